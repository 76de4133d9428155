"""Before a rollout that stops the serving pod first: can the new pod be placed? (api/placement.py decides.)

Asked only when it matters — its rendered Deployment cannot surge (a ReadWriteOnce model cache), or it is a
LeaderWorkerSet (it rolls a group at a time without surge), and the spec or the plan changed since the status was
written (or an earlier rollout was held) — so a steady service costs no request; it matters only if the workload as
it is has Ready pods (groups). Then: that Deployment, the nodes the new pod may use, the
pods on them (at most MAX_NODES nodes; in every namespace when the operator watches them all, else in the namespaces
it watches, where the chart lets it list pods — GPUs held by pods it cannot see are not counted, and such a rollout
may still wait) and the service's own pods (of a LeaderWorkerSet: the group with the highest index, the one its
rolling update replaces first — its leader StatefulSet's partition counts down).

A held rollout leaves the Deployment (LeaderWorkerSet) as it is (it is dropped from the children to apply), says why in
Progressing (reason RolloutHeld) and in one Warning Event; a rollout that will interrupt service says so (Progressing
reason RolloutInterrupts, and an Event) in the same status write that records the new plan, before the Deployment is
updated. A held rollout is looked at again at every reconcile (the watchdog's round included), and proceeds once a
GPU is free.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..api import conditions as cond
from ..api.placement import ROLLOUT_HELD, ROLLOUT_INTERRUPTS, Placement, decide, pod_template, surges_any
from ..reconcile import EVENT_NORMAL, EVENT_WARNING, Desired, Event
from ..render.lws import LWS_GROUP_INDEX_LABEL
from ..render.manifests import selector_for
from . import config, effects, kube

#: The most nodes of a pool whose pods are listed for one decision (a larger pool: the first ones, by name).
MAX_NODES = 32


#: The workloads whose rollouts are checked.
WORKLOADS = ("Deployment", "LeaderWorkerSet")


def _deployment(children: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The service's workload among the children: its Deployment or its LeaderWorkerSet."""
    return next((c for c in children if c.get("kind") in WORKLOADS), None)


def _rolls_without_surge(workload: Mapping[str, Any]) -> bool:
    return not surges_any(workload)


def held(status: Mapping[str, Any]) -> bool:
    """Whether the service's rollout is held now (Progressing says RolloutHeld): what else writes Progressing (the
    LeaderWorkerSet's group view) keeps it."""
    return _held_before(status)


def _held_before(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == cond.PROGRESSING and c.get("reason") == ROLLOUT_HELD
               for c in status.get("conditions") or [] if isinstance(c, Mapping))


def _changed(status: Mapping[str, Any], desired: Desired) -> bool:
    before = status.get("plan") or {}
    after = desired.status.plan
    return after is None or before.get("specHash") != after.spec_hash or before.get("args") != after.args


def _observe(namespace: str, name: str, desired_deployment: Mapping[str, Any]
             ) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    kind = str(desired_deployment.get("kind") or "Deployment")
    resource = kube.LEADERWORKERSETS if kind == "LeaderWorkerSet" else kube.DEPLOYMENTS
    with kube.api_errors(f"read {kind} {name}"):
        current = kube.get(resource, namespace, str(desired_deployment["metadata"]["name"]))
    template_spec = pod_template(desired_deployment).get("spec") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted((template_spec.get("nodeSelector") or {}).items()))
    with kube.api_errors("list the nodes of the new pool"):
        nodes = sorted(kube.list_objects(kube.NODES, label_selector=selector or None),
                       key=lambda n: str((n.get("metadata") or {}).get("name")))[:MAX_NODES]
    pods: list[dict[str, Any]] = []
    # every namespace when the operator watches them all (the chart grants it pods there), else those it watches
    scopes: tuple[str | None, ...] = config.CONFIG.namespaces or (None,)
    for node in nodes:
        node_name = str((node.get("metadata") or {}).get("name") or "")
        for scope in scopes:
            with kube.api_errors(f"list the pods on node {node_name}"):
                pods.extend(kube.list_objects(kube.PODS, scope, field_selector=f"spec.nodeName={node_name}"))
    own_selector = ",".join(f"{k}={v}" for k, v in selector_for(name).items())
    with kube.api_errors(f"list the pods of {name}"):
        mine = kube.list_objects(kube.PODS, namespace, label_selector=own_selector)
    if kind == "LeaderWorkerSet":
        mine = _first_replaced_group(mine)
    own = [str((p.get("metadata") or {}).get("name") or "") for p in mine]
    return current, nodes, pods, own


