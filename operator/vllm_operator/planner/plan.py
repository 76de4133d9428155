"""Choose vLLM flags for a model on a GPU, and explain every choice.

`plan(request)` keeps every pinned flag exactly, fills the rest (tensor-parallel size, utilization, max-model-len,
max-num-seqs; fp8 KV or enforce-eager only when they decide between fitting and not), predicts vLLM's startup
with `memory.predict_startup`, and, when nothing fits, lists concrete options that would, each with its figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .arch import ModelArch, dtype_bytes
from .failures import FailureKind
from .gpus import GPUSpec
from .lora import MAX_LORA_VOCAB, LoRASlots, adapter_bytes_per_stage, vocab_too_large
from .memory import (
    EngineFlags,
    GPUFacts,
    MemoryBreakdown,
    PredictedFailure,
    StartupPrediction,
    cudagraph_bytes,
    init_nontorch_gib,
    pp_layer_counts,
    predict_startup,
)
from .versions import VersionProfile, batch_defaults, profile_for

_TP_CHOICES = (1, 2, 4, 8, 16)
_FP8_KV_GPUS_MIN_CC = 8.9
_MARGIN_GIB = 0.25          # slack kept below what other tenants leave free
_MIN_USEFUL_LEN = 1024
_UNPINNABLE = ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "max_num_seqs",
               "max_num_batched_tokens", "kv_cache_dtype", "enforce_eager", "block_size")


class PinnedFlags(BaseModel):
    """vLLM flags the user fixed (snake_case, as vLLM names them). None = the planner chooses."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tensor_parallel_size: int | None = Field(None, ge=1)
    pipeline_parallel_size: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    max_model_len: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    dtype: str | None = None
    enforce_eager: bool | None = None
    block_size: int | None = Field(None, ge=1)
    cpu_offload_gb: float | None = Field(None, ge=0)
    kv_cache_memory_bytes: int | None = Field(None, ge=1)
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    # LoRA (spec.lora or flags.enableLora/maxLoraRank): sizes the adapter slots vLLM reserves (planner/lora.py)
    enable_lora: bool | None = None
    max_lora_rank: int | None = Field(None, ge=1)
    max_loras: int | None = Field(None, ge=1)
    lora_modules: tuple[str, ...] | None = None

    def pinned_names(self) -> list[str]:
        return [name for name, value in self.model_dump().items() if value is not None]


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


