"""Before a rollout that stops the serving pod first: can the new pod be placed? (api/placement.py decides.)

Asked only when it matters — its rendered Deployment cannot surge (a ReadWriteOnce model cache), or it is a
LeaderWorkerSet (it rolls a group at a time without surge), and the spec or the plan changed since the status was
written (or an earlier rollout was held) — so a steady service costs no request; it matters only if the workload as
it is has Ready pods (groups). Then: that Deployment, the nodes the new pod may use, the
pods on them (at most MAX_NODES nodes; in every namespace when the operator watches them all, else in the namespaces
it watches, where the chart lets it list pods — GPUs held by pods it cannot see are not counted, and such a rollout
may still wait) and the service's own pods (of a LeaderWorkerSet: the group with the highest index, the one its
rolling update replaces first — its leader StatefulSet's partition counts down).

A StatefulSet (a claim per pod without LeaderWorkerSet) is checked like the groups: it rolls one pod at a time from
the highest ordinal without surge, so the pod it replaces first is the one with the highest ordinal.

Before a switch between workload kinds creates its new workload (make before break: the previous one serves until
the new one serves as many replicas), that many of its pods must fit beside the serving pods
(`api.placement.decide_switch`).
When it cannot — the previous workload holds every GPU of the pool — the switch would wait forever, serving but never
converging: it is held instead. Nothing is applied (the Service and the autoscaler keep addressing the previous
workload's pods), `status.workload` and `status.selector` stay the previous workload's, and Progressing says
RolloutHeld with what would let it proceed; it is looked at again at every reconcile.

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
from ..api import switch
from ..api.placement import (
    ROLLOUT_HELD,
    ROLLOUT_INTERRUPTS,
    Placement,
    decide,
    decide_switch,
    pod_template,
    surges_any,
)
from ..reconcile import EVENT_NORMAL, EVENT_WARNING, Desired, Event
from ..render.lws import LWS_GROUP_INDEX_LABEL
from ..render.manifests import LABEL_SERVICE, selector_for
from ..render.pods import serving_pods
from . import config, effects, kube

#: The most nodes of a pool whose pods are listed for one decision (a larger pool: the first ones, by name).
MAX_NODES = 32
#: How old an answer to "is the LeaderWorkerSet API served?" may be (seconds; as handlers/rollouts.py).
SERVED_MAX_AGE = 30.0


#: The workloads whose rollouts are checked.
WORKLOADS = switch.WORKLOADS
#: Why a service switches to a workload kind (the held switch's message).
SWITCH_WHY = {
    "StatefulSet": "each pod of this service needs a model cache claim of its own (it may run several pods and "
                   "the storage is ReadWriteOnce; the LeaderWorkerSet API is not served)",
    "LeaderWorkerSet": "its plan spans nodes, or each of its pods needs a model cache claim of its own",
    "Deployment": "its plan runs on a Deployment now",
}


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


def _pool_pods(desired_deployment: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The nodes the workload's pods may use (at most MAX_NODES) and the pods on them that the operator can see."""
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
    return nodes, pods


def _observe(namespace: str, name: str, desired_deployment: Mapping[str, Any]
             ) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    kind = str(desired_deployment.get("kind") or "Deployment")
    with kube.api_errors(f"read {kind} {name}"):
        current = kube.get(kube.KIND_RESOURCES[kind], namespace, str(desired_deployment["metadata"]["name"]))
    nodes, pods = _pool_pods(desired_deployment)
    if kind == "StatefulSet":
        own_selector = serving_pods(name, namespace, kind=kind).label_selector()
    else:
        own_selector = ",".join(f"{k}={v}" for k, v in selector_for(name).items())
    with kube.api_errors(f"list the pods of {name}"):
        mine = kube.list_objects(kube.PODS, namespace, label_selector=own_selector)
    if kind == "LeaderWorkerSet":
        mine = _first_replaced_group(mine)
    elif kind == "StatefulSet":
        mine = _highest_ordinal(mine)
    own = [str((p.get("metadata") or {}).get("name") or "") for p in mine]
    return current, nodes, pods, own


