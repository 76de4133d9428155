"""Admission in the emulator, as the API server does it for writes over HTTP.

* names: a string, a DNS-1123 subdomain (namespaces: a DNS-1123 label; services: a DNS-1035 label);
* unknown fields: dropped, or reported for ``fieldValidation=Strict|Warn`` (as ``strict decoding error``);
* CRDs: structural pruning, ``default``s, the schema's types and constraints, and the CEL rules of
  ``x-kubernetes-validations`` (with ``oldSelf`` on updates) — evaluated with ``cel-python``;
* built-in kinds: the types of Kubernetes' own schemas (not their required fields, nor the semantic checks
  the real API server adds).

Errors are :class:`FieldError` s; the emulator turns them into ``422 Invalid`` with ``details.causes``. As in
the real server (validation ratcheting), an update is not refused for a value it does not change.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import celpy  # cel-python
import jsonschema

from vllm_operator_sim.emulator_openapi import builtin_definitions, resolve

__all__ = ['FieldError', 'apply_defaults', 'cel_errors', 'name_errors', 'prune_unknown', 'schema_errors']

Path = tuple[str | int, ...]
_SUBDOMAIN = re.compile(r'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')
_LABEL_1123 = re.compile(r'[a-z0-9]([-a-z0-9]*[a-z0-9])?')
_LABEL_1035 = re.compile(r'[a-z]([-a-z0-9]*[a-z0-9])?')
_JSON_TYPES = {str: 'string', bool: 'boolean', int: 'integer', float: 'number', list: 'array', dict: 'object',
               type(None): 'null'}


class FieldError(NamedTuple):
    """One cause of a 422, as in ``Status.details.causes``."""

    field: str
    reason: str  # FieldValueInvalid, FieldValueTypeInvalid, FieldValueRequired, FieldValueNotSupported
    message: str

    def cause(self) -> dict[str, str]:
        return {'reason': self.reason, 'message': self.message, 'field': self.field}

    def __str__(self) -> str:
        return f'{self.field}: {self.message}'


def field_path(path: Path) -> str:
    """``('spec', 'env', 0, 'name')`` → ``spec.env[0].name``."""
    text = ''
    for part in path:
        text += f'[{part}]' if isinstance(part, int) else (f'.{part}' if text else str(part))
    return text


def _type_name(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _get(obj: Any, path: Path) -> Any:
    for part in path:
        if isinstance(part, int):
            obj = obj[part] if isinstance(obj, list) and part < len(obj) else None
        else:
            obj = obj.get(part) if isinstance(obj, Mapping) else None
    return obj


def name_errors(plural: str, group: str, name: Any) -> list[FieldError]:
    """``metadata.name`` as the API server validates it for this resource."""
    if not isinstance(name, str):
        return [FieldError('metadata.name', 'FieldValueTypeInvalid',
                           f'Invalid value: {json.dumps(name)}: must be of type string')]
    if (group, plural) in (('', 'namespaces'),):
        pattern, limit, what = _LABEL_1123, 63, 'a lowercase RFC 1123 label'
    elif (group, plural) == ('', 'services'):
        pattern, limit, what = _LABEL_1035, 63, 'a DNS-1035 label'
    else:
        pattern, limit, what = _SUBDOMAIN, 253, 'a lowercase RFC 1123 subdomain'
    if len(name) > limit:
        return [FieldError('metadata.name', 'FieldValueInvalid',
                           f'Invalid value: "{name}": must be no more than {limit} characters')]
    if not pattern.fullmatch(name):
        return [FieldError('metadata.name', 'FieldValueInvalid',
                           f'Invalid value: "{name}": {what} must consist of lower case alphanumeric characters '
                           f"or '-'{' or .' if pattern is _SUBDOMAIN else ''}, and must start and end with an "
                           f"alphanumeric character (regex used for validation is '{pattern.pattern}')")]
    return []


#: ValidateAnnotationsSize: all of an object's annotations (keys and values) together, in bytes.
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024


def annotation_errors(metadata: Any) -> list[FieldError]:
    """``metadata.annotations`` as the API server bounds them (every kind): at most 256 KiB in all."""
    annotations = (metadata or {}).get('annotations') if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return []
    total = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        return [FieldError('metadata.annotations', 'FieldValueTooLong',
                           f'Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes')]
    return []


# --- unknown fields (pruning) -----------------------------------------------------------------------------------


def prune_unknown(obj: Any, schema: Mapping[str, Any], *, path: Path = (), builtin: bool = False) -> list[str]:
    """Drop the fields the schema does not declare, in place; return their paths (``spec.foo``).

    ``x-kubernetes-preserve-unknown-fields`` keeps everything below; a built-in ``object`` without properties
    (``RawExtension``, ``FieldsV1``) is free-form, as are ``additionalProperties: true`` maps.
    """
    if '$ref' in schema:  # into Kubernetes' own definitions
        builtin = True
    schema = resolve(schema)
    dropped: list[str] = []
    if isinstance(obj, dict):
        props = schema.get('properties')
        extra = schema.get('additionalProperties')
        preserve = schema.get('x-kubernetes-preserve-unknown-fields') is True
        if props is None and not isinstance(extra, Mapping) and (preserve or builtin or extra is True):
            return dropped
        for key in list(obj):
            if props is not None and key in props:
                dropped += prune_unknown(obj[key], props[key], path=(*path, key), builtin=builtin)
            elif isinstance(extra, Mapping):
                dropped += prune_unknown(obj[key], extra, path=(*path, key), builtin=builtin)
            elif not (preserve or extra is True or (not path and key in ('apiVersion', 'kind'))):
                dropped.append(field_path((*path, key)))
                del obj[key]
    elif isinstance(obj, list) and isinstance(schema.get('items'), Mapping):
        for index, item in enumerate(obj):
            dropped += prune_unknown(item, schema['items'], path=(*path, index), builtin=builtin)
    return dropped


# --- defaults ---------------------------------------------------------------------------------------------------


def apply_defaults(obj: Any, schema: Mapping[str, Any]) -> None:
    """Set the schema's ``default`` for absent properties of present objects, in place (structural defaulting)."""
    schema = resolve(schema)
    if isinstance(obj, dict):
        for key, sub in (schema.get('properties') or {}).items():
            sub = resolve(sub)
            if key not in obj and 'default' in sub:
                obj[key] = copy.deepcopy(sub['default'])
            if key in obj:
                apply_defaults(obj[key], sub)
        extra = schema.get('additionalProperties')
        if isinstance(extra, Mapping):
            for key, value in obj.items():
                if key not in (schema.get('properties') or {}):
                    apply_defaults(value, extra)
    elif isinstance(obj, list) and isinstance(schema.get('items'), Mapping):
        for item in obj:
            apply_defaults(item, schema['items'])


