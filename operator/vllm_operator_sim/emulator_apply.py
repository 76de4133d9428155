"""Server-side apply and field ownership (``metadata.managedFields``) for the emulator.

A field is a path of ``f:<key>`` (map keys), ``k:<json>`` (an item of an associative list, by its keys) and
``v:<json>`` (an item of a set) segments, as in ``FieldsV1``. Leaves are scalars, atomic lists and empty maps.
Lists are associative, sets or atomic according to the schema (``x-kubernetes-list-type``, or a built-in's
``x-kubernetes-patch-merge-key``); without a schema a list is atomic.

* :func:`apply` merges an applied configuration into the live object for a field manager: it refuses (409)
  to change a field another manager owns with a different value unless forced, takes ownership of what it
  sets, and removes what this manager set before and no longer sets (if nobody else owns it).
* :func:`track_update` moves the fields an ordinary write (create, update, patch) changes to its manager.

Simplifications: no ``.`` (membership) entries; ownership is by leaf (a map a removal leaves empty goes with it,
as the real server's parent entries make it); one entry per manager, operation and subresource (the real server
also splits by API version).
"""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vllm_operator_sim.emulator_openapi import resolve

__all__ = ['ApplyConflict', 'apply', 'fields_of', 'from_fields_v1', 'to_fields_v1', 'track_update']

Field = tuple[str, ...]
Obj = dict[str, Any]
_META_FIELDS = ('labels', 'annotations', 'finalizers', 'ownerReferences')


class ApplyConflict(Exception):
    """Fields another manager owns with a different value: ``[(manager, '.spec.replicas'), …]``."""

    def __init__(self, conflicts: list[tuple[str, str]]) -> None:
        self.conflicts = conflicts
        lines = '\n'.join(f'- conflict with "{m}": {f}' for m, f in conflicts)
        super().__init__(f'Apply failed with {len(conflicts)} conflict{"s" if len(conflicts) > 1 else ""}:\n'
                         f'{lines}' if len(conflicts) > 1 else
                         f'Apply failed with 1 conflict: conflict with "{conflicts[0][0]}": {conflicts[0][1]}')


