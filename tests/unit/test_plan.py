"""planner.plan: choosing vLLM flags, explaining them, and options when nothing fits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from vllm_operator.planner import (
    Constraints,
    FailureKind,
    PinnedFlags,
    Plan,
    PlanRequest,
    Workload,
    flags_to_args,
    plan,
    with_vllm_defaults,
)
from vllm_operator.planner.arch import ModelArch
from vllm_operator.planner.gpus import GPUSpec

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"


@pytest.fixture
def make(load_arch: Callable[[str], ModelArch], gpu: Callable[[str], GPUSpec]) -> Callable[..., PlanRequest]:
    def build(model: str, gpu_name: str, **kwargs: Any) -> PlanRequest:
        return PlanRequest(arch=load_arch(model), gpu=gpu(gpu_name), **kwargs)

    return build


Make = Callable[..., PlanRequest]


def kebab(name: str) -> str:
    return name.replace("_", "-")


def assert_reasons_cover_chosen_flags(result: Plan) -> None:
    text = " ".join(result.reasons)
    for name in result.flags:
        if name not in result.pinned:
            assert kebab(name) in text, f"no reason mentions {kebab(name)}: {result.reasons}"


def assert_valid_tp(arch: ModelArch, tp: int) -> None:
    assert arch.num_heads % tp == 0
    kv = arch.num_kv_heads
    assert (kv % tp == 0) if kv >= tp else (tp % kv == 0)


# --- the basics ---------------------------------------------------------------------------------------------


def test_small_model_on_h100_fits_on_one_gpu_with_its_full_context(make: Make) -> None:
    result = plan(make(LLAMA_8B, "h100"))
    assert result.fits and result.failure is None
    assert result.flags["tensor_parallel_size"] == 1
    assert result.flags["max_model_len"] == 131072
    assert result.prediction.kv_cache_tokens > 131072
    assert result.options == []
    assert result.gpu == "H100-SXM-80GB" and result.gpu_count == 1
    assert result.model_id == LLAMA_8B


def test_plan_is_deterministic(make: Make) -> None:
    request = make(LLAMA_70B, "h100", gpu_count=1)
    assert plan(request).model_dump() == plan(request).model_dump()


def test_plan_uses_the_newest_release_by_default_and_the_given_one_otherwise(make: Make) -> None:
    from vllm_operator.planner import NEWEST_KNOWN_VERSION

    assert plan(make(LLAMA_8B, "h100")).vllm_version == NEWEST_KNOWN_VERSION
    assert plan(make(LLAMA_8B, "h100", vllm_version="0.11.0")).vllm_version == "0.11.0"


def test_args_are_the_flags_on_the_command_line(make: Make) -> None:
    result = plan(make(LLAMA_8B, "l4", workload=Workload(context_length=30000, concurrency=1)))
    args = result.args()
    assert args[:2] == ["--tensor-parallel-size", "1"]
    assert "--max-model-len" in args
    assert args == flags_to_args(result.flags)


def test_flags_to_args_booleans() -> None:
    args = flags_to_args({"enforce_eager": True, "enable_prefix_caching": False, "max_model_len": 4096,
                          "kv_cache_dtype": None})
    assert args == ["--enforce-eager", "--no-enable-prefix-caching", "--max-model-len", "4096"]


@pytest.mark.parametrize(
    ("model", "gpu_name", "kwargs"),
    [
        (LLAMA_8B, "h100", {}),
        (LLAMA_8B, "l4", {}),
        (LLAMA_70B, "h100", {"gpu_count": 8}),
        (QWEN_7B, "l4", {"workload": Workload(context_length=16384, concurrency=2)}),
        (LLAMA_8B, "l4", {"workload": Workload(context_length=40000, concurrency=1)}),
        (LLAMA_8B, "l4", {"workload": Workload(context_length=30000, concurrency=1)}),
        (LLAMA_8B, "h100", {"gpu_free_gib": 40.0}),
        ("google/gemma-3-27b-it", "h100", {}),
        ("openai/gpt-oss-20b", "h100", {}),
    ],
)
def test_every_chosen_flag_has_a_reason(make: Make, model: str, gpu_name: str, kwargs: dict[str, Any]) -> None:
    result = plan(make(model, gpu_name, **kwargs))
    assert result.fits
    assert_reasons_cover_chosen_flags(result)
    assert any("Budget per GPU" in r for r in result.reasons)


def test_flags_from_constraints_and_workload_have_reasons(make: Make) -> None:
    result = plan(make(LLAMA_8B, "h100", constraints=Constraints(max_num_batched_tokens=2048),
                       workload=Workload(prefix_caching=True)))
    assert result.flags["max_num_batched_tokens"] == 2048
    assert result.flags["enable_prefix_caching"] is True
    assert_reasons_cover_chosen_flags(result)


# --- tensor parallelism -------------------------------------------------------------------------------------


def test_70b_on_h100s_gets_the_smallest_tp_that_fits(make: Make) -> None:
    # 0.26.0: from 0.29 MRV2's CUDA-graph estimate (an ESTIMATE, booked in full) tips the default context to TP=4
    result = plan(make(LLAMA_70B, "h100", gpu_count=8, vllm_version="0.26.0"))
    assert result.fits
    assert result.flags["tensor_parallel_size"] == 2
    assert result.gpu_count == 2
    assert any("tensor-parallel-size 2: the smallest valid size" in r for r in result.reasons)


def test_70b_on_one_h100_does_not_fit_and_offers_more_gpus(make: Make) -> None:
    result = plan(make(LLAMA_70B, "h100", gpu_count=1, vllm_version="0.26.0"))
    assert not result.fits
    assert result.failure is not None and result.failure.kind is FailureKind.WEIGHTS_DO_NOT_FIT
    more = [o for o in result.options if o.gpu == "H100-SXM-80GB" and o.gpu_count > 1]
    assert more, [o.summary for o in result.options]
    assert more[0].flags["tensor_parallel_size"] == more[0].gpu_count == 2


@pytest.mark.parametrize(("model", "gpu_name"), [("Qwen/Qwen2.5-32B-Instruct", "t4"), ("microsoft/phi-4", "t4"),
                                                  (QWEN_7B, "t4"), ("Qwen/Qwen2.5-14B-Instruct", "l4")])
def test_tp_candidates_respect_head_and_kv_divisibility(make: Make, model: str, gpu_name: str) -> None:
    for count in (1, 2, 3, 4, 5, 6, 8, 12, 16):
        request = make(model, gpu_name, gpu_count=count)
        result = plan(request)
        tp = result.flags["tensor_parallel_size"]
        assert tp <= count
        assert_valid_tp(request.arch, tp)
        for option in result.options:
            if option.gpu == request.gpu.name:
                assert_valid_tp(request.arch, option.flags["tensor_parallel_size"])


def test_40_head_8_kv_model_never_gets_tp_16(make: Make) -> None:
    result = plan(make("Qwen/Qwen2.5-32B-Instruct", "t4", gpu_count=16))
    assert result.fits
    assert result.flags["tensor_parallel_size"] == 8


def test_pinned_invalid_tp_is_kept_and_fails(make: Make) -> None:
    result = plan(make("Qwen/Qwen2.5-14B-Instruct", "h100", gpu_count=8,
                       pinned=PinnedFlags(tensor_parallel_size=5)))
    assert not result.fits
    assert result.flags["tensor_parallel_size"] == 5
    assert result.failure is not None and result.failure.kind is FailureKind.INVALID_PARALLELISM
    change = [o for o in result.options if o.summary.startswith("Change the pinned tensor-parallel-size")]
    assert change and change[0].flags["tensor_parallel_size"] in (1, 2, 4, 8)


# --- pinned flags -------------------------------------------------------------------------------------------


def test_pinned_flags_appear_verbatim_when_it_fits(make: Make) -> None:
    pins = PinnedFlags(gpu_memory_utilization=0.8, max_model_len=8192, max_num_seqs=64, block_size=32,
                       max_num_batched_tokens=4096, enable_prefix_caching=False)
    result = plan(make(LLAMA_8B, "h100", pinned=pins))
    assert result.fits
    for name, value in pins.model_dump(exclude_none=True).items():
        assert result.flags[name] == value
    assert sorted(result.pinned) == sorted(pins.model_dump(exclude_none=True))
    assert any("gpu-memory-utilization 0.8 is pinned" in r for r in result.reasons)
    assert "--no-enable-prefix-caching" in result.args()


def test_pinned_flags_are_never_changed_when_infeasible(make: Make) -> None:
    pins = PinnedFlags(max_model_len=131072, gpu_memory_utilization=0.9, max_num_seqs=7, kv_cache_dtype="auto",
                       enforce_eager=False)
    result = plan(make(LLAMA_8B, "l4", pinned=pins))
    assert not result.fits
    assert result.failure is not None and result.failure.kind is FailureKind.KV_CACHE_TOO_SMALL
    for name, value in pins.model_dump(exclude_none=True).items():
        assert result.flags[name] == value, name
    summaries = [o.summary for o in result.options]
    assert any(s.startswith("Change the pinned max-model-len from 131072 to ") for s in summaries), summaries
    for option in result.options:
        assert option.kv_cache_tokens > 0


def test_pinned_tp_too_small_offers_changing_it(make: Make) -> None:
    result = plan(make(LLAMA_70B, "h100", gpu_count=8, pinned=PinnedFlags(tensor_parallel_size=1),
                       vllm_version="0.26.0"))
    assert not result.fits
    assert result.flags["tensor_parallel_size"] == 1
    assert "tensor_parallel_size" in result.pinned
    assert any(o.summary == "Change the pinned tensor-parallel-size from 1 to 2" for o in result.options)


def test_unknown_pinned_flag_is_rejected() -> None:
    with pytest.raises(ValueError):
        PinnedFlags(max_model_length=4096)  # type: ignore[call-arg]


# --- max-model-len ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu_name", ["l4", "4090", "24GB"])
def test_max_model_len_reduced_with_a_reason_when_kv_is_short(make: Make, gpu_name: str) -> None:
    request = make(LLAMA_8B, gpu_name)
    result = plan(request)
    assert result.fits
    mml = result.flags["max_model_len"]
    assert 1024 <= mml < request.arch.derived_max_model_len
    assert mml <= result.prediction.estimated_max_model_len
    assert any(r.startswith(f"max-model-len {mml}: the model allows 131072") for r in result.reasons)


def test_max_model_len_never_above_derived(make: Make) -> None:
    for model in (QWEN_7B, "microsoft/phi-2", "meta-llama/Meta-Llama-3-8B-Instruct"):
        request = make(model, "h200")
        result = plan(request)
        assert result.flags["max_model_len"] <= request.arch.derived_max_model_len
    assert plan(make("microsoft/phi-2", "h100")).flags["max_model_len"] == 2048


def test_qwen_7b_on_l4_keeps_its_32k_context(make: Make) -> None:
    result = plan(make(QWEN_7B, "l4"))
    assert result.fits
    assert result.flags["max_model_len"] == 32768
    assert any("full context fits" in r for r in result.reasons)


# --- workload -----------------------------------------------------------------------------------------------


def test_workload_context_and_concurrency_are_met(make: Make) -> None:
    result = plan(make(LLAMA_8B, "h100", workload=Workload(context_length=8192, concurrency=64)))
    assert result.fits
    assert result.flags["max_model_len"] >= 8192
    assert result.prediction.kv_cache_tokens >= 64 * 8192


def test_workload_that_cannot_be_met_is_infeasible(make: Make) -> None:
    result = plan(make(LLAMA_8B, "h100", workload=Workload(context_length=131072, concurrency=1000)))
    assert not result.fits
    assert result.failure is not None and result.failure.kind is FailureKind.KV_CACHE_TOO_SMALL
    assert "1000 concurrent requests of 131072 tokens" in result.failure.message


def test_shorter_context_option_is_shorter(make: Make) -> None:
    result = plan(make(LLAMA_8B, "h100", workload=Workload(context_length=131072, concurrency=1000)))
    shorter = [o for o in result.options if o.summary.startswith("Shorter context")]
    assert all(o.max_model_len < 131072 for o in shorter), [(o.summary, o.max_model_len) for o in shorter]


def test_context_length_longer_than_the_model_is_infeasible(make: Make) -> None:
    result = plan(make(QWEN_7B, "h100", workload=Workload(context_length=65536, concurrency=1)))
    assert not result.fits


def test_max_num_seqs_sized_below_the_default_when_kv_holds_fewer(make: Make) -> None:
    result = plan(make(LLAMA_8B, "l4"))
    seqs = result.flags["max_num_seqs"]
    assert 1 <= seqs < 256
    assert any(r.startswith(f"max-num-seqs {seqs}: the KV cache holds about") and "preempt" in r
               for r in result.reasons)
    # roughly what the cache holds at 2048 tokens per request
    assert seqs <= result.prediction.kv_cache_tokens // 2048 + 1


def test_max_num_seqs_keeps_the_default_when_kv_holds_more(make: Make) -> None:
    result = plan(make("Qwen/Qwen2.5-0.5B-Instruct", "h100", constraints=Constraints(max_model_len=2048)))
    assert result.flags["max_num_seqs"] == 1024
    assert any("max-num-seqs 1024: vLLM's default" in r for r in result.reasons)


def test_max_num_seqs_is_sized_at_the_typical_request_not_the_p99_context(make: Make) -> None:
    result = plan(make(LLAMA_8B, "h100", workload=Workload(context_length=32768, concurrency=4)))
    assert result.fits
    assert result.flags["max_num_seqs"] >= 4
    assert result.flags["max_num_seqs"] <= result.prediction.kv_cache_tokens // 2048 + 1
    # issue 16: a workload of 32k and a pinned max-model-len of 32k give the same max-num-seqs for the same memory
    for gpu_name in ("RTX-4090", "L4"):
        by_workload = plan(make(LLAMA_8B, gpu_name, workload=Workload(context_length=32768, concurrency=1)))
        by_pin = plan(make(LLAMA_8B, gpu_name, pinned=PinnedFlags(max_model_len=32768)))
        if by_workload.flags["max_model_len"] == 32768:
            assert by_workload.flags["max_num_seqs"] == by_pin.flags["max_num_seqs"]


def test_max_model_len_is_refitted_for_the_chosen_max_num_seqs(make: Make) -> None:
    # 0.33 on an L4: the sampler rows and CUDA graphs of vLLM's 256 sequences cost KV cache; fitting max-model-len
    # at 256 and then lowering max-num-seqs would leave the memory that frees unused
    chosen = plan(make(LLAMA_8B, "l4"))
    seqs, length = chosen.flags["max_num_seqs"], chosen.flags["max_model_len"]
    assert chosen.fits and seqs < 256
    at_default = plan(make(LLAMA_8B, "l4", pinned=PinnedFlags(max_num_seqs=256)))
    assert at_default.fits and length > at_default.flags["max_model_len"]
    # consistent: the chosen count pinned gives the same context, and the chosen context pinned the same count
    assert plan(make(LLAMA_8B, "l4", pinned=PinnedFlags(max_num_seqs=seqs))).flags["max_model_len"] == length
    assert plan(make(LLAMA_8B, "l4", pinned=PinnedFlags(max_model_len=length))).flags["max_num_seqs"] == seqs
    # the longest that fits with that many sequences, less 10% of the predicted figures beside the weights: one
    # rounding step more would eat into that margin, and the margin itself is inside what vLLM's estimate allows
    est, mem = chosen.prediction.estimated_max_model_len, chosen.memory
    held = 0.10 * (mem.activation_gib + mem.non_torch_gib + mem.cudagraph_gib + mem.persistent_gib) / mem.kv_cache_gib
    assert 0 < held < 0.05
    assert length <= est * (1 - held) < length + 1024 <= est
    assert any(f"max-num-seqs {seqs})" in r for r in chosen.reasons if r.startswith(f"max-model-len {length}"))


def test_the_fit_margin_never_costs_the_workloads_context(make: Make) -> None:
    # vLLM's estimate at 8 sequences and utilization 0.912 on an L4 is just above 32768: the margin would take the
    # 16-bit plan below the workload's context and make fp8 look necessary; the stated context is kept instead
    result = plan(make(LLAMA_8B, "l4", pinned=PinnedFlags(max_num_seqs=8, gpu_memory_utilization=0.912),
                       workload=Workload(context_length=32768, concurrency=1)))
    assert result.fits and result.prediction.failure is None
    assert result.flags["max_model_len"] == 32768 and "kv_cache_dtype" not in result.flags
    assert result.prediction.estimated_max_model_len >= 32768
    assert int(result.prediction.estimated_max_model_len * 0.99) < 32768  # the margin alone would have cut it


@pytest.mark.parametrize("version", ["0.19.0", "0.26.0", "0.33.0"])
@pytest.mark.parametrize(("model", "gpu_name"), [(LLAMA_8B, "l4"), (QWEN_7B, "RTX-4090"),
                                                  ("google/gemma-2-9b-it", "L4"), (LLAMA_70B, "h100")])
def test_the_refitted_plan_passes_every_startup_check(make: Make, version: str, model: str, gpu_name: str) -> None:
    for count in (1, 2, 4):
        result = plan(make(model, gpu_name, gpu_count=count, vllm_version=version))
        if result.fits:
            assert result.prediction.failure is None
            assert result.prediction.estimated_max_model_len >= result.flags["max_model_len"]


@pytest.mark.parametrize("learned", [
    Constraints(force_fp8_kv=True, min_utilization=0.95),
    # the whole NoKVCacheMemory ladder before tensor parallelism (remediation/policy.py, _no_kv_memory)
    Constraints(min_utilization=0.95, force_enforce_eager=True, max_num_batched_tokens=512, force_fp8_kv=True),
])
def test_a_replan_with_fp8_at_095_fits_where_a_pinned_fp8_plan_fits(make: Make, learned: Constraints) -> None:
    # the remediation ladder's last memory steps: utilization raised to 0.95, then an fp8 KV cache. At vLLM's default
    # 256 sequences (sampler rows, CUDA graphs) no KV cache is left for Qwen2.5-14B on an RTX 5090; with the few
    # sequences a usable plan needs, it is
    pinned = plan(make("Qwen/Qwen2.5-14B-Instruct", "RTX-5090", pinned=PinnedFlags(
        kv_cache_dtype="fp8", gpu_memory_utilization=0.95, max_num_seqs=4)))
    assert pinned.fits
    replan = plan(make("Qwen/Qwen2.5-14B-Instruct", "RTX-5090", constraints=learned))
    assert replan.fits and replan.failure is None
    assert replan.flags["kv_cache_dtype"] == "fp8" and replan.flags["gpu_memory_utilization"] == 0.95
    assert replan.flags["max_num_seqs"] >= 4
    assert replan.flags["max_model_len"] >= pinned.flags["max_model_len"]


# --- fp8 KV cache and enforce-eager -------------------------------------------------------------------------


def test_neither_fp8_kv_nor_eager_when_auto_fits(make: Make) -> None:
    for request in (make(LLAMA_8B, "h100"), make(LLAMA_8B, "l4"), make(QWEN_7B, "l4"),
                    make(LLAMA_8B, "h100", workload=Workload(context_length=8192, concurrency=8))):
        result = plan(request)
        assert result.fits
        assert "kv_cache_dtype" not in result.flags
        assert "enforce_eager" not in result.flags
        assert "--enforce-eager" not in result.args()


def _longest_context(make: Make, gpu: str = "l4", **pins: Any) -> int:
    """The max-model-len the planner reaches for Llama-3.1-8B on one GPU with these flags pinned."""
    return int(plan(make(LLAMA_8B, gpu, pinned=PinnedFlags(**pins))).flags["max_model_len"])


def test_fp8_kv_chosen_only_when_auto_falls_short(make: Make) -> None:
    eager = _longest_context(make, kv_cache_dtype="auto", enforce_eager=True)
    fp8 = _longest_context(make, kv_cache_dtype="fp8", enforce_eager=False)
    assert fp8 > eager
    context = (eager + fp8) // 2  # more than 16-bit KV holds even without CUDA graphs, less than fp8 KV holds
    result = plan(make(LLAMA_8B, "l4", workload=Workload(context_length=context, concurrency=1)))  # L4 has fp8
    assert result.fits
    assert result.flags["kv_cache_dtype"] == "fp8"
    assert result.flags["max_model_len"] >= context
    assert any(r.startswith("kv-cache-dtype fp8:") for r in result.reasons)
    assert result.prediction.kv_bytes_per_token == 65_536


def test_fp8_kv_not_chosen_on_gpus_without_fp8(make: Make) -> None:
    result = plan(make(LLAMA_8B, "a10", workload=Workload(context_length=40000, concurrency=1)))  # Ampere
    assert result.flags.get("kv_cache_dtype", "auto") == "auto"
    assert not any("fp8" in o.flags.get("kv_cache_dtype", "") for o in result.options if o.gpu == "A10")


def test_enforce_eager_chosen_only_when_graphs_cannot_fit_at_any_setting(make: Make) -> None:
    # A10 (Ampere) has no fp8 KV cache: between graphs and eager, only eager holds the context
    auto = _longest_context(make, "a10", kv_cache_dtype="auto", enforce_eager=False)
    eager = _longest_context(make, "a10", kv_cache_dtype="auto", enforce_eager=True)
    assert eager > auto  # from v0.21 the CUDA-graph estimate comes out of the KV budget
    context = (auto + eager) // 2
    result = plan(make(LLAMA_8B, "a10", workload=Workload(context_length=context, concurrency=1)))
    assert result.fits
    assert result.flags.get("enforce_eager") is True
    assert "kv_cache_dtype" not in result.flags
    assert result.flags["max_model_len"] >= context
    assert any(r.startswith("enforce-eager:") for r in result.reasons)
    assert result.memory.cudagraph_gib == 0


def test_cuda_graphs_kept_when_another_allowed_setting_fits(make: Make) -> None:
    # on an L4 (fp8 KV) the same squeeze is met with CUDA graphs kept: fp8 KV is an allowed setting
    auto = _longest_context(make, kv_cache_dtype="auto", enforce_eager=False)
    eager = _longest_context(make, kv_cache_dtype="auto", enforce_eager=True)
    context = (auto + eager) // 2
    result = plan(make(LLAMA_8B, "l4", workload=Workload(context_length=context, concurrency=1)))
    assert result.fits
    assert "enforce_eager" not in result.flags
    assert result.flags["kv_cache_dtype"] == "fp8"
    assert result.flags["max_model_len"] >= context


# --- other tenants and constraints --------------------------------------------------------------------------


def test_gpu_free_gib_lowers_utilization_below_free_over_total(make: Make) -> None:
    result = plan(make(LLAMA_8B, "h100", gpu_free_gib=40.0))
    util = result.flags["gpu_memory_utilization"]
    assert util < 40.0 / 79.19
    assert result.memory.requested_gib <= 40.0
    assert result.fits
    assert any("free" in r and "gpu-memory-utilization" in r for r in result.reasons)


def test_free_memory_check_uses_the_given_free_memory(make: Make) -> None:
    result = plan(make(LLAMA_8B, "h100", vllm_version="0.19.0", gpu_free_gib=40.0,
                       pinned=PinnedFlags(gpu_memory_utilization=0.508, max_model_len=8192)))
    assert result.memory.requested_gib > 40.0
    assert result.failure is not None
    assert result.failure.kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY
    assert "(40.00/79.19 GiB)" in result.failure.message


def test_constraint_max_utilization(make: Make) -> None:
    result = plan(make(LLAMA_8B, "h100", constraints=Constraints(max_utilization=0.8)))
    assert result.flags["gpu_memory_utilization"] <= 0.8
    assert any("capped at 0.80" in r for r in result.reasons)


def test_constraint_max_model_len(make: Make) -> None:
    result = plan(make(LLAMA_8B, "h100", constraints=Constraints(max_model_len=4096)))
    assert result.fits
    assert result.flags["max_model_len"] == 4096


def test_constraint_min_model_len_honoured(make: Make) -> None:
    result = plan(make(LLAMA_8B, "l4", constraints=Constraints(min_model_len=40000)))
    assert result.fits
    assert result.flags["max_model_len"] >= 40000


def test_constraint_min_model_len_infeasible(make: Make) -> None:
    result = plan(make(LLAMA_8B, "l4", constraints=Constraints(min_model_len=120000)))
    assert not result.fits
    assert result.options


def test_constraint_forces_eager_and_fp8(make: Make) -> None:
    result = plan(make(LLAMA_8B, "h100", constraints=Constraints(force_enforce_eager=True, force_fp8_kv=True)))
    assert result.flags["enforce_eager"] is True
    assert result.flags["kv_cache_dtype"] == "fp8"


def test_constraint_max_num_seqs(make: Make) -> None:
    result = plan(make(LLAMA_8B, "h100", constraints=Constraints(max_num_seqs=16)))
    assert result.flags["max_num_seqs"] <= 16


def test_extra_activation_reduces_kv(make: Make) -> None:
    # 0.26.0: from 0.27 MRV2's sampler state (per max_num_seqs, which the planner fits to the KV cache) also moves
    base = plan(make(LLAMA_8B, "h100", constraints=Constraints(max_model_len=8192), vllm_version="0.26.0"))
    more = plan(make(LLAMA_8B, "h100", constraints=Constraints(max_model_len=8192, extra_activation_gib=4.0),
                     vllm_version="0.26.0"))
    assert more.memory.kv_cache_gib == pytest.approx(base.memory.kv_cache_gib - 4.0, abs=0.02)
    assert more.prediction.kv_cache_tokens < base.prediction.kv_cache_tokens


# --- infeasible: options ------------------------------------------------------------------------------------


def test_70b_on_one_rtx_4090_lists_options_with_figures(make: Make, gpu: Callable[[str], GPUSpec]) -> None:
    result = plan(make(LLAMA_70B, "4090", gpu_count=1))
    assert not result.fits
    assert result.failure is not None and result.failure.kind is FailureKind.WEIGHTS_DO_NOT_FIT
    assert any("Does not fit" in r for r in result.reasons)
    summaries = [o.summary for o in result.options]
    assert any(o.gpu == "RTX-4090" and o.gpu_count > 1 for o in result.options), summaries
    assert any(s.startswith("Use a larger GPU") for s in summaries), summaries
    for option in result.options:
        assert option.kv_cache_tokens > 0
        assert option.max_concurrency > 0
        assert option.max_model_len >= 1024
        assert option.flags["tensor_parallel_size"] * option.flags.get("pipeline_parallel_size", 1) \
            == option.gpu_count
        # the option's GPU has more memory in total than the one that failed
        assert gpu(option.gpu).reported_gib * option.gpu_count > 23.33


def test_70b_on_one_h100_offers_a_quantized_variant(make: Make) -> None:
    result = plan(make(LLAMA_70B, "h100", gpu_count=1))
    summaries = [o.summary for o in result.options]
    # a named checkpoint from the catalog when it has one (issue 16), else "a 4-bit AWQ/GPTQ checkpoint of ..."
    assert any(o.kind == "quantized-checkpoint" and "Meta-Llama-3.1-70B-Instruct-AWQ-INT4" in o.summary
               for o in result.options), summaries
    assert any(s.startswith("Use a larger GPU") for s in summaries), summaries


def test_options_replan_to_a_fitting_startup(make: Make, load_arch: Callable[[str], ModelArch],
                                              gpu: Callable[[str], GPUSpec]) -> None:
    result = plan(make(LLAMA_70B, "h100", gpu_count=1))
    checked = 0
    for option in result.options:
        if option.kind == "quantized-checkpoint":
            continue  # a different checkpoint
        pins = PinnedFlags(**{k: v for k, v in option.flags.items() if k in PinnedFlags.model_fields})
        again = plan(PlanRequest(arch=load_arch(LLAMA_70B), gpu=gpu(option.gpu), gpu_count=option.gpu_count,
                                 pinned=pins))
        assert again.fits, option.summary
        assert again.prediction.kv_cache_tokens == pytest.approx(option.kv_cache_tokens, rel=0.01)
        checked += 1
    assert checked >= 2


def test_fitting_plan_has_no_options(make: Make) -> None:
    assert plan(make(QWEN_7B, "h100")).options == []


# --- with_vllm_defaults -------------------------------------------------------------------------------------


def test_with_vllm_defaults_fills_what_vllm_would_use(make: Make) -> None:
    filled = with_vllm_defaults(make(LLAMA_8B, "h100", vllm_version="0.19.0")).pinned
    assert filled.tensor_parallel_size == 1
    assert filled.pipeline_parallel_size == 1
    assert filled.gpu_memory_utilization == 0.90
    assert filled.max_model_len == 131072
    assert (filled.max_num_seqs, filled.max_num_batched_tokens) == (1024, 8192)
    assert filled.kv_cache_dtype == "auto"
    assert filled.enforce_eager is False


def test_with_vllm_defaults_by_release_and_gpu(make: Make) -> None:
    assert with_vllm_defaults(make(LLAMA_8B, "h100", vllm_version="0.21.0")).pinned.gpu_memory_utilization == 0.92
    small = with_vllm_defaults(make(LLAMA_8B, "l4", vllm_version="0.19.0")).pinned
    assert (small.max_num_seqs, small.max_num_batched_tokens) == (256, 2048)
    a100 = with_vllm_defaults(make(LLAMA_8B, "a100-80gb", vllm_version="0.19.0")).pinned
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (256, 2048)


def test_with_vllm_defaults_keeps_pins(make: Make) -> None:
    pins = PinnedFlags(tensor_parallel_size=2, gpu_memory_utilization=0.95, max_model_len=8192, max_num_seqs=64)
    filled = with_vllm_defaults(make(LLAMA_8B, "h100", pinned=pins, gpu_count=2)).pinned
    assert (filled.tensor_parallel_size, filled.gpu_memory_utilization, filled.max_model_len,
            filled.max_num_seqs) == (2, 0.95, 8192, 64)


def test_vllm_defaults_plan_does_not_search(make: Make) -> None:
    result = plan(with_vllm_defaults(make(LLAMA_8B, "l4", vllm_version="0.19.0")))
    # vLLM's own defaults try the full 128k context on a 24 GB card, and fail the way vLLM does
    assert not result.fits
    assert result.flags["max_model_len"] == 131072
    assert result.flags["gpu_memory_utilization"] == 0.9
    assert result.failure is not None and result.failure.kind is FailureKind.KV_CACHE_TOO_SMALL
    assert "models's max seq len (131072)" in result.failure.message


# --- calibration: replay real vLLM startups (benchmarks/data) -----------------------------------------------------

_RECORD_GPUS = {"H100": "h100", "L4": "l4", "L40S": "l40s", "A100 40GB": "a100-40gb", "A100": "a100-80gb"}


def _find_record(records: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    found = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, f"{len(found)} records match {match}"
    return found[0]


def _replay(record: dict[str, Any], shared: Any, load_gpu: Callable[[str], GPUSpec]) -> Plan:
    """Pin what the run set, let vLLM's own defaults fill the rest, as the real run did."""
    import json
    import re

    from vllm_operator.planner.arch import arch_from_config

    folder = shared / "models" / record["model_id"].replace("/", "__")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    arch = arch_from_config(json.loads((folder / "config.json").read_text()), model_id=record["model_id"],
                            total_size=index["metadata"]["total_size"])
    text = str(record["gpu"])
    count_match = re.match(r"\s*(\d+)\s*x\s*", text)
    gpu_name = next(v for k, v in _RECORD_GPUS.items() if k in text)
    version = re.search(r"(\d+\.\d+(?:\.\d+)?)", str(record["vllm_version"]))
    free = re.search(r"Free memory on device(?: cuda:\d+)? \(([\d.]+)/", record.get("error") or "")

    def num(key: str) -> Any:
        value = record.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    kv = record.get("kv_cache_dtype")
    pins = PinnedFlags(
        tensor_parallel_size=num("tensor_parallel_size"), pipeline_parallel_size=num("pipeline_parallel_size"),
        gpu_memory_utilization=num("gpu_memory_utilization"), max_model_len=num("max_model_len"),
        max_num_seqs=num("max_num_seqs"), max_num_batched_tokens=num("max_num_batched_tokens"),
        kv_cache_dtype=kv if kv not in (None, "auto") else None, block_size=num("block_size"),
        enforce_eager=record.get("enforce_eager") or None)
    request = PlanRequest(arch=arch, gpu=load_gpu(gpu_name), gpu_count=int(count_match.group(1)) if count_match else 1,
                          pinned=pins, vllm_version=version.group(1) if version else None,
                          gpu_free_gib=float(free.group(1)) if free else None)
    return plan(with_vllm_defaults(request))


