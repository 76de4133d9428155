"""Label and field selectors of the Kubernetes API, as parsed from ``labelSelector``/``fieldSelector``."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ['SelectorError', 'parse_field_selector', 'parse_label_selector', 'selector_from_match_labels']

Predicate = Callable[[Mapping[str, Any]], bool]

_LABEL_REQ = re.compile(
    r'^\s*(?P<neg>!?)\s*(?P<key>[\w./-]+)\s*'
    r'(?:(?P<op>==|=|!=)\s*(?P<value>[\w./-]*)|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*$'
)
_FIELD_REQ = re.compile(r'^\s*(?P<path>[\w.]+)\s*(?P<op>==|=|!=)\s*(?P<value>.*?)\s*$')


class SelectorError(ValueError):
    """The selector string cannot be parsed."""


def _split(selector: str) -> list[str]:
    """Split on commas that are not inside ``(...)``."""
    return [part for part in re.split(r',(?![^(]*\))', selector) if part.strip()]


def _label_requirement(text: str) -> Predicate:
    match = _LABEL_REQ.match(text)
    if not match or (match['neg'] and (match['op'] or match['setop'])):
        raise SelectorError(f'unable to parse requirement: {text!r}')
    key = match['key']
    if match['neg']:
        return lambda labels: key not in labels
    if match['op']:
        value, negate = match['value'], match['op'] == '!='
        return lambda labels: (labels.get(key) == value) != negate
    if match['setop']:
        values = {v.strip() for v in match['values'].split(',') if v.strip()}
        if match['setop'] == 'in':
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    return lambda labels: key in labels


def parse_label_selector(selector: str | None) -> Predicate:
    """Turn ``a=b,c!=d,e in (f,g),h notin (i),j,!k`` into a predicate over an object's labels."""
    reqs = [_label_requirement(part) for part in _split(selector or '')]
    return lambda labels: all(req(labels) for req in reqs)


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split('.'):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ''
    if isinstance(value, bool):
        return 'true' if value else 'false'
    return str(value)


def parse_field_selector(selector: str | None) -> Predicate:
    """Turn ``metadata.name=x,status.phase!=Running`` into a predicate over a whole object.

    Any dotted path is accepted (the real API allows only a few per resource: ``metadata.name``,
    ``metadata.namespace``, ``status.phase``, ``spec.nodeName``...); a missing field reads as ``''``.
    """
    reqs: list[tuple[str, bool, str]] = []
    for part in _split(selector or ''):
        match = _FIELD_REQ.match(part)
        if not match:
            raise SelectorError(f'invalid field selector: {part!r}')
        reqs.append((match['path'], match['op'] == '!=', match['value']))
    return lambda obj: all((_field_value(obj, path) == value) != negate for path, negate, value in reqs)


def selector_from_match_labels(selector: Mapping[str, Any] | None) -> str:
    """Render a ``LabelSelector`` (``matchLabels`` + ``matchExpressions``) as a selector string."""
    selector = selector or {}
    parts = [f'{k}={v}' for k, v in sorted((selector.get('matchLabels') or {}).items())]
    for expr in selector.get('matchExpressions') or []:
        key, op, values = expr.get('key'), expr.get('operator'), expr.get('values') or []
        if op in ('In', 'NotIn'):
            parts.append(f'{key} {op.lower()} ({",".join(values)})')
        elif op == 'Exists':
            parts.append(str(key))
        elif op == 'DoesNotExist':
            parts.append(f'!{key}')
    return ','.join(parts)
