"""A stateful Kubernetes API emulator served over real HTTP on loopback.

:class:`KubeEmulator` subclasses :class:`kmock.KubernetesEmulator` (pinned ``kmock==0.8``): it keeps
kmock's request parsing, request recording and DSL reactions (``emu['get /api/v1/pods'] << 500`` still
overrides a response, for fault injection), and replaces kmock's in-memory logic with its own store:

* objects get ``uid``, a global ``resourceVersion``, ``creationTimestamp``, ``generation`` (bumped when
  anything but ``metadata``/``status`` changes) and ``generateName``;
* JSON patches (with ``test``), merge patches, strategic merge patches (built-in types only, as in the
  real API), PUT with optimistic concurrency, 409 AlreadyExists/Conflict, 404/422 ``Status`` bodies;
* ``status`` and ``scale`` subresources, for built-ins and CRDs that declare them;
* lists (``XxxList`` with a ``resourceVersion``) and watches with label/field selectors, ``timeoutSeconds``
  and ``resourceVersion`` resume from a bounded per-resource history (410 Expired beyond it);
* discovery of built-ins and of CRDs created at run time (served at once, ``Established=True``);
* finalizers with ``deletionTimestamp``, immediate cascading garbage collection by ``ownerReferences``;
* ``pods/log`` with text set by :meth:`KubeEmulator.set_pod_log` (``previous=true``, ``tailLines``,
  ``limitBytes``); an RBAC-style access log;
* admission of HTTP writes (:mod:`~vllm_operator_sim.emulator_admission`): names, unknown fields
  (``fieldValidation``), CRD pruning, defaults, schema and CEL rules, built-in types; ``dryRun=All`` on
  every write; server-side apply with field managers and conflicts (:mod:`~vllm_operator_sim.emulator_apply`);
* ``/openapi/v2`` and ``/openapi/v3`` (:mod:`~vllm_operator_sim.emulator_openapi`) for ``kubectl explain``
  and validation; server-side tables with kubectl's columns (:mod:`~vllm_operator_sim.emulator_tables`).

Timestamps come from :attr:`KubeEmulator.now` (the wall clock, or the simulated cluster's clock), so ages
agree with the timestamps the simulated kubelet writes.

Deliberate simplifications: creating an object in a missing namespace creates the namespace; deleting
a namespace deletes its objects and the namespace at once; pods are deleted without a grace period;
core and ``events.k8s.io`` events are stored separately; objects are stored once per group and plural
(no conversion between CRD versions); writes through the direct Python API skip admission and field
ownership (so tests can store what a client could not). A watch with ``sendInitialEvents=true`` (client-go's
watch-list, as kubectl 1.35 uses it) gets the current objects, then the BOOKMARK that ends them. Not supported:
pagination (``limit`` returns everything), other BOOKMARK events, protobuf and CBOR bodies (``kubectl create
deployment`` sends protobuf: 415), admission webhooks, auth.

:class:`EmulatedAPIServer` serves an emulator on ``127.0.0.1`` from a background thread with its own
event loop, so blocking clients, kopf and subprocesses such as ``kubectl`` can all talk to it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import dataclasses
import datetime
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import aiohttp.web
import attrs
import kmock
import yaml

from vllm_operator_sim import statefulset
from vllm_operator_sim.emulator_admission import (
    FieldError,
    annotation_errors,
    apply_defaults,
    cel_errors,
    name_errors,
    prune_unknown,
    schema_errors,
)
from vllm_operator_sim.emulator_apply import ApplyConflict, track_update
from vllm_operator_sim.emulator_apply import apply as server_side_apply
from vllm_operator_sim.emulator_openapi import (
    OBJECT_META,
    crd_schema,
    kind_schema_name,
    openapi_v2,
    openapi_v3_doc,
    openapi_v3_paths,
)
from vllm_operator_sim.emulator_patches import PatchError, json_patch, merge_patch, strategic_merge_patch
from vllm_operator_sim.emulator_resources import (
    BUILTIN_RESOURCES,
    ResourceDef,
    api_group,
    api_group_list,
    api_resource_list,
    from_crd,
)
from vllm_operator_sim.emulator_selectors import (
    SelectorError,
    parse_field_selector,
    parse_label_selector,
    selector_from_match_labels,
)
from vllm_operator_sim.emulator_tables import as_table, wants_table

__all__ = ['APIError', 'AccessRecord', 'EmulatedAPIServer', 'KubeEmulator', 'ResourceDef']

log = logging.getLogger(__name__)
T = TypeVar('T')
Obj = dict[str, Any]
ObjKey = tuple[str, str]  # (namespace or '' for cluster-scoped, name)
_NS = next(r for r in BUILTIN_RESOURCES if r.plural == 'namespaces')
_CRD = next(r for r in BUILTIN_RESOURCES if r.plural == 'customresourcedefinitions')
_STS = next(r for r in BUILTIN_RESOURCES if r.plural == 'statefulsets')
_SYSTEM_META = ('uid', 'creationTimestamp', 'deletionTimestamp', 'deletionGracePeriodSeconds',
                'generation', 'resourceVersion', 'name', 'namespace', 'managedFields')
_APPLY_PATCH = 'application/apply-patch+yaml'


class AccessRecord(NamedTuple):
    """One resource request as RBAC sees it: ``verb`` is get/list/watch/create/update/patch/delete/deletecollection."""

    verb: str
    group: str
    resource: str
    subresource: str | None
    namespace: str | None


class APIError(Exception):
    """An API failure rendered as a ``Status`` object, as the real API server does."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, dict(details or {})

    def status(self) -> Obj:
        body: Obj = {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                     'message': self.message, 'reason': self.reason, 'code': self.code}
        if self.details:
            body['details'] = self.details
        return body


def _details(rdef: ResourceDef, name: str) -> Obj:
    return {'name': name, 'group': rdef.group, 'kind': rdef.plural}


def _not_found(rdef: ResourceDef, name: str) -> APIError:
    return APIError(404, 'NotFound', f'{rdef.qualified} "{name}" not found', _details(rdef, name))


def _conflict(rdef: ResourceDef, name: str) -> APIError:
    return APIError(409, 'Conflict', f'Operation cannot be fulfilled on {rdef.qualified} "{name}": the object '
                    'has been modified; please apply your changes to the latest version and try again',
                    _details(rdef, name))


def _invalid(rdef: ResourceDef, name: str, why: str) -> APIError:
    return APIError(422, 'Invalid', f'{rdef.kind} "{name}" is invalid: {why}', _details(rdef, name))


def _invalid_fields(rdef: ResourceDef, name: Any, errors: list[FieldError]) -> APIError:
    """A 422 as the real server words it: ``Kind.group "name" is invalid: [field: message, …]``."""
    kind = f'{rdef.kind}.{rdef.group}' if rdef.group else rdef.kind
    text = str(errors[0]) if len(errors) == 1 else '[' + ', '.join(map(str, errors)) + ']'
    details = {**_details(rdef, str(name)), 'kind': rdef.kind, 'causes': [e.cause() for e in errors]}
    return APIError(422, 'Invalid', f'{kind} "{name}" is invalid: {text}', details)


@dataclasses.dataclass
class _WriteOptions:
    """What an HTTP write asks for (the direct API writes with ``admit=False``)."""

    admit: bool = False
    dry_run: bool = False
    field_validation: str = 'Warn'
    manager: str | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def from_request(cls, params: Mapping[str, str], user_agent: str) -> _WriteOptions:
        dry_run = params.get('dryRun')
        if dry_run not in (None, '', 'All'):
            raise _bad_request(f'Invalid dry run value: {dry_run!r}, only "All" is allowed')
        validation = params.get('fieldValidation') or 'Warn'
        if validation not in ('Ignore', 'Warn', 'Strict'):
            raise _bad_request(f'fieldValidation must be one of "Ignore", "Warn" or "Strict", not {validation!r}')
        manager = params.get('fieldManager') or (user_agent.split('/')[0] if user_agent else 'unknown')
        return cls(admit=True, dry_run=dry_run == 'All', field_validation=validation, manager=manager[:128])


