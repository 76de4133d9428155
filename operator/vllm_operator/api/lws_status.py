"""A multi-node VLLMService's readiness from its LeaderWorkerSet and pods. Pure: no API calls.

The LWS controller reports `readyReplicas` (groups whose leader is Ready and whose workers are all available) and an
`Available` condition only when every group is ready (kubernetes-sigs/lws `updateConditions`); KServe and the NIM
operator read exactly that. Here the same rule is applied to the pods themselves (a group is ready when all its
`size` pods are Ready), because the operator is woken by pod events, and the LWS status lags the pods (it is
written after them; read at the pod event it can still say Progressing, and nothing wakes the operator when it
catches up). Ready therefore means "every group serves"; a worker the scheduler cannot place is reported as
InsufficientNodes (one group needs `size` nodes of the pool at once).

Leader and worker pods carry the same `model-download` init container (render/lws.py from render/cache.py), read
as api/rollout.py reads a single-node pod's (`download_running`, `download_failure`): a group whose pods download
is `Downloading`, naming the pods and their ranks; a download that fails on any rank is `ModelDownloadFailed`
(Degraded, never Ready), with the redacted reason the pod hook recorded in `status.modelCache.downloadError`.
Such a failure is not a rank failure: the group's failure attribution (remediation/groups.py) reads only the vLLM
container, and a group LeaderWorkerSet recreates because its download failed is not counted toward
`maxGroupRecreations` (`not_failing_groups`: a download that fails, or a group whose vLLM never started, which no
vLLM failure can have recreated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import conditions as cond
from .rollout import (
    STANDING,
    current_degraded_reason,
    download_detail,
    download_failure,
    download_running,
    pod_ready,
    unschedulable_message,
)

WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"


@dataclass(frozen=True)
class GroupView:
    groups: int             # desired groups (spec.replicas)
    ready_groups: int       # status.readyReplicas
    size: int               # pods per group
    available: bool         # every group ready (the LWS's own Available condition, computed from the pods)
    unschedulable: tuple[str, ...]   # 'pod: scheduler message' of pods that cannot be placed
    downloading: tuple[str, ...] = ()       # 'rank: pod X, started at T' of pods whose model download runs
    download_failed: tuple[tuple[str, str], ...] = ()   # (rank, the kubelet's word) of pods whose download fails
    download_failed_groups: frozenset[str] = frozenset()  # group indexes with a failing download
    unstarted_groups: frozenset[str] = frozenset()  # group indexes none of whose pods' vLLM container has run yet
    vllm_started: int = 0   # pods whose vLLM container has run (so their download succeeded)

    @property
    def not_failing_groups(self) -> frozenset[str]:
        """Groups a recreation of which now would be no vLLM pod failure (remediation/groups.count_recreations):
        LeaderWorkerSet's RecreateGroupOnPodRestart also recreates a group when an init container restarts, and a
        vLLM that never ran cannot have failed."""
        return self.download_failed_groups | self.unstarted_groups


def _vllm_started(pod: Mapping[str, Any]) -> bool:
    """Whether a container of the pod (vLLM) has run: running, ready, terminated, or terminated before."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if not isinstance(status, Mapping):
            continue
        state, last = status.get("state") or {}, status.get("lastState") or {}
        if status.get("ready") or "running" in state or "terminated" in state or "terminated" in last:
            return True
    return False


def _rank(labels: Mapping[str, Any]) -> str:
    """'leader of group 0', 'worker 1 of group 0' from a pod's LWS labels."""
    worker, group = str(labels.get(WORKER_INDEX_LABEL, "?")), str(labels.get(GROUP_INDEX_LABEL, "?"))
    return f"leader of group {group}" if worker == "0" else f"worker {worker} of group {group}"


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
    stuck, running, failed = [], [], []
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        members.setdefault(str(labels.get(GROUP_INDEX_LABEL, "")), []).append(pod)
        message = unschedulable_message(pod)
        if message:
            stuck.append(f"{(pod.get('metadata') or {}).get('name')}: {message}")
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue  # a pod of a group LWS is deleting says nothing of the group that replaces it
        if (failure := download_failure(pod)) is not None:
            failed.append((_rank(labels), failure, str(labels.get(GROUP_INDEX_LABEL, ""))))
        elif (downloading := download_running(pod)) is not None:
            running.append(f"{_rank(labels)}: {downloading}")
    ready = sum(1 for g in range(groups) if len(members.get(str(g), [])) == size
                and all(pod_ready(p) for p in members[str(g)]))
    return GroupView(groups=groups, ready_groups=ready, size=size, available=ready >= groups,
                     unschedulable=tuple(stuck), downloading=tuple(running),
                     download_failed=tuple((rank, failure) for rank, failure, _ in failed),
                     download_failed_groups=frozenset(group for *_, group in failed),
                     unstarted_groups=frozenset(g for g, group in members.items()
                                                if not any(_vllm_started(p) for p in group)),
                     vllm_started=sum(1 for p in pods if _vllm_started(p)))


