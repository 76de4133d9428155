"""Bounded work per spec (issue 20): planning counts startup predictions against a budget, stops its searches at the
best found so far when the budget is spent, and the operator says so in a PlanBudget condition naming the field that
made the spec expensive. Counts, not seconds: every test here is about what was counted, never how long it took."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit import adversarial
from kit.catalog import catalog_arch, catalog_gpu
from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.modelfiles import find_in_catalog
from vllm_operator.planner import budget
from vllm_operator.planner.multinode import plan_across_nodes
from vllm_operator.planner.plan import PlanRequest, plan
from vllm_operator.reconcile import Observed, desired_state

MAVERICK = "meta-llama/Llama-4-Maverick-17B-128E-Instruct"
L4_PAIR = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "2"}
RTX_4090 = {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090", "nvidia.com/gpu.count": "1"}
NOW = datetime(2026, 1, 1, tzinfo=UTC)
EXAMPLE_FILES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
L4_NODE = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "23034"}


def _request(model: str, gpu: str, count: int) -> PlanRequest:
    return PlanRequest(arch=catalog_arch(model), gpu=catalog_gpu(gpu), gpu_count=count)


def _expensive(status: dict[str, Any] | None = None) -> Observed:
    spec = {"model": {"name": MAVERICK}, "gpu": {"maxNodes": 64, "maxCount": 64}}
    observed: Observed = adversarial.observe(spec, "maverick", (RTX_4090, L4_PAIR))
    return observed if status is None else replace(observed, status=status)


@pytest.fixture(autouse=True)
def _fresh_plan_cache() -> None:
    reconcile._plan_cache.clear()


def _planning_work(observed: Observed) -> budget.WorkBudget:
    """desired_state with the reconcile's own budget caught as it closes."""
    seen: list[budget.WorkBudget] = []
    spend = budget.spend

    def catching(limit: int | None = None) -> Any:
        context = spend(limit)

        class Catch:
            def __enter__(self) -> budget.WorkBudget:
                work = context.__enter__()
                seen.append(work)
                return work

            def __exit__(self, *exc: Any) -> Any:
                return context.__exit__(*exc)

        return Catch()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(budget, "spend", catching)  # the reconcile core calls budget.spend()
        desired_state(observed)
    assert len(seen) == 1
    return seen[0]


def test_without_an_open_budget_nothing_is_counted_or_stopped() -> None:
    assert budget.out_of_budget() is False and budget.stops() == 0
    budget.charge(10**9)  # no budget open: a no-op


def test_predictions_are_counted_by_search_and_the_count_is_deterministic() -> None:
    request = _request(MAVERICK, "NVIDIA-GeForce-RTX-4090", 1)
    counts = []
    for _ in range(2):
        with budget.spend(10**9) as work:
            result = plan_across_nodes(request, gpus_per_node=1, max_nodes=64)
        counts.append((work.used, dict(work.by_phase)))
        assert work.report() is None and not work.spent
    assert counts[0] == counts[1]
    used, by_phase = counts[0]
    assert used == sum(by_phase.values()) > 0
    assert {"layouts", "nodes"} <= set(by_phase)
    unbounded = plan_across_nodes(request, gpus_per_node=1, max_nodes=64)  # no budget: the same plan
    assert unbounded.model_dump() == result.model_dump()


def test_a_spent_node_search_keeps_the_fewest_nodes_found_so_far_and_names_max_nodes() -> None:
    request = _request("meta-llama/Llama-3.1-405B-Instruct", "NVIDIA-L4", 1)
    full = plan_across_nodes(request, gpus_per_node=1, max_nodes=64)
    assert full.fits and 2 < full.split.nodes < 64
    with budget.spend(10**9) as probe:
        plan(request)
    single = probe.used  # the single-node plan (with its options), before the node search
    with budget.spend(single + 1) as work:  # the search can plan the most nodes allowed, then must stop
        cut = plan_across_nodes(request, gpus_per_node=1, max_nodes=64)
    report = work.report()
    assert report is not None and report.phase == "nodes"
    assert report.field == "spec.gpu.maxNodes" and "maxNodes" in report.advice
    assert "spec.gpu.maxNodes" in report.message() and f"{work.used:,}" in report.message()
    assert cut.fits and cut.split.nodes == 64  # the fitting node count it held when it stopped: more than needed
    assert cut.split.nodes > full.split.nodes
    with budget.spend(single) as none_left:  # spent before the search: no node count, the single-node answer
        refused = plan_across_nodes(request, gpus_per_node=1, max_nodes=64)
    assert not refused.fits and refused.split.nodes == 1
    assert none_left.report() is not None and none_left.report().field == "spec.gpu.maxNodes"  # type: ignore[union-attr]


