"""Choose vLLM flags for a model on a GPU, and explain every choice.

`plan(request)` keeps every pinned flag exactly, fills the rest (tensor-parallel size, utilization, max-model-len,
max-num-seqs; fp8 KV or enforce-eager only when they decide between fitting and not), predicts vLLM's startup
with `memory.predict_startup`, and, when nothing fits, lists concrete options that would, each with its figures.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Iterator
from importlib import resources
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from ..api.flags import vllm_cli_flag, vllm_cli_negation
from ..api.v1alpha1 import MAX_MODEL_LEN_AUTO, LoRASpec, MemoryBreakdown, PinnedFlags
from . import budget
from .arch import ArchError, ModelArch, checkpoint_bytes, dtype_bytes
from .failures import FailureKind
from .gpus import GPUSpec, safe_utilization
from .lora import (
    DEFAULT_MAX_LORA_RANK,
    MOE_EXPERTS_SINCE,
    LoRAEstimate,
    LoRASlots,
    LoRASupport,
    VocabCheck,
    adapter_bytes_per_stage,
    lora_support,
    lora_wraps_experts,
    refusal_message,
    vocab_check,
)
from .memory import (
    EngineFlags,
    GPUFacts,
    PredictedFailure,
    StartupPrediction,
    arch_for_release,
    cudagraph_bytes,
    headroom_buffers_bytes,
    init_nontorch_gib,
    outside_budget_gib,
    pp_layer_counts,
    pp_partition,
    predict_startup,
    profile_for_model,
    shard_failure,
    speculative_memory,
)
from .moe_parallel import moe_parallel_reasons
from .speculative import Speculation, parse_speculative_config
from .versions import VersionProfile, batch_defaults, profile_for

_TP_CHOICES = (1, 2, 4, 8, 16)
_FP8_KV_GPUS_MIN_CC = 8.9
_MARGIN_GIB = 0.25          # slack kept below what other tenants leave free
_MIN_USEFUL_LEN = 1024
_ESTIMATE_MARGIN = 0.10       # of the predicted non-weight figures, kept free when max-model-len is fitted
_REFIT_PASSES = 3           # max-model-len re-fitted after max-num-seqs is sized: a bounded fixed point
#: The default workload (README, "What a good plan is"): a plan is *usable* when it offers this context (or the
#: model's maximum if shorter), admits this many concurrent requests and keeps CUDA graphs.
DEFAULT_CONTEXT_CAP = 8192
DEFAULT_CONCURRENCY = 4
_UNPINNABLE = ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "max_num_seqs",
               "max_num_batched_tokens", "kv_cache_dtype", "enforce_eager", "block_size")


class Workload(BaseModel):
    """The traffic the user expects (optional)."""

    model_config = ConfigDict(frozen=True)

    context_length: int | None = Field(None, ge=1, description="typical p99 prompt+output tokens")
    concurrency: int | None = Field(None, ge=1, description="peak concurrent requests")
    prefix_caching: bool | None = None
    typical_request_tokens: int | None = Field(None, ge=1, description="soft: the length max-num-seqs is sized for")


class Constraints(BaseModel):
    """What the remediation ladder has learned about this service; the planner treats them as hard limits."""

    model_config = ConfigDict(frozen=True)

    max_utilization: float | None = Field(None, gt=0, le=1)
    min_utilization: float | None = Field(None, gt=0, le=1)
    gpu_free_gib: float | None = Field(None, ge=0, description="free memory per GPU a failed start reported")
    host_memory_gib: float | None = Field(None, gt=0, description="container memory limit (rendering, not vLLM)")
    max_model_len: int | None = Field(None, ge=1)
    min_model_len: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    min_tensor_parallel_size: int | None = Field(None, ge=1)
    extra_activation_gib: float = Field(0.0, ge=0, description="activation seen above our model")
    force_enforce_eager: bool = False
    force_fp8_kv: bool = False
    # multi-node, stage-specific steps (remediation/policy.py): layers moved off a failing pipeline stage, and nodes
    pp_layer_partition: str | None = Field(None, max_length=256, pattern=r"^[0-9]+(,[0-9]+)*$",
                                           description="VLLM_PP_LAYER_PARTITION, e.g. '64,62'; ignored when it does "
                                                       "not match the plan's pipeline stages and layers")
    min_nodes: int | None = Field(None, ge=1, le=64, description="plan a replica over at least this many nodes")


class PlanRequest(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    arch: ModelArch
    gpu: GPUSpec
    gpu_count: int = Field(1, ge=1, description="GPUs one replica may use (TP x PP at most this)")
    pinned: PinnedFlags = PinnedFlags()
    lora: LoRASpec | None = Field(None, description="spec.lora: the adapters vLLM serves (pinned like a flag)")
    workload: Workload = Workload()
    constraints: Constraints = Constraints()
    vllm_version: str | None = None
    gpu_free_gib: float | None = Field(None, ge=0, description="free memory per GPU when vLLM starts, if others hold some")
    version_note: str = Field("", description="why this vLLM release was assumed (a digest, mirror tag or latest)")
    speculation: Speculation | None = Field(
        None, description="the pinned speculative config as the planner reads it (with the draft's architecture when "
                          "its config.json was read); None: read from pinned.speculative_config")
    load_format: str = Field("auto", description="`--load-format`: 'ipc_cache' maps weights a weight-cache daemon "
                                                 "holds on the GPU (vLLM 0.32+ takes them out of its budget)")
    vllm_defaults: frozenset[str] = Field(
        frozenset(), description="the pinned flags with_vllm_defaults filled in with vLLM's own default (a command "
                                 "that did not set them): the reasons say \"vLLM's default\", not \"pinned\"")


class InvalidParallelism(ValueError):
    """A pinned parallel layout vLLM cannot run; the message says why and what to pin instead."""


def check_parallelism(arch: ModelArch, pipeline_parallel_size: int | None) -> None:
    """Refuse more pipeline stages than decoder layers. vLLM has no check of its own: get_pp_indices
    (vllm/distributed/utils.py) gives each stage layers // pp = 0 layers and the remainder one each to the stages
    before the last, so the others hold no layer and no KV cache, and no plan can size them."""
    pp = pipeline_parallel_size or 1
    if pp > arch.num_layers:
        empty = pp_layer_counts(arch.num_layers, pp).count(0)
        raise InvalidParallelism(
            f"--pipeline-parallel-size {pp} for the {arch.num_layers} decoder layers of {arch.model_id}: vLLM's "
            f"get_pp_indices would leave {empty} stages without a layer; each stage needs at least one, so use at "
            f"most {arch.num_layers}")


def request_speculation(request: PlanRequest) -> Speculation | None:
    """The request's speculative decoding as the planner reads it: `request.speculation` when the caller built it
    (reconcile and the CLI, with the draft's config.json when they could read it), else the pinned
    spec.flags.speculativeConfig parsed as vLLM would read the flag (the draft then booked by estimate)."""
    if request.speculation is not None:
        return request.speculation
    pinned = request.pinned.speculative_config
    return None if pinned is None else parse_speculative_config(pinned.to_vllm())


class Option(BaseModel):
    """An alternative that would fit, with its figures."""

    summary: str
    kind: str = Field("gpus", description="gpus | flags | context | quantized-checkpoint | larger-gpu | pool | nodes")
    changes: list[str] = Field(default_factory=list,
                               description="what the option changes beyond the GPUs (KV dtype, quantization, eager)")
    source: str = Field("catalog", description="where the GPUs come from: 'catalog' (CLI) or 'cluster' (node pools)")
    flags: dict[str, Any]
    gpu: str
    gpu_count: int
    kv_cache_tokens: int
    max_model_len: int
    max_concurrency: float


class Plan(BaseModel):
    model_id: str
    gpu: str
    gpu_count: int
    gpu_count_allowed: int = 1
    vllm_version: str
    fits: bool
    usable: bool = Field(True, description="fits and meets the default (or stated) workload with CUDA graphs")
    kv_fraction: float | None = Field(None, description="planned KV cache memory / the physical limit: what vLLM "
                                      "could use at the GPU's highest safe utilization minus weights, activation "
                                      "and overhead (same flags)")
    flags: dict[str, Any] = Field(description="vLLM flags, snake_case, the ones we pass explicitly")
    pinned: list[str]
    prediction: StartupPrediction
    failure: PredictedFailure | None
    reasons: list[str]
    options: list[Option] = []
    lora_bytes: int = Field(0, description="bytes per GPU vLLM reserves for LoRA adapter slots (in the weights; "
                                           "0: LoRA off), on the stage that holds the most")

    @property
    def memory(self) -> MemoryBreakdown:
        return self.prediction.memory

    max_model_len_auto: bool = Field(False, description="max-model-len is rendered as `auto` (pinned so, or chosen by "
                                                          "the planner where it is the same plan and the safer one): "
                                                          "vLLM fits it at startup (flags.max_model_len is the length "
                                                          "it is predicted to pick)")

    def rendered_flags(self) -> dict[str, Any]:
        """The flags as they reach vLLM: `flags`, with `auto` where max-model-len is pinned to it."""
        if not self.max_model_len_auto:
            return self.flags
        return {**self.flags, "max_model_len": MAX_MODEL_LEN_AUTO}

    def args(self) -> list[str]:
        """The flags as vLLM command-line arguments."""
        return flags_to_args(self.rendered_flags())


def flags_to_args(flags: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for name, value in flags.items():
        flag = vllm_cli_flag(name)
        if isinstance(value, bool):
            if value:
                args.append(flag)
            elif name in ("enable_prefix_caching", "enable_chunked_prefill"):
                args.append(vllm_cli_negation(name))
        elif isinstance(value, (list, tuple)):  # nargs='+' options (--lora-modules name=source ...)
            args.extend([flag, *map(str, value)] if value else [])
        elif value is not None:
            args.extend([flag, str(value)])
    return args


def _free_gib(request: PlanRequest) -> float | None:
    """Free memory per GPU at startup: what the user said, else what a failed start reported."""
    if request.gpu_free_gib is not None:
        return request.gpu_free_gib
    return request.constraints.gpu_free_gib


def _facts(request: PlanRequest, tp: int, pp: int = 1) -> GPUFacts:
    total = request.gpu.reported_gib
    other = 0.0
    free = _free_gib(request)
    if free is not None:
        own_init = init_nontorch_gib(tp, request.gpu.nvlink, pp)
        other = max(total - free - own_init, 0.0)
    return GPUFacts(total_gib=total, other_used_gib=other, uma=request.gpu.uma, nvlink=request.gpu.nvlink,
                    compute_capability=request.gpu.compute_capability)


def _valid_tp(arch: ModelArch, tp: int, *, expert_parallel: bool = False) -> bool:
    """A TP size every layer's shard check accepts: with --enable-expert-parallel the routed experts are held whole
    (no check on their intermediate size), otherwise each is split over the TP ranks (memory.moe_parallelism_failure
    then checks TP × DP)."""
    if shard_failure(arch, tp) is not None:
        return False
    return expert_parallel or arch.moe_intermediate_size % tp == 0


class _Candidate:
    """One assignment of the free flags, with its prediction."""

    def __init__(self, flags: EngineFlags, prediction: StartupPrediction, notes: list[str]) -> None:
        self.flags = flags
        self.prediction = prediction
        self.notes = notes


def _beside_budget_gib(request: PlanRequest, resolved: VersionProfile, arch: ModelArch, tp: int, pp: int,
                       eager: bool) -> tuple[float, float]:
    """What the model's runner puts in the 1 - util headroom beside the budget at vLLM's default batch sizes (an upper
    bound: the plan admits no more sequences than the defaults): CUDA graphs where their estimate is not subtracted
    (before 0.21; Model Runner V2 before 0.29), and MRV2's sampler state / PP receive buffer before 0.27."""
    gpu = request.gpu
    defaults = batch_defaults(resolved, gpu_memory_gib=gpu.reported_gib, is_a100=gpu.is_a100,
                              max_model_len=arch.derived_max_model_len, compute_capability=gpu.compute_capability)
    probe = EngineFlags(tensor_parallel_size=tp, pipeline_parallel_size=pp, max_model_len=1,
                        max_num_seqs=request.pinned.max_num_seqs or defaults.max_num_seqs,
                        max_num_batched_tokens=request.pinned.max_num_batched_tokens or defaults.max_num_batched_tokens,
                        enforce_eager=eager)
    graphs = 0.0
    if not resolved.cudagraph_subtracted and not eager:
        graphs = cudagraph_bytes(arch, probe, resolved, max(pp_layer_counts(arch.num_layers, max(pp, 1))),
                                 compute_capability=gpu.compute_capability) / 2**30
    return graphs, headroom_buffers_bytes(arch, probe, resolved) / 2**30


def _utilization(request: PlanRequest, profile: VersionProfile, tp: int, arch: ModelArch,
                 eager: bool, reasons: list[str], pp: int = 1) -> float:
    pinned = request.pinned.gpu_memory_utilization
    if pinned is not None:
        reasons.append(f"gpu-memory-utilization {pinned} {_pinned_or_default(request, 'gpu_memory_utilization')}.")
        return pinned
    gpu = request.gpu
    total = gpu.reported_gib
    resolved = profile_for_model(profile, arch)
    init = outside_budget_gib(tp, pp, gpu.nvlink, resolved)
    util, basis = safe_utilization(gpu, init)
    why = f"gpu-memory-utilization {util:.2f}: {basis}"
    if pp > 1:  # memory.pp_comm_gib: NCCL's buffers have no figure in vLLM's source
        comm = init - outside_budget_gib(tp, 1, gpu.nvlink, resolved)
        why += f" ({comm:.2f} GiB of the {init:.2f} GiB are the pipeline-parallel NCCL communicators, an estimate)"
    graphs, buffers = _beside_budget_gib(request, resolved, arch, tp, pp, eager)
    if graphs or buffers:
        cap = int((1 - (init + graphs + buffers + _MARGIN_GIB) / total) * 100) / 100
        if util > cap:
            util = cap
            what = f"CUDA graphs ({graphs:.2f} GiB)" if graphs else ""
            if buffers:
                what += (" and " if what else "") + f"Model Runner V2's sampler/pipeline buffers ({buffers:.2f} GiB)"
            why += (f", lowered to {cap:.2f} so that vLLM {profile.version}'s {what} and the "
                    f"CUDA context/NCCL ({init:.2f} GiB) fit beside the budget")
    floor = request.constraints.min_utilization
    if floor is not None and util < floor:
        util = floor
        why += f", raised to {floor:.2f} because an earlier start had too little memory for the KV cache"
    free = _free_gib(request)
    if free is not None:
        cap = (free - _MARGIN_GIB) / total
        if util > cap:
            util = cap
            why += (f", lowered to {cap:.2f} because only {free:.2f} GiB of {total:.2f} GiB is free "
                    "(other processes hold the rest) and vLLM refuses to start when free < total × utilization")
    limit = request.constraints.max_utilization
    if limit is not None and util > limit:
        util = limit
        why += f", capped at {limit:.2f} by what an earlier failure showed"
    util = max(int(util * 100) / 100, 0.05)
    reasons.append(why + ".")
    return util


def lora_flags(request: PlanRequest) -> dict[str, Any]:
    """The vLLM flags spec.lora asks for (--enable-lora, --max-loras, --max-lora-rank, --lora-modules), snake_case;
    empty without spec.lora. They are pinned like spec.flags: the plan keeps them and accounts for their memory."""
    return request.lora.to_vllm(request.pinned.max_lora_rank) if request.lora else {}


def pinned_flags(request: PlanRequest) -> dict[str, Any]:
    """Every flag the user fixed: spec.flags, then what spec.lora adds."""
    pinned = request.pinned.to_vllm()
    return {**pinned, **{k: v for k, v in lora_flags(request).items() if k not in pinned}}


def _build_flags(request: PlanRequest, profile: VersionProfile, tp: int, pp: int, util: float, kv_dtype: str,
                 eager: bool, max_model_len: int, max_num_seqs: int | None) -> EngineFlags:
    pinned = request.pinned
    lora = lora_flags(request)
    defaults = batch_defaults(profile, gpu_memory_gib=request.gpu.reported_gib, is_a100=request.gpu.is_a100,
                              compute_capability=request.gpu.compute_capability,
                              max_model_len=max_model_len,
                              chunked_prefill=pinned.enable_chunked_prefill is not False)
    seqs = pinned.max_num_seqs or max_num_seqs or defaults.max_num_seqs
    speculation = request_speculation(request)
    if speculation is not None and not (pinned.max_num_seqs or max_num_seqs):
        # each sequence verifies k + 1 tokens: start from as many sampler rows as vLLM's default gives without it
        seqs = max(1, seqs // (speculation.tokens(request.arch) + 1))
    tokens = pinned.max_num_batched_tokens or defaults.max_num_batched_tokens
    if request.constraints.max_num_batched_tokens and not pinned.max_num_batched_tokens:
        tokens = min(tokens, request.constraints.max_num_batched_tokens)
    if request.constraints.max_num_seqs and not pinned.max_num_seqs:
        seqs = min(seqs, request.constraints.max_num_seqs)
    return EngineFlags(
        pp_layer_partition=layer_partition(request, pp),
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        gpu_memory_utilization=util,
        max_model_len=max_model_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        kv_cache_dtype=kv_dtype,
        dtype=pinned.dtype or "auto",
        quantization=pinned.quantization,
        enforce_eager=eager,
        block_size=pinned.block_size or 16,
        cpu_offload_gb=pinned.cpu_offload_gb or 0.0,
        kv_cache_memory_bytes=pinned.kv_cache_memory_bytes,
        enable_prefix_caching=pinned.enable_prefix_caching,
        enable_chunked_prefill=pinned.enable_chunked_prefill,
        max_loras=lora.get("max_loras", 1) if lora or pinned.enable_lora else 0,
        max_lora_rank=lora.get("max_lora_rank") or pinned.max_lora_rank or DEFAULT_MAX_LORA_RANK,
        lora_moe_experts=lora_wraps_experts(profile.version),
        speculative=speculation,
        data_parallel_size=pinned.data_parallel_size or 1,
        enable_expert_parallel=bool(pinned.enable_expert_parallel),
        load_format=request.load_format,
    )


def layer_partition(request: PlanRequest, pp: int) -> tuple[int, ...] | None:
    """The learned VLLM_PP_LAYER_PARTITION when it fits this layout (pp stages, the model's layers), else None."""
    wanted = request.constraints.pp_layer_partition
    if wanted is None or pp < 2:
        return None
    try:
        return tuple(pp_partition(request.arch.num_layers, pp, wanted))
    except ValueError:
        return None


def _predict(request: PlanRequest, profile: VersionProfile, flags: EngineFlags) -> StartupPrediction:
    arch = request.arch
    extra = request.constraints.extra_activation_gib
    budget.charge()
    prediction = predict_startup(arch, flags, _facts(request, flags.tensor_parallel_size,
                                                     flags.pipeline_parallel_size), profile)
    if extra:
        # an observed activation above our model: take it out of the KV budget
        memory = prediction.memory.model_copy(update={
            "activation_gib": round(prediction.memory.activation_gib + extra, 2),
            "kv_cache_gib": round(max(prediction.memory.kv_cache_gib - extra, 0), 2)})
        scale = memory.kv_cache_gib / prediction.memory.kv_cache_gib if prediction.memory.kv_cache_gib else 0.0
        prediction = prediction.model_copy(update={
            "memory": memory,
            "num_blocks": int(prediction.num_blocks * scale),
            "kv_cache_tokens": int(prediction.kv_cache_tokens * scale),
            "max_concurrency": round(prediction.max_concurrency * scale, 2),
            "estimated_max_model_len": int(prediction.estimated_max_model_len * scale)})
    return prediction


def _length_target(request: PlanRequest) -> int:
    arch = request.arch
    target = arch.derived_max_model_len
    if request.constraints.max_model_len:
        target = min(target, request.constraints.max_model_len)
    return target


def _round_len(length: int) -> int:
    if length >= 2048:
        return length // 1024 * 1024
    if length >= 256:
        return length // 256 * 256
    return length


def _workload_ok(request: PlanRequest, prediction: StartupPrediction, flags: EngineFlags) -> bool:
    wl = request.workload
    minimum = max(request.constraints.min_model_len or 0, wl.context_length or 0)
    if flags.max_model_len < minimum:
        return False
    if wl.concurrency and wl.context_length:
        per_request = min(wl.context_length, flags.max_model_len)
        capacity = prediction.kv_cache_tokens / per_request if per_request else 0.0
        if profile_tokens_are_capacity(prediction, flags):
            capacity = prediction.max_concurrency * flags.max_model_len / per_request
        # with --data-parallel-size every engine has this cache and vLLM spreads the requests over the engines
        return capacity * flags.data_parallel_size >= wl.concurrency
    return True


def profile_tokens_are_capacity(prediction: StartupPrediction, flags: EngineFlags) -> bool:
    """Whether the window-aware capacity should be used (hybrid sliding-window models)."""
    return prediction.max_concurrency * flags.max_model_len > prediction.kv_cache_tokens * 1.05


class _Choice:
    """The flags fixed for one candidate: (tp, pp, kv dtype, eager) and the utilization they give."""

    def __init__(self, request: PlanRequest, profile: VersionProfile, tp: int, pp: int, util: float, kv_dtype: str,
                 eager: bool) -> None:
        self.request, self.profile = request, profile
        self.tp, self.pp, self.util, self.kv_dtype, self.eager = tp, pp, util, kv_dtype, eager

    def flags(self, max_model_len: int, max_num_seqs: int | None) -> EngineFlags:
        return _build_flags(self.request, self.profile, self.tp, self.pp, self.util, self.kv_dtype, self.eager,
                            max_model_len, max_num_seqs)

    def predict(self, flags: EngineFlags) -> StartupPrediction:
        return _predict(self.request, self.profile, flags)


def _fit_length(choice: _Choice, max_num_seqs: int | None) -> tuple[EngineFlags, StartupPrediction, str]:
    """The longest max-model-len (up to the target) whose KV cache fits with `max_num_seqs` (None: vLLM's default),
    with the activation, sampler and CUDA-graph figures of that many sequences; and the reason for it."""
    request = choice.request
    pinned_len = request.pinned.max_model_len
    if pinned_len == MAX_MODEL_LEN_AUTO:
        return _auto_length(choice, max_num_seqs)
    target = int(pinned_len) if pinned_len is not None else _length_target(request)
    flags = choice.flags(target, max_num_seqs)
    prediction = choice.predict(flags)
    if pinned_len is not None:
        return flags, prediction, f"max-model-len {pinned_len} {_pinned_or_default(request, 'max_model_len')}."
    estimate, margin = prediction.estimated_max_model_len, 0.0
    fit = estimate
    if estimate < target:  # the KV cache binds: leave room for the error of the predicted figures, but never at
        # the cost of a context the workload needs (or of the shortest useful one)
        floor = max(_MIN_USEFUL_LEN, request.constraints.min_model_len or 0, request.workload.context_length or 0)
        fit = max(int(estimate * (1 - _estimate_margin(prediction))), min(estimate, floor))
        margin = 1 - fit / estimate if estimate else 0.0
    if fit < min(_MIN_USEFUL_LEN, target):  # not even a short request fits: keep the target, the failure says why
        return flags, prediction, (
            f"max-model-len {target}: not even {min(_MIN_USEFUL_LEN, target)} tokens of KV cache fit in what is "
            f"left per GPU ({prediction.memory.kv_cache_gib:.2f} GiB).")
    if fit >= target:
        return flags, prediction, f"max-model-len {target}: the model's full context fits in the KV cache."
    length = _round_len(fit)
    flags = choice.flags(length, max_num_seqs)
    prediction = choice.predict(flags)
    return flags, prediction, (
        f"max-model-len {length}: the model allows {request.arch.derived_max_model_len}, but one request of that "
        f"length needs more KV cache than the {prediction.memory.kv_cache_gib:.2f} GiB left per GPU; {estimate} tokens "
        f"is the longest that fits (vLLM's own estimate with max-num-seqs {flags.max_num_seqs}), less {margin:.1%} "
        f"for the error of the predicted activation, CUDA-graph and overhead figures: {fit}, rounded down.")


def _auto_length(choice: _Choice, max_num_seqs: int | None) -> tuple[EngineFlags, StartupPrediction, str]:
    """`--max-model-len auto` (or -1), as vLLM 0.14.0+ resolves it: the engine is configured and profiled at the
    model's derived length, then `_auto_fit_max_model_len` (v1/core/kv_cache_utils.py) keeps that length when one
    request of it fits the KV memory, else binary-searches the longest that does - the same search as the estimate
    vLLM's KV-too-small error prints (`estimated_max_model_len`), so no margin: vLLM fits what it measures."""
    derived = choice.request.arch.derived_max_model_len
    flags = choice.flags(derived, max_num_seqs)
    prediction = choice.predict(flags)
    version = choice.profile.version
    estimate = prediction.estimated_max_model_len
    if estimate <= 0:
        message = ("Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. "
                   "Try increasing `gpu_memory_utilization`.")
        if prediction.failure is None or prediction.failure.kind is FailureKind.KV_CACHE_TOO_SMALL:
            prediction = prediction.model_copy(update={"failure": PredictedFailure(
                kind=FailureKind.KV_CACHE_TOO_SMALL, message=message)})
        return flags, prediction, f"max-model-len auto: vLLM {version} would stop: \"{message}\""
    if estimate >= derived:
        return flags, prediction, (f"max-model-len auto: vLLM {version} keeps the model's full context, {derived} "
                                   "tokens: one request of it fits the KV cache.")
    flags = choice.flags(estimate, max_num_seqs)
    prediction = choice.predict(flags)
    return flags, prediction, (
        f"max-model-len auto: vLLM {version} reduces the model's {derived} to {estimate} tokens, the longest one "
        f"request of which fits the {prediction.memory.kv_cache_gib:.2f} GiB of KV cache per GPU (its log: "
        f"\"Auto-fit max_model_len: reduced from {derived} to {estimate}\").")


def _pinned_or_default(request: PlanRequest, name: str) -> str:
    """"is pinned", or "is vLLM's default" for a flag `with_vllm_defaults` filled in (the command did not set it)."""
    return "is vLLM's default" if name in request.vllm_defaults else "is pinned"


def _estimate_margin(prediction: StartupPrediction) -> float:
    """The share of the KV cache a fitted max-model-len leaves unused: _ESTIMATE_MARGIN of the predicted
    (not read from the checkpoint) figures beside the weights, so an error in them does not fail vLLM's KV check."""
    mem = prediction.memory
    if mem.kv_cache_gib <= 0:
        return 0.0
    predicted = mem.activation_gib + mem.non_torch_gib + mem.cudagraph_gib + mem.persistent_gib
    return min(_ESTIMATE_MARGIN * predicted / mem.kv_cache_gib, 1.0)


def _fallback_seqs(request: PlanRequest, flags: EngineFlags) -> int:
    """The fewest sequences a usable plan admits: the workload's concurrency per engine, else the default workload's
    (README, "What a good plan is"); never more than vLLM's default."""
    wanted = request.workload.concurrency or DEFAULT_CONCURRENCY
    return max(1, min(flags.max_num_seqs, -(-wanted // flags.data_parallel_size)))


def _fit_with_seqs(choice: _Choice, flags: EngineFlags,
                   seqs: int) -> tuple[EngineFlags, StartupPrediction, str] | None:
    """max-model-len re-fitted with `seqs` sequences; else the same length with them; None when neither starts."""
    refit = _fit_length(choice, seqs)
    if refit[1].failure is None:
        return refit
    same = choice.flags(flags.max_model_len, seqs)
    prediction = choice.predict(same)
    return None if prediction.failure is not None else (same, prediction, "")


def _candidate(request: PlanRequest, profile: VersionProfile, tp: int, pp: int, kv_dtype: str,
               eager: bool) -> _Candidate:
    """Fill max_model_len and max_num_seqs for one (tp, pp, kv dtype, eager) choice.

    max-model-len is first fitted at vLLM's default max-num-seqs; max-num-seqs is then sized to that KV cache, and
    max-model-len re-fitted with the activation, sampler and CUDA-graph memory of the chosen count, so that what
    fewer sequences free goes back into the context. A bounded fixed point (at most `_REFIT_PASSES` passes), every
    pass a full `predict_startup`; a pass whose plan would not start, or that would shorten the context, is never
    taken. When vLLM's default count
    leaves no room at all, the fewest sequences a usable plan admits are tried before the plan is given up.
    """
    notes: list[str] = []
    choice = _Choice(request, profile, tp, pp, _utilization(request, profile, tp, request.arch, eager, notes, pp),
                     kv_dtype, eager)
    flags, prediction, length_note = _fit_length(choice, None)
    if request.pinned.max_num_seqs is not None:
        return _Candidate(flags, prediction, [*notes, length_note,
                                              f"max-num-seqs {request.pinned.max_num_seqs} "
                                              f"{_pinned_or_default(request, 'max_num_seqs')}."])
    most = flags.max_num_seqs  # vLLM's default (or the ladder's limit): never admit more
    if prediction.failure is not None:
        fewest = _fallback_seqs(request, flags)
        rescued = _fit_with_seqs(choice, flags, fewest) if fewest < most else None
        if rescued is None:
            return _Candidate(flags, prediction, [*notes, length_note])
        flags, prediction, length_note = rescued[0], rescued[1], rescued[2] or length_note
    for _ in range(_REFIT_PASSES):
        seqs = _size_max_num_seqs(request, prediction, flags, most)
        if seqs == flags.max_num_seqs:
            break  # a fixed point: the re-fitted cache holds as many sequences as the plan admits
        refit = _fit_with_seqs(choice, flags, seqs)
        if refit is None or refit[0].max_model_len < flags.max_model_len:
            break  # more sequences never cost context: the context comes first in the objective
        flags, prediction, length_note = refit[0], refit[1], refit[2] or length_note
    return _Candidate(flags, prediction, [*notes, length_note, _seqs_note(request, prediction, flags, most)])


def _typical_and_capacity(request: PlanRequest, prediction: StartupPrediction, flags: EngineFlags) -> tuple[int, int]:
    # sized at the typical request, not the p99 context: most requests are shorter, and vLLM preempts (never
    # crashes) when long ones fill the cache; the workload's concurrency at its p99 length is checked separately
    typical = min(flags.max_model_len, request.workload.typical_request_tokens or 2048)
    capacity = int(prediction.max_concurrency * flags.max_model_len / typical) if typical else flags.max_num_seqs
    return typical, capacity


def _size_max_num_seqs(request: PlanRequest, prediction: StartupPrediction, flags: EngineFlags, most: int) -> int:
    """As many sequences as the KV cache holds at the typical request length, not vLLM's 256/1024 (`most`)."""
    _, capacity = _typical_and_capacity(request, prediction, flags)
    per_engine = -(-(request.workload.concurrency or 1) // flags.data_parallel_size)  # DP engines share the load
    seqs = max(1, min(most, max(capacity, per_engine)))
    if request.constraints.max_num_seqs:
        seqs = min(seqs, request.constraints.max_num_seqs)
    return seqs


def _seqs_note(request: PlanRequest, prediction: StartupPrediction, flags: EngineFlags, most: int) -> str:
    typical, capacity = _typical_and_capacity(request, prediction, flags)
    seqs = flags.max_num_seqs
    if seqs < most:
        return (f"max-num-seqs {seqs}: the KV cache holds about {capacity} requests of {typical} tokens; vLLM's "
                f"default of {most} would admit more than fit and preempt under load.")
    return f"max-num-seqs {seqs}: vLLM's default; the KV cache holds about {capacity} requests of {typical} tokens."


def _tp_candidates(request: PlanRequest) -> list[int]:
    pinned = request.pinned.tensor_parallel_size
    if pinned:
        return [pinned]
    pp = request.pinned.pipeline_parallel_size or 1
    low = request.constraints.min_tensor_parallel_size or 1
    if request.gpu.is_mig:
        return [1]  # a process sees one MIG slice: no tensor parallelism across slices
    dp = request.pinned.data_parallel_size or 1  # GPUs per replica = TP × PP × DP
    if dp > 1:  # a floor meant for all the pod's GPUs (spec.gpu.count) is at most what one DP engine can have
        low = min(low, max(request.gpu_count // (pp * dp), 1))
    return [tp for tp in _TP_CHOICES
            if low <= tp and tp * pp * dp <= request.gpu_count
            and _valid_tp(request.arch, tp, expert_parallel=bool(request.pinned.enable_expert_parallel))]


def _kv_choices(request: PlanRequest) -> list[str]:
    pinned = request.pinned.kv_cache_dtype
    if pinned:
        return [pinned]
    if request.constraints.force_fp8_kv:
        return ["fp8"]
    choices = ["auto"]
    if _supports_fp8_kv(request.gpu):
        choices.append("fp8")
    return choices


def _supports_fp8_kv(gpu: GPUSpec) -> bool:
    """FP8 KV cache kernels need compute capability 8.9+ (Ada, Hopper, Blackwell)."""
    cc = gpu.compute_capability_tuple
    if cc is None:
        return gpu.fp8
    return cc[0] + cc[1] / 10 >= _FP8_KV_GPUS_MIN_CC


def _eager_choices(request: PlanRequest) -> list[bool]:
    if request.pinned.enforce_eager is not None:
        return [request.pinned.enforce_eager]
    if request.constraints.force_enforce_eager:
        return [True]
    return [False, True]


def _search(request: PlanRequest, profile: VersionProfile) -> Iterator[_Candidate]:
    pp = request.pinned.pipeline_parallel_size or 1
    for tp in _tp_candidates(request) or [request.pinned.tensor_parallel_size or 1]:
        for kv in _kv_choices(request):
            for eager in _eager_choices(request):
                yield _candidate(request, profile, tp, pp, kv, eager)


def default_context(arch: ModelArch) -> int:
    """The context a plan must offer when no workload is given: the model's maximum, capped at a sensible length."""
    return min(arch.derived_max_model_len, DEFAULT_CONTEXT_CAP)


def _wanted_context(request: PlanRequest) -> int:
    wanted = request.workload.context_length or default_context(request.arch)
    return min(wanted, request.arch.derived_max_model_len)


def shortfalls(request: PlanRequest, flags: EngineFlags) -> list[str]:
    """How a plan that starts falls short of *usable* (README, "What a good plan is"); empty = not degenerate.

    Only what the planner chose counts: a pinned flag or a limit the remediation ladder learned is the user's or
    the cluster's word, not a degenerate choice.
    """
    out: list[str] = []
    pinned, limits, wl = request.pinned, request.constraints, request.workload
    context = _wanted_context(request)
    if pinned.max_model_len is None and limits.max_model_len is None and flags.max_model_len < context:
        out.append(f"max-model-len {flags.max_model_len} (below {context})")
    seqs = min(wl.concurrency or DEFAULT_CONCURRENCY, DEFAULT_CONCURRENCY)
    if pinned.max_num_seqs is None and limits.max_num_seqs is None and flags.max_num_seqs < seqs:
        out.append(f"max-num-seqs {flags.max_num_seqs} (below {seqs})")
    if flags.enforce_eager and pinned.enforce_eager is None and not limits.force_enforce_eager:
        out.append("--enforce-eager (no CUDA graphs)")
    return out


def _objective_text(request: PlanRequest) -> str:
    wl = request.workload
    context = _wanted_context(request)
    if wl.context_length or wl.concurrency:
        return (f"the stated workload ({wl.concurrency or 1} concurrent request(s) of {context} tokens) with "
                "CUDA graphs")
    return (f"the default workload (context {context} tokens, {DEFAULT_CONCURRENCY} concurrent requests, "
            "CUDA graphs on)")


def _gpus(candidate: _Candidate) -> int:
    flags = candidate.flags
    return flags.tensor_parallel_size * flags.pipeline_parallel_size * flags.data_parallel_size


def _starts(request: PlanRequest, candidate: _Candidate) -> bool:
    return candidate.prediction.failure is None and _workload_ok(request, candidate.prediction, candidate.flags)


def _rank(request: PlanRequest, index: int, candidate: _Candidate) -> tuple[float, ...]:
    """The objective as a sort key (smaller is better).

    1. It starts and meets the stated workload. 2. It is usable (not degenerate). Among usable plans: 16-bit KV
    (no quality change) if any allowed configuration has it, then fewer GPUs, then more KV cache. Among degenerate
    plans: CUDA graphs kept if any allowed setting keeps them, then the fewest shortfalls, then fewer GPUs, 16-bit
    KV, more KV. Plans that do not start are shown for the most GPUs allowed (the GPUs asked for).
    """
    flags = candidate.flags
    fp8 = float(flags.kv_cache_dtype.startswith("fp8") and not request.pinned.kv_cache_dtype)
    if not _starts(request, candidate):
        return (2.0, -_gpus(candidate), fp8, float(flags.enforce_eager), float(index))
    short = shortfalls(request, flags)
    eager = float(flags.enforce_eager and request.pinned.enforce_eager is None)
    if not short:  # usable: 16-bit KV (no quality change) before fewer GPUs, then fewer GPUs, then more KV
        return (0.0, fp8, float(_gpus(candidate)), -float(candidate.prediction.kv_cache_tokens), float(index))
    return (1.0, eager, float(len(short)), float(_gpus(candidate)), fp8, -float(candidate.prediction.kv_cache_tokens),
            float(index))


def _choose(request: PlanRequest, profile: VersionProfile) -> tuple[_Candidate, bool, list[_Candidate]]:
    """The best candidate by the objective, whether it starts, and every candidate tried (search order)."""
    candidates: list[_Candidate] = []
    for candidate in _search(request, profile):  # tensor-parallel sizes ascending
        candidates.append(candidate)
        fp8 = candidate.flags.kv_cache_dtype.startswith("fp8") and not request.pinned.kv_cache_dtype
        if not fp8 and _starts(request, candidate) and not shortfalls(request, candidate.flags):
            break  # usable with 16-bit KV on the fewest GPUs so far: no later candidate ranks higher
    ranked = sorted(enumerate(candidates), key=lambda pair: _rank(request, *pair))
    best = ranked[0][1]
    return best, _starts(request, best), candidates


def plan(request: PlanRequest, *, options: bool = True) -> Plan:
    """The flags to run `request.arch` on `request.gpu`, with the predicted startup and the reasons. Raises
    InvalidParallelism for a pinned layout vLLM cannot run (more pipeline stages than layers).

    `options=False`: no alternatives are searched when it does not fit (a search over layouts asks only whether
    each one fits; the options cost many plans each)."""
    profile = profile_for_model(profile_for(request.vllm_version), request.arch)
    request = request.model_copy(update={"arch": arch_for_release(request.arch, profile)})
    check_parallelism(request.arch, request.pinned.pipeline_parallel_size)
    result, fits, tried = _choose(request, profile)
    reasons = _reasons(request, profile, result, fits, tried)
    flags = _explicit_flags(request, result.flags, profile)
    failure = _plain_failure(result.prediction.failure)
    wanted = request.workload.context_length
    if not fits and wanted and wanted > request.arch.derived_max_model_len:
        failure = PredictedFailure(
            kind=FailureKind.MAX_MODEL_LEN_TOO_LONG,
            message=f"The workload's context length ({wanted}) is longer than the model's own maximum "
                    f"({request.arch.derived_max_model_len}, from config.json); lower it or pick a model with a "
                    "longer context.")
    if not fits and failure is None:
        failure = PredictedFailure(kind=FailureKind.KV_CACHE_TOO_SMALL, message=_workload_message(request, result))
    auto, auto_reason = _operator_auto(request, profile, result.flags, result.prediction, fits)
    if auto_reason:
        reasons.append(auto_reason)
    refused = _lora_verdict(request, profile, result.flags, reasons)
    if refused is not None:  # no GPU, flag or checkpoint change helps: vLLM refuses --enable-lora for this model
        fits, failure = False, refused
    degenerate = fits and bool(shortfalls(request, result.flags))
    found = [] if refused or not options or (fits and not degenerate) else list(
        _options(request, profile, usable_only=degenerate))
    prediction = result.prediction
    if prediction.failure is not None:
        prediction = prediction.model_copy(update={"failure": _plain_failure(prediction.failure)})
    return Plan(
        kv_fraction=kv_fraction(request, profile, result.flags, result.prediction),
        model_id=request.arch.model_id,
        gpu=request.gpu.name,
        gpu_count=_gpus(result),
        gpu_count_allowed=request.gpu_count,
        vllm_version=profile.version,
        fits=fits,
        usable=fits and not degenerate,
        flags=flags,
        max_model_len_auto=request.pinned.max_model_len == MAX_MODEL_LEN_AUTO or auto,
        pinned=_pinned_names(request),
        prediction=prediction,
        failure=failure,
        reasons=reasons,
        options=found,
        lora_bytes=lora_bytes(request.arch, result.flags),
    )


def _operator_auto(request: PlanRequest, profile: VersionProfile, flags: EngineFlags, prediction: StartupPrediction,
                   fits: bool) -> tuple[bool, str | None]:
    """Whether the operator renders `--max-model-len auto` for a length it chose itself, and the reason either way.

    `auto` (vLLM 0.14.0+) keeps the model's derived length when one request of it fits the KV cache vLLM measured,
    and binary-searches the longest that does otherwise (`_auto_fit_max_model_len`, v1/core/kv_cache_utils.py): the
    search `_auto_length` replays. So `auto` is the same plan as an explicit length exactly when the planner chose the
    model's full context, and then the safer one: if the memory comes out smaller than predicted, an explicit length
    stops vLLM with the KV-cache-too-small error, `auto` starts with what fits. Where requests need a context length
    (spec.workload.contextLength, constraints.minModelLen), a start with less than that would pass without an error:
    `auto` only when that length fits the KV cache with the margin kept for the error of the predicted figures. A
    fitted length shorter than the model's keeps that margin, which `auto` would not: it stays explicit."""
    pinned = request.pinned.max_model_len
    derived = request.arch.derived_max_model_len
    if pinned is not None or not profile.max_model_len_auto or not fits:
        return False, None  # the length is the user's (or a replayed command's), the release has no auto, or no plan
    cap = request.constraints.max_model_len
    if cap is not None and cap < derived:
        return False, None  # a cap below the model's length: auto cannot say it
    version = profile.version
    if flags.max_model_len < derived:
        estimate = prediction.estimated_max_model_len
        return False, (f"max-model-len {flags.max_model_len}, not auto: vLLM {version}'s `--max-model-len auto` would "
                       f"pick {estimate} tokens here, the longest one request of which fits the predicted KV cache, "
                       "with no room for the error of the predicted figures.")
    wanted = max(request.constraints.min_model_len or 0, request.workload.context_length or 0)
    margin = _estimate_margin(prediction)
    kv_bytes = prediction.memory.kv_cache_gib * 2**30
    slack = 1 - wanted * prediction.kv_bytes_per_token / kv_bytes if kv_bytes > 0 else 0.0
    if wanted and (wanted >= derived or slack < margin):
        return False, (f"max-model-len {derived}, not auto (the same length on vLLM {version} as predicted): requests "
                       f"need {wanted} tokens, and `auto` would start with fewer, without an error, where an explicit "
                       "length stops vLLM with the KV-cache-too-small error, if the KV cache came out "
                       f"{max(slack, 0.0):.1%} smaller than predicted (the planner keeps {margin:.1%} for the error of "
                       "its predicted figures).")
    need = (f", and keeps at least the {wanted} tokens requests need unless the KV cache comes out {slack:.0%} smaller "
            f"than predicted (the planner keeps {margin:.1%} for the error of its predicted figures)") if wanted else ""
    return True, (f"max-model-len auto: on vLLM {version} it keeps the model's full context, {derived} tokens, as "
                  "planned (one request of it fits the predicted KV cache); unlike an explicit length, which stops "
                  "vLLM with the KV-cache-too-small error if the memory comes out smaller than predicted, `auto` "
                  "re-fits to the memory vLLM measures at startup (its log then says \"Auto-fit max_model_len: reduced "
                  f"from ...\"){need}.")


def kv_fraction(request: PlanRequest, profile: VersionProfile, flags: EngineFlags,
                prediction: StartupPrediction) -> float | None:
    """The planned KV cache as a fraction of the physical limit: the memory vLLM could use at this GPU's highest
    safe utilization, minus the same weights, activation and overhead. None when nothing is left for KV at all."""
    mem = prediction.memory
    if prediction.failure is not None:
        return None
    safe, _ = safe_utilization(request.gpu, outside_budget_gib(flags.tensor_parallel_size, flags.pipeline_parallel_size,
                                                               request.gpu.nvlink,
                                                               profile_for_model(profile, request.arch)))
    free = _free_gib(request)
    if free is not None:  # memory others hold is not physically available
        safe = min(safe, max(free - _MARGIN_GIB, 0.0) / request.gpu.reported_gib)
    graphs = mem.cudagraph_gib if profile.cudagraph_subtracted else 0.0
    physical = (safe * mem.gpu_total_gib - mem.weights_gib - mem.activation_gib - mem.non_torch_gib - graphs
                - mem.persistent_gib)
    if physical <= 0:
        return None
    return round(min(mem.kv_cache_gib / physical, 9.99), 3)


_INVENTED = re.compile(r"\s*\(original error: .*\)\s*$", re.DOTALL)


def _plain_failure(failure: PredictedFailure | None) -> PredictedFailure | None:
    """vLLM's own words for a failure, without the PyTorch traceback a real run would append: no pod ran, so the
    allocation sizes in such a traceback would be invented."""
    if failure is None:
        return None
    message = _INVENTED.sub("", failure.message)
    if message.lstrip().startswith("torch.OutOfMemoryError"):
        message = "torch.OutOfMemoryError: CUDA out of memory."
    return failure if message == failure.message else failure.model_copy(update={"message": message})


def _workload_message(request: PlanRequest, candidate: _Candidate) -> str:
    wl = request.workload
    pred = candidate.prediction
    return (f"The KV cache holds {pred.kv_cache_tokens} tokens ({pred.max_concurrency:.2f} requests of "
            f"{candidate.flags.max_model_len}); the workload asks for {wl.concurrency or 1} concurrent requests of "
            f"{wl.context_length or candidate.flags.max_model_len} tokens.")


def _pinned_names(request: PlanRequest) -> list[str]:
    names = list(pinned_flags(request))  # spec.flags, then what spec.lora adds
    if request.speculation is not None and "speculative_config" not in names:
        names.append("speculative_config")
    return names


def _explicit_flags(request: PlanRequest, flags: EngineFlags, profile: VersionProfile) -> dict[str, Any]:
    """The flags we pass on the command line: what we chose plus everything pinned, in a stable order. Pinned flags
    the planner does not model (LoRA, swap space, ...) reach vLLM as written, so no pin is silently dropped."""
    out: dict[str, Any] = {
        "tensor_parallel_size": flags.tensor_parallel_size,
        "gpu_memory_utilization": flags.gpu_memory_utilization,
        "max_model_len": flags.max_model_len,
        "max_num_seqs": flags.max_num_seqs,
    }
    if flags.pipeline_parallel_size > 1 or request.pinned.pipeline_parallel_size:
        out["pipeline_parallel_size"] = flags.pipeline_parallel_size
    defaults = batch_defaults(profile, gpu_memory_gib=request.gpu.reported_gib, is_a100=request.gpu.is_a100,
                              compute_capability=request.gpu.compute_capability,
                              max_model_len=flags.max_model_len)
    if request.pinned.max_num_batched_tokens or flags.max_num_batched_tokens != defaults.max_num_batched_tokens:
        out["max_num_batched_tokens"] = flags.max_num_batched_tokens
    if flags.kv_cache_dtype != "auto" or request.pinned.kv_cache_dtype:
        out["kv_cache_dtype"] = flags.kv_cache_dtype
    if flags.enforce_eager or request.pinned.enforce_eager is not None:
        out["enforce_eager"] = flags.enforce_eager
    for name, value in pinned_flags(request).items():
        if name not in out:
            out[name] = value
    if flags.speculative is not None:  # the speculation the plan was made for, as vLLM reads the flag
        out["speculative_config"] = flags.speculative.to_json()
    if request.workload.prefix_caching is not None and "enable_prefix_caching" not in out:
        out["enable_prefix_caching"] = request.workload.prefix_caching
    return out


def _lora_estimate(arch: ModelArch, flags: EngineFlags) -> LoRAEstimate:
    dtype = dtype_bytes(flags.dtype) if flags.dtype not in ("auto", "") else min(dtype_bytes(arch.dtype), 2)
    slots = LoRASlots(max_loras=flags.max_loras, max_rank=flags.max_lora_rank, dtype_bytes=dtype,
                      moe_experts=flags.lora_moe_experts)
    return adapter_bytes_per_stage(arch, slots, flags.tensor_parallel_size,
                                   pp_layer_counts(arch.num_layers, flags.pipeline_parallel_size))


def lora_bytes(arch: ModelArch, flags: EngineFlags) -> int:
    """Bytes per GPU of the adapter slots on the stage that holds the most (0 with LoRA off)."""
    return max(_lora_estimate(arch, flags).per_stage) if flags.max_loras else 0


def lora_reason(arch: ModelArch, flags: EngineFlags) -> str:
    """What the adapter slots cost, per GPU (they are part of the weights figure and come out of the KV cache)."""
    estimate = _lora_estimate(arch, flags)
    text = (f"LoRA: {flags.max_loras} adapter slot(s) at rank {flags.max_lora_rank} reserve "
            f"{max(estimate.per_stage) / 2**30:.2f} GiB per GPU while the model loads (counted in the weights, "
            "taken from the KV cache)")
    if arch.is_moe and not flags.lora_moe_experts:
        text += f"; the routed experts get no slots before vLLM {MOE_EXPERTS_SINCE} (no fused-MoE LoRA layer)"
    return text + (f"; {estimate.note}." if estimate.note else ".")


def _lora_verdict(request: PlanRequest, profile: VersionProfile, flags: EngineFlags,
                  reasons: list[str]) -> PredictedFailure | None:
    """With LoRA on, whether the release serves this model's class with it (catalog/lora_support.yaml): adds the
    reason, and returns vLLM's refusal as the plan's failure when it does not."""
    if not flags.max_loras:
        return None
    support = lora_support(request.arch.architectures, profile.version)
    reasons.append(lora_support_reason(request.arch, profile.version, support))
    if support.supported is not False:
        return _vocab_verdict(request.arch, profile.version, reasons)
    return PredictedFailure(kind=FailureKind.INVALID_ARGUMENT,
                            message=refusal_message(support, request.arch.model_id))


def _vocab_verdict(arch: ModelArch, version: str, reasons: list[str]) -> PredictedFailure | None:
    """vLLM's refusal of an LM head whose vocabulary exceeds the release's LoRA limit (planner/lora.py)."""
    check = vocab_check(arch.architectures, arch.vocab_size, version)
    if check is None:
        return None
    reasons.append(vocab_reason(arch, version, check))
    return PredictedFailure(kind=FailureKind.INVALID_ARGUMENT, message=check.limit.text) if check.refused else None


def vocab_reason(arch: ModelArch, version: str, check: VocabCheck) -> str:
    names = check.architecture or ", ".join(arch.architectures) or arch.model_id
    vocab = (f"{check.vocab:,} tokens" if check.vocab == arch.vocab_size
             else f"{check.vocab:,} tokens (config.json's {arch.vocab_size:,} + lora_extra_vocab_size)")
    if check.refused:
        return (f"LoRA: vLLM {version} makes the LM head of {names} a LoRA target (read from {check.basis}) and "
                f"refuses a vocabulary of more than {check.limit.max:,} tokens there; this one compares {vocab}: it "
                "fails once the weights loaded. Remove spec.lora / --enable-lora, or use a release with a higher "
                "limit.")
    return (f"LoRA: vLLM {version} refuses a vocabulary of more than {check.limit.max:,} tokens on an LM head that "
            f"is a LoRA target; this model has {vocab}, and whether {names}'s head is one is not known "
            f"({check.basis}); the plan assumes it is not.")


def lora_support_reason(arch: ModelArch, version: str, support: LoRASupport) -> str:
    """Whether this release serves the architecture with LoRA, and what the answer rests on."""
    names = support.architecture or ", ".join(arch.architectures) or arch.model_id
    if support.supported:
        return f"LoRA: vLLM {version} implements SupportsLoRA for {names} (read from {support.basis})."
    if support.supported is None:
        return (f"LoRA: whether vLLM {version} serves {names} with --enable-lora is not known ({support.basis}); "
                "the plan assumes it does.")
    phase = "before the engine starts" if support.refusal and support.refusal.phase == "config" else \
        "while the model loads"
    return (f"LoRA: vLLM {version} does not implement SupportsLoRA for {names} (read from {support.basis}): it "
            f"refuses --enable-lora {phase}. Remove spec.lora / --enable-lora, or serve a model whose architecture "
            "supports LoRA.")


def _speculation_reasons(arch: ModelArch, flags: EngineFlags, profile: VersionProfile) -> list[str]:
    draft = speculative_memory(arch, flags, profile)
    if draft is None:
        return []
    return [draft.note + " speculative-config is pinned; a max-num-seqs the planner chooses starts from vLLM's "
            f"default divided by {draft.sampler_rows_factor} (the rows one sequence takes in the sampler)."]


def _reasons(request: PlanRequest, profile: VersionProfile, candidate: _Candidate, fits: bool,
             tried: list[_Candidate]) -> list[str]:
    arch, gpu, flags, pred = request.arch, request.gpu, candidate.flags, candidate.prediction
    mem = pred.memory
    reasons = [
        f"Model {arch.model_id}: {arch.family}, {arch.num_layers} layers, {arch.num_kv_heads} KV heads × "
        f"{arch.head_dim}, {mem.weights_gib:.2f} GiB of weights per GPU at TP={flags.tensor_parallel_size}.",
        f"GPU {gpu.name}: vLLM sees {gpu.reported_gib:.2f} GiB. vLLM {profile.version} ({profile.engine} engine) "
        f"sizes memory by the rules of releases since {profile.since}: {profile.note}.",
    ]
    if request.version_note:
        reasons.append(request.version_note)
    reasons.extend(_speculation_reasons(arch, flags, profile))
    tp = flags.tensor_parallel_size
    short = shortfalls(request, flags) if fits else []
    objective = _objective_text(request)
    if request.pinned.tensor_parallel_size:
        reasons.append(f"tensor-parallel-size {tp} {_pinned_or_default(request, 'tensor_parallel_size')}.")
    elif not fits:
        reasons.append(f"tensor-parallel-size {tp}: the most of the {request.gpu_count} GPU(s) allowed; no valid "
                       f"size up to that starts{' with the stated workload' if request.workload.concurrency else ''}.")
    else:
        fewer = [c for c in tried if _gpus(c) < _gpus(candidate) and _starts(request, c)]
        if fewer and not short:
            best_fewer = min(fewer, key=lambda c: _rank(request, 0, c))
            falls = shortfalls(request, best_fewer.flags)
            if falls:
                reasons.append(
                    f"tensor-parallel-size {tp}: on {_gpus(best_fewer)} GPU(s) vLLM would start only with "
                    f"{', '.join(falls)}; {_gpus(candidate)} GPUs meet {objective}. "
                    "Trade-off: more GPUs for a usable plan.")
            else:
                reasons.append(
                    f"tensor-parallel-size {tp}: {_gpus(best_fewer)} GPU(s) would meet {objective} only with an fp8 "
                    f"KV cache (a quality change); {_gpus(candidate)} GPUs keep 16-bit KV. Trade-off: more GPUs "
                    "for unchanged quality (pin --kv-cache-dtype fp8 to use fewer).")
        elif tp == 1:
            reasons.append("tensor-parallel-size 1: the model fits on one GPU.")
        else:
            smaller = [t for t in _TP_CHOICES if t < tp and _valid_tp(arch, t, expert_parallel=flags.enable_expert_parallel)]
            reasons.append(
                f"tensor-parallel-size {tp}: the smallest valid size that fits "
                f"(tried {', '.join(map(str, smaller)) or 'none smaller'}; sizes must divide {arch.num_heads} "
                f"attention heads and {arch.num_kv_heads} KV heads).")
    if short:
        reasons.append(
            f"Trade-off: no configuration within the {request.gpu_count} GPU(s) allowed meets {objective}; this "
            f"plan starts with {', '.join(short)}"
            + (" (CUDA graphs do not fit at any allowed setting)" if flags.enforce_eager else "")
            + ". The options say what would meet it.")
    reasons.extend(candidate.notes)
    reasons.extend([lora_reason(arch, flags)] if flags.max_loras else [])
    reasons.extend(moe_parallel_reasons(arch, flags, profile.version_tuple))
    if flags.kv_cache_dtype in ("fp8", "fp8_e4m3", "fp8_e5m2") and not request.pinned.kv_cache_dtype:
        reasons.append("kv-cache-dtype fp8: with 16-bit KV the plan does not fit or falls short of "
                       f"{objective}; fp8 halves KV bytes per token (small quality cost).")
    defaults = batch_defaults(profile, gpu_memory_gib=request.gpu.reported_gib, is_a100=request.gpu.is_a100,
                              compute_capability=request.gpu.compute_capability,
                              max_model_len=flags.max_model_len)
    if request.pinned.max_num_batched_tokens:
        reasons.append(f"max-num-batched-tokens {flags.max_num_batched_tokens} "
                       f"{_pinned_or_default(request, 'max_num_batched_tokens')}.")
    elif flags.max_num_batched_tokens != defaults.max_num_batched_tokens:
        reasons.append(f"max-num-batched-tokens {flags.max_num_batched_tokens}: below vLLM's default of "
                       f"{defaults.max_num_batched_tokens} to shrink the activation peak (learned from an earlier "
                       "failure).")
    if request.workload.prefix_caching is not None and request.pinned.enable_prefix_caching is None:
        state = "on" if request.workload.prefix_caching else "off"
        reasons.append(f"enable-prefix-caching {state}: as spec.workload.prefixCaching asks (agent and RAG workloads "
                       "reuse long prompt prefixes).")
    if flags.enforce_eager and request.pinned.enforce_eager is None:
        reasons.append("enforce-eager: CUDA graphs would not fit; eager mode gives their memory to the KV cache "
                       "at some decode speed.")
    if pred.failure is None:  # when vLLM would fail, "Does not fit" below carries the arithmetic instead
        graphs = f" + {mem.cudagraph_gib:.2f} CUDA graphs" if profile.cudagraph_subtracted and mem.cudagraph_gib else ""
        persistent = f" + {mem.persistent_gib:.2f} sampler state/allocator" if mem.persistent_gib else ""
        reasons.append(
            f"Budget per GPU: {mem.requested_gib:.2f} GiB requested = {mem.weights_gib:.2f} weights + "
            f"{mem.activation_gib:.2f} activation + {mem.non_torch_gib:.2f} non-torch{graphs}{persistent} + "
            f"{mem.kv_cache_gib:.2f} KV cache → {pred.kv_cache_tokens} tokens, {pred.max_concurrency:.2f} "
            f"concurrent requests of {flags.max_model_len}.")
    if not fits:
        reasons.append("Does not fit: " + does_not_fit(request, profile, candidate.flags, pred))
    return reasons


def does_not_fit(request: PlanRequest, profile: VersionProfile, flags: EngineFlags, pred: StartupPrediction) -> str:
    """Why a plan does not start, as arithmetic that adds up (the figures of the memory bar), then vLLM's words."""
    failure = _plain_failure(pred.failure)
    mem = pred.memory
    gpus = flags.tensor_parallel_size * flags.pipeline_parallel_size * flags.data_parallel_size
    if failure is None:
        wl = request.workload
        return (f"the KV cache holds {pred.kv_cache_tokens} tokens per replica; the workload asks for "
                f"{wl.concurrency or 1} concurrent requests of {min(wl.context_length or flags.max_model_len, flags.max_model_len)} "
                "tokens.")
    arithmetic = ""
    if failure.kind in (FailureKind.WEIGHTS_DO_NOT_FIT, FailureKind.CUDA_OOM_STARTUP, FailureKind.NO_KV_CACHE_MEMORY,
                        FailureKind.KV_CACHE_TOO_SMALL):
        overhead = round(mem.non_torch_gib + (mem.cudagraph_gib if profile.cudagraph_subtracted else 0.0)
                         + mem.persistent_gib, 2)
        one = round(pred.kv_bytes_per_token * flags.max_model_len / 2**30, 2)
        need = round(mem.weights_gib + mem.activation_gib + overhead + one, 2)
        if need > mem.requested_gib:
            arithmetic = (f"weights {mem.weights_gib:.2f} GiB + activation {mem.activation_gib:.2f} + overhead "
                          f"{overhead:.2f} + KV cache for one request of {flags.max_model_len} tokens {one:.2f} = "
                          f"{need:.2f} GiB > budget {mem.requested_gib:.2f} GiB (gpu-memory-utilization "
                          f"{flags.gpu_memory_utilization} × {mem.gpu_total_gib:.2f} GiB) on each of {gpus} GPU(s).")
        elif failure.kind == FailureKind.CUDA_OOM_STARTUP:
            context = round(mem.headroom_gib, 2)
            arithmetic = (f"the budget {mem.requested_gib:.2f} GiB fits, but CUDA graphs ({mem.cudagraph_gib:.2f} GiB) "
                          f"and the CUDA context are captured outside it, in the {context:.2f} GiB left of "
                          f"{mem.gpu_total_gib:.2f} GiB on each of {gpus} GPU(s), and do not fit there.")
    if failure.kind == FailureKind.CUDA_OOM_STARTUP:
        return arithmetic or "a CUDA allocation would fail during startup (torch.OutOfMemoryError)."
    said = f"vLLM would print: {failure.message}"
    return f"{arithmetic} {said}" if arithmetic else said


class _Attempt(Protocol):
    """Plans a changed request; the Option when it starts (and is usable, if asked), else None. Each summary once."""

    def __call__(self, summary: str, changed: PlanRequest, kind: str = "gpus") -> Option | None: ...


def _attempter(request: PlanRequest, profile: VersionProfile, usable_only: bool) -> _Attempt:
    seen: set[str] = set()

    def attempt(summary: str, changed: PlanRequest, kind: str = "gpus") -> Option | None:
        if budget.out_of_budget():  # the spec's planning budget is spent: keep the options found so far
            return None
        best, starts, _ = _choose(changed, profile)
        if not starts or (usable_only and shortfalls(changed, best.flags)) or summary in seen:
            return None
        seen.add(summary)
        flags = _explicit_flags(changed, best.flags, profile)
        return Option(summary=summary, kind=kind, changes=_changes(request, changed, best.flags), flags=flags,
                      gpu=changed.gpu.name, gpu_count=_gpus(best), kv_cache_tokens=best.prediction.kv_cache_tokens,
                      max_model_len=best.flags.max_model_len, max_concurrency=best.prediction.max_concurrency)

    return attempt


def _options(request: PlanRequest, profile: VersionProfile, usable_only: bool = False) -> Iterable[Option]:
    """Concrete alternatives from the GPU catalog that would fit (and be usable, when the plan itself only starts
    degenerate), each planned for real and saying what it changes beyond the GPUs. One step per kind of change, in
    the order they are offered."""
    with budget.phase("options"):
        return _options_within_budget(request, profile, usable_only)


def _options_within_budget(request: PlanRequest, profile: VersionProfile, usable_only: bool) -> list[Option]:
    attempt = _attempter(request, profile, usable_only)
    found: list[Option] = []
    found.extend(_unpinned_options(request, attempt))
    found.extend(_more_gpus_option(request, attempt))
    found.extend(_shorter_context_option(request, attempt))
    found.extend(_fp8_kv_option(request, attempt))
    found.extend(_quantized_options(request, attempt))
    found.extend(_one(_larger_gpu(request, attempt)))
    return rank_options(found)


#: How much an option asks the user to change, least first (issue 23): flags and context on the same GPUs, more of the
#: same GPUs, another pool of this cluster, another checkpoint; GPUs the cluster lacks come last, whatever they are.
_OPTION_TIER = {"flags": 0, "context": 0, "gpus": 1, "nodes": 1, "pool": 2, "quantized-checkpoint": 3,
                "larger-gpu": 4}


def option_spans_nodes(option: Option) -> bool:
    return option.kind == "nodes"


def rank_options(options: Iterable[Option], *, in_cluster: bool = False) -> list[Option]:
    """Options by what the user must change least: the same GPUs first, then fewer nodes and GPUs, then other pools
    of this cluster, then another checkpoint, then GPUs the cluster lacks (`in_cluster`: every option whose source
    is not the cluster). A multi-node option never ranks above a single-node one (of the cluster's GPUs). Stable:
    equal options keep the order they were found in."""
    listed = list(options)

    def key(pair: tuple[int, Option]) -> tuple[int, int, int, int, int]:
        index, option = pair
        lacking = option.kind == "larger-gpu" or (in_cluster and option.source != "cluster")
        return (int(lacking), int(option_spans_nodes(option)), _OPTION_TIER.get(option.kind, 4), option.gpu_count,
                index)

    return [option for _, option in sorted(enumerate(listed), key=key)]


def _one(option: Option | None) -> list[Option]:
    return [option] if option else []


def _unpinned_options(request: PlanRequest, attempt: _Attempt) -> list[Option]:
    """A pinned flag that cannot work: what the planner would choose instead, one flag at a time."""
    found: list[Option] = []
    for name in _UNPINNABLE:
        value = getattr(request.pinned, name)
        if value is None:
            continue
        relaxed_pins = request.pinned.model_copy(update={name: None})
        option = attempt(f"unpin {name.replace('_', '-')} (pinned {value})",
                         request.model_copy(update={"pinned": relaxed_pins}), kind="flags")
        if option:
            option.summary = (f"Change the pinned {name.replace('_', '-')} from {value} to "
                              f"{option.flags.get(name, 'vLLM default')}")
            found.append(option)
    return found


def _more_gpus_option(request: PlanRequest, attempt: _Attempt) -> list[Option]:
    """More GPUs of the same kind: the smallest count (2, 4, 8) above the request's that fits."""
    if request.pinned.tensor_parallel_size or request.gpu.is_mig:  # a process sees one MIG slice
        return []
    for count in (2, 4, 8):
        if count > request.gpu_count:
            option = attempt(f"Use {count}× {request.gpu.name} with tensor parallelism",
                             request.model_copy(update={"gpu_count": count}))
            if option:
                return [option]
    return []


def _shorter_context_option(request: PlanRequest, attempt: _Attempt) -> list[Option]:
    """A shorter context, if the pinned length (or the workload's) is what breaks it; else fewer concurrent
    requests of the workload's length."""
    if not (request.pinned.max_model_len or request.workload.context_length):
        return []
    relaxed = request.model_copy(update={
        "pinned": request.pinned.model_copy(update={"max_model_len": None}),
        "workload": Workload(prefix_caching=request.workload.prefix_caching)})
    option = attempt("Unpin max-model-len and let the planner size the context", relaxed, kind="context")
    if option is None:
        return []
    pinned_len = request.pinned.max_model_len
    wanted = (pinned_len if isinstance(pinned_len, int) else None) or request.workload.context_length or 0
    if option.max_model_len < wanted:
        option.summary = f"Shorter context: max-model-len {option.max_model_len}"
        return [option]
    if request.workload.concurrency and request.workload.context_length:
        per_request = min(request.workload.context_length, option.max_model_len)
        holds = int(option.max_concurrency * option.max_model_len / per_request)
        if holds >= 1:
            option.summary = (f"Fewer concurrent requests: the KV cache holds about {holds} requests of "
                              f"{per_request} tokens (the workload asks for {request.workload.concurrency})")
            return [option]
    return []


def _fp8_kv_option(request: PlanRequest, attempt: _Attempt) -> list[Option]:
    if request.pinned.kv_cache_dtype not in (None, "auto") or not _supports_fp8_kv(request.gpu):
        return []
    return _one(attempt("fp8 KV cache (--kv-cache-dtype fp8)", request.model_copy(update={
        "pinned": request.pinned.model_copy(update={"kv_cache_dtype": "fp8"})}), kind="flags"))


def _quantized_options(request: PlanRequest, attempt: _Attempt) -> list[Option]:
    """Quantized weights: FP8 online where the GPU has it, the catalog's quantized checkpoints of this model (or,
    when it has none, a generic quantized variant)."""
    arch = request.arch
    if arch.quantization is not None or request.pinned.quantization is not None:
        return []
    found: list[Option] = []
    if request.gpu.fp8:
        found.extend(_one(attempt("Quantize weights to FP8 online (--quantization fp8) or use an FP8 checkpoint",
                                  request.model_copy(update={"pinned": request.pinned.model_copy(
                                      update={"quantization": "fp8"})}), kind="flags")))
    named: list[Option] = []
    for variant in catalog_quantized_variants(arch):
        if not _kernels_for(variant, request.gpu):
            continue
        method = variant.quantization.method if variant.quantization else "quantized"
        named.extend(_one(attempt(f"Use the quantized checkpoint {variant.model_id} ({method}, "
                                  f"{checkpoint_bytes(variant) / 2**30:.1f} GiB of weights; a separate model from "
                                  "the catalog)", request.model_copy(update={"arch": variant}),
                                  "quantized-checkpoint")))
    found.extend(named)
    if not named:
        found.extend(_one(_quantized_variant(request, attempt)))
    return found


def _changes(request: PlanRequest, changed: PlanRequest, flags: EngineFlags) -> list[str]:
    """What an option changes beyond the GPUs: everything a user would notice in quality, speed or checkpoint."""
    out: list[str] = []
    if flags.kv_cache_dtype != "auto" and flags.kv_cache_dtype != (request.pinned.kv_cache_dtype or "auto"):
        out.append(f"KV cache dtype {flags.kv_cache_dtype} (small quality cost)")
    if changed.pinned.quantization != request.pinned.quantization:
        out.append(f"weights quantized online (--quantization {changed.pinned.quantization})")
    if changed.arch is not request.arch and changed.arch.quantization != request.arch.quantization:
        out.append("a different (quantized) checkpoint")
    if flags.enforce_eager and not request.pinned.enforce_eager:
        out.append("--enforce-eager (no CUDA graphs: slower decode)")
    for name in _UNPINNABLE:
        before, after = getattr(request.pinned, name), getattr(changed.pinned, name)
        if before is not None and after is None:
            out.append(f"unpins {name.replace('_', '-')}")
    return out


_SHAPE = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "vocab_size", "derived_max_model_len")


def catalog_quantized_variants(arch: ModelArch) -> list[ModelArch]:
    """Quantized checkpoints of this model in the built-in model catalog: the same architecture (layers, widths,
    heads, vocabulary, context; the MLP width within 1 %) and the same numbered words in the name (version and size:
    Llama-3.3 is not Llama-3.1), with a quantization_config."""
    if arch.quantization is not None:
        return []
    numbers = set(_name_numbers(arch.model_id))
    return [variant for variant in _catalog_archs() if variant.quantization is not None
            and all(getattr(variant, f) == getattr(arch, f) for f in _SHAPE)
            and abs((variant.intermediate_size or 0) - (arch.intermediate_size or 0))
            <= 0.01 * (arch.intermediate_size or 0)  # AWQ pads the MLP width (Qwen2.5-72B: 29568 → 29696)
            and numbers <= set(_name_numbers(variant.model_id))]


def _kernels_for(variant: ModelArch, gpu: GPUSpec) -> bool:
    """Whether vLLM has kernels for this checkpoint's weights on the GPU: FP8 weights need Ampere or newer (Marlin
    FP8 on 8.0-8.6, native from 8.9); 4-bit AWQ/GPTQ and int8 run from Turing (7.5)."""
    cc = gpu.compute_capability_tuple
    if cc is None:
        return True
    fp8 = "fp8" in variant.model_id.lower() or (variant.quantization is not None and "fp8" in variant.quantization.method)
    return cc >= ((8, 0) if fp8 else (7, 5))


def _name_numbers(model_id: str) -> list[str]:
    return [token for token in re.split(r"[-_\s]+", model_id.rsplit("/", 1)[-1].lower()) if re.search(r"\d", token)]


@functools.lru_cache(maxsize=1)
def _catalog_archs() -> tuple[ModelArch, ...]:
    """Every model of the built-in catalog (package data, read like the GPU catalog: no network)."""
    from .arch import arch_from_config

    archs = []
    for path in sorted(resources.files("vllm_operator.catalog").joinpath("models").iterdir(), key=lambda p: p.name):
        if not path.name.endswith(".json"):
            continue
        row = json.loads(path.read_text(encoding="utf-8"))
        try:
            archs.append(arch_from_config(row["config"], model_id=row["model_id"], total_size=row.get("total_size"),
                                          total_size_estimated=bool(row.get("total_size_estimated"))))
        except (ArchError, KeyError, TypeError, ValueError):
            continue  # a row the planner cannot read is not offered
    return tuple(archs)


def _quantized_variant(request: PlanRequest, attempt: _Attempt) -> Option | None:
    """A 4-bit (AWQ/GPTQ) checkpoint of the same model: weights ≈ 0.52 B/param outside embeddings."""
    from .arch import Quantization, checkpoint_bytes

    arch = request.arch
    embed = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    body = max(arch.param_count - embed, 0)
    size = int(body * 0.5195 + embed * 2)
    if size >= checkpoint_bytes(arch):
        return None
    variant = arch.model_copy(update={
        "quantization": Quantization(method="awq", weight_bits=4, group_size=128), "total_size": size,
        "total_size_estimated": True, "dtype": "float16"})
    option: Option | None = attempt(f"Use a 4-bit AWQ/GPTQ checkpoint of {arch.model_id} (about "
                                    f"{size / 2**30:.1f} GiB of weights)", request.model_copy(update={"arch": variant}),
                                    "quantized-checkpoint")
    return option


def offered_as_larger(gpu: GPUSpec) -> bool:
    """Whether "a GPU the cluster lacks" may name this catalog row: a whole datacenter GPU a Linux node runs. A WSL2
    row (a Windows desktop), a laptop or desktop card (tier consumer/workstation), a UMA part (GB10, GH200: host
    memory counts) or a MIG slice is a way the user's own machine is described, not a GPU a cluster adds."""
    return gpu.tier == "datacenter" and gpu.host == "linux" and not gpu.uma and not gpu.is_mig


def _larger_gpu(request: PlanRequest, attempt: _Attempt) -> Option | None:
    from .gpus import load_gpu_catalog

    catalog = load_gpu_catalog()
    bigger = sorted((g for g in catalog if g.reported_gib > request.gpu.reported_gib and offered_as_larger(g)),
                    key=lambda g: g.reported_gib)
    weights_gib = checkpoint_bytes(request.arch) / 2**30 / max(request.gpu_count, 1)
    tried: list[float] = []
    for gpu in bigger:
        if gpu.reported_gib < weights_gib or any(abs(gpu.reported_gib - size) < 1.0 for size in tried):
            continue  # the weights alone exceed it, or a GPU of the same size did not fit
        tried.append(gpu.reported_gib)
        option: Option | None = attempt(f"Use a larger GPU: {gpu.name} ({gpu.reported_gib:.0f} GiB)",
                                        request.model_copy(update={"gpu": gpu}), "larger-gpu")
        if option:
            return option
    return None


def with_vllm_defaults(request: PlanRequest) -> PlanRequest:
    """The request with every unpinned flag set to what vLLM itself would use when the flag is absent.

    This is how a record of a real run is replayed (the run used vLLM's defaults for what it did not set), and the
    baseline "vLLM's defaults" that the operator is compared against.
    """
    profile = profile_for(request.vllm_version)
    pinned = request.pinned
    derived = arch_for_release(request.arch, profile).derived_max_model_len
    # `auto`: vLLM sizes its batch defaults at the derived length, before the KV cache is fitted
    length = derived if pinned.max_model_len in (None, MAX_MODEL_LEN_AUTO) else int(pinned.max_model_len)
    defaults = batch_defaults(profile, gpu_memory_gib=request.gpu.reported_gib, is_a100=request.gpu.is_a100,
                              compute_capability=request.gpu.compute_capability,
                              max_model_len=length, chunked_prefill=pinned.enable_chunked_prefill is not False)
    filled = pinned.model_copy(update={
        "tensor_parallel_size": pinned.tensor_parallel_size or 1,
        "pipeline_parallel_size": pinned.pipeline_parallel_size or 1,
        "gpu_memory_utilization": pinned.gpu_memory_utilization or profile.default_utilization,
        "max_model_len": pinned.max_model_len or length,
        "max_num_seqs": pinned.max_num_seqs or defaults.max_num_seqs,
        "max_num_batched_tokens": pinned.max_num_batched_tokens or defaults.max_num_batched_tokens,
        "kv_cache_dtype": pinned.kv_cache_dtype or "auto",
        "enforce_eager": bool(pinned.enforce_eager),
    })
    defaulted = frozenset(name for name in ("tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization",
                                             "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                                             "kv_cache_dtype", "enforce_eager") if getattr(pinned, name) is None)
    return request.model_copy(update={"pinned": filled, "vllm_defaults": request.vllm_defaults | defaulted})
