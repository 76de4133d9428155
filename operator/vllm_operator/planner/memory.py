"""vLLM's startup memory arithmetic, per GPU, for fully resolved flags.

`predict_startup` answers: with these flags on this GPU and this vLLM release, what will the startup log say
(weights, activation peak, non-torch memory, CUDA-graph estimate, available KV memory, "GPU KV cache size: N
tokens", maximum concurrency) and does vLLM start — and if not, which error does it raise, with which numbers?

The budget follows `vllm/v1/worker/gpu_worker.py` (docs/research/vllm-memory-model.md §1; 0.22+ in
docs/research/vllm-0.27-0.33.md): requested = ceil(total × util); available KV = requested − weights − activation
peak − non-torch growth − (CUDA-graph estimate from v0.21, on the V1 runner; Model Runner V2 from 0.29) − (from 0.27:
MRV2 sampler state and allocator leftovers). Which model runner a release picks is decided per model
(`profile_for_model`).
The KV layout follows `kv_cache_interface.py`/`kv_cache_utils.py` (§2). The terms vLLM measures at run time
(activation, non-torch, CUDA graphs) are modelled from the architecture with per-release constants calibrated on
the startup logs in benchmarks/data (benchmarks/planner_accuracy.py reports the fit per era).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from ..api.v1alpha1 import MemoryBreakdown
from . import messages
from .arch import LayerKind, ModelArch, ceil_div, checkpoint_bytes, dtype_bytes, gib, lm_head_bytes_per_param
from .failures import FailureKind
from .lora import LoRASlots, adapter_bytes_per_stage
from .speculative import DraftMemory, Speculation, attention_layer_kinds, draft_memory
from .versions import Version, VersionProfile, profile_for, uses_v2_runner

GiB = 2**30
_FP8_KV = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla", "fp8_inc")
# Memory the CUDA context, cuBLAS and (at TP>=2) NCCL hold before vLLM takes its init snapshot (H100 logs:
# 79.19 - 78.68 free at TP=1; 79.19 - 77.18 at TP=2). It sits outside the util budget, in the headroom.
_INIT_NONTORCH_GIB = (0.51, 2.01)
# Activation model constants (torch bytes), fitted on v0.19 H100 logs; see module docstring.
_ACT_BASE_GIB = 0.087
_HIDDEN_KEPT_BYTES = 2.25     # hidden states of every batched token, alive through the sampler pass
_FWD_INTER_BYTES = 7.5        # gate/up projection + activation per token per intermediate unit (per GPU)
_FWD_HIDDEN_BYTES = 2.0
_MULTIMODAL_GIB = 0.2         # encoder profiling of one maximal multimodal item
# Fragmentation during CUDA-graph warm-up of MXFP4 MoE kernels, as a share of the activation peak
# (gpt-oss at util 0.95 on H100 fails graph capture in v0.19 at TP1 and TP2; at 0.90 it starts).
_MXFP4_WARMUP_SHARE = 1.0
# Model Runner V2's persistent sampler state (vllm/v1/worker/gpu/model_runner.py::load_model, 0.22+): output_bin_counts
# int32 [max_num_seqs × vocab] + prompt_bin_mask and the grammar bitmask, int32 [max_num_seqs × vocab/32] each.
_V2_SAMPLER_STATE_BYTES = 4 + 4 / 32 + 4 / 32
# Attention kernels want block sizes in multiples of 16 when a hybrid model's attention block grows to hold a mamba
# state page (model_executor/models/config.py::HybridAttentionMambaModelConfig.verify_and_update_config).
_KERNEL_BLOCK_ALIGNMENT = 16
# CUDA-graph capture sizes (config/vllm.py::VllmConfig._set_cudagraph_sizes, read in 0.28.0): the default largest
# size is min(2 x max_num_seqs x decode query length, 512; from 0.28 1024 on compute capability 10.x), capped at
# max_num_batched_tokens; sizes [1, 2, 4] + range(8, 256, 8) + range(256, largest + 1, 16), plus
# max_num_batched_tokens when it is below the largest. FULL decode graphs only up to max_num_seqs x query length
# (v1/cudagraph_dispatcher.py::initialize_cudagraph_keys; MRV2: gpu/cudagraph_utils.py, max_decode_tokens).
_CAPTURE_MAX_DEFAULT = 512
# The estimate is, per mode, the first (largest) capture plus (n - 1) x the second capture's growth
# (v1/worker/gpu_model_runner.py::profile_cudagraph_memory; MRV2 extrapolates the same way from 0.29). The model in
# `cudagraph_bytes` was fitted on v0.19 H100 logs that captured 51 PIECEWISE + 51 FULL graphs ("Profiling CUDA graph
# memory: PIECEWISE=51 (largest=512), FULL=51 (largest=512)"): its per-layer term is scaled by the graphs captured.
_CALIBRATED_EXTRA_GRAPHS = (51 - 1) + (51 - 1)
# NCCL memory of one pipeline-parallel communicator per GPU. distributed/parallel_state.py::initialize_model_parallel
# gives the PP group (every group of size > 1) a device communicator; its PyNcclCommunicator runs a warm-up
# all_reduce in __init__ (device_communicators/pynccl.py), so NCCL's buffers exist before vLLM's init snapshot
# (v1/worker/gpu_worker.py::init_device: "Initialize the distributed environment BEFORE taking memory snapshot"):
# outside the budget, in what the startup check sees as used. Model Runner V2 adds a sibling communicator for the
# sampled-token broadcast (v1/worker/gpu/pp_utils.py::PPHandler, make_sibling_device_group "pp_broadcast"), created
# after the snapshot and connected by NCCL at its first broadcast: in the 1 - util headroom once serving.
# ESTIMATE (NCCL's own buffers, no figure in vLLM's source): NVLink/NVSwitch GPUs 0.5 GiB per communicator, from
# issue 15's report of ~3.0 GiB per PP stage where the TP>=2 context measures 2.01 GiB (_INIT_NONTORCH_GIB): ~1.0 GiB
# for the two PP communicators of a Model Runner V2 stage (the runner of every model from 0.29); PCIe GPUs 0.25 GiB,
# the figure init_nontorch_gib books for a TP communicator without NVLink.
_PP_COMM_GIB = (0.5, 0.25)


class EngineFlags(BaseModel):
    """Every vLLM flag that changes memory, fully resolved (no 'auto' except dtypes)."""

    model_config = ConfigDict(frozen=True)

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str = "auto"
    dtype: str = "auto"
    quantization: str | None = None
    enforce_eager: bool = False
    block_size: int = 16
    cpu_offload_gb: float = 0.0
    kv_cache_memory_bytes: int | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    # LoRA (--enable-lora): adapter slots vLLM reserves at load time, see planner/lora.py; 0 = LoRA off
    max_loras: int = 0
    max_lora_rank: int = 16
    lora_moe_experts: bool = Field(True, description="the release gives fused MoE experts slots (lora.py, 0.11.1+)")
    speculative: Speculation | None = Field(None, description="`--speculative-config`, parsed (planner/speculative.py)")
    # MoE parallelism (pinned only): see moe_parallel_weights
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    # VLLM_PP_LAYER_PARTITION (an environment variable, not a flag): layers per pipeline stage; None = vLLM's split
    pp_layer_partition: tuple[int, ...] | None = None
    load_format: str = Field("auto", description="`--load-format`; 'ipc_cache' maps weights a weight-cache daemon "
                                                 "holds (zero-copy, vLLM 0.32+)")


class GPUFacts(BaseModel):
    """What vLLM sees of one GPU at startup."""

    model_config = ConfigDict(frozen=True)

    total_gib: float = Field(description="total memory as torch.cuda.mem_get_info reports it")
    other_used_gib: float = Field(0.0, description="memory held by other processes when vLLM starts")
    uma: bool = False
    nvlink: bool = True
    compute_capability: str | None = Field(None, description="e.g. '10.0'; 10.x captures more CUDA graphs (0.28+)")


class PredictedFailure(BaseModel):
    kind: FailureKind
    message: str


class StartupPrediction(BaseModel):
    memory: MemoryBreakdown
    kv_bytes_per_token: int = Field(description="KV bytes per token per GPU over all layers of the tightest stage")
    num_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    estimated_max_model_len: int = Field(description="the longest context one request can have in this KV cache")
    failure: PredictedFailure | None = None

    @property
    def starts(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class _KVLayout:
    page_bytes: int          # bytes of one block of one layer
    group_size: int          # layers sharing one block id
    groups: tuple[LayerKind, ...]  # one entry per KV-cache group
    layer_kinds: tuple[LayerKind, ...]  # the stage's layers
    block_size: int = 16     # tokens per attention block (grown for linear/mamba hybrids)
    inflight_batches: int = 1  # sliding-window layers keep window − 1 + this × max_num_batched_tokens tokens
    state_blocks: int = 1    # pages one request holds per linear/mamba group (2 in "align" mode, 3 with a
    #                          prefill checkpoint page: prefill_checkpoint_page)

    @property
    def bytes_per_block(self) -> int:
        return self.page_bytes * self.group_size


def profile_for_model(profile: VersionProfile, arch: ModelArch) -> VersionProfile:
    """The release's rules for this model: which model runner vLLM picks (config/vllm.py::use_v2_model_runner), and
    with it whether the CUDA-graph estimate is subtracted and which sampler/graph constants apply.

    A profile already resolved (for this or another model, e.g. a quantized variant) is resolved again from its era.
    """
    if profile.runner:
        era = profile_for(profile.version or profile.since)
        if era.since != profile.since:
            return profile
        profile = era
    v2 = uses_v2_runner(profile, architectures=arch.architectures, is_moe=arch.is_moe,
                        quantized=arch.quantization is not None, state_layers=LayerKind.LINEAR in arch.layer_kinds)
    if not v2:
        return profile.model_copy(update={"runner": "V1"})
    return profile.model_copy(update={
        "runner": "V2",
        # gpu/model_runner.py::profile_cudagraph_memory returns 0 before 0.29: graphs go into the 1 − util headroom
        "cudagraph_subtracted": profile.v2_cudagraph_estimate,
        "cudagraph_scale": profile.v2_cudagraph_scale,
        "sampler_bytes": profile.v2_sampler_bytes,
    })


def arch_for_release(arch: ModelArch, profile: VersionProfile) -> ModelArch:
    """The model as this release reads its config: from 0.30 the YaRN factor no longer scales the derived length."""
    if profile.yarn_factor_applied or arch.yarn_unscaled_max_len is None:
        return arch
    return arch.model_copy(update={"derived_max_model_len": arch.yarn_unscaled_max_len})


def v2_sampler_state_bytes(arch: ModelArch, flags: EngineFlags, profile: VersionProfile) -> int:
    """Model Runner V2's persistent sampler buffers on the last pipeline stage (0 on the V1 runner)."""
    if profile.runner != "V2":
        return 0
    return int(_V2_SAMPLER_STATE_BYTES * flags.max_num_seqs * arch.vocab_size)


