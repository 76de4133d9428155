"""Watch each VLLMService's vLLM metrics in Prometheus and act on sustained trouble (observe → decide → apply).

For every VLLMService with ``spec.prometheus.enabled`` a kopf daemon on the operator's registry wakes up every
``config.CONFIG.metrics_interval_seconds`` (read at every wake-up, so it can be changed at run time) and, when the
operator has a Prometheus URL (``vllm-operator run --prometheus-url``):

1. reads the service's metrics over the policy window (`metrics.observe`: ≤ 5 s for all queries, no retries);
2. writes ``status.metrics`` (KV-cache usage, preemption rate, waiting, running) when a value changed, and the
   condition ``MetricsAvailable`` (True ``MetricsObserved``; False ``PrometheusUnreachable`` or ``NoMetricsFound``);
3. decides (`metrics.policy.decide`, pure) and applies at most one bounded action, recorded in
   ``status.remediation.history`` and as an Event: lower ``max_num_seqs`` (a remediation step: the constraint goes
   into ``status.remediation.profile``, the plan is recomputed and the Deployment rolled), scale the Deployment's
   replicas within ``spec.replicas``..``spec.maxReplicas`` (the VLLMService's spec is never written), or recommend
   a replica count.

Without a Prometheus URL nothing is read or written. When ``spec.prometheus.enabled`` is turned off the daemon
stops, replicas it added go back to ``spec.replicas``, and ``MetricsAvailable`` turns Unknown (``MetricsDisabled``).
Status writes start from a fresh read and carry its ``resourceVersion``; on a conflict they are rebuilt, so they
never undo another writer's change.

It is a daemon rather than a ``@kopf.timer`` because a timer's interval is fixed when the module is imported (before
``vllm-operator run`` has read its flags) and kopf reports every timer run as an INFO Event on the object. The
daemon's loop is a timer in all but name: one asyncio task per enabled service, the work runs in a thread, and
every exception is caught and logged — a missing, slow or broken Prometheus never blocks or fails a reconcile.

Operator-wide settings (`config.CONFIG`): ``prometheus_url``, ``metrics_interval_seconds``; and, until they get
their own fields/flags, in ``config.CONFIG.extra``: ``prometheus_selector`` (the label-matcher template, see
`metrics.observe`; also env ``VLLM_OPERATOR_PROMETHEUS_SELECTOR``), ``prometheus_rate_window`` (``5m``),
``prometheus_timeout_seconds`` (5, at most 5) and ``metrics_policy`` (a mapping of `PolicySettings` fields).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import kopf

from .. import metrics
from ..api import conditions as cond
from ..api import switch
from ..api.v1alpha1 import (
    MetricsStatus,
    RemediationEvent,
    RemediationStatus,
    SpecValidationError,
    VLLMServiceSpec,
    VLLMServiceStatus,
    parse_spec,
)
from ..metrics.observe import DEFAULT_TIMEOUT_SECONDS, PrometheusReader, PrometheusUnavailable
from ..metrics.policy import (
    MetricsAction,
    MetricsDecision,
    Observation,
    PolicySettings,
    decide,
    metrics_status,
)
from ..remediation.ladder import ProfileChange
from ..render.pods import ServingPods, serving_now
from . import config, effects, kube
from .remediation import change_profile

log = logging.getLogger("vllm_operator.metrics")


#: Event reasons of the actions.
MAX_NUM_SEQS_LOWERED: Final = "MaxNumSeqsLowered"
SCALED_UP: Final = "ScaledUp"
SCALED_DOWN: Final = "ScaledDown"
REPLICAS_RECOMMENDED: Final = "MoreReplicasRecommended"
EVENT_REASONS: Final = (MAX_NUM_SEQS_LOWERED, SCALED_UP, SCALED_DOWN, REPLICAS_RECOMMENDED)

MIN_INTERVAL_SECONDS = 1.0
MAX_TIMEOUT_SECONDS = DEFAULT_TIMEOUT_SECONDS


# --------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------


def _extra(cfg: config.OperatorConfig, key: str) -> Any:
    value = getattr(cfg, key, None)
    return value if value is not None else (cfg.extra or {}).get(key)


def policy_settings(cfg: config.OperatorConfig | None = None) -> PolicySettings:
    cfg = cfg or config.CONFIG
    values = _extra(cfg, "metrics_policy")
    return PolicySettings.from_mapping(values if isinstance(values, Mapping) else None)


def reader_for(cfg: config.OperatorConfig | None = None) -> PrometheusReader:
    cfg = cfg or config.CONFIG
    assert cfg.prometheus_url
    selector = _extra(cfg, "prometheus_selector") or os.environ.get("VLLM_OPERATOR_PROMETHEUS_SELECTOR") or None
    timeout = float(_extra(cfg, "prometheus_timeout_seconds") or MAX_TIMEOUT_SECONDS)
    return PrometheusReader(cfg.prometheus_url, selector=selector, rate_window=_extra(cfg, "prometheus_rate_window"),
                            timeout=min(timeout, MAX_TIMEOUT_SECONDS))


def interval_seconds(cfg: config.OperatorConfig | None = None) -> float:
    cfg = cfg or config.CONFIG
    try:
        return max(float(cfg.metrics_interval_seconds), MIN_INTERVAL_SECONDS)
    except (TypeError, ValueError):
        return 60.0


# --------------------------------------------------------------------------------------------------
# The daemon
# --------------------------------------------------------------------------------------------------


def prometheus_enabled(spec: Mapping[str, Any], **_: Any) -> bool:
    prometheus = spec.get("prometheus") if isinstance(spec, Mapping) else None
    return isinstance(prometheus, Mapping) and prometheus.get("enabled") is True


async def vllmservice_metrics_watch(stopped: kopf.DaemonStopped, name: str, namespace: str | None,
                                    **_: Any) -> None:
    """Every `metrics_interval_seconds`: observe, write status.metrics, act (see the module docstring)."""
    assert namespace is not None
    loop = asyncio.get_running_loop()
    while not stopped:
        if config.CONFIG.prometheus_url:
            try:
                await loop.run_in_executor(None, watch_service, namespace, name)
            except Exception as exc:  # never fail: the next round tries again
                log.warning("metrics watch of %s/%s failed: %s", namespace, name, exc)
        await stopped.wait(interval_seconds())
    if stopped.reason is not None and stopped.reason & kopf.DaemonStoppingReason.FILTERS_MISMATCH:
        try:
            await loop.run_in_executor(None, mark_disabled, namespace, name)
        except Exception as exc:
            log.debug("could not mark metrics disabled on %s/%s: %s", namespace, name, exc)


def mark_disabled(namespace: str, name: str, wait_seconds: float = 4.0) -> None:
    """spec.prometheus.enabled was turned off: replicas added from metrics go back to spec.replicas, and an
    existing MetricsAvailable condition says metrics are not read (Unknown, MetricsDisabled).

    Written once the reconcile of that spec change has written its status (observedGeneration caught up), so that
    its write — computed from the status it was handed — does not put the old condition back."""
    deadline = time.monotonic() + wait_seconds
    service: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        with kube.api_errors("read the VLLMService"):
            service = kube.get(kube.VLLMSERVICES, namespace, name)
        if service is None:
            return
        generation = (service.get("metadata") or {}).get("generation")
        if (service.get("status") or {}).get("observedGeneration") == generation:
            break
        time.sleep(0.2)
    if service is not None:
        _scale_back(service)
    update = cond.ConditionUpdate(cond.METRICS_AVAILABLE, cond.UNKNOWN, cond.METRICS_DISABLED,
                                  "spec.prometheus.enabled is false: metrics are not read")

    def build(status: dict[str, Any]) -> VLLMServiceStatus | None:
        if not any(c.get("type") == cond.METRICS_AVAILABLE for c in status.get("conditions") or []):
            return None
        return _fold(status, [update], datetime.now(UTC))

    update_status(namespace, name, build)


def _scale_back(service: Mapping[str, Any]) -> None:
    """The Deployment runs more than spec.replicas only because this watch scaled it: return to spec.replicas."""
    try:
        spec = parse_spec(service.get("spec") or {})
    except SpecValidationError:
        return
    meta = service.get("metadata") or {}
    kind = scaled_kind(service)
    with kube.api_errors(f"read the {kind}"):
        deployment = kube.get(kube.KIND_RESOURCES[kind], meta["namespace"], effects.workload_names(meta["name"])[kind])
    replicas = _replicas(deployment)
    if replicas is None or replicas <= spec.replicas or spec.autoscaling is not None:
        return  # with an autoscaler the reconcile renders spec.replicas: nothing of ours to undo
    effects.scale_deployment(meta["namespace"], meta["name"], spec.replicas, kind)

    def cleared(status: dict[str, Any]) -> VLLMServiceStatus | None:
        if (status.get("metrics") or {}).get("desiredReplicas") is None:
            return None
        observed = MetricsStatus.model_validate(status.get("metrics") or {})
        return _fold(status, [], datetime.now(UTC), metrics=observed.model_copy(update={"desired_replicas": None}))

    update_status(meta["namespace"], meta["name"], cleared)
    _event(service, "Normal", SCALED_DOWN, f"spec.prometheus.enabled is false: replicas {replicas} → "
                                           f"{spec.replicas} (spec.replicas)")


# --------------------------------------------------------------------------------------------------
# Status writes: from a fresh read, guarded by resourceVersion, rebuilt on conflict
# --------------------------------------------------------------------------------------------------


def _fold(status: Mapping[str, Any], updates: list[cond.ConditionUpdate], now: datetime,
          **changes: Any) -> VLLMServiceStatus:
    """Status with these conditions/fields; observedGeneration is left as the reconcile wrote it."""
    generation = status.get("observedGeneration")
    return cond.fold_status(dict(status), conditions=updates, observed_generation=generation, now=now, **changes)


def _status_of(service: Mapping[str, Any]) -> dict[str, Any]:
    return dict(service.get("status") or {})


def update_status(namespace: str, name: str, build: Callable[[dict[str, Any]], VLLMServiceStatus | None],
                  attempts: int = 6) -> bool:
    """The one status writer (`effects.update_status`), with `build` given the stored status."""
    return effects.update_status(namespace, name, lambda service: build(_status_of(service)), attempts=attempts)


# --------------------------------------------------------------------------------------------------
# One round
# --------------------------------------------------------------------------------------------------


def watch_service(namespace: str, name: str, *, now: datetime | None = None) -> MetricsDecision | None:
    """One round for one service: observe, write status.metrics and the condition, apply the decision.

    Returns the decision (None when nothing was observed). API errors raise kopf.TemporaryError (the daemon logs
    them); Prometheus errors become the condition.
    """
    cfg = config.CONFIG
    url = cfg.prometheus_url
    if not url:
        return None
    found = kube.get_service(namespace, name)
    if found is None:
        return None
    service, spec = found
    if not spec.prometheus.enabled:
        return None
    if not ((service.get("status") or {}).get("gpu") or {}).get("nodes"):
        return None  # no plan recorded yet: which pods serve (a Deployment's, or a group's leaders) is not known
    status = _status_of(service)
    now = now or datetime.now(UTC)
    settings = policy_settings(cfg)
    try:
        with reader_for(cfg) as reader:
            observation = reader.observe(namespace, name, pods_regex=serving_pods_of(service).pod_name_regex,
                                         model=spec.model.served_name or spec.model.name,
                                         window_seconds=settings.window_seconds,
                                         step_seconds=settings.step_seconds, now=now)
    except PrometheusUnavailable as exc:
        metrics.PROMETHEUS_UP.set(0)
        down = cond.ConditionUpdate(cond.METRICS_AVAILABLE, cond.FALSE, cond.PROMETHEUS_UNREACHABLE,
                                    f"{exc}. status.metrics keeps the last values seen; nothing is changed "
                                    "from metrics until Prometheus answers again.")
        update_status(namespace, name, lambda st: _fold(st, [down], now))
        log.debug("%s/%s: %s", namespace, name, exc)
        return None
    metrics.PROMETHEUS_UP.set(1)
    if observation.empty:
        missing = cond.ConditionUpdate(
            cond.METRICS_AVAILABLE, cond.FALSE, cond.NO_METRICS_FOUND,
            f"Prometheus at {url} has no vLLM series matching {{{observation.selector}}}: are the pods running and "
            "scraped (annotation prometheus.io/scrape), and does the operator's --prometheus-selector match the "
            "series' labels?")
        update_status(namespace, name, lambda st: _fold(st, [missing], now))
        return None

    available = cond.ConditionUpdate(cond.METRICS_AVAILABLE, cond.TRUE, cond.METRICS_OBSERVED,
                                     f"{observation.pod_count} pod(s) reporting to {url}")
    kind = scaled_kind(service)
    with kube.api_errors(f"read the {kind}"):
        deployment = kube.get(kube.KIND_RESOURCES[kind], namespace, effects.workload_names(name)[kind])
    replicas = _replicas(deployment)
    decision = decide(observation, spec=spec, status=status, replicas=replicas, now=now, settings=settings)
    log.debug("%s/%s: %s", namespace, name, decision.message)
    if decision.action is MetricsAction.LOWER_MAX_NUM_SEQS:
        if apply_lower_max_num_seqs(service, spec, observation, decision, available, replicas, now):
            return decision
        decision = MetricsDecision(action=MetricsAction.NONE, message=f"not applied: {decision.message}")
    elif decision.action in (MetricsAction.SCALE_UP, MetricsAction.SCALE_DOWN, MetricsAction.RECOMMEND_REPLICAS):
        apply_replicas(service, observation, decision, available, now)
        return decision
    update_status(namespace, name, lambda st: _fold(
        st, [available], now, metrics=metrics_status(observation, st.get("metrics"), now)))
    return decision


def serving_pods_of(service: Mapping[str, Any]) -> ServingPods:
    """The pods that serve this VLLMService now (`render.pods.serving_now`: the recorded plan's shape, the previous
    workload's pods while a switch waits for the new one)."""
    meta = service.get("metadata") or {}
    return serving_now(str(meta.get("name") or ""), str(meta.get("namespace") or ""), service.get("status") or {})


def scaled_kind(service: Mapping[str, Any]) -> str:
    """The workload whose replicas the watch may change: the Deployment, or the StatefulSet of a service with a
    claim per pod; a LeaderWorkerSet's groups are not scaled from metrics (its service has no Deployment: the watch
    reads None and scales nothing, as before)."""
    return "StatefulSet" if switch.target_kind(service.get("status") or {}) == "StatefulSet" else "Deployment"


def _replicas(deployment: Mapping[str, Any] | None) -> int | None:
    if deployment is None:
        return None
    value = (deployment.get("spec") or {}).get("replicas")
    return int(value) if isinstance(value, int) else 1


def _event(service: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    meta = service.get("metadata") or {}
    effects.post_event(meta["namespace"], effects.involved(service), type_, reason, message)


def apply_lower_max_num_seqs(service: Mapping[str, Any], spec: VLLMServiceSpec, observation: Observation,
                             decision: MetricsDecision, available: cond.ConditionUpdate, replicas: int | None,
                             now: datetime) -> bool:
    """Lower max_num_seqs as a ladder step (`remediation.ladder`: re-planned, recorded, then rolled out). False
    when the new plan would not fit or would not lower max-num-seqs (then nothing is changed)."""
    assert decision.max_num_seqs is not None
    meta = service.get("metadata") or {}
    name, namespace = meta["name"], meta["namespace"]
    change = ProfileChange(
        failure_class=str(decision.failure_class), changes={"max_num_seqs": decision.max_num_seqs},
        message=decision.message, evidence=decision.evidence, lowers="max_num_seqs", conditions=(available,),
        status_changes={"metrics": metrics_status(observation, _status_of(service).get("metrics"), now)})
    outcome = change_profile(namespace, name, change)
    if outcome is None:
        log.info("%s/%s: %s — but the re-plan does not fit or keeps max-num-seqs; nothing changed", namespace, name,
                 decision.message)
        return False
    _keep_replicas(namespace, name, spec, replicas, scaled_kind(service))
    return True


def _keep_replicas(namespace: str, name: str, spec: VLLMServiceSpec, replicas: int | None,
                   kind: str = "Deployment") -> None:
    """A re-rendered Deployment (StatefulSet) carries spec.replicas; put back replicas the operator had scaled to."""
    if replicas is None or replicas == spec.replicas or spec.max_replicas is None or spec.autoscaling is not None:
        return
    if not spec.replicas < replicas <= spec.max_replicas:
        return
    effects.scale_deployment(namespace, name, replicas, kind)


def apply_replicas(service: Mapping[str, Any], observation: Observation, decision: MetricsDecision,
                   available: cond.ConditionUpdate, now: datetime) -> None:
    """Scale the Deployment (SCALE_UP/SCALE_DOWN) or only advise (RECOMMEND_REPLICAS). Record, then act: the entry
    and `status.metrics.desiredReplicas` (which the reconcile renders the replicas from) are written first, once —
    a rebuilt write that finds its entry recorded writes nothing — then the Deployment is scaled."""
    assert decision.replicas is not None
    meta = service.get("metadata") or {}
    name, namespace = meta["name"], meta["namespace"]
    before = decision.replicas_before
    if decision.action is MetricsAction.RECOMMEND_REPLICAS:
        flags_after: dict[str, Any] = {"recommended_replicas": decision.replicas}
        if before is not None:
            flags_after["replicas"] = before
        event_type, reason = "Warning", REPLICAS_RECOMMENDED
    else:
        flags_after = {"replicas": decision.replicas}
        up = decision.action is MetricsAction.SCALE_UP
        event_type, reason = ("Normal", SCALED_UP if up else SCALED_DOWN)
    stamp = cond.format_time(now)

    def build(status: dict[str, Any]) -> VLLMServiceStatus | None:
        remediation = RemediationStatus.model_validate(status.get("remediation") or {})
        if remediation.history and remediation.history[-1].time == stamp and \
                remediation.history[-1].flags_after == flags_after:
            return None  # this decision is recorded (an earlier write landed before its answer was lost)
        entry = RemediationEvent(step=remediation.step, time=stamp,
                                 failure_class=str(decision.failure_class), evidence=decision.evidence[:500],
                                 flags_before={"replicas": before} if before is not None else {},
                                 flags_after=flags_after, message=decision.message,
                                 profile_before=dict(remediation.profile))  # the profile is not changed
        recorded = remediation.model_copy(update={"history": [*remediation.history, entry]})
        observed = metrics_status(observation, status.get("metrics"), now)
        if decision.action is MetricsAction.RECOMMEND_REPLICAS:
            observed = observed.model_copy(update={"recommendation": decision.message})
        else:
            observed = observed.model_copy(update={"desired_replicas": decision.replicas})
        return _fold(status, [available], now, metrics=observed, remediation=recorded)

    update_status(namespace, name, build)
    if decision.action is not MetricsAction.RECOMMEND_REPLICAS:
        effects.scale_deployment(namespace, name, decision.replicas, scaled_kind(service))
        metrics.REMEDIATIONS.labels(failure_class=str(decision.failure_class)).inc()
    _event(service, event_type, reason, decision.message)
    log.info("%s/%s: %s", namespace, name, decision.message)
