"""A simulated DaemonSet controller (kube-controller-manager's `daemon` controller) with what the operator's prewarm
DaemonSet (render/prewarm.py) depends on.

Per DaemonSet: one pod per schedulable node whose labels match the template's `nodeSelector` and whose
NoSchedule/NoExecute taints the template tolerates, named `<ds>-<5 characters>`, bound to its node (the real
controller sets a `metadata.name` node affinity and the scheduler binds it; here `spec.nodeName` is set at once),
labelled with the template's labels and `controller-revision-hash`, owned by the DaemonSet (the emulator's garbage
collector deletes the pods with it). A changed template replaces every pod of an older revision at once (the
operator's `maxUnavailable: 100%`); a pod on a node that no longer matches goes. Status: `desiredNumberScheduled`,
`currentNumberScheduled`, `updatedNumberScheduled`, `numberReady`, `numberAvailable`, `numberMisscheduled`,
`observedGeneration`. Source: kubernetes `pkg/controller/daemon/daemon_controller.go` (`podsShouldBeOnNode`,
`updateDaemonSetStatus`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from .lws import API  # the same API surface as the LeaderWorkerSet controller's

log = logging.getLogger("vllm_operator_sim.daemonsets")

REVISION = "controller-revision-hash"


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj.get("metadata") or {})


def _revision(template: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True, default=str).encode()).hexdigest()[:10]


def tolerated(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether one of the pod's tolerations tolerates the taint (the scheduler's rule, as the kubelet applies it)."""
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol.get("key") == taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and tol.get("value") == taint.get("value"):
            return True
    return False


def _fits(node: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """Whether a daemon pod of this template should run on the node (labels, taints; not resources: its pods ask
    for almost nothing)."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    labels = _meta(node).get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
    return all(tolerated(list(spec.get("tolerations") or []), t) for t in taints)


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


class DaemonSetController:
    """See the module docstring; :meth:`control` is one pass over every DaemonSet."""

    def __init__(self, api: API) -> None:
        self.api = api
        self._names = 0

    def control(self) -> None:
        try:
            sets = self.api.list_objects("daemonsets")
        except Exception:  # not served: nothing to control
            return
        if not sets:
            return
        nodes = self.api.list_objects("nodes")
        for daemon_set in sets:
            try:
                self._control(daemon_set, nodes)
            except Exception as exc:  # one bad object must not stop the others
                log.debug("daemonset %s: %s", _meta(daemon_set).get("name"), exc)

    def _pod_name(self, name: str) -> str:
        self._names += 1
        return f"{name}-{hashlib.sha1(f'{name}/{self._names}'.encode()).hexdigest()[:5]}"

    def _control(self, daemon_set: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
        meta = _meta(daemon_set)
        name, namespace = meta["name"], meta.get("namespace", "default")
        template = (daemon_set.get("spec") or {}).get("template") or {}
        pod_spec = template.get("spec") or {}
        revision = _revision(template)
        selector = ((daemon_set.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        owned = [p for p in self.api.list_objects(
            "pods", namespace, label_selector=",".join(f"{k}={v}" for k, v in sorted(selector.items())))
            if any(r.get("uid") == meta.get("uid") for r in _meta(p).get("ownerReferences") or [])]
        wanted = {_meta(n)["name"] for n in nodes if _fits(n, pod_spec)}
        on: dict[str, dict[str, Any]] = {}
        for pod in owned:
            pmeta = _meta(pod)
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            stale = (pmeta.get("labels") or {}).get(REVISION) != revision
            if node not in wanted or stale or node in on:
                self.api.delete_object("pods", pmeta["name"], namespace)
                continue
            on[node] = pod
        for node in sorted(wanted - set(on)):
            tmeta = dict(template.get("metadata") or {})
            body = {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": self._pod_name(name), "namespace": namespace,
                                 "labels": {**(tmeta.get("labels") or {}), REVISION: revision},
                                 "annotations": dict(tmeta.get("annotations") or {}),
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name,
                                                      "uid": meta.get("uid"), "controller": True,
                                                      "blockOwnerDeletion": True}]},
                    "spec": {**json.loads(json.dumps(pod_spec)), "nodeName": node},
                    "status": {"phase": "Pending"}}
            on[node] = self.api.create_object("pods", body, namespace)
        ready = sum(1 for p in on.values() if _ready(p))
        status = {"desiredNumberScheduled": len(wanted), "currentNumberScheduled": len(on),
                  "updatedNumberScheduled": len(on), "numberReady": ready, "numberAvailable": ready,
                  "numberMisscheduled": 0, "observedGeneration": meta.get("generation", 1)}
        if dict(daemon_set.get("status") or {}) != status:
            self.api.patch_status("daemonsets", name, status, namespace)