def v2_sampler_entry_bytes(arch: ModelArch, flags: EngineFlags, profile: VersionProfile) -> float:
    """Bytes per sampled row and vocabulary entry at the peak of Model Runner V2's profile-run sampler pass
    (gpu/model_runner.py::_dummy_sampler_run, read in the 0.26.0-0.33.0 wheels).

    The logits come out of compute_logits in the model dtype: each TP rank's [rows x vocab/TP] shard is gathered
    into [rows x vocab] (model_executor/layers/logits_processor.py::_get_logits), both alive during the gather. The
    dummy requests keep the sampler's default states (temperature 0, top-k = vocab, top-p 1: SamplingStates), so
    apply_sampling_params makes no fp32 copy and the Triton gumbel kernel's per-block buffers are
    rows x ceil(vocab/1024) entries: nothing else of vocab size. From 0.33 a second pass runs with
    SamplingParams.for_sampler_warmup() (top-k 50, top-p 0.9, min-p, penalties, logprobs 5): the fp32 copy of the
    logits and what the top-k/top-p sampler allocates, `profile.sampler_bytes` (resolved from v2_sampler_bytes).
    """
    logits = _model_dtype_bytes(arch, flags) * (1 + 1 / flags.tensor_parallel_size)
    return logits + profile.sampler_bytes


def state_page_bytes(arch: ModelArch, flags: EngineFlags) -> int:
    """One linear-attention/mamba layer's per-sequence state on one TP rank, in the model dtype."""
    return ceil_div(arch.state_elements, flags.tensor_parallel_size) * _model_dtype_bytes(arch, flags)


def kv_dtype_bytes(arch: ModelArch, flags: EngineFlags, profile: VersionProfile) -> int:
    if flags.kv_cache_dtype in _FP8_KV:
        return 1
    if arch.quantization and arch.quantization.kv_cache_fp8 and profile.version_tuple >= (0, 15, 0):
        return 1
    return _model_dtype_bytes(arch, flags)


def _model_dtype_bytes(arch: ModelArch, flags: EngineFlags) -> int:
    if flags.dtype not in ("auto", ""):
        return dtype_bytes(flags.dtype)
    return min(dtype_bytes(arch.dtype), 2)  # vLLM runs float32 checkpoints in 16-bit unless asked


def pp_layer_counts(num_layers: int, pp: int) -> list[int]:
    """vLLM's get_pp_indices: L//pp each, the remainder added to the stages before the last."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def pp_partition(num_layers: int, pp: int, override: str | None = None) -> list[int]:
    """Layers per pipeline stage: `VLLM_PP_LAYER_PARTITION` if given (validated as vLLM's get_pp_indices does:
    one integer per stage, summing to the layers), else vLLM's split. Raises ValueError for a bad override."""
    if override is None:
        return pp_layer_counts(num_layers, pp)
    try:
        parts = [int(part) for part in override.split(",")]
    except ValueError:
        raise ValueError(f"VLLM_PP_LAYER_PARTITION {override!r} is not a comma-separated list of integers") from None
    if len(parts) != pp:
        raise ValueError(f"VLLM_PP_LAYER_PARTITION {override!r} has {len(parts)} parts, pipeline-parallel-size is {pp}")
    if sum(parts) != num_layers or min(parts) < 1:
        raise ValueError(f"VLLM_PP_LAYER_PARTITION {override!r} must be positive and sum to {num_layers} layers")
    return parts


def stage_layer_counts(arch: ModelArch, flags: EngineFlags) -> list[int]:
    """Layers per pipeline stage for these flags: the partition when one is set, else vLLM's split."""
    if flags.pp_layer_partition is not None:
        return list(flags.pp_layer_partition)
    return pp_layer_counts(arch.num_layers, flags.pipeline_parallel_size)


def _stage_kinds(arch: ModelArch, pp: int, partition: Sequence[int] | None = None) -> list[tuple[LayerKind, ...]]:
    stages, start = [], 0
    for count in partition or pp_layer_counts(arch.num_layers, pp):
        stages.append(arch.layer_kinds[start : start + count])
        start += count
    return stages


