"""From vLLM's metrics over a window to one bounded, recorded action — pure: no Prometheus, no Kubernetes, no clock.

`decide(observation, spec=..., status=..., replicas=..., now=..., settings=...)` looks at what Prometheus showed for
one VLLMService over the last `settings.window_seconds` (see `metrics.observe`) and returns a `MetricsDecision`:

* **Sustained preemptions** — the summed preemption rate of the service's pods stays above
  `preemption_rate_threshold` at every point of the window: vLLM admits more sequences than its KV cache holds and
  keeps evicting them. Lower `max_num_seqs` to what the cache really holds —
  `status.plan.kvCacheTokens / typical request length`, the length observed (prompt + generation tokens of the
  requests finished in the window) or else `spec.workload.contextLength` or else `max_model_len`; when the cache was
  full, the sequences observed running cap it too — at most halving per step. This is a `Constraints` change
  (`max_num_seqs`), applied like a remediation step: it counts against `spec.remediation.maxSteps`, needs
  `spec.remediation.enabled`, and never touches a pinned `spec.flags.maxNumSeqs`.
* **A full KV cache with a queue** — usage ≥ `kv_full` and requests waiting at every point of the window: the
  replicas are at capacity. Add replicas: scale the Deployment (never the VLLMService's spec) when the user allowed
  a range (`spec.maxReplicas` above the current count), else recommend a count, once per count. Sustained
  preemptions that `max_num_seqs` can no longer answer (pinned, at the floor, steps exhausted) take this path too.
  While the pods also preempt but the preemption rate's samples do not cover the window yet, wait: whether
  max-num-seqs is the cause is decided first.
* **Idle extra replicas** — replicas the operator added earlier (the Deployment runs more than `spec.replicas`), while
  over the window nothing waited and the fullest replica's cache stayed below `scale_down_kv`: remove one. Replicas
  above `spec.maxReplicas` (the user lowered it; `spec.replicas` when it is unset) are removed at once.

Bounds: one action per `cooldown_seconds` (and never sooner than `spec.remediation.minIntervalSeconds`) after the
latest entry of `status.remediation.history` — any step rolls pods out, so older samples say nothing about the new
ones; the window must lie wholly after that entry; `max_num_seqs` at most halves per step and never goes below
`min_max_num_seqs`; replicas stay within `spec.replicas`..`spec.maxReplicas`. Idempotent: the same observation and
status give the same decision, and once acted on, the recorded history entry holds further actions back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from ..api.times import format_time, parse_time
from ..api.v1alpha1 import MetricsStatus, VLLMServiceSpec, flags_from_api
from ..planner import Constraints

__all__ = [
    "FAILURE_CLASSES",
    "KV_CACHE_SATURATED",
    "SUSTAINED_PREEMPTION",
    "UNDERUTILIZED",
    "MetricsAction",
    "MetricsDecision",
    "Observation",
    "Point",
    "PolicySettings",
    "decide",
    "metrics_status",
]

#: `failureClass` of the history entries this policy records.
SUSTAINED_PREEMPTION = "SustainedPreemption"
KV_CACHE_SATURATED = "KVCacheSaturated"
UNDERUTILIZED = "Underutilized"
FAILURE_CLASSES = (SUSTAINED_PREEMPTION, KV_CACHE_SATURATED, UNDERUTILIZED)


@dataclass(frozen=True)
class Point:
    """One sample of a range query: unix time in seconds, value."""

    time: float
    value: float


@dataclass(frozen=True)
class Observation:
    """What Prometheus showed for one service over `[end - window_seconds, end]`, one point per `step_seconds`.

    Each series is aggregated over the service's pods: KV-cache usage is the fullest pod's (max), preemption rate,
    waiting and running are summed. Series are oldest first; a point is missing where Prometheus had no sample.
    """

    end: datetime
    window_seconds: float
    step_seconds: float
    kv_cache_usage: tuple[Point, ...] = ()
    preemption_rate: tuple[Point, ...] = ()
    waiting: tuple[Point, ...] = ()
    running: tuple[Point, ...] = ()
    pods: tuple[Point, ...] = ()
    request_tokens: float | None = None          # mean prompt + generation tokens per request finished in the window
    selector: str = ""

    @property
    def empty(self) -> bool:
        return not (self.kv_cache_usage or self.preemption_rate or self.waiting or self.running)

    def latest(self, series: Sequence[Point]) -> float | None:
        """The newest value when it is fresh (within two steps of `end`), else None."""
        if not series:
            return None
        last = series[-1]
        if last.time < self.end.timestamp() - 2 * self.step_seconds - 1:
            return None
        return last.value

    @property
    def pod_count(self) -> int:
        value = self.latest(self.pods)
        return int(value) if value is not None else 0


@dataclass(frozen=True)
class PolicySettings:
    """Operator-wide thresholds and bounds (see `metrics_watch.policy_settings` for where they are read)."""

    window_seconds: float = 600.0                # a symptom must hold this long
    step_seconds: float = 30.0                   # resolution of the window
    preemption_rate_threshold: float = 0.1       # preemptions per second, summed over the service's pods
    kv_full: float = 0.95                        # KV-cache usage counted as full
    scale_down_kv: float = 0.5                   # below this (and no queue) an added replica is idle
    cooldown_seconds: float = 900.0              # least time between two metric-driven actions
    min_max_num_seqs: int = 1                    # never lower max_num_seqs below this
    scale_down: bool = True                      # remove replicas the operator added once they idle

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> PolicySettings:
        """Settings from a mapping with snake_case or camelCase keys; unknown keys are ignored."""
        known = {f: f for f in cls.__dataclass_fields__}
        known.update({_camel(f): f for f in cls.__dataclass_fields__})
        out: dict[str, Any] = {}
        for key, value in (values or {}).items():
            name = known.get(str(key))
            if name is not None and value is not None:
                default = getattr(cls, name)
                out[name] = type(default)(value) if not isinstance(default, bool) else bool(value)
        return cls(**out)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class MetricsAction(StrEnum):
    NONE = "none"
    LOWER_MAX_NUM_SEQS = "lowerMaxNumSeqs"
    SCALE_UP = "scaleUp"
    SCALE_DOWN = "scaleDown"
    RECOMMEND_REPLICAS = "recommendReplicas"


@dataclass(frozen=True)
class MetricsDecision:
    action: MetricsAction
    message: str
    failure_class: str | None = None
    constraints: Constraints | None = None       # LOWER_MAX_NUM_SEQS: the new remediation profile's constraints
    max_num_seqs: int | None = None              # LOWER_MAX_NUM_SEQS: the new limit
    replicas: int | None = None                  # SCALE_*: the Deployment's new count; RECOMMEND: the count advised
    replicas_before: int | None = None
    evidence: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def acts(self) -> bool:
        return self.action is not MetricsAction.NONE


# --------------------------------------------------------------------------------------------------
# status.metrics
# --------------------------------------------------------------------------------------------------


def metrics_status(observation: Observation, previous: Mapping[str, Any] | None, now: datetime) -> MetricsStatus:
    """status.metrics from the newest samples, rounded so that noise does not rewrite status; `time` moves only
    when a value changed (it says when these values were first seen)."""
    kv = observation.latest(observation.kv_cache_usage)
    rate = observation.latest(observation.preemption_rate)
    waiting = observation.latest(observation.waiting)
    running = observation.latest(observation.running)
    values = {
        "kv_cache_usage": None if kv is None else round(min(max(kv, 0.0), 1.0), 3),
        "preemption_rate": None if rate is None else round(max(rate, 0.0), 3),
        "waiting": None if waiting is None else round(max(waiting, 0.0), 2),
        "running": None if running is None else round(max(running, 0.0), 2),
    }
    old = MetricsStatus.model_validate(dict(previous or {}))
    unchanged = all(_same(getattr(old, name), value) for name, value in values.items())
    time = old.time if unchanged and old.time else format_time(now)
    return MetricsStatus(**values, time=time, desired_replicas=old.desired_replicas,
                         recommendation=old.recommendation)


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=0, abs_tol=1e-9)


# --------------------------------------------------------------------------------------------------
# Symptoms over the window
# --------------------------------------------------------------------------------------------------


def _covers(series: Sequence[Point], start: float, end: float, step: float) -> bool:
    """Samples from the window's start to its end, with no gap longer than two steps."""
    if not series:
        return False
    slack = step + 1.0
    if series[0].time > start + slack or series[-1].time < end - 2 * step - 1.0:
        return False
    return all(b.time - a.time <= 2 * step + 1.0 for a, b in zip(series, series[1:], strict=False))


