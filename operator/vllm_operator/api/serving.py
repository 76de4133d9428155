"""Whether a service serves, decided once from whichever of its workloads exist (pure).

The Deployment's or StatefulSet's rollout (handlers/rollouts.py) and the LeaderWorkerSet's groups (handlers/lws.py)
each compute conditions from their own workload; both fold them into the service's status through `serving`, so that during a
switch between workload kinds (api/switch.py) they never disagree: the workload the recorded plan runs on
(`switch.target_kind`: `status.workload`, which the reconcile records with the plan) speaks, the other stays
silent; while the new one is not Ready and the previous one still has ready pods, Ready is False with
`ServingPreviousProfile`, naming the previous workload.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import conditions as cond
from .switch import WorkloadSwitch, recorded, target_kind


def serving(kind: str, updates: Sequence[cond.ConditionUpdate], status: Mapping[str, Any], *,
            previous_name: str = "", previous_ready: int = 0) -> list[cond.ConditionUpdate] | None:
    """The conditions a workload of `kind` may fold into the service's status: None when it is not the workload the
    recorded plan runs on (the other one speaks); its own `updates` otherwise, except that while a switch from a
    previous workload (`previous_ready` ready pods or groups) runs and this one is not Ready, Ready says that the
    previous workload still serves."""
    if kind != target_kind(status):
        return None
    switch = recorded(status)
    ready = next((u for u in updates if u.type == cond.READY), None)
    if switch is None or switch.target != kind or previous_ready <= 0 or ready is None or ready.status == cond.TRUE:
        return list(updates)
    previous = switching(switch, previous_name=previous_name, previous_ready=previous_ready,
                         target_said=ready.message)
    return [u for u in updates if u.type != cond.READY] + ([previous] if previous is not None else [ready])


def switching(switch: WorkloadSwitch, *, previous_name: str, previous_ready: int,
              target_said: str) -> cond.ConditionUpdate | None:
    """Ready while a switch waits for its new workload: False, the previous workload still serving (None when it
    has no ready pods or groups either: then the new workload's own word stands)."""
    if previous_ready <= 0:
        return None
    unit = "group" if switch.previous == "LeaderWorkerSet" else "pod"
    return cond.ConditionUpdate(
        cond.READY, cond.FALSE, cond.SERVING_PREVIOUS_PROFILE,
        f"the previous {switch.previous} {previous_name} still serves ({previous_ready} {unit}"
        f"{'s' if previous_ready != 1 else ''} ready) until the {switch.target} is Ready: {target_said}")
