"""The remediation ladder's policy, pure: `decide(failure, key, Current, now)` on failures read (by the real
classifier) from vLLM's own texts — `planner.messages` by release and the corpus in data/vllm_failure_texts.yaml.

Each class gets its step; steps are bounded (maxSteps, minIntervalSeconds), idempotent (pod UID + restart count)
and never touch a pinned flag; the profile round-trips through status; stepping up is opt-in and waits for the
stable window.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_operator.api.v1alpha1 import RemediationSpec, RemediationStatus, parse_spec
from vllm_operator.planner import Constraints, messages
from vllm_operator.planner.failures import FailureKind
from vllm_operator.planner.versions import profile_for
from vllm_operator.reconcile import constraints_from_status
from vllm_operator.remediation.classifier import Failure, classify_text
from vllm_operator.remediation.ladder import current_from
from vllm_operator.remediation.policy import (
    Action,
    Current,
    Decision,
    constraints_to_profile,
    decide,
    failure_key,
    profile_constraints,
    step_up,
)

CORPUS = {t["id"]: t for t in yaml.safe_load(
    (Path(__file__).parent / "data" / "vllm_failure_texts.yaml").read_text())["texts"]}
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
KEY = "0b7c1f0e-5d0c-4c1e-9a7a-3f1f2d9e8a11/3"
L4_GIB = 21.84
FLAGS: dict[str, Any] = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_model_len": 32768,
                         "max_num_seqs": 37}
NEWEST = profile_for("0.26.0")


def corpus(entry_id: str) -> Failure:
    """A corpus text, classified as the operator would read it from the pod."""
    t = CORPUS[entry_id]
    return classify_text(t["text"], terminated_reason=t.get("terminated_reason"), exit_code=t.get("exit_code"),
                         was_ready_before=t.get("was_ready_before"))


def current(**changes: Any) -> Current:
    values: dict[str, Any] = {"flags": dict(FLAGS), "gpu_total_gib": L4_GIB}
    values.update(changes)
    return Current(**values)


def step(failure: Failure, cur: Current, key: str = KEY) -> Decision:
    decision = decide(failure, key, cur, NOW)
    assert decision.failure_class == failure.kind
    return decision


def kv_failure(version: str, *, max_model_len: int = 32768, estimate: int = 20000, needed: float = 1.75,
               available: float = 1.07) -> Failure:
    """KVCacheTooSmall as `version` words it (available/needed ≈ the estimate's share of max_model_len)."""
    text = messages.kv_too_small_message(profile_for(version), max_model_len=max_model_len, needed_gib=needed,
                                         available_gib=available, estimated_max_len=estimate, kv_tokens=estimate)
    failure = classify_text(text, exit_code=1, terminated_reason="Error")
    assert failure.kind is FailureKind.KV_CACHE_TOO_SMALL, text
    return failure


def free_failure(free: float = 17.4, total: float = L4_GIB, util: float = 0.9, version: str = "0.26.0") -> Failure:
    text = messages.free_memory_message(profile_for(version), device=0, free_gib=free, total_gib=total, util=util,
                                        requested_gib=round(total * util, 2))
    failure = classify_text(text, exit_code=1)
    assert failure.kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY, text
    return failure


def torch_oom() -> str:
    return messages.cuda_oom_message(device=0, tried_mib=260.0, total_gib=22.03, free_mib=120.5, in_use_gib=21.9,
                                     torch_gib=21.5)


NO_KV = classify_text(messages.no_kv_memory_message(NEWEST), exit_code=1)
WEIGHTS = classify_text(messages.weights_oom_message(NEWEST, torch_oom()), exit_code=1)
OOM_STARTUP = corpus("oom-profiling-frames-0.9")
OOM_SERVING = classify_text(torch_oom(), exit_code=1, was_ready_before=True)
HOST_OOM = classify_text("", terminated_reason="OOMKilled", exit_code=137)
HEADS = classify_text(messages.heads_divisibility_message(28, 3), exit_code=1)
TOO_LONG = classify_text(messages.max_len_too_long_message(65536, 32768), exit_code=1)
KV = kv_failure("0.26.0")
FREE = free_failure()

REPRESENTATIVE: dict[FailureKind, Failure] = {
    FailureKind.KV_CACHE_TOO_SMALL: KV,
    FailureKind.INSUFFICIENT_FREE_GPU_MEMORY: FREE,
    FailureKind.NO_KV_CACHE_MEMORY: NO_KV,
    FailureKind.WEIGHTS_DO_NOT_FIT: WEIGHTS,
    FailureKind.CUDA_OOM_STARTUP: OOM_STARTUP,
    FailureKind.CUDA_OOM_SERVING: OOM_SERVING,
    FailureKind.HOST_OOM_KILLED: HOST_OOM,
    FailureKind.INVALID_PARALLELISM: HEADS,
    FailureKind.MAX_MODEL_LEN_TOO_LONG: TOO_LONG,
    FailureKind.UNKNOWN: corpus("unknown-illegal-memory-access"),
    FailureKind.MODEL_NOT_FOUND: corpus("hf-repo-not-found"),
    FailureKind.IMAGE_PULL: classify_text('Back-off pulling image "vllm/vllm-openai:v0.26.0"',
                                          waiting_reason="ImagePullBackOff"),
    FailureKind.INVALID_ARGUMENT: corpus("argparse-unrecognized"),
    FailureKind.PIPELINE_PARALLEL_UNSUPPORTED: corpus("pp-unsupported-v0"),
}


def test_the_representative_failures_are_read_as_their_class() -> None:
    for kind, failure in REPRESENTATIVE.items():
        assert failure.kind is kind, (kind, failure.summary)
    assert set(REPRESENTATIVE) == set(FailureKind)


# --- feeding a step back, as the planner and the next status would ---------------------------------------------

def planned(cur: Current, decision: Decision, *, after: timedelta = timedelta(minutes=5)) -> Current:
    """The service after a STEP: the new constraints in the profile, the flags the planner would then choose
    (pinned flags kept), the failure key and time recorded."""
    assert decision.action is Action.STEP and decision.constraints is not None
    c = decision.constraints
    flags = dict(cur.flags)

    def set_flag(name: str, value: Any) -> None:
        if name not in cur.pinned:
            flags[name] = value

    util = float(flags.get("gpu_memory_utilization", 0.9))
    if c.min_utilization is not None:
        util = max(util, c.min_utilization)
    if c.gpu_free_gib is not None and cur.gpu_total_gib:
        util = min(util, int((c.gpu_free_gib - 0.25) / cur.gpu_total_gib * 100) / 100)
    if c.max_utilization is not None:
        util = min(util, c.max_utilization)
    set_flag("gpu_memory_utilization", util)
    if c.max_model_len is not None:
        set_flag("max_model_len", min(int(flags["max_model_len"]), c.max_model_len))
    if c.max_num_seqs is not None:
        set_flag("max_num_seqs", min(int(flags["max_num_seqs"]), c.max_num_seqs))
    if c.max_num_batched_tokens is not None:
        set_flag("max_num_batched_tokens", c.max_num_batched_tokens)
    if c.min_tensor_parallel_size is not None:
        set_flag("tensor_parallel_size", max(int(flags["tensor_parallel_size"]), c.min_tensor_parallel_size))
    if c.force_enforce_eager:
        set_flag("enforce_eager", True)
    if c.force_fp8_kv:
        set_flag("kv_cache_dtype", "fp8")
    return cur.model_copy(update={
        "flags": flags, "constraints": c, "step": cur.step + 1,
        "history_keys": cur.history_keys | {KEY}, "last_step_time": NOW - after})


def walk(failure: Failure, cur: Current, limit: int = 40) -> tuple[list[Decision], Current]:
    """Feed the same kind of failure (a new pod each time) until the ladder stops stepping."""
    decisions = []
    for n in range(limit):
        decision = decide(failure, f"pod-{n}/1", cur, NOW)
        decisions.append(decision)
        if decision.action is not Action.STEP:
            return decisions, cur
        cur = planned(cur, decision)
    raise AssertionError(f"the ladder did not stop within {limit} steps: {[d.changed for d in decisions]}")


# --- KVCacheTooSmall ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("version", "wording"), [
    ("0.6.4", "v0"), ("0.7.3", "v1-gb"), ("0.8.3", "v1-no-estimate"), ("0.8.5", "v1-broken-estimate"),
    ("0.9.1", "v1-models's"), ("0.13.0", "v1-models's"), ("0.22.0", "v1"), ("0.26.0", "v1"),
])
def test_kv_too_small_sets_max_model_len_from_what_vllm_says_fits_in_each_wording(version: str,
                                                                                 wording: str) -> None:
    # 1.07/1.75 of 32768 is 20034 tokens; releases that print the estimate say 20000; V0 prints the cache's
    # 20000 tokens. Either way the next length is computed from vLLM's numbers: 19456 (rounded down to 1 Ki).
    failure = kv_failure(version)
    assert failure.wording == wording
    decision = step(failure, current())
    assert decision.action is Action.STEP
    assert decision.changed == {"max_model_len": 19456}
    assert decision.constraints == Constraints(max_model_len=19456)
    assert "32768" in decision.message and "19456" in decision.message


