"""Gated DeltaNet prefill on FLA's Triton kernels (issue 23): what chunk_gated_delta_rule_fwd allocates for the
profile run's batch is booked in the activation peak where vLLM runs FLA rather than FlashInfer, and marked as an
estimate (the overlap with the layer's other transients is not read from the code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_operator.planner.arch import ModelArch, arch_from_config
from vllm_operator.planner.memory import (
    EngineFlags,
    GPUFacts,
    activation_bytes,
    fla_gdn_bytes,
    fla_gdn_prefill,
    predict_startup,
    profile_for_model,
)
from vllm_operator.planner.versions import profile_for

MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "models-2026"


def _arch(folder: str) -> ModelArch:
    config = json.loads((MODELS / folder / "config.json").read_text())
    return arch_from_config(config, model_id=folder.replace("__", "/"))


@pytest.fixture(scope="module")
def qwen36_27b() -> ModelArch:
    return _arch("nvidia__Qwen3.6-27B-NVFP4")  # 48 value heads of 128, key heads of 128


def test_the_config_gives_the_value_heads(qwen36_27b: ModelArch) -> None:
    assert (qwen36_27b.state_layer, qwen36_27b.linear_value_heads, qwen36_27b.linear_value_head_dim,
            qwen36_27b.linear_key_head_dim) == ("gated_deltanet", 48, 128, 128)
    dense = _arch("Qwen__Qwen3-32B")
    assert (dense.linear_value_heads, dense.linear_value_head_dim) == (0, 0)


def test_fla_intermediates_follow_the_kernels_shapes(qwen36_27b: ModelArch) -> None:
    flags = EngineFlags(max_model_len=262144, max_num_seqs=8, max_num_batched_tokens=65536)
    # per token and value head: g fp32 4 + A 64x2 + w 128x2 + u 128x2 + h 128x128/64x2 + v_new 128x2 + o 128x2
    assert fla_gdn_bytes(qwen36_27b, flags) == 65536 * 48 * (4 + 128 + 256 + 256 + 512 + 256 + 256)
    tp2 = flags.model_copy(update={"tensor_parallel_size": 2})
    assert fla_gdn_bytes(qwen36_27b, tp2) == fla_gdn_bytes(qwen36_27b, flags) // 2
    half = flags.model_copy(update={"max_num_batched_tokens": 32768})
    assert fla_gdn_bytes(qwen36_27b, half) == fla_gdn_bytes(qwen36_27b, flags) // 2


@pytest.mark.parametrize(("cc", "version", "fla"), [
    ("9.0", "0.24.0", False),    # Hopper: FlashInfer's GDN prefill in every release
    ("10.0", "0.24.0", False),   # B200 with 128-wide key heads: FlashInfer from 0.22
    ("10.0", "0.21.0", True),
    ("12.1", "0.24.0", True),    # GB10 / RTX 5090: FLA until 0.30
    ("12.0", "0.30.0", False),
    ("8.9", "0.33.0", True),     # Ada: FLA
    (None, "0.33.0", True),      # an unknown GPU: the larger booking
])
def test_the_prefill_backend_follows_the_release_and_the_gpu(qwen36_27b: ModelArch, cc: str | None, version: str,
                                                            fla: bool) -> None:
    assert fla_gdn_prefill(qwen36_27b, profile_for(version), cc) is fla


def test_the_term_enters_the_peak_and_is_marked_estimated_only_on_fla(qwen36_27b: ModelArch) -> None:
    flags = EngineFlags(max_model_len=262144, max_num_seqs=8, max_num_batched_tokens=65536,
                        gpu_memory_utilization=0.7, kv_cache_dtype="fp8")
    profile = profile_for_model(profile_for("0.24.0"), qwen36_27b)
    on_fla = activation_bytes(qwen36_27b, flags, profile, last_stage=True, compute_capability="12.1")
    on_hopper = activation_bytes(qwen36_27b, flags, profile, last_stage=True, compute_capability="9.0")
    assert on_fla - on_hopper == fla_gdn_bytes(qwen36_27b, flags)
    gb10 = predict_startup(qwen36_27b, flags, GPUFacts(total_gib=119.8, uma=True, compute_capability="12.1"),
                           profile_for("0.24.0"))
    h200 = predict_startup(qwen36_27b, flags, GPUFacts(total_gib=139.75, compute_capability="9.0"),
                           profile_for("0.24.0"))
    assert "activation_gib" in gb10.memory.estimated and "kv_cache_gib" in gb10.memory.estimated
    assert "activation_gib" not in h200.memory.estimated
