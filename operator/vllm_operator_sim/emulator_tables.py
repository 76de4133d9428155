"""Server-side printing (``meta.k8s.io/v1 Table``) for ``kubectl get`` without ``-o`` (and ``-o wide``).

The columns are those the real API server prints: pods (READY, STATUS, RESTARTS, AGE; wide: IP, NODE),
events (LAST SEEN, TYPE, REASON, OBJECT, MESSAGE), deployments, statefulsets (READY, AGE), controllerrevisions,
services, namespaces; a CRD's ``additionalPrinterColumns``. Ages are measured against the cluster's clock (see ``KubeEmulator.now``).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping
from typing import Any

from vllm_operator_sim.emulator_resources import ResourceDef

__all__ = ['as_table', 'wants_table']

_FILTER = re.compile(r'^\[\?\(@\.(?P<key>[\w.]+)\s*==\s*["\'](?P<value>[^"\']*)["\']\)\]$')
Now = datetime.datetime


def wants_table(accept: str) -> bool:
    """Whether the client (kubectl) asked for server-side printing."""
    return 'as=Table' in accept


def _parse(timestamp: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(str(timestamp), '%Y-%m-%dT%H:%M:%SZ').replace(tzinfo=datetime.UTC)
    except ValueError:
        return None


def human_duration(seconds: int) -> str:
    """Kubernetes' ``duration.HumanDuration`` (what kubectl shows as an age)."""
    if seconds < -1:
        return '<invalid>'
    seconds = max(seconds, 0)
    if seconds < 120:
        return f'{seconds}s'
    minutes = seconds // 60
    if minutes < 10:
        return f'{minutes}m{seconds % 60}s' if seconds % 60 else f'{minutes}m'
    if minutes < 180:
        return f'{minutes}m'
    hours = seconds // 3600
    if hours < 8:
        return f'{hours}h{minutes % 60}m' if minutes % 60 else f'{hours}h'
    if hours < 48:
        return f'{hours}h'
    if hours < 24 * 8:
        return f'{hours // 24}d{hours % 24}h' if hours % 24 else f'{hours // 24}d'
    return f'{hours // 24}d' if hours < 24 * 365 * 2 else f'{hours // (24 * 365)}y'


def _age(timestamp: Any, now: Now) -> str:
    then = _parse(timestamp)
    return '<unknown>' if then is None else human_duration(int((now - then).total_seconds()))


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


def _init_status(pod: Mapping[str, Any]) -> str | None:
    """``Init:…`` while the pod's init containers have not all succeeded (kubectl's printPod): ``Init:N/M`` while
    the N+1st runs or waits to, ``Init:<reason>`` (``Init:Error``, ``Init:CrashLoopBackOff``) when it failed or
    cannot start; None once they are done (or the pod's ``Initialized`` condition is True)."""
    spec, status = pod.get('spec') or {}, pod.get('status') or {}
    if any(c.get('type') == 'Initialized' and c.get('status') == 'True' for c in status.get('conditions') or []):
        return None
    total = len(spec.get('initContainers') or [])
    for index, container in enumerate(status.get('initContainerStatuses') or []):
        state = container.get('state') or {}
        terminated, waiting = state.get('terminated'), (state.get('waiting') or {}).get('reason')
        if terminated and terminated.get('exitCode') == 0:
            continue
        if terminated:
            return 'Init:' + (terminated.get('reason') or (f'Signal:{terminated["signal"]}' if terminated.get('signal')
                                                           else f'ExitCode:{terminated.get("exitCode")}'))
        if waiting and waiting != 'PodInitializing':
            return f'Init:{waiting}'
        return f'Init:{index}/{total}'
    return None


def _pod_status(pod: Mapping[str, Any]) -> str:
    """The STATUS column of ``kubectl get pods`` (kubectl's printPod: init containers first, then the regular ones)."""
    meta, status = pod.get('metadata') or {}, pod.get('status') or {}
    reason = status.get('reason') or status.get('phase') or 'Unknown'
    running = False
    initializing = _init_status(pod)
    if initializing is not None:
        reason = initializing
    for container in reversed([] if initializing else status.get('containerStatuses') or []):
        state = container.get('state') or {}
        if (state.get('waiting') or {}).get('reason'):
            reason = state['waiting']['reason']
        elif terminated := state.get('terminated'):
            reason = terminated.get('reason') or (f'Signal:{terminated["signal"]}' if terminated.get('signal')
                                                  else f'ExitCode:{terminated.get("exitCode")}')
        elif 'running' in state and container.get('ready'):
            running = True
    if running and reason == 'Completed':
        reason = 'Running'
    if meta.get('deletionTimestamp'):
        reason = 'Terminating'
    return str(reason)