def _in_window(series: Iterable[Point], start: float) -> list[Point]:
    return [p for p in series if p.time >= start - 0.5]


def _by_time(series: Iterable[Point]) -> dict[float, float]:
    return {round(p.time, 3): p.value for p in series}


@dataclass(frozen=True)
class _Window:
    start: float
    end: float
    step: float


def _sustained_preemption(obs: Observation, w: _Window, threshold: float) -> bool:
    series = _in_window(obs.preemption_rate, w.start)
    return _covers(series, w.start, w.end, w.step) and all(p.value > threshold for p in series)


def _preemption_pending(obs: Observation, w: _Window, threshold: float) -> bool:
    """Preempting now, but too few samples yet to call it sustained (a young rate() starts later than gauges)."""
    series = _in_window(obs.preemption_rate, w.start)
    return bool(series) and series[-1].value > threshold and not _covers(series, w.start, w.end, w.step)


def _saturated(obs: Observation, w: _Window, kv_full: float) -> bool:
    kv = _in_window(obs.kv_cache_usage, w.start)
    waiting = _by_time(_in_window(obs.waiting, w.start))
    if not _covers(kv, w.start, w.end, w.step):
        return False
    for point in kv:
        queued = waiting.get(round(point.time, 3))
        if point.value < kv_full or not queued or queued <= 0:
            return False
    return True