def _highest_ordinal(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pod a StatefulSet's rolling update replaces first: the highest ordinal (`<sts>-<n>`)."""
    def ordinal(pod: Mapping[str, Any]) -> int:
        tail = str((pod.get("metadata") or {}).get("name") or "").rsplit("-", 1)[-1]
        return int(tail) if tail.isdigit() else -1
    top = max((ordinal(p) for p in pods), default=-1)
    return [p for p in pods if ordinal(p) == top and top >= 0]


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
    interruption said when it can; a switch to another workload kind held (and said) when the new workload's pods
    could not be placed beside the serving pods."""
    children = desired.children
    deployment = _deployment(children) if children is not None else None
    if deployment is not None and _switching(status, desired):
        held_switch = _guard_switch(namespace, name, status, desired, deployment, now)
        if held_switch is not None:
            return held_switch
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


def _switching(status: Mapping[str, Any], desired: Desired) -> bool:
    """Whether this reconcile may start a switch between workload kinds: the plan's kind is not the one the status
    records, or a switch is recorded at its first step (its new workload may not exist yet)."""
    record = switch.recorded(status)
    if record is not None:
        return record.step == switch.CREATE_TARGET
    return desired.status.workload is not None and switch.target_kind(status) != desired.status.workload


def _guard_switch(namespace: str, name: str, status: Mapping[str, Any], desired: Desired,
                  target: Mapping[str, Any], now: datetime) -> Desired | None:
    """The desired state with the switch held when the new workload does not exist yet and its pods cannot be
    placed beside the serving one's pods; None when the switch may go on (or there is none)."""
    kind = str(target.get("kind"))
    with kube.api_errors(f"read {kind} {target['metadata']['name']}"):
        if kube.get(kube.KIND_RESOURCES[kind], namespace, str(target["metadata"]["name"])) is not None:
            return None  # created already: the switch waits for it (or it is this kind's own rollout)
    meta = target.get("metadata") or {}
    owner: Mapping[str, Any] = next(iter(meta.get("ownerReferences") or []), {})
    uid = str(owner.get("uid") or "")
    label = str((meta.get("labels") or {}).get(LABEL_SERVICE) or "")
    previous = None
    for other in switch.others(kind):
        if other == "LeaderWorkerSet" and not kube.served(kube.LEADERWORKERSETS, SERVED_MAX_AGE):
            continue
        other_name = effects.workload_names(name)[other]
        with kube.api_errors(f"read {other} {other_name}"):
            found = kube.get(kube.KIND_RESOURCES[other], namespace, other_name)
        if found is not None and effects.owned(found, uid, label):
            previous = found
            break
    if previous is None:
        return None
    ready = int((previous.get("status") or {}).get("readyReplicas") or 0)
    nodes, pods = _pool_pods(target)
    placement = decide_switch(previous, target, ready=ready, nodes=nodes, pods=pods,
                              why=SWITCH_WHY.get(kind, f"its plan runs on a {kind} now"))
    if placement.verdict != "hold":
        return None
    # nothing is applied: the previous workload and what addresses its pods stay as they are, and the status keeps
    # saying that workload runs (the next reconcile plans the switch again and looks again)
    desired.children = None
    previous_kind = str(previous.get("kind"))
    keep = {"workload": previous_kind, "selector": status.get("selector") if isinstance(status.get("selector"), str)
            else serving_pods(name, namespace, kind=previous_kind).label_selector(), "workload_switch": None}
    desired.status = desired.status.model_copy(update=keep)
    return _apply(desired, placement, status, now)


def _apply(desired: Desired, placement: Placement, status: Mapping[str, Any], now: datetime) -> Desired:
    if placement.verdict == "proceed":
        return desired
    generation = desired.status.observed_generation
    if placement.verdict == "hold":
        if desired.children is not None:
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
