"""planner.report: the one-bar memory picture and the text a person reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from vllm_operator.planner import Plan, PlanRequest, Workload, plan
from vllm_operator.planner.arch import ModelArch
from vllm_operator.planner.gpus import GPUSpec
from vllm_operator.planner.report import memory_bar, memory_segments, render_plan_text

CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("meta-llama/Llama-3.1-8B-Instruct", "h100", {}),
    ("meta-llama/Llama-3.1-8B-Instruct", "h100", {"vllm_version": "0.19.0"}),
    ("meta-llama/Llama-3.1-8B-Instruct", "l4", {}),
    ("Qwen/Qwen2.5-0.5B-Instruct", "b200", {}),
    ("meta-llama/Llama-3.1-70B-Instruct", "h100", {"gpu_count": 8}),
    ("google/gemma-3-27b-it", "h100", {"vllm_version": "0.11.0"}),
    ("meta-llama/Llama-3.1-70B-Instruct", "4090", {}),  # does not fit
    ("meta-llama/Llama-3.1-8B-Instruct", "h100", {"workload": Workload(context_length=131072, concurrency=1000)}),
]


@pytest.fixture(params=CASES, ids=[f"{m.split('/')[1]}-{g}-{i}" for i, (m, g, _) in enumerate(CASES)])
def result(request: pytest.FixtureRequest, load_arch: Callable[[str], ModelArch],
           gpu: Callable[[str], GPUSpec]) -> Plan:
    model, gpu_name, kwargs = request.param
    return plan(PlanRequest(arch=load_arch(model), gpu=gpu(gpu_name), **kwargs))


def test_bar_width_is_constant(result: Plan) -> None:
    bar = memory_bar(result)
    assert bar.startswith("[") and bar.endswith("]")
    assert len(bar) == 62
    assert len(memory_bar(result, width=30)) == 32


def test_segments_are_in_vllm_order_and_not_negative(result: Plan) -> None:
    segments = memory_segments(result)
    assert [label for label, _ in segments] == ["weights", "activation", "overhead", "KV cache", "headroom"]
    assert all(size >= 0 for _, size in segments)


def test_segments_sum_to_the_gpu_total_when_it_fits(result: Plan) -> None:
    if not result.fits and result.memory.weights_gib > result.memory.gpu_total_gib:
        pytest.skip("weights alone exceed the GPU; there is no headroom to balance")
    total = sum(size for _, size in memory_segments(result))
    assert total == pytest.approx(result.memory.gpu_total_gib, abs=0.02)


def test_bar_cells_follow_the_segments(result: Plan) -> None:
    segments = dict(memory_segments(result))
    bar = memory_bar(result)[1:-1]
    if segments["KV cache"] / result.memory.gpu_total_gib > 0.1:
        assert "░" in bar
    if segments["weights"] / result.memory.gpu_total_gib > 0.1:
        assert bar.startswith("█")


def test_text_has_the_verdict_the_bar_and_the_reasons(result: Plan) -> None:
    text = render_plan_text(result)
    lines = text.splitlines()
    assert lines[0].startswith("FITS:" if result.fits else "DOES NOT FIT:")
    assert f"  {memory_bar(result)}" in lines
    assert "Why:" in lines
    for reason in result.reasons:
        assert f"  - {reason}" in text
    assert "vllm serve " + result.model_id + " " + " ".join(result.args()) in text
    assert f"{result.prediction.kv_cache_tokens:,} tokens" in text


def test_infeasible_text_names_the_failure_and_lists_options(load_arch: Callable[[str], ModelArch],
                                                             gpu: Callable[[str], GPUSpec]) -> None:
    result = plan(PlanRequest(arch=load_arch("meta-llama/Llama-3.1-70B-Instruct"), gpu=gpu("4090")))
    text = render_plan_text(result)
    assert text.startswith("DOES NOT FIT: meta-llama/Llama-3.1-70B-Instruct on 1× RTX-4090")
    assert "vLLM would fail (WeightsDoNotFit); what vLLM would print:" in text
    assert "Options that would fit (GPUs from the GPU catalog):" in text
    assert "Tried to allocate" not in text  # no pod ran: no invented PyTorch traceback
    assert result.options
    for option in result.options:
        assert option.summary in text
        assert f"{option.kv_cache_tokens:,} KV tokens" in text


def test_fitting_text_has_no_options_section(load_arch: Callable[[str], ModelArch],
                                             gpu: Callable[[str], GPUSpec]) -> None:
    result = plan(PlanRequest(arch=load_arch("Qwen/Qwen2.5-7B-Instruct"), gpu=gpu("h100")))
    text = render_plan_text(result)
    assert "DOES NOT FIT" not in text
    assert "Options that would fit" not in text
    assert "would fail" not in text


def test_a_degenerate_plan_is_marked_and_options_say_what_they_change(load_arch: Callable[[str], ModelArch],
                                                                      gpu: Callable[[str], GPUSpec]) -> None:
    # (gemma-2-9b on an L4 with 0.26 was degenerate until max-model-len was re-fitted for the chosen max-num-seqs)
    result = plan(PlanRequest(arch=load_arch("Qwen/Qwen2.5-14B-Instruct"), gpu=gpu("RTX-5090")))
    text = render_plan_text(result)
    assert text.startswith("FITS, DEGENERATE (see Trade-off): Qwen/Qwen2.5-14B-Instruct on 1× RTX-5090")
    assert "  - Trade-off: no configuration within the 1 GPU(s) allowed meets the default workload" in text
    assert "Options that would meet the workload (GPUs from the GPU catalog):" in text
    for option in result.options:
        if option.flags.get("kv_cache_dtype") == "fp8":
            assert "also changes: KV cache dtype fp8" in text


def test_headline_says_how_many_gpus_were_allowed(load_arch: Callable[[str], ModelArch],
                                                  gpu: Callable[[str], GPUSpec]) -> None:
    result = plan(PlanRequest(arch=load_arch("meta-llama/Llama-3.1-8B-Instruct"), gpu=gpu("H100"), gpu_count=4))
    assert render_plan_text(result).startswith("FITS: meta-llama/Llama-3.1-8B-Instruct on 1× H100-SXM-80GB (of 4 "
                                               "allowed)")
