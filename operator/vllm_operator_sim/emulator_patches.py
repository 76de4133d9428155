"""Patch semantics of the Kubernetes API for the emulator: JSON patch, JSON merge patch, strategic merge.

All functions are pure: they never mutate their inputs and return new documents.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ['PatchError', 'PatchTestFailed', 'json_patch', 'merge_patch', 'strategic_merge_patch']


class PatchError(ValueError):
    """The patch cannot be applied (a bad path, a bad operation, a wrong type)."""


class PatchTestFailed(PatchError):
    """A JSON-patch ``test`` operation found a different value."""


# --- JSON patch (RFC 6902) -------------------------------------------------------------------------

def _pointer(path: str) -> list[str]:
    if path == '':
        return []
    if not path.startswith('/'):
        raise PatchError(f'invalid JSON pointer: {path!r}')
    return [part.replace('~1', '/').replace('~0', '~') for part in path[1:].split('/')]


def _index(container: list[Any], part: str, *, for_add: bool = False) -> int:
    if for_add and part == '-':
        return len(container)
    if not part.isdigit():
        raise PatchError(f'invalid list index: {part!r}')
    index = int(part)
    if index > len(container) or (index == len(container) and not for_add):
        raise PatchError(f'list index out of range: {index}')
    return index


def _resolve(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict):
            if part not in doc:
                raise PatchError(f'path not found: {part!r}')
            doc = doc[part]
        elif isinstance(doc, list):
            doc = doc[_index(doc, part)]
        else:
            raise PatchError(f'cannot descend into a scalar at {part!r}')
    return doc


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _resolve(doc, parts[:-1])
    if isinstance(parent, dict):
        parent[parts[-1]] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, parts[-1], for_add=True), value)
    else:
        raise PatchError('cannot add to a scalar')
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        raise PatchError('cannot remove the root')
    parent = _resolve(doc, parts[:-1])
    if isinstance(parent, dict):
        if parts[-1] not in parent:
            raise PatchError(f'path not found: {parts[-1]!r}')
        del parent[parts[-1]]
    elif isinstance(parent, list):
        del parent[_index(parent, parts[-1])]
    else:
        raise PatchError('cannot remove from a scalar')
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """Apply an RFC 6902 JSON patch (``add``, ``remove``, ``replace``, ``move``, ``copy``, ``test``)."""
    if not isinstance(ops, list):
        raise PatchError('a JSON patch must be a list of operations')
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or 'path' not in op:
            raise PatchError(f'invalid operation: {op!r}')
        kind, parts = op.get('op'), _pointer(op['path'])
        if kind == 'test':
            if _resolve(doc, parts) != op.get('value'):
                raise PatchTestFailed(f'test failed at {op["path"]!r}')
        elif kind == 'add':
            doc = _add(doc, parts, copy.deepcopy(op.get('value')))
        elif kind == 'remove':
            doc = _remove(doc, parts)
        elif kind == 'replace':
            _resolve(doc, parts)  # must exist
            doc = _add(_remove(doc, parts) if parts else doc, parts, copy.deepcopy(op.get('value')))
        elif kind in ('move', 'copy'):
            source = _pointer(op.get('from', ''))
            value = copy.deepcopy(_resolve(doc, source))
            if kind == 'move':
                doc = _remove(doc, source)
            doc = _add(doc, parts, value)
        else:
            raise PatchError(f'unknown operation: {kind!r}')
    return doc


# --- JSON merge patch (RFC 7386) ------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 JSON merge patch: dicts merge recursively, ``null`` deletes, lists replace."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- Strategic merge patch (the subset that matters for the workloads) ---------------------------

#: Lists merged item-by-item by a key, as in Kubernetes' built-in types (``patchMergeKey``).
#: A tuple means "the first key that the patch item has" (container ports vs. service ports).
MERGE_KEYS: dict[str, tuple[str, ...]] = {
    'containers': ('name',),
    'initContainers': ('name',),
    'ephemeralContainers': ('name',),
    'env': ('name',),
    'volumes': ('name',),
    'imagePullSecrets': ('name',),
    'volumeMounts': ('mountPath',),
    'volumeDevices': ('devicePath',),
    'ports': ('containerPort', 'port', 'name'),
    'ownerReferences': ('uid',),
    'conditions': ('type',),
}
#: Lists of scalars merged as sets (``patchStrategy: merge`` without a key).
PRIMITIVE_MERGE_LISTS = frozenset({'finalizers'})


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith('$')}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def _merge_keyed_list(base: list[Any], items: list[Any], keys: tuple[str, ...]) -> list[Any]:
    if any(isinstance(item, dict) and item.get('$patch') == 'replace' for item in items):
        return [_strip_directives(item) for item in items
                if not (isinstance(item, dict) and item.get('$patch') == 'replace')]
    result = copy.deepcopy(base)
    for item in items:
        key = next((k for k in keys if isinstance(item, dict) and k in item), None)
        if key is None:
            result.append(_strip_directives(item))
            continue
        index = next((i for i, old in enumerate(result)
                      if isinstance(old, dict) and old.get(key) == item[key]), None)
        if item.get('$patch') == 'delete':
            if index is not None:
                del result[index]
        elif index is None:
            result.append(_strip_directives(item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Apply a strategic merge patch as the API server does for built-in types.

    Dicts merge and ``null`` deletes as in a merge patch; the lists in :data:`MERGE_KEYS` merge
    by their key (``$patch: delete``/``replace`` directives honoured), ``finalizers`` merge as
    sets (``$deleteFromPrimitiveList/finalizers`` honoured); other lists are replaced. Other
    directives (``$setElementOrder``, ``$retainKeys``) are ignored.
    """
    if not isinstance(patch, dict):
        return _strip_directives(copy.deepcopy(patch))
    if patch.get('$patch') == 'replace':
        return _strip_directives(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith('$'):
            continue
        old = result.get(key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_keyed_list(old if isinstance(old, list) else [], value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in PRIMITIVE_MERGE_LISTS:
            merged = list(old) if isinstance(old, list) else []
            result[key] = merged + [v for v in value if v not in merged]
        else:
            result[key] = strategic_merge_patch(old, value)
    for key, value in patch.items():
        if key.startswith('$deleteFromPrimitiveList/') and isinstance(value, list):
            field = key.split('/', 1)[1]
            if isinstance(result.get(field), list):
                result[field] = [v for v in result[field] if v not in value]
    return result
