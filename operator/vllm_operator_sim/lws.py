"""A simulated LeaderWorkerSet controller (kubernetes-sigs/lws) with the semantics the operator depends on.

Per LWS and group g in 0..replicas-1: a leader pod `<lws>-<g>` from `leaderTemplate` (or `workerTemplate`) and
workers `<lws>-<g>-<w>` (w = 1..size-1) from `workerTemplate`, created together (startupPolicy LeaderCreated);
labels `leaderworkerset.sigs.k8s.io/{name,group-index,worker-index,group-key,template-revision-hash}`, annotation
`…/size` (and `…/leader-name` on workers); `LWS_LEADER_ADDRESS=<lws>-<g>.<lws>.<ns>`, `LWS_GROUP_SIZE`,
`LWS_WORKER_INDEX` first in every container's env, and `$(VAR)` in command/args expanded as the kubelet does.
Group restart (`RecreateGroupOnPodRestart`): any pod of the group with a container restart — an init container's
too, as lws `podutils.ContainerRestarted` reads `initContainerStatuses` of a Pending or Running pod, so the
kubelet's retry of a failing `model-download` init container recreates the group — or a deletion timestamp → every
pod of the group is deleted (and recreated on the next pass, new UIDs, restart count 0), event `RecreateGroup`.
`RecreateGroupAfterStart` (lws ≥ 0.9) does the same only once the group has started: never while a pod of it is
Pending (an init container still failing) or fewer than `size` pods exist. A template change recreates groups one at a time (maxUnavailable 1). Status: `replicas`,
`readyReplicas` (groups whose pods are all Ready), `updatedReplicas`, and `Available` only when every group is
ready, else `Progressing`. Sources: lws `pkg/controllers/{leaderworkerset,pod}_controller.go`,
`pkg/utils/pod/pod_utils.go` (research notes: ../shared/research/multinode.md §1, §5).

No StatefulSets and no headless Service are materialised (the operator reads neither); `volumeClaimTemplates` give
each pod a claim `<template>-<pod>` as the StatefulSets would, kept across group recreation.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

log = logging.getLogger("vllm_operator_sim.lws")

GROUP = "leaderworkerset.x-k8s.io"
PLURAL = "leaderworkersets"
PREFIX = "leaderworkerset.sigs.k8s.io/"
NAME, GROUP_INDEX, WORKER_INDEX = PREFIX + "name", PREFIX + "group-index", PREFIX + "worker-index"
GROUP_KEY, REVISION, SIZE, LEADER_NAME = (PREFIX + "group-key", PREFIX + "template-revision-hash", PREFIX + "size",
                                          PREFIX + "leader-name")
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class API(Protocol):
    def create_object(self, resource: str, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]: ...
    def list_objects(self, resource: str, namespace: str | None = None, *, label_selector: str | None = None,
                     field_selector: str | None = None) -> list[dict[str, Any]]: ...
    def delete_object(self, resource: str, name: str, namespace: str | None = None, *,
                      propagation_policy: str | None = None) -> Any: ...
    def patch_status(self, resource: str, name: str, status: Mapping[str, Any],
                     namespace: str | None = None) -> Any: ...


def slim_crd() -> dict[str, Any]:
    """A slim LeaderWorkerSet CRD for the simulated cluster (the upstream one is 16.9k lines; the operator's
    rendering is checked against that one in tests/unit/test_render_lws.py): schema defaults, templates kept."""
    keep = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    spec = {"type": "object", "properties": {
        "replicas": {"type": "integer", "format": "int32", "default": 1},
        "startupPolicy": {"type": "string", "default": "LeaderCreated", "enum": ["LeaderCreated", "LeaderReady"]},
        "rolloutStrategy": {**keep, "default": {"type": "RollingUpdate"}},
        "networkConfig": keep,
        "leaderWorkerTemplate": {"type": "object", "required": ["workerTemplate"], "properties": {
            "size": {"type": "integer", "format": "int32", "default": 1, "minimum": 1},
            "restartPolicy": {"type": "string", "default": "RecreateGroupOnPodRestart",
                              "enum": ["RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None", "Default"]},
            "leaderTemplate": keep, "workerTemplate": keep, "subGroupPolicy": keep,
            "volumeClaimTemplates": {"type": "array", "items": keep}}},
    }, "required": ["leaderWorkerTemplate"]}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {"group": GROUP, "scope": "Namespaced",
                 "names": {"plural": PLURAL, "singular": "leaderworkerset", "kind": "LeaderWorkerSet",
                           "shortNames": ["lws"], "listKind": "LeaderWorkerSetList"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "subresources": {"status": {}, "scale": {
                                   "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "metadata": {"type": "object"}, "spec": spec, "status": keep}}}}]}}


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return dict(meta) if isinstance(meta, Mapping) else {}


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _expand(text: str, env: Mapping[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _restarted(pod: Mapping[str, Any]) -> bool:
    if _meta(pod).get("deletionTimestamp"):
        return True
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending", "Running"):
        return False
    return any(int(c.get("restartCount") or 0) > 0
               for c in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []))


def _recreate(policy: str, group: list[dict[str, Any]], size: int) -> bool:
    """Whether the group's restart policy recreates it now (lws pod_controller)."""
    if policy in ("None", "Default") or not any(_restarted(p) for p in group):
        return False
    if policy == "RecreateGroupAfterStart":  # not before the group has started: every pod there and none Pending
        return len(group) >= size and all((p.get("status") or {}).get("phase") != "Pending" for p in group)
    return True