def group_conditions(view: GroupView, status: Mapping[str, Any] | None = None) -> list[cond.ConditionUpdate]:
    """Ready / Progressing (and Degraded for the model download) for a service served by LeaderWorkerSet groups.

    `status` is the service's current status: the redacted reason of a failing download
    (status.modelCache.downloadError), and whether Degraded holds a verdict the groups must not override (STANDING)
    or a download failure they may clear. Without it a failing download is still said, with the kubelet's word."""
    said = f"{view.ready_groups}/{view.groups} groups of {view.size} pods ready"
    if view.groups == 0:
        return [cond.ConditionUpdate(cond.READY, cond.FALSE, cond.SCALED_TO_ZERO, "scaled to zero groups"),
                cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, cond.SCALED_TO_ZERO, "scaled to zero groups")]
    degraded = current_degraded_reason(status) if status is not None else None
    if view.download_failed:
        return _download_failed(view, said, status or {}, degraded)
    if degraded == cond.MODEL_DOWNLOAD_FAILED and _failed_before_recreation(view, status or {}):
        return []  # a group recreated after its download failed: what is said stands until a pod says otherwise
    if view.available and view.ready_groups >= view.groups:
        updates = [cond.ConditionUpdate(cond.READY, cond.TRUE, cond.AVAILABLE, said),
                   cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, cond.ROLLOUT_COMPLETE, said)]
        if degraded is not None and degraded not in STANDING and degraded != cond.MODEL_DOWNLOAD_FAILED:
            # a pod failure or a remediation step (Remediating) is over once every group serves: say so, as the
            # Deployment's rollout does; a verdict (STANDING, group recreations exhausted) stands
            steps = _steps(status or {})
            updates.append(cond.ConditionUpdate(cond.DEGRADED, cond.FALSE, cond.AS_EXPECTED,
                                                f"{said} after {steps} remediation step(s)" if steps else said))
    else:
        updates = _not_ready(view, said)
    if degraded == cond.MODEL_DOWNLOAD_FAILED:
        updates.append(cond.ConditionUpdate(cond.DEGRADED, cond.FALSE, cond.AS_EXPECTED,
                                            "the model download no longer fails"))
    return updates


def _steps(status: Mapping[str, Any]) -> int:
    remediation = status.get("remediation")
    step = remediation.get("step") if isinstance(remediation, Mapping) else None
    return step if isinstance(step, int) and step > 0 else 0


def _failed_before_recreation(view: GroupView, status: Mapping[str, Any]) -> bool:
    """Whether the download failure recorded (status.modelCache.downloadError, cleared by the pod hook once a download
    succeeds) still stands: LeaderWorkerSet recreated the group on the init container's retry and no pod of the new
    group has said anything of its download yet (none downloads, no vLLM container has run)."""
    cache = status.get("modelCache")
    recorded = cache.get("downloadError") if isinstance(cache, Mapping) else None
    return bool(recorded) and not view.downloading and view.ready_groups == 0 and not view.vllm_started


def _not_ready(view: GroupView, said: str) -> list[cond.ConditionUpdate]:
    """Why the groups do not serve yet, when no download fails: the scheduler, a download in progress, or starting."""
    if view.unschedulable:
        return [cond.ConditionUpdate(cond.READY, cond.FALSE, cond.PODS_NOT_READY, said),
                cond.ConditionUpdate(
                    cond.PROGRESSING, cond.TRUE, cond.INSUFFICIENT_NODES,
                    f"{said}; a group needs {view.size} nodes at once and the scheduler cannot place "
                    + "; ".join(view.unschedulable[:3]))]
    if view.downloading:
        detail = "downloading the model into the cache: " + "; ".join(view.downloading[:3]) + (
            f" (and {len(view.downloading) - 3} more)" if len(view.downloading) > 3 else "")
        return [cond.ConditionUpdate(cond.READY, cond.FALSE, cond.DOWNLOADING, f"{said}: {detail}"),
                cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, cond.DOWNLOADING, f"{said}; {detail}")]
    return [cond.ConditionUpdate(cond.READY, cond.FALSE, cond.PODS_NOT_READY, said),
            cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, cond.DEPLOYING, said)]


def _download_failed(view: GroupView, said: str, status: Mapping[str, Any],
                     degraded: str | None) -> list[cond.ConditionUpdate]:
    """A rank's model download fails: the group cannot serve until it succeeds (a gated model without a token, a
    missing revision, an image that cannot be pulled). Degraded unless a standing verdict holds."""
    rank, failure = view.download_failed[0]
    detail = f"{rank}: {download_detail(failure, status)}"
    others = len(view.download_failed) - 1
    if others:
        detail += f" (and {others} more pod{'s' if others > 1 else ''} of the groups)"
    updates = [cond.ConditionUpdate(cond.READY, cond.FALSE, cond.MODEL_DOWNLOAD_FAILED, f"{said}: {detail}"),
               cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, cond.MODEL_DOWNLOAD_FAILED,
                                    f"{said}; the model download fails: {detail}")]
    if degraded not in STANDING:
        updates.append(cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, cond.MODEL_DOWNLOAD_FAILED,
                                            f"the model download fails: {detail}"))
    return updates
