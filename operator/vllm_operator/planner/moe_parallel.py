"""What `--data-parallel-size` and `--enable-expert-parallel` do to a plan, in words (the memory is in memory.py).

Both flags are opt-in: the planner plans them when they are pinned and never turns them on by itself (README,
"MoE parallelism: expert and data parallelism", says why and when memory arithmetic alone would favour them).
vLLM's layout (vllm/model_executor/layers/fused_moe/config.py::FusedMoEParallelConfig.make, expert_map_manager.py::
determine_expert_map): DP engines each run TP × PP GPUs with their own scheduler and KV cache; attention, dense MLPs,
shared experts and routers are split over TP inside every engine (replicated across DP ranks); the MoE layers run
over all TP × DP ranks — each expert split TP × DP ways, or with expert parallelism (EP size = TP × DP) whole
experts per rank, E // EP each and one more on the first E % EP ranks. Pure: no I/O.
"""

from __future__ import annotations

from .arch import ModelArch, gib
from .memory import (
    EngineFlags,
    experts_per_rank,
    moe_group_size,
    moe_rows,
    moe_workspace_bytes,
    weights_bytes_per_gpu,
)
from .versions import Version


def moe_parallel_reasons(arch: ModelArch, flags: EngineFlags, version: Version) -> list[str]:
    """The explanation lines for a plan with DP and/or EP pinned (empty without them)."""
    out: list[str] = []
    dp = flags.data_parallel_size
    if dp > 1:
        out.append(_dp_reason(arch, flags))
    if flags.enable_expert_parallel:
        out.append(_ep_reason(arch, flags))
    if (dp > 1 or flags.enable_expert_parallel) and moe_workspace_bytes(arch, flags, version):
        out.append(_workspace_reason(arch, flags, version))
    return out


def _workspace_reason(arch: ModelArch, flags: EngineFlags, version: Version) -> str:
    rows = moe_rows(flags, version)
    whole = flags.enable_expert_parallel
    width = arch.moe_intermediate_size if whole else arch.moe_intermediate_size / moe_group_size(flags)
    gathered = (f" (the {flags.data_parallel_size} engines' {flags.max_num_batched_tokens} batched tokens "
                "gathered before the experts)" if flags.data_parallel_size > 1 else "")
    return (f"MoE workspace {gib(moe_workspace_bytes(arch, flags, version)):.2f} GiB in the activation figure: "
            f"{rows} rows{gathered} × top-{arch.experts_per_token} × the "
            f"{'whole expert' if whole else 'per-rank slice'} ({width:g} wide), as vLLM's Triton experts size it. "
            "ESTIMATE for the other expert kernels (DeepGEMM, CUTLASS, FlashInfer) and the all-to-all backends "
            "(DeepEP, pplx), whose buffers are not modelled; a smaller --max-num-batched-tokens shrinks it.")


def _dp_reason(arch: ModelArch, flags: EngineFlags) -> str:
    dp, tp, pp = flags.data_parallel_size, flags.tensor_parallel_size, flags.pipeline_parallel_size
    text = (f"data-parallel-size {dp} is pinned: {dp} engines of TP {tp} × PP {pp} in one pod ({dp * tp * pp} GPUs); "
            "every engine has its own scheduler and KV cache, so the KV figures here are per engine "
            f"({dp}× that in the pod) and one request uses one engine's cache.")
    if not arch.is_moe:
        return text + (" For a dense model the engines are independent replicas: spec.replicas gives the same in "
                       "separate pods, which schedule more easily.")
    if flags.enable_expert_parallel:
        return text + f" The MoE layers run over all {tp * dp} ranks (expert parallelism, below)."
    return text + (f" Attention and dense weights are split {tp} ways in each engine (replicated {dp}×); each routed "
                   f"expert is split over all {tp * dp} ranks, as vLLM flattens DP into the MoE layers' TP group.")


def _ep_reason(arch: ModelArch, flags: EngineFlags) -> str:
    group = moe_group_size(flags)
    if not arch.is_moe:
        return "enable-expert-parallel is pinned and has no effect: the model has no MoE layers."
    if group == 1:
        return "enable-expert-parallel is pinned and has no effect at TP × DP = 1 (one rank holds every expert)."
    held = experts_per_rank(arch, flags)
    split = flags.model_copy(update={"enable_expert_parallel": False})
    with_ep, without = max(weights_bytes_per_gpu(arch, flags)), max(weights_bytes_per_gpu(arch, split))
    text = (f"enable-expert-parallel is pinned: EP size = TP × DP = {group}; each rank holds {held} of the "
            f"{arch.num_experts} routed experts of every MoE layer ({len(arch.moe_layers)} layers) whole instead of a "
            f"1/{group} slice of each: {gib(with_ep):.2f} GiB of weights on the busiest GPU vs {gib(without):.2f} GiB "
            "with every expert split.")
    remainder = arch.num_experts % group
    if remainder:
        text += (f" {arch.num_experts} experts do not divide by {group}: ranks 0–{remainder - 1} hold {held}, the "
                 f"others {held - 1} (vLLM's determine_expert_map); the busiest rank sizes the plan.")
    else:
        text += f" {arch.num_experts} experts divide by {group}: the same expert bytes per GPU as splitting them."
    return text
