"""planner.memory: vLLM's startup arithmetic (docs/research/vllm-memory-model.md §1, §2, §7) — exact figures and the failure order."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from vllm_operator.planner.arch import ModelArch, arch_from_config
from vllm_operator.planner.failures import FailureKind
from vllm_operator.planner.memory import (
    EngineFlags,
    GPUFacts,
    StartupPrediction,
    activation_bytes,
    cudagraph_bytes,
    cudagraph_capture_counts,
    cudagraph_capture_sizes,
    external_weights_bytes,
    init_nontorch_gib,
    non_torch_bytes,
    outside_budget_gib,
    pp_intermediate_bytes,
    pp_layer_counts,
    predict_startup,
    prefill_checkpoint_page,
    profile_for_model,
    serving_comm_bytes,
    stage_terms,
    v2_sampler_entry_bytes,
    v2_sampler_state_bytes,
)
from vllm_operator.planner.versions import profile_for

LoadArch = Callable[[str], ModelArch]
GiB = 2**30
H100 = 79.19  # what vLLM reports for an H100-80GB

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_3_70B = "meta-llama/Meta-Llama-3-70B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
QWEN_72B = "Qwen/Qwen2.5-72B-Instruct"
QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"
QWEN3_235B = "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"
DSV2_LITE = "deepseek-ai/DeepSeek-V2-Lite"
GEMMA3_27B = "google/gemma-3-27b-it"


def predict(arch: ModelArch, version: str = "0.19.0", total_gib: float = H100, other_gib: float = 0.0,
            **flags: Any) -> StartupPrediction:
    flags.setdefault("max_model_len", 8192)
    flags.setdefault("max_num_seqs", 1024)
    flags.setdefault("max_num_batched_tokens", 8192)
    gpu = GPUFacts(total_gib=total_gib, other_used_gib=other_gib)
    return predict_startup(arch, EngineFlags(**flags), gpu, profile_for(version))


# --- KV bytes per token per GPU (§2, §7) ---------------------------------------------------------------------


def test_llama_3_1_8b_kv_bytes_per_token(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    assert predict(arch).kv_bytes_per_token == 131_072  # 2·32·8·128·2
    assert predict(arch, kv_cache_dtype="fp8").kv_bytes_per_token == 65_536


def test_llama_3_70b_fp16_is_0_3125_mib_per_token_and_80_gib_for_8x32k(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_3_70B)
    per_token = predict(arch, total_gib=178.41).kv_bytes_per_token
    assert per_token == 327_680
    assert per_token / 2**20 == 0.3125
    assert 32 * 1024 * 8 * per_token / GiB == pytest.approx(80, rel=0.01)


def test_qwen2_5_72b_tp2_splits_kv_heads(load_arch: LoadArch) -> None:
    assert predict(load_arch(QWEN_72B), tensor_parallel_size=2).kv_bytes_per_token == 163_840  # 2·80·4·128·2


def test_qwen3_235b_tp8_replicates_kv_heads(load_arch: LoadArch) -> None:
    arch = load_arch(QWEN3_235B)  # 4 KV heads < TP 8 → one (replicated) head per GPU
    tp8 = predict(arch, tensor_parallel_size=8).kv_bytes_per_token
    tp4 = predict(arch, tensor_parallel_size=4).kv_bytes_per_token
    assert tp8 == 48_128  # 2·94·1·128·2
    assert tp8 == tp4


def test_deepseek_v2_lite_mla_not_divided_by_tp(load_arch: LoadArch) -> None:
    arch = load_arch(DSV2_LITE)
    assert predict(arch).kv_bytes_per_token == 31_104  # 27·576·2, one latent, no K/V factor 2
    assert predict(arch, tensor_parallel_size=2).kv_bytes_per_token == 31_104
    assert predict(arch, kv_cache_dtype="fp8").kv_bytes_per_token == 15_552


def test_pp_stage_split_gives_earlier_stages_the_remainder() -> None:
    assert pp_layer_counts(27, 2) == [14, 13]
    assert pp_layer_counts(80, 3) == [27, 27, 26]
    assert pp_layer_counts(62, 4) == [15, 16, 16, 15]
    assert pp_layer_counts(32, 4) == [8, 8, 8, 8]
    assert sum(pp_layer_counts(61, 8)) == 61


def test_pp_holds_only_the_stage_layers(load_arch: LoadArch) -> None:
    pred = predict(load_arch(DSV2_LITE), pipeline_parallel_size=2)
    assert pred.kv_bytes_per_token in (14 * 1152, 13 * 1152)


# --- weights ------------------------------------------------------------------------------------------------


def test_7b_fp16_weights_about_14_gib(load_arch: LoadArch) -> None:
    assert predict(load_arch(QWEN_7B)).memory.weights_gib == pytest.approx(14.2, rel=0.05)


def test_tp_shrinks_weights_about_linearly(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    tp1 = predict(arch).memory.weights_gib
    tp2 = predict(arch, tensor_parallel_size=2).memory.weights_gib
    tp4 = predict(arch, tensor_parallel_size=4).memory.weights_gib
    assert tp1 == pytest.approx(15.0, rel=0.03)  # logged 14.99
    assert 0.45 <= tp2 / tp1 <= 0.55
    assert 0.45 <= tp4 / tp2 <= 0.55


def test_quantized_weights_are_smaller(load_arch: LoadArch) -> None:
    full = predict(load_arch(QWEN_7B)).memory.weights_gib
    awq = predict(load_arch("Qwen/Qwen2.5-7B-Instruct-AWQ")).memory.weights_gib
    fp8 = predict(load_arch("RedHatAI/Qwen2.5-7B-Instruct-fp8-dynamic")).memory.weights_gib
    assert awq < fp8 < full
    assert awq == pytest.approx(5.29, rel=0.05)
    assert fp8 == pytest.approx(8.14, rel=0.05)


# --- budget -------------------------------------------------------------------------------------------------


def test_requested_is_ceil_of_total_times_util(load_arch: LoadArch) -> None:
    pred = predict(load_arch(LLAMA_8B), gpu_memory_utilization=0.95)
    assert pred.memory.requested_gib == 75.23  # research §7.1
    assert pred.memory.headroom_gib == pytest.approx(79.19 - 75.23, abs=0.01)


def test_budget_terms_add_up(load_arch: LoadArch) -> None:
    for version in ("0.19.0", "0.21.0"):
        mem = predict(load_arch(LLAMA_8B), version=version, gpu_memory_utilization=0.95).memory
        used = mem.weights_gib + mem.activation_gib + mem.non_torch_gib + mem.kv_cache_gib
        if version == "0.21.0":
            used += mem.cudagraph_gib
        assert used == pytest.approx(mem.requested_gib, abs=0.03)


def test_kv_cache_memory_bytes_overrides_the_budget(load_arch: LoadArch) -> None:
    pred = predict(load_arch(LLAMA_8B), kv_cache_memory_bytes=4 * GiB)
    assert pred.memory.kv_cache_gib == 4.0
    assert pred.num_blocks == 4 * GiB // (2 * 2**20)


def test_utilization_raises_kv_monotonically(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    for version in ("0.19.0", "0.26.0"):
        preds = [predict(arch, version=version, gpu_memory_utilization=u / 100) for u in range(40, 100, 5)]
        kv = [p.memory.kv_cache_gib for p in preds]
        assert kv == sorted(kv) and len(set(kv)) == len(kv)
        tokens = [p.kv_cache_tokens for p in preds]
        assert tokens == sorted(tokens)


def test_enforce_eager_frees_cudagraph_memory_only_from_v0_21(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    before, before_eager = predict(arch, "0.20.0"), predict(arch, "0.20.0", enforce_eager=True)
    assert before_eager.memory.kv_cache_gib == before.memory.kv_cache_gib
    assert before_eager.kv_cache_tokens == before.kv_cache_tokens

    after, after_eager = predict(arch, "0.21.0"), predict(arch, "0.21.0", enforce_eager=True)
    assert after.memory.cudagraph_gib > 0
    assert after_eager.memory.cudagraph_gib == 0
    assert after_eager.memory.kv_cache_gib == pytest.approx(
        after.memory.kv_cache_gib + after.memory.cudagraph_gib, abs=0.02)
    assert after_eager.kv_cache_tokens > after.kv_cache_tokens


def test_v0_21_subtracts_cuda_graphs_from_the_same_budget(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    old, new = predict(arch, "0.20.0"), predict(arch, "0.21.0")
    assert new.memory.kv_cache_gib < old.memory.kv_cache_gib


# --- blocks and the logged token count (§2.3) ---------------------------------------------------------------


def test_blocks_to_tokens_uniform_model(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    block_bytes = 16 * 131_072  # 16 tokens × 32 layers' K and V
    avail = 1234 * block_bytes + block_bytes - 1  # floor(avail / block) = 1234
    profile = profile_for("0.8.0")
    assert profile.tokens_definition == "blocks"
    pred = predict(arch, "0.8.0", kv_cache_memory_bytes=avail)
    assert pred.num_blocks == 1234
    assert pred.kv_cache_tokens == 19_744


def test_llama_8b_h100_v0_19_research_example(load_arch: LoadArch) -> None:
    # §7.1: 58.11 GiB available → 29,752 blocks → 476,032 tokens (logged 476,016)
    pred = predict(load_arch(LLAMA_8B), kv_cache_memory_bytes=int(58.11 * GiB))
    assert pred.num_blocks == 29_752
    assert pred.kv_cache_tokens == 476_032
    assert pred.max_concurrency == pytest.approx(58.11, abs=0.01)


def test_gemma_3_27b_hybrid_v0_19_research_example(load_arch: LoadArch) -> None:
    # §7.5: group_size 10, 7 groups (1 full + 6 sliding); 19.53 GiB → 15,998 blocks → 36,560 tokens, 4.46×
    pred = predict(load_arch(GEMMA3_27B), kv_cache_memory_bytes=int(19.53 * GiB))
    assert pred.num_blocks == 15_998  # floor(19.53 GiB / (131,072 B × group_size 10))
    assert pred.kv_cache_tokens == 36_560  # 15,998 // 7 groups × 16
    assert pred.max_concurrency == pytest.approx(4.46, abs=0.005)


def test_hybrid_without_the_hybrid_manager_counts_every_layer_as_full(load_arch: LoadArch) -> None:
    # before the hybrid allocator (v0.8, "blocks"): sliding layers get full-length caches
    pred = predict(load_arch(GEMMA3_27B), "0.8.0", kv_cache_memory_bytes=int(19.53 * GiB))
    assert pred.num_blocks == int(19.53 * GiB) // (131_072 * 62)


def test_v0_21_tokens_are_concurrency_times_max_model_len(load_arch: LoadArch) -> None:
    arch = load_arch(GEMMA3_27B)
    avail = int(19.53 * GiB)
    for mml in (8192, 32768):
        pred = predict(arch, "0.21.0", kv_cache_memory_bytes=avail, max_model_len=mml)
        assert abs(pred.kv_cache_tokens - pred.max_concurrency * mml) <= 0.005 * mml + 1
    old = predict(arch, "0.20.0", kv_cache_memory_bytes=avail, max_model_len=32768)
    new = predict(arch, "0.21.0", kv_cache_memory_bytes=avail, max_model_len=32768)
    assert old.num_blocks == new.num_blocks
    assert old.kv_cache_tokens == 36_560  # ignores the window savings
    assert new.kv_cache_tokens > 2.5 * old.kv_cache_tokens  # window-aware (#41069)


def test_uniform_model_token_count_is_the_same_under_every_definition(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    avail = int(20 * GiB)
    counts = {v: predict(arch, v, kv_cache_memory_bytes=avail).kv_cache_tokens for v in ("0.8.0", "0.19.0", "0.21.0")}
    assert counts["0.8.0"] == counts["0.19.0"]
    assert counts["0.21.0"] == pytest.approx(counts["0.19.0"], abs=16)


def test_block_size_does_not_change_capacity_beyond_rounding(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    small = predict(arch, kv_cache_memory_bytes=int(20 * GiB))
    large = predict(arch, kv_cache_memory_bytes=int(20 * GiB), block_size=128)
    assert large.kv_cache_tokens == pytest.approx(small.kv_cache_tokens, abs=128)


def test_estimated_max_model_len_is_what_fits(load_arch: LoadArch) -> None:
    pred = predict(load_arch(LLAMA_8B), kv_cache_memory_bytes=2 * GiB, max_model_len=8192)
    assert pred.estimated_max_model_len == 16_384  # 2 GiB / 131,072 B


# --- failures: order and messages (§3) ----------------------------------------------------------------------


def test_failure_order_free_memory_check_first(load_arch: LoadArch) -> None:
    # weights would not fit either, but the free-memory check runs first
    pred = predict(load_arch(LLAMA_70B), other_gib=30)
    assert pred.failure is not None
    assert pred.failure.kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY


def test_failure_order_weights_before_kv(load_arch: LoadArch) -> None:
    pred = predict(load_arch(LLAMA_70B))
    assert pred.failure is not None
    assert pred.failure.kind is FailureKind.WEIGHTS_DO_NOT_FIT
    assert not pred.starts


def test_failure_order_no_kv_memory(load_arch: LoadArch) -> None:
    pred = predict(load_arch(QWEN_72B), tensor_parallel_size=2, gpu_memory_utilization=0.9)
    assert pred.failure is not None
    assert pred.failure.kind is FailureKind.NO_KV_CACHE_MEMORY
    assert pred.memory.kv_cache_gib == 0
    assert pred.kv_cache_tokens == 0


def test_failure_order_kv_too_small_last(load_arch: LoadArch) -> None:
    pred = predict(load_arch(LLAMA_8B), gpu_memory_utilization=0.3, max_model_len=131072)
    assert pred.failure is not None
    assert pred.failure.kind is FailureKind.KV_CACHE_TOO_SMALL
    assert 0 < pred.estimated_max_model_len < 131072


def test_fitting_config_has_no_failure(load_arch: LoadArch) -> None:
    pred = predict(load_arch(LLAMA_8B), gpu_memory_utilization=0.9)
    assert pred.starts and pred.failure is None


def test_max_model_len_above_derived_fails(load_arch: LoadArch) -> None:
    pred = predict(load_arch("microsoft/phi-2"), max_model_len=8192)
    assert pred.failure is not None
    assert pred.failure.kind is FailureKind.MAX_MODEL_LEN_TOO_LONG
    assert "User-specified max_model_len (8192) is greater than the derived max_model_len" in pred.failure.message
    assert "2048" in pred.failure.message


def test_invalid_tp_fails(load_arch: LoadArch) -> None:
    pred = predict(load_arch("Qwen/Qwen3-14B"), tensor_parallel_size=5)  # 40 heads ok, 8 KV heads not
    assert pred.failure is not None
    assert pred.failure.kind is FailureKind.INVALID_PARALLELISM
    assert "is not divisible by 5" in pred.failure.message


def test_tp_not_dividing_heads_fails(load_arch: LoadArch) -> None:
    pred = predict(load_arch(LLAMA_8B), tensor_parallel_size=3)
    assert pred.failure is not None
    assert pred.failure.kind is FailureKind.INVALID_PARALLELISM
    assert "Total number of attention heads (32) must be divisible by tensor parallel size (3)" in pred.failure.message


def test_invalid_tp_message_matches_the_real_log(load_arch: LoadArch) -> None:
    pred = predict(load_arch("Qwen/Qwen3-14B"), tensor_parallel_size=5)
    assert pred.failure is not None
    assert "151936 is not divisible by 5" in pred.failure.message


# Release attributions are ±1 minor (research notes §0): the tests stay clear of the era boundaries.
@pytest.mark.parametrize("version", ["0.15.0", "0.19.0", "0.26.0"])
def test_free_memory_message_names_the_device_in_recent_releases(load_arch: LoadArch, version: str) -> None:
    pred = predict(load_arch(LLAMA_8B), version, other_gib=20, gpu_memory_utilization=0.9)
    assert pred.failure is not None
    assert pred.failure.kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY
    msg = pred.failure.message
    # 20 GiB held by another process, 0.51 GiB by vLLM's own CUDA context: vLLM sees 58.68 GiB free
    assert "Free memory on device cuda:0 (58.68/79.19 GiB) on startup is less than desired GPU memory " \
           "utilization (0.9, 71.27 GiB)" in msg
    assert "Decrease GPU memory utilization or reduce GPU memory used by other processes." in msg


@pytest.mark.parametrize("version", ["0.9.1", "0.10.0", "0.12.0"])
def test_free_memory_message_without_device_0_9_to_0_12(load_arch: LoadArch, version: str) -> None:
    pred = predict(load_arch(LLAMA_8B), version, other_gib=20, gpu_memory_utilization=0.9)
    assert pred.failure is not None
    assert pred.failure.kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY
    assert "Free memory on device (58.68/79.19 GiB)" in pred.failure.message  # 20 GiB others + 0.51 own context
    assert "cuda:" not in pred.failure.message


def test_before_v0_9_1_other_processes_shrink_kv_instead(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    alone = predict(arch, "0.8.5", gpu_memory_utilization=0.9)
    shared = predict(arch, "0.8.5", other_gib=20, gpu_memory_utilization=0.9)
    assert shared.failure is None or shared.failure.kind is not FailureKind.INSUFFICIENT_FREE_GPU_MEMORY
    assert shared.memory.kv_cache_gib == pytest.approx(alone.memory.kv_cache_gib - 20, abs=0.02)


def test_from_v0_9_1_other_processes_do_not_shrink_kv(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    alone = predict(arch, "0.19.0", gpu_memory_utilization=0.5)
    shared = predict(arch, "0.19.0", other_gib=20, gpu_memory_utilization=0.5)
    assert shared.memory.kv_cache_gib == alone.memory.kv_cache_gib


def test_weights_oom_message_from_v0_13(load_arch: LoadArch) -> None:
    pred = predict(load_arch(LLAMA_70B), "0.19.0")
    assert pred.failure is not None
    msg = pred.failure.message
    assert msg.startswith("ValueError: Failed to load model - not enough GPU memory.")
    assert "GPU 0 has a total capacity of 79.19 GiB" in msg


def test_weights_oom_message_before_v0_13_is_raw_torch(load_arch: LoadArch) -> None:
    pred = predict(load_arch(LLAMA_70B), "0.11.0")
    assert pred.failure is not None
    assert pred.failure.kind is FailureKind.WEIGHTS_DO_NOT_FIT
    assert pred.failure.message.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert "Failed to load model" not in pred.failure.message


def test_no_kv_memory_message_per_release(load_arch: LoadArch) -> None:
    arch = load_arch(QWEN_72B)
    # 0.85 x 79.19 GiB = 67.3 GiB requested < the 67.8 GiB of weights per GPU: nothing left for KV in any release
    old = predict(arch, "0.19.0", tensor_parallel_size=2, gpu_memory_utilization=0.85)
    new = predict(arch, "0.26.0", tensor_parallel_size=2, gpu_memory_utilization=0.85)
    for pred in (old, new):
        assert pred.failure is not None
        assert pred.failure.kind is FailureKind.NO_KV_CACHE_MEMORY
        assert "No available memory for the cache blocks. Try increasing `gpu_memory_utilization`" in pred.failure.message
    assert "CPU backend" not in old.failure.message  # type: ignore[union-attr]
    assert "CPU backend" in new.failure.message  # type: ignore[union-attr]


def _kv_too_small(load_arch: LoadArch, version: str) -> StartupPrediction:
    pred = predict(load_arch(LLAMA_8B), version, gpu_memory_utilization=0.3, max_model_len=131072)
    assert pred.failure is not None
    assert pred.failure.kind is FailureKind.KV_CACHE_TOO_SMALL
    return pred


@pytest.mark.parametrize("version", ["0.5.4", "0.6.5"])
def test_kv_too_small_v0_wording(load_arch: LoadArch, version: str) -> None:
    pred = _kv_too_small(load_arch, version)
    msg = pred.failure.message  # type: ignore[union-attr]
    tokens = pred.num_blocks * 16
    assert (f"The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in "
            f"KV cache ({tokens})") in msg
    assert tokens < 131072


@pytest.mark.parametrize("version", ["0.10.0", "0.15.0", "0.20.0"])
def test_kv_too_small_typo_wording_0_10_to_0_20(load_arch: LoadArch, version: str) -> None:
    pred = _kv_too_small(load_arch, version)
    msg = pred.failure.message  # type: ignore[union-attr]
    assert "To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed" in msg
    assert f"available KV cache memory ({pred.memory.kv_cache_gib:.2f} GiB)" in msg
    assert f"the estimated maximum model length is {pred.estimated_max_model_len}." in msg


@pytest.mark.parametrize("version", ["0.22.0", "0.26.0"])
def test_kv_too_small_current_wording_in_the_newest_releases(load_arch: LoadArch, version: str) -> None:
    pred = _kv_too_small(load_arch, version)
    msg = pred.failure.message  # type: ignore[union-attr]
    assert "models's" not in msg
    assert "To serve at least one request with the model's max seq len (131072), (16.00 GiB KV cache is needed" in msg
    match = re.search(r"the estimated maximum model length is (\d+)\.", msg)
    assert match is not None
    assert int(match.group(1)) == pred.estimated_max_model_len
    assert "(which also controls CPU memory on the CPU backend)" in msg


def test_kv_needed_for_32k_of_llama_3_70b_is_10_gib(load_arch: LoadArch) -> None:
    pred = predict(load_arch(LLAMA_3_70B), total_gib=178.41, kv_cache_memory_bytes=GiB, max_model_len=8192)
    assert pred.failure is not None and pred.failure.kind is FailureKind.KV_CACHE_TOO_SMALL
    assert "(2.50 GiB KV cache is needed" in pred.failure.message  # 8192 × 0.3125 MiB


def test_mla_needed_bytes_issue_15871(load_arch: LoadArch) -> None:
    # issue #15871: 32,768 tokens of DeepSeek-V2-Lite need 32,768 × 31,104 B = 0.95 GiB
    pred = predict(load_arch(DSV2_LITE), "0.19.0", kv_cache_memory_bytes=GiB // 2, max_model_len=32768)
    assert pred.failure is not None and pred.failure.kind is FailureKind.KV_CACHE_TOO_SMALL
    assert "(0.95 GiB KV cache is needed" in pred.failure.message


def test_sliding_window_needs_less_for_one_long_request(load_arch: LoadArch) -> None:
    arch = load_arch(GEMMA3_27B)
    pred = predict(arch, "0.19.0", kv_cache_memory_bytes=10 * GiB, max_model_len=131072)
    # 52 sliding layers hold at most ~window + batch tokens each; only the 10 full layers grow with the length
    every_layer_full = 10 * GiB // (62 * 8192)
    assert pred.estimated_max_model_len > 3 * every_layer_full
    assert pred.estimated_max_model_len < 10 * GiB // (10 * 8192)


# --- 0.22-0.33: the model runner, the consumed-memory profiler, SWA in flight, the null block, YaRN ------------------

GEMMA2_2B = "google/gemma-2-2b-it"


def _budget_terms(pred: StartupPrediction) -> float:
    m = pred.memory
    return m.requested_gib - m.weights_gib - m.activation_gib - m.non_torch_gib - m.persistent_gib


def test_v1_runner_subtracts_the_graph_estimate_in_0_23(load_arch: LoadArch) -> None:
    pred = predict(load_arch(LLAMA_8B), "0.23.0")
    assert pred.memory.cudagraph_gib > 0.5
    assert pred.memory.kv_cache_gib == pytest.approx(_budget_terms(pred) - pred.memory.cudagraph_gib, abs=0.03)


@pytest.mark.parametrize("version", ["0.24.0", "0.26.0", "0.28.0"])
def test_v2_runner_subtracts_no_graph_estimate_before_0_29(load_arch: LoadArch, version: str) -> None:
    # gpu/model_runner.py::profile_cudagraph_memory returns 0 on MRV2 up to 0.28
    arch = load_arch(LLAMA_8B)
    assert profile_for_model(profile_for(version), arch).runner == "V2"
    pred = predict(arch, version)
    assert pred.memory.kv_cache_gib == pytest.approx(_budget_terms(pred), abs=0.03)


def test_v2_runner_subtracts_its_estimate_from_0_29(load_arch: LoadArch) -> None:
    pred = predict(load_arch(LLAMA_8B), "0.29.0")
    assert pred.memory.cudagraph_gib == pytest.approx(0.3 + 0.0165 * 32, abs=0.01)  # scale 1.0 (ESTIMATE)
    assert pred.memory.kv_cache_gib == pytest.approx(_budget_terms(pred) - pred.memory.cudagraph_gib, abs=0.03)
    assert "cudagraph_gib" in pred.memory.estimated and "kv_cache_gib" in pred.memory.estimated


def test_0_27_counts_the_v2_sampler_state_and_no_allocator_leftovers(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)  # vocab 128256
    before, after = predict(arch, "0.26.0", max_num_seqs=1024), predict(arch, "0.27.0", max_num_seqs=1024)
    assert before.memory.persistent_gib == 0
    state = 4.25 * 1024 * 128256 / GiB  # output_bin_counts + prompt_bin_mask + grammar bitmask
    # memory_profiling measures after gc.collect() + empty_cache(): the allocator keeps no free segment
    assert after.memory.persistent_gib == pytest.approx(state, abs=0.01)
    assert before.memory.kv_cache_gib - after.memory.kv_cache_gib == pytest.approx(state, abs=0.02)
    assert before.memory.estimated == after.memory.estimated == []  # read from the code: nothing left to estimate


def test_v2_sampler_pass_holds_the_logits_in_the_model_dtype(load_arch: LoadArch) -> None:
    """_dummy_sampler_run (0.22-0.32): the TP shard and the gathered logits in bf16, sampled greedily (no fp32 copy);
    0.33 adds the warm-up pass's fp32 copy and FlashInfer's buffers (an ESTIMATE, named in the plan)."""
    arch = load_arch(LLAMA_8B)
    rows, vocab = 1024, 128256
    flags = EngineFlags(tensor_parallel_size=2, max_model_len=8192, max_num_seqs=rows, max_num_batched_tokens=1024)
    v27 = profile_for_model(profile_for("0.27.0"), arch)
    v33 = profile_for_model(profile_for("0.33.0"), arch)
    assert v2_sampler_entry_bytes(arch, flags, v27) == 2 * (1 + 1 / 2)
    assert v2_sampler_entry_bytes(arch, flags, v33) == 2 * (1 + 1 / 2) + 12
    # at 1024 batched tokens the sampler pass is the peak: base + logits + the batch's hidden states
    peak = activation_bytes(arch, flags, v27, last_stage=True)
    assert peak == int(0.087 * GiB + 3 * rows * vocab + 2.25 * 1024 * arch.hidden_size)
    assert "activation_gib" in predict(arch, "0.33.0", max_num_seqs=rows).memory.estimated
    assert "activation_gib" not in predict(arch, "0.32.0", max_num_seqs=rows).memory.estimated


def test_v1_runner_has_no_sampler_state(load_arch: LoadArch) -> None:
    arch = load_arch(QWEN3_235B)  # MoE, not listed: the V1 runner up to 0.28
    assert profile_for_model(profile_for("0.28.0"), arch).runner == "V1"
    pred = predict(arch, "0.28.0", tensor_parallel_size=4, total_gib=139.75)
    assert pred.memory.persistent_gib == 0


def test_sliding_window_keeps_two_batches_in_flight_from_0_26(load_arch: LoadArch) -> None:
    # SlidingWindowSpec: cdiv(min(window − 1 + k × mnbt, len), block) + 1, k = 1 up to 0.25, 2 from 0.26
    arch = load_arch(GEMMA2_2B)  # window 4096, 13 sliding + 13 full layers → two groups
    old = predict(arch, "0.25.0", max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=256)
    new = predict(arch, "0.26.0", max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=256)
    full = 8192 // 16
    assert old.num_blocks / old.max_concurrency == pytest.approx(full + -(-(4095 + 2048) // 16) + 1, rel=0.01)
    assert new.num_blocks / new.max_concurrency == pytest.approx(full + -(-(4095 + 4096) // 16) + 1, rel=0.01)


@pytest.mark.parametrize(("version", "fails"), [("0.28.0", False), ("0.29.0", True)])
def test_kv_check_keeps_the_null_block_back_from_0_29(load_arch: LoadArch, version: str, fails: bool) -> None:
    # Llama-3.1-8B: a block of 16 tokens over 32 layers is 32 × 65536 B; one request of 1024 tokens needs 64 blocks
    needed = 64 * 32 * 65536
    pred = predict(load_arch(LLAMA_8B), version, max_model_len=1024, kv_cache_memory_bytes=needed)
    assert (pred.failure is not None and pred.failure.kind is FailureKind.KV_CACHE_TOO_SMALL) is fails


def _qwen25_yarn() -> ModelArch:
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
              "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
              "intermediate_size": 18944, "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
              "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    return arch_from_config(config, model_id="test/qwen2.5-yarn")


@pytest.mark.parametrize(("version", "fails"), [("0.29.0", False), ("0.30.0", True)])
def test_yarn_factor_no_longer_extends_the_length_from_0_30(version: str, fails: bool) -> None:
    arch = _qwen25_yarn()
    assert arch.derived_max_model_len == 131072 and arch.yarn_unscaled_max_len == 32768
    pred = predict(arch, version, max_model_len=65536, kv_cache_memory_bytes=20 * GiB)
    assert (pred.failure is not None and pred.failure.kind is FailureKind.MAX_MODEL_LEN_TOO_LONG) is fails


def _qwen3_next_like(**overrides: Any) -> ModelArch:
    config = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
              "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
              "vocab_size": 151936, "intermediate_size": 5120, "max_position_embeddings": 262144,
              "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
              "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
              "torch_dtype": "bfloat16", **overrides}
    return arch_from_config(config, model_id="test/qwen3-next")


def test_linear_attention_hybrid_gives_kv_to_full_attention_layers_only() -> None:
    arch = _qwen3_next_like()
    # GDN state: conv (4 − 1) × (2·16·128 + 32·128) + recurrent 32·128·128 elements, bf16 → 1,097,728 B per layer
    assert arch.state_elements == 3 * 8192 + 524288
    pred = predict(arch, "0.33.0", max_model_len=4096, kv_cache_memory_bytes=10 * GiB, enable_prefix_caching=False)
    assert pred.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2  # 12 full-attention layers of 48
    # the attention block grows to 16·⌈1,097,728 / (16·2048)⌉ = 544 tokens so that one page holds a state;
    # 36 linear + 12 full layers → group size 12: 3 state groups (1 block per request) + 1 attention group
    page = 544 * 2048
    assert pred.num_blocks == 10 * GiB // (page * 12)
    per_request = 3 + -(-4096 // 544)
    assert pred.max_concurrency == pytest.approx(pred.num_blocks / per_request, abs=0.01)
    assert pred.kv_cache_tokens == int(pred.num_blocks / per_request * 4096)


def test_linear_state_shards_over_tensor_parallel_ranks() -> None:
    arch = _qwen3_next_like()
    one = predict(arch, "0.33.0", max_model_len=4096, kv_cache_memory_bytes=10 * GiB)
    two = predict(arch, "0.33.0", max_model_len=4096, kv_cache_memory_bytes=10 * GiB, tensor_parallel_size=2)
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2
    assert two.max_concurrency == pytest.approx(2 * one.max_concurrency, rel=0.05)


def test_the_plan_text_names_the_estimates(load_arch: LoadArch) -> None:
    from vllm_operator.planner import PlanRequest, plan
    from vllm_operator.planner.gpus import load_gpu_catalog
    from vllm_operator.planner.report import render_plan_text

    l4 = load_gpu_catalog().get("L4")
    old = plan(PlanRequest(arch=load_arch(LLAMA_8B), gpu=l4, vllm_version="0.21.0"))
    new = plan(PlanRequest(arch=load_arch(LLAMA_8B), gpu=l4, vllm_version="0.33.0"))
    assert old.memory.estimated == [] and "estimates" not in render_plan_text(old)
    assert set(new.memory.estimated) == {"activation_gib", "cudagraph_gib", "kv_cache_gib"}
    text = render_plan_text(new)
    assert "CUDA graphs (Model Runner V2 estimate)" in text and "sampler peak" in text


def test_a_resolved_profile_is_resolved_again_for_another_model(load_arch: LoadArch) -> None:
    # 0.22-0.23: dense Qwen3 runs MRV2, a quantized one does not
    dense = load_arch("Qwen/Qwen3-8B")
    resolved = profile_for_model(profile_for("0.22.0"), dense)
    assert resolved.runner == "V2" and not resolved.cudagraph_subtracted
    quantized = dense.model_copy(update={"quantization": arch_from_config(
        {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 1,
         "vocab_size": 8, "quantization_config": {"quant_method": "fp8"}}, model_id="q").quantization})
    again = profile_for_model(resolved, quantized)
    assert again.runner == "V1" and again.cudagraph_subtracted and again.sampler_bytes == 14.2


@pytest.mark.parametrize(("version", "prefix_caching", "state_pages"), [
    ("0.27.0", None, 1), ("0.28.0", None, 2), ("0.33.0", False, 1), ("0.27.0", True, 2),
])
def test_hybrid_prefix_caching_keeps_two_state_pages_per_request(version: str, prefix_caching: bool | None,
                                                                 state_pages: int) -> None:
    # 0.28+: prefix caching on by default for hybrids → mamba_cache_mode "align" → MambaSpec holds 2 pages
    pred = predict(_qwen3_next_like(), version, max_model_len=4096, kv_cache_memory_bytes=10 * GiB,
                   enable_prefix_caching=prefix_caching)
    per_request = 3 * state_pages + -(-4096 // 544)
    assert pred.max_concurrency == pytest.approx(pred.num_blocks / per_request, abs=0.01)


def test_vllm_s_estimate_keeps_the_null_block_back_from_0_29(load_arch: LoadArch) -> None:
    # the estimated maximum length in the KV-too-small message is what one request can have in avail − one block
    arch = load_arch(LLAMA_8B)
    avail = 64 * 32 * 65536  # exactly 1024 tokens
    old = predict(arch, "0.28.0", max_model_len=2048, kv_cache_memory_bytes=avail)
    new = predict(arch, "0.29.0", max_model_len=2048, kv_cache_memory_bytes=avail)
    assert old.estimated_max_model_len == 1024
    assert new.estimated_max_model_len == 1008  # one block of 16 tokens fewer
    assert new.failure is not None and "estimated maximum model length is 1008" in new.failure.message
    fits = predict(arch, "0.29.0", max_model_len=new.estimated_max_model_len, kv_cache_memory_bytes=avail)
    assert fits.failure is None


def test_sliding_window_in_flight_batches_follow_pipeline_stages_on_mrv2(load_arch: LoadArch) -> None:
    # 0.26+: max_concurrent_batches = pp + 1 on Model Runner V2 with pipeline parallelism
    arch = load_arch(GEMMA2_2B)
    pred = predict(arch, "0.26.0", max_model_len=16384, max_num_batched_tokens=2048, max_num_seqs=256,
                   pipeline_parallel_size=2, kv_cache_memory_bytes=4 * GiB)
    assert profile_for_model(profile_for("0.26.0"), arch).runner == "V2"
    full = 16384 // 16
    sliding = -(-(4095 + 3 * 2048) // 16) + 1
    assert pred.num_blocks / pred.max_concurrency == pytest.approx(full + sliding, rel=0.01)


# --- CUDA-graph capture sizes and the graph estimate (config/vllm.py::_set_cudagraph_sizes, 0.28) --------------


def test_capture_sizes_are_vllms_default_list() -> None:
    sizes = cudagraph_capture_sizes(1024, 8192)
    assert len(sizes) == 51 and sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512  # "PIECEWISE=51 (largest=512)"
    assert len(cudagraph_capture_sizes(1024, 8192, largest_default=1024)) == 83  # + 32 sizes of 16 up to 1024
    # largest = min(2 × max_num_seqs × query length, default, max_num_batched_tokens); mnbt itself when below it
    assert cudagraph_capture_sizes(10, 2048) == [1, 2, 4, 8, 16]
    assert cudagraph_capture_sizes(256, 300) == [*cudagraph_capture_sizes(128, 8192), 272, 288, 300]
    assert cudagraph_capture_sizes(4, 2048, decode_query_len=5) == [1, 2, 4, 8, 16, 24, 32, 40]


def test_full_decode_graphs_stop_at_max_num_seqs(load_arch: LoadArch) -> None:
    arch, profile = load_arch(LLAMA_8B), profile_for("0.21.0")
    h100 = EngineFlags(max_model_len=8192, max_num_seqs=1024, max_num_batched_tokens=8192)
    l4 = EngineFlags(max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=2048)
    assert cudagraph_capture_counts(arch, h100, profile) == (51, 51, 512)
    assert cudagraph_capture_counts(arch, l4, profile) == (51, 35, 512)  # FULL only up to 256 = max_num_seqs


def test_graph_estimate_scales_with_the_graphs_captured(load_arch: LoadArch) -> None:
    """0.3 GiB shared + 0.0165 GiB per layer per (51 − 1) + (51 − 1) further graphs, × the era's scale."""
    arch = load_arch(LLAMA_8B)  # 32 layers
    v19, v21 = profile_for("0.19.0"), profile_for("0.21.0")
    h100 = EngineFlags(max_model_len=8192, max_num_seqs=1024, max_num_batched_tokens=8192)
    assert cudagraph_bytes(arch, h100, v19, 32) / GiB == pytest.approx(0.3 + 0.0165 * 32, abs=1e-6)  # as calibrated
    few = h100.model_copy(update={"max_num_seqs": 10})  # PIECEWISE 1..16 (5 graphs), FULL up to 10 (4 graphs)
    assert cudagraph_capture_counts(arch, few, v19) == (5, 4, 16)
    assert cudagraph_bytes(arch, few, v19, 32) / GiB == pytest.approx(0.3 + 0.0165 * 32 * 7 / 100, abs=1e-6)
    # the 0.21 scale reproduces the RTX A5000 Qwen3-8B log (256 sequences, 36 layers): 0.52 GiB
    qwen3 = EngineFlags(max_model_len=40960, max_num_seqs=256, max_num_batched_tokens=2048)
    assert cudagraph_bytes(arch, qwen3, v21, 36) / GiB == pytest.approx(0.52, abs=0.005)
    assert cudagraph_bytes(arch, h100.model_copy(update={"enforce_eager": True}), v21, 32) == 0


