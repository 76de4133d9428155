"""Plans that span nodes: how many nodes, which TP × PP split, and what each pipeline stage holds.

vLLM's native multi-node mode (`--nnodes/--node-rank/--master-addr`, `--headless` on the other nodes) runs one
engine over `nnodes` nodes: world = TP × PP, local world = world / nnodes GPUs per node, ranks TP-fastest
(`vllm/v1/executor/multiproc_executor.py::_get_parallel_sizes`). With TP = GPUs per node and PP = nodes, every node
is one pipeline stage (the split vLLM's docs recommend); for GPUs without NVLink (PCIe L40S) TP 1 × PP (nodes × GPUs)
is tried as well. Layers are split as `vllm/distributed/utils.py::get_pp_indices` splits them
(`memory.pp_layer_counts`: the first stage carries the embedding, the last the lm_head and the sampler), and the
KV cache is the minimum over stages, as `kv_cache_utils.py::unify_kv_cache_configs` makes it. The figures per stage
come from the same functions `memory.predict_startup` uses.

Pure: no Kubernetes, no I/O. A plan spans nodes only when one node's GPUs cannot meet the objective and the caller
allows more than one node (`spec.gpu.maxNodes`, CLI `--nodes`).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from ..api.v1alpha1 import PinnedFlags
from . import budget
from .arch import ModelArch, gib
from .failures import FailureKind
from .memory import (
    EngineFlags,
    GPUFacts,
    PredictedFailure,
    _layout,
    _stage_kinds,
    arch_for_release,
    init_nontorch_gib,
    non_torch_bytes,
    pp_layer_counts,
    pp_partition,
    profile_for_model,
    stage_terms,
    weights_bytes_per_gpu,
)
from .plan import Option, Plan, PlanRequest, layer_partition, plan, rank_options
from .versions import VersionProfile, profile_for

__all__ = [
    "MAX_OPTION_NODES",
    "MultiNodePlan",
    "Split",
    "StageMemory",
    "candidate_splits",
    "limiting_stage",
    "multinode_document",
    "nodes_for",
    "plan_across_nodes",
    "pp_partition",
    "render_multinode_text",
    "spanning_option",
    "stage_memory",
]

MAX_OPTION_NODES = 8   # how far the options look beyond what the caller allows


class StageMemory(BaseModel):
    """One pipeline stage's GPU (one TP rank), in GiB, as its worker's startup log would report it."""

    model_config = ConfigDict(frozen=True)

    stage: int
    first_layer: int
    layers: int
    weights_gib: float
    activation_gib: float
    kv_cache_gib: float
    num_blocks: int
    kv_bytes_per_token: int = Field(description="KV bytes per token on one GPU of this stage")


class Split(BaseModel):
    """How one replica is laid out over nodes."""

    model_config = ConfigDict(frozen=True)

    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1, description="GPUs each pod (node) requests: world size / nodes")
    tensor_parallel_size: int = Field(ge=1)
    pipeline_parallel_size: int = Field(ge=1)
    data_parallel_size: int = Field(1, ge=1, description="engines in one pod (pinned --data-parallel-size)")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    def describe(self) -> str:
        dp = f" × DP {self.data_parallel_size}" if self.data_parallel_size > 1 else ""
        return f"TP {self.tensor_parallel_size} × PP {self.pipeline_parallel_size}{dp}"


class MultiNodePlan(BaseModel):
    """A plan with its layout over nodes and the memory of every pipeline stage."""

    plan: Plan
    split: Split
    gpu: str
    max_nodes: int = Field(ge=1)
    stages: list[StageMemory]
    limiting_stage: int = Field(description="the stage with the fewest KV blocks: it caps every stage's KV cache")
    reasons: list[str] = Field(description="why this layout (before the single-node plan's reasons)")
    options: list[Option] = []
    layer_partition: list[int] | None = Field(
        None, description="VLLM_PP_LAYER_PARTITION for every rank (a remediation step moved layers); None: vLLM's split")

    def partition_env(self) -> str | None:
        """The value of VLLM_PP_LAYER_PARTITION the pods need, or None (vLLM's own split)."""
        return ",".join(map(str, self.layer_partition)) if self.layer_partition else None

    @property
    def fits(self) -> bool:
        return self.plan.fits

    @property
    def spans_nodes(self) -> bool:
        return self.split.nodes > 1

    def headline(self) -> str:
        verdict = "FITS" if self.fits else "DOES NOT FIT"
        s = self.split
        if s.nodes == 1:
            where = f"{s.world_size}× {self.gpu}" + (f" ({s.describe()})" if s.data_parallel_size > 1 else "")
        else:
            where = (f"{s.nodes} nodes × {s.gpus_per_node}× {self.gpu} ({s.describe()}, spans nodes: one "
                     f"LeaderWorkerSet group of {s.nodes} pods)")
        return f"{verdict}: {self.plan.model_id} on {where} with vLLM {self.plan.vllm_version}"


def nodes_for(world_size: int, gpus_per_node: int) -> int:
    """The fewest nodes vLLM can spread `world_size` ranks over: world % nnodes == 0 and world / nnodes ≤ GPUs."""
    n = max(math.ceil(world_size / gpus_per_node), 1)
    while world_size % n:
        n += 1
    return n


def stage_memory(arch: ModelArch, flags: EngineFlags, gpu: GPUFacts, profile: VersionProfile) -> list[StageMemory]:
    """Per-stage weights, activation peak and KV cache (the terms of `memory.predict_startup`, stage by stage)."""
    profile = profile_for_model(profile, arch)
    arch = arch_for_release(arch, profile)
    total = int(gpu.total_gib * 2**30)
    requested = math.ceil(total * flags.gpu_memory_utilization)
    pp = flags.pipeline_parallel_size
    weights = weights_bytes_per_gpu(arch, flags)
    non_torch = non_torch_bytes(flags, profile, nvlink=gpu.nvlink)
    stages: list[StageMemory] = []
    first = 0
    for stage, kinds in enumerate(_stage_kinds(arch, pp, flags.pp_layer_partition)):
        layout = _layout(arch, flags, profile, kinds, gpu.compute_capability)
        # the same per-stage terms as predict_startup: activation (+ the V1 PP receive buffer), persistent buffers
        # counted from 0.27 (allocator leftovers, MRV2 sampler state and PP receive buffer), CUDA-graph estimate
        terms = stage_terms(arch, flags, profile, stage, len(kinds), compute_capability=gpu.compute_capability)
        act = terms.activation
        avail = requested - weights[stage] - act - non_torch - terms.persistent
        if profile.cudagraph_subtracted:
            avail -= terms.cudagraph
        if profile.others_memory_counted:
            avail -= int(gpu.other_used_gib * 2**30)
        if flags.kv_cache_memory_bytes is not None:
            avail = flags.kv_cache_memory_bytes
        blocks = max(avail, 0) // layout.bytes_per_block
        stages.append(StageMemory(
            stage=stage, first_layer=first, layers=len(kinds), weights_gib=round(gib(weights[stage]), 2),
            activation_gib=round(gib(act), 2), kv_cache_gib=round(gib(max(avail, 0)), 2), num_blocks=int(blocks),
            kv_bytes_per_token=len(kinds) * layout.page_bytes // layout.block_size))
        first += len(kinds)
    return stages


def limiting_stage(stages: list[StageMemory]) -> int:
    """The stage whose KV blocks vLLM takes for every stage (the first of equals, as `min` picks it)."""
    return min(stages, key=lambda s: s.num_blocks).stage


def candidate_splits(arch: ModelArch, nodes: int, gpus_per_node: int, nvlink: bool) -> list[Split]:
    """The TP × PP layouts tried on `nodes` nodes, preferred first: TP = GPUs per node × PP = nodes (each node one
    stage), then for GPUs without NVLink TP 1 × PP = all GPUs (vLLM's advice for PCIe cards). Only layouts whose
    stages each get at least one layer."""
    splits = [Split(nodes=nodes, gpus_per_node=gpus_per_node, tensor_parallel_size=gpus_per_node,
                    pipeline_parallel_size=nodes)]
    if not nvlink and gpus_per_node > 1:
        splits.append(Split(nodes=nodes, gpus_per_node=gpus_per_node, tensor_parallel_size=1,
                            pipeline_parallel_size=nodes * gpus_per_node))
    return [s for s in splits if s.pipeline_parallel_size <= arch.num_layers]


def _flags_of(result: Plan, request: PlanRequest) -> EngineFlags:
    """The EngineFlags a plan resolved (rebuilt from its explicit flags: those are all we pass to vLLM)."""
    f = result.flags
    pinned = request.pinned
    return EngineFlags(
        tensor_parallel_size=int(f.get("tensor_parallel_size", 1)),
        pipeline_parallel_size=int(f.get("pipeline_parallel_size", 1)),
        gpu_memory_utilization=float(f["gpu_memory_utilization"]),
        max_model_len=int(f["max_model_len"]),
        max_num_seqs=int(f["max_num_seqs"]),
        max_num_batched_tokens=int(f.get("max_num_batched_tokens") or _default_batched(result, request)),
        kv_cache_dtype=str(f.get("kv_cache_dtype", "auto")),
        dtype=pinned.dtype or "auto",
        quantization=pinned.quantization,
        enforce_eager=bool(f.get("enforce_eager", False)),
        block_size=pinned.block_size or 16,
        cpu_offload_gb=pinned.cpu_offload_gb or 0.0,
        kv_cache_memory_bytes=pinned.kv_cache_memory_bytes,
        data_parallel_size=pinned.data_parallel_size or 1,
        enable_expert_parallel=bool(pinned.enable_expert_parallel),
        pp_layer_partition=layer_partition(request, int(f.get("pipeline_parallel_size", 1))),
    )


def _default_batched(result: Plan, request: PlanRequest) -> int:
    from .versions import batch_defaults

    profile = profile_for(request.vllm_version)
    return batch_defaults(profile, gpu_memory_gib=request.gpu.reported_gib, is_a100=request.gpu.is_a100,
                          max_model_len=int(result.flags["max_model_len"]),
                          chunked_prefill=request.pinned.enable_chunked_prefill is not False).max_num_batched_tokens


def _facts(request: PlanRequest, flags_tp: int, flags_pp: int = 1) -> GPUFacts:
    other = 0.0
    free = request.gpu_free_gib if request.gpu_free_gib is not None else request.constraints.gpu_free_gib
    if free is not None:
        own_init = init_nontorch_gib(int(flags_tp), request.gpu.nvlink, int(flags_pp))
        other = max(request.gpu.reported_gib - free - own_init, 0.0)
    return GPUFacts(total_gib=request.gpu.reported_gib, other_used_gib=other, uma=request.gpu.uma,
                    nvlink=request.gpu.nvlink, compute_capability=request.gpu.compute_capability)


def _with_split(request: PlanRequest, split: Split) -> PlanRequest:
    pins = request.pinned.model_copy(update={"tensor_parallel_size": split.tensor_parallel_size,
                                              "pipeline_parallel_size": split.pipeline_parallel_size})
    return request.model_copy(update={"pinned": pins, "gpu_count": split.world_size})


def _restore_user_pins(result: Plan, user: PinnedFlags, split: Split, why: str) -> Plan:
    """A plan made with the split pinned, told as the planner's choice (the user pinned only what they pinned)."""
    ours = {f"tensor-parallel-size {split.tensor_parallel_size} is pinned.",
            f"pipeline-parallel-size {split.pipeline_parallel_size} is pinned."}
    reasons = [r for r in result.reasons if r not in ours or user.tensor_parallel_size is not None]
    if user.tensor_parallel_size is None:
        reasons.insert(2, why)
    return result.model_copy(update={"pinned": list(user.to_vllm()), "reasons": reasons})


def _finish(request: PlanRequest, result: Plan, split: Split, max_nodes: int, reasons: list[str],
            options: list[Option]) -> MultiNodePlan:
    profile = profile_for(request.vllm_version)
    flags = _flags_of(result, request)
    stages = stage_memory(request.arch, flags, _facts(request, flags.tensor_parallel_size, flags.pipeline_parallel_size),
                          profile)
    limit = limiting_stage(stages)
    partition = list(flags.pp_layer_partition) if flags.pp_layer_partition else None
    if partition is not None:
        reasons = [*reasons, f"VLLM_PP_LAYER_PARTITION={','.join(map(str, partition))} on every rank (vLLM's own split "
                             f"is {','.join(map(str, pp_layer_counts(request.arch.num_layers, len(partition))))}): a "
                             "remediation step moved layers off a pipeline stage that ran out of memory."]
    if split.pipeline_parallel_size > 1:
        s = stages[limit]
        layers = ", ".join(str(st.layers) for st in stages)
        reasons = [*reasons,
                   f"Pipeline stages hold {layers} layers (vLLM's get_pp_indices: the first stage also holds the "
                   f"embedding, the last the lm_head and sampler); stage {limit} (layers {s.first_layer}–"
                   f"{s.first_layer + s.layers - 1}) has the least KV memory ({s.kv_cache_gib:.2f} GiB per GPU) and "
                   "caps the KV cache of every stage (vLLM takes the minimum of the workers' blocks)."]
    return MultiNodePlan(plan=result, split=split, gpu=request.gpu.name, max_nodes=max_nodes, stages=stages,
                         limiting_stage=limit, reasons=reasons, options=options, layer_partition=partition)


def _option(result: Plan, split: Split, summary: str) -> Option:
    return Option(summary=summary, kind="nodes", flags=result.flags, gpu=result.gpu, gpu_count=split.world_size,
                  kv_cache_tokens=result.prediction.kv_cache_tokens, max_model_len=int(result.flags["max_model_len"]),
                  max_concurrency=result.prediction.max_concurrency)


class _NodeSearch:
    """Whether some split fits on n nodes, each node count planned at most once and without options (a layout
    search asks only whether each layout fits; the options of one plan cost dozens of plans)."""

    def __init__(self, request: PlanRequest, gpus_per_node: int) -> None:
        self.request, self.gpus_per_node = request, gpus_per_node
        self.found: dict[int, tuple[Split, Plan] | None] = {}
        self.tried: dict[int, list[str]] = {}

    def fits(self, nodes: int) -> tuple[Split, Plan] | None:
        if nodes not in self.found:
            self.found[nodes], self.tried[nodes] = None, []
            for split in candidate_splits(self.request.arch, nodes, self.gpus_per_node, self.request.gpu.nvlink):
                result = plan(_with_split(self.request, split), options=False)
                if result.fits:
                    self.found[nodes] = (split, result)
                    break
                self.tried[nodes].append(f"{split.describe()} on {nodes} nodes")
        return self.found[nodes]

    def fewest(self, low: int, high: int) -> tuple[int, Split, Plan] | None:
        """The fewest nodes in [low, high] on which a split fits: a binary search (more nodes never hold less: each
        stage gets fewer layers), so 64 allowed nodes cost at most 7 node counts, not 63.

        Within the spec's work budget (planner/budget.py): once it is spent the search stops at the fewest nodes
        found to fit so far (`high` always fits in the loop), or finds none."""
        high = min(high, self.request.arch.num_layers)  # beyond: more stages than layers, no split at all
        if low > high or budget.out_of_budget() or self.fits(high) is None:
            return None
        while low < high:
            if budget.out_of_budget():
                break
            middle = (low + high) // 2
            if self.fits(middle) is not None:
                high = middle
            else:
                low = middle + 1
        split, result = self.fits(high)  # type: ignore[misc]  # fits(high) holds by the loop's invariant
        return high, split, result

    def tried_before(self, nodes: int | None = None) -> list[str]:
        return [text for n in sorted(self.tried) if nodes is None or n < nodes for text in self.tried[n]]


def spanning_option(request: PlanRequest, gpus_per_node: int, after: int) -> Option | None:
    """The fewest nodes beyond `after` (up to MAX_OPTION_NODES) on which some split fits."""
    with budget.phase("options"):
        found = _NodeSearch(request, gpus_per_node).fewest(after + 1, max(MAX_OPTION_NODES, after))
    if found is None:
        return None
    nodes, split, result = found
    return _option(result, split, f"Span {nodes} nodes of {gpus_per_node}× {request.gpu.name} "
                                  f"({split.describe()}; spec.gpu.maxNodes / --nodes {nodes})")


def plan_across_nodes(request: PlanRequest, *, gpus_per_node: int, max_nodes: int = 1) -> MultiNodePlan:
    """Plan one replica on up to `max_nodes` identical nodes of `gpus_per_node` GPUs each.

    Pinned TP × PP decides the node count (the fewest nodes vLLM can spread the ranks over). Otherwise one node is
    planned first; only when it does not fit and `max_nodes` > 1 are 2, 3, … nodes tried, preferred split first.
    """
    pinned = request.pinned
    if (pinned.data_parallel_size or 1) > 1:
        return _data_parallel_on_one_node(request, gpus_per_node, max_nodes)
    if pinned.tensor_parallel_size is not None:
        world = pinned.tensor_parallel_size * (pinned.pipeline_parallel_size or 1)
        nodes = nodes_for(world, gpus_per_node)
        split = Split(nodes=nodes, gpus_per_node=world // nodes, tensor_parallel_size=pinned.tensor_parallel_size,
                      pipeline_parallel_size=pinned.pipeline_parallel_size or 1)
        result = plan(request.model_copy(update={"gpu_count": world}))
        reasons: list[str] = []
        if nodes > 1:
            reasons.append(f"Pinned {split.describe()} is {world} GPUs: more than one node's {gpus_per_node}, so "
                           f"it spans {nodes} nodes of {split.gpus_per_node} GPUs (vLLM needs world size % nnodes "
                           "== 0).")
        if nodes > max_nodes:
            message = (f"{split.describe()} needs {nodes} nodes of {split.gpus_per_node}× {request.gpu.name}; "
                       f"only {max_nodes} node(s) allowed (spec.gpu.maxNodes / --nodes). One pod cannot hold "
                       f"{world} GPUs.")
            failure = PredictedFailure(kind=FailureKind.INVALID_PARALLELISM, message=message)
            result = result.model_copy(update={"fits": False, "failure": failure,
                                               "reasons": [*result.reasons, "Does not fit: " + message]})
            options = list(result.options)
            if result.prediction.failure is None:
                options.insert(0, _option(result, split, f"Span {nodes} nodes of {split.gpus_per_node}× "
                                                         f"{request.gpu.name} (spec.gpu.maxNodes / --nodes {nodes})"))
            result = result.model_copy(update={"options": options})
        return _finish(request, result, split, max_nodes, reasons, list(result.options))

    least = max(request.constraints.min_nodes or 1, 1)
    single = plan(request.model_copy(update={"gpu_count": gpus_per_node}))
    single_split = Split(nodes=1, gpus_per_node=single.gpu_count, tensor_parallel_size=int(
        single.flags.get("tensor_parallel_size", 1)), pipeline_parallel_size=int(
        single.flags.get("pipeline_parallel_size", 1)))
    if single.fits and not 1 < least <= max_nodes:
        return _finish(request, single, single_split, max_nodes, [], [])
    # a remediation step that asked for more nodes (constraints.min_nodes) starts there: fewer failed
    why_more = (f"an earlier start on fewer nodes ran out of memory (a remediation step asked for at least {least})"
                if single.fits else f"one node's {gpus_per_node} GPU(s) do not fit "
                f"({single.failure.kind if single.failure else 'workload'})")
    search = _NodeSearch(request, gpus_per_node)
    with budget.phase("nodes"):
        found = search.fewest(max(2, least if least <= max_nodes else 2), max_nodes)
    if found is not None:
        nodes, split, _ = found
        tried = search.tried_before(nodes)
        result = plan(_with_split(request, split))  # the chosen layout, with everything a plan says
        why = (f"{split.describe()} over {nodes} nodes of {gpus_per_node}× {request.gpu.name}: {why_more}"
               + (f"; tried {', '.join(tried)}" if tried else "")
               + ("; each node is one pipeline stage, TP stays inside the node"
                  + ("'s NVLink" if request.gpu.nvlink else "")
                  if split.tensor_parallel_size == gpus_per_node else
                  "; TP 1 × PP because these GPUs have no NVLink (vLLM's advice for PCIe cards)") + ".")
        result = _restore_user_pins(result, pinned, split, why)
        return _finish(request, result, split, max_nodes, [], [])
    tried = search.tried_before()
    options = list(single.options)
    spanning = spanning_option(request, gpus_per_node, max_nodes)
    if spanning is not None:  # after every single-node option (issue 23): rank_options keeps it there
        options = rank_options([*options, spanning])
    single = single.model_copy(update={"options": options})
    reasons = [f"Tried spanning nodes: {', '.join(tried)}; none fits."] if tried else []
    return _finish(request, single, single_split, max_nodes, reasons, options)


def _data_parallel_on_one_node(request: PlanRequest, gpus_per_node: int, max_nodes: int) -> MultiNodePlan:
    """A pinned --data-parallel-size is planned on one node: DP × TP × PP GPUs in one pod. Spreading DP ranks over
    nodes needs vLLM's DP launch flags (--data-parallel-size-local/-address/-rpc-port/-start-rank, or --nnodes
    inferring them from 0.33), whose meaning changed between releases; the operator does not render them."""
    result = plan(request.model_copy(update={"gpu_count": gpus_per_node}))
    flags = result.flags
    tp, pp = int(flags.get("tensor_parallel_size", 1)), int(flags.get("pipeline_parallel_size", 1))
    dp = int(request.pinned.data_parallel_size or 1)
    world = tp * pp * dp
    split = Split(nodes=1, gpus_per_node=world, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                  data_parallel_size=dp)
    if world > gpus_per_node:
        message = (f"data-parallel-size {dp} × TP {tp} × PP {pp} = {world} GPUs; one node has {gpus_per_node}. "
                   "Data parallelism is planned inside one pod (one node) only: lower data-parallel-size, or drop it "
                   "and use spec.replicas for more engines.")
        failure = PredictedFailure(kind=FailureKind.INVALID_PARALLELISM, message=message)
        result = result.model_copy(update={"fits": False, "usable": False, "failure": failure,
                                           "reasons": [*result.reasons, "Does not fit: " + message]})
    reasons = ([f"data-parallel-size {dp} is pinned: planned on one node ({max_nodes} allowed); DP ranks are not "
                "spread over nodes."] if max_nodes > 1 else [])
    return _finish(request, result, split, max_nodes, reasons, list(result.options))


def render_multinode_text(result: MultiNodePlan) -> str:
    """The plan as `vllm-operator plan` prints it: the single-node report with a node-aware headline and stages."""
    from .report import render_plan_text

    lines = render_plan_text(result.plan.model_copy(update={"options": result.options})).split("\n")
    lines[0] = result.headline()
    dp = result.split.data_parallel_size
    if dp > 1:  # every engine has its own KV cache: say whose figure it is
        tokens = result.plan.prediction.kv_cache_tokens
        lines = [f"KV cache per engine ({dp} engines: {dp * tokens:,} tokens in the pod): " + line[len("KV cache: "):]
                 if line.startswith("KV cache: ") else line for line in lines]
    extra: list[str] = []
    if result.split.pipeline_parallel_size > 1:
        extra = ["", "Per pipeline stage (one GPU each; the limiting stage caps every stage's KV cache):"]
        for s in result.stages:
            mark = "  ← limits KV" if s.stage == result.limiting_stage else ""
            extra.append(f"  stage {s.stage}: layers {s.first_layer}–{s.first_layer + s.layers - 1} "
                         f"({s.layers}), weights {s.weights_gib:.2f} GiB, activation {s.activation_gib:.2f} GiB, "
                         f"KV {s.kv_cache_gib:.2f} GiB = {s.num_blocks:,} blocks{mark}")
    if result.reasons:
        extra += ["", "Across nodes:"] + [f"  - {r}" for r in result.reasons]
    at = next((i for i, line in enumerate(lines) if line.startswith("vllm serve ")), len(lines))
    return "\n".join(lines[:at] + extra[1:] + [""] + lines[at:]) if extra else "\n".join(lines)


def multinode_document(result: MultiNodePlan) -> dict[str, object]:
    """The node layout and per-stage memory for `plan -o json|yaml` (merged over the single-node document)."""
    s = result.split
    return {
        "headline": result.headline(),
        "nodes": s.nodes,
        "gpus_per_node": s.gpus_per_node,
        "max_nodes": result.max_nodes,
        "spans_nodes": result.spans_nodes,
        "tensor_parallel_size": s.tensor_parallel_size,
        "pipeline_parallel_size": s.pipeline_parallel_size,
        "data_parallel_size": s.data_parallel_size,
        "stages": [stage.model_dump() for stage in result.stages],
        "limiting_stage": result.limiting_stage,
        "node_reasons": result.reasons,
        "options": [option.model_dump() for option in result.options],
    }