def layer_token_bytes(arch: ModelArch, flags: EngineFlags, profile: VersionProfile) -> int:
    """KV bytes of one token in one attention layer on one TP rank."""
    kv_bytes = kv_dtype_bytes(arch, flags, profile)
    if arch.is_mla:
        return arch.head_dim * kv_bytes
    kv_heads = max(1, arch.num_kv_heads // flags.tensor_parallel_size)
    return 2 * kv_heads * arch.head_dim * kv_bytes


def prefill_checkpoint_page(arch: ModelArch, profile: VersionProfile, compute_capability: str | None) -> bool:
    """Whether this release keeps one more state page per request for the model's state layers in "align" mode
    (MambaSpec.num_prefill_checkpoint_blocks): Mamba2 from 0.32 (mamba_mixer2.py); Gated DeltaNet from 0.33 when
    FlashInfer's GDN prefill runs (qwen_gdn_linear_attn.py::_resolve_gdn_prefill_backend: SM90, or SM10.x/12.x with a
    key head dim of 128). An unknown GPU is planned with the page (the larger booking)."""
    if profile.mamba_prefill_checkpoint == "none":
        return False
    if arch.state_layer == "mamba2":
        return True
    if arch.state_layer != "gated_deltanet" or profile.mamba_prefill_checkpoint != "mamba2_gdn":
        return False
    if compute_capability is None:
        return True
    major = compute_capability.split(".")[0]
    return major == "9" or (major in ("10", "12") and arch.linear_key_head_dim == 128)


def _layout(arch: ModelArch, flags: EngineFlags, profile: VersionProfile, kinds: tuple[LayerKind, ...],
            compute_capability: str | None = None) -> _KVLayout:
    block = flags.block_size
    per_token = layer_token_bytes(arch, flags, profile)
    page = block * per_token
    inflight = profile.swa_inflight_batches
    if inflight > 1 and profile.runner == "V2" and flags.pipeline_parallel_size > 1:
        inflight = flags.pipeline_parallel_size + 1  # MRV2 with PP keeps pp + 1 batches in flight (0.26+)
    if LayerKind.LINEAR in kinds:
        # HybridAttentionMambaModelConfig.verify_and_update_config: the attention block grows (in multiples of 16
        # tokens) until one attention page holds a state page; state pages are padded to the attention page.
        state = state_page_bytes(arch, flags)
        if all(k is LayerKind.LINEAR for k in kinds):
            page = state
        else:
            needed_block = _KERNEL_BLOCK_ALIGNMENT * ceil_div(state, _KERNEL_BLOCK_ALIGNMENT * per_token)
            block = max(block, needed_block)
            page = max(block * per_token, state)
        counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
        smallest, largest = min(counts.values()), max(counts.values())
        group_size = largest if largest < 1.5 * smallest else smallest
        state_groups = tuple(kind for kind, count in counts.items() for _ in range(ceil_div(count, group_size)))
        prefix_caching = flags.enable_prefix_caching
        align = profile.hybrid_prefix_caching if prefix_caching is None else prefix_caching
        pages = (2 + prefill_checkpoint_page(arch, profile, compute_capability)) if align else 1
        return _KVLayout(page, group_size, state_groups, kinds, block, inflight, pages)
    hybrid_manager = profile.tokens_definition != "blocks"
    counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    if len(counts) <= 1 or not hybrid_manager:
        kind = kinds[0] if len(counts) == 1 else LayerKind.FULL
        stage_kinds = kinds if hybrid_manager else tuple(LayerKind.FULL if k is not LayerKind.FULL and len(counts) > 1
                                                         else k for k in kinds)
        return _KVLayout(page, len(kinds), (kind,), stage_kinds, block, inflight)
    smallest, largest = min(counts.values()), max(counts.values())
    group_size = largest if largest < 1.5 * smallest else smallest
    groups: list[LayerKind] = []
    for kind, count in counts.items():
        groups.extend([kind] * ceil_div(count, group_size))
    return _KVLayout(page, group_size, tuple(groups), kinds, block, inflight)


def _blocks_per_request(layout: _KVLayout, arch: ModelArch, flags: EngineFlags, length: int) -> int:
    """Blocks one request of `length` tokens holds across all KV-cache groups."""
    total = 0
    for kind in layout.groups:
        total += _blocks_for(kind, layout, arch, flags, length)
    return total


def _blocks_for(kind: LayerKind, layout: _KVLayout, arch: ModelArch, flags: EngineFlags, length: int) -> int:
    block = layout.block_size
    if kind is LayerKind.LINEAR:
        return layout.state_blocks  # MambaSpec: state pages per sequence, whatever its length
    if kind is LayerKind.FULL or arch.sliding_window is None:
        return ceil_div(length, block)
    window = arch.sliding_window
    # SlidingWindowSpec.max_memory_usage_bytes; 0.26+: 2 batches in flight under async scheduling
    in_flight = layout.inflight_batches * flags.max_num_batched_tokens
    return ceil_div(min(window - 1 + in_flight, length), block) + 1


def _needed_bytes(layout: _KVLayout, arch: ModelArch, flags: EngineFlags, length: int) -> int:
    """Σ over layers of max_memory_usage_bytes(length): what one full-length request needs."""
    counts = {kind: layout.layer_kinds.count(kind) for kind in set(layout.layer_kinds)}
    return sum(count * _blocks_for(kind, layout, arch, flags, length) * layout.page_bytes
               for kind, count in counts.items())


def weights_bytes_per_gpu(arch: ModelArch, flags: EngineFlags) -> list[int]:
    """Weight bytes resident on each pipeline stage's GPUs (one TP rank), in vLLM's in-memory layout."""
    ckpt = checkpoint_bytes(arch)
    params = max(arch.param_count, 1)
    embed_params = arch.vocab_size * arch.hidden_size
    head_params = 0 if arch.tie_word_embeddings else embed_params
    target = _model_dtype_bytes(arch, flags)
    q = arch.quantization
    if q is None:
        stored = ckpt / params
        per_param = float(target) if stored > target * 1.5 or stored < target / 1.5 else stored
        online = (flags.quantization or "").lower()
        embed_b, body_b = per_param, per_param
        if online in ("fp8", "fbgemm_fp8", "ptpc_fp8", "modelopt"):
            body_b = 1.0
        elif online == "bitsandbytes":
            body_b = 0.5 + 0.0625
        body = (params - embed_params - head_params) * body_b
        embed, head = embed_params * embed_b, head_params * embed_b
    else:
        scale = 1.064 if q.method == "mxfp4" else 1.0  # MXFP4 kernels pad/swizzle expert weights
        embed, head = embed_params * 2.0, head_params * lm_head_bytes_per_param(arch)
        body = max(ckpt * scale - embed - head, ckpt * 0.5)
    tp, pp = flags.tensor_parallel_size, flags.pipeline_parallel_size
    layer_params = arch.layer_param_counts or (1,) * arch.num_layers
    all_layers = sum(layer_params)
    # tensors vLLM replicates across TP ranks (expert routers, norms, MXFP4 swizzle padding) do not shrink
    replicated = 0.015 * body if (q is not None and q.method == "mxfp4" and tp > 1) else 0.0
    rope_cache = arch.derived_max_model_len * arch.head_dim * 2 if not arch.is_mla else 0
    per_stage, start = [], 0
    for i, layers in enumerate(stage_layer_counts(arch, flags)):
        share = body * sum(layer_params[start : start + layers]) / all_layers
        start += layers
        extra = (embed if i == 0 else 0.0) + (head if i == pp - 1 else 0.0)
        resident = (share + extra) / tp + replicated + rope_cache
        resident -= flags.cpu_offload_gb * GiB
        per_stage.append(int(max(resident, 0) * 1.0015))
    per_stage = moe_parallel_weights(arch, flags, per_stage)
    if flags.max_loras:  # adapter slots are allocated while the model loads: they count as weights
        slots = LoRASlots(max_loras=flags.max_loras, max_rank=flags.max_lora_rank,
                          dtype_bytes=_model_dtype_bytes(arch, flags), moe_experts=flags.lora_moe_experts)
        lora = adapter_bytes_per_stage(arch, slots, tp, stage_layer_counts(arch, flags)).per_stage
        per_stage = [w + extra for w, extra in zip(per_stage, lora, strict=True)]
    return per_stage


def speculative_memory(arch: ModelArch, flags: EngineFlags, profile: VersionProfile) -> DraftMemory | None:
    """What `--speculative-config` adds on a GPU of the last stage (planner/speculative.py); None without it."""
    spec = flags.speculative
    if spec is None:
        return None
    plain = flags.model_copy(update={"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "cpu_offload_gb": 0.0,
                                     "speculative": None})
    embed_head = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2) * 2
    rope = 0 if arch.is_mla else arch.derived_max_model_len * arch.head_dim * 2
    body = max(weights_bytes_per_gpu(arch, plain)[0] / 1.0015 - embed_head - rope, 0.0)
    draft_weights: int | None = None
    draft_kv: int | None = None
    if spec.draft_arch is not None and spec.kind not in ("mtp",):
        draft_flags = plain.model_copy(update={"tensor_parallel_size": spec.draft_tensor_parallel_size
                                               or flags.tensor_parallel_size, "quantization": spec.quantization})
        draft_weights = weights_bytes_per_gpu(spec.draft_arch, draft_flags)[0]
        attention = sum(1 for k in spec.draft_arch.layer_kinds if k is not LayerKind.LINEAR)
        draft_kv = attention * layer_token_bytes(spec.draft_arch, flags.model_copy(update={"speculative": None}),
                                                 profile)
    return draft_memory(spec, arch, body_bytes=body, dtype_bytes=_model_dtype_bytes(arch, flags),
                        tp=flags.tensor_parallel_size, max_num_batched_tokens=flags.max_num_batched_tokens,
                        draft_weights_bytes=draft_weights, draft_kv_per_token=draft_kv,
                        target_kv_per_token=layer_token_bytes(arch, flags, profile))


