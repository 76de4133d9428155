"""A simulated StatefulSet controller (kube-controller-manager's `statefulset-controller`, Kubernetes 1.29–1.35), and
the API server's defaulting and validation of `apps/v1` StatefulSets.

**The controller** (:class:`StatefulSetController`, one pass per kubelet tick, as :mod:`~vllm_operator_sim.lws`):

* Pods `<sts>-<ordinal>` for the ordinals `ordinals.start … start+replicas-1` from `spec.template`: its labels plus
  `statefulset.kubernetes.io/pod-name`, `apps.kubernetes.io/pod-index` and `controller-revision-hash` (the revision's
  name, `<sts>-<hash of the template>`), a controller ownerReference to the StatefulSet, `hostname` = the pod's name
  and `subdomain` = `spec.serviceName`. Owned pods are those the selector matches with the set as controller (an
  orphan with a member's name is adopted, as `ControllerRefManager` does).
* Revisions are `ControllerRevision` objects (`apps/v1`, owned by the set, `data` = the template as a replace patch,
  `revision` numbers; a template equal to an older revision reuses it with the next number — a rollback; at most
  `revisionHistoryLimit` revisions that neither status nor a pod uses are kept).
* `volumeClaimTemplates`: before pod `<sts>-<i>` is created the claim `<template>-<sts>-<i>` is created when missing
  (the template's labels plus the selector's matchLabels), and the pod's volume named after the template refers to it
  (claim volumes first, then the template's other volumes); a Pending pod gets its missing claims created. An
  existing claim is reused, so the weights cached on it (the kubelet keys its cache by claim) survive pod deletion,
  rollouts and scale down/up. `persistentVolumeClaimRetentionPolicy` (`StatefulSetAutoDeletePVC`, on by default from
  1.27): `whenDeleted: Delete` gives each claim an ownerReference to the set (the emulator's garbage collector deletes
  it with the set); `whenScaled: Delete` gives a scaled-away ordinal's claim an ownerReference to its pod (and drops
  the set's), so it goes with that pod; `Retain` (the default) removes those references.
* `podManagementPolicy`: `OrderedReady` (the default) handles the ordinals in order and stops at the first pod that is
  missing (after creating it), terminating, not Running and Ready, or not available for `minReadySeconds`; it scales
  down from the highest ordinal one pod at a time, only while every lower pod is healthy (the first unhealthy pod may
  go). So a pod that never becomes Ready blocks every later step — the rolling update too, even after the template is
  fixed (Kubernetes issue 67250: delete the pod by hand). `Parallel` creates and deletes every pod at once; an
  unhealthy pod blocks nothing but the rolling update's next deletion.
* `updateStrategy` `RollingUpdate` (default, `partition` 0): once the pass above has not stopped, from the highest
  ordinal down to `partition`, the first pod whose revision is not the update revision (and is not terminating) is
  deleted — recreated on a later pass from the new template, with the same name and claims — and the controller waits
  while the highest updated pod is not Running and Ready (one pod unavailable at a time). Ordinals below the partition
  keep, and are recreated at, the current revision. `OnDelete`: pods take the update revision only when deleted.
  A Failed or Succeeded pod is deleted and recreated (`RecreatingFailedPod` / `RecreatingTerminatedPod`).
* Status (written only when it changes, the whole `status` replaced): `observedGeneration`, `replicas` (pods that
  exist), `readyReplicas`, `availableReplicas`, `currentReplicas`, `updatedReplicas`, `currentRevision`,
  `updateRevision`, `collisionCount: 0`. As the real API's JSON (`omitempty`): `readyReplicas`, `currentReplicas`
  and `updatedReplicas` are absent when 0 (a reader must take a missing count as 0, not fall back to another one);
  `replicas`, `availableReplicas` and `collisionCount` are always there. A rolling update completes
  (`currentRevision` := `updateRevision`) when every pod is updated and ready; under `OnDelete` it never does.
  No conditions (the real controller writes none).
* Events on the StatefulSet, source `statefulset-controller`, worded as `stateful_pod_control.go` words them:
  `SuccessfulCreate` "create Pod X in StatefulSet Y successful" and "create Claim C Pod X in StatefulSet Y success",
  `SuccessfulDelete` "delete Pod X in StatefulSet Y successful".

Not modelled: `maxUnavailable` (feature gate `MaxUnavailableStatefulSet`; one pod at a time, as with it off),
graceful termination (the emulator deletes pods at once, so "terminating" is seen only with finalizers), stale
claims (`PodClaimIsStale`: the emulator's garbage collector removes a scaled-away claim at once), the headless
Service (the operator creates its own). Which node a ReadWriteOnce claim is attached to is not modelled by the
simulator for any workload: the kubelet keys cached weights and compile caches by claim name.

**The API server** (:func:`set_defaults`, :func:`validation_errors`, called by the emulator for writes through
HTTP): defaults as `SetDefaults_StatefulSet` (`replicas` 1, `podManagementPolicy` OrderedReady, `updateStrategy`
RollingUpdate with `partition` 0, retention Retain/Retain, `revisionHistoryLimit` 10, and each claim template's
`volumeMode: Filesystem` and `status.phase: Pending`, so a client comparing what it rendered with what is stored
sees what it would see on a cluster); a 422 as
`ValidateStatefulSetSpec` / `ValidateStatefulSetUpdate` word it: a selector that is missing, empty or does not match
the template's labels, a `restartPolicy` other than Always, an unknown policy or strategy, a negative count, and on
update any change of the spec outside `replicas`, `ordinals`, `template`, `updateStrategy`,
`persistentVolumeClaimRetentionPolicy`, `minReadySeconds` and `revisionHistoryLimit` (so `selector`,
`serviceName`, `volumeClaimTemplates` and `podManagementPolicy` are immutable).

Sources: kubernetes `pkg/controller/statefulset/{stateful_set_control,stateful_set_utils,stateful_pod_control}.go`,
`pkg/apis/apps/v1/defaults.go`, `pkg/apis/apps/validation/validation.go`, `pkg/controller/history`.
"""

