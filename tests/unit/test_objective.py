"""The planner's objective (docs/planner.md, "What a good plan is") over a grid: catalog models × GPUs × GPU counts × workloads.

1. A plan that starts under the stated workload beats one that does not.
2. A usable plan (the default workload's context, a handful of concurrent requests, CUDA graphs on) beats a
   degenerate one whenever any allowed configuration is usable - checked here independently, by pinning every
   tensor-parallel size and KV dtype with CUDA graphs on and asking the planner for that configuration alone.
3. Options can be deployed: re-planned with their flags pinned they start, and never use TP across MIG slices.
4. "Does not fit" is arithmetic that adds up: the test parses the numbers.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from kit.catalog import catalog_arch, catalog_gpu
from vllm_operator.planner import PinnedFlags, Plan, PlanRequest, Workload, plan
from vllm_operator.planner.plan import DEFAULT_CONCURRENCY, DEFAULT_CONTEXT_CAP, default_context

MODELS = sorted(
    path.name[:-5].replace("__", "/", 1)
    for path in resources.files("vllm_operator.catalog").joinpath("models").iterdir()
    if path.name.endswith(".json")
)
GPUS = ("T4", "L4", "RTX-4090", "L40S", "H100-SXM-80GB", "A100-SXM4-40GB-MIG-3g.20gb")
COUNTS = (1, 2, 8)
WORKLOADS = (Workload(), Workload(context_length=16384, concurrency=4))
_NUMBER = r"(\d+(?:\.\d+)?)"




def _request(model: str, gpu: str, count: int, workload: Workload, **pins: object) -> PlanRequest:
    return PlanRequest(arch=catalog_arch(model), gpu=catalog_gpu(gpu), gpu_count=count, workload=workload,
                       pinned=PinnedFlags(**pins))  # type: ignore[arg-type]


def _usable(result: Plan, request: PlanRequest) -> bool:
    if not result.fits or result.flags.get("enforce_eager"):
        return False
    wanted = min(request.workload.context_length or DEFAULT_CONTEXT_CAP, request.arch.derived_max_model_len)
    seqs = min(request.workload.concurrency or DEFAULT_CONCURRENCY, DEFAULT_CONCURRENCY)
    return bool(result.flags["max_model_len"] >= wanted and result.flags["max_num_seqs"] >= seqs)


def _any_usable_configuration(model: str, gpu: str, count: int, workload: Workload) -> str | None:
    """An allowed configuration that is usable, found by pinning it (TP × KV dtype, CUDA graphs on)."""
    arch = catalog_arch(model)
    for tp in (1, 2, 4, 8):
        if tp > count or arch.num_heads % tp or (tp > 1 and catalog_gpu(gpu).is_mig):
            continue
        for kv in ("auto", "fp8"):
            if kv == "fp8" and not _fp8_kv(gpu):
                continue
            request = _request(model, gpu, count, workload, tensor_parallel_size=tp, kv_cache_dtype=kv)
            result = plan(request)
            if _usable(result, request):
                return f"TP={tp} kv={kv}: {result.args()}"
    return None


def _fp8_kv(gpu: str) -> bool:
    cc = catalog_gpu(gpu).compute_capability_tuple
    return cc is not None and cc >= (8, 9)


def _check_arithmetic(result: Plan) -> None:
    """Each 'Does not fit' sum adds up and exceeds the budget it names."""
    for reason in result.reasons:
        match = re.search(rf"weights {_NUMBER} GiB \+ activation {_NUMBER} \+ overhead {_NUMBER} \+ KV cache for one "
                          rf"request of \d+ tokens {_NUMBER} = {_NUMBER} GiB > budget {_NUMBER} GiB", reason)
        if match:
            weights, activation, overhead, kv, total, budget = map(float, match.groups())
            assert abs(weights + activation + overhead + kv - total) <= 0.015, reason
            assert total > budget, reason
        assert "Tried to allocate" not in reason, reason
        budget = re.match(rf"Budget per GPU: {_NUMBER} GiB requested = {_NUMBER} weights \+ {_NUMBER} activation \+ "
                          rf"{_NUMBER} non-torch(?: \+ {_NUMBER} CUDA graphs)? \+ {_NUMBER} KV cache", reason)
        if budget:
            requested, *parts = (float(x) for x in budget.groups() if x is not None)
            assert abs(sum(parts) - requested) <= 0.03, reason
    if result.failure:
        assert "Tried to allocate" not in result.failure.message


@pytest.mark.parametrize("model", MODELS)
def test_no_degenerate_plan_when_a_usable_one_is_allowed(model: str) -> None:
    for gpu in GPUS:
        for count in COUNTS:
            for workload in WORKLOADS:
                request = _request(model, gpu, count, workload)
                result = plan(request)
                where = f"{model} on {count}× {gpu}, {workload}"
                _check_arithmetic(result)
                if result.fits:
                    assert result.gpu_count <= count, where
                if catalog_gpu(gpu).is_mig:
                    assert result.gpu_count == 1, where
                    assert all(o.gpu_count == 1 for o in result.options if o.gpu == gpu), where
                if _usable(result, request):
                    assert result.usable, where
                    continue
                found = _any_usable_configuration(model, gpu, count, workload) if result.fits else None
                assert found is None, f"{where}: planned {result.args()} although {found} is usable"
                if result.fits:
                    assert not result.usable, where
                    assert any(r.startswith("Trade-off:") for r in result.reasons), where


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-72B-Instruct-AWQ", "meta-llama/Llama-3.1-70B-Instruct",
                                   "meta-llama/Llama-3.1-8B-Instruct", "google/gemma-2-27b-it"])
@pytest.mark.parametrize("gpu", ["L4", "RTX-4090", "L40S", "A100-SXM4-40GB-MIG-3g.20gb"])
def test_options_can_be_deployed(model: str, gpu: str) -> None:
    result = plan(_request(model, gpu, 1, Workload()))
    for option in result.options:
        assert option.gpu_count in (1, 2, 4, 8), option
        if catalog_gpu(option.gpu).is_mig:
            assert option.gpu_count == 1, option
        if option.kind == "quantized-checkpoint":
            assert option.changes, option
            continue
        pins = {k: v for k, v in option.flags.items() if k in PinnedFlags.model_fields}
        replanned = plan(PlanRequest(arch=catalog_arch(model), gpu=catalog_gpu(option.gpu),
                                     gpu_count=option.gpu_count, pinned=PinnedFlags(**pins)))
        assert replanned.fits, (option, replanned.failure)
        beyond = {"kv_cache_dtype", "quantization", "enforce_eager"} & {k for k, v in option.flags.items() if v
                                                                        and v != "auto"}
        if beyond:
            assert option.changes, option


def test_the_issue_example_prefers_tp2_over_a_degenerate_tp1() -> None:
    result = plan(_request("Qwen/Qwen2.5-72B-Instruct-AWQ", "L40S", 2, Workload()))
    assert result.fits and result.usable
    assert result.flags["tensor_parallel_size"] == 2
    assert result.flags["max_model_len"] == 32768
    assert "enforce_eager" not in result.flags and "kv_cache_dtype" not in result.flags
    assert any("Trade-off: more GPUs" in r for r in result.reasons)


def test_more_gpus_for_a_usable_plan_say_the_trade_off() -> None:
    # one RTX 5090 (31.19 GiB) starts Qwen2.5-14B's 27.56 GiB of weights only degenerate: a short context, eager, fp8
    # (gemma-2-9b on an L4 was the case before max-model-len was re-fitted for the chosen max-num-seqs: now usable)
    one = plan(_request("Qwen/Qwen2.5-14B-Instruct", "RTX-5090", 1, Workload()))
    assert one.fits and not one.usable  # 1 GPU: a short context, one sequence
    two = plan(_request("Qwen/Qwen2.5-14B-Instruct", "RTX-5090", 2, Workload()))
    assert two.usable and two.gpu_count == 2
    assert any("Trade-off: more GPUs for a usable plan" in r for r in two.reasons)


def test_fewest_gpus_when_one_is_usable() -> None:
    result = plan(_request("meta-llama/Llama-3.1-8B-Instruct", "L4", 8, Workload()))
    assert result.usable and result.gpu_count == 1
    assert result.flags["max_model_len"] >= default_context(catalog_arch("meta-llama/Llama-3.1-8B-Instruct"))


def test_a_degenerate_plan_says_its_trade_off() -> None:
    result = plan(_request("Qwen/Qwen2.5-14B-Instruct", "RTX-5090", 1, Workload()))
    assert result.fits and not result.usable
    trade = next(r for r in result.reasons if r.startswith("Trade-off:"))
    assert "1 GPU(s) allowed" in trade and "default workload" in trade
    assert result.options and all(o.max_model_len >= 8192 for o in result.options)


def test_infeasible_headline_is_for_the_gpus_asked_for() -> None:
    result = plan(_request("meta-llama/Llama-3.1-70B-Instruct", "L40S", 2, Workload()))
    assert not result.fits
    assert result.gpu_count == 2
    text = next(r for r in result.reasons if r.startswith("Does not fit:"))
    assert "on each of 2 GPU(s)" in text
    assert "Tried to allocate" not in text and "Tried to allocate" not in (result.failure.message if result.failure
                                                                            else "")


def test_quantized_checkpoints_from_the_catalog_are_a_separate_kind_of_option() -> None:
    result = plan(_request("meta-llama/Llama-3.1-70B-Instruct", "L40S", 1, Workload()))
    named = [o for o in result.options if o.kind == "quantized-checkpoint"]
    assert any("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4" in o.summary for o in named)
    assert all("a different (quantized) checkpoint" in o.changes for o in named)
    # the same shape but another release is not "a checkpoint of this model"
    other = plan(_request("meta-llama/Llama-3.3-70B-Instruct", "L40S", 1, Workload()))
    assert not any("3.1" in o.summary for o in other.options)
    # no FP8 checkpoint where vLLM has no FP8 kernels (Turing)
    t4 = plan(_request("meta-llama/Llama-3.1-8B-Instruct", "T4", 1, Workload()))
    assert any(o.kind == "quantized-checkpoint" for o in t4.options)
    assert not any("fp8" in o.summary.lower() for o in t4.options if o.kind == "quantized-checkpoint")