@pytest.mark.parametrize(
    "match",
    [
        {"model_id": "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic", "tensor_parallel_size": 2},
        {"model_id": "Qwen/Qwen2.5-72B-Instruct", "tensor_parallel_size": 2},
        {"model_id": "google/gemma-3-4b-it"},
        {"model_id": "openai/gpt-oss-20b", "tensor_parallel_size": 2, "gpu_memory_utilization": 0.9},
        {"model_id": "deepseek-ai/DeepSeek-V2-Lite", "pipeline_parallel_size": 2},
        {"model_id": "Qwen/Qwen3-14B", "vllm_version": "0.15.0"},
        {"model_id": "Qwen/Qwen3-14B", "vllm_version": "0.17.0"},
        {"model_id": "codellama/CodeLlama-7b-hf"},
        {"model_id": "Qwen/Qwen2.5-7B-Instruct", "tensor_parallel_size": 4},
    ],
    ids=["llama-3.3-70b-fp8-tp2", "qwen2.5-72b-tp2", "gemma-3-4b", "gpt-oss-20b-tp2-u0.9", "dsv2-lite-pp2-l4",
         "qwen3-14b-v0.15", "qwen3-14b-v0.17", "codellama-7b-mha", "qwen2.5-7b-tp4"],
)
def test_replayed_records_predict_kv_tokens_within_2_percent(
        match: dict[str, Any], startup_records: list[dict[str, Any]], shared_data: Any,
        gpu: Callable[[str], GPUSpec]) -> None:
    record = _find_record(startup_records, **match)
    logged = record["gpu_kv_cache_tokens"]
    assert isinstance(logged, int)
    result = _replay(record, shared_data, gpu)
    assert result.failure is None or result.failure.kind is FailureKind.CUDA_OOM_STARTUP
    error = (result.prediction.kv_cache_tokens - logged) / logged
    assert abs(error) <= 0.02, f"predicted {result.prediction.kv_cache_tokens} vs logged {logged} ({error:+.2%})"