from __future__ import annotations

import copy
import datetime
import json
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from .emulator_admission import FieldError
from .emulator_selectors import SelectorError, parse_label_selector, selector_from_match_labels

__all__ = ["COMPONENT", "PLURAL", "POD_INDEX", "POD_NAME", "REVISION", "REVISIONS", "StatefulSetController",
           "revision_name", "set_defaults", "validation_errors"]

log = logging.getLogger("vllm_operator_sim.statefulset")

PLURAL = "statefulsets"
REVISIONS = "controllerrevisions"
POD_NAME = "statefulset.kubernetes.io/pod-name"
POD_INDEX = "apps.kubernetes.io/pod-index"
REVISION = "controller-revision-hash"
REVISION_HASH = "controller.kubernetes.io/hash"  # a ControllerRevision's own label
COMPONENT = "statefulset-controller"
ORDERED, PARALLEL = "OrderedReady", "Parallel"
ROLLING, ON_DELETE = "RollingUpdate", "OnDelete"
RETAIN, DELETE = "Retain", "Delete"
#: The spec fields an update may change (ValidateStatefulSetUpdate), and how the real server refuses the others.
MUTABLE = ("replicas", "ordinals", "template", "updateStrategy", "persistentVolumeClaimRetentionPolicy",
           "minReadySeconds", "revisionHistoryLimit")
UPDATE_FORBIDDEN = ("Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', "
                    "'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' "
                    "are forbidden")
_ORDINAL = re.compile(r"^(.*)-([0-9]+)$")
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand.SafeEncodeString's alphabet


class API(Protocol):
    def create_object(self, resource: str, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]: ...
    def list_objects(self, resource: str, namespace: str | None = None, *, label_selector: str | None = None,
                     field_selector: str | None = None) -> list[dict[str, Any]]: ...
    def patch_object(self, resource: str, name: str, patch: Any, namespace: str | None = None, *,
                     patch_type: str = "merge", subresource: str | None = None) -> dict[str, Any]: ...
    def delete_object(self, resource: str, name: str, namespace: str | None = None, *,
                      propagation_policy: str | None = None) -> Any: ...


#: (namespace, the StatefulSet's metadata, event type, reason, message)
EventSink = Callable[[str, Mapping[str, Any], str, str, str], None]


# --- the API server: defaults and validation ---------------------------------------------------------------------

