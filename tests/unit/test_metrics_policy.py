"""metrics.policy: from observed vLLM metrics over a window to one bounded, recorded action (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from vllm_operator.api.v1alpha1 import parse_spec
from vllm_operator.metrics.policy import (
    KV_CACHE_SATURATED,
    SUSTAINED_PREEMPTION,
    UNDERUTILIZED,
    MetricsAction,
    MetricsDecision,
    Observation,
    Point,
    PolicySettings,
    decide,
    metrics_status,
)
from vllm_operator.planner import Constraints

END = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
SETTINGS = PolicySettings(window_seconds=600, step_seconds=30, preemption_rate_threshold=0.1, kv_full=0.95,
                          cooldown_seconds=900)
POINTS = 21  # 600 s / 30 s + 1: the whole window


def series(values: float | Sequence[float], n: int = POINTS, step: float = 30.0,
           end: datetime = END) -> tuple[Point, ...]:
    """Points ending at `end`, one per step; a scalar is repeated n times."""
    vals = [float(values)] * n if isinstance(values, int | float) else [float(v) for v in values]
    last = end.timestamp()
    return tuple(Point(time=last - (len(vals) - 1 - i) * step, value=v) for i, v in enumerate(vals))


def observation(kv: Any = 0.5, preempt: Any = 0.0, waiting: Any = 0, running: Any = 10, pods: Any = 1,
                tokens: float | None = None, **kwargs: Any) -> Observation:
    return Observation(end=END, window_seconds=600, step_seconds=30, kv_cache_usage=series(kv),
                       preemption_rate=series(preempt), waiting=series(waiting), running=series(running),
                       pods=series(pods), request_tokens=tokens, **kwargs)


def spec(**fields: Any) -> Any:
    base: dict[str, Any] = {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "prometheus": {"enabled": True}}
    base.update(fields)
    return parse_spec(base)


def status(max_num_seqs: int = 64, kv_tokens: int = 100_000, max_model_len: int = 32768,
           history: Sequence[Mapping[str, Any]] = (), profile: Mapping[str, Any] | None = None,
           step: int = 0) -> dict[str, Any]:
    return {"plan": {"fits": True, "flags": {"max_num_seqs": max_num_seqs, "max_model_len": max_model_len},
                     "kvCacheTokens": kv_tokens},
            "remediation": {"step": step, "profile": dict(profile or {}), "history": list(history)}}


def entry(ago_seconds: float, failure_class: str = SUSTAINED_PREEMPTION, **extra: Any) -> dict[str, Any]:
    when = (END - timedelta(seconds=ago_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"step": 1, "time": when, "failureClass": failure_class, **extra}


def run(obs: Observation, s: Any = None, st: Mapping[str, Any] | None = None, replicas: int | None = 1,
        settings: PolicySettings = SETTINGS) -> MetricsDecision:
    return decide(obs, spec=s or spec(), status=st if st is not None else status(), replicas=replicas, now=END,
                  settings=settings)


# --- status.metrics ------------------------------------------------------------------------------


def test_metrics_status_rounds_and_keeps_time_while_values_hold() -> None:
    obs = observation(kv=0.123456, preempt=0.04444, waiting=3, running=7)
    first = metrics_status(obs, None, END)
    assert first.kv_cache_usage == 0.123 and first.preemption_rate == 0.044 and first.waiting == 3
    assert first.running == 7 and first.time == "2025-06-01T12:00:00Z"
    later = END + timedelta(minutes=1)
    same = metrics_status(obs, first.to_dict(), later)
    assert same == first                                  # nothing changed: nothing to write
    moved = metrics_status(observation(kv=0.5, waiting=3, running=7, preempt=0.04444), first.to_dict(), later)
    assert moved.kv_cache_usage == 0.5 and moved.time == "2025-06-01T12:01:00Z"


def test_metrics_status_clamps_and_drops_stale_values() -> None:
    obs = Observation(end=END, window_seconds=600, step_seconds=30, kv_cache_usage=series(1.2),
                      waiting=series(1, end=END - timedelta(minutes=5)))
    status_ = metrics_status(obs, None, END)
    assert status_.kv_cache_usage == 1.0
    assert status_.waiting is None                        # the newest sample is 5 minutes old
    assert status_.running is None and status_.preemption_rate is None


# --- no action -------------------------------------------------------------------------------------


def test_healthy_service_needs_nothing() -> None:
    decision = run(observation(kv=0.7, preempt=0.0, waiting=0))
    assert decision.action is MetricsAction.NONE and not decision.acts
    assert "no sustained symptom" in decision.message


@pytest.mark.parametrize("preempt", [
    [0.5] * 20 + [0.05],                     # one point at the end below the threshold
    [0.05] + [0.5] * 20,                     # one point at the start below
])
def test_preemptions_must_last_the_whole_window(preempt: list[float]) -> None:
    assert run(observation(preempt=preempt)).action is MetricsAction.NONE


def test_a_window_not_covered_is_not_sustained() -> None:
    late = Observation(end=END, window_seconds=600, step_seconds=30, preemption_rate=series(0.5, n=10),
                       kv_cache_usage=series(0.99, n=10), waiting=series(3, n=10), running=series(10, n=10))
    assert run(late).action is MetricsAction.NONE         # only the last 5 minutes have samples
    gap = list(series(0.5))
    del gap[8:12]                                         # two minutes missing in the middle
    holey = Observation(end=END, window_seconds=600, step_seconds=30, preemption_rate=tuple(gap))
    assert run(holey).action is MetricsAction.NONE


# --- sustained preemptions → max_num_seqs ---------------------------------------------------------


def test_sustained_preemptions_lower_max_num_seqs_to_what_the_cache_holds() -> None:
    decision = run(observation(preempt=0.5, kv=0.8, tokens=2500))    # 100000 tokens / 2500 per request = 40
    assert decision.action is MetricsAction.LOWER_MAX_NUM_SEQS
    assert decision.failure_class == SUSTAINED_PREEMPTION
    assert decision.max_num_seqs == 40
    assert decision.constraints == Constraints(max_num_seqs=40)
    assert "max-num-seqs 64 → 40" in decision.message and "observed" in decision.message
    assert "preemptions/s" in decision.evidence


def test_lowering_is_at_most_halving() -> None:
    decision = run(observation(preempt=0.5, tokens=10_000))          # holds 10
    assert decision.max_num_seqs == 32 and "at most halved" in decision.message


def test_request_length_falls_back_to_the_workload_then_max_model_len() -> None:
    by_workload = run(observation(preempt=0.5), s=spec(workload={"contextLength": 2000}))
    assert by_workload.max_num_seqs == 50 and "spec.workload.contextLength" in by_workload.message
    by_length = run(observation(preempt=0.5), st=status(max_num_seqs=8, max_model_len=32768))
    assert by_length.max_num_seqs == 4                               # 100000/32768 = 3, bounded by halving


def test_sequences_running_while_the_cache_was_full_cap_the_estimate() -> None:
    decision = run(observation(preempt=0.5, kv=0.99, running=36, tokens=2500))
    assert decision.max_num_seqs == 36 and "36 sequences ran" in decision.message


def test_the_learned_profile_is_kept() -> None:
    st = status(profile={"gpu_free_gib": 17.4, "max_model_len": 16384}, step=1)
    decision = run(observation(preempt=0.5, tokens=2500), st=st)
    assert decision.constraints == Constraints(gpu_free_gib=17.4, max_model_len=16384, max_num_seqs=40)


def test_preemptions_the_cache_explains_not_lead_to_replicas() -> None:
    # 100000 / 1000 = 100 sequences fit: max-num-seqs 64 is not the problem → more replicas (here: a range).
    decision = run(observation(preempt=0.5, tokens=1000, running=10, waiting=10), s=spec(maxReplicas=3))
    assert decision.action is MetricsAction.SCALE_UP and decision.failure_class == SUSTAINED_PREEMPTION
    assert decision.replicas == 2 and "not fewer than max-num-seqs 64" in decision.message


@pytest.mark.parametrize(("fields", "st", "why"), [
    ({"flags": {"maxNumSeqs": 64}}, status(), "pinned"),
    ({"remediation": {"enabled": False}}, status(), "enabled is false"),
    ({"remediation": {"maxSteps": 2}}, status(step=2), "maxSteps=2"),
    ({}, status(max_num_seqs=1), "cannot go lower"),
    ({}, status(profile={"max_num_seqs": 30}), "already limited to 30"),
])
def test_when_max_num_seqs_cannot_move_replicas_are_recommended(fields: dict[str, Any], st: dict[str, Any],
                                                                 why: str) -> None:
    decision = run(observation(preempt=0.5, tokens=2500, running=10, waiting=5), s=spec(**fields), st=st)
    assert decision.action is MetricsAction.RECOMMEND_REPLICAS
    assert decision.replicas == 2 and why in decision.message
    assert "spec.maxReplicas" in decision.message


# --- a full KV cache with a queue → replicas ------------------------------------------------------


def test_full_cache_with_a_queue_scales_within_the_allowed_range() -> None:
    decision = run(observation(kv=0.97, waiting=10, running=10), s=spec(replicas=1, maxReplicas=4))
    assert decision.action is MetricsAction.SCALE_UP and decision.failure_class == KV_CACHE_SATURATED
    assert (decision.replicas_before, decision.replicas) == (1, 2)
    # Much more waits than runs: proportional, but at most doubling and never above maxReplicas.
    assert run(observation(kv=0.97, waiting=30, running=10), s=spec(replicas=2, maxReplicas=8),
               replicas=2).replicas == 4
    assert run(observation(kv=0.97, waiting=30, running=10), s=spec(replicas=2, maxReplicas=3),
               replicas=2).replicas == 3


def test_full_cache_without_a_range_is_a_recommendation_said_once() -> None:
    decision = run(observation(kv=0.97, waiting=10, running=10))
    assert decision.action is MetricsAction.RECOMMEND_REPLICAS and decision.replicas == 2
    assert "set spec.maxReplicas to 2" in decision.message
    at_ceiling = run(observation(kv=0.97, waiting=10, running=10), s=spec(replicas=1, maxReplicas=2), replicas=2)
    assert at_ceiling.action is MetricsAction.RECOMMEND_REPLICAS and "raise spec.maxReplicas above 2" in \
        at_ceiling.message
    said = entry(3600, KV_CACHE_SATURATED, flagsAfter={"replicas": 1, "recommendedReplicas": 2})
    again = run(observation(kv=0.97, waiting=10, running=10), st=status(history=[said]))
    assert again.action is MetricsAction.NONE and "already recommended" in again.message


def test_full_cache_without_a_queue_is_fine() -> None:
    assert run(observation(kv=0.99, waiting=[1] * 20 + [0])).action is MetricsAction.NONE
    assert run(observation(kv=[0.99] * 10 + [0.9] + [0.99] * 10, waiting=4)).action is MetricsAction.NONE


# --- bounds: cooldown, window after the last step, replicas range ---------------------------------


def test_cooldown_after_any_step() -> None:
    busy = observation(preempt=0.5, tokens=2500)
    cooling = run(busy, st=status(history=[entry(300, "InsufficientFreeGPUMemory")]))
    assert cooling.action is MetricsAction.NONE and "cooling down" in cooling.message
    after = run(busy, st=status(history=[entry(1000)]))
    assert after.action is MetricsAction.LOWER_MAX_NUM_SEQS


def test_the_window_must_start_after_the_last_step() -> None:
    quick = PolicySettings(window_seconds=600, step_seconds=30, cooldown_seconds=60)
    decision = run(observation(preempt=0.5, tokens=2500), st=status(history=[entry(300)]), settings=quick)
    assert decision.action is MetricsAction.NONE and "new pods" in decision.message


def test_min_interval_seconds_of_the_spec_is_respected() -> None:
    quick = PolicySettings(window_seconds=600, step_seconds=30, cooldown_seconds=60)
    decision = run(observation(preempt=0.5, tokens=2500), s=spec(remediation={"minIntervalSeconds": 3600}),
                   st=status(history=[entry(1800)]), settings=quick)
    assert decision.action is MetricsAction.NONE and "cooling down" in decision.message


def test_idle_added_replicas_are_removed_one_at_a_time() -> None:
    idle = observation(kv=0.2, waiting=0, running=2)
    decision = run(idle, s=spec(replicas=1, maxReplicas=3), replicas=3)
    assert decision.action is MetricsAction.SCALE_DOWN and decision.failure_class == UNDERUTILIZED
    assert (decision.replicas_before, decision.replicas) == (3, 2)
    assert run(idle, s=spec(replicas=1, maxReplicas=3), replicas=1).action is MetricsAction.NONE
    assert run(observation(kv=0.2, waiting=[0] * 20 + [1]), s=spec(replicas=1, maxReplicas=3),
               replicas=3).action is MetricsAction.NONE
    no_down = PolicySettings(window_seconds=600, step_seconds=30, scale_down=False)
    assert run(idle, s=spec(replicas=1, maxReplicas=3), replicas=3, settings=no_down).action is MetricsAction.NONE


def test_replicas_above_the_allowed_range_are_brought_back_at_once() -> None:
    st = status(history=[entry(60, KV_CACHE_SATURATED)])                   # even while cooling down
    lowered = run(observation(kv=0.99, waiting=5), s=spec(replicas=1, maxReplicas=2), st=st, replicas=4)
    assert lowered.action is MetricsAction.SCALE_DOWN and lowered.replicas == 2
    unset = run(observation(), s=spec(replicas=2), st=st, replicas=3)
    assert unset.action is MetricsAction.SCALE_DOWN and unset.replicas == 2 and "no spec.maxReplicas" in \
        unset.message


def test_no_deployment_nothing_to_scale() -> None:
    decision = run(observation(kv=0.97, waiting=10, running=10), s=spec(maxReplicas=3), replicas=None)
    assert decision.action is MetricsAction.RECOMMEND_REPLICAS


# --- idempotence and settings ---------------------------------------------------------------------


def test_same_input_same_decision_and_a_recorded_step_holds_the_next_back() -> None:
    busy = observation(preempt=0.5, tokens=2500)
    first, second = run(busy), run(busy)
    assert first == second and first.action is MetricsAction.LOWER_MAX_NUM_SEQS
    recorded = status(max_num_seqs=40, profile={"max_num_seqs": 40}, step=1, history=[entry(0)])
    assert run(busy, st=recorded).action is MetricsAction.NONE


def test_settings_from_a_mapping() -> None:
    s = PolicySettings.from_mapping({"windowSeconds": "120", "step_seconds": 5, "cooldownSeconds": 30,
                                     "scaleDown": False, "unknown": 1, "kv_full": None})
    assert (s.window_seconds, s.step_seconds, s.cooldown_seconds, s.scale_down, s.kv_full) == (120, 5, 30, False,
                                                                                              0.95)
    assert PolicySettings.from_mapping(None) == PolicySettings()


def test_a_full_cache_that_also_preempts_waits_for_the_preemption_verdict() -> None:
    young = Observation(end=END, window_seconds=600, step_seconds=30, kv_cache_usage=series(0.99),
                        waiting=series(5), running=series(10), preemption_rate=series(0.5, n=10))
    decision = run(young, s=spec(maxReplicas=3))
    assert decision.action is MetricsAction.NONE and "max-num-seqs is the cause" in decision.message
    # Preemptions that come and go over a covered window do not hold scaling back.
    spiky = observation(kv=0.99, waiting=5, running=10, preempt=[0.5, 0.0] * 10 + [0.5])
    assert run(spiky, s=spec(maxReplicas=3)).action is MetricsAction.SCALE_UP