def test_a_spent_option_search_keeps_the_options_found_so_far() -> None:
    request = _request("meta-llama/Meta-Llama-3-70B-Instruct", "NVIDIA-L4", 1)
    full = plan(request)
    assert not full.fits and len(full.options) >= 2
    with budget.spend(10**9) as probe:
        plan(request, options=False)
    with budget.spend(probe.used + 1) as work:
        cut = plan(request)
    report = work.report()
    assert report is not None and report.phase == "options" and report.field == "spec.gpu.product"
    assert len(cut.options) < len(full.options)
    assert {o.summary for o in cut.options} <= {o.summary for o in full.options}
    assert cut.flags == full.flags and cut.fits is full.fits  # the plan itself is complete


def test_the_operator_says_which_field_made_the_spec_expensive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budget, "PLAN_BUDGET_PREDICTIONS", 100)
    desired = desired_state(_expensive())
    over = cond.find_condition(desired.status.conditions, cond.PLAN_BUDGET)
    assert over is not None and (over.status, over.reason) == (cond.TRUE, cond.OVER_BUDGET)
    assert "spec.gpu." in over.message and ("lower" in over.message or "set spec.gpu" in over.message)
    warnings = [e for e in desired.events if e.reason == cond.OVER_BUDGET]
    assert len(warnings) == 1 and warnings[0].message == over.message
    # planned again with that status: the same condition, no second Event
    again = desired_state(_expensive(desired.status.model_dump(by_alias=True, exclude_none=True)))
    assert cond.find_condition(again.status.conditions, cond.PLAN_BUDGET) == over
    assert not [e for e in again.events if e.reason == cond.OVER_BUDGET]
    # within the budget again: False, WithinBudget
    monkeypatch.setattr(budget, "PLAN_BUDGET_PREDICTIONS", 10**9)
    reconcile._plan_cache.clear()
    after = desired_state(_expensive(desired.status.model_dump(by_alias=True, exclude_none=True)))
    within = cond.find_condition(after.status.conditions, cond.PLAN_BUDGET)
    assert within is not None and (within.status, within.reason) == (cond.FALSE, cond.WITHIN_BUDGET)


def test_a_plan_cut_short_for_one_spec_is_never_cached_for_another(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budget, "PLAN_BUDGET_PREDICTIONS", 100)
    cut = desired_state(_expensive())
    monkeypatch.setattr(budget, "PLAN_BUDGET_PREDICTIONS", 10**9)
    whole = desired_state(_expensive())
    assert cond.find_condition(whole.status.conditions, cond.PLAN_BUDGET) is None
    assert cut.plan is not None and whole.plan is not None
    assert len(whole.plan.options) >= len(cut.plan.options)
    reconcile._plan_cache.clear()
    fresh = desired_state(_expensive())
    assert fresh.plan is not None and fresh.plan.model_dump() == whole.plan.model_dump()


def test_the_hand_picked_expensive_spec_is_within_the_budget() -> None:
    work = _planning_work(_expensive())
    assert work.report() is None and 0 < work.used < budget.PLAN_BUDGET_PREDICTIONS


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_no_example_comes_near_the_budget(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    spec = document["spec"]
    observed = Observed(name=document["metadata"]["name"], namespace="default", uid="uid-1", generation=1, spec=spec,
                        status={}, now=NOW, nodes=[L4_NODE], model_files=find_in_catalog(spec["model"]["name"]))
    work = _planning_work(observed)
    assert work.report() is None and work.used < budget.PLAN_BUDGET_PREDICTIONS // 3  # the 405B examples: 612


def test_without_a_product_a_spent_budget_stops_planning_more_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = ({"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1"},
             {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8"},
             {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"})
    observed = adversarial.observe({"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}}, "small", nodes)
    whole = desired_state(observed)
    assert whole.plan is not None and whole.plan.fits and "pools:" in (whole.status.gpu.source or "")
    reconcile._plan_cache.clear()
    monkeypatch.setattr(budget, "PLAN_BUDGET_PREDICTIONS", 1)
    cut = desired_state(observed)
    over = cond.find_condition(cut.status.conditions, cond.PLAN_BUDGET)
    assert over is not None and over.reason == cond.OVER_BUDGET
    assert "in the pools search, which spec.gpu.product sizes" in over.message and "set spec.gpu.product" in over.message
    assert cut.plan is not None and cut.plan.fits  # still answered: the pool resolved first