@pytest.mark.parametrize(("entry", "fits"), [
    ("kv-v1-current-0.22", 27264),                 # estimate printed
    ("kv-v1-typo-docs-0.21", 22464),
    ("kv-v1-typo-0.11", 101088),
    ("kv-v1-typo-0.9.2-termination-message", 30944),
    ("kv-v1-broken-estimate-0.8.5", 80855),        # 131072 × 9.87 / 16.0: derived from needed/available
    ("kv-v1-no-estimate-0.8.3", 80855),
    ("kv-v1-gb-0.7.3", 23838),                     # 32768 × 2.91 / 4.0 (GB on both sides)
    ("kv-v0-0.6.4", 23648),                        # V0: the cache's "(Y)" tokens
    ("kv-v0-bare-message", 9712),
])
def test_kv_too_small_on_real_texts_plans_just_below_what_fits(entry: str, fits: int) -> None:
    failure = corpus(entry)
    decision = step(failure, current(flags={**FLAGS, "max_model_len": failure.max_model_len}))
    assert decision.action is Action.STEP
    target = decision.changed["max_model_len"]
    assert fits - 1024 < target <= fits, (target, fits)
    assert target % 256 == 0
    assert str(fits) in decision.message


def test_kv_too_small_keeps_the_workload_context_and_raises_utilization_instead() -> None:
    # vLLM says 20000 fit, the user needs 24000: shrinking would break the workload, so use more of the GPU.
    decision = step(KV, current(min_context=24000))
    assert decision.action is Action.STEP
    # more memory, and the context capped at the length that failed (never grown past it), not shrunk
    assert decision.changed == {"min_utilization": 0.95, "max_model_len": KV.max_model_len}
    assert KV.max_model_len is not None and KV.max_model_len >= 24000