def set_defaults(obj: dict[str, Any]) -> None:
    """`SetDefaults_StatefulSet` (apps/v1, with StatefulSetAutoDeletePVC on): in place."""
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    spec.setdefault("replicas", 1)
    if not spec.get("podManagementPolicy"):
        spec["podManagementPolicy"] = ORDERED
    strategy = spec.setdefault("updateStrategy", {})
    if isinstance(strategy, dict):
        if not strategy.get("type"):
            strategy["type"] = ROLLING
            strategy.setdefault("rollingUpdate", {})
        if strategy["type"] == ROLLING and isinstance(strategy.get("rollingUpdate"), dict):
            strategy["rollingUpdate"].setdefault("partition", 0)
    policy = spec.setdefault("persistentVolumeClaimRetentionPolicy", {})
    if isinstance(policy, dict):
        for key in ("whenDeleted", "whenScaled"):
            if not policy.get(key):
                policy[key] = RETAIN
    spec.setdefault("revisionHistoryLimit", 10)
    for claim in spec.get("volumeClaimTemplates") or []:  # PersistentVolumeClaim defaults, as stored by the server
        if isinstance(claim, dict) and isinstance(claim.setdefault("spec", {}), dict):
            claim["spec"].setdefault("volumeMode", "Filesystem")
            if not (claim.get("status") or {}).get("phase"):
                claim["status"] = {**(claim.get("status") or {}), "phase": "Pending"}


def _go(value: Any) -> str:
    """A value as Go's `%#v` prints it in a field error (maps with sorted keys)."""
    if isinstance(value, Mapping):
        return "map[string]string{" + ", ".join(f'"{k}":"{v}"' for k, v in sorted(value.items())) + "}"
    return json.dumps(value)


def _template_labels(spec: Mapping[str, Any]) -> dict[str, str]:
    return dict(((spec.get("template") or {}).get("metadata") or {}).get("labels") or {})