def _idle(obs: Observation, w: _Window, kv_idle: float, threshold: float) -> bool:
    kv = _in_window(obs.kv_cache_usage, w.start)
    waiting = _in_window(obs.waiting, w.start)
    if not (_covers(kv, w.start, w.end, w.step) and _covers(waiting, w.start, w.end, w.step)):
        return False
    preempting = any(p.value > threshold for p in _in_window(obs.preemption_rate, w.start))
    return not preempting and all(p.value < kv_idle for p in kv) and all(p.value <= 0 for p in waiting)


def _mean(series: Sequence[Point]) -> float | None:
    return sum(p.value for p in series) / len(series) if series else None


def _summary(obs: Observation, w: _Window) -> str:
    parts = []
    kv = _in_window(obs.kv_cache_usage, w.start)
    if kv:
        parts.append(f"KV cache {min(p.value for p in kv):.0%}–{max(p.value for p in kv):.0%} full")
    rate = _in_window(obs.preemption_rate, w.start)
    if rate:
        parts.append(f"{min(p.value for p in rate):.2g}–{max(p.value for p in rate):.2g} preemptions/s")
    waiting = _in_window(obs.waiting, w.start)
    if waiting:
        parts.append(f"{min(p.value for p in waiting):g}–{max(p.value for p in waiting):g} waiting")
    running = _in_window(obs.running, w.start)
    if running:
        parts.append(f"{min(p.value for p in running):g}–{max(p.value for p in running):g} running")
    if obs.request_tokens:
        parts.append(f"{obs.request_tokens:.0f} tokens per request")
    return f"over {w.end - w.start:.0f}s: " + ", ".join(parts) if parts else "no samples"


# --------------------------------------------------------------------------------------------------
# The decision
# --------------------------------------------------------------------------------------------------


def _last_action(status: Mapping[str, Any]) -> datetime | None:
    history = (status.get("remediation") or {}).get("history") or []
    times = [t for t in (parse_time(h.get("time")) for h in history if isinstance(h, Mapping)) if t]
    return max(times) if times else None


def _none(message: str, notes: Sequence[str] = ()) -> MetricsDecision:
    return MetricsDecision(action=MetricsAction.NONE, message=message, notes=tuple(notes))


