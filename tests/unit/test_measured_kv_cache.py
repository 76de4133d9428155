"""status.kvCache: vLLM's own "KV cache size: N tokens" next to the plan's prediction (remediation/kvcache.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from vllm_operator.remediation.kvcache import (
    MAX_TOKENS,
    auto_fit_length,
    context_reduced,
    fold_measured,
    measured_tokens,
    runs_plan,
)

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
PLAN_ARGS = ["--tensor-parallel-size", "1", "--max-model-len", "16384"]
POD_ARGS = ["Qwen/Qwen2.5-7B-Instruct", "--host", "0.0.0.0", "--port", "8000", *PLAN_ARGS]
STATUS = {"plan": {"args": PLAN_ARGS, "kvCacheTokens": 20000}}


@pytest.mark.parametrize(("log", "tokens"), [
    ("INFO 01-02 [kv_cache_utils.py:1087] GPU KV cache size: 17,712 tokens\n", 17712),
    ("(EngineCore_DP0 pid=1) INFO [kv_cache_utils.py:1290] GPU KV cache size: 669,712 tokens, Maximum concurrency "
     "for 32,768 tokens per request: 20.44x\n", 669712),
    ("INFO CPU KV cache size: 4096 tokens, Maximum concurrency for 512 tokens per request: 8.00x", 4096),
    # a restarted engine in the same log (the tail holds both): the newest start counts
    ("GPU KV cache size: 1,000 tokens\n...\nGPU KV cache size: 2,000 tokens\n", 2000),
    ("no such line", None),
    (f"GPU KV cache size: {MAX_TOKENS + 1} tokens", None),
])
def test_the_measured_tokens_are_read_from_vllms_line(log: str, tokens: int | None) -> None:
    assert measured_tokens(log) == tokens


def test_the_measurement_sits_next_to_the_prediction_with_the_difference() -> None:
    folded = fold_measured(STATUS, pod="qwen-bcdf-ghjkl", template="abc", pod_args=POD_ARGS, tokens=17712, now=NOW)
    assert folded is not None
    assert (folded.measured_tokens, folded.predicted_tokens, folded.difference_tokens) == (17712, 20000, -2288)
    assert folded.difference_percent == -11.4 and folded.pod == "qwen-bcdf-ghjkl" and folded.template == "abc"
    assert folded.time == "2025-01-02T03:04:05Z"
    recorded = {**STATUS, "kvCache": folded.model_dump(by_alias=True)}
    # the same measurement again: nothing to write
    assert fold_measured(recorded, pod="qwen-bcdf-mnpqr", template="abc", pod_args=POD_ARGS, tokens=17712,
                         now=NOW) is None


def test_a_pod_of_an_older_profile_never_stands_for_the_current_one() -> None:
    older = [*POD_ARGS[:-1], "32768"]
    assert not runs_plan(older, PLAN_ARGS)
    assert fold_measured(STATUS, pod="qwen-old", template="old", pod_args=older, tokens=40000, now=NOW) is None
    assert fold_measured({"plan": {"kvCacheTokens": 5}}, pod="p", template="t", pod_args=POD_ARGS, tokens=1,
                         now=NOW) is None  # no recorded args: nothing to compare with
    leader = [*POD_ARGS, "--distributed-executor-backend", "mp", "--nnodes", "$(LWS_GROUP_SIZE)"]
    assert runs_plan(leader, PLAN_ARGS)


@pytest.mark.parametrize(("log", "found"), [
    ("(EngineCore pid=7) INFO [kv_cache_utils.py:2478] Auto-fit max_model_len: reduced from 131072 to 98304 to fit "
     "in available KV cache memory (12.5 GiB GPU)\n", (98304, 131072)),
    ("INFO Auto-fit max_model_len: reduced from 32768 to 17488 to fit in available GPU memory (2.1 GiB available "
     "for KV cache)", (17488, 32768)),
    ("INFO Auto-fit max_model_len: full model context length 32768 fits in available GPU memory", (32768, 32768)),
    ("Auto-fit max_model_len: reduced from 99999999999999 to 1 to fit", None),  # beyond any context: ignored
    ("GPU KV cache size: 1,000 tokens", None),
])
def test_the_context_vllms_auto_fit_chose_is_read_from_its_line(log: str, found: tuple[int, int] | None) -> None:
    assert auto_fit_length(log) == found


def test_a_context_auto_fitted_below_the_plan_is_recorded_and_warned() -> None:
    status = {"plan": {"args": PLAN_ARGS, "kvCacheTokens": 20000, "flags": {"maxModelLen": 16384}}}
    folded = fold_measured(status, pod="qwen-bcdf-ghjkl", template="abc", pod_args=POD_ARGS, tokens=12000, now=NOW,
                           auto_fit=(12000, 16384))
    assert folded is not None and (folded.max_model_len, folded.planned_max_model_len) == (12000, 16384)
    warning = context_reduced(folded)
    assert warning is not None and "12,000 tokens where the plan expected 16,384" in warning
    assert "spec.flags.maxModelLen" in warning
    # the full context kept: recorded, nothing to warn about; an explicit length: no auto-fit fields at all
    kept = fold_measured(status, pod="p", template="abc", pod_args=POD_ARGS, tokens=20500, now=NOW,
                         auto_fit=(16384, 16384))
    assert kept is not None and kept.max_model_len == 16384 and context_reduced(kept) is None
    explicit = fold_measured(status, pod="p", template="abc", pod_args=POD_ARGS, tokens=20500, now=NOW)
    assert explicit is not None and explicit.max_model_len is None and context_reduced(explicit) is None