class LWSController:
    """Reconciles every LeaderWorkerSet of the emulated API into pods; call `control(now)` once per tick."""

    def __init__(self, api: API, on_event: Callable[[str, str, str, str], None] | None = None,
                 on_available: Callable[[str, Mapping[str, Any]], None] | None = None) -> None:
        self.api = api
        self.on_event = on_event   # (namespace, lws name, reason, message)
        self.on_available = on_available   # (namespace, the LWS's metadata): every group ready
        self.recreations: dict[tuple[str, str], int] = {}

    def control(self) -> None:
        try:
            sets = self.api.list_objects(PLURAL)
        except Exception:  # the CRD is not installed: nothing to control
            return
        for lws in sets:
            try:
                self._control(lws)
            except Exception as exc:  # one bad object must not stop the others
                log.debug("leaderworkerset %s: %s", _meta(lws).get("name"), exc)

    def _control(self, lws: dict[str, Any]) -> None:
        meta = _meta(lws)
        name, namespace = meta["name"], meta.get("namespace", "default")
        spec = lws.get("spec") or {}
        lwt = spec.get("leaderWorkerTemplate") or {}
        size = max(int(lwt.get("size") or 1), 1)
        replicas = max(int(spec.get("replicas", 1) or 0), 0)
        worker_t = lwt.get("workerTemplate") or {}
        leader_t = lwt.get("leaderTemplate") or worker_t
        revision = _hash({"leader": leader_t, "worker": worker_t, "size": size})
        pods = self.api.list_objects("pods", namespace, label_selector=f"{NAME}={name}")
        by_group: dict[int, list[dict[str, Any]]] = {}
        for pod in pods:
            by_group.setdefault(int(_meta(pod).get("labels", {}).get(GROUP_INDEX, -1)), []).append(pod)
        policy = lwt.get("restartPolicy") or "RecreateGroupOnPodRestart"
        rolling = False
        for g in range(replicas):
            group = by_group.get(g, [])
            stale = any(_meta(p).get("labels", {}).get(REVISION) != revision for p in group)
            broken = _recreate(policy, group, size)
            if group and (broken or (stale and not rolling)):
                rolling = rolling or stale
                self._delete_group(namespace, name, g, group,
                                   "a pod of the group restarted" if broken else "the template changed")
                continue
            present = {int(_meta(p).get("labels", {}).get(WORKER_INDEX, -1)) for p in group}
            for w in range(size):
                if w not in present:
                    self._create_pod(lws, g, w, size, revision, leader_t if w == 0 else worker_t)
        for g, group in by_group.items():
            if g >= replicas:  # scaled down: the highest groups go
                self._delete_group(namespace, name, g, group, "scaled down")
        self._write_status(lws, replicas, size, revision)

    def _delete_group(self, namespace: str, name: str, g: int, group: list[dict[str, Any]], why: str) -> None:
        for pod in group:
            self.api.delete_object("pods", _meta(pod)["name"], namespace)
        if why != "scaled down":
            key = (namespace, name)
            self.recreations[key] = self.recreations.get(key, 0) + 1
            if self.on_event:
                self.on_event(namespace, name, "RecreateGroup", f"group {g} of {name} recreated: {why}")

    def _create_pod(self, lws: Mapping[str, Any], g: int, w: int, size: int, revision: str,
                    template: Mapping[str, Any]) -> None:
        meta = _meta(lws)
        name, namespace = meta["name"], meta.get("namespace", "default")
        leader = f"{name}-{g}"
        pod_name = leader if w == 0 else f"{leader}-{w}"
        tmeta = copy.deepcopy(dict(template.get("metadata") or {}))
        labels = {**(tmeta.get("labels") or {}), NAME: name, GROUP_INDEX: str(g), WORKER_INDEX: str(w),
                  GROUP_KEY: hashlib.sha1(f"{namespace}/{leader}".encode()).hexdigest(), REVISION: revision}
        annotations = {**(tmeta.get("annotations") or {}), SIZE: str(size)}
        if w:
            annotations[LEADER_NAME] = leader
        env = {"LWS_LEADER_ADDRESS": f"{leader}.{name}.{namespace}", "LWS_GROUP_SIZE": str(size),
               "LWS_WORKER_INDEX": str(w)}
        spec = copy.deepcopy(dict(template.get("spec") or {}))
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            own = [e for e in container.get("env") or [] if e.get("name") not in env]
            container["env"] = [{"name": k, "value": v} for k, v in env.items()] + own
            values = {**env, **{e["name"]: str(e.get("value", "")) for e in own if "value" in e}}
            for key in ("command", "args"):
                if key in container:
                    container[key] = [_expand(str(a), values) for a in container[key]]
        spec.setdefault("restartPolicy", "Always")
        spec["hostname"], spec["subdomain"] = pod_name, name
        self._claims(lws, pod_name, namespace, spec)
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": namespace, "labels": labels, "annotations": annotations,
                             "ownerReferences": [{"apiVersion": f"{GROUP}/v1", "kind": "LeaderWorkerSet",
                                                  "name": name, "uid": meta.get("uid"), "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": spec, "status": {"phase": "Pending"}}
        self.api.create_object("pods", body, namespace)

    def _claims(self, lws: Mapping[str, Any], pod_name: str, namespace: str, spec: dict[str, Any]) -> None:
        """volumeClaimTemplates, as the group's StatefulSets do: a claim `<template>-<pod>` per pod, created once and
        kept when the pod (or its group) is recreated; the pod's volume of that name refers to it."""
        templates = ((lws.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("volumeClaimTemplates") or []
        for template in templates:
            volume = str((template.get("metadata") or {}).get("name") or "")
            if not volume:
                continue
            claim = f"{volume}-{pod_name}"
            if not self.api.list_objects("persistentvolumeclaims", namespace, field_selector=f"metadata.name={claim}"):
                self.api.create_object("persistentvolumeclaims", {
                    "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim, "namespace": namespace,
                                 "labels": dict((template.get("metadata") or {}).get("labels") or {})},
                    "spec": copy.deepcopy(template.get("spec") or {})}, namespace)
            volumes = [v for v in spec.get("volumes") or [] if v.get("name") != volume]
            spec["volumes"] = [*volumes, {"name": volume, "persistentVolumeClaim": {"claimName": claim}}]

    def _write_status(self, lws: Mapping[str, Any], replicas: int, size: int, revision: str) -> None:
        meta = _meta(lws)
        name, namespace = meta["name"], meta.get("namespace", "default")
        pods = self.api.list_objects("pods", namespace, label_selector=f"{NAME}={name}")
        ready = updated = 0
        for g in range(replicas):
            group = [p for p in pods if _meta(p).get("labels", {}).get(GROUP_INDEX) == str(g)]
            if len(group) == size and all(_ready(p) for p in group):
                ready += 1
            if group and all(_meta(p).get("labels", {}).get(REVISION) == revision for p in group):
                updated += 1
        available = ready >= replicas
        if available and replicas and self.on_available:
            self.on_available(namespace, meta)
        previous = {c.get("type"): c for c in (lws.get("status") or {}).get("conditions") or []}
        kind = "Available" if available else "Progressing"
        since = (previous.get(kind) or {}).get("lastTransitionTime") or "1970-01-01T00:00:00Z"
        condition = {"type": kind, "status": "True", "reason": "AllGroupsReady" if available else "GroupsProgressing",
                     "message": "All replicas are ready" if available else "Replicas are progressing",
                     "lastTransitionTime": since}
        status = {"replicas": replicas, "readyReplicas": ready, "updatedReplicas": updated,
                  "observedGeneration": meta.get("generation", 1), "conditions": [condition],
                  "hpaPodSelector": f"{NAME}={name},{WORKER_INDEX}=0"}
        if {k: v for k, v in (lws.get("status") or {}).items()} != status:
            self.api.patch_status(PLURAL, name, status, namespace)