def _first_replaced_group(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods of the group a LeaderWorkerSet's rolling update replaces first: the highest group index."""
    def index(pod: Mapping[str, Any]) -> int:
        try:
            return int(str(((pod.get("metadata") or {}).get("labels") or {}).get(LWS_GROUP_INDEX_LABEL)))
        except ValueError:
            return -1
    top = max((index(p) for p in pods), default=-1)
    return [p for p in pods if index(p) == top and top >= 0]


def guard(namespace: str, name: str, status: Mapping[str, Any], desired: Desired, now: datetime) -> Desired:
    """The desired state, with the Deployment held back (and said) when its new pod could not be placed, or the
    interruption said when it can."""
    children = desired.children
    deployment = _deployment(children) if children is not None else None
    if (children is None or deployment is None or not _rolls_without_surge(deployment)
            or not (_changed(status, desired) or _held_before(status))):
        return desired
    current, nodes, pods, own = _observe(namespace, name, deployment)
    # the workload's own count (pods, or groups): the status's readyReplicas may not have caught up with a pod that
    # just got Ready
    ready = int(((current or {}).get("status") or {}).get("readyReplicas") or 0)
    start = (status.get("coldStart") or {}).get("readySeconds")
    placement = decide(current, deployment, ready=ready, nodes=nodes, pods=pods, own_pods=own,
                       start_seconds=float(start) if isinstance(start, (int, float)) else None)
    return _apply(desired, placement, status, now)


def _apply(desired: Desired, placement: Placement, status: Mapping[str, Any], now: datetime) -> Desired:
    if placement.verdict == "proceed":
        return desired
    generation = desired.status.observed_generation
    if placement.verdict == "hold":
        assert desired.children is not None
        desired.children = [c for c in desired.children if c.get("kind") not in WORKLOADS]
        updates = [cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, ROLLOUT_HELD, placement.message)]
        said = any(c.get("type") == cond.PROGRESSING and c.get("reason") == ROLLOUT_HELD
                   and c.get("message") == placement.message for c in status.get("conditions") or [])
        if not said:
            desired.events.append(Event(EVENT_WARNING, ROLLOUT_HELD, placement.message))
    else:
        updates = [cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, ROLLOUT_INTERRUPTS, placement.message)]
        desired.events.append(Event(EVENT_NORMAL, ROLLOUT_INTERRUPTS, placement.message))
    desired.status = cond.fold_status(desired.status, conditions=updates, observed_generation=generation, now=now)
    return desired


def announces(desired: Desired) -> bool:
    """Whether this reconcile starts a rollout that interrupts service (said before it starts)."""
    found = cond.find_condition(desired.status.conditions, cond.PROGRESSING)
    return bool(found is not None and found.reason == ROLLOUT_INTERRUPTS and desired.children
                and _deployment(desired.children) is not None
                and any(e.reason == ROLLOUT_INTERRUPTS for e in desired.events))


def post_announcement(namespace: str, involved: Mapping[str, Any], desired: Desired) -> None:
    """Post the interruption's Event now (before the Deployment changes); it is taken off the events to post later."""
    for event in [e for e in desired.events if e.reason == ROLLOUT_INTERRUPTS]:
        effects.post_event(namespace, involved, event.type, event.reason, event.message)
        desired.events.remove(event)