def decide(observation: Observation, *, spec: VLLMServiceSpec, status: Mapping[str, Any], replicas: int | None,
           now: datetime, settings: PolicySettings | None = None) -> MetricsDecision:
    """The action for one service: see the module docstring. `replicas` is the Deployment's current count
    (None when there is no Deployment: nothing to scale)."""
    s = settings or PolicySettings()
    current = replicas if replicas is not None else spec.replicas
    notes: list[str] = []
    if spec.autoscaling is not None:  # an autoscaler owns the pod count: recommend only, never scale (issue 14)
        spec = spec.model_copy(update={"max_replicas": None, "replicas": max(current, spec.replicas)})

    allowed = max(spec.max_replicas or spec.replicas, spec.replicas)
    if replicas is not None and replicas > allowed:
        bound = (f"spec.maxReplicas {spec.max_replicas}" if spec.max_replicas is not None
                 else f"spec.replicas {spec.replicas} (no spec.maxReplicas)")
        return MetricsDecision(action=MetricsAction.SCALE_DOWN, failure_class=UNDERUTILIZED, replicas=allowed,
                               replicas_before=replicas, message=f"replicas {replicas} → {allowed}: above {bound}")

    end = observation.end.timestamp()
    start = end - s.window_seconds
    last = _last_action(status)
    cooldown = max(s.cooldown_seconds, float(spec.remediation.min_interval_seconds))
    if last is not None:
        if now < last + timedelta(seconds=cooldown):
            return _none(f"cooling down: the last step was at {format_time(last)}; next action allowed after "
                         f"{format_time(last + timedelta(seconds=cooldown))}")
        if last.timestamp() > start:
            return _none("the window starts before the last step: waiting for samples of the new pods")
    window = _Window(start=start, end=end, step=observation.step_seconds)
    evidence = _summary(observation, window)

    if _sustained_preemption(observation, window, s.preemption_rate_threshold):
        lowered = _lower_max_num_seqs(observation, window, spec, status, s, evidence, notes)
        if lowered is not None:
            return lowered
        return _more_replicas(SUSTAINED_PREEMPTION, "sustained preemptions", spec, status, replicas, current,
                              observation, window, evidence, notes)
    if _saturated(observation, window, s.kv_full):
        if _preemption_pending(observation, window, s.preemption_rate_threshold):
            return _none(f"KV cache full with a queue and preempting, but the preemption rate does not cover the "
                         f"window yet: waiting to tell whether max-num-seqs is the cause ({evidence})", notes)
        return _more_replicas(KV_CACHE_SATURATED, f"KV cache ≥ {s.kv_full:.0%} full with requests waiting", spec,
                              status, replicas, current, observation, window, evidence, notes)
    if (s.scale_down and replicas is not None and replicas > spec.replicas
            and _idle(observation, window, s.scale_down_kv, s.preemption_rate_threshold)):
        target = replicas - 1
        return MetricsDecision(action=MetricsAction.SCALE_DOWN, failure_class=UNDERUTILIZED, replicas=target,
                               replicas_before=replicas, evidence=evidence,
                               message=f"replicas {replicas} → {target}: no queue and KV cache below "
                                       f"{s.scale_down_kv:.0%} ({evidence})")
    return _none(f"no sustained symptom ({evidence})", notes)


