"""reconcile.cached_plan: the operator's memo of the pure planner — the same answer as `plan`, keyed on every field
of the request (the speculation's draft architecture too, which the request's JSON leaves out), and each caller
gets a copy it may change."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from vllm_operator import reconcile
from vllm_operator.planner import PinnedFlags, PlanRequest, plan
from vllm_operator.planner.arch import ModelArch
from vllm_operator.planner.gpus import GPUSpec
from vllm_operator.planner.speculative import parse_speculative_config

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_1B = "meta-llama/Llama-3.2-1B-Instruct"


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconcile, "_plan_cache", type(reconcile._plan_cache)())


def test_a_cached_plan_is_the_plan_and_a_copy(load_arch: Callable[[str], ModelArch],
                                              gpu: Callable[[str], GPUSpec]) -> None:
    request = PlanRequest(arch=load_arch(LLAMA_8B), gpu=gpu("L4"))
    first = reconcile.cached_plan(request)
    assert first == plan(request)
    first.flags["max_model_len"] = 1  # a caller's change never reaches the next caller
    first.reasons.append("changed")
    second = reconcile.cached_plan(PlanRequest(arch=load_arch(LLAMA_8B), gpu=gpu("L4")))
    assert second == plan(request) and second is not first
    assert len(reconcile._plan_cache) == 1  # an equal request is the same key


def test_every_field_of_the_request_is_in_the_key(load_arch: Callable[[str], ModelArch],
                                                  gpu: Callable[[str], GPUSpec]) -> None:
    base = PlanRequest(arch=load_arch(LLAMA_8B), gpu=gpu("L4"))
    variants = [base,
                base.model_copy(update={"gpu": gpu("A100-40GB")}),
                base.model_copy(update={"pinned": PinnedFlags(max_model_len=4096)}),
                base.model_copy(update={"vllm_version": "0.8.5"})]
    for request in variants:
        assert reconcile.cached_plan(request) == plan(request)
    assert len(reconcile._plan_cache) == len(variants)


def test_the_draft_architecture_is_in_the_key(load_arch: Callable[[str], ModelArch],
                                              gpu: Callable[[str], GPUSpec]) -> None:
    speculation = parse_speculative_config('{"method": "draft_model", "model": "org/draft", '
                                           '"num_speculative_tokens": 4}')
    base = PlanRequest(arch=load_arch(LLAMA_8B), gpu=gpu("L4"), speculation=speculation)
    with_draft = base.model_copy(update={"speculation": speculation.model_copy(
        update={"draft_arch": load_arch(LLAMA_1B)})})
    assert base.model_dump_json() == with_draft.model_dump_json()  # why the key adds it
    for request in (base, with_draft):
        assert reconcile.cached_plan(request) == plan(request)
    assert len(reconcile._plan_cache) == 2


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch, load_arch: Callable[[str], ModelArch],
                              gpu: Callable[[str], GPUSpec]) -> None:
    monkeypatch.setattr(reconcile, "PLAN_CACHE_SIZE", 2)
    for length in (2048, 4096, 8192):
        reconcile.cached_plan(PlanRequest(arch=load_arch(LLAMA_8B), gpu=gpu("L4"),
                                          pinned=PinnedFlags(max_model_len=length)))
    assert len(reconcile._plan_cache) == 2