def _restarts(pod: Mapping[str, Any], now: Now) -> str:
    """RESTARTS: the init containers' while the pod initializes, else the regular containers' (kubectl's printPod)."""
    key = 'initContainerStatuses' if _init_status(pod) is not None else 'containerStatuses'
    statuses = (pod.get('status') or {}).get(key) or []
    count = sum(int(c.get('restartCount') or 0) for c in statuses)
    finished = [t for c in statuses if (t := _parse(((c.get('lastState') or {}).get('terminated') or {})
                                                    .get('finishedAt')))]
    return f'{count} ({_age(max(finished).strftime("%Y-%m-%dT%H:%M:%SZ"), now)} ago)' if count and finished \
        else str(count)


def _pod_cells(pod: Mapping[str, Any], now: Now) -> list[Any]:
    spec, status = pod.get('spec') or {}, pod.get('status') or {}
    statuses = status.get('containerStatuses') or []
    ready = f'{sum(1 for c in statuses if c.get("ready"))}/{len(spec.get("containers") or []) or len(statuses)}'
    return [ready, _pod_status(pod), _restarts(pod, now), _age(pod.get('metadata', {}).get('creationTimestamp'), now),
            status.get('podIP') or '<none>', spec.get('nodeName') or '<none>', '<none>', '<none>']


def _event_cells(event: Mapping[str, Any], now: Now) -> list[Any]:
    involved = event.get('involvedObject') or event.get('regarding') or {}
    last = event.get('lastTimestamp') or event.get('eventTime') or (event.get('metadata') or {}).get(
        'creationTimestamp')
    source = event.get('source') or {}
    return [_age(last, now), event.get('type', ''), event.get('reason', ''),
            f'{str(involved.get("kind", "")).lower()}/{involved.get("name", "")}',
            involved.get('fieldPath', ''), ', '.join(v for v in (source.get('component'), source.get('host')) if v),
            event.get('message') or event.get('note') or '',
            _age(event.get('firstTimestamp') or last, now), event.get('count') or 1,
            (event.get('metadata') or {}).get('name', '')]


def _deployment_cells(obj: Mapping[str, Any], now: Now) -> list[Any]:
    spec, status = obj.get('spec') or {}, obj.get('status') or {}
    containers = ((spec.get('template') or {}).get('spec') or {}).get('containers') or []
    selector = (spec.get('selector') or {}).get('matchLabels') or {}
    return [f'{status.get("readyReplicas") or 0}/{spec.get("replicas", 1)}', status.get('updatedReplicas') or 0,
            status.get('availableReplicas') or 0, _age(obj.get('metadata', {}).get('creationTimestamp'), now),
            ','.join(c.get('name', '') for c in containers), ','.join(c.get('image', '') for c in containers),
            ','.join(f'{k}={v}' for k, v in selector.items()) or '<none>']


def _statefulset_cells(obj: Mapping[str, Any], now: Now) -> list[Any]:
    """kubectl's printStatefulSet: READY is readyReplicas/spec.replicas."""
    spec, status = obj.get('spec') or {}, obj.get('status') or {}
    containers = ((spec.get('template') or {}).get('spec') or {}).get('containers') or []
    return [f'{status.get("readyReplicas") or 0}/{spec.get("replicas", 1)}',
            _age(obj.get('metadata', {}).get('creationTimestamp'), now),
            ','.join(c.get('name', '') for c in containers), ','.join(c.get('image', '') for c in containers)]


def _controllerrevision_cells(obj: Mapping[str, Any], now: Now) -> list[Any]:
    """kubectl's printControllerRevision: CONTROLLER is <kind>.<group>/<name> of its controller."""
    owner = next((r for r in (obj.get('metadata') or {}).get('ownerReferences') or [] if r.get('controller')), None)
    controller = '<none>'
    if owner is not None:
        group = str(owner.get('apiVersion', '')).rpartition('/')[0]
        controller = f'{str(owner.get("kind", "")).lower()}{"." + group if group else ""}/{owner.get("name", "")}'
    return [controller, obj.get('revision', 0), _age(obj.get('metadata', {}).get('creationTimestamp'), now)]


def _service_cells(obj: Mapping[str, Any], now: Now) -> list[Any]:
    spec = obj.get('spec') or {}
    ports = ','.join(f'{p.get("port")}/{p.get("protocol", "TCP")}' for p in spec.get('ports') or []) or '<none>'
    selector = ','.join(f'{k}={v}' for k, v in (spec.get('selector') or {}).items()) or '<none>'
    return [spec.get('type', 'ClusterIP'), spec.get('clusterIP') or '<none>',
            ','.join(spec.get('externalIPs') or []) or '<none>', ports,
            _age(obj.get('metadata', {}).get('creationTimestamp'), now), selector]