def test_kv_too_small_never_rounds_below_the_workload_context() -> None:
    failure = kv_failure("0.26.0", estimate=24300, available=1.3)
    decision = step(failure, current(min_context=24100))
    assert decision.action is Action.STEP
    assert 24100 <= decision.changed["max_model_len"] <= 24300


def test_kv_too_small_with_max_model_len_pinned_raises_utilization_then_stops_naming_the_flag() -> None:
    pinned = frozenset({"max_model_len"})
    decision = step(KV, current(pinned=pinned))
    assert decision.action is Action.STEP
    assert decision.changed == {"min_utilization": 0.95}

    at_the_top = current(pinned=pinned, flags={**FLAGS, "gpu_memory_utilization": 0.95})
    verdict = step(KV, at_the_top)
    assert verdict.action is Action.EXHAUSTED
    assert verdict.constraints is None and verdict.changed == {}
    assert "spec.flags.maxModelLen" in verdict.message
    assert "20000" in verdict.message  # the length that would fit


def test_kv_too_small_with_length_and_utilization_pinned_stops_at_once() -> None:
    verdict = step(KV, current(pinned=frozenset({"max_model_len", "gpu_memory_utilization"})))
    assert verdict.action is Action.EXHAUSTED
    assert "spec.flags.maxModelLen to 20000" in verdict.message


def test_kv_too_small_verdict_names_the_workload_context_when_it_is_what_blocks() -> None:
    cur = current(min_context=24000, flags={**FLAGS, "gpu_memory_utilization": 0.95})
    verdict = step(KV, cur)
    assert verdict.action is Action.EXHAUSTED
    assert "spec.workload.contextLength" in verdict.message


# --- InsufficientFreeGPUMemory -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("entry", "free"), [
    ("free-device-real-codellama-tp2", 60.87), ("free-device-real-kimi-tp4-bare", 60.85),
    ("free-no-device-0.11", 38.21), ("free-external-weights-0.33", 20.5),
])
def test_insufficient_free_memory_replans_for_the_free_memory_vllm_saw(entry: str, free: float) -> None:
    decision = step(corpus(entry), current(gpu_total_gib=79.19))
    assert decision.action is Action.STEP
    assert decision.changed == {"gpu_free_gib": free}


@pytest.mark.parametrize("version", ["0.9.1", "0.14.0", "0.26.0"])
def test_insufficient_free_memory_with_utilization_pinned_names_the_flag_and_a_value_that_fits(version: str) -> None:
    free, total = 17.4, L4_GIB
    failure = free_failure(free, total, version=version)
    verdict = step(failure, current(pinned=frozenset({"gpu_memory_utilization"})))
    assert verdict.action is Action.EXHAUSTED and verdict.constraints is None
    assert "spec.flags.gpuMemoryUtilization" in verdict.message
    found = re.search(r"set it to ([0-9.]+) or less", verdict.message)
    assert found, verdict.message
    value = float(found[1])
    assert 0 < value <= (free - 0.3) / total


