"""Server-side printing (``meta.k8s.io/v1 Table``) for ``kubectl get`` without ``-o``."""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any

from vllm_operator_sim.emulator_resources import ResourceDef

__all__ = ['as_table', 'wants_table']

_FILTER = re.compile(r'^\[\?\(@\.(?P<key>[\w.]+)\s*==\s*["\'](?P<value>[^"\']*)["\']\)\]$')
#: A few useful columns of built-ins (beyond Name and Age): (name, type, JSONPath-like path).
_BUILTIN_COLUMNS: dict[tuple[str, str], list[tuple[str, str, str]]] = {
    ('', 'pods'): [('Status', 'string', '.status.phase'), ('Node', 'string', '.spec.nodeName')],
    ('apps', 'deployments'): [('Replicas', 'integer', '.spec.replicas'), ('Ready', 'integer', '.status.readyReplicas')],
    ('', 'namespaces'): [('Status', 'string', '.status.phase')],
}


def wants_table(accept: str) -> bool:
    """Whether the client (kubectl) asked for server-side printing."""
    return 'as=Table' in accept


def _age(timestamp: Any) -> str:
    try:
        then = datetime.datetime.strptime(str(timestamp), '%Y-%m-%dT%H:%M:%SZ').replace(tzinfo=datetime.UTC)
    except ValueError:
        return '<unknown>'
    seconds = max(0, int((datetime.datetime.now(datetime.UTC) - then).total_seconds()))
    if seconds < 120:
        return f'{seconds}s'
    if seconds < 600:
        return f'{seconds // 60}m{seconds % 60}s'
    if seconds < 3 * 3600:
        return f'{seconds // 60}m'
    return f'{seconds // 3600}h' if seconds < 48 * 3600 else f'{seconds // 86400}d'


def _jsonpath(obj: Any, path: str) -> Any:
    """Evaluate the simple JSONPaths used in printer columns: ``.a.b``, ``.a[0]``, ``.a[?(@.k=="v")].b``."""
    for token in re.findall(r'\[[^\]]*\]|[^.\[]+', path):
        if token.startswith('[') and (match := _FILTER.match(token)):
            items = obj if isinstance(obj, list) else []
            obj = next((i for i in items if _jsonpath(i, '.' + match['key']) == match['value']), None)
        elif token.startswith('['):
            index = token[1:-1]
            obj = obj[int(index)] if isinstance(obj, list) and index.lstrip('-').isdigit() and \
                -len(obj) <= int(index) < len(obj) else None
        else:
            obj = obj.get(token) if isinstance(obj, Mapping) else None
        if obj is None:
            return None
    return obj


def as_table(rdef: ResourceDef, result: Mapping[str, Any]) -> dict[str, Any]:
    """Render an object or a list as a Table: Name, the printer columns (CRD or built-in), Age."""
    columns: list[tuple[str, str, str, int]] = [
        (c.get('name', ''), c.get('type', 'string'), c.get('jsonPath', ''), int(c.get('priority', 0)))
        for c in rdef.printer_columns
    ] or [(n, t, p, 0) for n, t, p in _BUILTIN_COLUMNS.get(rdef.storage_key, [])]
    has_age = any(c[2] == '.metadata.creationTimestamp' for c in columns)
    definitions = [{'name': 'Name', 'type': 'string', 'format': 'name', 'description': 'Name', 'priority': 0}]
    definitions += [{'name': n, 'type': t, 'format': '', 'description': n, 'priority': p} for n, t, _, p in columns]
    if not has_age:
        definitions.append({'name': 'Age', 'type': 'string', 'format': '', 'description': 'Age', 'priority': 0})
    items = result.get('items', []) if 'items' in result else [result]
    rows = []
    for obj in items:
        cells: list[Any] = [obj.get('metadata', {}).get('name', '')]
        for _, kind, path, _ in columns:
            value = _jsonpath(obj, path)
            cells.append(_age(value) if kind == 'date' and value is not None else value)
        if not has_age:
            cells.append(_age(obj.get('metadata', {}).get('creationTimestamp')))
        rows.append({'cells': cells, 'object': obj})
    meta = dict(result.get('metadata') or {}) if 'items' in result else {}
    return {'kind': 'Table', 'apiVersion': 'meta.k8s.io/v1', 'metadata': meta,
            'columnDefinitions': definitions, 'rows': rows}