class PlanRequest(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    arch: ModelArch
    gpu: GPUSpec
    gpu_count: int = Field(1, ge=1, description="GPUs one replica may use (TP x PP at most this)")
    pinned: PinnedFlags = PinnedFlags()
    workload: Workload = Workload()
    constraints: Constraints = Constraints()
    vllm_version: str | None = None
    gpu_free_gib: float | None = Field(None, ge=0, description="free memory per GPU when vLLM starts, if others hold some")


class Option(BaseModel):
    """An alternative that would fit, with its figures."""

    summary: str
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
    vllm_version: str
    fits: bool
    flags: dict[str, Any] = Field(description="vLLM flags, snake_case, the ones we pass explicitly")
    pinned: list[str]
    prediction: StartupPrediction
    failure: PredictedFailure | None
    reasons: list[str]
    options: list[Option] = []

    @property
    def memory(self) -> MemoryBreakdown:
        return self.prediction.memory

    def args(self) -> list[str]:
        """The flags as vLLM command-line arguments."""
        return flags_to_args(self.flags)


def flags_to_args(flags: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if value:
                args.append(flag)
            elif name in ("enable_prefix_caching", "enable_chunked_prefill"):
                args.append("--no-" + name.replace("_", "-"))
        elif value is not None:
            args.extend([flag, str(value)])
    return args


def _free_gib(request: PlanRequest) -> float | None:
    """Free memory per GPU at startup: what the user said, else what a failed start reported."""
    if request.gpu_free_gib is not None:
        return request.gpu_free_gib
    return request.constraints.gpu_free_gib


def _facts(request: PlanRequest, tp: int) -> GPUFacts:
    total = request.gpu.reported_gib
    other = 0.0
    free = _free_gib(request)
    if free is not None:
        own_init = init_nontorch_gib(tp, request.gpu.nvlink)
        other = max(total - free - own_init, 0.0)
    return GPUFacts(total_gib=total, other_used_gib=other, uma=request.gpu.uma, nvlink=request.gpu.nvlink)


def _valid_tp(arch: ModelArch, tp: int) -> bool:
    if arch.num_heads % tp:
        return False
    if not arch.is_mla:
        kv = arch.num_kv_heads
        if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            return False
    return not any(size and size % tp for size in (arch.vocab_size, arch.intermediate_size, arch.moe_intermediate_size))


class _Candidate:
    """One assignment of the free flags, with its prediction."""

    def __init__(self, flags: EngineFlags, prediction: StartupPrediction, notes: list[str]) -> None:
        self.flags = flags
        self.prediction = prediction
        self.notes = notes


def _utilization(request: PlanRequest, profile: VersionProfile, tp: int, arch: ModelArch,
                 eager: bool, reasons: list[str]) -> float:
    pinned = request.pinned.gpu_memory_utilization
    if pinned is not None:
        reasons.append(f"gpu-memory-utilization {pinned} is pinned.")
        return pinned
    gpu = request.gpu
    util = gpu.default_utilization
    why = f"gpu-memory-utilization {util:.2f}: the headroom we keep on {gpu.tier} GPUs like the {gpu.name}"
    total = gpu.reported_gib
    init = init_nontorch_gib(tp, gpu.nvlink)
    if not profile.cudagraph_subtracted and not eager:
        # before v0.21 CUDA graphs are captured in the headroom outside the budget
        probe = EngineFlags(tensor_parallel_size=tp, max_model_len=1, max_num_seqs=1, max_num_batched_tokens=1,
                            enforce_eager=eager)
        graphs = cudagraph_bytes(arch, probe, profile, arch.num_layers // max(request.pinned.pipeline_parallel_size
                                                                               or 1, 1)) / 2**30
        cap = 1 - (init + graphs + _MARGIN_GIB) / total
        if util > cap:
            util = cap
            why += (f", lowered to {cap:.2f} so that vLLM {profile.version}'s CUDA graphs ({graphs:.2f} GiB) and the "
                    f"CUDA context ({init:.2f} GiB) fit beside the budget")
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


def _build_flags(request: PlanRequest, profile: VersionProfile, tp: int, pp: int, util: float, kv_dtype: str,
                 eager: bool, max_model_len: int, max_num_seqs: int | None) -> EngineFlags:
    pinned = request.pinned
    defaults = batch_defaults(profile, gpu_memory_gib=request.gpu.reported_gib, is_a100=request.gpu.is_a100,
                              max_model_len=max_model_len,
                              chunked_prefill=pinned.enable_chunked_prefill is not False)
    seqs = pinned.max_num_seqs or max_num_seqs or defaults.max_num_seqs
    tokens = pinned.max_num_batched_tokens or defaults.max_num_batched_tokens
    if request.constraints.max_num_batched_tokens and not pinned.max_num_batched_tokens:
        tokens = min(tokens, request.constraints.max_num_batched_tokens)
    if request.constraints.max_num_seqs and not pinned.max_num_seqs:
        seqs = min(seqs, request.constraints.max_num_seqs)
    return EngineFlags(
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
        max_loras=(pinned.max_loras or 1) if pinned.enable_lora else 0,
        max_lora_rank=pinned.max_lora_rank or 16,
    )


def _predict(request: PlanRequest, profile: VersionProfile, flags: EngineFlags) -> StartupPrediction:
    arch = request.arch
    extra = request.constraints.extra_activation_gib
    prediction = predict_startup(arch, flags, _facts(request, flags.tensor_parallel_size), profile)
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
        return capacity >= wl.concurrency
    return True


def profile_tokens_are_capacity(prediction: StartupPrediction, flags: EngineFlags) -> bool:
    """Whether the window-aware capacity should be used (hybrid sliding-window models)."""
    return prediction.max_concurrency * flags.max_model_len > prediction.kv_cache_tokens * 1.05


def _candidate(request: PlanRequest, profile: VersionProfile, tp: int, pp: int, kv_dtype: str,
               eager: bool) -> _Candidate:
    """Fill max_model_len and max_num_seqs for one (tp, pp, kv dtype, eager) choice."""
    notes: list[str] = []
    arch = request.arch
    util = _utilization(request, profile, tp, arch, eager, notes)
    pinned_len = request.pinned.max_model_len
    target = pinned_len or _length_target(request)
    flags = _build_flags(request, profile, tp, pp, util, kv_dtype, eager, target, None)
    prediction = _predict(request, profile, flags)
    if pinned_len is None:
        fit = min(prediction.estimated_max_model_len, target)
        if fit < min(_MIN_USEFUL_LEN, target):
            length = target  # not even a short request fits: keep the target and let the failure say why
            notes.append(f"max-model-len {length}: not even {min(_MIN_USEFUL_LEN, target)} tokens of KV cache fit "
                         f"in what is left per GPU ({prediction.memory.kv_cache_gib:.2f} GiB).")
        elif fit < target:
            length = _round_len(fit)
            notes.append(
                f"max-model-len {length}: the model allows {arch.derived_max_model_len}, but one request of that "
                f"length needs more KV cache than the {prediction.memory.kv_cache_gib:.2f} GiB left per GPU; "
                f"{fit} tokens is the longest that fits (vLLM's own estimate), rounded down.")
        else:
            length = target
            notes.append(f"max-model-len {length}: the model's full context fits in the KV cache.")
        if length >= 1:
            flags = _build_flags(request, profile, tp, pp, util, kv_dtype, eager, length, None)
            prediction = _predict(request, profile, flags)
    else:
        notes.append(f"max-model-len {pinned_len} is pinned.")
    if request.pinned.max_num_seqs is None and prediction.failure is None:
        seqs = _size_max_num_seqs(request, prediction, flags, notes)
        if seqs != flags.max_num_seqs:
            flags = _build_flags(request, profile, tp, pp, util, kv_dtype, eager, flags.max_model_len, seqs)
            prediction = _predict(request, profile, flags)
    elif request.pinned.max_num_seqs is not None:
        notes.append(f"max-num-seqs {request.pinned.max_num_seqs} is pinned.")
    return _Candidate(flags, prediction, notes)


def _size_max_num_seqs(request: PlanRequest, prediction: StartupPrediction, flags: EngineFlags,
                       notes: list[str]) -> int:
    """As many sequences as the KV cache holds at the typical request length, not vLLM's 256/1024."""
    typical = request.workload.context_length or min(flags.max_model_len,
                                                     request.workload.typical_request_tokens or 2048)
    capacity = int(prediction.max_concurrency * flags.max_model_len / typical) if typical else flags.max_num_seqs
    seqs = max(1, min(flags.max_num_seqs, capacity))
    if request.constraints.max_num_seqs:
        seqs = min(seqs, request.constraints.max_num_seqs)
    if seqs < flags.max_num_seqs:
        notes.append(
            f"max-num-seqs {seqs}: the KV cache holds about {capacity} requests of {typical} tokens; vLLM's default "
            f"of {flags.max_num_seqs} would admit more than fit and preempt under load.")
    else:
        notes.append(
            f"max-num-seqs {seqs}: vLLM's default; the KV cache holds about {capacity} requests of {typical} tokens.")
    return seqs


def _tp_candidates(request: PlanRequest) -> list[int]:
    pinned = request.pinned.tensor_parallel_size
    if pinned:
        return [pinned]
    pp = request.pinned.pipeline_parallel_size or 1
    low = request.constraints.min_tensor_parallel_size or 1
    return [tp for tp in _TP_CHOICES if low <= tp and tp * pp <= request.gpu_count and _valid_tp(request.arch, tp)]


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


def plan(request: PlanRequest) -> Plan:
    """The flags to run `request.arch` on `request.gpu`, with the predicted startup and the reasons."""
    profile = profile_for(request.vllm_version)
    first: _Candidate | None = None
    chosen: _Candidate | None = None
    for candidate in _search(request, profile):
        first = first or candidate
        if candidate.prediction.failure is None and _workload_ok(request, candidate.prediction, candidate.flags):
            chosen = candidate
            break
    result = chosen or first
    assert result is not None
    reasons = _reasons(request, profile, result, chosen is not None)
    flags = _explicit_flags(request, result.flags, profile)
    failure = result.prediction.failure
    wanted = request.workload.context_length
    if chosen is None and wanted and wanted > request.arch.derived_max_model_len:
        failure = PredictedFailure(
            kind=FailureKind.MAX_MODEL_LEN_TOO_LONG,
            message=f"The workload's context length ({wanted}) is longer than the model's own maximum "
                    f"({request.arch.derived_max_model_len}, from config.json); lower it or pick a model with a "
                    "longer context.")
    if chosen is None and failure is None:
        failure = PredictedFailure(kind=FailureKind.KV_CACHE_TOO_SMALL, message=_workload_message(request, result))
    options = [] if chosen is not None else list(_options(request, profile))
    return Plan(
        model_id=request.arch.model_id,
        gpu=request.gpu.name,
        gpu_count=result.flags.tensor_parallel_size * result.flags.pipeline_parallel_size,
        vllm_version=profile.version,
        fits=chosen is not None,
        flags=flags,
        pinned=request.pinned.pinned_names(),
        prediction=result.prediction,
        failure=failure,
        reasons=reasons,
        options=options,
    )


def _workload_message(request: PlanRequest, candidate: _Candidate) -> str:
    wl = request.workload
    pred = candidate.prediction
    return (f"The KV cache holds {pred.kv_cache_tokens} tokens ({pred.max_concurrency:.2f} requests of "
            f"{candidate.flags.max_model_len}); the workload asks for {wl.concurrency or 1} concurrent requests of "
            f"{wl.context_length or candidate.flags.max_model_len} tokens.")


def _explicit_flags(request: PlanRequest, flags: EngineFlags, profile: VersionProfile) -> dict[str, Any]:
    """The flags we pass on the command line: what we chose plus everything pinned, in a stable order."""
    out: dict[str, Any] = {
        "tensor_parallel_size": flags.tensor_parallel_size,
        "gpu_memory_utilization": flags.gpu_memory_utilization,
        "max_model_len": flags.max_model_len,
        "max_num_seqs": flags.max_num_seqs,
    }
    if flags.pipeline_parallel_size > 1 or request.pinned.pipeline_parallel_size:
        out["pipeline_parallel_size"] = flags.pipeline_parallel_size
    defaults = batch_defaults(profile, gpu_memory_gib=request.gpu.reported_gib, is_a100=request.gpu.is_a100,
                              max_model_len=flags.max_model_len)
    if request.pinned.max_num_batched_tokens or flags.max_num_batched_tokens != defaults.max_num_batched_tokens:
        out["max_num_batched_tokens"] = flags.max_num_batched_tokens
    if flags.kv_cache_dtype != "auto" or request.pinned.kv_cache_dtype:
        out["kv_cache_dtype"] = flags.kv_cache_dtype
    if flags.enforce_eager or request.pinned.enforce_eager is not None:
        out["enforce_eager"] = flags.enforce_eager
    for name, value in request.pinned.model_dump().items():
        if value is not None and name not in out:
            out[name] = value
    if request.workload.prefix_caching is not None and "enable_prefix_caching" not in out:
        out["enable_prefix_caching"] = request.workload.prefix_caching
    return out


def lora_reason(arch: ModelArch, flags: EngineFlags) -> str:
    """What the adapter slots cost, per GPU (they are part of the weights figure and come out of the KV cache)."""
    dtype = dtype_bytes(flags.dtype) if flags.dtype not in ("auto", "") else min(dtype_bytes(arch.dtype), 2)
    slots = LoRASlots(max_loras=flags.max_loras, max_rank=flags.max_lora_rank, dtype_bytes=dtype)
    estimate = adapter_bytes_per_stage(arch, slots, flags.tensor_parallel_size,
                                       pp_layer_counts(arch.num_layers, flags.pipeline_parallel_size))
    text = (f"LoRA: {flags.max_loras} adapter slot(s) at rank {flags.max_lora_rank} reserve "
            f"{max(estimate.per_stage) / 2**30:.2f} GiB per GPU while the model loads (counted in the weights, "
            "taken from the KV cache)")
    if vocab_too_large(arch):
        text += (f"; vLLM refuses LoRA on an LM head of more than {MAX_LORA_VOCAB} tokens ({arch.vocab_size} here): "
                 "the server will not start with --enable-lora")
    return text + (f"; {estimate.note}." if estimate.note else ".")


def _reasons(request: PlanRequest, profile: VersionProfile, candidate: _Candidate, fits: bool) -> list[str]:
    arch, gpu, flags, pred = request.arch, request.gpu, candidate.flags, candidate.prediction
    mem = pred.memory
    reasons = [
        f"Model {arch.model_id}: {arch.family}, {arch.num_layers} layers, {arch.num_kv_heads} KV heads × "
        f"{arch.head_dim}, {mem.weights_gib:.2f} GiB of weights per GPU at TP={flags.tensor_parallel_size}.",
        f"GPU {gpu.name}: vLLM sees {gpu.reported_gib:.2f} GiB. vLLM {profile.version} ({profile.engine} engine) "
        f"sizes memory by the rules of releases since {profile.since}: {profile.note}.",
    ]
    tp = flags.tensor_parallel_size
    if request.pinned.tensor_parallel_size:
        reasons.append(f"tensor-parallel-size {tp} is pinned.")
    elif not fits:
        reasons.append(f"tensor-parallel-size {tp}: no size up to the {request.gpu_count} GPU(s) allowed fits.")
    elif tp == 1:
        reasons.append("tensor-parallel-size 1: the model fits on one GPU.")
    else:
        smaller = [t for t in _TP_CHOICES if t < tp and _valid_tp(arch, t)]
        reasons.append(
            f"tensor-parallel-size {tp}: the smallest valid size that fits "
            f"(tried {', '.join(map(str, smaller)) or 'none smaller'}; sizes must divide {arch.num_heads} attention "
            f"heads and {arch.num_kv_heads} KV heads).")
    reasons.extend(candidate.notes)
    if flags.max_loras:
        reasons.append(lora_reason(arch, flags))
    if flags.kv_cache_dtype in ("fp8", "fp8_e4m3", "fp8_e5m2") and not request.pinned.kv_cache_dtype:
        reasons.append("kv-cache-dtype fp8: with 16-bit KV the plan does not fit; fp8 halves KV bytes per token "
                       "(small quality cost).")
    defaults = batch_defaults(profile, gpu_memory_gib=request.gpu.reported_gib, is_a100=request.gpu.is_a100,
                              max_model_len=flags.max_model_len)
    if request.pinned.max_num_batched_tokens:
        reasons.append(f"max-num-batched-tokens {flags.max_num_batched_tokens} is pinned.")
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
    reasons.append(
        f"Budget per GPU: {mem.requested_gib:.2f} GiB requested = {mem.weights_gib:.2f} weights + "
        f"{mem.activation_gib:.2f} activation + {mem.non_torch_gib:.2f} non-torch"
        + (f" + {mem.cudagraph_gib:.2f} CUDA graphs" if profile.cudagraph_subtracted and mem.cudagraph_gib else "")
        + f" + {mem.kv_cache_gib:.2f} KV cache → {pred.kv_cache_tokens} tokens, "
          f"{pred.max_concurrency:.2f} concurrent requests of {flags.max_model_len}.")
    if not fits:
        reasons.append("Does not fit: " + (pred.failure.message if pred.failure else _workload_message(request,
                                                                                                     candidate)))
    return reasons


def _options(request: PlanRequest, profile: VersionProfile) -> Iterable[Option]:  # noqa: C901 - a case per way out
    """Concrete alternatives that would fit, each planned for real."""
    seen: set[str] = set()

    def attempt(summary: str, changed: PlanRequest) -> Option | None:
        first = None
        for candidate in _search(changed, profile):
            first = first or candidate
            if candidate.prediction.failure is None and _workload_ok(changed, candidate.prediction, candidate.flags):
                if summary in seen:
                    return None
                seen.add(summary)
                flags = _explicit_flags(changed, candidate.flags, profile)
                return Option(summary=summary, flags=flags, gpu=changed.gpu.name,
                              gpu_count=candidate.flags.tensor_parallel_size * candidate.flags.pipeline_parallel_size,
                              kv_cache_tokens=candidate.prediction.kv_cache_tokens,
                              max_model_len=candidate.flags.max_model_len,
                              max_concurrency=candidate.prediction.max_concurrency)
        return None

    arch = request.arch
    found: list[Option] = []
    # a pinned flag that cannot work: what the planner would choose instead, one flag at a time
    for name in _UNPINNABLE:
        value = getattr(request.pinned, name)
        if value is None:
            continue
        relaxed_pins = request.pinned.model_copy(update={name: None})
        option = attempt(f"unpin {name.replace('_', '-')} (pinned {value})",
                         request.model_copy(update={"pinned": relaxed_pins}))
        if option:
            option.summary = (f"Change the pinned {name.replace('_', '-')} from {value} to "
                              f"{option.flags.get(name, 'vLLM default')}")
            found.append(option)
    # more GPUs of the same kind
    if not request.pinned.tensor_parallel_size:
        for count in (2, 4, 8):
            if count > request.gpu_count:
                option = attempt(f"Use {count}× {request.gpu.name} with tensor parallelism",
                                 request.model_copy(update={"gpu_count": count}))
                if option:
                    found.append(option)
                    break
    # a shorter context, if the pinned length is what breaks it
    if request.pinned.max_model_len or request.workload.context_length:
        relaxed = request.model_copy(update={
            "pinned": request.pinned.model_copy(update={"max_model_len": None}),
            "workload": Workload(prefix_caching=request.workload.prefix_caching)})
        option = attempt("Unpin max-model-len and let the planner size the context", relaxed)
        wanted = request.pinned.max_model_len or request.workload.context_length or 0
        if option and option.max_model_len < wanted:
            option.summary = f"Shorter context: max-model-len {option.max_model_len}"
            found.append(option)
        elif option and request.workload.concurrency and request.workload.context_length:
            per_request = min(request.workload.context_length, option.max_model_len)
            holds = int(option.max_concurrency * option.max_model_len / per_request)
            if holds >= 1:
                option.summary = (f"Fewer concurrent requests: the KV cache holds about {holds} requests of "
                                  f"{per_request} tokens (the workload asks for {request.workload.concurrency})")
                found.append(option)
    # fp8 KV cache
    if request.pinned.kv_cache_dtype in (None, "auto") and _supports_fp8_kv(request.gpu):
        option = attempt("fp8 KV cache (--kv-cache-dtype fp8)", request.model_copy(update={
            "pinned": request.pinned.model_copy(update={"kv_cache_dtype": "fp8"})}))
        if option:
            found.append(option)
    # quantized weights
    if arch.quantization is None and request.pinned.quantization is None:
        if request.gpu.fp8:
            option = attempt("Quantize weights to FP8 online (--quantization fp8) or use an FP8 checkpoint",
                             request.model_copy(update={"pinned": request.pinned.model_copy(
                                 update={"quantization": "fp8"})}))
            if option:
                found.append(option)
        option = _quantized_variant(request, attempt)
        if option:
            found.append(option)
    # a larger GPU
    option = _larger_gpu(request, attempt)
    if option:
        found.append(option)
    return found


def _quantized_variant(request: PlanRequest, attempt: Any) -> Option | None:
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
                                    f"{size / 2**30:.1f} GiB of weights)", request.model_copy(update={"arch": variant}))
    return option