#: FLA's chunk size (vllm/model_executor/layers/fla/ops/utils.py::FLA_CHUNK_SIZE, 64 in 0.21-0.33)
_FLA_CHUNK = 64


def fla_gdn_prefill(arch: ModelArch, profile: VersionProfile, compute_capability: str | None) -> bool:
    """Whether the Gated DeltaNet prefill of the profile run is FLA's Triton chunk kernel (ChunkGatedDeltaRule's
    forward_native) rather than FlashInfer's: qwen_gdn_linear_attn.py::_resolve_gdn_prefill_backend picks FlashInfer on
    SM90 (0.21+), on SM10.x with a key head dim of 128 (0.22+) and on SM12.x with 128 (0.30+); Triton elsewhere. An
    unknown GPU is planned with FLA (the larger booking)."""
    if arch.state_layer != "gated_deltanet" or not arch.linear_value_heads:
        return False
    if compute_capability is None:
        return True
    major = compute_capability.split(".")[0]
    version = profile.version_tuple
    flashinfer = (compute_capability == "9.0"
                  or (major == "10" and arch.linear_key_head_dim == 128 and version >= (0, 22, 0))
                  or (major == "12" and arch.linear_key_head_dim == 128 and version >= (0, 30, 0)))
    return not flashinfer


def fla_gdn_bytes(arch: ModelArch, flags: EngineFlags) -> int:
    """What FLA's chunk_gated_delta_rule_fwd (vllm/model_executor/layers/fla/ops/chunk.py, unchanged 0.21-0.33)
    allocates for one prefill of `max_num_batched_tokens` tokens, alive together when its last kernel runs: per token
    and value head (H = value heads per GPU, BT = 64): g's cumulative sum (fp32, cumsum.py), A solved to the model dtype
    (H x BT, solve_tril.py; the fp32 A before it is freed), w (K) and u (V) (wy_fast.py), h - one K x V state per chunk
    of BT tokens (chunk_delta_h.py) - and v_new (V), and the output (V, chunk_o.py), in the model dtype."""
    heads = max(1, arch.linear_value_heads // flags.tensor_parallel_size)
    k, v = arch.linear_key_head_dim or 128, arch.linear_value_head_dim or 128
    dtype = 2
    per_head = 4 + dtype * (_FLA_CHUNK + k + v + k * v / _FLA_CHUNK + v + v)
    return int(flags.max_num_batched_tokens * heads * per_head)


def activation_bytes(arch: ModelArch, flags: EngineFlags, profile: VersionProfile, *, last_stage: bool,
                     compute_capability: str | None = None) -> int:
    """Torch peak growth during profile_run: max(forward pass, sampler pass) + MoE workspace + encoder + FLA's Gated
    DeltaNet prefill intermediates."""
    tp = flags.tensor_parallel_size
    tokens = flags.max_num_batched_tokens
    rows = min(flags.max_num_seqs, tokens)
    if flags.speculative is not None and last_stage:  # k draft tokens + 1 bonus token verified per sequence
        rows = min(flags.max_num_seqs * (flags.speculative.tokens(arch) + 1), tokens)
    forward = tokens * (_FWD_INTER_BYTES * arch.intermediate_size / tp + _FWD_HIDDEN_BYTES * arch.hidden_size)
    if arch.is_moe and arch.moe_intermediate_size:
        forward = tokens * (_FWD_INTER_BYTES * arch.moe_intermediate_size / tp + _FWD_HIDDEN_BYTES * arch.hidden_size)
    per_entry = profile.sampler_bytes
    if profile.runner == "V2":
        per_entry = v2_sampler_entry_bytes(arch, flags, profile)
    sampler = per_entry * rows * arch.vocab_size if last_stage else 0.0
    sampler += _HIDDEN_KEPT_BYTES * tokens * arch.hidden_size
    peak = _ACT_BASE_GIB * GiB + max(forward, sampler)
    if arch.is_moe and not (arch.quantization and arch.quantization.method == "mxfp4"):
        if flags.enable_expert_parallel or flags.data_parallel_size > 1:  # the layout changes the problem size
            peak += moe_workspace_bytes(arch, flags, profile.version_tuple)
        else:  # plain TP: the calibrated estimate (benchmarks/planner_accuracy.py)
            peak += tokens * arch.experts_per_token * (2 * arch.moe_intermediate_size / tp + arch.hidden_size) * 2
    if arch.multimodal:
        peak += _MULTIMODAL_GIB * GiB
    if fla_gdn_prefill(arch, profile, compute_capability):  # ESTIMATE (the overlap): see _estimated_figures
        peak += fla_gdn_bytes(arch, flags)
    return int(peak)


def non_torch_bytes(flags: EngineFlags, profile: VersionProfile, *, nvlink: bool = True) -> int:
    """Non-torch growth while profiling: cuBLAS workspaces and lazily loaded kernels on every rank (nontorch_gib[0]),
    NCCL/custom all-reduce buffers at TP>=2 (NVLink GPUs: nontorch_gib[1]); a NCCL group without custom all-reduce
    (TP over PCIe, or the pipeline-parallel group) adds 0.07 GiB to the base."""
    tp, pp = flags.tensor_parallel_size, flags.pipeline_parallel_size
    if tp > 1 and nvlink:
        value = profile.nontorch_gib[1]
    elif tp > 1 or pp > 1:
        # no custom all-reduce without NVLink/P2P; a TP-1 pipeline stage is a rank like any other (its cuBLAS and
        # kernel growth is the base's) with a NCCL group of its own (was 0.07 alone, below a single GPU's growth)
        value = profile.nontorch_gib[0] + 0.07
    else:
        value = profile.nontorch_gib[0]
    return int(value * GiB)


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, *, largest_default: int = 512,
                            decode_query_len: int = 1) -> list[int]:
    """vLLM's default CUDA-graph capture sizes (config/vllm.py::VllmConfig._set_cudagraph_sizes, 0.28.0)."""
    largest = min(max_num_seqs * decode_query_len * 2, largest_default, max_num_batched_tokens)
    if largest < 1:
        return []
    sizes = [i for i in (1, 2, 4) if i <= largest]
    if largest >= 8:
        sizes += list(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        sizes += list(range(256, largest + 1, 16))
    if max_num_batched_tokens <= largest:
        sizes.append(max_num_batched_tokens)
    return sorted(set(sizes))


def cudagraph_capture_counts(arch: ModelArch, flags: EngineFlags, profile: VersionProfile,
                             compute_capability: str | None = None) -> tuple[int, int, int]:
    """(PIECEWISE graphs, FULL decode graphs, largest size) vLLM captures with these flags on this GPU."""
    query = 1 + (flags.speculative.tokens(arch) if flags.speculative is not None else 0)
    cc10 = compute_capability is not None and compute_capability.split(".")[0] == "10"
    default = profile.cudagraph_capture_max_cc10 if cc10 else _CAPTURE_MAX_DEFAULT
    sizes = cudagraph_capture_sizes(flags.max_num_seqs, flags.max_num_batched_tokens, largest_default=default,
                                    decode_query_len=query)
    full = [size for size in sizes if query <= size <= query * flags.max_num_seqs]
    return len(sizes), len(full), (sizes[-1] if sizes else 0)


def cudagraph_bytes(arch: ModelArch, flags: EngineFlags, profile: VersionProfile, layers: int, *,
                    compute_capability: str | None = None) -> int:
    """vLLM's CUDA-graph memory estimate for one GPU (0 with --enforce-eager): a shared part (the first, largest
    capture) plus a per-layer part per further graph, scaled by how many graphs these flags capture."""
    if flags.enforce_eager:
        return 0
    piecewise, full, largest = cudagraph_capture_counts(arch, flags, profile, compute_capability)
    if piecewise == 0:
        return 0
    shared = 0.3 + (0.2 if flags.tensor_parallel_size > 1 else 0.0) + (0.3 if arch.is_moe else 0.0)
    if largest > _CAPTURE_MAX_DEFAULT:
        # ESTIMATE: the first capture is the largest batch; beyond the calibrated 512 its buffers are taken to grow
        # in proportion (compute capability 10.x from 0.28: 1024)
        shared *= largest / _CAPTURE_MAX_DEFAULT
    extra_graphs = max(piecewise - 1, 0) + max(full - 1, 0)
    per_graph = 0.0165 * layers * extra_graphs / _CALIBRATED_EXTRA_GRAPHS
    return int((shared + per_graph) * profile.cudagraph_scale * GiB)


def pp_comm_gib(pp: int, nvlink: bool) -> float:
    """NCCL memory one pipeline-parallel communicator holds per GPU (ESTIMATE, see _PP_COMM_GIB); 0 without PP."""
    if pp <= 1:
        return 0.0
    return _PP_COMM_GIB[0] if nvlink else _PP_COMM_GIB[1]


def init_nontorch_gib(tp: int, nvlink: bool, pp: int = 1) -> float:
    """Memory held before vLLM's init snapshot: CUDA context, plus NCCL/custom all-reduce at TP>=2 (more with
    NVLink), plus the pipeline-parallel group's NCCL communicator at PP>=2."""
    tp_part = _INIT_NONTORCH_GIB[1] if tp > 1 and nvlink else _INIT_NONTORCH_GIB[0] + (0.25 if tp > 1 else 0.0)
    return tp_part + pp_comm_gib(pp, nvlink)


def outside_budget_gib(tp: int, pp: int, nvlink: bool, profile: VersionProfile) -> float:
    """What vLLM holds on one GPU outside its budget once serving: the context and communicators made before the init
    snapshot (`init_nontorch_gib`) and those connected at the first step (`serving_comm_bytes`); `profile` resolved
    for the model (`profile_for_model`)."""
    probe = EngineFlags(tensor_parallel_size=tp, pipeline_parallel_size=pp, max_model_len=1, max_num_seqs=1,
                        max_num_batched_tokens=1)
    return init_nontorch_gib(tp, nvlink, pp) + serving_comm_bytes(probe, profile, nvlink=nvlink) / GiB


def headroom_buffers_bytes(arch: ModelArch, flags: EngineFlags, profile: VersionProfile) -> int:
    """Model Runner V2's persistent buffers that sit in the 1 - util headroom before 0.27 (sampler state on the last
    stage, PP receive buffer on the others), on the stage that holds the most; `profile` resolved for the model."""
    pp = flags.pipeline_parallel_size
    return max(stage_terms(arch, flags, profile, stage, layers).headroom
               for stage, layers in enumerate(pp_layer_counts(arch.num_layers, pp)))


def serving_comm_bytes(flags: EngineFlags, profile: VersionProfile, *, nvlink: bool) -> int:
    """NCCL memory created after the KV cache, at the first served step: Model Runner V2's sibling communicator for
    the PP sampled-token broadcast (v1/worker/gpu/pp_utils.py::PPHandler). 0 on the V1 runner or without PP."""
    if profile.runner != "V2":
        return 0
    return int(pp_comm_gib(flags.pipeline_parallel_size, nvlink) * GiB)


def pp_intermediate_bytes(arch: ModelArch, flags: EngineFlags, stage: int) -> int:
    """The buffer a non-first PP stage keeps for the hidden states it receives: make_empty_intermediate_tensors
    (model_executor/models/utils.py::make_empty_intermediate_tensors_factory, ["hidden_states", "residual"]) of
    max_num_batched_tokens rows x hidden_size (not sharded by TP) in the model dtype. The V1 runner allocates it in
    the profile run (gpu_model_runner.py::_dummy_run: inside the activation peak); Model Runner V2 in load_model
    (gpu/model_runner.py: persistent, like its sampler state)."""
    if stage == 0 or flags.pipeline_parallel_size <= 1:
        return 0
    return 2 * flags.max_num_batched_tokens * arch.hidden_size * _model_dtype_bytes(arch, flags)


def external_weights_bytes(flags: EngineFlags, profile: VersionProfile, weights: int) -> int:
    """Weights a weight-cache daemon holds for this rank and vLLM maps zero-copy (`--load-format ipc_cache`): the
    bytes v1/worker/utils.py::request_memory takes out of ceil(total x util) from 0.32 (the daemon reports what it
    holds, model_loader/weight_cache/ipc_loader.py::get_external_weight_memory; the planner's figure for it is the
    rank's weights). 0 for any other load format, and before 0.32 (no such loader)."""
    if flags.load_format != "ipc_cache" or not profile.external_weights_budget:
        return 0
    return weights


@dataclass(frozen=True)
class StageTerms:
    """What one pipeline stage's GPU spends besides weights and KV cache, as vLLM accounts for it."""

    activation: int      # torch peak growth in the profile run (V1: with the PP receive buffer)
    persistent: int      # counted in the budget from 0.27: allocator leftovers, MRV2 sampler state and PP buffer
    cudagraph: int       # the CUDA-graph estimate (subtracted where the release and runner do)
    headroom: int        # MRV2 buffers that sit in the 1 - util headroom before 0.27


def stage_terms(arch: ModelArch, flags: EngineFlags, profile: VersionProfile, stage: int, layers: int, *,
                compute_capability: str | None = None) -> StageTerms:
    """The per-stage terms of the budget (`profile` resolved for the model: `profile_for_model`)."""
    pp = flags.pipeline_parallel_size
    last = stage == pp - 1
    act = activation_bytes(arch, flags, profile, last_stage=last, compute_capability=compute_capability)
    receive = pp_intermediate_bytes(arch, flags, stage)
    mrv2 = v2_sampler_state_bytes(arch, flags, profile) if last else 0
    if profile.runner == "V2":
        mrv2 += receive
    else:
        act += receive
    # 0.27+ (`consumed` profiler): what the allocator keeps after memory_profiling's closing empty_cache counts
    # against the budget (allocator_slack_gib; 0: empty_cache returns every free segment)
    slack = int(profile.allocator_slack_gib * GiB) if profile.profiler == "consumed" else 0
    counted = profile.v2_sampler_state_counted
    graph = cudagraph_bytes(arch, flags, profile, layers, compute_capability=compute_capability)
    return StageTerms(activation=act, persistent=slack + (mrv2 if counted else 0), cudagraph=graph,
                      headroom=0 if counted else mrv2)


def _round2(value_bytes: float) -> float:
    return round(gib(value_bytes), 2)


def _check_parallelism(arch: ModelArch, flags: EngineFlags) -> PredictedFailure | None:
    return shard_failure(arch, flags.tensor_parallel_size)


def dense_mlp_sizes(arch: ModelArch) -> tuple[int, ...]:
    """The MLP widths vLLM splits over the TP ranks whatever the expert layout: the dense MLP of the layers without
    routed experts (none when every layer has them: Mixtral's `intermediate_size` is its experts') and the shared
    experts (`DeepseekV2MLP`/`Qwen2MoeMLP`/`LlamaMLP` — column-parallel, `divide(size, tp)`, with or without
    --enable-expert-parallel)."""
    if not arch.is_moe:
        return (arch.intermediate_size,)
    dense = (arch.intermediate_size,) if len(arch.moe_layers) < arch.num_layers else ()
    shared = (arch.shared_expert_size,) if arch.shared_expert_size else ()
    return dense + shared


def shard_failure(arch: ModelArch, tp: int) -> PredictedFailure | None:
    """The TP shard asserts of the layers every rank builds, in the order vLLM builds them: attention heads, the
    embedding (vocab), the KV heads, the dense and shared-expert MLPs. The routed experts' check depends on DP and
    EP: `moe_parallelism_failure`."""
    if arch.num_heads % tp:
        return PredictedFailure(kind=FailureKind.INVALID_PARALLELISM,
                                message=messages.heads_divisibility_message(arch.num_heads, tp))
    if arch.vocab_size % tp:
        return PredictedFailure(kind=FailureKind.INVALID_PARALLELISM,
                                message=messages.shard_divisibility_message(arch.vocab_size, tp))
    if not arch.is_mla:
        kv = arch.num_kv_heads
        if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            return PredictedFailure(kind=FailureKind.INVALID_PARALLELISM,
                                    message=messages.shard_divisibility_message(kv, tp))
    for size in dense_mlp_sizes(arch):
        if size and size % tp:
            return PredictedFailure(kind=FailureKind.INVALID_PARALLELISM,
                                    message=messages.shard_divisibility_message(size, tp))
    return None


def predict_startup(arch: ModelArch, flags: EngineFlags, gpu: GPUFacts, profile: VersionProfile) -> StartupPrediction:
    """What vLLM's startup will log and whether it starts (the tightest GPU decides, as vLLM takes the minimum)."""
    profile = profile_for_model(profile, arch)
    arch = arch_for_release(arch, profile)
    total = int(gpu.total_gib * GiB)
    util = flags.gpu_memory_utilization
    requested = math.ceil(total * util)
    pp = flags.pipeline_parallel_size
    free = total - int(gpu.other_used_gib * GiB)
    stage_kinds = _stage_kinds(arch, pp, flags.pp_layer_partition)
    weights = weights_bytes_per_gpu(arch, flags)
    draft = speculative_memory(arch, flags, profile)
    if draft is not None:  # the drafter runs on the last stage: its weights, and its attention layers take KV pages
        weights[-1] += draft.weights_bytes
        stage_kinds[-1] = attention_layer_kinds(stage_kinds[-1], draft.kv_layers)
    non_torch = non_torch_bytes(flags, profile, nvlink=gpu.nvlink)
    # 0.32+ with --load-format ipc_cache: a weight-cache daemon (another process) holds the weights
    external = external_weights_bytes(flags, profile, max(weights))
    free = min(free, total - external)

    best: tuple[int, int, _KVLayout, int, StageTerms] | None = None
    headroom_need = 0
    for stage, kinds in enumerate(stage_kinds):
        layout = _layout(arch, flags, profile, kinds, gpu.compute_capability)
        terms = stage_terms(arch, flags, profile, stage, len(kinds), compute_capability=gpu.compute_capability)
        headroom_need = max(headroom_need, terms.headroom)
        # request_memory (0.32+): the daemon's weights leave the budget, and none are loaded into this process
        local = 0 if external else weights[stage]
        avail = requested - external_weights_bytes(flags, profile, weights[stage]) - local
        avail -= terms.activation + non_torch + terms.persistent
        if profile.cudagraph_subtracted:
            avail -= terms.cudagraph
        if profile.others_memory_counted:
            avail -= int(gpu.other_used_gib * GiB)
        if flags.kv_cache_memory_bytes is not None:
            avail = flags.kv_cache_memory_bytes
        blocks = max(avail, 0) // layout.bytes_per_block
        if best is None or blocks < best[1]:
            best = (avail, blocks, layout, weights[stage], terms)
    assert best is not None
    avail, num_blocks, layout, w, terms = best
    act, graph, persistent = terms.activation, terms.cudagraph, terms.persistent
    mml = flags.max_model_len
    block_size = layout.block_size

    per_request = _blocks_per_request(layout, arch, flags, mml)
    concurrency = num_blocks / per_request if per_request else 0.0
    if profile.engine == "V0":
        concurrency = num_blocks * block_size / mml
    if profile.tokens_definition == "blocks":
        tokens = num_blocks * block_size
    elif profile.tokens_definition == "blocks_per_group":
        tokens = num_blocks // len(layout.groups) * block_size
    else:
        tokens = int(concurrency * mml)
    # 0.29+: vLLM plans one request against avail − one block (the null block), its estimate included
    reserve = layout.bytes_per_block if profile.kv_check_reserves_block else 0
    estimated = _estimate_max_len(layout, arch, flags, max(avail - reserve, 0), arch.derived_max_model_len)
    attention_layers = len(layout.layer_kinds) - layout.layer_kinds.count(LayerKind.LINEAR)
    per_token = attention_layers * layout.page_bytes // block_size
    breakdown = MemoryBreakdown(
        gpu_total_gib=round(gpu.total_gib, 2),
        requested_gib=_round2(requested),
        weights_gib=_round2(w),
        activation_gib=_round2(act),
        non_torch_gib=_round2(non_torch),
        cudagraph_gib=_round2(graph),
        kv_cache_gib=_round2(max(avail, 0)),
        headroom_gib=_round2(total - requested),
        persistent_gib=_round2(persistent),
        estimated=list(_estimated_figures(arch, flags, profile, gpu)),
    )
    prediction = StartupPrediction(
        memory=breakdown,
        kv_bytes_per_token=per_token,
        num_blocks=int(num_blocks),
        kv_cache_tokens=int(tokens),
        max_concurrency=round(concurrency, 2),
        estimated_max_model_len=estimated,
    )
    failure = _first_failure(arch, flags, gpu, profile, prediction, requested, free, w, act, avail, layout,
                             external=external, headroom_need=headroom_need)
    return prediction.model_copy(update={"failure": failure})


def _estimated_figures(arch: ModelArch, flags: EngineFlags, profile: VersionProfile,
                       gpu: GPUFacts | None = None) -> tuple[str, ...]:
    """Which breakdown figures rest on a constant no vLLM log has calibrated (ESTIMATE in catalog/vllm_versions.yaml
    and in this module's comments)."""
    out: list[str] = []
    cc = gpu.compute_capability if gpu is not None else None
    if profile.cudagraph_subtracted and cudagraph_capture_counts(arch, flags, profile, cc)[2] > _CAPTURE_MAX_DEFAULT:
        out.append("cudagraph_gib")  # the first capture beyond the calibrated 512 (compute capability 10.x, 0.28+)
    if profile.runner == "V2" and profile.v2_sampler_bytes and "v2_sampler_bytes" in profile.estimates:
        out.append("activation_gib")  # MRV2's warm-up sampler pass with full sampling parameters (0.33+)
    if (profile.runner == "V2" and profile.cudagraph_subtracted and not flags.enforce_eager
            and "v2_cudagraph_scale" in profile.estimates):
        out.append("cudagraph_gib")  # MRV2's trial-capture estimate (0.29+)
    if profile.profiler == "consumed" and profile.allocator_slack_gib and "allocator_slack_gib" in profile.estimates:
        out.append("persistent_gib")  # allocator leftovers (0.27+)
    if gpu is not None and gpu.uma and profile.version_tuple >= (0, 26, 0):
        # utils/mem_utils.py::MemorySnapshot.measure (read in 0.26.0-0.33.0): on an integrated GPU the free memory is
        # psutil's available host memory, so the process's own host-side growth during startup (compile workers,
        # loader buffers) is counted as non-KV memory; nothing in vLLM's source bounds it
        out.append("non_torch_gib")
    if fla_gdn_prefill(arch, profile, cc):
        # ESTIMATE: FLA's Gated DeltaNet intermediates are the code's shapes (fla_gdn_bytes), taken to add to the
        # calibrated forward peak; how they overlap the layer's other transients is not read from the code
        out.append("activation_gib")
    if flags.speculative is not None:
        out.append("activation_gib")  # the sampler booked for k + 1 tokens per sequence (vLLM profiles fewer)
        draft = speculative_memory(arch, flags, profile)
        if draft is not None and draft.estimated:
            out.append("weights_gib")  # a draft whose config.json was not read
    out = list(dict.fromkeys(out))
    if out:
        out.append("kv_cache_gib")  # what is left after them
    return tuple(out)


def _estimate_max_len(layout: _KVLayout, arch: ModelArch, flags: EngineFlags, avail: int, limit: int) -> int:
    """vLLM's binary search for the longest max_model_len whose one request fits in `avail` bytes."""
    if _needed_bytes(layout, arch, flags, 1) > avail:
        return 0
    lo, hi = 1, max(limit, 1)
    if _needed_bytes(layout, arch, flags, hi) <= avail:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _needed_bytes(layout, arch, flags, mid) <= avail:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _first_failure(
    arch: ModelArch,
    flags: EngineFlags,
    gpu: GPUFacts,
    profile: VersionProfile,
    pred: StartupPrediction,
    requested: int,
    free: int,
    weights: int,
    act: int,
    avail: int,
    layout: _KVLayout,
    *,
    external: int = 0,
    headroom_need: int = 0,
) -> PredictedFailure | None:
    """The first check vLLM's startup trips over, in the order vLLM runs them."""
    total = int(gpu.total_gib * GiB)
    if flags.max_model_len > arch.derived_max_model_len:
        return PredictedFailure(kind=FailureKind.MAX_MODEL_LEN_TOO_LONG,
                                message=messages.max_len_too_long_message(flags.max_model_len,
                                                                          arch.derived_max_model_len))
    bad = _check_parallelism(arch, flags) or moe_parallelism_failure(arch, flags)
    if bad:
        return bad
    tp_init = init_nontorch_gib(flags.tensor_parallel_size, gpu.nvlink, flags.pipeline_parallel_size) * GiB
    loadable = free - tp_init  # what cudaMemGetInfo reports free once vLLM's own context exists
    early = _startup_check_failure(flags, gpu, profile, loadable, requested, external)
    if early:
        return early
    local = 0 if external else weights  # zero-copy mapped weights allocate nothing in this process
    if local > loadable:
        oom = messages.cuda_oom_message(
            device=0, tried_mib=min(1024.0, gib(weights) * 1024 / 10), total_gib=gpu.total_gib,
            free_mib=max(gib(loadable), 0) * 1024 * 0.02, in_use_gib=gib(total - free + tp_init) + gib(loadable),
            torch_gib=gib(loadable) * 0.98)
        return PredictedFailure(kind=FailureKind.WEIGHTS_DO_NOT_FIT, message=messages.weights_oom_message(profile, oom))
    if local + act > loadable:
        oom = messages.cuda_oom_message(
            device=0, tried_mib=512.0, total_gib=gpu.total_gib, free_mib=64.0,
            in_use_gib=gib(total - 64 * 2**20), torch_gib=gib(local + act - 512 * 2**20))
        return PredictedFailure(kind=FailureKind.CUDA_OOM_STARTUP, message=oom)
    if avail <= 0:
        return PredictedFailure(kind=FailureKind.NO_KV_CACHE_MEMORY, message=messages.no_kv_memory_message(profile))
    too_small = _kv_fit_failure(arch, flags, profile, pred, avail, layout)
    if too_small:
        return too_small
    # After the KV cache is allocated, CUDA-graph capture, warm-up and (at the first step) late NCCL communicators run
    # in what is left of the GPU: free memory less the engine's budget.
    headroom = free - (requested - external)
    if profile.others_memory_counted:
        headroom = total - requested
    need = tp_init + headroom_need + serving_comm_bytes(flags, profile, nvlink=gpu.nvlink)
    if not flags.enforce_eager:
        if not profile.cudagraph_subtracted:
            need += pred.memory.cudagraph_gib * GiB
        if arch.quantization and arch.quantization.method == "mxfp4" and arch.is_moe:
            need += _MXFP4_WARMUP_SHARE * act
    if need > headroom:
        oom = messages.cuda_oom_message(
            device=0, tried_mib=786.0, total_gib=gpu.total_gib, free_mib=max(gib(headroom - tp_init), 0) * 1024 * 0.3,
            in_use_gib=gib(requested + tp_init), torch_gib=gib(requested - 0.25 * GiB))
        return PredictedFailure(kind=FailureKind.CUDA_OOM_STARTUP, message=oom)
    return None


# --------------------------------------------------------------------------------------------------
# MoE parallelism: --data-parallel-size and --enable-expert-parallel (pinned only)
# --------------------------------------------------------------------------------------------------


def moe_group_size(flags: EngineFlags) -> int:
    """The ranks one MoE layer runs across: TP × DP (vLLM's FusedMoEParallelConfig.make flattens DP into the MoE
    layers' TP group; with --enable-expert-parallel that group becomes the EP group, EP size = TP × DP)."""
    return flags.tensor_parallel_size * flags.data_parallel_size


def experts_per_rank(arch: ModelArch, flags: EngineFlags) -> int:
    """Routed experts the busiest EP rank holds: vLLM's determine_expert_map gives E // EP to every rank and one more
    to the first E % EP ranks, so the heaviest holds ceil(E / EP)."""
    return ceil_div(arch.num_experts, moe_group_size(flags))


def _layer_param_bytes(arch: ModelArch, flags: EngineFlags) -> float:
    """Resident bytes of one decoder-layer parameter, as weights_bytes_per_gpu spreads the checkpoint's body over the
    layers (the same per-parameter rate, so the expert share below is the one it booked)."""
    plain = flags.model_copy(update={"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "cpu_offload_gb": 0.0,
                                     "max_loras": 0, "data_parallel_size": 1, "enable_expert_parallel": False})
    embed_head = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2) * 2
    rope = 0 if arch.is_mla else arch.derived_max_model_len * arch.head_dim * 2
    body = max(weights_bytes_per_gpu(arch, plain)[0] / 1.0015 - embed_head - rope, 0.0)
    return body / max(sum(arch.layer_param_counts) or arch.param_count, 1)


