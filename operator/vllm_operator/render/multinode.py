"""The reconcile core's multi-node hooks: plan across nodes when `spec.gpu.maxNodes` > 1, say how a replica spans
nodes in status, and decide whether the LeaderWorkerSet can be rendered (engine installed, vLLM release new enough,
enough nodes of the pool). Pure: the shell passes what it observed (is the LWS API served, how many nodes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api import conditions as cond
from ..api.switch import Kind
from ..api.v1alpha1 import MultiNodeStatus, StageStatus, VLLMServiceSpec
from ..planner import Plan, PlanRequest
from ..planner.multinode import MultiNodePlan, plan_across_nodes, spanning_option
from .lws import (
    LWS_INSTALL_HINT,
    GroupOptions,
    build_multinode_children,
    lws_name,
    multinode_supported,
    multinode_unsupported_reason,
)
from .manifests import RenderInput, build_children
from .statefulset import build_statefulset_children

#: How often a service waiting for the LeaderWorkerSet API is re-checked (it may be installed at any time).
LWS_RECHECK_SECONDS = 60.0


def gpus_per_node(spec: VLLMServiceSpec, node_count: int | None) -> int:
    """GPUs one pod (one node) may use: gpu.count, else what the pool's nodes have, within gpu.maxCount."""
    if spec.gpu.count:
        return spec.gpu.count
    return min(spec.gpu.max_count, node_count) if node_count else spec.gpu.max_count


def plan_spread(spec: VLLMServiceSpec, request: PlanRequest, node_count: int | None) -> MultiNodePlan | None:
    """The plan over up to `spec.gpu.maxNodes` nodes; None when the spec allows one node (nothing changes then)."""
    if spec.gpu.max_nodes <= 1:
        return None
    per_node = gpus_per_node(spec, node_count)
    return plan_across_nodes(request.model_copy(update={"gpu_count": per_node}), gpus_per_node=per_node,
                             max_nodes=spec.gpu.max_nodes)


def with_spanning_option(result: Plan, spec: VLLMServiceSpec, request: PlanRequest, node_count: int | None,
                         pool_nodes: int) -> Plan:
    """A one-node plan that does not fit, with 'Span N nodes' first among its options when some N would fit and the
    cluster has N nodes of the pool (options name only what the cluster has; never MIG slices across nodes)."""
    if result.fits or spec.gpu.max_nodes > 1 or request.pinned.tensor_parallel_size or request.gpu.is_mig:
        return result
    per_node = gpus_per_node(spec, node_count)
    option = spanning_option(request.model_copy(update={"gpu_count": per_node}), per_node, 1)
    if option is None or option.gpu_count > per_node * pool_nodes:
        return result
    option = option.model_copy(update={"source": "cluster"})
    return result.model_copy(update={"options": [option, *result.options]})


def multinode_status(spread: MultiNodePlan, service_name: str,
                     previous: Mapping[str, Any] | None = None) -> MultiNodeStatus | None:
    """The split and stages of the plan; what the shell recorded of the groups (recreations, failures) is kept."""
    if not spread.spans_nodes:
        return None
    s = spread.split
    kept = {k: v for k, v in (previous or {}).items() if k in ("groupRecreations", "leaders", "failures")}
    return MultiNodeStatus.model_validate({**MultiNodeStatus(
        nodes=s.nodes,
        gpus_per_node=s.gpus_per_node, tensor_parallel_size=s.tensor_parallel_size,
        pipeline_parallel_size=s.pipeline_parallel_size, limiting_stage=spread.limiting_stage,
        stages=[StageStatus(stage=st.stage, first_layer=st.first_layer, layers=st.layers, weightsGiB=st.weights_gib,
                            activationGiB=st.activation_gib, kvCacheGiB=st.kv_cache_gib, num_blocks=st.num_blocks)
                for st in spread.stages],
        leader_worker_set=lws_name(service_name)).to_dict(), **kept})


@dataclass(frozen=True)
class Blocker:
    """Why a plan that spans nodes cannot be deployed now, and whether waiting can help."""

    reason: str
    message: str
    retry_after: float | None
    blocks: bool = True   # False: render anyway (nodes may come: autoscaler), but say what is missing


def blocker(spread: MultiNodePlan, version: str, *, lws_installed: bool | None,
            pool_nodes: int | None) -> Blocker | None:
    """What stops the LeaderWorkerSet from being applied: None when it can be.

    `lws_installed` None = not checked (the apply itself will tell); `pool_nodes` None = unknown (gpu.product set).
    """
    if not multinode_supported(version):
        return Blocker(cond.MULTI_NODE_UNSUPPORTED, multinode_unsupported_reason(version), None)
    if lws_installed is False:
        return Blocker(cond.LWS_NOT_INSTALLED,
                       f"the plan spans {spread.split.nodes} nodes and needs the LeaderWorkerSet API "
                       f"(leaderworkerset.x-k8s.io/v1), which this cluster does not serve; {LWS_INSTALL_HINT}. "
                       f"Re-checked every {int(LWS_RECHECK_SECONDS)} s.", LWS_RECHECK_SECONDS)
    if pool_nodes is not None and pool_nodes < spread.split.nodes:
        return Blocker(cond.INSUFFICIENT_NODES,
                       f"one replica needs {spread.split.nodes} × {spread.split.gpus_per_node}× {spread.gpu} nodes; "
                       f"found {pool_nodes} matching node(s); its workers stay Pending until enough exist",
                       LWS_RECHECK_SECONDS, blocks=False)
    return None


def progress_updates(stop: Blocker | None) -> list[cond.ConditionUpdate]:
    """A non-blocking shortfall (too few nodes yet) shown on Progressing while the LeaderWorkerSet is applied."""
    if stop is None:
        return []
    return [cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, stop.reason, stop.message)]


def group_options(spec: VLLMServiceSpec, spread: MultiNodePlan | None) -> GroupOptions:
    """What the pods of a group get beyond a single-node pod: the plan's layer split (VLLM_PP_LAYER_PARTITION, when
    a remediation step moved layers) and spec.network's RDMA resources and IPC_LOCK."""
    return GroupOptions(layer_partition=spread.partition_env() if spread else None,
                        rdma_resources=tuple((r.name, r.count) for r in spec.network.rdma_resources),
                        ipc_lock=spec.network.ipc_lock)


def workload_kind(render: RenderInput, nodes: int) -> Kind:
    """The workload the service runs as: a LeaderWorkerSet when one replica spans nodes; when each one-node pod needs
    a cache claim of its own (render/cache.py), one-pod groups (a LeaderWorkerSet) or a StatefulSet; else a
    Deployment."""
    if nodes > 1:
        return "LeaderWorkerSet"
    if render.cache_claim_template is not None:
        return render.per_pod_workload
    return "Deployment"


def runs_as_groups(render: RenderInput, nodes: int) -> bool:
    """Whether the service runs as a LeaderWorkerSet (`workload_kind`)."""
    return workload_kind(render, nodes) == "LeaderWorkerSet"


def children_for(render: RenderInput, nodes: int, group: GroupOptions | None = None) -> list[dict[str, Any]]:
    """A Deployment and its Service for one node; a LeaderWorkerSet and the leaders' Service for more, or for
    one-pod groups with a claim per pod; a StatefulSet and its Service for a claim per pod without LeaderWorkerSet."""
    kind = workload_kind(render, nodes)
    if kind == "LeaderWorkerSet":
        return build_multinode_children(render, nodes, group)
    if kind == "StatefulSet":
        return build_statefulset_children(render)
    return build_children(render)