# --- schema types and constraints -------------------------------------------------------------------------------


def _no_check(*_: Any) -> Any:
    return iter(())


#: Built-in kinds: types, formats-free, without ``required`` (the real server reports those semantically).
_BuiltinValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {'required': _no_check})


@functools.cache
def _builtin_validator(definition: str) -> jsonschema.protocols.Validator:
    return _BuiltinValidator({'$defs': builtin_definitions(), '$ref': f'#/$defs/{definition}'})


def _crd_validator(schema: Mapping[str, Any]) -> jsonschema.protocols.Validator:
    return jsonschema.Draft4Validator({**schema, 'definitions': {}, '$defs': builtin_definitions()})


def _error(error: jsonschema.ValidationError) -> FieldError:
    path: Path = tuple(error.absolute_path)
    if error.validator == 'required':
        missing = re.match(r"'([^']+)'", error.message)
        name = missing[1] if missing else '?'
        return FieldError(field_path((*path, name)), 'FieldValueRequired', 'Required value')
    field = field_path(path) or '<root>'
    value = error.instance
    if error.validator == 'type':
        expected = error.validator_value
        expected = [t for t in expected if t != 'null'][0] if isinstance(expected, list) else expected
        kind = _type_name(value)
        return FieldError(field, 'FieldValueTypeInvalid',
                          f'Invalid value: "{kind}": {field} in body must be of type {expected}: "{kind}"')
    if error.validator == 'enum':
        allowed = ', '.join(json.dumps(v) for v in error.validator_value)
        return FieldError(field, 'FieldValueNotSupported',
                          f'Unsupported value: {json.dumps(value)}: supported values: {allowed}')
    return FieldError(field, 'FieldValueInvalid', f'Invalid value: {json.dumps(value, default=str)}: {error.message}')


def schema_errors(obj: Any, *, crd_schema: Mapping[str, Any] | None = None, builtin: str | None = None,
                  old: Any = None) -> list[FieldError]:
    """The schema violations of ``obj`` (a CRD's schema, or a built-in definition by name)."""
    if crd_schema is not None:
        validator = _crd_validator(crd_schema)
    elif builtin is not None:
        validator = _builtin_validator(builtin)
    else:
        return []
    errors = []
    for error in validator.iter_errors(obj):
        path = tuple(error.absolute_path)
        if old is not None and error.validator != 'required' and _get(old, path) == _get(obj, path):
            continue  # ratcheting: an unchanged value is not refused
        errors.append(_error(error))
    return sorted(set(errors), key=lambda e: e.field)


# --- CEL --------------------------------------------------------------------------------------------------------


@functools.cache
def _cel_program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _cel_eval(rule: str, value: Any, old: Any) -> tuple[bool, str | None]:
    activation = {'self': celpy.json_to_cel(value)}  # type: ignore[attr-defined]
    if old is not None:
        activation['oldSelf'] = celpy.json_to_cel(old)  # type: ignore[attr-defined]
    elif 'oldSelf' in rule:
        return True, None  # a transition rule: only on updates
    try:
        result = _cel_program(rule).evaluate(activation)
    except Exception as e:  # a compile or evaluation error: the real server reports it as invalid too
        return False, f'compilation/evaluation error: {e}'
    if isinstance(result, Exception):
        return False, f'evaluation error: {result}'
    return bool(result), None


def cel_errors(obj: Any, schema: Mapping[str, Any], old: Any = None, *, path: Path = ()) -> list[FieldError]:
    """The ``x-kubernetes-validations`` rules that ``obj`` breaks (rules on unchanged values are not evaluated)."""
    schema = resolve(schema)
    if obj is None or (old is not None and old == obj):
        return []
    errors: list[FieldError] = []
    for rule in schema.get('x-kubernetes-validations') or []:
        ok, problem = _cel_eval(rule['rule'], obj, old)
        if ok:
            continue
        field = field_path(path) + (rule.get('fieldPath') or '')
        message = problem or rule.get('message') or f'failed rule: {rule["rule"]}'
        errors.append(FieldError(field.lstrip('.') or '<root>', rule.get('reason') or 'FieldValueInvalid',
                                 f'Invalid value: "{_type_name(obj)}": {message}'))
    if isinstance(obj, dict):
        for key, sub in (schema.get('properties') or {}).items():
            if key in obj:
                errors += cel_errors(obj[key], sub, old.get(key) if isinstance(old, dict) else None,
                                     path=(*path, key))
    elif isinstance(obj, list) and isinstance(schema.get('items'), Mapping):
        for index, item in enumerate(obj):
            errors += cel_errors(item, schema['items'], path=(*path, index))
    return errors
