"""The exact texts vLLM prints when startup fails, release by release (docs/research/vllm-memory-model.md §3, docs/research/vllm-0.27-0.33.md).

The planner uses these to say what vLLM *would* print; the simulated cluster prints them; the classifier must read
them back. One place, so the three agree.
"""

from __future__ import annotations

from .versions import VersionError, VersionProfile, parse_version

DOCS = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"
#: From this release the KV-cache refusal formats its GiB figures with vllm.utils.mem_utils.format_gib,
#: `round(x, 2)` ("2.0 GiB", not "2.00 GiB"): read in vLLM 0.32.0's own output by the real tier (docs/real-vllm.md).
#: Earlier releases of the same wording are not checked and keep two decimals.
FORMAT_GIB_SINCE = "0.32.0"


def _kv_gib(profile: VersionProfile, value: float) -> str:
    try:
        rounded = bool(profile.version) and parse_version(profile.version) >= parse_version(FORMAT_GIB_SINCE)
    except VersionError:
        rounded = False
    return str(round(value, 2)) if rounded else f"{value:.2f}"


def free_memory_message(
    profile: VersionProfile, *, device: int, free_gib: float, total_gib: float, util: float, requested_gib: float,
    external: bool = False,
) -> str:
    """The startup check `free >= total * util` failing (vllm/v1/worker/utils.py::request_memory); `external`: the
    0.32+ check against the budget less externally held weights (`requested_gib` is then that engine budget)."""
    where = f"device cuda:{device} " if profile.free_check_style == "device" else "device "
    than = "the engine's budget after excluding external process's weights" if external else (
        "desired GPU memory utilization")
    return (
        f"ValueError: Free memory on {where}({free_gib:.2f}/{total_gib:.2f} GiB) on startup is less than {than} "
        f"({util}, {requested_gib:.2f} GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
        "processes."
    )


def external_weights_exceed_message(*, device: int, external_gib: float, total_gib: float, util: float,
                                    requested_gib: float) -> str:
    """0.32+: externally held weights larger than ceil(total x util) (vllm/v1/worker/utils.py::request_memory)."""
    return (
        f"ValueError: Externally held weights on device cuda:{device} ({external_gib:.2f}/{total_gib:.2f} GiB) exceed "
        f"the desired GPU memory utilization ({util}, {requested_gib:.2f} GiB). Increase GPU memory utilization or "
        "reduce GPU memory used by other processes."
    )


def no_kv_memory_message(profile: VersionProfile) -> str:
    if profile.kv_error_style == "v1_current":
        return (
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, despite "
            f"its name). See {DOCS} for more details."
        )
    return (
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine."
    )


def kv_too_small_message(
    profile: VersionProfile,
    *,
    max_model_len: int,
    needed_gib: float,
    available_gib: float,
    estimated_max_len: int,
    kv_tokens: int,
) -> str:
    """One request of max_model_len does not fit in the KV cache, worded as this release words it."""
    style = profile.kv_error_style
    if style == "v0":
        return (
            f"ValueError: The model's max seq len ({max_model_len}) is larger than the maximum number of tokens "
            f"that can be stored in KV cache ({kv_tokens}). Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine."
        )
    if style == "v1_gb":
        return (
            f"ValueError: To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({needed_gib:.2f} GB KV cache is needed, which is larger than the available KV cache memory "
            f"({available_gib:.2f} GB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
            "when initializing the engine."
        )
    if style == "v1_gib":
        return (
            f"ValueError: To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({needed_gib:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({available_gib:.2f} GiB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
            "when initializing the engine."
        )
    if style == "v1_broken_estimate":
        return (
            f"ValueError: To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({needed_gib:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({available_gib:.2f} GiB). Based on the available memory, Try increasing `gpu_memory_utilization` "
            "or decreasing `max_model_len` when initializing the engine."
        )
    if style in ("v1_typo", "v1_typo_docs"):
        docs = f" See {DOCS} for more details." if style == "v1_typo_docs" else ""
        return (
            f"ValueError: To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({needed_gib:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({available_gib:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{estimated_max_len}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            f"initializing the engine.{docs}"
        )
    return (
        f"ValueError: To serve at least one request with the model's max seq len ({max_model_len}), "
        f"({_kv_gib(profile, needed_gib)} GiB KV cache is needed, which is larger than the available KV cache memory "
        f"({_kv_gib(profile, available_gib)} GiB). Based on the available memory, the estimated maximum model length is "
        f"{estimated_max_len}. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU "
        f"backend) or decreasing `max_model_len` when initializing the engine. See {DOCS} for more details."
    )


def cuda_oom_message(
    *, device: int, tried_mib: float, total_gib: float, free_mib: float, in_use_gib: float, torch_gib: float
) -> str:
    """PyTorch's own CUDA OOM text (what vLLM shows when an allocation fails)."""
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_mib:.2f} MiB. GPU {device} has a "
        f"total capacity of {total_gib:.2f} GiB of which {free_mib:.2f} MiB is free. Including non-PyTorch memory, "
        f"this process has {in_use_gib:.2f} GiB memory in use. Of the allocated memory {torch_gib:.2f} GiB is "
        "allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated "
        "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )


def weights_oom_message(profile: VersionProfile, oom: str) -> str:
    """Weight loading OOM; releases since Dec 2025 wrap PyTorch's text in their own advice — on the V1 model runner
    only: Model Runner V2's `load_model` (vllm/v1/worker/gpu/model_runner.py) raises PyTorch's error bare."""
    if profile.version_tuple >= (0, 13, 0) and profile.runner != "V2":
        return (
            "ValueError: Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to "
            "free memory for weights, increasing --tensor-parallel-size, or using --quantization. See "
            f"{DOCS} for more tips. (original error: {oom})"
        )
    return oom


def heads_divisibility_message(heads: int, tp: int) -> str:
    return f"ValueError: Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp})."


def shard_divisibility_message(size: int, tp: int) -> str:
    return (
        f"AssertionError: {size} is not divisible by {tp}\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
    )


def max_len_too_long_message(requested: int, derived: int) -> str:
    return (
        f"ValueError: User-specified max_model_len ({requested}) is greater than the derived max_model_len "
        f"(max_position_embeddings={float(derived)} or model_max_length=None in model's config.json). To allow "
        "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN "
        "must be used with extreme caution. If the model uses relative position encoding (RoPE), positions "
        "exceeding derived_max_model_len lead to nan. If the model uses absolute position encoding, positions "
        "exceeding derived_max_model_len will cause a CUDA array out-of-bounds error."
    )
