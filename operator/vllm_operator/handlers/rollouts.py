"""The rollout as the pods show it, folded into the VLLMService's status; and the switch to a rollout without surge.

Called when a Deployment of ours changes and when a pod of ours cannot be scheduled. Reads the pods of the service
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
from ..render.lws import LWS_NAME_LABEL, lws_name
from ..render.manifests import selector_for
from . import effects, kube

log = logging.getLogger("vllm_operator.rollouts")

#: How old an answer to "is the LeaderWorkerSet API served?" may be (seconds; as handlers/lws.py).
SERVED_MAX_AGE = 30.0
#: The strategy of a Deployment that must roll without a surge pod.
NO_SURGE = {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}}


def _now() -> datetime:
    return datetime.now(UTC)


def list_pods(namespace: str, service: str) -> list[dict[str, Any]]:
    # the Deployment's pods, of every profile (older ones may predate the workload label): not a group's
    selector = ",".join([*(f"{k}={v}" for k, v in selector_for(service).items()), f"!{LWS_NAME_LABEL}"])
    with kube.api_errors(f"list the pods of {service}"):
        return kube.list_objects(kube.PODS, namespace, label_selector=selector)


def refresh(namespace: str, service: str, deployment: Mapping[str, Any] | None = None) -> bool:
    """Fold the rollout of the service's Deployment into its status; returns whether the status changed."""
    if deployment is None:
        with kube.api_errors(f"read Deployment {service}"):
            deployment = kube.get(kube.DEPLOYMENTS, namespace, service)
        if deployment is None:
            return False
    dep_status = deployment.get("status") or {}
    pods: list[dict[str, Any]] = []
    if int(dep_status.get("replicas") or 0) > 0:
        pods = list_pods(namespace, service)
    view = rollout.assess(deployment, pods)
    no_surge = None
    if view.unschedulable:
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
        group = _previous_group(namespace, service, status)
        said = serving.serving("Deployment", updates, status, previous_name=group[0], previous_ready=group[1])
        if said is None:
            not_serving.append(True)
            return None  # the plan runs on a LeaderWorkerSet: its groups say whether the service serves
        generation = int((stored.get("metadata") or {}).get("generation") or 1)
        return cond.fold_status(status, conditions=said, observed_generation=generation, now=_now(),
                                ready_replicas=ready)

    not_serving: list[bool] = []  # set when the recorded plan runs on a LeaderWorkerSet: this Deployment is the old one
    changed = effects.update_status(namespace, service, build)
    # a LeaderWorkerSet can be the workload this Deployment replaces only where the API serves one
    if effects.ready(deployment) and not not_serving:
        effects.finish_switch(namespace, deployment,
                              other_served=kube.served(kube.LEADERWORKERSETS, SERVED_MAX_AGE))
    return changed


def _previous_group(namespace: str, service: str, status: Mapping[str, Any]) -> tuple[str, int]:
    """(name, ready groups) of the LeaderWorkerSet a recorded switch to the Deployment replaces; ("", 0) if none."""
    record = switch.recorded(status)
    if record is None or record.previous != "LeaderWorkerSet":
        return "", 0
    name = lws_name(service)
    with kube.api_errors(f"read LeaderWorkerSet {name}"):
        group = kube.get(kube.LEADERWORKERSETS, namespace, name)
    return name, int(((group or {}).get("status") or {}).get("readyReplicas") or 0)


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