@pytest.mark.parametrize(
    ("match", "kind"),
    [
        ({"model_id": "codellama/CodeLlama-34b-hf"}, FailureKind.INSUFFICIENT_FREE_GPU_MEMORY),
        ({"model_id": "moonshotai/Kimi-Dev-72B", "gpu_kv_cache_tokens": None}, FailureKind.INSUFFICIENT_FREE_GPU_MEMORY),
        ({"model_id": "openai/gpt-oss-20b", "tensor_parallel_size": 1, "gpu_memory_utilization": 0.95,
          "vllm_version": "0.19.0"}, FailureKind.CUDA_OOM_STARTUP),
        ({"model_id": "openai/gpt-oss-20b", "tensor_parallel_size": 2, "gpu_memory_utilization": 0.95},
         FailureKind.CUDA_OOM_STARTUP),
        ({"model_id": "Qwen/Qwen3-14B", "tensor_parallel_size": 5}, FailureKind.INVALID_PARALLELISM),
    ],
    ids=["codellama-34b-free", "kimi-dev-72b-free", "gpt-oss-20b-tp1-oom", "gpt-oss-20b-tp2-oom", "qwen3-14b-tp5"],
)
def test_replayed_failures_predict_their_class(
        match: dict[str, Any], kind: FailureKind, startup_records: list[dict[str, Any]], shared_data: Any,
        gpu: Callable[[str], GPUSpec]) -> None:
    record = _find_record(startup_records, **match)
    assert record.get("error")
    result = _replay(record, shared_data, gpu)
    assert not result.fits
    assert result.failure is not None
    assert result.failure.kind is kind, result.failure.message



def test_more_pipeline_stages_than_layers_is_refused_by_the_planner(make: Make) -> None:
    """Was: ZeroDivisionError in predict_startup (a stage without layers has no KV block size)."""
    from vllm_operator.planner.plan import InvalidParallelism

    request = make("Qwen/Qwen2.5-0.5B-Instruct", "H100-80GB", gpu_count=32,
                   pinned=PinnedFlags(pipeline_parallel_size=32))
    with pytest.raises(InvalidParallelism, match=r"32 for the 24 decoder layers .* leave 8 stages without a layer.*"
                                                 r"at most 24"):
        plan(request)
    request = make("Qwen/Qwen2.5-0.5B-Instruct", "H100-80GB", gpu_count=24,
                   pinned=PinnedFlags(pipeline_parallel_size=24))
    assert plan(request).gpu_count == 24
