"""Failures of a multi-node group (LeaderWorkerSet): which rank and pipeline stage failed, and whether it was the
network. Pure: no Kubernetes client.

vLLM's native multi-node ranks are TP-fastest: node `w` (the pod with `leaderworkerset.sigs.k8s.io/worker-index`
= w) holds global ranks w·g … w·g+g−1 for g GPUs per node, and rank r is in pipeline stage r // TP
(`vllm/v1/executor/multiproc_executor.py`). With TP = GPUs per node each node is exactly one stage; with a
smaller TP (TP 1 × PP on PCIe GPUs) a node holds GPUs-per-node / TP stages, and the GPU a CUDA out-of-memory names
tells which of them failed (`failed_stage`).

Network failures — NCCL, Gloo, ZMQ and rendezvous timeouts — say nothing about GPU memory: the classifier gives
them the class `Network`, which the ladder surfaces without changing a memory flag (policy: only MEMORY_FAILURES
step). Patterns from the threads in ../shared/research/multinode.md §4 (Gloo connectFullMesh under hostNetwork,
NCCL watchdog timeouts, ZMQ "Cannot assign requested address", TCPStore timeouts).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..api.v1alpha1 import RemediationSpec

WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"

#: (what, pattern): the first that matches names the failure. Ordered from most to least specific.
NETWORK_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((what, re.compile(pattern)) for what, pattern in (
    ("NCCL", r"ProcessGroupNCCL.*(?:Watchdog caught collective operation timeout|timed out)"),
    # not "NCCL error: unhandled cuda error" (a CUDA fault inside a collective, not the network)
    # not a bare "NCCL error: unhandled system error" (ncclSystemError: a system call in NCCL's transport failed —
    # on one node that is shared memory or P2P, not a network; see classifier.nccl_system_error)
    ("NCCL", r"NCCL error:? (?:remote process exited|.*(?:socket|[Cc]onnection|timed? ?out))|"
             r"\bncclRemoteError\b|NCCL WARN .*(?:[Ss]ocket|[Cc]onnect|NET/|timeout)"),
    ("Gloo", r"Gloo connectFullMesh failed|\[enforce fail at .*gloo|gloo/transport/tcp"),
    ("ZMQ", r"\bzmq\.error\.\w+|\bZMQError\b"),
    ("rendezvous", r"DistNetworkError|DistStoreError|TCPStore.*(?:timed out|Connection refused)|"
                   r"The client socket has timed out|Socket Timeout"),
    ("network", r"Cannot assign requested address|Connection reset by peer|No route to host|"
                r"Name or service not known|Temporary failure in name resolution"),
))


def network_failure(text: str) -> str | None:
    """'NCCL', 'Gloo', 'ZMQ', 'rendezvous' or 'network' when the text shows a communication failure; else None."""
    for what, pattern in NETWORK_PATTERNS:
        if pattern.search(text):
            return what
    return None


class RankAttribution(BaseModel):
    """Where in the engine a pod of a group sits."""

    model_config = ConfigDict(frozen=True)

    group: int | None = Field(description="the LWS group (replica) index; None when the pod has no LWS labels")
    node_rank: int = Field(ge=0, description="vLLM's --node-rank: the LWS worker index (0 = leader)")
    ranks: tuple[int, ...] = Field(description="global ranks (GPUs) on this pod")
    stages: tuple[int, ...] = Field(description="pipeline stages those ranks belong to")

    def describe(self) -> str:
        where = "leader" if self.node_rank == 0 else f"worker {self.node_rank}"
        stages = ", ".join(map(str, self.stages))
        return (f"{where} (node rank {self.node_rank}, ranks {self.ranks[0]}–{self.ranks[-1]}, pipeline stage"
                f"{'s' if len(self.stages) > 1 else ''} {stages})")


def attribute(labels: Mapping[str, Any], *, gpus_per_node: int, tensor_parallel_size: int) -> RankAttribution | None:
    """The rank and stage of a pod from its LWS labels; None when it is not a pod of a group."""
    raw = labels.get(WORKER_INDEX_LABEL)
    try:
        node_rank = int(str(raw))
    except ValueError:
        return None
    if node_rank < 0 or gpus_per_node < 1 or tensor_parallel_size < 1:
        return None
    group_raw = labels.get(GROUP_INDEX_LABEL)
    group = int(str(group_raw)) if str(group_raw).isdigit() else None
    ranks = tuple(range(node_rank * gpus_per_node, (node_rank + 1) * gpus_per_node))
    stages = tuple(sorted({rank // tensor_parallel_size for rank in ranks}))
    return RankAttribution(group=group, node_rank=node_rank, ranks=ranks, stages=stages)


_CUDA_DEVICE = re.compile(r"^cuda:(\d+)$")


def failed_stage(where: RankAttribution, device: str | None, tensor_parallel_size: int) -> int | None:
    """The one pipeline stage of a pod that holds several, from the GPU its failure names (the classifier's
    `Failure.device`, "cuda:3" from torch's "GPU 3 has a total capacity of …"); None when it names none of this
    pod's GPUs.

    vLLM 0.33 `MultiprocExecutor` starts one worker per GPU of the node with local rank l on device cuda:l and global
    rank GPUs-per-node × node rank + l; the PP groups are strided over TP-fastest ranks, so that worker's stage is
    its global rank // TP."""
    match = _CUDA_DEVICE.match(device or "")
    if match is None or tensor_parallel_size < 1:
        return None
    local = int(match.group(1))
    if local >= len(where.ranks):
        return None
    stage = where.ranks[local] // tensor_parallel_size
    return stage if stage in where.stages else None


def recreations_exhausted(recreations: int, limit: int) -> bool:
    """Group recreations are bounded like ladder steps: past `limit` the service is Degraded with a verdict."""
    return recreations > limit


#: Group recreations after pod failures that the operator lets LeaderWorkerSet make before it says Degraded
#: (lws#877 "bounded group recovery"; the LWS controller itself recreates forever): the default of
#: spec.remediation.maxGroupRecreations.
MAX_GROUP_RECREATIONS: int = RemediationSpec.model_fields["max_group_recreations"].default


def group_recreation_limit(spec: Any) -> int:
    """spec.remediation.maxGroupRecreations of a stored spec (a raw mapping); the default when absent or invalid
    (the CRD bounds it; an object written around the CRD must not crash the count)."""
    remediation = spec.get("remediation") if isinstance(spec, Mapping) else None
    if not isinstance(remediation, Mapping):
        return MAX_GROUP_RECREATIONS
    try:
        return RemediationSpec.model_validate(dict(remediation)).max_group_recreations
    except ValidationError:
        return MAX_GROUP_RECREATIONS
MAX_RECORDED_FAILURES = 8


def record_failure(multi: Mapping[str, Any], *, pod: str, pod_uid: str, labels: Mapping[str, Any],
                   failure_class: str, summary: str, time: str) -> dict[str, Any] | None:
    """status.multiNode with this pod's failure added (attributed to its rank and stages); None when it is there
    already. The first failure of a group comes first: what a restart of the other ranks would hide."""
    failures = [dict(f) for f in multi.get("failures") or [] if isinstance(f, Mapping)]
    if any(f.get("podUID") == pod_uid for f in failures):
        return None
    where = attribute(labels, gpus_per_node=int(multi.get("gpusPerNode") or 1),
                      tensor_parallel_size=int(multi.get("tensorParallelSize") or 1))
    entry = {"pod": pod, "podUID": pod_uid, "nodeRank": where.node_rank if where else 0,
             "stages": list(where.stages) if where else [], "failureClass": failure_class,
             "summary": summary[:400], "time": time}
    return {**multi, "failures": [*failures, entry][-MAX_RECORDED_FAILURES:]}


#: The mark on a leader's entry in status.multiNode.leaders ("uid/plan/download-failed") while its group's model
#: download fails. LeaderWorkerSet's RecreateGroupOnPodRestart reads init containers too (kubernetes-sigs/lws
#: `podutils.ContainerRestarted`: any init or app container with restartCount > 0 of a Pending or Running pod), so
#: the kubelet's first retry of a failing `model-download` init container deletes and recreates the whole group —
#: again and again for a gated model without a token. That is no pod failure of vLLM: it is not counted toward
#: maxGroupRecreations (the service says ModelDownloadFailed instead; api/lws_status.py).
DOWNLOAD_FAILED_MARK = "download-failed"


def _leader_entry(entry: str) -> tuple[str, str, bool]:
    """(leader UID, plan hash, whether its group's download was failing) of a status.multiNode.leaders value."""
    uid, _, rest = entry.partition("/")
    plan, _, mark = rest.partition("/")
    return uid, plan, mark == DOWNLOAD_FAILED_MARK


def count_recreations(multi: Mapping[str, Any], leaders: Mapping[str, tuple[str, str]],
                      download_failed: Collection[str] = ()) -> dict[str, Any]:
    """status.multiNode with `leaders` (group index → (leader pod UID, plan hash)) recorded and every group whose
    leader changed under the same plan counted as a recreation (a new plan is a profile change, not a failure),
    unless the group replaced was last seen where no vLLM failure can have recreated it (`download_failed`: the
    group indexes whose model-download init container fails now or whose vLLM has not started yet,
    api/lws_status.GroupView.not_failing_groups)."""
    known = {str(k): str(v) for k, v in (multi.get("leaders") or {}).items()}
    count = int(multi.get("groupRecreations") or 0)
    for group, (uid, plan) in leaders.items():
        before = known.get(group)
        if before is not None:
            old_uid, old_plan, was_downloading = _leader_entry(before)
            if old_uid != uid and old_plan == plan and not was_downloading:
                count += 1
        known[group] = f"{uid}/{plan}" + (f"/{DOWNLOAD_FAILED_MARK}" if group in download_failed else "")
    return {**multi, "leaders": known, "groupRecreations": count}
