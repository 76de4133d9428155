"""Validation for people: a spec's problems as field paths (`spec.flags.gpuMemoryUtilization`) and what to change,
and the depth and size bounds checked before a spec is parsed."""

from __future__ import annotations

import difflib
import json
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from .schema import _PATTERN_WORDS, QUANTITY_PATTERN, _short

M = TypeVar("M", bound=BaseModel)


# --------------------------------------------------------------------------------------------------
# Validation for people: field paths and fixes
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecError:
    """One problem with a spec: `field` is a dotted camelCase path such as `spec.flags.gpuMemoryUtilization`."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SpecValidationError(ValueError):
    """The spec is invalid; `errors` says where and what to change."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def _join(base: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{base}[{part}]"
    if part.startswith("["):
        return base + part
    return f"{base}.{part}" if base else part


def _model_class(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `X`, `X | None`, `list[X]` or `dict[str, X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType, list, dict, Annotated):
        for arg in get_args(annotation):
            found = _model_class(arg)
            if found is not None:
                return found
    return None


def _fields_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """camelCase field names of the model reached from `root` by `loc` (used to suggest a fix for a typo)."""
    model: type[BaseModel] = root
    for part in loc:
        if isinstance(part, int):
            continue
        for name, info in model.model_fields.items():
            if part in (name, info.alias):
                found = _model_class(info.annotation)
                if found is None:
                    return []
                model = found
                break
        else:
            return []
    return [info.alias or name for name, info in model.model_fields.items()]


def _spec_errors(exc: ValidationError, prefix: str, root: type[BaseModel]) -> list[SpecError]:
    errors: list[SpecError] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        path = prefix
        for part in loc:
            path = _join(path, part)
        kind = err["type"]
        ctx = err.get("ctx") or {}
        if kind == "spec_rule":
            for violation in ctx.get("violations", []):
                errors.append(SpecError(_join(path, violation["field"]), violation["message"]))
            continue
        if kind == "extra_forbidden":
            name = str(loc[-1]) if loc else ""
            close = difflib.get_close_matches(name, _fields_at(root, loc[:-1]), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; remove it"
            errors.append(SpecError(path, f"unknown field {name!r}{hint}"))
            continue
        if kind == "missing":
            errors.append(SpecError(path, "is required; set it"))
            continue
        if kind == "string_pattern_mismatch" and ctx.get("pattern") == QUANTITY_PATTERN:
            message = "must be a Kubernetes quantity such as 64Gi, 500m or 8"
        elif kind == "string_pattern_mismatch" and ctx.get("pattern") in _PATTERN_WORDS:
            message = _PATTERN_WORDS[ctx["pattern"]]
        else:
            message = err["msg"]
            if message.startswith("Input should be"):
                message = "must be" + message.removeprefix("Input should be")
            elif message.startswith("Value error, "):
                message = message.removeprefix("Value error, ")
        errors.append(SpecError(path, f"{message} (got {_short(err.get('input'))})"))
    return errors


#: The deepest nesting of a whole spec (the deepest field, an affinity term's values, is 9 levels; an inline config
#: adds at most MAX_INLINE_JSON_DEPTH). Checked before anything recurses: a stored object may nest 10,000 levels.
MAX_SPEC_DEPTH = 32
#: The largest spec, as compact JSON. kopf keeps a copy of the spec as its diff base (an annotation where it fits,
#: status otherwise) and etcd holds at most 1.5 MiB per object: spec + copy + status stay under it.
MAX_SPEC_BYTES = 512 * 1024


def _path_name(root: type[BaseModel], path: tuple[str | int, ...]) -> str:
    """The field of the spec's schema a deep path is in: `spec.model.config` for a path into the free-form config,
    `spec.affinity` for a path through unknown keys of affinity."""
    name = "spec"
    model: type[BaseModel] | None = root
    for part in path:
        if isinstance(part, int):
            name = _join(name, part)
            continue
        if model is None:
            break
        field = next((info for key, info in model.model_fields.items() if part in (key, info.alias)), None)
        if field is None:
            break
        name = _join(name, part)
        model = _model_class(field.annotation)
    return name


def _plain(value: Any, root: type[BaseModel]) -> Any:
    """Plain dicts and lists from any mappings and sequences (kopf passes read-only mapping views), without recursion:
    raises SpecValidationError naming the field when the value nests deeper than MAX_SPEC_DEPTH."""

    def copy(item: Any) -> Any:
        if isinstance(item, Mapping):
            return {}
        if isinstance(item, list | tuple):
            return []
        return item

    top = copy(value)
    stack: list[tuple[Any, Any, tuple[str | int, ...]]] = [(value, top, ())]
    while stack:
        source, target, path = stack.pop()
        if len(path) > MAX_SPEC_DEPTH:
            raise SpecValidationError([SpecError(_path_name(root, path), (
                f"nests deeper than {MAX_SPEC_DEPTH} levels (a real value nests a few); remove the nesting")),
            ])
        items = source.items() if isinstance(source, Mapping) else enumerate(source)
        for key, item in items:
            child = copy(item)
            if isinstance(target, dict):
                target[key] = child
            else:
                target.append(child)
            if isinstance(item, Mapping | list | tuple):
                stack.append((item, child, (*path, key)))
    return top


def _spec_of(obj: Mapping[str, Any], root: type[BaseModel]) -> Any:
    """The spec inside a whole VLLMService object, or the object itself when it is a spec, as plain JSON data
    (bounded in depth and size: SpecValidationError naming the field otherwise)."""
    spec = obj.get("spec")
    plain = _plain(spec, root) if isinstance(spec, Mapping) and "model" not in obj else _plain(obj, root)
    try:
        size = len(json.dumps(plain, separators=(",", ":"), default=str))
    except (TypeError, ValueError):  # not JSON at all (a NaN is JSON to Python): pydantic names the field
        return plain
    if size > MAX_SPEC_BYTES and isinstance(plain, dict):
        path: tuple[str | int, ...] = ()
        node: Any = plain
        largest = size
        for _ in range(2):  # the largest field, and the largest inside it (spec.model.config, not spec.model)
            if not isinstance(node, dict) or not node:
                break
            sizes = {key: len(json.dumps(item, separators=(",", ":"), default=str)) for key, item in node.items()}
            key = max(sizes, key=lambda k: sizes[k])
            path, node, largest = (*path, key), node[key], sizes[key]
        raise SpecValidationError([SpecError(_path_name(root, path), (
            f"makes the spec {size // 1024} KiB, over the {MAX_SPEC_BYTES // 1024} KiB the operator keeps "
            f"(this field is {largest // 1024} KiB); shorten it, or move model files to model.configMapRef"))])
    return plain


def parse_spec_as(root: type[M], obj: Mapping[str, Any]) -> M:
    """Parse a spec, or a whole object's spec, as the model `root` (v1alpha1.parse_spec: VLLMServiceSpec). Raises
    SpecValidationError with field paths."""
    try:
        return root.model_validate(_spec_of(obj, root))
    except RecursionError as exc:  # bounded above; kept so that no input can become an InternalError
        raise SpecValidationError([SpecError("spec", "nests too deep; remove the nesting")]) from exc
    except ValidationError as exc:
        raise SpecValidationError(_spec_errors(exc, "spec", root)) from exc


def spec_problems(root: type[BaseModel], obj: Mapping[str, Any]) -> list[SpecError]:
    """Problems with a spec (or a whole object's spec) parsed as `root`; empty when it is valid
    (v1alpha1.validate_spec: VLLMServiceSpec)."""
    try:
        parse_spec_as(root, obj)
    except SpecValidationError as exc:
        return exc.errors
    return []