# --- NoKVCacheMemory ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry", ["nokv-v0-plain", "nokv-v1-docs-0.20", "nokv-v1-cpu-note-0.22",
                                   "nokv-auto-fit-0.14"])
def test_no_kv_memory_first_raises_utilization(entry: str) -> None:
    decision = step(corpus(entry), current())
    assert decision.action is Action.STEP
    assert decision.changed == {"min_utilization": 0.95}


def test_no_kv_memory_walks_utilization_eager_batched_tokens_fp8_then_tensor_parallelism() -> None:
    decisions, last = walk(NO_KV, current(max_steps=50))
    assert [d.changed for d in decisions[:-1]] == [
        {"min_utilization": 0.95},
        {"force_enforce_eager": True},
        {"max_num_batched_tokens": 1024},
        {"max_num_batched_tokens": 512},
        {"force_fp8_kv": True},
        {"min_tensor_parallel_size": 2},
        {"min_tensor_parallel_size": 4},
        {"min_tensor_parallel_size": 8},
    ]
    verdict = decisions[-1]
    assert verdict.action is Action.EXHAUSTED
    assert "spec.gpu.maxCount" in verdict.message and "16" in verdict.message
    # every step kept what the earlier ones learned
    assert last.constraints == Constraints(min_utilization=0.95, force_enforce_eager=True, max_num_batched_tokens=512,
                                           force_fp8_kv=True, min_tensor_parallel_size=8)


def test_no_kv_memory_does_not_raise_utilization_when_another_process_holds_memory() -> None:
    decision = step(NO_KV, current(constraints=Constraints(gpu_free_gib=17.4)))
    assert decision.changed == {"force_enforce_eager": True}


# --- WeightsDoNotFit ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("tp", "max_gpus", "expected"), [(1, 8, 2), (2, 8, 4), (4, 8, 8), (1, 2, 2)])
def test_weights_do_not_fit_doubles_tensor_parallelism_within_max_count(tp: int, max_gpus: int,
                                                                        expected: int) -> None:
    decision = step(WEIGHTS, current(flags={**FLAGS, "tensor_parallel_size": tp}, max_gpus=max_gpus))
    assert decision.action is Action.STEP
    assert decision.changed == {"min_tensor_parallel_size": expected}


@pytest.mark.parametrize("entry", ["oom-load-wrapper-0.13", "oom-loading-markers-0.8", "oom-loading-torch20-v0"])
def test_weights_do_not_fit_beyond_max_count_stops_naming_it(entry: str) -> None:
    failure = corpus(entry)
    assert failure.kind is FailureKind.WEIGHTS_DO_NOT_FIT
    verdict = step(failure, current(flags={**FLAGS, "tensor_parallel_size": 4}, max_gpus=4))
    assert verdict.action is Action.EXHAUSTED and verdict.constraints is None
    assert "spec.gpu.maxCount" in verdict.message and "8" in verdict.message


def test_weights_do_not_fit_with_tensor_parallelism_pinned_names_the_flag() -> None:
    verdict = step(WEIGHTS, current(pinned=frozenset({"tensor_parallel_size"})))
    assert verdict.action is Action.EXHAUSTED
    assert "spec.flags.tensorParallelSize" in verdict.message


def test_weights_do_not_fit_counts_pipeline_stages_against_max_count() -> None:
    cur = current(flags={**FLAGS, "tensor_parallel_size": 2, "pipeline_parallel_size": 2},
                  pinned=frozenset({"pipeline_parallel_size"}), max_gpus=4)
    verdict = step(WEIGHTS, cur)
    assert verdict.action is Action.EXHAUSTED
    assert "spec.gpu.maxCount" in verdict.message


