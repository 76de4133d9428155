"""A multi-node VLLMService's readiness from its LeaderWorkerSet and pods. Pure: no API calls.

The LWS controller reports `readyReplicas` (groups whose leader is Ready and whose workers are all available) and an
`Available` condition only when every group is ready (kubernetes-sigs/lws `updateConditions`); KServe and the NIM
operator read exactly that. Here the same rule is applied to the pods themselves (a group is ready when all its
`size` pods are Ready), because the operator is woken by pod events, and the LWS status lags the pods (it is
written after them; read at the pod event it can still say Progressing, and nothing wakes the operator when it
catches up). Ready therefore means "every group serves"; a worker the scheduler cannot place is reported as
InsufficientNodes (one group needs `size` nodes of the pool at once).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import conditions as cond
from .rollout import pod_ready, unschedulable_message

WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"


@dataclass(frozen=True)
class GroupView:
    groups: int             # desired groups (spec.replicas)
    ready_groups: int       # status.readyReplicas
    size: int               # pods per group
    available: bool         # every group ready (the LWS's own Available condition, computed from the pods)
    unschedulable: tuple[str, ...]   # 'pod: scheduler message' of pods that cannot be placed


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def assess_groups(lws: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> GroupView:
    spec = lws.get("spec") if isinstance(lws.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    template = spec.get("leaderWorkerTemplate") if isinstance(spec.get("leaderWorkerTemplate"), Mapping) else {}
    assert isinstance(template, Mapping)
    groups, size = _int(spec.get("replicas", 1)), max(_int(template.get("size", 1)), 1)
    members: dict[str, list[Mapping[str, Any]]] = {}
    stuck = []
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        members.setdefault(str(labels.get(GROUP_INDEX_LABEL, "")), []).append(pod)
        message = unschedulable_message(pod)
        if message:
            stuck.append(f"{(pod.get('metadata') or {}).get('name')}: {message}")
    ready = sum(1 for g in range(groups) if len(members.get(str(g), [])) == size
                and all(pod_ready(p) for p in members[str(g)]))
    return GroupView(groups=groups, ready_groups=ready, size=size, available=ready >= groups,
                     unschedulable=tuple(stuck))


def group_conditions(view: GroupView) -> list[cond.ConditionUpdate]:
    """Ready / Progressing for a service served by LeaderWorkerSet groups."""
    said = f"{view.ready_groups}/{view.groups} groups of {view.size} pods ready"
    if view.groups == 0:
        return [cond.ConditionUpdate(cond.READY, cond.FALSE, cond.SCALED_TO_ZERO, "scaled to zero groups"),
                cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, cond.SCALED_TO_ZERO, "scaled to zero groups")]
    if view.available and view.ready_groups >= view.groups:
        return [cond.ConditionUpdate(cond.READY, cond.TRUE, cond.AVAILABLE, said),
                cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, cond.ROLLOUT_COMPLETE, said)]
    updates = [cond.ConditionUpdate(cond.READY, cond.FALSE, cond.PODS_NOT_READY, said)]
    if view.unschedulable:
        updates.append(cond.ConditionUpdate(
            cond.PROGRESSING, cond.TRUE, cond.INSUFFICIENT_NODES,
            f"{said}; a group needs {view.size} nodes at once and the scheduler cannot place "
            + "; ".join(view.unschedulable[:3])))
    else:
        updates.append(cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, cond.DEPLOYING, said))
    return updates
