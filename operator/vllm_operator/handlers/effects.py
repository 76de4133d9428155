"""Every write the operator makes, in one place: children, the VLLMService's status, Events.

* `apply_children` — server-side apply (field manager `vllm-operator`) of what is missing or changed (by the
  spec-hash annotation), so each child converges to exactly its render; only the service's own objects are touched
  (a name taken by someone else's object is a `NameConflict` condition); a Deployment ↔ LeaderWorkerSet switch
  keeps the old workload serving until the new one is Ready. Idempotent, so a retry or a resumed operator can apply
  the same children again.
* `update_status` — THE status writer: read the VLLMService, let the caller build the next status from what is
  stored *now*, merge-patch it with the read's `metadata.resourceVersion` as a precondition; on 409 read and build
  again; on a 5xx or a dropped connection retry a few times at once (the write may have landed: the rebuild sees
  it and writes nothing), then raise `kopf.TemporaryError` with a short delay. `build` must therefore be
  idempotent — given a status that already holds its change it returns an equal status (or None).
* `patch_status` — one precondition write of a status computed from a known read (None on 409: rebuild).
* `post_event` — a core/v1 Event on the VLLMService (best effort: failures are retried a few times, then logged).

Handlers observe, call the pure core and hand the results here; nothing else writes to the API.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ..api import conditions as cond
from ..api import switch
from ..api.switch import WorkloadSwitch
from ..api.v1alpha1 import GROUP, VERSION, VLLMServiceStatus
from ..render.lws import lws_name
from ..render.manifests import ANNOTATION_SPEC_HASH, LABEL_SERVICE, MANAGED_BY, child_names
from ..render.pods import statefulset_name
from ..render.sharing import GROUP_LABEL
from ..render.statefulset import keep_immutable
from . import kube

log = logging.getLogger("vllm_operator.effects")

#: Pauses between immediate retries of a write that failed with a 5xx or a dropped connection (seconds).
RETRY_PAUSES = (0.1, 0.3, 0.8)
#: The delay kopf waits before re-running a handler whose write kept failing (seconds; not the watchdog's 120).
RETRY_DELAY = 1.0

StatusBuild = Callable[[dict[str, Any]], VLLMServiceStatus | None]


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in (429,) or (exc.status or 0) >= 500
    return isinstance(exc, HTTPError | OSError)


def _retrying(what: str, call: Callable[[], Any]) -> Any:
    """Run an API call; retry at once on a transient failure (5xx, 429, connection), then map to kopf's errors."""
    for pause in (*RETRY_PAUSES, None):
        try:
            return call()
        except (ApiException, HTTPError, OSError) as exc:
            if pause is None or not _transient(exc):
                with kube.api_errors(what):
                    raise
            log.debug("%s: %s; retrying in %ss", what, exc, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")


def involved(service: Mapping[str, Any]) -> dict[str, Any]:
    """The `involvedObject` of an Event about this VLLMService."""
    meta = service.get("metadata") or {}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLLMService", "name": meta.get("name"),
            "namespace": meta.get("namespace"), "uid": meta.get("uid")}


# --------------------------------------------------------------------------------------------------
# Children
# --------------------------------------------------------------------------------------------------


#: The workload kinds: a service runs on exactly one; a plan that starts (or stops) spanning nodes, or whose cache
#: becomes a claim per pod, switches it.
WORKLOADS = switch.WORKLOADS
#: The children that address the serving pods (a selector, or KEDA's PromQL pod matcher): during a workload switch
#: they keep addressing the old workload's pods until the new one is Ready, then all of them switch before the old
#: workload is deleted.
ADDRESSING = ("Service", "InferencePool", "ScaledObject")


def owned(obj: Mapping[str, Any] | None, uid: str, label: str) -> bool:
    """Whether `obj` is this service's child: an ownerReference to its uid and the operator's labels for it."""
    meta = (obj or {}).get("metadata") or {}
    labels = meta.get("labels") or {}
    return (any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or [])
            and labels.get("app.kubernetes.io/managed-by") == MANAGED_BY and labels.get(LABEL_SERVICE) == label)


#: The labels that say whose an object is: the service's own children carry the first, a share group's (its record
#: ConfigMap, its ResourceClaims: owned by every member) the second.
IDENTITY_LABELS = (LABEL_SERVICE, GROUP_LABEL)