def validation_errors(obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[FieldError]:
    """What `ValidateStatefulSetSpec` (and, with `old`, `ValidateStatefulSetUpdate`) refuses, worded as it does."""
    spec = obj.get("spec") or {}
    errors: list[FieldError] = []
    policy = spec.get("podManagementPolicy")
    if policy not in (ORDERED, PARALLEL):
        errors.append(FieldError("spec.podManagementPolicy", "FieldValueInvalid",
                                 f"Invalid value: {_go(policy)}: must be '{ORDERED}' or '{PARALLEL}'"))
    strategy = spec.get("updateStrategy") or {}
    kind = strategy.get("type")
    if kind == ON_DELETE and strategy.get("rollingUpdate") is not None:
        errors.append(FieldError("spec.updateStrategy.rollingUpdate", "FieldValueInvalid",
                                 f"Invalid value: {json.dumps(strategy['rollingUpdate'])}: only allowed for "
                                 f"updateStrategy '{ROLLING}'"))
    elif kind not in (ROLLING, ON_DELETE):
        errors.append(FieldError("spec.updateStrategy", "FieldValueInvalid",
                                 f"Invalid value: {json.dumps(strategy)}: must be '{ROLLING}' or '{ON_DELETE}'"))
    counts = [("spec.replicas", spec.get("replicas")), ("spec.minReadySeconds", spec.get("minReadySeconds")),
              ("spec.ordinals.start", (spec.get("ordinals") or {}).get("start")),
              ("spec.updateStrategy.rollingUpdate.partition", (strategy.get("rollingUpdate") or {}).get("partition"))]
    errors += [FieldError(path, "FieldValueInvalid", f"Invalid value: {value}: must be greater than or equal to 0")
               for path, value in counts if isinstance(value, int) and value < 0]
    for key in ("whenDeleted", "whenScaled"):
        value = (spec.get("persistentVolumeClaimRetentionPolicy") or {}).get(key)
        if value is not None and value not in (RETAIN, DELETE):
            errors.append(FieldError(f"spec.persistentVolumeClaimRetentionPolicy.{key}", "FieldValueNotSupported",
                                     f'Unsupported value: {json.dumps(value)}: supported values: "Retain", "Delete"'))
    errors += _selector_errors(spec)
    restart = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy") or "Always"
    if restart != "Always":
        errors.append(FieldError("spec.template.spec.restartPolicy", "FieldValueNotSupported",
                                 f'Unsupported value: {json.dumps(restart)}: supported values: "Always"'))
    if ((spec.get("template") or {}).get("spec") or {}).get("activeDeadlineSeconds") is not None:
        errors.append(FieldError("spec.template.spec.activeDeadlineSeconds", "FieldValueForbidden",
                                 "Forbidden: activeDeadlineSeconds in StatefulSet is not Supported"))
    if old is not None:
        before = {k: v for k, v in (old.get("spec") or {}).items() if k not in MUTABLE}
        after = {k: v for k, v in spec.items() if k not in MUTABLE}
        if before != after:
            errors.append(FieldError("spec", "FieldValueForbidden", UPDATE_FORBIDDEN))
    return errors


def _selector_errors(spec: Mapping[str, Any]) -> list[FieldError]:
    selector = spec.get("selector")
    if selector is None:
        return [FieldError("spec.selector", "FieldValueRequired", "Required value")]
    if not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return [FieldError("spec.selector", "FieldValueInvalid",
                           f"Invalid value: {json.dumps(selector)}: empty selector is invalid for statefulset")]
    try:
        matches = parse_label_selector(selector_from_match_labels(selector))
    except SelectorError as exc:
        return [FieldError("spec.selector", "FieldValueInvalid", f"Invalid value: {json.dumps(selector)}: {exc}")]
    labels = _template_labels(spec)
    if not matches(labels):
        return [FieldError("spec.template.metadata.labels", "FieldValueInvalid",
                           f"Invalid value: {_go(labels)}: `selector` does not match template `labels`")]
    return []


# --- revisions ---------------------------------------------------------------------------------------------------

def _fnv32a(data: bytes) -> int:
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def _patch(template: Mapping[str, Any]) -> dict[str, Any]:
    """A revision's `data` (`getPatch`): the template as a strategic-merge patch that replaces it."""
    return {"spec": {"template": {**copy.deepcopy(dict(template)), "$patch": "replace"}}}


def revision_name(sts: str, template: Mapping[str, Any], collision_count: int = 0) -> str:
    """`<sts>-<hash>` as `history.HashControllerRevision` names a revision: FNV-32a of its data and the collision
    count, the decimal number spelled in `rand.SafeEncodeString`'s alphabet."""
    data = json.dumps(_patch(template), sort_keys=True, separators=(",", ":")).encode() + str(collision_count).encode()
    return f"{sts}-" + "".join(_SAFE[ord(c) % len(_SAFE)] for c in str(_fnv32a(data)))


# --- pods --------------------------------------------------------------------------------------------------------

def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return dict(meta) if isinstance(meta, Mapping) else {}


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(_meta(obj).get("labels") or {})


def _ordinal(pod: Mapping[str, Any]) -> tuple[str, int]:
    found = _ORDINAL.match(str(_meta(pod).get("name") or ""))
    return (found[1], int(found[2])) if found else ("", -1)


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _terminating(pod: Mapping[str, Any]) -> bool:
    return bool(_meta(pod).get("deletionTimestamp"))


def _ready_since(pod: Mapping[str, Any]) -> str | None:
    """When the pod became Ready (its Ready condition's lastTransitionTime), None when it is not Running and Ready."""
    if _phase(pod) != "Running":
        return None
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            return str(condition.get("lastTransitionTime") or "")
    return None


def _healthy(pod: Mapping[str, Any]) -> bool:
    return _ready_since(pod) is not None and not _terminating(pod)


def _controller(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    return next((r for r in _meta(obj).get("ownerReferences") or [] if r.get("controller")), None)


def _owner_ref(kind: str, api_version: str, meta: Mapping[str, Any], *, controller: bool) -> dict[str, Any]:
    ref = {"apiVersion": api_version, "kind": kind, "name": meta.get("name"), "uid": meta.get("uid")}
    return {**ref, "controller": True, "blockOwnerDeletion": True} if controller else ref


class StatefulSetController:
    """Reconciles every StatefulSet of the emulated API into pods and claims; call :meth:`control` once per tick."""

    def __init__(self, api: API, on_event: EventSink | None = None,
                 on_available: Callable[[str, Mapping[str, Any]], None] | None = None,
                 now: Callable[[], datetime.datetime] | None = None) -> None:
        self.api = api
        self.on_event = on_event          # (namespace, the set's metadata, type, reason, message)
        self.on_available = on_available  # (namespace, the set's metadata): every replica updated and Ready
        self.now = now or (lambda: datetime.datetime.now(datetime.UTC))
        self.errors: list[str] = []  # what a pass failed on (kept for tests; the next pass tries again)

    def control(self) -> None:
        for sts in self.api.list_objects(PLURAL):
            try:
                self._sync(sts)
            except Exception as exc:  # one bad object must not stop the others
                log.debug("statefulset %s: %s", _meta(sts).get("name"), exc)
                self.errors.append(f"{_meta(sts).get('name')}: {exc!r}")

    # --- one StatefulSet ------------------------------------------------------------------------------------------

    def _sync(self, sts: dict[str, Any]) -> None:
        meta, spec = _meta(sts), dict(sts.get("spec") or {})
        selector = selector_from_match_labels(spec.get("selector"))
        if not selector or meta.get("deletionTimestamp"):
            return
        pods = self._pods(sts, selector)
        revisions = self._revisions(sts)
        current, update = self._current_and_update(sts, revisions)
        start = int((spec.get("ordinals") or {}).get("start") or 0)
        replicas = max(int(spec.get("replicas", 1) or 0), 0)
        slots: list[dict[str, Any] | None] = [None] * replicas
        condemned = []
        for pod in pods:
            ordinal = _ordinal(pod)[1]
            if start <= ordinal < start + replicas:
                slots[ordinal - start] = pod
            elif ordinal >= 0:
                condemned.append(pod)
        condemned.sort(key=lambda p: _ordinal(p)[1], reverse=True)
        monotonic = spec.get("podManagementPolicy") != PARALLEL
        unhealthy = [p for p in slots if p is not None and not _healthy(p)] + [
            p for p in reversed(condemned) if not _healthy(p)]
        first_unhealthy = unhealthy[0] if unhealthy else None
        stopped = self._replicas(sts, slots, start, current, update, monotonic) or \
            self._condemned(sts, condemned, first_unhealthy, monotonic)
        if not stopped and (spec.get("updateStrategy") or {}).get("type", ROLLING) == ROLLING:
            self._roll(sts, slots, update)
        self._write_status(sts, update, current)
        self._truncate(sts, revisions, current, update)

    def _pods(self, sts: Mapping[str, Any], selector: str) -> list[dict[str, Any]]:
        """The set's pods (`getPodsForStatefulSet`): matching its selector, controlled by it; orphans with a member's
        name adopted."""
        meta = _meta(sts)
        owned = []
        for pod in self.api.list_objects("pods", meta.get("namespace", "default"), label_selector=selector):
            controller = _controller(pod)
            if controller is None and _ordinal(pod)[0] == meta["name"] and not _terminating(pod):
                refs = [*(_meta(pod).get("ownerReferences") or []),
                        _owner_ref("StatefulSet", "apps/v1", meta, controller=True)]
                pod = self.api.patch_object("pods", _meta(pod)["name"], {"metadata": {"ownerReferences": refs}},
                                            meta.get("namespace", "default"))
                controller = _controller(pod)
            if controller is not None and controller.get("uid") == meta.get("uid") and \
                    _ordinal(pod)[0] == meta["name"]:
                owned.append(pod)
        return owned

    # --- revisions ------------------------------------------------------------------------------------------------

    def _revisions(self, sts: Mapping[str, Any]) -> list[dict[str, Any]]:
        meta = _meta(sts)
        found = [r for r in self.api.list_objects(REVISIONS, meta.get("namespace", "default"))
                 if (_controller(r) or {}).get("uid") == meta.get("uid")]
        return sorted(found, key=lambda r: (int(r.get("revision") or 0), _meta(r).get("name", "")))

    def _current_and_update(self, sts: Mapping[str, Any],
                            revisions: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
        """`getStatefulSetRevisions`: the update revision (created, or an equal older one given the next number)
        and the current one (status.currentRevision's, else the update revision)."""
        meta, spec = _meta(sts), sts.get("spec") or {}
        namespace = meta.get("namespace", "default")
        template = spec.get("template") or {}
        data = _patch(template)
        number = max((int(r.get("revision") or 0) for r in revisions), default=0) + 1
        equal = [r for r in revisions if r.get("data") == data]
        if equal and equal[-1] is revisions[-1]:  # the template has not changed
            update = equal[-1]
        elif equal:  # a rollback to an older template: that revision again, with the next number
            update = self.api.patch_object(REVISIONS, _meta(equal[-1])["name"], {"revision": number}, namespace)
            revisions[revisions.index(equal[-1])] = update
            revisions.sort(key=lambda r: int(r.get("revision") or 0))
        else:
            named = revision_name(meta["name"], template)
            update = self.api.create_object(REVISIONS, {
                "apiVersion": "apps/v1", "kind": "ControllerRevision",
                "metadata": {"name": named, "namespace": namespace,
                             "labels": {**_template_labels(spec), REVISION_HASH: named[len(meta["name"]) + 1:]},
                             "annotations": dict(meta.get("annotations") or {}),
                             "ownerReferences": [_owner_ref("StatefulSet", "apps/v1", meta, controller=True)]},
                "data": data, "revision": number}, namespace)
            revisions.append(update)
        wanted = (sts.get("status") or {}).get("currentRevision")
        current = next((r for r in revisions if _meta(r).get("name") == wanted), update)
        return current, update

    def _truncate(self, sts: Mapping[str, Any], revisions: list[dict[str, Any]], current: Mapping[str, Any],
                  update: Mapping[str, Any]) -> None:
        """`truncateHistory`: revisions neither status nor a pod uses, oldest first, beyond revisionHistoryLimit."""
        meta = _meta(sts)
        namespace = meta.get("namespace", "default")
        live = {_meta(current).get("name"), _meta(update).get("name")}
        live |= {_labels(p).get(REVISION) for p in self._pods(sts, selector_from_match_labels(
            (sts.get("spec") or {}).get("selector")))}
        history = [r for r in revisions if _meta(r).get("name") not in live]
        limit = int((sts.get("spec") or {}).get("revisionHistoryLimit", 10) or 0)
        for revision in history[:max(len(history) - limit, 0)]:
            self.api.delete_object(REVISIONS, _meta(revision)["name"], namespace)

    # --- the passes -----------------------------------------------------------------------------------------------

    def _replicas(self, sts: Mapping[str, Any], slots: list[dict[str, Any] | None], start: int,
                  current: Mapping[str, Any], update: Mapping[str, Any], monotonic: bool) -> bool:
        """`processReplica` for every ordinal in range; True when OrderedReady must stop this pass."""
        meta, spec = _meta(sts), sts.get("spec") or {}
        namespace = meta.get("namespace", "default")
        for i, pod in enumerate(slots):
            if pod is not None and _phase(pod) in ("Failed", "Succeeded"):
                failed = _phase(pod) == "Failed"
                self._event(sts, "Warning" if failed else "Normal",
                            "RecreatingFailedPod" if failed else "RecreatingTerminatedPod",
                            f"StatefulSet {namespace}/{meta['name']} is recreating "
                            f"{'failed' if failed else 'terminated'} Pod {_meta(pod)['name']}")
                self._delete_pod(sts, pod)
                pod = slots[i] = None
            if pod is None:
                slots[i] = self._create_pod(sts, start + i, current, update)
                if monotonic:
                    return True
                continue
            if _phase(pod) == "Pending":
                self._create_claims(sts, pod)
            if monotonic and (_terminating(pod) or not self._available(pod, spec)):
                return True
            self._retain(sts, pod, in_range=True)
        return False

    def _condemned(self, sts: Mapping[str, Any], condemned: list[dict[str, Any]],
                   first_unhealthy: Mapping[str, Any] | None, monotonic: bool) -> bool:
        """The ordinals scaled away, highest first (`processCondemned`); True when OrderedReady must stop."""
        spec = sts.get("spec") or {}
        for pod in condemned:  # their claims first: whenScaled Delete hands them to the pod
            self._retain(sts, pod, in_range=False)
        for pod in condemned:
            if _terminating(pod):
                if monotonic:
                    return True
                continue
            if monotonic and not self._available(pod, spec) and pod is not first_unhealthy:
                return True
            self._delete_pod(sts, pod)
            if monotonic:
                return True
        return False

    def _roll(self, sts: Mapping[str, Any], slots: list[dict[str, Any] | None], update: Mapping[str, Any]) -> None:
        """The rolling update: from the highest ordinal down to the partition, delete the first pod not at the update
        revision; wait while an updated one is not healthy."""
        strategy = (sts.get("spec") or {}).get("updateStrategy") or {}
        partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
        for target in range(len(slots) - 1, partition - 1, -1):
            pod = slots[target]
            if pod is None:
                return
            if _labels(pod).get(REVISION) != _meta(update).get("name") and not _terminating(pod):
                self._delete_pod(sts, pod)
                return
            if not _healthy(pod):
                return

    def _available(self, pod: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
        """Running and Ready for at least minReadySeconds (`isRunningAndAvailable`)."""
        since = _ready_since(pod)
        if since is None:
            return False
        wait = int(spec.get("minReadySeconds") or 0)
        if wait <= 0:
            return True
        try:
            ready = datetime.datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
        except ValueError:
            return False
        return (self.now() - ready).total_seconds() >= wait

    # --- pods and claims ------------------------------------------------------------------------------------------

    def _create_pod(self, sts: Mapping[str, Any], ordinal: int, current: Mapping[str, Any],
                    update: Mapping[str, Any]) -> dict[str, Any]:
        """`newVersionedStatefulSetPod` + `CreateStatefulPod`: claims first, then the pod at the current revision
        below the partition (RollingUpdate), else at the update revision."""
        meta, spec = _meta(sts), sts.get("spec") or {}
        namespace = meta.get("namespace", "default")
        strategy = spec.get("updateStrategy") or {}
        start = int((spec.get("ordinals") or {}).get("start") or 0)
        partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
        old = strategy.get("type", ROLLING) == ROLLING and ordinal < start + partition
        revision = current if old else update
        template = copy.deepcopy(((revision.get("data") or {}).get("spec") or {}).get("template") or {})
        template.pop("$patch", None)
        pod_name = f"{meta['name']}-{ordinal}"
        tmeta = dict(template.get("metadata") or {})
        labels = {**(tmeta.get("labels") or {}), POD_NAME: pod_name, POD_INDEX: str(ordinal),
                  REVISION: _meta(revision)["name"]}
        pod_spec = dict(template.get("spec") or {})
        pod_spec.setdefault("restartPolicy", "Always")  # the API server's pod defaults, as for the other controllers
        pod_spec.setdefault("schedulerName", "default-scheduler")
        pod_spec["hostname"] = pod_name
        if spec.get("serviceName"):
            pod_spec["subdomain"] = spec["serviceName"]
        claims = self._claim_names(sts, ordinal)
        volumes = [{"name": volume, "persistentVolumeClaim": {"claimName": claim}} for volume, claim in claims.items()]
        pod_spec["volumes"] = volumes + [v for v in pod_spec.get("volumes") or [] if v.get("name") not in claims]
        pod_meta: dict[str, Any] = {"name": pod_name, "generateName": f"{meta['name']}-", "namespace": namespace,
                                    "labels": labels,
                                    "annotations": dict(tmeta.get("annotations") or {}),
                                    "ownerReferences": [_owner_ref("StatefulSet", "apps/v1", meta, controller=True)]}
        if tmeta.get("finalizers"):
            pod_meta["finalizers"] = list(tmeta["finalizers"])
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec}
        self._create_claims(sts, body)
        created = self.api.create_object("pods", body, namespace)
        self._retain(sts, created, in_range=True)
        self._event(sts, "Normal", "SuccessfulCreate", f"create Pod {pod_name} in StatefulSet {meta['name']} successful")
        return created

    def _delete_pod(self, sts: Mapping[str, Any], pod: Mapping[str, Any]) -> None:
        meta = _meta(sts)
        self.api.delete_object("pods", _meta(pod)["name"], meta.get("namespace", "default"))
        self._event(sts, "Normal", "SuccessfulDelete",
                    f"delete Pod {_meta(pod)['name']} in StatefulSet {meta['name']} successful")

    def _claim_names(self, sts: Mapping[str, Any], ordinal: int) -> dict[str, str]:
        """volume name → claim name (`getPersistentVolumeClaimName`: `<template>-<sts>-<ordinal>`)."""
        names = {}
        for template in (sts.get("spec") or {}).get("volumeClaimTemplates") or []:
            volume = str((template.get("metadata") or {}).get("name") or "")
            if volume:
                names[volume] = f"{volume}-{_meta(sts)['name']}-{ordinal}"
        return names

    def _create_claims(self, sts: Mapping[str, Any], pod: Mapping[str, Any]) -> None:
        """`createPersistentVolumeClaims`: each missing claim of the pod, from its template, with the template's
        labels plus the selector's matchLabels."""
        meta, spec = _meta(sts), sts.get("spec") or {}
        namespace = meta.get("namespace", "default")
        ordinal = _ordinal(pod)[1]
        templates = {str((t.get("metadata") or {}).get("name") or ""): t for t in spec.get("volumeClaimTemplates") or []}
        for volume, claim in self._claim_names(sts, ordinal).items():
            if self.api.list_objects("persistentvolumeclaims", namespace, field_selector=f"metadata.name={claim}"):
                continue
            template = templates[volume]
            tmeta = copy.deepcopy(dict(template.get("metadata") or {}))
            labels = {**(tmeta.get("labels") or {}), **((spec.get("selector") or {}).get("matchLabels") or {})}
            body: dict[str, Any] = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                    "metadata": {**{k: v for k, v in tmeta.items() if k in ("annotations",)},
                                                 "name": claim, "namespace": namespace, "labels": labels},
                                    "spec": copy.deepcopy(template.get("spec") or {})}
            self.api.create_object("persistentvolumeclaims", body, namespace)
            self._event(sts, "Normal", "SuccessfulCreate",
                        f"create Claim {claim} Pod {_meta(pod)['name']} in StatefulSet {meta['name']} success")

    def _retain(self, sts: Mapping[str, Any], pod: Mapping[str, Any], *, in_range: bool) -> None:
        """`UpdatePodClaimForRetentionPolicy`: the ownerReferences each of the pod's claims must carry."""
        meta, spec = _meta(sts), sts.get("spec") or {}
        namespace = meta.get("namespace", "default")
        policy = spec.get("persistentVolumeClaimRetentionPolicy") or {}
        when_deleted, when_scaled = policy.get("whenDeleted") or RETAIN, policy.get("whenScaled") or RETAIN
        scaled_down = not in_range
        owners: list[tuple[Mapping[str, Any], str, str, bool]] = [  # (owner, kind, apiVersion, wanted)
            (meta, "StatefulSet", "apps/v1", when_deleted == DELETE and not (when_scaled == DELETE and scaled_down)),
            (_meta(pod), "Pod", "v1", when_scaled == DELETE and scaled_down)]
        for claim_name in self._claim_names(sts, _ordinal(pod)[1]).values():
            found = self.api.list_objects("persistentvolumeclaims", namespace, field_selector=f"metadata.name={claim_name}")
            if not found:
                continue
            refs = list(_meta(found[0]).get("ownerReferences") or [])
            changed = refs
            for owner, kind, api_version, wanted in owners:
                has = any(r.get("uid") == owner.get("uid") for r in changed)
                if wanted and not has:
                    changed = [*changed, _owner_ref(kind, api_version, owner, controller=False)]
                elif not wanted and has:
                    changed = [r for r in changed if r.get("uid") != owner.get("uid")]
            if changed != refs:
                self.api.patch_object("persistentvolumeclaims", claim_name, {"metadata": {"ownerReferences": changed}},
                                      namespace)

    # --- status and events ----------------------------------------------------------------------------------------

    def _write_status(self, sts: Mapping[str, Any], update: Mapping[str, Any], current: Mapping[str, Any]) -> None:
        """`updateStatus` + `completeRollingUpdate`, from the pods as they are now."""
        meta, spec = _meta(sts), sts.get("spec") or {}
        pods = self._pods(sts, selector_from_match_labels(spec.get("selector")))
        update_name, current_name = _meta(update).get("name"), _meta(current).get("name")
        live = [p for p in pods if _phase(p) and not _terminating(p)]
        counts = {"replicas": sum(1 for p in pods if _phase(p)),
                  "readyReplicas": sum(1 for p in pods if _ready_since(p) is not None),
                  "availableReplicas": sum(1 for p in pods if self._available(p, spec)),
                  "currentReplicas": sum(1 for p in live if _labels(p).get(REVISION) == current_name),
                  "updatedReplicas": sum(1 for p in live if _labels(p).get(REVISION) == update_name)}
        if (spec.get("updateStrategy") or {}).get("type", ROLLING) == ROLLING and \
                counts["updatedReplicas"] == counts["replicas"] == counts["readyReplicas"]:
            counts["currentReplicas"], current_name = counts["updatedReplicas"], update_name
        status: dict[str, Any] = {"observedGeneration": meta.get("generation", 1), "replicas": counts["replicas"]}
        for key in ("readyReplicas", "currentReplicas", "updatedReplicas"):  # omitempty in apps/v1's JSON
            if counts[key]:
                status[key] = counts[key]
        status.update(currentRevision=current_name, updateRevision=update_name, collisionCount=0,
                      availableReplicas=counts["availableReplicas"])
        replicas = int(spec.get("replicas", 1) or 0)
        if replicas and counts["readyReplicas"] >= replicas and counts["updatedReplicas"] >= replicas and \
                self.on_available is not None:
            self.on_available(meta.get("namespace", "default"), meta)
        if sts.get("status") != status:
            self.api.patch_object(PLURAL, meta["name"], [{"op": "replace", "path": "/status", "value": status}],
                                  meta.get("namespace", "default"), patch_type="json", subresource="status")

    def _event(self, sts: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        if self.on_event is not None:
            meta = _meta(sts)
            self.on_event(meta.get("namespace", "default"), meta, kind, reason, message)