_DIRECT = _WriteOptions()


def _bad_request(message: str) -> APIError:
    return APIError(400, 'BadRequest', message)


_NO_RESOURCE = APIError(404, 'NotFound', 'the server could not find the requested resource')


def _wall_clock() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _get_path(obj: Mapping[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.strip('.').split('.'):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _set_path(obj: Obj, path: str, value: Any) -> None:
    *parents, last = path.strip('.').split('.')
    for part in parents:
        obj = obj.setdefault(part, {})
    obj[last] = value


def _body_of(obj: Mapping[str, Any]) -> Obj:
    """What ``generation`` tracks: everything except metadata and status."""
    return {k: v for k, v in obj.items() if k not in ('metadata', 'status', 'apiVersion', 'kind')}


@dataclasses.dataclass(frozen=True)
class _Event:
    rv: int
    type: str
    obj: Obj
    old: Obj | None = None


@dataclasses.dataclass(eq=False)
class _Watcher:
    key: tuple[str, str]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[_Event | None]


@attrs.define(kw_only=True, eq=False)
class KubeEmulator(kmock.KubernetesEmulator):
    """The stateful API. All public methods are thread-safe; the ``*_object`` ones bypass HTTP.

    Objects are never mutated in place once stored (every write stores a new dict), and the direct API
    returns deep copies. Direct writes follow the same rules as HTTP ones (status subresource, conflicts,
    finalizers), except that :meth:`create_object` keeps a given ``status``.
    """

    history_size: int = 1000  #: watch events kept per resource for ``resourceVersion`` resumes
    #: The cluster's clock: ``creationTimestamp``, ``deletionTimestamp``, ages in tables, managedFields times.
    now: Callable[[], datetime.datetime] = _wall_clock
    max_recorded_requests: int = 2000  #: kmock's request records kept (older ones are dropped)
    access_log: collections.deque[AccessRecord] = attrs.field(
        factory=lambda: collections.deque(maxlen=100_000), init=False)
    _state_lock: threading.RLock = attrs.field(factory=threading.RLock, init=False)
    _changed: threading.Condition = attrs.field(init=False)
    _defs: dict[tuple[str, str, str], ResourceDef] = attrs.field(factory=dict, init=False)
    _store: dict[tuple[str, str], dict[ObjKey, Obj]] = attrs.field(factory=dict, init=False)
    _history: dict[tuple[str, str], collections.deque[_Event]] = attrs.field(factory=dict, init=False)
    _floors: dict[tuple[str, str], int] = attrs.field(factory=dict, init=False)
    _watchers: set[_Watcher] = attrs.field(factory=set, init=False)
    _logs: dict[tuple[str, str, str | None], str] = attrs.field(factory=dict, init=False)
    _previous_logs: dict[tuple[str, str, str | None], str] = attrs.field(factory=dict, init=False)
    _accessed: set[AccessRecord] = attrs.field(factory=set, init=False)
    _rv: int = attrs.field(default=0, init=False)
    _http_marks: int = attrs.field(default=0, init=False)  # HTTP requests begun plus requests ended

    def __attrs_post_init__(self) -> None:
        # Deliberately not calling kmock's: its fallback reactions are replaced by _serve().
        self._changed = threading.Condition(self._state_lock)
        for rdef in BUILTIN_RESOURCES:
            self.register_resource(rdef)
        for ns in ('default', 'kube-system', 'kube-public', 'kube-node-lease'):
            self._create(_NS, None, {'metadata': {'name': ns}}, from_api=False)

    # --- resources ------------------------------------------------------------------------------

    def register_resource(self, rdef: ResourceDef) -> None:
        """Serve a resource (in discovery and over HTTP) in addition to the built-ins and CRDs."""
        with self._state_lock:
            self._defs[rdef.group, rdef.version, rdef.plural] = rdef

    def served_resources(self) -> list[ResourceDef]:
        """All resources served now, built-in and CRD-derived."""
        with self._state_lock:
            return list(self._defs.values())

    def resolve(self, resource: str | ResourceDef) -> ResourceDef:
        """Find a resource by plural, ``plural.group``, ``group/version/plural``, kind or short name."""
        if isinstance(resource, ResourceDef):
            return resource
        with self._state_lock:
            found = sorted((r for r in self._defs.values() if resource in r.names()), key=lambda r: r.group != '')
        if not found:
            raise KeyError(f'unknown resource: {resource!r}')
        return found[0]

    def _def_for(self, key: tuple[str, str]) -> ResourceDef | None:
        return next((r for r in self._defs.values() if r.storage_key == key), None)

    # --- direct API -----------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The latest resourceVersion handed out (global, as in etcd)."""
        return self._rv

    def _ns(self, rdef: ResourceDef, namespace: str | None) -> str:
        return (namespace or 'default') if rdef.namespaced else ''

    def create_object(self, resource: str | ResourceDef, obj: Mapping[str, Any], namespace: str | None = None, *,
                      manager: str | None = None) -> Obj:
        """Create an object (``metadata.namespace`` or ``namespace`` or ``default``); its status is kept.

        With ``manager`` (a field manager, e.g. ``kubectl``) the create is admitted as an HTTP one is: schema,
        pruning, CRD defaults and CEL rules (a 422 :class:`APIError` when refused), status dropped, fields owned.
        """
        rdef = self.resolve(resource)
        if manager is None:
            return copy.deepcopy(self._create(rdef, namespace, dict(obj), from_api=False))
        opts = _WriteOptions(admit=True, field_validation='Strict', manager=manager)
        return copy.deepcopy(self._create(rdef, namespace, dict(obj), from_api=True, opts=opts))

    def get_object(self, resource: str | ResourceDef, name: str, namespace: str | None = None) -> Obj | None:
        """The object, or ``None`` if absent."""
        rdef = self.resolve(resource)
        with self._state_lock:
            obj = self._store.get(rdef.storage_key, {}).get((self._ns(rdef, namespace), name))
            return copy.deepcopy(obj) if obj is not None else None

    def list_objects(self, resource: str | ResourceDef, namespace: str | None = None, *,
                     label_selector: str | None = None, field_selector: str | None = None) -> list[Obj]:
        """Objects of all namespaces (or one), filtered by selector strings as in the API."""
        rdef = self.resolve(resource)
        items, _ = self._select(rdef, namespace, None, label_selector, field_selector)
        return copy.deepcopy(items)

    def patch_object(self, resource: str | ResourceDef, name: str, patch: Any, namespace: str | None = None, *,
                     patch_type: str = 'merge', subresource: str | None = None, manager: str | None = None) -> Obj:
        """Patch like the API: ``patch_type`` is ``merge``, ``strategic`` or ``json``; admitted as an HTTP patch
        when ``manager`` is given (see :meth:`create_object`)."""
        rdef = self.resolve(resource)
        fn = self._patcher(rdef, name, {'merge': 'application/merge-patch+json', 'json': 'application/json-patch+json',
                                        'strategic': 'application/strategic-merge-patch+json'}[patch_type], patch)
        opts = _DIRECT if manager is None else _WriteOptions(admit=True, field_validation='Strict', manager=manager)
        return copy.deepcopy(self._write(rdef, self._ns(rdef, namespace), name, fn, subresource=subresource,
                                         opts=opts))

    def patch_status(self, resource: str | ResourceDef, name: str, status: Mapping[str, Any],
                     namespace: str | None = None) -> Obj:
        """Merge-patch ``.status`` (via the status subresource where the resource has one)."""
        rdef = self.resolve(resource)
        sub = 'status' if 'status' in rdef.subresources else None
        return self.patch_object(rdef, name, {'status': dict(status)}, namespace, subresource=sub)

    def replace_object(self, resource: str | ResourceDef, obj: Mapping[str, Any], namespace: str | None = None, *,
                       subresource: str | None = None) -> Obj:
        """PUT semantics: a stale ``metadata.resourceVersion`` raises a 409 :class:`APIError`."""
        rdef = self.resolve(resource)
        meta = obj.get('metadata') or {}
        ns = self._ns(rdef, namespace or meta.get('namespace'))
        return copy.deepcopy(self._write(rdef, ns, meta.get('name', ''), lambda _: copy.deepcopy(dict(obj)),
                                         subresource=subresource))

    def delete_object(self, resource: str | ResourceDef, name: str, namespace: str | None = None, *,
                      propagation_policy: str | None = None) -> Obj | None:
        """Delete like the API (finalizers respected); returns the last state, or ``None`` if absent."""
        rdef = self.resolve(resource)
        try:
            return copy.deepcopy(self._delete(rdef, self._ns(rdef, namespace), name,
                                              {'propagationPolicy': propagation_policy}))
        except APIError as e:
            if e.code == 404:
                return None
            raise

    def set_pod_log(self, namespace: str, name: str, text: str, container: str | None = None, *,
                    previous: bool = False) -> None:
        """Set what ``GET pods/log`` returns (for one container, or for any container if ``None``).

        With ``previous=True``: the log of the container's previous run (``?previous=true``).
        """
        with self._state_lock:
            (self._previous_logs if previous else self._logs)[namespace, name, container] = text

    def append_pod_log(self, namespace: str, name: str, text: str, container: str | None = None) -> None:
        """Append to a pod's log."""
        with self._state_lock:
            self._logs[namespace, name, container] = self._logs.get((namespace, name, container), '') + text

    def accessed(self) -> set[AccessRecord]:
        """Every distinct (verb, group, resource, subresource, namespace) requested so far."""
        with self._state_lock:
            return set(self._accessed)

    def activity(self) -> tuple[int, int, int]:
        """What changes while anyone works against the API: (the latest resourceVersion, HTTP requests begun plus
        ended, watch events not yet written to their streams). The simulated cluster's pacer waits for it to stand
        still (:mod:`vllm_operator_sim.pacer`)."""
        with self._state_lock:
            return self._rv, self._http_marks, sum(w.queue.qsize() for w in self._watchers)

    def wait_for(self, predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.05,
                 message: str = '') -> T:
        """Poll ``predicate`` (waking up early on every change) until truthy; return its result.

        Raises :class:`TimeoutError` after ``timeout`` seconds. Do not call it from the emulator's loop.
        """
        deadline = time.monotonic() + timeout
        while not (result := predicate()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(message or f'condition not met in {timeout}s: {predicate!r}')
            with self._changed:
                self._changed.wait(min(interval, remaining))
        return result

    async def await_for(self, predicate: Callable[[], T | Awaitable[T]], timeout: float = 10.0,
                        interval: float = 0.05, message: str = '') -> T:
        """The asyncio variant of :meth:`wait_for` (the predicate may be a coroutine function)."""
        deadline = time.monotonic() + timeout
        while True:
            result = predicate()
            if isinstance(result, Awaitable):
                result = await result
            if result:
                return result
            if time.monotonic() >= deadline:
                raise TimeoutError(message or f'condition not met in {timeout}s: {predicate!r}')
            await asyncio.sleep(interval)

    def close_watches(self) -> None:
        """End all open watch streams (as the server does when it stops)."""
        with self._state_lock:
            for watcher in list(self._watchers):
                self._notify(watcher, None)

    # --- the store ------------------------------------------------------------------------------

    def _stamp(self) -> str:
        return self.now().astimezone(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')

    def _crd_of(self, rdef: ResourceDef) -> Obj | None:
        """The CustomResourceDefinition serving a custom resource."""
        with self._state_lock:
            return self._store.get(_CRD.storage_key, {}).get(('', f'{rdef.plural}.{rdef.group}'))

    def _schema_of(self, rdef: ResourceDef) -> tuple[dict[str, Any] | None, str | None]:
        """(a CRD version's schema, or ``None``; the built-in definition name, or ``None``)."""
        if rdef.custom:
            crd = self._crd_of(rdef)
            return (crd_schema(crd, rdef.version) if crd is not None else None), None
        return None, kind_schema_name(rdef)

    def _field_schema(self, rdef: ResourceDef) -> dict[str, Any]:
        """The schema that tells associative lists from atomic ones (for field ownership)."""
        schema, builtin = self._schema_of(rdef)
        if schema is not None:
            return schema
        return {'$ref': f'#/$defs/{builtin}'} if builtin else {'properties': {'metadata': {
            '$ref': f'#/$defs/{OBJECT_META}'}}}

    def _admit(self, rdef: ResourceDef, obj: Obj, old: Obj | None, opts: _WriteOptions,
               subresource: str | None = None) -> None:
        """Validate an HTTP write (pruning and defaulting ``obj`` in place); raise 400/422.

        A status write admits ``.status`` only: the rest is the stored object's, which it cannot change.
        """
        schema, builtin = self._schema_of(rdef)
        if subresource == 'status' and 'status' in obj:
            if schema is not None:
                preserve = {'x-kubernetes-preserve-unknown-fields': True} if schema.get(
                    'x-kubernetes-preserve-unknown-fields') else {}
                schema = {'type': 'object', 'properties': {
                    'status': (schema.get('properties') or {}).get('status') or preserve}}
                view: Obj = {'status': obj['status']}
                self._admit_view(rdef, obj, view, {'status': (old or {}).get('status')}, schema, None, opts)
                obj['status'] = view['status']
            return
        self._admit_view(rdef, obj, obj, old, schema, builtin, opts)

    def _admit_view(self, rdef: ResourceDef, obj: Obj, view: Obj, old: Obj | None, schema: dict[str, Any] | None,
                    builtin: str | None, opts: _WriteOptions) -> None:
        errors: list[FieldError] = annotation_errors(view.get('metadata')) if view is obj else []
        dropped: list[str] = []
        if schema is not None:
            dropped = prune_unknown(view, schema)
            apply_defaults(view, schema)
            errors = schema_errors(view, crd_schema=schema, old=old) + cel_errors(view, schema, old)
        elif builtin is not None:
            dropped = prune_unknown(view, {'$ref': f'#/$defs/{builtin}'}, builtin=True)
            if rdef.storage_key == _STS.storage_key:  # the apps/v1 defaults and semantic rules of a StatefulSet
                statefulset.set_defaults(view)
            errors = schema_errors(view, builtin=builtin, old=old)
            if rdef.storage_key == _STS.storage_key:
                errors += statefulset.validation_errors(view, old)
        if dropped and opts.field_validation == 'Strict':
            raise _bad_request('strict decoding error: ' + ', '.join(f'unknown field "{f}"' for f in dropped))
        if opts.field_validation == 'Warn':
            opts.warnings += [f'unknown field "{f}"' for f in dropped]
        if errors:
            raise _invalid_fields(rdef, obj['metadata'].get('name'), errors)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _notify(self, watcher: _Watcher, item: _Event | None) -> None:
        try:
            watcher.loop.call_soon_threadsafe(watcher.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed
            self._watchers.discard(watcher)

    def _emit(self, rdef: ResourceDef, kind: str, obj: Obj, old: Obj | None = None) -> None:
        event = _Event(self._rv, kind, obj, old)
        history = self._history.setdefault(rdef.storage_key, collections.deque())
        if len(history) >= self.history_size:
            self._floors[rdef.storage_key] = history.popleft().rv
        history.append(event)
        for watcher in list(self._watchers):
            if watcher.key == rdef.storage_key:
                self._notify(watcher, event)
        self._changed.notify_all()

    def _matcher(self, namespace: str | None, name: str | None, label_selector: str | None,
                 field_selector: str | None) -> Callable[[Obj], bool]:
        try:
            labels_ok, fields_ok = parse_label_selector(label_selector), parse_field_selector(field_selector)
        except SelectorError as e:
            raise _bad_request(str(e)) from None

        def match(obj: Obj) -> bool:
            meta = obj.get('metadata') or {}
            return ((not namespace or meta.get('namespace') == namespace)
                    and (name is None or meta.get('name') == name)
                    and labels_ok(meta.get('labels') or {}) and fields_ok(obj))
        return match

    def _select(self, rdef: ResourceDef, namespace: str | None, name: str | None, label_selector: str | None,
                field_selector: str | None) -> tuple[list[Obj], int]:
        match = self._matcher(namespace, name, label_selector, field_selector)
        with self._state_lock:
            objs = self._store.get(rdef.storage_key, {})
            return [obj for _, obj in sorted(objs.items()) if match(obj)], self._rv

    @staticmethod
    def _new_object(rdef: ResourceDef, namespace: str | None, body: Any) -> tuple[Obj, str]:
        """A copy of a create's body with its metadata a dict, and the namespace it goes to ('' if none)."""
        if not isinstance(body, dict):
            raise _bad_request('the body of the request must be a JSON object')
        obj = copy.deepcopy(body)
        if not isinstance(obj.get('metadata') or {}, dict):
            raise _invalid_fields(rdef, '', [FieldError('metadata', 'FieldValueTypeInvalid',
                                                        'Invalid value: must be an object')])
        meta = obj['metadata'] = dict(obj.get('metadata') or {})
        if not rdef.namespaced:
            meta.pop('namespace', None)
            return obj, ''
        if namespace and meta.get('namespace') not in (None, '', namespace):
            raise _bad_request('the namespace of the provided object does not match the namespace sent on the request')
        key_ns = meta['namespace'] = namespace or meta.get('namespace') or 'default'
        if not isinstance(key_ns, str):
            raise _invalid_fields(rdef, meta.get('name'), [FieldError(
                'metadata.namespace', 'FieldValueTypeInvalid', 'Invalid value: must be of type string')])
        return obj, key_ns

    @staticmethod
    def _new_name(rdef: ResourceDef, meta: Obj, key_ns: str, objs: Mapping[ObjKey, Obj]) -> str:
        """The name a create stores under (``generateName`` resolved), validated and not taken."""
        if not meta.get('name') and meta.get('generateName'):
            while not meta.get('name') or (key_ns, meta['name']) in objs:
                meta['name'] = meta['generateName'] + ''.join(random.choices('bcdfghjklmnpqrstvwxz2456789', k=5))
        name = meta.get('name')
        if not name and name != 0:
            raise _invalid(rdef, '', 'metadata.name: Required value: name or generateName is required')
        if errors := name_errors(rdef.plural, rdef.group, name):
            raise _invalid_fields(rdef, name, errors)
        if (key_ns, name) in objs:
            raise APIError(409, 'AlreadyExists', f'{rdef.qualified} "{name}" already exists', _details(rdef, name))
        return str(name)

    def _create(self, rdef: ResourceDef, namespace: str | None, body: Any, *, from_api: bool,
                opts: _WriteOptions = _DIRECT) -> Obj:
        obj, key_ns = self._new_object(rdef, namespace, body)
        meta = obj['metadata']
        with self._state_lock:
            objs = self._store.setdefault(rdef.storage_key, {})
            name = self._new_name(rdef, meta, key_ns, objs)
            if from_api and 'status' in rdef.subresources:
                obj.pop('status', None)
            managed = meta.get('managedFields') if opts.admit else None
            for field in _SYSTEM_META:
                meta.pop(field, None)
            meta.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=self._stamp(), generation=1)
            obj['apiVersion'], obj['kind'] = rdef.api_version, rdef.kind
            if key_ns:
                meta['namespace'] = key_ns
            if opts.admit:
                self._admit(rdef, obj, None, opts)
                if managed is not None:  # server-side apply's create
                    meta['managedFields'] = managed
                elif opts.manager:
                    track_update(None, obj, opts.manager, self._field_schema(rdef), self.now)
            if opts.dry_run:
                if rdef.storage_key == _CRD.storage_key:
                    self._check_crd(obj)
                return obj
            if rdef.namespaced and ('', key_ns) not in self._store.get(_NS.storage_key, {}):
                self._create(_NS, None, {'metadata': {'name': key_ns}}, from_api=False)  # auto-created
            self._apply_defaults(rdef, obj)
            meta['resourceVersion'] = self._next_rv()
            objs[key_ns, name] = obj
            self._emit(rdef, 'ADDED', obj)
            return obj

    def _apply_defaults(self, rdef: ResourceDef, obj: Obj) -> None:
        """What the API server's defaulting and the controllers' first reaction would set."""
        if rdef is _NS or rdef.storage_key == _NS.storage_key:
            obj.setdefault('status', {'phase': 'Active'})
        elif rdef.storage_key == ('', 'pods'):
            obj.setdefault('status', {'phase': 'Pending'})
        elif rdef.storage_key == ('', 'persistentvolumeclaims'):  # bound later by volumes.py's binder
            obj.setdefault('spec', {}).setdefault('volumeMode', 'Filesystem')
            obj.setdefault('status', {'phase': 'Pending'})
        elif rdef.storage_key in (('apps', 'deployments'), ('apps', 'replicasets')):
            obj.setdefault('spec', {}).setdefault('replicas', 1)
            obj.setdefault('status', {})
        elif rdef.storage_key == _STS.storage_key:
            statefulset.set_defaults(obj)
            obj.setdefault('status', {'replicas': 0, 'availableReplicas': 0})  # apps/v1 JSON: not omitempty
        elif rdef.storage_key == _CRD.storage_key:
            self._register_crd(obj)

    @staticmethod
    def _check_crd(crd: Obj) -> list[ResourceDef]:
        spec, name = crd.get('spec') or {}, crd['metadata']['name']
        names = spec.get('names') or {}
        defs = from_crd(crd)
        if not defs or not names.get('kind') or name != f'{names.get("plural")}.{spec.get("group")}':
            raise _invalid(_CRD, name, 'spec: a group, names.plural, names.kind and a served version are required, '
                           'and metadata.name must be <plural>.<group>')
        return defs

    def _register_crd(self, crd: Obj) -> None:
        spec = crd.get('spec') or {}
        names = spec.get('names') or {}
        defs = self._check_crd(crd)
        self._unregister_crd(crd)
        for rdef in defs:
            self.register_resource(rdef)
        accepted = {'plural': names['plural'], 'kind': names['kind'], 'singular': defs[0].singular,
                    'listKind': names.get('listKind', names['kind'] + 'List'), **names}
        storage = next((v['name'] for v in spec['versions'] if v.get('storage')), defs[0].version)
        conditions = (crd.get('status') or {}).get('conditions') or [
            {'type': t, 'status': 'True', 'reason': r, 'message': m, 'lastTransitionTime': self._stamp()}
            for t, r, m in [('NamesAccepted', 'NoConflicts', 'no conflicts found'),
                            ('Established', 'InitialNamesAccepted', 'the initial names have been accepted')]]
        crd['status'] = {'acceptedNames': accepted, 'storedVersions': [storage], 'conditions': conditions}

    def _unregister_crd(self, crd: Obj) -> None:
        spec = crd.get('spec') or {}
        key = (spec.get('group', ''), (spec.get('names') or {}).get('plural', ''))
        for def_key, rdef in list(self._defs.items()):
            if rdef.custom and rdef.storage_key == key:
                del self._defs[def_key]

    def _write(self, rdef: ResourceDef, namespace: str, name: str, mutate: Callable[[Obj], Any], *,
               subresource: str | None = None, opts: _WriteOptions = _DIRECT, applied: bool = False) -> Obj:
        """Read-modify-write one object with the API's rules; returns the stored result."""
        with self._state_lock:
            objs = self._store.get(rdef.storage_key, {})
            old = objs.get((namespace, name))
            if old is None:
                raise _not_found(rdef, name)
            if subresource == 'scale':
                scale = mutate(self._scale_of(rdef, old))
                candidate = copy.deepcopy(old)
                replicas = _get_path(scale, 'spec.replicas') if isinstance(scale, dict) else None
                if not isinstance(replicas, int) or replicas < 0:
                    raise _invalid(rdef, name, 'spec.replicas: must be a non-negative integer')
                _set_path(candidate, rdef.spec_replicas_path, replicas)
                candidate['metadata']['resourceVersion'] = _get_path(scale, 'metadata.resourceVersion')
            else:
                candidate = mutate(copy.deepcopy(old))
            if not isinstance(candidate, dict):
                raise _bad_request('the result must be a JSON object')
            sent_rv = (candidate.get('metadata') or {}).get('resourceVersion')
            if sent_rv not in (None, '') and str(sent_rv) != old['metadata']['resourceVersion']:
                raise _conflict(rdef, name)
            new = self._merge(rdef, old, candidate, subresource)
            self._admit_update(rdef, old, new, candidate, subresource, opts, applied)
            if new == old:
                return old
            old_meta, new_meta = old['metadata'], new['metadata']
            if old_meta.get('deletionTimestamp') and set(new_meta.get('finalizers') or []) - set(
                    old_meta.get('finalizers') or []):
                raise _invalid(rdef, name, 'metadata.finalizers: Forbidden: no new finalizers can be added '
                               'if the object is being deleted')
            if _body_of(new) != _body_of(old):
                new_meta['generation'] = int(old_meta.get('generation', 1)) + 1
            if opts.dry_run:
                return new
            if rdef.storage_key == _CRD.storage_key and subresource is None:
                self._register_crd(new)
            new_meta['resourceVersion'] = self._next_rv()
            objs[namespace, name] = new
            self._emit(rdef, 'MODIFIED', new, old)
            if new_meta.get('deletionTimestamp') and not new_meta.get('finalizers'):
                return self._remove(rdef, (namespace, name))
            return new

    def _admit_update(self, rdef: ResourceDef, old: Obj, new: Obj, candidate: Obj, subresource: str | None,
                      opts: _WriteOptions, applied: bool) -> None:
        """Admission and field ownership of an update (``new`` is changed in place)."""
        sent = (candidate.get('metadata') or {}).get('managedFields')
        # server-side apply sets managedFields itself; a client may rewrite them (kubectl's upgrade of
        # client-side apply ownership does), which the server takes as they are
        rewritten = opts.admit and isinstance(sent, list) and sent != old['metadata'].get('managedFields')
        if applied or rewritten:
            new['metadata']['managedFields'] = sent or None
        if not opts.admit:
            return
        self._admit(rdef, new, old, opts, subresource)
        if not applied and not rewritten and opts.manager:
            track_update(old, new, opts.manager, self._field_schema(rdef), self.now,
                         'status' if subresource == 'status' else None)
        if new['metadata'].get('managedFields') is None:
            new['metadata'].pop('managedFields', None)

    @staticmethod
    def _merge(rdef: ResourceDef, old: Obj, candidate: Obj, subresource: str | None) -> Obj:
        """Keep what a write may not change: system metadata, and status vs. the rest."""
        if subresource == 'status':
            new = {**old, 'metadata': dict(old['metadata'])}
            if 'status' in candidate:
                new['status'] = candidate['status']
            else:
                new.pop('status', None)
            return new
        new = dict(candidate)
        if 'status' in rdef.subresources:
            if 'status' in old:
                new['status'] = old['status']
            else:
                new.pop('status', None)
        meta = dict(candidate.get('metadata') or {})
        for field in _SYSTEM_META:
            if field in old['metadata']:
                meta[field] = old['metadata'][field]
            else:
                meta.pop(field, None)
        new['metadata'], new['apiVersion'], new['kind'] = meta, old['apiVersion'], old['kind']
        return new

    def _scale_of(self, rdef: ResourceDef, obj: Obj) -> Obj:
        meta = obj['metadata']
        if rdef.label_selector_path:
            selector = _get_path(obj, rdef.label_selector_path) or ''
        else:
            selector = selector_from_match_labels(_get_path(obj, 'spec.selector'))
        return {'apiVersion': 'autoscaling/v1', 'kind': 'Scale',
                'metadata': {k: meta[k] for k in ('name', 'namespace', 'uid', 'resourceVersion', 'creationTimestamp')
                             if k in meta},
                'spec': {'replicas': _get_path(obj, rdef.spec_replicas_path) or 0},
                'status': {'replicas': _get_path(obj, rdef.status_replicas_path) or 0, 'selector': selector}}

    def _delete(self, rdef: ResourceDef, namespace: str, name: str, options: Mapping[str, Any] | None,
                dry_run: bool = False) -> Obj:
        options = options or {}
        with self._state_lock:
            objs = self._store.get(rdef.storage_key, {})
            old = objs.get((namespace, name))
            if old is None:
                raise _not_found(rdef, name)
            pre = options.get('preconditions') or {}
            if any(pre.get(k) not in (None, old['metadata'].get(k)) for k in ('uid', 'resourceVersion')):
                raise _conflict(rdef, name)
            if dry_run:
                if old['metadata'].get('finalizers') and not old['metadata'].get('deletionTimestamp'):
                    return {**old, 'metadata': {**old['metadata'], 'deletionTimestamp': self._stamp(),
                                                'deletionGracePeriodSeconds': 0}}
                return old
            if old['metadata'].get('finalizers'):
                if old['metadata'].get('deletionTimestamp'):
                    return old
                meta = {**old['metadata'], 'deletionTimestamp': self._stamp(), 'deletionGracePeriodSeconds': 0,
                        'resourceVersion': self._next_rv()}
                new = objs[namespace, name] = {**old, 'metadata': meta}
                self._emit(rdef, 'MODIFIED', new, old)
                return new
            orphan = options.get('propagationPolicy') == 'Orphan' or options.get('orphanDependents') is True
            return self._remove(rdef, (namespace, name), orphan=orphan)

    def _remove(self, rdef: ResourceDef, key: ObjKey, *, orphan: bool = False) -> Obj:
        """Really delete an object; then the cascades: CRD instances, namespace contents, dependents."""
        old = self._store[rdef.storage_key].pop(key)
        obj = {**old, 'metadata': {**old['metadata'], 'resourceVersion': self._next_rv()}}
        self._emit(rdef, 'DELETED', obj)
        if rdef.storage_key == _CRD.storage_key:
            spec = obj.get('spec') or {}
            instances_key = (spec.get('group', ''), (spec.get('names') or {}).get('plural', ''))
            instances_def = self._def_for(instances_key)
            self._unregister_crd(obj)
            for okey in sorted(self._store.get(instances_key, {})):
                if instances_def is not None:
                    self._remove(instances_def, okey, orphan=True)
        elif rdef.storage_key == _NS.storage_key:
            for skey, objs in list(self._store.items()):
                sdef = self._def_for(skey)
                for okey in [k for k in objs if k[0] == key[1]]:
                    if sdef is not None and okey in objs:
                        self._delete(sdef, okey[0], okey[1], None)
        elif rdef.storage_key == ('', 'pods'):
            for logs in (self._logs, self._previous_logs):
                for log_key in [k for k in logs if k[:2] == key]:
                    del logs[log_key]
        if not orphan:
            self._collect_garbage(obj['metadata']['uid'])
        return obj

    def _collect_garbage(self, uid: str) -> None:
        """Delete the dependents of a deleted owner, or drop the reference if other owners remain."""
        live_uids = {o['metadata'].get('uid') for objs in self._store.values() for o in objs.values()}
        for skey, objs in list(self._store.items()):
            sdef = self._def_for(skey)
            for okey, obj in list(objs.items()):
                refs = obj['metadata'].get('ownerReferences') or []
                if sdef is None or okey not in objs or not any(r.get('uid') == uid for r in refs):
                    continue
                remaining = [r for r in refs if r.get('uid') != uid]
                if any(r.get('uid') in live_uids for r in remaining):
                    def drop_ref(o: Obj, refs: list[Any] = remaining) -> Obj:
                        return {**o, 'metadata': {**o['metadata'], 'ownerReferences': refs}}
                    self._write(sdef, okey[0], okey[1], drop_ref)
                else:
                    self._delete(sdef, okey[0], okey[1], None)

    def _patcher(self, rdef: ResourceDef, name: str, content_type: str, patch: Any) -> Callable[[Obj], Any]:
        if content_type == 'application/json-patch+json':
            apply: Callable[[Any, Any], Any] = json_patch
        elif content_type == 'application/merge-patch+json':
            apply = merge_patch
        elif content_type == 'application/strategic-merge-patch+json' and not rdef.custom:
            apply = strategic_merge_patch
        else:
            raise APIError(415, 'UnsupportedMediaType', f'the body of the request was in an unknown format - '
                           f'accepted media types include: application/json-patch+json, '
                           f'application/merge-patch+json{"" if rdef.custom else ", application/strategic-merge-patch+json"}')

        def mutate(obj: Obj) -> Any:
            try:
                return apply(obj, patch)
            except PatchError as e:
                raise _invalid(rdef, name, str(e)) from None
        return mutate

    # --- HTTP -----------------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """The aiohttp entry point: parse (as kmock does, where it can), record, handle."""
        self._http_marks += 1
        try:
            return await self._receive(raw_request)
        finally:
            self._http_marks += 1

    async def _receive(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        body = await raw_request.read()
        try:
            request = await kmock.Request._parse(raw_request, id=len(self._requests))
        except ValueError:  # kmock 0.8 cannot parse e.g. /api/v1/namespaces
            request = kmock.Request(id=len(self._requests), method=raw_request.method, url=raw_request.url,
                                    params=dict(raw_request.query), headers=dict(raw_request.headers),
                                    body=body, text=body.decode(errors='replace'), raw_request=raw_request)
        self._requests.append(request)
        if len(self._requests) > self.max_recorded_requests:
            del self._requests[:len(self._requests) - self.max_recorded_requests]
        return await self._handle(request)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """Serve user-defined kmock reactions first (if any match), then the emulated API."""
        if self._payloads:
            try:
                return await kmock.RawHandler._handle(self, request)
            except NotImplementedError:
                pass
        raw = request._raw_request
        assert raw is not None
        try:
            return await self._serve(raw, request.body, dict(raw.query))
        except APIError as e:
            return aiohttp.web.json_response(e.status(), status=e.code)
        except Exception as e:  # an emulator bug: tell the client, as the real API does
            log.exception('The emulator failed on %s %s', raw.method, raw.path_qs)
            return aiohttp.web.json_response(APIError(500, 'InternalError', repr(e)).status(), status=500)

    def _serve_discovery(self, raw: aiohttp.web.BaseRequest, parts: list[str],
                         defs: Mapping[tuple[str, str, str], ResourceDef]) -> Any:
        """The documents of non-resource paths (version, health, OpenAPI, discovery), or ``None``."""
        if not parts or parts[0] in ('version', 'healthz', 'livez', 'readyz'):
            return self._serve_nonresource(parts)
        if parts[0] == 'openapi':
            return self._serve_openapi(parts[1:])
        if parts == ['api']:
            return {'kind': 'APIVersions', 'versions': ['v1'], 'serverAddressByClientCIDRs': [
                {'clientCIDR': '0.0.0.0/0', 'serverAddress': raw.host}]}
        if parts == ['apis']:
            return api_group_list(defs.values())
        if parts[0] == 'apis' and len(parts) == 2:
            versions = list(dict.fromkeys(v for g, v, _ in defs if g == parts[1]))
            if not versions:
                raise _NO_RESOURCE
            return api_group(parts[1], versions)
        if parts[0] not in ('api', 'apis') or len(parts) < (2 if parts[0] == 'api' else 3):
            raise _NO_RESOURCE
        if len(parts) == (2 if parts[0] == 'api' else 3):  # a group version's resources
            group, version = ('', parts[1]) if parts[0] == 'api' else (parts[1], parts[2])
            served = [r for (g, v, _), r in defs.items() if (g, v) == (group, version)]
            if not served:
                raise _NO_RESOURCE
            return api_resource_list(served[0].api_version, served)
        return None

    async def _serve(self, raw: aiohttp.web.BaseRequest, body: bytes, params: dict[str, str]
                     ) -> aiohttp.web.StreamResponse:
        parts = [p for p in raw.path.split('/') if p]
        with self._state_lock:
            defs = dict(self._defs)
        document = self._serve_discovery(raw, parts, defs)
        if document is not None:
            return aiohttp.web.json_response(document)
        group, version, rest = ('', parts[1], parts[2:]) if parts[0] == 'api' else (parts[1], parts[2], parts[3:])
        watch = raw.method == 'GET' and params.get('watch') in ('true', '1')
        if rest[0] == 'watch':  # the deprecated /watch/ paths
            watch, rest = True, rest[1:]
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == 'namespaces' and (group, version, rest[2]) in defs:
            namespace, rest = rest[1], rest[2:]
        rdef = defs.get((group, version, rest[0])) if rest else None
        name = rest[1] if len(rest) > 1 else None
        sub = '/'.join(rest[2:]) or None
        if rdef is None or (namespace and not rdef.namespaced) or (sub and sub not in rdef.subresources):
            raise _NO_RESOURCE
        verb = 'watch' if watch else {
            'GET': 'get' if name else 'list', 'POST': 'create', 'PUT': 'update', 'PATCH': 'patch',
            'DELETE': 'delete' if name else 'deletecollection'}.get(raw.method)
        if verb is None or (verb == 'create' and name) or (verb in ('update', 'patch') and not name):
            raise APIError(405, 'MethodNotAllowed', f'the server does not allow this method on the requested '
                           f'resource ({raw.method} {rdef.qualified})')
        record = AccessRecord(verb, group, rdef.plural, sub, namespace)
        with self._state_lock:
            self.access_log.append(record)
            self._accessed.add(record)
        if verb == 'watch':
            return await self._stream_watch(raw, rdef, namespace, name, params)
        return self._serve_resource(raw, verb, rdef, namespace, name, sub, body, params)

    def _serve_openapi(self, parts: list[str]) -> Any:
        with self._state_lock:
            resources = self.served_resources()
            crds = {(o.get('spec', {}).get('group', ''), o.get('spec', {}).get('names', {}).get('plural', '')): o
                    for o in self._store.get(_CRD.storage_key, {}).values()}
        if parts == ['v2']:
            return openapi_v2(resources, crds)
        if parts == ['v3']:
            return openapi_v3_paths(resources, crds)
        if len(parts) > 1 and parts[0] == 'v3' and (doc := openapi_v3_doc(resources, crds, '/'.join(parts[1:]))):
            return doc
        raise _NO_RESOURCE

    def _serve_nonresource(self, parts: list[str]) -> Any:
        if not parts:
            paths = {'/api', '/api/v1', '/apis', '/version', '/healthz', '/openapi/v2', '/openapi/v3'}
            paths |= {f'/apis/{r.group}/{r.version}' for r in self.served_resources() if r.group}
            paths |= {f'/apis/{r.group}' for r in self.served_resources() if r.group}
            return {'paths': sorted(paths)}
        if parts[0] == 'version':
            return {'major': '1', 'minor': '32', 'gitVersion': 'v1.32.0-emulated', 'platform': 'linux/amd64'}
        return 'ok'

    def _serve_resource(self, raw: aiohttp.web.BaseRequest, verb: str, rdef: ResourceDef, namespace: str | None,
                        name: str | None, sub: str | None, body: bytes, params: dict[str, str]
                        ) -> aiohttp.web.StreamResponse:
        ns = self._ns(rdef, namespace)
        writes = verb in ('create', 'update', 'patch', 'delete', 'deletecollection')
        opts = _WriteOptions.from_request(params, raw.headers.get('User-Agent', '')) if writes else _DIRECT
        data = self._decode(raw.content_type, body) if writes else None
        result: Any
        status = 200
        if verb == 'list':
            items, rv = self._select(rdef, namespace, None, params.get('labelSelector'), params.get('fieldSelector'))
            result = {'kind': f'{rdef.kind}List', 'apiVersion': rdef.api_version,
                      'metadata': {'resourceVersion': str(rv)}, 'items': [self._present(rdef, o) for o in items]}
        elif verb == 'get' and sub == 'log':
            return aiohttp.web.Response(text=self._pod_log(rdef, ns, name or '', params))
        elif verb == 'patch' and raw.content_type == _APPLY_PATCH:
            assert name is not None
            result, status = self._server_side_apply(rdef, ns, name, sub, data, params, opts)
            result = self._scale_of(rdef, result) if sub == 'scale' else self._present(rdef, result)
        elif verb == 'get':
            with self._state_lock:
                obj = self._store.get(rdef.storage_key, {}).get((ns, name or ''))
            if obj is None:
                raise _not_found(rdef, name or '')
            result = self._scale_of(rdef, obj) if sub == 'scale' else self._present(rdef, obj)
        elif verb == 'create':
            if sub is not None:
                raise _NO_RESOURCE
            result, status = self._present(rdef, self._create(rdef, namespace, data, from_api=True, opts=opts)), 201
        elif verb in ('update', 'patch'):
            assert name is not None
            if verb == 'update':
                if not isinstance(data, dict) or (data.get('metadata') or {}).get('name', name) != name:
                    raise _bad_request('the name of the object does not match the name on the URL')
                fn: Callable[[Obj], Any] = lambda _: data  # noqa: E731
            else:
                fn = self._patcher(rdef, name, raw.content_type, data)
            result = self._write(rdef, ns, name, fn, subresource=sub, opts=opts)
            result = self._scale_of(rdef, result) if sub == 'scale' else self._present(rdef, result)
        elif verb == 'delete':
            options = {**(data if isinstance(data, dict) else {}), **params}
            dry_run = opts.dry_run or 'All' in (options.get('dryRun') or [])
            result = self._present(rdef, self._delete(rdef, ns, name or '', options, dry_run))
        else:  # deletecollection
            items, rv = self._select(rdef, namespace, None, params.get('labelSelector'), params.get('fieldSelector'))
            deleted = [self._delete(rdef, ns if rdef.namespaced and namespace else o['metadata'].get('namespace', ''),
                                    o['metadata']['name'], data if isinstance(data, dict) else None, opts.dry_run)
                       for o in items]
            result = {'kind': f'{rdef.kind}List', 'apiVersion': rdef.api_version,
                      'metadata': {'resourceVersion': str(self._rv)},
                      'items': [self._present(rdef, o) for o in deleted]}
        if verb in ('get', 'list') and sub is None and wants_table(raw.headers.get('Accept', '')):
            result = as_table(rdef, result, self.now())
        headers = {'Warning': ', '.join(f'299 - {json.dumps(w)}' for w in opts.warnings)} if opts.warnings else None
        return aiohttp.web.json_response(result, status=status, headers=headers)

    @staticmethod
    def _decode(content_type: str, body: bytes) -> Any:
        """A write's body: JSON, or YAML for server-side apply; ``None`` when empty."""
        if not body.strip():
            return None
        if 'protobuf' in content_type or 'cbor' in content_type:
            raise APIError(415, 'UnsupportedMediaType', 'the body of the request was in an unknown format - '
                           'accepted media types include: application/json')
        try:
            return yaml.safe_load(body) if content_type == _APPLY_PATCH else json.loads(body)
        except (ValueError, yaml.YAMLError):
            raise _bad_request('the body of the request could not be decoded as JSON') from None

    def _server_side_apply(self, rdef: ResourceDef, ns: str, name: str, sub: str | None, config: Any,
                           params: Mapping[str, str], opts: _WriteOptions) -> tuple[Obj, int]:
        """PATCH with ``application/apply-patch+yaml``: create or merge, with field managers and conflicts."""
        if not params.get('fieldManager'):
            raise _bad_request('PATCH with apply requires a fieldManager (the fieldManager query parameter)')
        if not isinstance(config, dict):
            raise _bad_request('the applied configuration must be an object')
        meta: Obj = config['metadata'] if isinstance(config.get('metadata'), dict) else {}
        if meta.get('name', name) != name:
            raise _bad_request('the name of the object does not match the name on the URL')
        force = params.get('force') in ('true', '1')
        schema = self._field_schema(rdef)
        manager = opts.manager or ''

        def applied(live: Obj) -> Obj:
            try:
                return server_side_apply(live, config, manager, schema, force=force, now=self.now,
                                         subresource='status' if sub == 'status' else None)
            except ApplyConflict as e:
                causes = [{'reason': 'FieldManagerConflict', 'message': f'conflict with "{m}"', 'field': f}
                          for m, f in e.conflicts]
                raise APIError(409, 'Conflict', str(e), {**_details(rdef, name), 'causes': causes}) from None

        with self._state_lock:
            exists = (ns, name) in self._store.get(rdef.storage_key, {})
            if exists:
                return self._write(rdef, ns, name, applied, subresource=sub, opts=opts, applied=True), 200
            if sub is not None:
                raise _not_found(rdef, name)
            skeleton: Obj = {'apiVersion': rdef.api_version, 'kind': rdef.kind,
                             'metadata': {'name': name, **({'namespace': ns} if ns else {})}}
            new = applied(skeleton)
            new['metadata'].update({k: v for k, v in meta.items() if k in ('generateName',)})
            return self._create(rdef, ns or None, new, from_api=True, opts=opts), 201

    @staticmethod
    def _present(rdef: ResourceDef, obj: Obj) -> Obj:
        """The object as served in the requested version (no conversion beyond ``apiVersion``)."""
        return obj if obj.get('apiVersion') == rdef.api_version else {**obj, 'apiVersion': rdef.api_version}

    def _pod_log(self, rdef: ResourceDef, namespace: str, name: str, params: Mapping[str, str]) -> str:
        previous = params.get('previous') in ('true', '1')
        logs = self._previous_logs if previous else self._logs
        container = params.get('container')
        with self._state_lock:
            pod = self._store.get(rdef.storage_key, {}).get((namespace, name))
            if pod is None:
                raise _not_found(rdef, name)
            if container is None:
                containers = [c.get('name') for c in (pod.get('spec') or {}).get('containers') or []]
                if len(containers) > 1:
                    raise _bad_request(f'a container name must be specified for pod {name}, choose one of: '
                                       f'{containers}')
                container = containers[0] if containers else None
            if previous and not self._running(pod, container):
                logs = self._logs  # no run after the one that ended: its log is still the container's log
            key = next((k for k in ((namespace, name, container), (namespace, name, None)) if k in logs), None)
            if key is None and previous:
                raise _bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
            text = logs[key] if key is not None else ''
        try:
            if params.get('tailLines') is not None:
                tail = int(params['tailLines'])
                text = ''.join(text.splitlines(keepends=True)[-tail:]) if tail > 0 else ''
            if params.get('limitBytes') is not None:
                text = text.encode()[:int(params['limitBytes'])].decode(errors='ignore')
        except ValueError:
            raise _bad_request('tailLines and limitBytes must be integers') from None
        return text

    @staticmethod
    def _running(pod: Obj, container: str | None) -> bool:
        """Whether a new run of the container started after the one in ``lastState.terminated``.

        ``previous=true`` reads the run recorded in ``lastState.terminated`` (as the kubelet does): the log kept
        from before the restart while the container runs again, else (back-off) the container's log as it is.
        """
        statuses = (pod.get('status') or {}).get('containerStatuses') or []
        status = next((s for s in statuses if s.get('name') == container), statuses[0] if statuses else {})
        return 'running' in (status.get('state') or {}) or 'terminated' in (status.get('state') or {})

    async def _stream_watch(self, raw: aiohttp.web.BaseRequest, rdef: ResourceDef, namespace: str | None,
                           name: str | None, params: Mapping[str, str]) -> aiohttp.web.StreamResponse:
        match = self._matcher(namespace, name, params.get('labelSelector'), params.get('fieldSelector'))
        table = wants_table(raw.headers.get('Accept', ''))
        since = params.get('resourceVersion') or '0'
        if not since.isdigit():
            raise _bad_request(f'invalid resource version: {since!r}')
        loop = asyncio.get_running_loop()
        watcher = _Watcher(rdef.storage_key, loop, asyncio.Queue())
        expired = False
        with self._state_lock:
            if since == '0':  # the current state as ADDED, then live events
                backlog = [_Event(self._rv, 'ADDED', obj) for _, obj in
                           sorted(self._store.get(rdef.storage_key, {}).items())]
            elif int(since) < self._floors.get(rdef.storage_key, 0):
                expired, backlog = True, []
            else:
                backlog = [ev for ev in self._history.get(rdef.storage_key, ()) if ev.rv > int(since)]
            self._watchers.add(watcher)
        response = aiohttp.web.StreamResponse(headers={'Content-Type': 'application/json'})
        try:
            await response.prepare(raw)
            if expired:
                status = APIError(410, 'Expired', f'too old resource version: {since}').status()
                await response.write(json.dumps({'type': 'ERROR', 'object': status}).encode() + b'\n')
                return response
            timeout = float(params.get('timeoutSeconds') or 0)
            deadline = loop.time() + timeout if timeout > 0 else None
            for event in backlog:
                await self._write_event(response, rdef, event, match, table)
            if params.get('sendInitialEvents') == 'true':  # a watch-list (client-go's WatchListClient)
                bookmark = {'kind': rdef.kind, 'apiVersion': rdef.api_version, 'metadata': {
                    'resourceVersion': str(backlog[-1].rv if backlog else self._rv),
                    'annotations': {'k8s.io/initial-events-end': 'true'}}}
                await response.write(json.dumps({'type': 'BOOKMARK', 'object': bookmark}).encode() + b'\n')
            while True:
                wait = 5.0 if deadline is None else min(5.0, deadline - loop.time())
                if wait <= 0:
                    break
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if raw.transport is None or raw.transport.is_closing():
                        break
                    continue
                if item is None:
                    break
                await self._write_event(response, rdef, item, match, table)
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away
        finally:
            with self._state_lock:
                self._watchers.discard(watcher)
        return response

    async def _write_event(self, response: aiohttp.web.StreamResponse, rdef: ResourceDef, event: _Event,
                           match: Callable[[Obj], bool], table: bool) -> None:
        """Send an event as seen through the selectors (an object leaving the selection is DELETED)."""
        now_ok = match(event.obj)
        kind: str | None = event.type if now_ok else None
        if event.type == 'MODIFIED':
            was_ok = event.old is not None and match(event.old)
            kind = 'MODIFIED' if now_ok and was_ok else 'ADDED' if now_ok else 'DELETED' if was_ok else None
        if kind is not None:
            obj = self._present(rdef, event.obj)
            line = json.dumps({'type': kind, 'object': as_table(rdef, obj, self.now()) if table else obj})
            await response.write(line.encode() + b'\n')


class EmulatedAPIServer:
    """Serves a :class:`KubeEmulator` on ``127.0.0.1`` (ephemeral port) from a background thread.

    Use ``start()``/``stop()``, ``with EmulatedAPIServer() as srv``, or ``async with`` (which starts the
    same background thread, so blocking clients in the caller's loop are still safe). Attributes not
    found on the server are looked up on its emulator, so ``srv.get_object(...)`` works.
    """

    def __init__(self, emulator: KubeEmulator | None = None, *, host: str = '127.0.0.1', port: int = 0) -> None:
        self.emulator = emulator if emulator is not None else KubeEmulator()
        self.host, self.port = host, port
        self.kubeconfig_path: Path | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith('_') or name == 'emulator':
            raise AttributeError(name)
        return getattr(self.emulator, name)

    @property
    def url(self) -> str:
        return f'http://{self.host}:{self.port}'

    def start(self, timeout: float = 10.0) -> EmulatedAPIServer:
        """Start serving; returns when the port is listening."""
        if self._thread is not None:
            raise RuntimeError('the server is already started')
        self._ready.clear()
        self._thread = threading.Thread(target=self._run, name=f'kube-emulator-{id(self):x}', daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            self.stop()
            raise RuntimeError(f'the emulated API server did not start: {self._error!r}')
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the watches, stop serving and join the thread (idempotent)."""
        if self._loop is not None and self._stopping is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just closed
                self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError('the emulated API server did not stop in time')
        self._thread = self._loop = self._stopping = None

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:
            self._error = e
            self._ready.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()

        async def handler(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
            return await self.emulator(request)

        app = aiohttp.web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route('*', '/{tail:.*}', handler)
        runner = aiohttp.web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            site = aiohttp.web.TCPSite(runner, self.host, self.port)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            await self._stopping.wait()
            self.emulator.close_watches()
        finally:
            await runner.cleanup()

    def kubeconfig(self, namespace: str = 'default') -> dict[str, Any]:
        """A kubeconfig for this server: plain HTTP, a dummy token."""
        return {'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'emulator', 'preferences': {},
                'clusters': [{'name': 'emulator', 'cluster': {'server': self.url}}],
                'users': [{'name': 'emulator', 'user': {'token': 'emulator-token'}}],
                'contexts': [{'name': 'emulator', 'context': {'cluster': 'emulator', 'user': 'emulator',
                                                              'namespace': namespace}}]}

    def write_kubeconfig(self, path: str | Path, namespace: str = 'default') -> Path:
        """Write :meth:`kubeconfig` (JSON, which is valid YAML) and remember it as ``kubeconfig_path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.kubeconfig(namespace), indent=2))
        self.kubeconfig_path = path
        return path

    def __enter__(self) -> EmulatedAPIServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    async def __aenter__(self) -> EmulatedAPIServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *_: object) -> None:
        await asyncio.to_thread(self.stop)