def ours(existing: Mapping[str, Any], child: Mapping[str, Any]) -> bool:
    """Whether `existing` is the object `child` renders, the operator's: an ownerReference to one of the child's
    owners (by uid) and the child's identity labels (managed-by, and the service's or the share group's)."""
    meta, want = existing.get("metadata") or {}, child["metadata"]
    labels, wanted = meta.get("labels") or {}, want.get("labels") or {}
    uids = {ref.get("uid") for ref in want.get("ownerReferences") or []}
    if not uids:  # an object no service owns (a model's shared cache claim): all its rendered labels identify it
        return labels.get("app.kubernetes.io/managed-by") == MANAGED_BY and all(
            labels.get(key) == value for key, value in wanted.items())
    return (any(ref.get("uid") in uids for ref in meta.get("ownerReferences") or [])
            and labels.get("app.kubernetes.io/managed-by") == MANAGED_BY
            and all(labels.get(key) == wanted[key] for key in IDENTITY_LABELS if key in wanted))


def _owner(children: list[dict[str, Any]]) -> tuple[str, str, str]:
    """(VLLMService name, uid, label value) of the service whose children these are ("" when none says)."""
    for child in children:
        meta = child["metadata"]
        label = (meta.get("labels") or {}).get(LABEL_SERVICE)
        ref: Mapping[str, Any] = next(iter(meta.get("ownerReferences") or []), {})
        if label and ref.get("kind") == "VLLMService":
            return str(ref.get("name") or ""), str(ref.get("uid") or ""), str(label)
    return "", "", ""


def _legacy(entry: Mapping[str, Any]) -> bool:
    return (entry.get("operation") == "Update" and not entry.get("subresource")
            and entry.get("manager") in kube.LEGACY_MANAGERS)


def adopted_fields(managed: list[dict[str, Any]] | None, api_version: str,
                   config: Mapping[str, Any] | None = None) -> list[dict[str, Any]] | None:
    """`metadata.managedFields` with the fields the operator owns through ordinary writes (`Update` entries of
    `kube.LEGACY_MANAGERS`: children created with POST or merge-patched) moved into its `Apply` entry, so that
    server-side apply removes them when the render stops setting them. None when nothing needs moving: no such
    entry, or (given the `config` about to be applied) every field they hold is still in it — the apply then owns
    them too, and the move waits for the render that drops one. Status and scale entries stay as they are."""
    entries = [dict(e) for e in managed or []]
    legacy = [e for e in entries if _legacy(e)]
    if not legacy or (config is not None and all(holds(config, e.get("fieldsV1") or {}) for e in legacy)):
        return None
    mine = next((e for e in entries if e.get("manager") == kube.FIELD_MANAGER and e.get("operation") == "Apply"
                 and not e.get("subresource")), None)
    if mine is None:
        mine = {"manager": kube.FIELD_MANAGER, "operation": "Apply", "apiVersion": api_version,
                "fieldsType": "FieldsV1", "fieldsV1": {}}
        entries.append(mine)
    tree: dict[str, Any] = copy.deepcopy(mine.get("fieldsV1") or {})
    for entry in legacy:
        _union(tree, entry.get("fieldsV1") or {})
    mine["fieldsV1"] = tree
    return [e for e in entries if not any(e is old for old in legacy)]


def holds(config: Any, fields: Mapping[str, Any]) -> bool:
    """Whether `config` sets every field of a FieldsV1 tree (`f:` keys, `k:` associative list items by their keys,
    `v:` set members): the items and keys the server recorded are all the schema this needs."""
    for segment, sub in fields.items():
        if segment == ".":
            continue
        if segment.startswith("f:"):
            if not isinstance(config, Mapping) or segment[2:] not in config:
                return False
            value = config[segment[2:]]
        elif segment.startswith(("k:", "v:")):
            want = json.loads(segment[2:])
            items = config if isinstance(config, list) else []
            if segment.startswith("v:"):
                if want not in items:
                    return False
                continue
            value = next((i for i in items if isinstance(i, Mapping) and all(i.get(k) == v for k, v in want.items())),
                         None)
            if value is None:
                return False
        else:
            return False
        if isinstance(sub, Mapping) and any(k != "." for k in sub) and not holds(value, sub):
            return False
    return True