def moe_parallel_weights(arch: ModelArch, flags: EngineFlags, per_stage: list[int]) -> list[int]:
    """Per-stage weights per GPU with the routed experts laid out as DP/EP lay them out.

    `weights_bytes_per_gpu` books every routed expert split over the TP ranks. With `--data-parallel-size` D the
    experts are split over TP × D ranks instead (attention, dense MLPs, shared experts and routers stay split over
    TP, i.e. replicated on every DP rank); with `--enable-expert-parallel` each of the TP × D ranks holds whole
    experts, ceil(E / (TP × D)) of them per MoE layer, and none of the others. Same expert bytes per GPU as TP
    sharding only when E divides by TP × D. Dense models and plain TP are returned unchanged.
    """
    group = moe_group_size(flags)
    if not arch.is_moe or not arch.routed_expert_params or not arch.moe_layers or group == 1:
        return per_stage
    rate = _layer_param_bytes(arch, flags)
    expert_bytes = arch.routed_expert_params * rate
    held = experts_per_rank(arch, flags) if flags.enable_expert_parallel else arch.num_experts / group
    out, start = [], 0
    for stage, layers in enumerate(pp_layer_counts(arch.num_layers, flags.pipeline_parallel_size)):
        moe_in_stage = sum(1 for i in arch.moe_layers if start <= i < start + layers)
        start += layers
        booked = moe_in_stage * arch.num_experts * expert_bytes / flags.tensor_parallel_size
        actual = moe_in_stage * held * expert_bytes
        out.append(max(int(per_stage[stage] + (actual - booked) * 1.0015), 0))
    return out