def test_weights_verdict_names_gpu_count_when_the_user_fixed_it() -> None:
    spec = parse_spec({"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "gpu": {"count": 1, "maxCount": 8}})
    cur = current_from(spec, {"plan": {"flags": FLAGS}})
    verdict = step(WEIGHTS, cur)
    assert verdict.action is Action.EXHAUSTED
    assert "spec.gpu.count" in verdict.message


# --- CUDA OOM at startup and while serving ------------------------------------------------------------------------

@pytest.mark.parametrize("entry", ["oom-serving-markers-0.11", "oom-serving-was-ready"])
def test_cuda_oom_while_serving_halves_max_num_seqs(entry: str) -> None:
    decision = step(corpus(entry), current())
    assert decision.action is Action.STEP
    assert decision.changed == {"max_num_seqs": 18}


def test_cuda_oom_while_serving_walks_seqs_down_then_batched_tokens_then_stops() -> None:
    decisions, _ = walk(OOM_SERVING, current(max_steps=50))
    assert [d.changed for d in decisions[:-1]] == [
        {"max_num_seqs": 18}, {"max_num_seqs": 9}, {"max_num_seqs": 4}, {"max_num_seqs": 2}, {"max_num_seqs": 1},
        {"max_num_batched_tokens": 1024}, {"max_num_batched_tokens": 512}]
    assert decisions[-1].action is Action.EXHAUSTED


def test_cuda_oom_while_serving_with_max_num_seqs_pinned_shrinks_batched_tokens() -> None:
    decision = step(OOM_SERVING, current(pinned=frozenset({"max_num_seqs"})))
    assert decision.changed == {"max_num_batched_tokens": 1024}
    verdict = step(OOM_SERVING, current(pinned=frozenset({"max_num_seqs", "max_num_batched_tokens"})))
    assert verdict.action is Action.EXHAUSTED
    assert "max-num-seqs" in verdict.message


@pytest.mark.parametrize("entry", ["oom-cudagraph-real-gpt-oss-tp1", "oom-profiling-frames-0.9",
                                   "oom-sampler-warmup-0.11", "oom-capture-torch21-v0"])
def test_cuda_oom_at_startup_enforces_eager_first(entry: str) -> None:
    failure = corpus(entry)
    assert failure.kind is FailureKind.CUDA_OOM_STARTUP
    assert step(failure, current()).changed == {"force_enforce_eager": True}


def test_cuda_oom_at_startup_then_lowers_utilization() -> None:
    decisions, _ = walk(OOM_STARTUP, current(max_steps=50))
    changed = [d.changed for d in decisions[:-1]]
    assert changed[0] == {"force_enforce_eager": True}
    assert changed[1] == {"max_utilization": 0.85}
    assert changed[2] == {"max_utilization": 0.8}
    assert decisions[-1].action is Action.EXHAUSTED


# --- HostOOMKilled -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry", ["host-oom-killed", "host-oom-killed-with-cuda-text", "host-sigkill-no-text"])
def test_host_oom_raises_the_memory_limit_by_half(entry: str) -> None:
    decision = step(corpus(entry), current(host_memory_gib=26.0, node_memory_gib=128.0))
    assert decision.action is Action.STEP
    assert decision.changed == {"host_memory_gib": 39.0}


def test_host_oom_starts_from_the_limit_an_earlier_step_set() -> None:
    cur = current(host_memory_gib=26.0, constraints=Constraints(host_memory_gib=39.0), node_memory_gib=128.0)
    assert step(HOST_OOM, cur).changed == {"host_memory_gib": 59.0}


def test_host_oom_is_capped_by_the_nodes_allocatable_memory_then_stops() -> None:
    capped = step(HOST_OOM, current(host_memory_gib=26.0, node_memory_gib=32.0))
    assert capped.changed == {"host_memory_gib": 28.0}  # 90 % of 32 GiB
    verdict = step(HOST_OOM, current(host_memory_gib=28.0, node_memory_gib=32.0))
    assert verdict.action is Action.EXHAUSTED
    assert "32" in verdict.message


def test_host_oom_with_memory_set_by_the_user_stops_naming_it() -> None:
    verdict = step(HOST_OOM, current(host_memory_gib=26.0, memory_pinned=True))
    assert verdict.action is Action.EXHAUSTED and verdict.constraints is None
    assert "spec.resources.memory" in verdict.message and "26" in verdict.message


# --- InvalidParallelism, MaxModelLenTooLong ----------------------------------------------------------------------

@pytest.mark.parametrize("entry", ["heads-tp-v0-plain", "heads-tp-pydantic-0.11", "not-divisible-real-qwen3-tp5",
                                   "kv-heads-tp-0.33"])
def test_invalid_parallelism_with_tensor_parallelism_pinned_stops_with_advice(entry: str) -> None:
    failure = corpus(entry)
    tp = failure.tensor_parallel_size or failure.divisor
    verdict = step(failure, current(flags={**FLAGS, "tensor_parallel_size": tp},
                                    pinned=frozenset({"tensor_parallel_size"})))
    assert verdict.action is Action.EXHAUSTED and verdict.constraints is None
    assert f"spec.flags.tensorParallelSize={tp}" in verdict.message


def test_invalid_parallelism_never_steps_on_its_own() -> None:
    for entry in ("heads-tp-pydantic-0.11", "world-size-0.21", "placement-group-0.33"):
        decision = step(corpus(entry), current())
        assert decision.action is Action.EXHAUSTED and decision.changed == {}


def test_invalid_parallelism_advice_suggests_sizes_that_divide_the_heads() -> None:
    failure = corpus("kv-heads-tp-0.33")  # 6 KV heads, TP 4
    verdict = step(failure, current(flags={**FLAGS, "tensor_parallel_size": 4},
                                    pinned=frozenset({"tensor_parallel_size"})))
    advice = verdict.message.split("use one of:")[-1]
    suggested = {int(n) for n in re.findall(r"\b\d+\b", advice)}
    assert suggested, advice
    assert 4 not in suggested
    assert all(6 % n == 0 for n in suggested), suggested


@pytest.mark.parametrize(("entry", "derived"), [("max-len-pydantic-phi2", 2048), ("max-len-v0-plain", 4096)])
def test_max_model_len_too_long_plans_the_models_own_context(entry: str, derived: int) -> None:
    decision = step(corpus(entry), current())
    assert decision.action is Action.STEP
    assert decision.changed == {"max_model_len": derived}
    verdict = step(corpus(entry), current(pinned=frozenset({"max_model_len"})))
    assert verdict.action is Action.EXHAUSTED
    assert f"spec.flags.maxModelLen exceeds the model's context ({derived}); set it to {derived}" in verdict.message


# --- not memory: surface, change nothing -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", [FailureKind.UNKNOWN, FailureKind.IMAGE_PULL, FailureKind.MODEL_NOT_FOUND,
                                  FailureKind.INVALID_ARGUMENT, FailureKind.PIPELINE_PARALLEL_UNSUPPORTED])