def _union(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for key, sub in other.items():
        if isinstance(sub, Mapping):
            _union(into.setdefault(key, {}), sub)


def _apply(resource: kube.Resource, namespace: str, child: dict[str, Any], existing: Mapping[str, Any] | None,
           what: str) -> None:
    """Server-side apply of the whole child. A child the operator wrote before with ordinary writes (created with
    POST, merge-patched: `Update` entries) whose render now drops a field those writes set is taken over first:
    the entries move into the apply entry (one metadata write, the read's resourceVersion as a precondition — a
    409 retries the reconcile), so the apply removes that field."""
    name = child["metadata"]["name"]
    if existing is not None:
        meta = existing.get("metadata") or {}
        rewritten = adopted_fields(meta.get("managedFields"), str(existing.get("apiVersion") or child["apiVersion"]),
                                   child)
        if rewritten is not None:
            body = {"metadata": {"managedFields": rewritten, "resourceVersion": meta.get("resourceVersion")}}
            _retrying(f"{what}: take over its fields", partial(kube.patch, resource, namespace, name, body,
                                                                discard=True))
    _retrying(what, partial(kube.apply, resource, namespace, name, child, discard=True))


def _behind(workload: Mapping[str, Any]) -> bool:
    """Whether a Deployment's or StatefulSet's controller has not yet seen its current spec (`observedGeneration`),
    so its counters are of the previous one; a StatefulSet whose rollout is under way (`updateRevision` differs from
    `currentRevision`) is behind too."""
    if workload.get("kind") not in ("Deployment", "StatefulSet"):
        return False
    status = workload.get("status") or {}
    generation, seen = (workload.get("metadata") or {}).get("generation"), status.get("observedGeneration")
    if generation is not None and seen is not None and seen < generation:
        return True
    update, current = status.get("updateRevision"), status.get("currentRevision")
    return workload.get("kind") == "StatefulSet" and bool(update) and bool(current) and update != current


def takes_over(target: Mapping[str, Any] | None, previous: Mapping[str, Any] | None) -> bool:
    """Whether a switch's new workload may take over from the previous one: it serves with all its replicas, or at
    least as many ready replicas (pods; groups) of its current revision as the previous one has ready now, and at
    least one. The second case is a switch whose previous workload holds what the rest need: a `kubectl scale`
    1 → 2 that moves a one-pod Deployment to one-pod groups with claims of their own (render/cache.py) on a pool of
    two GPUs, whose second group can start only once the Deployment's pod is gone — waiting for every group there
    would wait forever. The service then serves no less than before at every step."""
    if ready(target):
        return True
    if not target:
        return False
    spec, status = target.get("spec") or {}, target.get("status") or {}
    if _behind(target):
        return False
    have = min(int(status.get("readyReplicas") or 0), int(status.get("updatedReplicas", 0) or 0)
               if "updatedReplicas" in status or target.get("kind") == "StatefulSet"
               else int(status.get("readyReplicas") or 0))
    before = int(((previous or {}).get("status") or {}).get("readyReplicas") or 0)
    return int(spec.get("replicas", 1) or 0) > 0 and have >= max(before, 1)


def ready(workload: Mapping[str, Any] | None) -> bool:
    """Whether a workload serves with all its replicas (Deployment, StatefulSet: pods of its current generation and
    revision; LWS: groups)."""
    if not workload:
        return False
    spec, status = workload.get("spec") or {}, workload.get("status") or {}
    want = int(spec.get("replicas", 1) or 0)
    if _behind(workload):
        return False
    # a StatefulSet's counts are absent when 0 (`omitempty`); a Deployment's updatedReplicas of older API servers
    updated = status.get("updatedReplicas", 0 if workload.get("kind") == "StatefulSet" else status.get("readyReplicas"))
    return int(status.get("readyReplicas") or 0) >= want and int(updated or 0) >= want


def workload_names(service: str) -> dict[str, str]:
    """The name of each workload kind of a service."""
    return {"Deployment": child_names(service).deployment, "LeaderWorkerSet": lws_name(service),
            "StatefulSet": statefulset_name(service)}


def _previous(namespace: str, kind: str, service: str, uid: str, label: str) -> dict[str, Any] | None:
    """The service's own workload of another kind than `kind` (a switch's previous one), if one exists."""
    for other in switch.others(kind):
        name = workload_names(service)[other]
        found = _retrying(f"read {other} {name}", partial(kube.get, kube.KIND_RESOURCES[other], namespace, name))
        if owned(found, uid, label):
            return dict(found or {})
    return None


#: Kinds whose spec cannot change once created (claims): created once, never re-applied.
IMMUTABLE = ("PersistentVolumeClaim", "ResourceClaim")


def create_children(children: list[dict[str, Any]], namespace: str) -> list[str]:
    """Children of a new service: create each without reading it first; one that exists already (409) or any other
    failure goes through `effects.apply_children`, which reads, compares and retries."""
    written, rest = [], []
    for index, child in enumerate(children):
        try:
            kube.create(kube.KIND_RESOURCES[child["kind"]], namespace, child, discard=True)
        except ApiException as exc:
            if exc.status in (400, 422):  # refused: the same object would be refused again
                with kube.api_errors(f"apply {child['kind']} {child['metadata']['name']}"):
                    raise
            rest = children[index:]
            break
        except (HTTPError, OSError):
            rest = children[index:]
            break
        written.append(f"created {child['kind']} {child['metadata']['name']}")
    return written + (apply_children(rest, namespace) if rest else [])


#: What a workload switch records before each step: `record(WorkloadSwitch | None)`, a status write (the reconcile's,
#: handlers/service.py); it raises when the record cannot be written, and nothing of the step is done.
SwitchRecorder = Callable[[WorkloadSwitch | None], None]

#: Services whose Service/InferencePool selector change waits for their workload's rollout (this process's memory:
#: the next Ready event of the workload reconciles them at once; after a restart the resume and the watchdog do).
HELD_SELECTORS: set[tuple[str, str]] = set()


def _selector(obj: Mapping[str, Any] | None) -> Any:
    return ((obj or {}).get("spec") or {}).get("selector")


def apply_children(children: list[dict[str, Any]], namespace: str, record: SwitchRecorder | None = None) -> list[str]:
    """Make each child exactly its render: server-side apply (field manager `vllm-operator`, forced) of what is
    missing or whose spec hash changed; fields the render no longer sets go, fields other managers set stay.

    Only this service's own objects are touched: a child's name taken by an object without its ownerReference and
    labels is left alone (never patched, adopted or deleted), named in the `NameConflict` condition; the rest still
    converge. A Service/InferencePool whose selector changes while its workload rolls out keeps the selector the
    running pods match until the workload is Ready as rendered (no pod unaddressed in between: an operator upgrade
    that labels the pods anew is one rollout without an outage). A workload switch (Deployment ↔ LeaderWorkerSet,
    `api.switch`) makes before it breaks, one step at a time, each recorded with `record` before it acts: create the
    new workload, wait until it is Ready (the Service and InferencePool keep addressing the old one's pods), switch
    them, delete the old workload — each step decided from what the API shows, so a restart resumes it."""
    if not children:
        return []
    service, uid, label = _owner(children)
    target = next((c for c in children if c["kind"] in WORKLOADS), None)
    old = _previous(namespace, target["kind"], service, uid, label) if target is not None else None
    written: list[str] = []
    conflicts: list[str] = []
    live: dict[int, Mapping[str, Any] | None] = {}
    for index, child in enumerate(children):
        kind, name = child["kind"], child["metadata"]["name"]
        existing = _retrying(f"apply {kind} {name}", partial(kube.get, kube.KIND_RESOURCES[kind], namespace, name))
        if existing is not None and not ours(existing, child):
            conflicts.append(f"{kind} {name}")
            continue
        live[index] = existing
    if old is not None and target is not None:
        written += _switch(namespace, children, live, old, target, record)
    else:
        if record is not None and target is not None:
            record(None)  # no workload of the other kind (left): no switch under way
        rolled_out = target is None or _at_render(target, live.get(children.index(target)))
        held = False
        for index, existing in live.items():
            child = children[index]
            if child["kind"] in ADDRESSING and existing is not None and not rolled_out and \
                    _selector(existing) != _selector(child):
                held = True  # the pods the new selector picks are not all there yet: the old one addresses them
                continue
            written += _converge(namespace, child, existing)
        if held:
            HELD_SELECTORS.add((namespace, service))
            written.append(f"kept the selectors of {service} on the running pods until the workload is rolled out")
        else:
            HELD_SELECTORS.discard((namespace, service))
    if service:
        say_conflicts(namespace, service, uid, conflicts)
    return written


def _at_render(child: Mapping[str, Any], existing: Mapping[str, Any] | None) -> bool:
    """Whether a workload exists as rendered (its spec hash) and serves with all its replicas."""
    return existing is not None and _hash(child) == _hash(existing) and ready(existing)


def _converge(namespace: str, child: dict[str, Any], existing: Mapping[str, Any] | None) -> list[str]:
    """Create `child`, or apply it when its spec hash changed; the line saying what was written."""
    kind, name = child["kind"], child["metadata"]["name"]
    resource, what = kube.KIND_RESOURCES[kind], f"apply {kind} {name}"
    if existing is None:
        _create(resource, namespace, child, what)
        return [f"created {kind} {name}"]
    if kind not in IMMUTABLE and _hash(child) != _hash(existing):
        if kind == "StatefulSet":  # its selector, claims, serviceName and pod policy stay as they were created
            child = keep_immutable(child, dict(existing))
        _apply(resource, namespace, child, existing, what)
        return [f"updated {kind} {name}"]
    return []


def _switch(namespace: str, children: list[dict[str, Any]], live: Mapping[int, Mapping[str, Any] | None],
            old: Mapping[str, Any] | None, target: dict[str, Any], record: SwitchRecorder | None) -> list[str]:
    """The steps of a workload switch that the API's state allows now, each recorded before it acts."""
    assert old is not None
    previous, kind = str(old["kind"]), str(target["kind"])
    previous_name = str((old.get("metadata") or {}).get("name"))
    index = children.index(target)
    existing = live.get(index)
    addressing = [i for i in live if children[i]["kind"] in ADDRESSING]
    moved = all(live[i] is not None and _hash(live[i] or {}) == _hash(children[i]) for i in addressing)
    applied = existing is not None and _hash(existing) == _hash(target)
    written: list[str] = []
    done: set[int] = set()

    def converge(indices: list[int]) -> None:
        for i in indices:
            if i not in done:
                done.add(i)
                written.extend(_converge(namespace, children[i], live[i]))

    others = [i for i in live if i != index and children[i]["kind"] not in ADDRESSING]
    while True:
        step = switch.next_step(previous_exists=old is not None, target_applied=applied,
                                target_ready=applied and takes_over(existing, old), addressing_moved=moved)
        if record is not None:
            record(switch.record(previous, kind, step))
        if step == switch.CREATE_TARGET:
            # in apply order (a claim before its workload); a new InferencePool is created, an existing one kept
            converge([i for i in live if children[i]["kind"] not in ADDRESSING or live[i] is None])
            applied, existing = True, None  # just written: not Ready yet
        elif step == switch.WAIT_READY:
            converge(others)  # what else changed meanwhile (a claim, an autoscaler), never the addressing children
            written.append(f"kept {previous} {previous_name} serving until the {kind} is Ready")
            return written
        elif step == switch.SWITCH_ADDRESSING:
            converge(addressing)
            moved = True
        elif step == switch.DELETE_PREVIOUS and old is not None:
            written.extend(_delete_owned(namespace, previous, old, f"replaced by a {kind}"))
            written.extend(_release_claims(namespace, children, old, kind))
            old = None
        else:
            converge(others)  # complete: whatever else the render changed
            return written


def _claims(obj: Mapping[str, Any]) -> set[str]:
    """The PersistentVolumeClaims a child mounts through its pod template's (templates') volumes."""
    spec = obj.get("spec") or {}
    group = spec.get("leaderWorkerTemplate") or {}
    templates = [spec.get("template"), group.get("leaderTemplate"), group.get("workerTemplate")]
    return {str((v.get("persistentVolumeClaim") or {}).get("claimName"))
            for t in templates if isinstance(t, Mapping)
            for v in ((t.get("spec") or {}).get("volumes") or []) if isinstance(v, Mapping)
            and isinstance(v.get("persistentVolumeClaim"), Mapping)}


def _release_claims(namespace: str, children: list[dict[str, Any]], old: Mapping[str, Any], kind: str) -> list[str]:
    """After a switch deleted the previous workload: the claims it mounted that the service created for itself (an
    ownerReference to the service, its labels) and that no rendered child mounts any more — a Deployment's own
    `<service>-model-cache` after a switch to a claim per pod — deleted too, so they do not stay unused until the
    service is deleted. Never a claim without that owner (a model's shared ReadWriteMany claim, the user's)."""
    service, uid, label = _owner(children)
    still = set().union(*(_claims(c) for c in children)) | {
        str(c["metadata"]["name"]) for c in children if c["kind"] == "PersistentVolumeClaim"}
    written: list[str] = []
    for name in sorted(_claims(old) - still):
        found = _retrying(f"read PersistentVolumeClaim {name}", partial(kube.get, kube.PVCS, namespace, name))
        if found is not None and owned(found, uid, label):
            written.extend(_delete_owned(namespace, "PersistentVolumeClaim", found,
                                         f"{service}'s {kind} gives each pod a claim of its own"))
    return written


def _hash(obj: Mapping[str, Any]) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
    return None if value is None else str(value)


def _create(resource: kube.Resource, namespace: str, child: dict[str, Any], what: str) -> None:
    name = child["metadata"]["name"]
    try:
        _retrying(what, partial(kube.apply, resource, namespace, name, child, discard=True))
    except kopf.TemporaryError:
        # an apply that landed but answered 5xx: it exists now
        if _retrying(what, partial(kube.get, resource, namespace, name)) is None:
            raise


def say_conflicts(namespace: str, service: str, uid: str, conflicts: list[str]) -> bool:
    """Set (or clear) the NameConflict condition: which objects hold this service's children's names, and what to
    rename. A Warning Event when the condition is newly set or names other objects. False when the status already
    says it; when it was written, raises kopf.TemporaryError (a short delay) so that the reconcile runs again on the
    status stored now — its own status write would otherwise be built on the status read before."""
    message = ""
    if conflicts:
        message = (f"{', '.join(conflicts)} already exist{'s' if len(conflicts) == 1 else ''} in {namespace} and "
                   f"{'is' if len(conflicts) == 1 else 'are'} not this VLLMService's (no ownerReference to it, or not "
                   f"labelled app.kubernetes.io/managed-by={MANAGED_BY}, {LABEL_SERVICE}); the operator leaves "
                   f"{'it' if len(conflicts) == 1 else 'them'} alone. Rename or delete "
                   f"{'that object' if len(conflicts) == 1 else 'those objects'}, or rename this VLLMService "
                   "(its children are named after it)")
    said: list[bool] = []

    def build(stored: dict[str, Any]) -> VLLMServiceStatus | None:
        status = stored.get("status") or {}
        current = next((c for c in status.get("conditions") or [] if c.get("type") == cond.NAME_CONFLICT), None)
        if not conflicts and (current is None or current.get("status") == cond.FALSE):
            return None
        if conflicts and current is not None and current.get("status") == cond.TRUE and \
                current.get("message") == message:
            return None
        said.append(bool(conflicts))
        update = (cond.ConditionUpdate(cond.NAME_CONFLICT, cond.TRUE, cond.NAME_CONFLICT, message) if conflicts else
                  cond.ConditionUpdate(cond.NAME_CONFLICT, cond.FALSE, cond.NO_CONFLICT, "every child is this service's own"))
        generation = status.get("observedGeneration")
        return cond.fold_status(status, conditions=[update], now=datetime.now(UTC),
                                observed_generation=generation if isinstance(generation, int) else None)

    if not update_status(namespace, service, build):
        return False
    if said and said[-1]:
        post_event(namespace, involved({"metadata": {"name": service, "namespace": namespace, "uid": uid}}),
                   "Warning", cond.NAME_CONFLICT, message)
    # the caller's own status write was built on the status read before this one (and a new service's is written
    # without a precondition): reconcile again on what is stored now rather than write over the condition
    raise kopf.TemporaryError(f"{cond.NAME_CONFLICT} of {namespace}/{service} recorded; reconciling again",
                              delay=RETRY_DELAY)


def delete_stale(stale: list[tuple[str, str]], namespace: str) -> list[str]:
    """Delete optional children (autoscaler, InferencePool) the spec no longer asks for; gone ones are fine."""
    written = []
    for kind, name in stale:
        resource = kube.KIND_RESOURCES[kind]
        existing = _retrying(f"read {kind} {name}", partial(kube.get, resource, namespace, name))
        labels = ((existing or {}).get("metadata") or {}).get("labels") or {}
        if existing is None or labels.get("app.kubernetes.io/managed-by") != MANAGED_BY:
            continue  # not there, or not ours
        try:
            _retrying(f"delete {kind} {name}", partial(kube.delete, resource, namespace, name))
        except kopf.TemporaryError:
            if _retrying(f"read {kind} {name}", partial(kube.get, resource, namespace, name)) is not None:
                raise
        written.append(f"deleted {kind} {name}")
    return written


def _delete_owned(namespace: str, kind: str, obj: Mapping[str, Any], why: str) -> list[str]:
    name = str((obj.get("metadata") or {}).get("name"))
    resource = kube.KIND_RESOURCES[kind]
    try:
        _retrying(f"delete {kind} {name}", partial(kube.delete, resource, namespace, name))
    except kopf.TemporaryError:
        if _retrying(f"read {kind} {name}", partial(kube.get, resource, namespace, name)) is not None:
            raise
    return [f"deleted {kind} {name}: {why}"]


#: What finishes a switch whose new workload is Ready: a reconcile of the service (namespace, name) on what is stored
#: now, which moves the Service and deletes the old workload (`apply_children`). Set by the layer that reconciles
#: (handlers/watchdog.py, at startup); None: the watchdog's next round does it.
SWITCH_FINISHER: Callable[[str, str], Any] | None = None


def finish_switch(namespace: str, workload: Mapping[str, Any], *, other_served: bool = True) -> bool:
    """Called on an event of a Ready workload (a Deployment or StatefulSet; a LeaderWorkerSet, or one of its pods):
    when its service still owns a workload of the other kind (looked up only where `other_served`: the API serves
    that kind), or holds a Service/InferencePool selector until this rollout is done, reconcile the service now
    rather than at the watchdog's next round."""
    finisher = SWITCH_FINISHER
    ref = next((r for r in (workload.get("metadata") or {}).get("ownerReferences") or []
                if r.get("kind") == "VLLMService"), None)
    if finisher is None or ref is None:
        return False
    if (namespace, str(ref.get("name"))) in HELD_SELECTORS and ready(workload):
        log.info("%s/%s: the %s is rolled out: moving the selectors to its pods", namespace, ref.get("name"),
                 workload.get("kind"))
    elif other_served and switch_pending(namespace, workload):
        log.info("%s/%s: the new %s is Ready: switching the Service to it", namespace, ref.get("name"),
                 workload.get("kind"))
    else:
        return False
    finisher(namespace, str(ref.get("name")))
    return True


def switch_pending(namespace: str, workload: Mapping[str, Any]) -> bool:
    """Whether `workload` (a Deployment or LeaderWorkerSet of ours) may take over (`takes_over`) while its service
    still owns a workload of the other kind: a switch waiting for this moment to move the Service over and delete the
    old one."""
    kind = workload.get("kind")
    meta = workload.get("metadata") or {}
    ref = next((r for r in meta.get("ownerReferences") or [] if r.get("kind") == "VLLMService"), None)
    if kind not in WORKLOADS or ref is None or not takes_over(workload, None):
        return False  # not even one ready replica: no need to read the other workload
    found = _previous(namespace, str(kind), str(ref.get("name")), str(ref.get("uid")),
                      str((meta.get("labels") or {}).get(LABEL_SERVICE)))
    return found is not None and takes_over(workload, found)


def set_strategy(namespace: str, name: str, strategy: dict[str, Any]) -> None:
    """Change a Deployment's rollout strategy in place (a merge patch: the next render's apply takes it back)."""
    _retrying(f"patch the strategy of Deployment {name}",
              lambda: kube.patch(kube.DEPLOYMENTS, namespace, name, {"spec": {"strategy": strategy}}))


def scale_deployment(namespace: str, name: str, replicas: int, kind: str = "Deployment") -> None:
    """Set the replicas of service `name`'s Deployment (or StatefulSet, `kind`) in place (a merge patch)."""
    workload = workload_names(name)[kind]
    _retrying(f"scale {kind} {workload}", lambda: kube.patch(kube.KIND_RESOURCES[kind], namespace, workload,
                                                             {"spec": {"replicas": replicas}}))


# --------------------------------------------------------------------------------------------------
# Status: the one writer
# --------------------------------------------------------------------------------------------------


def patch_status(namespace: str, name: str, service: Mapping[str, Any], new: VLLMServiceStatus) -> bool | None:
    """Merge-patch status with `service`'s resourceVersion as a precondition. True: written; False: nothing to
    write; None: the object changed since it was read (409) — read and build again. Transient failures are
    retried at once; what still fails raises kopf.TemporaryError."""
    patch = cond.status_patch(dict(service.get("status") or {}), new)
    if not patch:
        return False
    body: dict[str, Any] = {"status": patch}
    version = (service.get("metadata") or {}).get("resourceVersion")
    if version:
        body["metadata"] = {"resourceVersion": version}
    try:
        kube.patch(kube.VLLMSERVICES, namespace, name, body, subresource="status", discard=True)
    except ApiException as exc:
        if exc.status == 409:
            return None
        if not _transient(exc):
            with kube.api_errors(f"write status of {name}"):
                raise
        return None  # the write may have landed: the caller reads again and rebuilds
    except (HTTPError, OSError):
        return None
    return True


def read_service(namespace: str, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = _retrying(f"read VLLMService {name}",
                                             lambda: kube.get(kube.VLLMSERVICES, namespace, name))
    return found


def update_status(namespace: str, name: str, build: StatusBuild, *, attempts: int = 6) -> bool:
    """Read the VLLMService, build its next status from the stored one (`build(service)`; None: nothing to write),
    write it with the read's resourceVersion; on a conflict or a failed write read and build again. Returns whether
    anything was written. Raises kopf.TemporaryError (delay `RETRY_DELAY`) when every attempt failed.

    Holds the service's lock, as the reconcile and the ladder do, so writers in this process never interleave."""
    with kube.service_lock(namespace, name):
        for attempt in range(attempts):
            service = read_service(namespace, name)
            if service is None:
                return False
            new = build(service)
            if new is None:
                return False
            written = patch_status(namespace, name, service, new)
            if written is not None:
                return written
            time.sleep(RETRY_PAUSES[min(attempt, len(RETRY_PAUSES) - 1)])
    raise kopf.TemporaryError(f"the status of {namespace}/{name} could not be written", delay=RETRY_DELAY)


# --------------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------------


def post_event_or_retry(namespace: str, involved_object: Mapping[str, Any], type_: str, reason: str,
                        message: str) -> None:
    """Post an Event of the reconcile; an API failure raises kopf's retry (`kube.api_errors`), and the retried
    reconcile posts it again."""
    with kube.api_errors("post an event"):
        kube.post_event(namespace, dict(involved_object), type_, reason, message)


def post_event(namespace: str, involved_object: Mapping[str, Any], type_: str, reason: str, message: str, *,
               name: str | None = None) -> bool:
    """Post an Event (best effort: transient failures retried at once, then logged). Returns whether it is there.

    With a fixed `name` (the Event of a recorded step) posting is idempotent: a retry after a 5xx that landed, or
    a re-post after a restart, answers 409 AlreadyExists and counts as posted. Without one, such a retry may post
    it twice (kubectl shows both, better than none)."""
    try:
        _retrying(f"post event {reason}", lambda: _post(namespace, involved_object, type_, reason, message, name))
    except kopf.TemporaryError as exc:
        log.warning("event %s on %s/%s not posted: %s", reason, namespace, involved_object.get("name"), exc)
        return False
    return True


def _post(namespace: str, involved_object: Mapping[str, Any], type_: str, reason: str, message: str,
          name: str | None) -> None:
    try:
        kube.post_event(namespace, dict(involved_object), type_, reason, message, event_name=name)
    except ApiException as exc:
        if not (name and exc.status == 409):
            raise
        # 409 is AlreadyExists only when the Event is there: a 409 Conflict (or a proxy's) posted nothing, and
        # counting it as posted lost the Event for good (issue 20); it stays unannounced and is posted again
        if kube.get(kube.EVENTS, namespace, name) is None:
            raise