def _larger_gpu(request: PlanRequest, attempt: Any) -> Option | None:
    from .gpus import load_gpu_catalog

    catalog = load_gpu_catalog()
    bigger = sorted((g for g in catalog if g.reported_gib > request.gpu.reported_gib and not g.uma),
                    key=lambda g: g.reported_gib)
    for gpu in bigger:
        option: Option | None = attempt(f"Use a larger GPU: {gpu.name} ({gpu.reported_gib:.0f} GiB)",
                                        request.model_copy(update={"gpu": gpu}))
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
    length = pinned.max_model_len or request.arch.derived_max_model_len
    defaults = batch_defaults(profile, gpu_memory_gib=request.gpu.reported_gib, is_a100=request.gpu.is_a100,
                              max_model_len=length, chunked_prefill=pinned.enable_chunked_prefill is not False)
    filled = pinned.model_copy(update={
        "tensor_parallel_size": pinned.tensor_parallel_size or 1,
        "pipeline_parallel_size": pinned.pipeline_parallel_size or 1,
        "gpu_memory_utilization": pinned.gpu_memory_utilization or profile.default_utilization,
        "max_model_len": length,
        "max_num_seqs": pinned.max_num_seqs or defaults.max_num_seqs,
        "max_num_batched_tokens": pinned.max_num_batched_tokens or defaults.max_num_batched_tokens,
        "kv_cache_dtype": pinned.kv_cache_dtype or "auto",
        "enforce_eager": bool(pinned.enforce_eager),
    })
    return request.model_copy(update={"pinned": filled})