def test_failures_no_flag_can_fix_are_surfaced_with_their_summary(kind: FailureKind) -> None:
    failure = REPRESENTATIVE[kind]
    decision = step(failure, current())
    assert decision.action is Action.SURFACE
    assert decision.constraints is None and decision.changed == {}
    assert failure.summary in decision.message


# --- bounded, idempotent -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", [k for k in FailureKind if k in (
    FailureKind.KV_CACHE_TOO_SMALL, FailureKind.NO_KV_CACHE_MEMORY, FailureKind.CUDA_OOM_SERVING,
    FailureKind.WEIGHTS_DO_NOT_FIT, FailureKind.HOST_OOM_KILLED, FailureKind.INSUFFICIENT_FREE_GPU_MEMORY)])
def test_at_max_steps_the_ladder_stops_and_says_what_to_change(kind: FailureKind) -> None:
    verdict = step(REPRESENTATIVE[kind], current(step=5, max_steps=5, host_memory_gib=26.0))
    assert verdict.action is Action.EXHAUSTED and verdict.constraints is None
    assert "spec.remediation.maxSteps=5" in verdict.message
    assert "The next step would have been:" in verdict.message  # what to apply by hand


def test_max_steps_zero_never_steps() -> None:
    assert step(KV, current(max_steps=0)).action is Action.EXHAUSTED


def test_min_interval_not_elapsed_waits_and_then_steps() -> None:
    cur = current(step=1, last_step_time=NOW - timedelta(seconds=59), min_interval_seconds=60)
    wait = step(KV, cur)
    assert wait.action is Action.WAIT and wait.constraints is None
    assert "minIntervalSeconds" in wait.message
    due = cur.model_copy(update={"last_step_time": NOW - timedelta(seconds=60)})
    assert step(KV, due).action is Action.STEP


def test_the_same_failure_is_ignored_before_anything_else() -> None:
    for cur in (current(history_keys=frozenset({KEY})),
                current(history_keys=frozenset({KEY}), enabled=False),
                current(history_keys=frozenset({KEY}), step=9, max_steps=5),
                current(history_keys=frozenset({KEY}), last_step_time=NOW)):
        for failure in (KV, REPRESENTATIVE[FailureKind.MODEL_NOT_FOUND]):
            assert step(failure, cur).action is Action.IGNORE
    # another restart of the same pod is a new failure
    assert decide(KV, KEY.replace("/3", "/4"), current(history_keys=frozenset({KEY})), NOW).action is Action.STEP