#: VLLM_FUSED_MOE_CHUNK_SIZE's default: 32768 up to 0.11 (read from the 0.8.0, 0.10.2 and 0.11.0 wheels' envs.py),
#: 16384 from 0.12 (0.12.0, 0.14.0, 0.17.0); the variable is gone from 0.18 (0.18.0, 0.19.0, 0.20.0, 0.26.0, 0.30.0,
#: 0.33.0): the experts then run on the whole batch at once.
_MOE_CHUNK_BEFORE_0_12 = 32768
_MOE_CHUNK_0_12 = 16384


def moe_rows(flags: EngineFlags, version: Version) -> int:
    """Tokens one fused-experts call works on in the profile run (the M of its workspace).

    With DP > 1 every engine profiles with max-num-batched-tokens at the same time and the default
    `allgather_reducescatter` dispatch gathers the DP ranks' tokens before the experts (0.33
    `AgRsAll2AllManager`, `DPMetadata.sp_local_sizes` "without any chunking"; 0.10.2 `do_naive_dispatch_combine`):
    M = DP × tokens. Before 0.18 the modular kernel cut M into VLLM_FUSED_MOE_CHUNK_SIZE chunks, and from 0.12 to
    0.17 a DP + EP profile run sized the workspace at a whole chunk whatever M was (`_allocate_buffers`, "Force
    worst-case allocation in profiling run").
    """
    rows = flags.max_num_batched_tokens * flags.data_parallel_size
    if version >= (0, 18, 0):
        return rows
    chunk = _MOE_CHUNK_0_12 if version >= (0, 12, 0) else _MOE_CHUNK_BEFORE_0_12
    if version >= (0, 12, 0) and flags.enable_expert_parallel and flags.data_parallel_size > 1:
        return chunk
    return min(rows, chunk)