def _namespace_cells(obj: Mapping[str, Any], now: Now) -> list[Any]:
    return [(obj.get('status') or {}).get('phase', ''), _age(obj.get('metadata', {}).get('creationTimestamp'), now)]


Columns = list[tuple[str, int]]  # (name, priority); the first column is always Name
#: Built-in tables: the columns after Name (as the real API server prints them), and the cells of an object.
_BUILTIN: dict[tuple[str, str], tuple[Columns, Callable[[Mapping[str, Any], Now], list[Any]]]] = {
    ('', 'pods'): ([('Ready', 0), ('Status', 0), ('Restarts', 0), ('Age', 0), ('IP', 1), ('Node', 1),
                    ('Nominated Node', 1), ('Readiness Gates', 1)], _pod_cells),
    ('', 'events'): ([('Last Seen', 0), ('Type', 0), ('Reason', 0), ('Object', 0), ('Subobject', 1),
                      ('Source', 1), ('Message', 0), ('First Seen', 1), ('Count', 1), ('Name', 1)], _event_cells),
    ('events.k8s.io', 'events'): ([('Last Seen', 0), ('Type', 0), ('Reason', 0), ('Object', 0), ('Subobject', 1),
                                   ('Source', 1), ('Message', 0), ('First Seen', 1), ('Count', 1), ('Name', 1)],
                                  _event_cells),
    ('apps', 'deployments'): ([('Ready', 0), ('Up-to-date', 0), ('Available', 0), ('Age', 0), ('Containers', 1),
                               ('Images', 1), ('Selector', 1)], _deployment_cells),
    ('apps', 'statefulsets'): ([('Ready', 0), ('Age', 0), ('Containers', 1), ('Images', 1)], _statefulset_cells),
    ('apps', 'controllerrevisions'): ([('Controller', 0), ('Revision', 0), ('Age', 0)], _controllerrevision_cells),
    ('', 'services'): ([('Type', 0), ('Cluster-IP', 0), ('External-IP', 0), ('Port(s)', 0), ('Age', 0),
                        ('Selector', 1)], _service_cells),
    ('', 'namespaces'): ([('Status', 0), ('Age', 0)], _namespace_cells),
}


def _definition(name: str, kind: str, priority: int, fmt: str = '') -> dict[str, Any]:
    return {'name': name, 'type': kind, 'format': fmt, 'description': name, 'priority': priority}


def as_table(rdef: ResourceDef, result: Mapping[str, Any], now: Now | None = None) -> dict[str, Any]:
    """Render an object or a list as a Table: Name, then the CRD's printer columns or the built-in's columns."""
    now = now or datetime.datetime.now(datetime.UTC)
    items = result.get('items', []) if 'items' in result else [result]
    definitions = [_definition('Name', 'string', 0, 'name')]
    builtin = None if rdef.printer_columns else _BUILTIN.get(rdef.storage_key)
    rows = []
    if builtin is not None:
        columns, cells_of = builtin
        named = rdef.plural != 'events'  # events lead with Last Seen and end with their name
        definitions = (definitions if named else []) + [_definition(n, 'string', p) for n, p in columns]
        for obj in items:
            row = cells_of(obj, now)
            rows.append({'cells': [obj.get('metadata', {}).get('name', ''), *row] if named else row,
                         'object': obj})
    else:
        printer = [(c.get('name', ''), c.get('type', 'string'), c.get('jsonPath', ''), int(c.get('priority', 0)))
                   for c in rdef.printer_columns]
        has_age = any(path == '.metadata.creationTimestamp' for _, _, path, _ in printer)
        definitions += [_definition(n, t, p) for n, t, _, p in printer]
        if not has_age:
            definitions.append(_definition('Age', 'string', 0))
        for obj in items:
            cells: list[Any] = [obj.get('metadata', {}).get('name', '')]
            for _, kind, path, _ in printer:
                value = _jsonpath(obj, path)
                cells.append(_age(value, now) if kind == 'date' and value is not None else value)
            if not has_age:
                cells.append(_age(obj.get('metadata', {}).get('creationTimestamp'), now))
            rows.append({'cells': cells, 'object': obj})
    meta = dict(result.get('metadata') or {}) if 'items' in result else {}
    return {'kind': 'Table', 'apiVersion': 'meta.k8s.io/v1', 'metadata': meta,
            'columnDefinitions': definitions, 'rows': rows}
