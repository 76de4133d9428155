"""status.kvCache: vLLM's own "KV cache size: N tokens" next to the plan's prediction (remediation/kvcache.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from vllm_operator.remediation.kvcache import MAX_TOKENS, fold_measured, measured_tokens, runs_plan

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
