"""The rollout as the pods show it, folded into the VLLMService's status; and the switch to a rollout without surge.

Called when a Deployment or StatefulSet of ours changes and when a pod of ours cannot be scheduled (a StatefulSet's
rollout is read the same way: its pods of the current template, its controller's counters; it never surges). Reads the pods of the service
(and, only when a new pod lacks GPUs, the nodes), computes the conditions with the pure `api.rollout`, and writes
them through the one status writer (`effects.update_status`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..api import conditions as cond
from ..api import rollout, serving, switch
from ..render.lws import LWS_NAME_LABEL
from ..render.manifests import selector_for
from ..render.pods import STATEFULSET_WORKLOAD, WORKLOAD_LABEL, serving_pods, statefulset_name
from . import effects, kube

log = logging.getLogger("vllm_operator.rollouts")

#: How old an answer to "is the LeaderWorkerSet API served?" may be (seconds; as handlers/lws.py).
SERVED_MAX_AGE = 30.0
#: The strategy of a Deployment that must roll without a surge pod.
NO_SURGE = {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}}


def _now() -> datetime:
    return datetime.now(UTC)


def list_pods(namespace: str, service: str, kind: str = "Deployment") -> list[dict[str, Any]]:
    """The pods of the service's Deployment, of every profile (older ones may predate the workload label): not a
    group's, not a StatefulSet's; or those of its StatefulSet."""
    if kind == "StatefulSet":
        parts = [f"{k}={v}" for k, v in serving_pods(service, namespace, kind=kind).match_labels.items()]
    else:
        parts = [*(f"{k}={v}" for k, v in selector_for(service).items()), f"!{LWS_NAME_LABEL}",
                 f"{WORKLOAD_LABEL}!={STATEFULSET_WORKLOAD}"]
    with kube.api_errors(f"list the pods of {service}"):
        return kube.list_objects(kube.PODS, namespace, label_selector=",".join(parts))


def _workload(namespace: str, service: str) -> dict[str, Any] | None:
    """The service's Deployment, else its StatefulSet."""
    with kube.api_errors(f"read Deployment {service}"):
        found = kube.get(kube.DEPLOYMENTS, namespace, service)
    if found is None:
        name = statefulset_name(service)
        with kube.api_errors(f"read StatefulSet {name}"):
            found = kube.get(kube.STATEFULSETS, namespace, name)
    return found


def refresh(namespace: str, service: str, deployment: Mapping[str, Any] | None = None) -> bool:
    """Fold the rollout of the service's Deployment (or StatefulSet) into its status; returns whether the status
    changed."""
    if deployment is None:
        deployment = _workload(namespace, service)
        if deployment is None:
            return False
    kind = str(deployment.get("kind") or "Deployment")
    dep_status = deployment.get("status") or {}
    pods: list[dict[str, Any]] = []
    if int(dep_status.get("replicas") or 0) > 0:
        pods = list_pods(namespace, service, kind)
    view = rollout.assess(deployment, pods)
    no_surge = None
    if view.unschedulable and kind == "Deployment":
        nodes = _nodes(deployment)
        no_surge = rollout.surge_blocked(deployment, view, pods, nodes)
        if no_surge:
            _roll_without_surge(namespace, service, deployment, no_surge)
    ready = int(dep_status.get("readyReplicas") or 0)

    def build(stored: dict[str, Any]) -> Any:
        status = stored.get("status") or {}
        if (status.get("plan") or {}).get("fits") is False:
            return None  # an infeasible plan has no Deployment of ours to report on
        updates = rollout.rollout_conditions(view, status)
        if no_surge:
            updates.append(cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, cond.ROLLING_WITHOUT_SURGE, no_surge))
        # during a switch the workload the recorded plan runs on speaks (api.serving, as handlers/lws.py)
        if switch.recorded(status) is not None:
            switching.append(True)
        group = _previous_workload(namespace, service, status, kind)
        said = serving.serving(kind, updates, status, previous_name=group[0], previous_ready=group[1])
        if said is None:
            not_serving.append(True)
            return None  # the plan runs on another workload: it says whether the service serves
        generation = int((stored.get("metadata") or {}).get("generation") or 1)
        return cond.fold_status(status, conditions=said, observed_generation=generation, now=_now(),
                                ready_replicas=ready)

    not_serving: list[bool] = []  # set when the recorded plan runs on another workload: this one is the old one
    switching: list[bool] = []  # set when the status records a switch under way
    changed = effects.update_status(namespace, service, build)
    # the workload this one replaces is looked up where a switch is recorded, or a LeaderWorkerSet is served
    if effects.ready(deployment) and not not_serving:
        effects.finish_switch(namespace, deployment, other_served=bool(switching) or kind == "StatefulSet"
                              or kube.served(kube.LEADERWORKERSETS, SERVED_MAX_AGE))
    return changed


def _previous_workload(namespace: str, service: str, status: Mapping[str, Any], kind: str) -> tuple[str, int]:
    """(name, ready pods or groups) of the workload a recorded switch to `kind` replaces; ("", 0) if none."""
    record = switch.recorded(status)
    if record is None or record.previous == kind or record.target != kind:
        return "", 0
    name = effects.workload_names(service)[record.previous]
    with kube.api_errors(f"read {record.previous} {name}"):
        found = kube.get(kube.KIND_RESOURCES[record.previous], namespace, name)
    return name, int(((found or {}).get("status") or {}).get("readyReplicas") or 0)


def _nodes(deployment: Mapping[str, Any]) -> list[dict[str, Any]]:
    template = (deployment.get("spec") or {}).get("template") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(((template.get("spec") or {}).get("nodeSelector") or {}).items()))
    with kube.api_errors("list nodes"):
        return kube.list_objects(kube.NODES, label_selector=selector or None)


def _roll_without_surge(namespace: str, service: str, deployment: Mapping[str, Any], why: str) -> None:
    """Switch once: under the service's lock, on the Deployment as it is now (a pod event and a Deployment event
    may both have seen the surge strategy)."""
    name = (deployment.get("metadata") or {}).get("name") or service
    with kube.service_lock(namespace, service):
        with kube.api_errors(f"read Deployment {name}"):
            current = kube.get(kube.DEPLOYMENTS, namespace, name)
        if current is None or not rollout.surges(current):
            return
        effects.set_strategy(namespace, name, NO_SURGE["spec"]["strategy"])
    log.info("%s/%s: %s", namespace, name, why)
    owner = next((r for r in (deployment.get("metadata") or {}).get("ownerReferences") or []
                  if r.get("kind") == "VLLMService"), None)
    if owner is not None:
        involved = effects.involved({"metadata": {"name": owner.get("name"), "namespace": namespace,
                                                  "uid": owner.get("uid")}})
        effects.post_event(namespace, involved, "Warning", cond.ROLLING_WITHOUT_SURGE, why)