def _list_kind(schema: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    kind = schema.get('x-kubernetes-list-type')
    if kind == 'map':
        return 'map', tuple(schema.get('x-kubernetes-list-map-keys') or ())
    if kind in ('set', 'atomic'):
        return kind, ()
    if key := schema.get('x-kubernetes-patch-merge-key'):
        return 'map', (key,)
    return ('set', ()) if schema.get('x-kubernetes-patch-strategy') == 'merge' else ('atomic', ())


def _sub(schema: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    props = schema.get('properties') or {}
    if key in props:
        return resolve(props[key])
    extra = schema.get('additionalProperties')
    return resolve(extra) if isinstance(extra, Mapping) else {}


def _item_key(item: Any, keys: tuple[str, ...]) -> str | None:
    if not keys or not isinstance(item, Mapping) or not all(k in item for k in keys):
        return None
    return 'k:' + json.dumps({k: item[k] for k in keys}, separators=(',', ':'), sort_keys=True)


def _walk(value: Any, schema: Mapping[str, Any], prefix: Field, out: set[Field]) -> None:
    schema = resolve(schema)
    if isinstance(value, Mapping) and value:
        for key, sub in value.items():
            _walk(sub, _sub(schema, key), (*prefix, f'f:{key}'), out)
    elif isinstance(value, list) and value:
        kind, keys = _list_kind(schema)
        items = resolve(schema.get('items') or {})
        if kind == 'map' and all(_item_key(i, keys) for i in value):
            for item in value:
                _walk(item, items, (*prefix, str(_item_key(item, keys))), out)
        elif kind == 'set' and all(not isinstance(i, (Mapping, list)) for i in value):
            out.update((*prefix, 'v:' + json.dumps(i)) for i in value)
        else:
            out.add(prefix)
    else:
        out.add(prefix)


def fields_of(obj: Mapping[str, Any], schema: Mapping[str, Any], subresource: str | None = None) -> set[Field]:
    """The fields set in an object: ``status`` for the status subresource, else everything but status."""
    out: set[Field] = set()
    schema = resolve(schema)
    if subresource == 'status':
        if obj.get('status') not in (None, {}):
            _walk(obj['status'], _sub(schema, 'status'), ('f:status',), out)
        return out
    meta = obj.get('metadata') or {}
    for key in _META_FIELDS:
        if meta.get(key) not in (None, {}, []):
            _walk(meta[key], _sub(resolve(_sub(schema, 'metadata')), key), ('f:metadata', f'f:{key}'), out)
    for key, value in obj.items():
        if key not in ('apiVersion', 'kind', 'metadata', 'status'):
            _walk(value, _sub(schema, key), (f'f:{key}',), out)
    return out


def _find(items: list[Any], segment: str) -> int | None:
    if segment.startswith('k:'):
        want = json.loads(segment[2:])
        return next((i for i, item in enumerate(items)
                     if isinstance(item, Mapping) and all(item.get(k) == v for k, v in want.items())), None)
    if segment.startswith('v:'):
        value = json.loads(segment[2:])
        return next((i for i, item in enumerate(items) if item == value), None)
    return None


_MISSING = object()


def value_at(obj: Any, field: Field) -> Any:
    """The value at a field path (a sentinel when absent)."""
    for segment in field:
        if segment.startswith('f:') and isinstance(obj, Mapping):
            obj = obj.get(segment[2:], _MISSING)
        elif isinstance(obj, list) and (index := _find(obj, segment)) is not None:
            obj = obj[index]
        else:
            return _MISSING
        if obj is _MISSING:
            return obj
    return obj


def _remove(obj: Any, field: Field) -> None:
    *parents, last = field
    for segment in parents:
        obj = value_at(obj, (segment,))
        if obj is _MISSING:
            return
    if last.startswith('f:') and isinstance(obj, dict):
        obj.pop(last[2:], None)
    elif isinstance(obj, list) and (index := _find(obj, last)) is not None:
        del obj[index]


def _is_key(field: Field) -> bool:
    """Whether ``field`` is a key field of an associative list item (``…, k:{"name":…}, f:name``)."""
    return len(field) > 1 and field[-2].startswith('k:') and field[-1][2:] in json.loads(field[-2][2:])


def _prune(obj: Obj, field: Field, kept: set[Field]) -> None:
    """After removing ``field``: drop the maps, list items and lists it leaves empty on its way up, as the real
    server does (it owns the parents too, ``.`` entries), unless someone still sets that parent itself."""
    for depth in range(len(field) - 1, 0, -1):
        parent = field[:depth]
        if parent in kept:
            return
        if parent[-1].startswith(('k:', 'v:')):  # an item whose key fields went too is an empty map now
            items = value_at(obj, parent[:-1])
            if isinstance(items, list):
                items[:] = [item for item in items if item != {}]
            continue
        value = value_at(obj, parent)
        if value not in ({}, []):
            return
        _remove(obj, parent)


def _merge(live: Any, config: Any, schema: Mapping[str, Any]) -> Any:
    schema = resolve(schema)
    if isinstance(live, dict) and isinstance(config, Mapping):
        result = dict(live)
        for key, value in config.items():
            result[key] = _merge(live.get(key), value, _sub(schema, key)) if key in live else copy.deepcopy(value)
        return result
    if isinstance(live, list) and isinstance(config, list):
        kind, keys = _list_kind(schema)
        items = resolve(schema.get('items') or {})
        if kind == 'map' and all(_item_key(i, keys) for i in [*live, *config]):
            result_list = list(live)
            for item in config:
                index = _find(result_list, str(_item_key(item, keys)))
                if index is None:
                    result_list.append(copy.deepcopy(item))
                else:
                    result_list[index] = _merge(result_list[index], item, items)
            return result_list
        if kind == 'set':
            return list(live) + [copy.deepcopy(i) for i in config if i not in live]
    return copy.deepcopy(config)


def to_fields_v1(fields: Iterable[Field]) -> Obj:
    """``{('f:spec', 'f:replicas')}`` → ``{'f:spec': {'f:replicas': {}}}``."""
    tree: Obj = {}
    for field in sorted(fields):
        node = tree
        for segment in field:
            node = node.setdefault(segment, {})
    return tree


def from_fields_v1(tree: Mapping[str, Any], prefix: Field = ()) -> set[Field]:
    out: set[Field] = set()
    for segment, sub in tree.items():
        if segment == '.':
            continue
        if isinstance(sub, Mapping) and any(k != '.' for k in sub):
            out |= from_fields_v1(sub, (*prefix, segment))
        else:
            out.add((*prefix, segment))
    return out


def _render(field: Field) -> str:
    text = ''
    for segment in field:
        if segment.startswith('f:'):
            text += '.' + segment[2:]
        elif segment.startswith('k:'):
            text += '[' + ','.join(f'{k}={json.dumps(v)}' for k, v in json.loads(segment[2:]).items()) + ']'
        else:
            text += f'[{segment[2:]}]'
    return text


Owners = dict[tuple[str, str, str | None], set[Field]]


def _owners(managed: Iterable[Mapping[str, Any]]) -> Owners:
    owners: Owners = {}
    for entry in managed:
        key = (str(entry.get('manager', '')), str(entry.get('operation', '')), entry.get('subresource'))
        owners.setdefault(key, set()).update(from_fields_v1(entry.get('fieldsV1') or {}))
    return owners


def _entries(owners: Owners, api_version: str, now: Callable[[], datetime.datetime],
             previous: Iterable[Mapping[str, Any]], touched: tuple[str, str, str | None]) -> list[Obj]:
    times = {(e.get('manager'), e.get('operation'), e.get('subresource')): e.get('time') for e in previous}
    entries = []
    for (manager, operation, sub), fields in owners.items():
        if not fields:
            continue
        stamp = now().strftime('%Y-%m-%dT%H:%M:%SZ') if (manager, operation, sub) == touched else \
            times.get((manager, operation, sub))
        entry: Obj = {'manager': manager, 'operation': operation, 'apiVersion': api_version, 'time': stamp,
                      'fieldsType': 'FieldsV1', 'fieldsV1': to_fields_v1(fields)}
        if sub:
            entry['subresource'] = sub
        entries.append(entry)
    return entries


def track_update(old: Mapping[str, Any] | None, new: Obj, manager: str, schema: Mapping[str, Any],
                 now: Callable[[], datetime.datetime], subresource: str | None = None) -> None:
    """Give ``manager`` (operation ``Update``) the fields this write changed; set ``new``'s managedFields."""
    previous = (old or {}).get('metadata', {}).get('managedFields') or []
    owners = _owners(previous)
    new_fields = fields_of(new, schema, subresource)
    old_fields = fields_of(old, schema, subresource) if old else set()
    changed = {f for f in new_fields if f not in old_fields or value_at(old, f) != value_at(new, f)}
    for key, fields in owners.items():
        if key[2] == subresource:
            owners[key] = (fields - changed) & new_fields
    touched = (manager, 'Update', subresource)
    if changed:
        owners.setdefault(touched, set()).update(changed)
    new['metadata']['managedFields'] = _entries(owners, new['apiVersion'], now, previous, touched)


def apply(live: Obj, config: Mapping[str, Any], manager: str, schema: Mapping[str, Any], *, force: bool,
          now: Callable[[], datetime.datetime], subresource: str | None = None) -> Obj:
    """Server-side apply of ``config`` by ``manager`` onto ``live`` (a new dict); raises :class:`ApplyConflict`."""
    previous = live.get('metadata', {}).get('managedFields') or []
    owners = _owners(previous)
    me = (manager, 'Apply', subresource)
    applied = fields_of(config, schema, subresource)
    conflicts = sorted({(m, _render(f)) for (m, op, sub), owned in owners.items() if (m, op, sub) != me
                        and sub == subresource for f in applied & owned
                        if value_at(live, f) != value_at(config, f)})
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    others: set[Field] = set()
    for key, owned in owners.items():
        if key != me and key[2] == subresource:
            if force:
                owned -= {f for f in applied if value_at(live, f) != value_at(config, f)}
            others |= owned
    if subresource == 'status':
        body = {'status': config.get('status')} if 'status' in config else {}
    else:
        body = {k: v for k, v in config.items() if k not in ('status', 'apiVersion', 'kind')}
        body['metadata'] = {k: v for k, v in (config.get('metadata') or {}).items() if k in _META_FIELDS}
    new: Obj = _merge(live, body, resolve(schema))
    kept = applied | others
    # deepest first; an item's key fields are not removed one by one (the item is found by them): an item left with
    # nothing but its keys, none of them owned by someone else, goes whole
    items: set[Field] = set()
    for field in sorted(owners.get(me, set()) - applied - others, key=lambda f: (-len(f), f)):
        if _is_key(field):
            items.add(field[:-1])
            continue
        _remove(new, field)
        _prune(new, field, kept)
    for item in sorted(items, key=lambda f: (-len(f), f)):
        value = value_at(new, item)
        keys = set(json.loads(item[-1][2:]))
        if isinstance(value, dict) and set(value) <= keys and not any(f[:len(item)] == item for f in kept):
            _remove(new, item)
            _prune(new, (*item, 'f:_'), kept)
    owners[me] = applied
    new.setdefault('metadata', {})['managedFields'] = _entries(owners, live.get('apiVersion', ''), now, previous, me)
    return new