def test_compute_capability_10_captures_up_to_1024_from_0_28(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    flags = EngineFlags(max_model_len=8192, max_num_seqs=1024, max_num_batched_tokens=16384)
    v27, v28 = profile_for("0.27.0"), profile_for("0.28.0")
    assert cudagraph_capture_counts(arch, flags, v27, "10.0") == (51, 51, 512)
    assert cudagraph_capture_counts(arch, flags, v28, "10.0") == (83, 83, 1024)
    assert cudagraph_capture_counts(arch, flags, v28, "10.3") == (83, 83, 1024)  # B300/GB300
    assert cudagraph_capture_counts(arch, flags, v28, "12.0") == (51, 51, 512)   # RTX 50xx / PRO 6000: not 10.x
    assert cudagraph_capture_counts(arch, flags, v28, "9.0") == (51, 51, 512)
    # (0.3 × 1024/512 shared, ESTIMATE) + 0.0165 × 32 × (82 + 82) / 100
    assert cudagraph_bytes(arch, flags, v28, 32, compute_capability="10.0") / GiB == pytest.approx(
        (0.6 + 0.0165 * 32 * 164 / 100) * v28.cudagraph_scale, abs=1e-6)
    b200 = GPUFacts(total_gib=178.41, compute_capability="10.0")
    v33 = profile_for("0.33.0")
    pred = predict_startup(arch, flags, b200, v33)
    assert pred.memory.cudagraph_gib == round((0.6 + 0.0165 * 32 * 164 / 100) * v33.v2_cudagraph_scale, 2)
    assert "cudagraph_gib" in pred.memory.estimated
    # the same B200 on 0.27 captured 51 graphs per mode; MRV2's estimate is 0 there, graphs sit in the headroom
    assert predict_startup(arch, flags, b200, v27).memory.cudagraph_gib == round(
        (0.3 + 0.0165 * 32) * v27.v2_cudagraph_scale, 2)


# --- pipeline parallelism: communicators and the receive buffer ----------------------------------------------


def test_pp_group_communicator_is_held_before_the_init_snapshot() -> None:
    """parallel_state.initialize_model_parallel: the PP group's PyNcclCommunicator is warmed up in init_device, before
    the snapshot (ESTIMATE 0.5 GiB on NVLink GPUs, 0.25 GiB on PCIe)."""
    assert init_nontorch_gib(1, True) == 0.51 and init_nontorch_gib(2, True) == 2.01
    assert init_nontorch_gib(2, True, pp=2) == pytest.approx(2.51)
    assert init_nontorch_gib(8, True, pp=4) == pytest.approx(2.51)  # one PP group per rank, whatever its size
    assert init_nontorch_gib(2, False, pp=2) == pytest.approx(0.51 + 0.25 + 0.25)
    assert init_nontorch_gib(1, False, pp=4) == pytest.approx(0.76)


def test_mrv2_pp_broadcast_communicator_is_booked_outside_the_budget(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    v1 = profile_for_model(profile_for("0.21.0"), arch)
    v2 = profile_for_model(profile_for("0.33.0"), arch)
    pp2 = EngineFlags(pipeline_parallel_size=2, max_model_len=8192, max_num_seqs=1024, max_num_batched_tokens=8192)
    assert serving_comm_bytes(pp2, v1, nvlink=True) == 0
    assert serving_comm_bytes(pp2, v2, nvlink=True) == GiB // 2
    assert serving_comm_bytes(pp2.model_copy(update={"pipeline_parallel_size": 1}), v2, nvlink=True) == 0
    assert outside_budget_gib(1, 2, True, v2) == pytest.approx(0.51 + 0.5 + 0.5)
    assert outside_budget_gib(2, 2, True, v2) == pytest.approx(3.01)  # issue 15: ~3.0 GiB per stage seen
    assert outside_budget_gib(1, 2, True, v1) == pytest.approx(0.51 + 0.5)


def test_non_first_stages_keep_a_receive_buffer(load_arch: LoadArch) -> None:
    """make_empty_intermediate_tensors: hidden_states + residual, max_num_batched_tokens × hidden (not split by TP)."""
    arch = load_arch(LLAMA_70B)  # hidden 8192, bf16
    flags = EngineFlags(tensor_parallel_size=4, pipeline_parallel_size=2, max_model_len=8192, max_num_seqs=1024,
                        max_num_batched_tokens=8192)
    assert pp_intermediate_bytes(arch, flags, 0) == 0
    assert pp_intermediate_bytes(arch, flags, 1) == 2 * 8192 * 8192 * 2  # 256 MiB
    # V1 runner: allocated in the profile run, so inside the activation peak of stage 1
    v1 = profile_for_model(profile_for("0.21.0"), arch)
    first, second = (stage_terms(arch, flags, v1, s, 40) for s in (0, 1))
    plain = activation_bytes(arch, flags, v1, last_stage=True)
    assert second.activation - plain == 2 * 8192 * 8192 * 2 and first.persistent == second.persistent == 0
    # MRV2 (Llama from 0.24): allocated in load_model, persistent: in the headroom before 0.27, in the budget after
    v26 = profile_for_model(profile_for("0.26.0"), arch)
    v27 = profile_for_model(profile_for("0.27.0"), arch)
    state = v2_sampler_state_bytes(arch, flags, v26)
    assert stage_terms(arch, flags, v26, 1, 40).headroom == state + 2 * 8192 * 8192 * 2
    assert stage_terms(arch, flags, v27, 1, 40).persistent == state + 2 * 8192 * 8192 * 2
    assert stage_terms(arch, flags, v27, 0, 40).persistent == 0


def test_pp_communicator_can_fail_the_free_memory_check(load_arch: LoadArch) -> None:
    """What the PP communicator holds before the snapshot is not free when vLLM compares free with total × util."""
    arch = load_arch(LLAMA_70B)
    flags: dict[str, Any] = dict(tensor_parallel_size=4, max_model_len=8192, gpu_memory_utilization=0.972)
    assert predict(arch, version="0.21.0", **flags).failure is None  # 79.19 − 2.01 ≥ 76.97 requested
    failed = predict(arch, version="0.21.0", pipeline_parallel_size=2, **flags).failure
    assert failed is not None and failed.kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY  # 79.19 − 2.51 < 76.97
    assert "(76.68/79.19 GiB)" in failed.message


# --- externally held weights (0.32, v1/worker/utils.py::request_memory) ---------------------------------------


def test_external_weights_leave_the_budget_from_0_32(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    v31, v32 = profile_for("0.31.0"), profile_for("0.32.0")
    assert external_weights_bytes(EngineFlags(max_model_len=1, max_num_seqs=1, max_num_batched_tokens=1,
                                              load_format="ipc_cache"), v31, 10 * GiB) == 0  # no such loader yet
    local = predict(arch, version="0.32.0")
    mapped = predict(arch, version="0.32.0", load_format="ipc_cache")
    # engine budget = ceil(total × util) − external weights, and nothing is loaded into the process: the same KV
    assert mapped.memory.kv_cache_gib == local.memory.kv_cache_gib and mapped.num_blocks == local.num_blocks
    assert mapped.failure is None and local.failure is None
    assert v32.external_weights_budget and not v31.external_weights_budget


def test_external_weights_change_the_startup_check(load_arch: LoadArch) -> None:
    """The daemon's weights are another process's memory: a local load at util 0.9 fails the free check, the
    zero-copy start compares free memory with the budget less those weights and starts."""
    arch = load_arch(LLAMA_8B)  # 15.01 GiB of weights
    weights = 15.01 * 1.0  # held by the weight-cache daemon
    local = predict(arch, version="0.32.0", other_gib=weights, gpu_memory_utilization=0.9)
    assert local.failure is not None and local.failure.kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY
    assert "desired GPU memory utilization" in local.failure.message
    mapped = predict(arch, version="0.32.0", other_gib=weights, gpu_memory_utilization=0.9, load_format="ipc_cache")
    assert mapped.failure is None
    # 0.9 x 79.19 = 71.27 budget, 15.01 of it held outside: 56.26 for the engine; 79.19 - 15.01 - 0.51 free ≥ 56.26
    tight = predict(arch, version="0.32.0", other_gib=weights + 10, gpu_memory_utilization=0.9,
                    load_format="ipc_cache")
    assert tight.failure is not None and tight.failure.kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY
    assert "the engine's budget after excluding external process's weights" in tight.failure.message
    assert re.search(r"\(0\.9, 56\.2\d GiB\)", tight.failure.message)


def test_external_weights_above_the_budget_are_an_error(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    low = predict(arch, version="0.33.0", gpu_memory_utilization=0.15, load_format="ipc_cache")  # 11.88 < 15.01
    assert low.failure is not None and low.failure.kind is FailureKind.INVALID_ARGUMENT
    assert low.failure.message.startswith("ValueError: Externally held weights on device cuda:0 (15.")
    assert "exceed the desired GPU memory utilization (0.15, 11.88 GiB)" in low.failure.message


# --- 2026 hybrid models of the built-in catalog (catalog/models; configs as recalled, see their source notes) ----

QWEN3_NEXT = "Qwen/Qwen3-Next-80B-A3B-Instruct"
GRANITE_4_H = "ibm-granite/granite-4.0-h-small"


def test_qwen3_next_80b_layers_and_state(load_arch: LoadArch) -> None:
    """48 layers, full_attention_interval 4: layers 3, 7, …, 47 hold KV (12), the other 36 a Gated DeltaNet state."""
    from vllm_operator.planner.arch import LayerKind
    from vllm_operator.planner.memory import state_page_bytes

    arch = load_arch(QWEN3_NEXT)
    full = [i for i, kind in enumerate(arch.layer_kinds) if kind is LayerKind.FULL]
    assert full == list(range(3, 48, 4)) and arch.layer_kinds.count(LayerKind.LINEAR) == 36
    assert arch.is_moe and arch.num_experts == 512 and arch.experts_per_token == 10
    # conv (4 − 1) × (2·16·128 + 32·128) + recurrent 32·128·128 = 548,864 elements, split over TP ranks, bf16
    assert arch.state_elements == 548_864
    tp4 = EngineFlags(tensor_parallel_size=4, max_model_len=32768, max_num_seqs=256, max_num_batched_tokens=8192)
    assert state_page_bytes(arch, tp4) == 137_216 * 2


def test_qwen3_next_80b_on_four_h100s(load_arch: LoadArch) -> None:
    arch = load_arch(QWEN3_NEXT)
    pred = predict(arch, "0.33.0", tensor_parallel_size=4, max_model_len=32768, kv_cache_memory_bytes=20 * GiB)
    # 2 KV heads at TP 4: one (replicated) head per rank → 12 layers × 2 × 1 × 256 × 2 B
    assert pred.kv_bytes_per_token == 12_288
    # attention block 16·⌈274,432 / (16 · 1,024)⌉ = 272 tokens, page 272 × 1,024 = 278,528 B ≥ the state page;
    # group size 12 (1 attention + 3 state groups): a block id holds 12 pages
    assert pred.num_blocks == 20 * GiB // (278_528 * 12)
    # 0.28+: prefix caching on for hybrids → 2 state pages per group; 0.33 on an H100 (or a GPU not named): FlashInfer's
    # GDN prefill exports a checkpoint → 3
    per_request = -(-32768 // 272) + 3 * 3
    assert pred.max_concurrency == pytest.approx(pred.num_blocks / per_request, abs=0.01)
    # weights: the checkpoint's 162,649,725,440 B (MTP layer included) over 4 ranks, the embedding and lm_head split
    assert pred.memory.weights_gib == pytest.approx(162_649_725_440 / 4 / GiB, rel=0.01)
    assert pred.failure is None


def test_qwen3_next_80b_plan_needs_four_h100s(load_arch: LoadArch) -> None:
    from vllm_operator.planner import PlanRequest, plan
    from vllm_operator.planner.gpus import load_gpu_catalog

    h100 = load_gpu_catalog().get("H100")
    planned = plan(PlanRequest(arch=load_arch(QWEN3_NEXT), gpu=h100, gpu_count=4, vllm_version="0.33.0"))
    assert planned.fits and planned.flags["tensor_parallel_size"] == 4
    assert planned.prediction.kv_bytes_per_token == 12_288
    two = plan(PlanRequest(arch=load_arch(QWEN3_NEXT), gpu=h100, gpu_count=2, vllm_version="0.33.0"))
    assert not two.fits  # 75.7 GiB of weights per GPU at TP 2


def test_granite_4_h_small_layers_and_state(load_arch: LoadArch) -> None:
    """40 layers: attention at 5, 15, 25, 35, Mamba-2 elsewhere (layer_types)."""
    from vllm_operator.planner.arch import LayerKind
    from vllm_operator.planner.memory import state_page_bytes

    arch = load_arch(GRANITE_4_H)
    full = [i for i, kind in enumerate(arch.layer_kinds) if kind is LayerKind.FULL]
    assert full == [5, 15, 25, 35] and arch.layer_kinds.count(LayerKind.LINEAR) == 36
    # mamba2_state_shape: conv (4 − 1) × (8192 + 2·1·128) + SSM 128 heads × 64 × 128 = 1,073,920 elements, bf16
    assert arch.state_elements == 3 * 8448 + 128 * 64 * 128 == 1_073_920
    flags = EngineFlags(max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=8192)
    assert state_page_bytes(arch, flags) == 2_147_840


def test_granite_4_h_small_on_one_h100(load_arch: LoadArch) -> None:
    arch = load_arch(GRANITE_4_H)
    pred = predict(arch, "0.33.0", max_model_len=8192, kv_cache_memory_bytes=20 * GiB)
    assert pred.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2  # 4 attention layers of 40
    # attention block 16·⌈2,147,840 / (16 · 4,096)⌉ = 528 tokens, page 2,162,688 B; 36 Mamba + 4 attention layers →
    # group size 4: 9 state groups + 1 attention group
    assert pred.num_blocks == 20 * GiB // (528 * 4096 * 4) == 2482
    per_request = -(-8192 // 528) + 9 * 3  # 0.32+: Mamba2 keeps a prefill checkpoint page (2 + 1 in "align" mode)
    assert pred.max_concurrency == pytest.approx(2482 / per_request, abs=0.01)
    assert pred.memory.weights_gib == pytest.approx(63_659_701_248 / GiB, rel=0.01)
    plain = predict(arch, "0.33.0", max_model_len=8192)
    assert plain.failure is None and plain.memory.kv_cache_gib > 5


def test_unified_memory_marks_the_host_side_growth_as_an_estimate(load_arch: LoadArch) -> None:
    """MemorySnapshot.measure (0.26.0-0.33.0): on an integrated GPU free memory is psutil's available host memory."""
    arch = load_arch(LLAMA_8B)
    flags = EngineFlags(max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=2048)
    uma = GPUFacts(total_gib=119.8, uma=True)
    new = predict_startup(arch, flags, uma, profile_for("0.27.0"))
    assert "non_torch_gib" in new.memory.estimated and "kv_cache_gib" in new.memory.estimated
    assert "non_torch_gib" not in predict_startup(arch, flags, uma, profile_for("0.11.0")).memory.estimated
    assert "non_torch_gib" not in predict_startup(arch, flags, GPUFacts(total_gib=119.8), profile_for("0.27.0")
                                                  ).memory.estimated


@pytest.mark.parametrize(("version", "cc", "state_pages"), [
    ("0.32.0", "9.0", 2),    # Gated DeltaNet exports no prefill checkpoint before 0.33
    ("0.33.0", "9.0", 3),    # Hopper: FlashInfer's GDN prefill, one checkpoint page more
    ("0.33.0", "12.0", 3),   # Blackwell with a key head dim of 128
    ("0.33.0", "8.9", 2),    # Ada: the Triton/FLA prefill, no checkpoint
    ("0.33.0", None, 3),     # unknown GPU: the larger booking
])
def test_gated_deltanet_prefill_checkpoint_page(version: str, cc: str | None, state_pages: int) -> None:
    """MambaSpec.max_memory_usage_bytes in "align" mode: 2 + num_prefill_checkpoint_blocks pages per request."""
    arch = _qwen3_next_like()
    flags = EngineFlags(max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=2048,
                        kv_cache_memory_bytes=10 * GiB, enable_prefix_caching=True)
    pred = predict_startup(arch, flags, GPUFacts(total_gib=79.19, compute_capability=cc), profile_for(version))
    per_request = 3 * state_pages + -(-4096 // 544)
    assert pred.max_concurrency == pytest.approx(pred.num_blocks / per_request, abs=0.01)


def test_mamba2_keeps_a_prefill_checkpoint_page_from_0_32(load_arch: LoadArch) -> None:
    arch = load_arch(GRANITE_4_H)
    assert arch.state_layer == "mamba2"
    v31, v32 = profile_for_model(profile_for("0.31.0"), arch), profile_for_model(profile_for("0.32.0"), arch)
    assert not prefill_checkpoint_page(arch, v31, "8.9") and prefill_checkpoint_page(arch, v32, "8.9")


def test_a_pipeline_stage_grows_like_a_single_gpu_plus_its_nccl_group() -> None:
    profile = profile_for("0.27.0")
    single = EngineFlags(max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=8192)
    stage = single.model_copy(update={"pipeline_parallel_size": 2})
    pcie_tp = single.model_copy(update={"tensor_parallel_size": 2})
    assert non_torch_bytes(stage, profile, nvlink=False) == non_torch_bytes(pcie_tp, profile, nvlink=False)
    assert non_torch_bytes(stage, profile) - non_torch_bytes(single, profile) == pytest.approx(0.07 * GiB, abs=2)
