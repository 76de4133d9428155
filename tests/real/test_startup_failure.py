"""Scenario 2: a real startup failure, remediated. The tiny long model claims a 2,097,152-token context at 16 KiB of
KV cache a token; on an L4 the planner fits the longest context the predicted KV cache holds (an explicit length:
`--max-model-len auto` only keeps a full context), but the real process has 1 GiB of CPU KV cache
(VLLM_CPU_KVCACHE_SPACE=1: 65,536 tokens). vLLM refuses with its own text and exits; the operator classifies that
text (KVCacheTooSmall), takes one step down the ladder (max-model-len to what vLLM said fits), and the next real
process starts and is Ready. The simulator's wording of that refusal for the release (planner/messages.py), given
the real figures, is the real line, character for character."""

from __future__ import annotations

import re

import pytest
from realkit import LONG_CONTEXT, TINY_LONG, VLLM_VERSION, RealCluster, tiny_spec, until

from kit.specs import condition, vllmservice
from vllm_operator.planner.messages import kv_too_small_message
from vllm_operator.planner.versions import profile_for
from vllm_operator.remediation.classifier import FailureKind, classify_text

pytestmark = pytest.mark.timeout(900)
KV_TEXT = "is larger than the available KV cache memory"


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_a_real_kv_cache_refusal_is_classified_and_one_ladder_step_makes_the_service_ready(
        real: RealCluster, kv_space: dict[str, int]) -> None:
    kv_space["long"] = 1
    real.cluster.apply(vllmservice(tiny_spec(TINY_LONG), name="long"))
    try:
        first = until(lambda: real.pods("long"), 60, "the first pod")[0]
        planned = int(_flag(first["spec"]["containers"][0]["args"], "--max-model-len"))
        assert 65_536 < planned < LONG_CONTEXT  # fitted to an L4's KV cache: more than the CPU process holds
        obj = real.wait_ready("long", timeout=600)
        # the first real process said why it could not start, in vLLM's own words, and exited non-zero
        [pod] = real.ready_pods("long")
        first_runs = [r for r in real.runner.history if r.uid == first["metadata"]["uid"]]
        new_runs = [r for r in real.runner.history if r.uid == pod["metadata"]["uid"]]
        assert first_runs and len(new_runs) == 1, [r.key for r in real.runner.history]
        failed = first_runs[0].log_path.read_text(errors="replace")
        assert KV_TEXT in failed and f"max seq len ({planned})" in failed, failed[-3000:]
        assert first_runs[0].process.returncode not in (None, 0)
        # the simulator words it as the real process did (the figures are the real ones: GiB and tokens)
        [line] = {ln.strip() for ln in failed.splitlines() if ln.startswith("ValueError: To serve at least one")}
        figures = re.search(r"max seq len \((\d+)\), \(([\d.]+) GiB .*memory \(([\d.]+) GiB\)\..* length is "
                            r"(\d+)\.", line)
        assert figures is not None, line
        assert kv_too_small_message(profile_for(VLLM_VERSION), max_model_len=int(figures[1]),
                                    needed_gib=float(figures[2]), available_gib=float(figures[3]),
                                    estimated_max_len=int(figures[4]), kv_tokens=0) == line
        # the classifier reads that real text as the operator got it: a KV cache too small, with vLLM's estimate
        failure = classify_text(failed[-65536:], terminated_reason="Error",
                                exit_code=first_runs[0].process.returncode)
        assert failure.kind is FailureKind.KV_CACHE_TOO_SMALL, failure
        assert failure.max_model_len == planned and failure.estimated_max_model_len, failure
        # one step down the ladder: max-model-len to at most what vLLM said fits; nothing else changed
        remediation = obj["status"]["remediation"]
        [event] = remediation["history"]
        assert event["failureClass"] == "KVCacheTooSmall", event
        assert int(event["flagsBefore"]["maxModelLen"]) == planned, event
        after = int(event["flagsAfter"]["maxModelLen"])
        assert after <= failure.estimated_max_model_len, (event, failure)
        assert int(_flag(pod["spec"]["containers"][0]["args"], "--max-model-len")) == after
        assert new_runs[0].ready and new_runs[0].process.poll() is None
        assert condition(obj, "Ready")["status"] == "True"
    finally:
        real.delete("long")