def moe_workspace_bytes(arch: ModelArch, flags: EngineFlags, version: Version) -> int:
    """The fused-experts workspace of one rank when DP/EP lay the experts out (plain TP keeps the calibrated
    estimate in activation_bytes).

    vLLM 0.33 `TritonExperts.workspace_shapes` (the same shapes in 0.10.2): workspace13 = (M, topk, max(N_act, K)),
    shared with the (M, K) output, and workspace2 = (M, topk, max(N, K)), in the activation dtype, where K is the
    hidden size, N the first GEMM's width (gate + up: 2 × the intermediate size per partition) and N_act the
    activation's output (the intermediate size per partition). The intermediate size per partition is the expert's
    whole width with --enable-expert-parallel (the MoE tp_size is 1) and 1/(TP × DP) of it without. M is
    `moe_rows`. ESTIMATE for the other expert kernels (DeepGEMM, CUTLASS, FlashInfer, Marlin: their own shapes) and
    for releases whose TP-only path still called the non-modular `fused_experts` (at most M × topk ×
    (max(N_act, K) − N_act) smaller).
    """
    if not arch.is_moe or not arch.moe_intermediate_size:
        return 0
    split = 1 if flags.enable_expert_parallel else moe_group_size(flags)
    per_partition = arch.moe_intermediate_size / split
    gated = arch.routed_expert_params != 2 * arch.hidden_size * arch.moe_intermediate_size
    first_gemm = per_partition * (2 if gated else 1)
    hidden = arch.hidden_size
    per_row = arch.experts_per_token * (max(per_partition, hidden) + max(first_gemm, hidden))
    return int(moe_rows(flags, version) * per_row * _model_dtype_bytes(arch, flags))