def _lower_max_num_seqs(obs: Observation, w: _Window, spec: VLLMServiceSpec, status: Mapping[str, Any],
                        s: PolicySettings, evidence: str, notes: list[str]) -> MetricsDecision | None:
    plan = status.get("plan") or {}
    flags = flags_from_api(plan.get("flags")) or {}
    remediation = status.get("remediation") or {}
    current = flags.get("max_num_seqs")
    if spec.flags.max_num_seqs is not None:
        notes.append(f"spec.flags.maxNumSeqs is pinned at {spec.flags.max_num_seqs}")
        return None
    if not spec.remediation.enabled:
        notes.append("spec.remediation.enabled is false: flags are not changed")
        return None
    step = int(remediation.get("step") or 0)
    if step >= spec.remediation.max_steps:
        notes.append(f"{step} remediation steps taken (spec.remediation.maxSteps={spec.remediation.max_steps})")
        return None
    if not isinstance(current, int) or isinstance(current, bool) or current <= s.min_max_num_seqs:
        notes.append(f"max-num-seqs is {current}: it cannot go lower")
        return None
    kv_tokens = plan.get("kvCacheTokens")
    typical, source = _typical_length(obs, spec, flags)
    estimates: list[tuple[int, str]] = []
    if isinstance(kv_tokens, int | float) and kv_tokens > 0 and typical:
        estimates.append((int(kv_tokens // typical),
                          f"{int(kv_tokens)} KV tokens / {typical:.0f} tokens per request ({source})"))
    full_running = _running_when_full(obs, w, s.kv_full)
    if full_running is not None:
        estimates.append((int(full_running), f"{full_running:.0f} sequences ran while the KV cache was full"))
    if not estimates:
        notes.append("no KV-cache size or request length to size max-num-seqs from")
        return None
    holds, why = min(estimates)
    floor = max(current // 2, s.min_max_num_seqs, 1)
    target = max(holds, floor)
    if target >= current:
        notes.append(f"the cache holds {holds} sequences ({why}), not fewer than max-num-seqs {current}")
        return None
    base = _constraints(flags_from_api(remediation.get("profile")) or {})
    if base.max_num_seqs is not None and base.max_num_seqs <= target:
        notes.append(f"max_num_seqs is already limited to {base.max_num_seqs}")
        return None
    bounded = " (at most halved per step)" if target > holds else ""
    return MetricsDecision(
        action=MetricsAction.LOWER_MAX_NUM_SEQS, failure_class=SUSTAINED_PREEMPTION,
        constraints=base.model_copy(update={"max_num_seqs": target}), max_num_seqs=target, evidence=evidence,
        message=f"sustained preemptions ({evidence}): the KV cache holds about {holds} sequences ({why}); "
                f"max-num-seqs {current} → {target}{bounded}",
        notes=tuple(notes))


def _typical_length(obs: Observation, spec: VLLMServiceSpec, flags: Mapping[str, Any]) -> tuple[float | None, str]:
    if obs.request_tokens and obs.request_tokens > 0:
        return obs.request_tokens, "observed"
    if spec.workload.context_length:
        return float(spec.workload.context_length), "spec.workload.contextLength"
    length = flags.get("max_model_len")
    if isinstance(length, int | float) and length > 0:
        return float(length), "max-model-len"
    return None, ""


def _running_when_full(obs: Observation, w: _Window, kv_full: float) -> float | None:
    kv = _by_time(_in_window(obs.kv_cache_usage, w.start))
    running = [p for p in _in_window(obs.running, w.start) if kv.get(round(p.time, 3), 0.0) >= kv_full]
    mean = _mean(running)
    return math.floor(mean) if mean is not None and mean >= 1 else None


def _constraints(profile: Mapping[str, Any]) -> Constraints:
    return Constraints(**{k: v for k, v in profile.items() if k in Constraints.model_fields})


def _more_replicas(failure_class: str, symptom: str, spec: VLLMServiceSpec, status: Mapping[str, Any],
                   replicas: int | None, current: int, obs: Observation, w: _Window, evidence: str,
                   notes: list[str]) -> MetricsDecision:
    needed = _replicas_needed(obs, w, current)
    why = f"{symptom} ({evidence})" + (f"; {'; '.join(notes)}" if notes else "")
    ceiling = spec.max_replicas
    if replicas is not None and ceiling is not None and current < ceiling:
        target = min(ceiling, needed)
        return MetricsDecision(action=MetricsAction.SCALE_UP, failure_class=failure_class, replicas=target,
                               replicas_before=current, evidence=evidence, notes=tuple(notes),
                               message=f"{why}: replicas {current} → {target} (spec.maxReplicas {ceiling})")
    if _already_recommended(status, failure_class, needed):
        return _none(f"{why}: {needed} replicas were already recommended", notes)
    if spec.autoscaling is not None:
        advice = (f"about {needed} replicas would serve this load; the {spec.autoscaling.engine} autoscaler decides "
                  f"(spec.autoscaling.maxReplicas {spec.autoscaling.max_replicas})")
    elif ceiling is not None and current >= ceiling:
        advice = f"raise spec.maxReplicas above {ceiling} (about {needed} replicas would serve this load)"
    else:
        advice = (f"about {needed} replicas would serve this load: set spec.maxReplicas to {needed} to let the "
                  f"operator scale, or spec.replicas")
    return MetricsDecision(action=MetricsAction.RECOMMEND_REPLICAS, failure_class=failure_class, replicas=needed,
                           replicas_before=current, evidence=evidence, notes=tuple(notes),
                           message=f"{why}: {advice}")


def _already_recommended(status: Mapping[str, Any], failure_class: str, needed: int) -> bool:
    """The latest history entry already advised this count for this symptom: say it once, not every cooldown."""
    history = (status.get("remediation") or {}).get("history") or []
    last = history[-1] if history and isinstance(history[-1], Mapping) else {}
    after = flags_from_api(last.get("flagsAfter")) or {}
    return bool(last.get("failureClass") == failure_class and after.get("recommended_replicas") == needed)


def _replicas_needed(obs: Observation, w: _Window, current: int) -> int:
    """Enough replicas for what ran plus what waited (averaged over the window), between +1 and ×2."""
    running = _mean(_in_window(obs.running, w.start))
    waiting = _mean(_in_window(obs.waiting, w.start))
    base = max(current, 1)
    wanted = base + 1
    if running and running > 0 and waiting is not None:
        wanted = math.ceil(base * (running + waiting) / running)
    return max(base + 1, min(wanted, base * 2))