def test_failure_keys_in_history_only_are_ignored_too() -> None:
    """A failure acted on earlier, though not the last one (`lastFailureKey` moved on), is still not repeated."""
    spec = parse_spec({"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}})
    status = {"plan": {"flags": FLAGS}, "remediation": {
        "step": 2, "profile": {"max_model_len": 19456},
        "history": [{"step": 1, "time": "2025-06-01T11:00:00Z", "failureClass": "KVCacheTooSmall",
                     "podUID": "pod-a", "restartCount": 3},
                    {"step": 2, "time": "2025-06-01T11:05:00Z", "failureClass": "NoKVCacheMemory",
                     "podUID": "pod-b", "restartCount": 1}],
        "lastFailureKey": "pod-c/7"}}
    cur = current_from(spec, status)
    assert cur.history_keys == {"pod-a/3", "pod-b/1", "pod-c/7"}
    assert cur.step == 2 and cur.constraints == Constraints(max_model_len=19456)
    assert cur.last_step_time == datetime(2025, 6, 1, 11, 5, tzinfo=UTC)
    for key in ("pod-a/3", "pod-b/1", "pod-c/7"):
        assert decide(KV, key, cur, NOW).action is Action.IGNORE
    assert failure_key("pod-a", 3) == "pod-a/3"


def test_remediation_disabled_surfaces_and_changes_nothing() -> None:
    decision = step(KV, current(enabled=False))
    assert decision.action is Action.SURFACE and decision.constraints is None
    assert "spec.remediation.enabled" in decision.message


def test_current_from_reads_pins_limits_and_the_containers_memory() -> None:
    spec = parse_spec({"model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
                       "flags": {"maxModelLen": 8192, "enforceEager": True},
                       "gpu": {"maxCount": 4}, "workload": {"contextLength": 4096},
                       "remediation": {"maxSteps": 3, "minIntervalSeconds": 0, "enabled": False}})
    cur = current_from(spec, {"plan": {"flags": FLAGS}, "gpu": {"memoryGiB": L4_GIB}}, host_memory_gib=26.0)
    assert cur.pinned == {"max_model_len", "enforce_eager"}
    assert (cur.max_gpus, cur.min_context, cur.max_steps, cur.min_interval_seconds, cur.enabled) == (4, 4096, 3, 0,
                                                                                                   False)
    assert cur.host_memory_gib == 26.0 and cur.gpu_total_gib == L4_GIB and not cur.memory_pinned
    assert current_from(parse_spec({"model": {"name": "m/m"}, "resources": {"memory": "64Gi"}}), {}).memory_pinned


# --- pinned flags are never changed (all classes × all pinned sets) ----------------------------------------------

PINNABLE = ("max_model_len", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens",
            "tensor_parallel_size", "enforce_eager", "kv_cache_dtype")
TOUCHES: dict[str, set[str]] = {  # the constraint fields that change a flag
    "max_model_len": {"max_model_len", "min_model_len"},
    "gpu_memory_utilization": {"min_utilization", "max_utilization", "gpu_free_gib"},
    "max_num_seqs": {"max_num_seqs"},
    "max_num_batched_tokens": {"max_num_batched_tokens"},
    "tensor_parallel_size": {"min_tensor_parallel_size"},
    "enforce_eager": {"force_enforce_eager"},
    "kv_cache_dtype": {"force_fp8_kv"},
}
FLAG_STATES: tuple[dict[str, Any], ...] = (
    FLAGS,
    {**FLAGS, "gpu_memory_utilization": 0.95, "enforce_eager": True, "max_num_batched_tokens": 512,
     "kv_cache_dtype": "fp8", "max_num_seqs": 1},
    {**FLAGS, "tensor_parallel_size": 4, "max_num_seqs": 2, "gpu_memory_utilization": 0.6},
)


def _subsets(names: Iterable[str]) -> Iterable[frozenset[str]]:
    names = list(names)
    return (frozenset(c) for r in range(len(names) + 1) for c in itertools.combinations(names, r))


def _forbidden(pinned: frozenset[str], memory_pinned: bool) -> set[str]:
    out = set().union(*(TOUCHES[name] for name in pinned)) if pinned else set()
    return out | ({"host_memory_gib"} if memory_pinned else set())


def _changed_fields(before: Constraints, after: Constraints) -> set[str]:
    return {name for name in Constraints.model_fields if getattr(before, name) != getattr(after, name)}


def test_no_decision_ever_changes_a_pinned_flag() -> None:
    checked = 0
    for failure, pinned, memory_pinned, flags in itertools.product(
            REPRESENTATIVE.values(), _subsets(PINNABLE), (False, True), FLAG_STATES):
        cur = current(flags=flags, pinned=pinned, memory_pinned=memory_pinned, host_memory_gib=26.0,
                      node_memory_gib=128.0, min_context=None)
        decision = decide(failure, KEY, cur, NOW)
        forbidden = _forbidden(pinned, memory_pinned)
        if decision.action is Action.STEP:
            assert decision.constraints is not None
            assert not set(decision.changed) & forbidden, (failure.kind, sorted(pinned), decision.changed)
            assert not _changed_fields(cur.constraints, decision.constraints) & forbidden
            checked += 1
        else:
            assert decision.constraints is None and decision.changed == {}
    assert checked > 1000  # the product really exercised steps


@pytest.mark.parametrize("kind", sorted(REPRESENTATIVE, key=str))
def test_walking_a_ladder_never_touches_a_pinned_flag_and_always_ends(kind: FailureKind) -> None:
    failure = REPRESENTATIVE[kind]
    for pinned in _subsets(PINNABLE):
        for memory_pinned in (False, True):
            cur = current(pinned=pinned, memory_pinned=memory_pinned, host_memory_gib=26.0, node_memory_gib=128.0,
                          max_steps=50)
            decisions, last = walk(failure, cur)
            forbidden = _forbidden(pinned, memory_pinned)
            assert not _changed_fields(Constraints(), last.constraints) & forbidden, (sorted(pinned), last)
            assert all(last.flags.get(name) == FLAGS.get(name) for name in pinned)
            assert decisions[-1].action in (Action.EXHAUSTED, Action.SURFACE)


def test_verdicts_for_pinned_flags_name_the_spec_field() -> None:
    cases: list[tuple[Failure, frozenset[str], str]] = [
        (KV, frozenset({"max_model_len", "gpu_memory_utilization"}), "spec.flags.maxModelLen"),
        (FREE, frozenset({"gpu_memory_utilization"}), "spec.flags.gpuMemoryUtilization"),
        (WEIGHTS, frozenset({"tensor_parallel_size"}), "spec.flags.tensorParallelSize"),
        (TOO_LONG, frozenset({"max_model_len"}), "spec.flags.maxModelLen"),
        (HEADS, frozenset({"tensor_parallel_size"}), "spec.flags.tensorParallelSize"),
    ]
    for failure, pinned, field in cases:
        verdict = step(failure, current(pinned=pinned))
        assert verdict.action is Action.EXHAUSTED, (failure.kind, verdict)
        assert field in verdict.message, (failure.kind, verdict.message)


# --- the profile in status; stepping up ---------------------------------------------------------------------------

PROFILES = [
    Constraints(),
    Constraints(max_model_len=19456),
    Constraints(gpu_free_gib=17.4, min_utilization=0.95, max_utilization=0.85),
    Constraints(force_enforce_eager=True, force_fp8_kv=True, max_num_batched_tokens=512, max_num_seqs=18,
                min_tensor_parallel_size=4, host_memory_gib=39.0, min_model_len=4096, extra_activation_gib=1.5),
]


@pytest.mark.parametrize("constraints", PROFILES)
def test_constraints_round_trip_through_the_status_profile(constraints: Constraints) -> None:
    profile = constraints_to_profile(constraints)
    assert all(value != Constraints.model_fields[name].default for name, value in profile.items())
    assert profile_constraints(profile) == constraints
    # as stored: status.remediation.profile through the API model and JSON
    stored = json.loads(json.dumps(RemediationStatus(profile=profile).model_dump(by_alias=True, mode="json")))
    back = profile_constraints(stored["profile"])
    assert back == constraints
    assert constraints_from_status({"remediation": stored}) == constraints


def test_an_empty_profile_is_no_constraint_and_unknown_keys_are_ignored() -> None:
    assert constraints_to_profile(Constraints()) == {}
    assert profile_constraints({}) == Constraints()
    assert profile_constraints({"max_model_len": 8192, "from_a_newer_operator": 1}) == Constraints(max_model_len=8192)


def test_step_up_is_opt_in_and_waits_for_the_stable_window() -> None:
    assert RemediationSpec().allow_step_up is False
    learned = Constraints(max_model_len=19456, min_utilization=0.95)
    cur = current(constraints=learned, step=2)
    order = ["max_model_len", "min_utilization"]
    window = 3600
    assert step_up(cur, order, NOW, None, window) is None                                   # not stable
    assert step_up(cur, order, NOW, NOW - timedelta(seconds=window - 1), window) is None     # not yet
    assert step_up(cur, [], NOW, NOW - timedelta(hours=5), window) is None                   # nothing learned
    relaxed = step_up(cur, order, NOW, NOW - timedelta(seconds=window), window)
    assert relaxed is not None
    constraints, why = relaxed
    assert constraints == Constraints(max_model_len=19456)  # only the newest constraint is dropped
    assert "min_utilization" in why and str(window) in why


def test_each_step_adds_exactly_one_constraint() -> None:
    for failure in REPRESENTATIVE.values():
        decisions, _ = walk(failure, current(max_steps=50, host_memory_gib=26.0, node_memory_gib=128.0))
        for d in decisions:
            if d.action is Action.STEP:
                assert len(d.changed) == 1, (failure.kind, d.changed)