def moe_parallelism_failure(arch: ModelArch, flags: EngineFlags) -> PredictedFailure | None:
    """The routed experts' shard check (vLLM 0.33 `FusedMoEConfig.__post_init__`: `assert intermediate_size %
    moe_parallel_config.tp_size == 0`). Without expert parallelism that TP size is TP × DP (`FusedMoEParallelConfig.
    make` flattens DP into it) and each expert's intermediate size must divide by it; with
    `--enable-expert-parallel` it is 1 — every rank holds whole experts, and no expert dimension is split."""
    group = moe_group_size(flags)
    if not arch.is_moe or flags.enable_expert_parallel or group == 1:
        return None
    if arch.moe_intermediate_size and arch.moe_intermediate_size % group:
        return PredictedFailure(kind=FailureKind.INVALID_PARALLELISM,
                                message=messages.shard_divisibility_message(arch.moe_intermediate_size, group))
    return None


def _startup_check_failure(flags: EngineFlags, gpu: GPUFacts, profile: VersionProfile, loadable: float,
                           requested: int, external: int) -> PredictedFailure | None:
    """v1/worker/utils.py::request_memory: free memory against the budget; from 0.32 with externally held weights,
    against the budget less those weights, and an error when they exceed the budget."""
    util = flags.gpu_memory_utilization
    if external:
        engine = requested - external
        if engine <= 0:
            return PredictedFailure(kind=FailureKind.INVALID_ARGUMENT, message=messages.external_weights_exceed_message(
                device=0, external_gib=gib(external), total_gib=gpu.total_gib, util=util,
                requested_gib=gib(requested)))
        if not gpu.uma and loadable < engine:
            return PredictedFailure(kind=FailureKind.INSUFFICIENT_FREE_GPU_MEMORY, message=messages.free_memory_message(
                profile, device=0, free_gib=gib(loadable), total_gib=gpu.total_gib, util=util,
                requested_gib=gib(engine), external=True))
        return None
    if profile.free_memory_check and not gpu.uma and loadable < requested:
        return PredictedFailure(
            kind=FailureKind.INSUFFICIENT_FREE_GPU_MEMORY,
            message=messages.free_memory_message(
                profile, device=0, free_gib=gib(loadable), total_gib=gpu.total_gib,
                util=util, requested_gib=gib(requested)),
        )
    return None


def _kv_fit_failure(arch: ModelArch, flags: EngineFlags, profile: VersionProfile, pred: StartupPrediction,
                    avail: int, layout: _KVLayout) -> PredictedFailure | None:
    """check_enough_kv_cache_memory: one request of max_model_len must fit in the KV cache."""
    needed = _needed_bytes(layout, arch, flags, flags.max_model_len)
    # 0.29+: get_kv_cache_configs / check_enough_kv_cache_memory plan against avail − one block (the null block)
    usable = avail - layout.bytes_per_block if profile.kv_check_reserves_block else avail
    too_small = (
        flags.max_model_len > pred.num_blocks * flags.block_size if profile.engine == "V0" else needed > usable
    )
    if not too_small:
        return None
    return PredictedFailure(
        kind=FailureKind.KV_CACHE_TOO_SMALL,
        message=messages.kv_too_small_message(
            profile, max_model_len=flags.max_model_len, needed_gib=gib(needed), available_gib=gib(usable),
            estimated_max_len=pred.estimated_max_model_len, kv_tokens=pred.num_blocks * layout.block_size),
    )
