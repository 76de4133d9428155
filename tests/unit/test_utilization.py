"""Utilization from the GPU: the highest that keeps the GPU's real needs outside vLLM's budget covered."""

from __future__ import annotations

import pytest

from kit.catalog import catalog_arch, catalog_gpu
from vllm_operator.planner import PlanRequest, Workload, plan
from vllm_operator.planner.gpus import (
    DESKTOP_RESERVE_GIB,
    MAX_SAFE_UTILIZATION,
    SLACK_GIB,
    SLACK_SHARE,
    load_gpu_catalog,
    safe_utilization,
)
from vllm_operator.planner.memory import init_nontorch_gib


@pytest.mark.parametrize("gpu", [g.name for g in load_gpu_catalog() if not g.uma])
@pytest.mark.parametrize("tp", [1, 2])
def test_what_is_left_outside_the_budget_covers_the_gpus_needs(gpu: str, tp: int) -> None:
    spec = catalog_gpu(gpu)
    context = init_nontorch_gib(tp, spec.nvlink)
    util, why = safe_utilization(spec, context)
    left = spec.reported_gib * (1 - util)
    needs = context + DESKTOP_RESERVE_GIB[spec.tier] + SLACK_GIB + SLACK_SHARE * spec.reported_gib
    assert left >= needs - 1e-6, (gpu, util, left, needs)
    assert util <= MAX_SAFE_UTILIZATION
    if util < MAX_SAFE_UTILIZATION:  # the highest: one point more would not cover them
        assert spec.reported_gib * (1 - util - 0.01) < needs, (gpu, util)
    assert why


def test_desktop_cards_keep_more_outside_than_headless_ones() -> None:
    consumer, _ = safe_utilization(catalog_gpu("RTX-4090"), 0.51)
    datacenter, _ = safe_utilization(catalog_gpu("L4"), 0.51)  # about the same memory, headless
    assert consumer < datacenter


def test_unified_memory_gpus_keep_the_catalog_policy() -> None:
    gh200 = catalog_gpu("GH200")
    assert safe_utilization(gh200, 0.51)[0] == gh200.default_utilization


def test_the_issue_example_keeps_cuda_graphs_on_a_24gb_consumer_card() -> None:
    # Llama-3.1-8B on a 24 GB GeForce at 32k context: the blanket 0.85 dropped CUDA graphs and ran one sequence
    result = plan(PlanRequest(arch=catalog_arch("meta-llama/Llama-3.1-8B-Instruct"), gpu=catalog_gpu("RTX-4090"),
                              workload=Workload(context_length=32768, concurrency=1)))
    assert result.fits and result.usable
    assert "enforce_eager" not in result.flags
    assert result.flags["gpu_memory_utilization"] > 0.85
    assert result.flags["max_num_seqs"] > 1
    assert any(r.startswith(f"gpu-memory-utilization {result.flags['gpu_memory_utilization']:.2f}: the highest")
               for r in result.reasons)


def test_kv_fraction_of_the_physical_limit() -> None:
    from vllm_operator.planner import PinnedFlags

    arch, l4 = catalog_arch("meta-llama/Llama-3.1-8B-Instruct"), catalog_gpu("L4")
    planned = plan(PlanRequest(arch=arch, gpu=l4))
    assert planned.kv_fraction is not None
    # the fraction is computed from the breakdown's figures, each rounded to 0.01 GiB: six of them may add 0.03 GiB
    assert 0.98 <= planned.kv_fraction <= 1.0 + 0.03 / planned.memory.kv_cache_gib
    lower = plan(PlanRequest(arch=arch, gpu=l4, pinned=PinnedFlags(gpu_memory_utilization=0.85)))
    assert lower.kv_fraction is not None
    mem = lower.memory
    safe, _ = safe_utilization(l4, init_nontorch_gib(1, l4.nvlink))
    physical = (safe * mem.gpu_total_gib - mem.weights_gib - mem.activation_gib - mem.non_torch_gib - mem.cudagraph_gib
                - mem.persistent_gib)
    assert abs(lower.kv_fraction - mem.kv_cache_gib / physical) < 0.005
    assert lower.kv_fraction < 0.7
    failing = plan(PlanRequest(arch=catalog_arch("meta-llama/Llama-3.1-70B-Instruct"), gpu=l4))
    assert failing.kv_fraction is None


def test_an_operator_override_of_the_utilization_is_planned_as_given() -> None:
    catalog = load_gpu_catalog([{"name": "L4", "default_utilization": 0.8}])
    l4 = catalog.get("L4")
    assert safe_utilization(l4, 0.51) == (0.8, "set for this GPU by the operator's GPU catalog override")
    result = plan(PlanRequest(arch=catalog_arch("meta-llama/Llama-3.1-8B-Instruct"), gpu=l4))
    assert result.flags["gpu_memory_utilization"] == 0.8
    other = load_gpu_catalog([{"name": "L4", "tier": "datacenter"}]).get("L4")
    assert not other.utilization_set and safe_utilization(other, 0.51)[0] == 0.92
