"""The remediation ladder's shell: observe (pods, their failures, log tails), decide (`remediation.ladder.next_step`,
pure), then record, act, announce (`effects`).

Record, then act: a step is first written to `status.remediation` (profile, history entry, failure key) with a
`resourceVersion` precondition, then its Event is posted, then the Deployment is rolled out. A reconcile renders
from the recorded profile, so a step recorded but not rolled out (a failed patch, a crash) is completed by the next
reconcile or retry and never undone; a failure whose key is recorded never causes a second step. A step whose write
failed is retried promptly (`RETRY_DELAYS`), not after the watchdog; so is a step deferred by
`spec.remediation.minIntervalSeconds`, at the time it is due. Pods of an older template than the Deployment's are
ignored (their failure was already answered).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import kopf

from .. import metrics, reconcile
from ..api import switch
from ..api.v1alpha1 import RemediationEvent
from ..quantity import quantity_gib
from ..remediation import groups, ladder
from ..remediation.classifier import Failure, classify, classify_text
from ..remediation.evidence import ContainerEvidence, evidence_from_pod
from ..remediation.ladder import STEP_UP, Deferred, Outcome, PodFailure, ProfileChange, step_up_target
from ..remediation.policy import failure_key
from ..render.manifests import ANNOTATION_PLAN, LABEL_SERVICE
from ..render.pods import statefulset_name
from . import effects, kube
from .observe import observe_service

__all__ = ["STEP_UP", "cancel_retries", "classify_pod", "death_index", "remediate_service", "step_up_service",
           "step_up_target"]

log = logging.getLogger("vllm_operator.remediation")
LOG_TAIL_LINES = 80
#: Delays of the prompt retries of a step whose write failed (seconds); after the last, the watchdog looks again.
RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0)
#: A step deferred by minIntervalSeconds is retried at its due time when that is at most this far away (seconds).
MAX_DEFERRAL = 900.0


def _now() -> datetime:
    return datetime.now(UTC)


def _failing(evidence: ContainerEvidence) -> bool:
    return bool(evidence.terminated_reason or evidence.exit_code or evidence.waiting_reason in (
        "CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError"))


def classify_pod(pod: Mapping[str, Any]) -> list[tuple[ContainerEvidence, Failure]]:
    """The failures a pod's vLLM container shows; fetches a bounded log tail when the message is empty."""
    found = []
    for evidence in evidence_from_pod(pod, container="vllm"):
        classified = _classify(evidence)
        if classified is not None:
            found.append(classified)
    return found


def _classify(evidence: ContainerEvidence) -> tuple[ContainerEvidence, Failure] | None:
    if not _failing(evidence):
        return None
    failure = classify(evidence)
    if failure is None:
        return None
    vague = failure.kind == "Unknown" or (failure.kind.startswith("CUDAOOM") and failure.phase is None)
    if (vague or not evidence.termination_message.strip()) and evidence.terminated_reason != "OOMKilled":
        # the termination message is the last 2 KB: the log tail has the traceback that tells load from profile
        tail = read_log_tail(evidence.namespace, evidence.pod_name)
        if tail and tail.strip() != evidence.termination_message.strip():
            refined = classify_text(tail, terminated_reason=evidence.terminated_reason,
                                    exit_code=evidence.exit_code, was_ready_before=evidence.was_ready_before,
                                    waiting_reason=evidence.waiting_reason)
            # the tail may only refine what the message said (e.g. the phase of an OOM), never discard it
            if refined.kind != "Unknown" or failure.kind == "Unknown":
                evidence = evidence.model_copy(update={"log_tail": tail})
                failure = refined
    return evidence, failure


def death_index(pod: Mapping[str, Any], evidence: ContainerEvidence) -> int:
    """Which death of the container this evidence describes, the same number in every state it is seen in.

    restartCount counts restarts: a death is seen with restartCount N while the container is terminated or waiting
    in CrashLoopBackOff, and still (as lastState) with N+1 once the container runs again. Counting the running
    case back by one gives each death one key, so it is answered once and the next death is not mistaken for it.
    """
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == evidence.container_name:
            running = "running" in (status.get("state") or {})
            return max(evidence.restart_count - 1, 0) if running else evidence.restart_count
    return evidence.restart_count


def read_log_tail(namespace: str, pod: str) -> str | None:
    """The end of the log of the container's run that died: `--previous` once the kubelet has restarted it; before
    that (state.terminated, the first death) the kubelet has no previous run (400) and the current log is the dead
    run's (found by the real tier: vLLM's own KV-cache error is 60 lines above the end, out of the 2 KB message)."""
    try:
        for previous in (True, False):
            text = kube.read_log(namespace, pod, container="vllm", tail_lines=LOG_TAIL_LINES, previous=previous)
            if text is not None:
                return text
    except Exception as exc:  # a missing log is not worth failing the handler for
        log.debug("no log for %s/%s: %s", namespace, pod, exc)
    return None


def _template_hash(obj: Mapping[str, Any] | None) -> str | None:
    if obj is None:
        return None
    template = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
    value = (template.get("annotations") or {}).get(ANNOTATION_PLAN)
    return str(value) if value is not None else None


def _container_memory_gib(deployment: Mapping[str, Any] | None) -> float | None:
    if deployment is None:
        return None
    containers = ((((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")
                  or [{}])
    limit = ((containers[0].get("resources") or {}).get("limits") or {}).get("memory")
    return quantity_gib(limit)


def _node_memory_gib() -> float | None:
    with kube.api_errors("list nodes"):
        nodes = kube.list_objects(kube.NODES)
    sizes = [quantity_gib(((n.get("status") or {}).get("allocatable") or {}).get("memory")) for n in nodes
             if ((n.get("metadata") or {}).get("labels") or {}).get("nvidia.com/gpu.product")]
    known = [s for s in sizes if s]
    return max(known) if known else None


def pod_failures(pods: list[dict[str, Any]], deployment: Mapping[str, Any] | None,
                 known: frozenset[str] = frozenset()) -> list[PodFailure]:
    """The classified failures of the pods of the Deployment's current template (older pods were answered), but
    for the failures whose keys are `known` (recorded: not classified again, no log read)."""
    current = _template_hash(deployment)
    found = []
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if current and annotations.get(ANNOTATION_PLAN) not in (None, current):
            continue
        for evidence in evidence_from_pod(pod, container="vllm"):
            key = failure_key(evidence.pod_uid, death_index(pod, evidence))
            if key in known:
                continue
            classified = _classify(evidence)
            if classified is not None:
                found.append(PodFailure(classified[0], classified[1], key, annotations.get(ANNOTATION_PLAN),
                                        node_rank=_node_rank(pod)))
    return found


def _node_rank(pod: Mapping[str, Any]) -> int | None:
    """The LeaderWorkerSet worker index of a pod of a group (its vLLM --node-rank); None for other pods."""
    raw = ((pod.get("metadata") or {}).get("labels") or {}).get(groups.WORKER_INDEX_LABEL)
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


# --------------------------------------------------------------------------------------------------
# Observe → decide → record → announce → act
# --------------------------------------------------------------------------------------------------


def remediate_service(namespace: str, name: str, logger: logging.Logger | kopf.Logger = log) -> Outcome | None:
    """Look at the service's pods; take at most one ladder step (recorded, then rolled out). Returns the outcome
    recorded now, if any. A failed write raises kopf.TemporaryError and schedules a prompt retry."""
    return _guarded(namespace, name, logger, failures=True)


def step_up_service(namespace: str, name: str, logger: logging.Logger | kopf.Logger = log) -> bool:
    """spec.remediation.allowStepUp: after a stable window, restore the profile from before the last step, once
    per profile (a profile that failed again after a step back is not retried). Returns whether it stepped."""
    outcome = _guarded(namespace, name, logger, failures=False, step_up=True)
    return outcome is not None and outcome.action == "step_up"


def change_profile(namespace: str, name: str, change: ProfileChange,
                   logger: logging.Logger | kopf.Logger = log) -> Outcome | None:
    """A metric-driven profile change, taken as a ladder step (recorded, then rolled out); None when the re-plan
    would not fit or not change what it must."""
    return _guarded(namespace, name, logger, failures=False, change=change)


def _guarded(namespace: str, name: str, logger: logging.Logger | kopf.Logger, **how: Any) -> Outcome | None:
    try:
        outcome = _step(namespace, name, logger, **how)
    except kopf.TemporaryError as exc:
        _schedule(namespace, name, exc.delay if isinstance(exc.delay, int | float) else None, failed=True)
        raise
    if outcome is not None:
        _retries.pop((namespace, name), None)
    return outcome


def _step(namespace: str, name: str, logger: logging.Logger | kopf.Logger, *, failures: bool,
          step_up: bool = False, change: ProfileChange | None = None) -> Outcome | None:
    with kube.service_lock(namespace, name):
        found = kube.get_service(namespace, name)
        if found is None:
            return None
        service, spec = found
        now = _now()
        deployment: dict[str, Any] | None = None
        seen: list[PodFailure] = []
        if failures:
            with kube.api_errors("read the Deployment and pods"):
                # the serving pods' workload: its Deployment, else its StatefulSet (a claim per pod), whose pods'
                # failures are read alike
                deployment = kube.get(kube.DEPLOYMENTS, namespace, name) or kube.get(
                    kube.STATEFULSETS, namespace, statefulset_name(name))
                pods = kube.list_objects(kube.PODS, namespace, label_selector=f"{LABEL_SERVICE}={name}")
            keys = ladder.recorded_keys(ladder.remediation_of(service.get("status") or {}))
            seen = pod_failures(pods, deployment, keys)
            if not seen:
                _announce(service, now)
                return None  # nothing new: the common case, without reading the model or the nodes
        elif change is None and step_up_target(spec, service.get("status") or {}, now) is None:
            return None  # no step up due: nothing to plan (the watchdog asks every round)
        node_memory = _node_memory_gib() if any(f.failure.kind == "HostOOMKilled" for f in seen) else None
        observed = observe_service(service, now)  # read once: every try of the status write below decides over it
        results: list[Outcome | Deferred | None] = []

        def build(fresh: dict[str, Any]) -> Any:
            generation = int((fresh.get("metadata") or {}).get("generation") or observed.generation)
            render = reconcile.renderer(replace(observed, generation=generation))  # pure: the core over the data
            seen_now = ladder.Observed(status=dict(fresh.get("status") or {}), generation=generation, now=now,
                                       render=render)
            result = ladder.next_step(seen_now, spec, failures=seen, change=change, step_up=step_up,
                                      host_memory_gib=_container_memory_gib(deployment),
                                      node_memory_gib=node_memory)
            results.append(result)
            return result.status if isinstance(result, Outcome) else None

        written = effects.update_status(namespace, name, build)
        last = results[-1] if results else None
        if isinstance(last, Deferred):
            _schedule(namespace, name, (last.retry_at - now).total_seconds(), failed=False)
            logger.info("%s/%s: %s", namespace, name, last.message)
            return None
        if not written or not isinstance(last, Outcome):
            if any(isinstance(r, Outcome) and r.children is not None for r in results):
                _complete(namespace, name, logger)  # a step may have landed before its answer was lost
            return None
        return _act(service, last, logger)


def _act(service: Mapping[str, Any], outcome: Outcome, logger: logging.Logger | kopf.Logger) -> Outcome:
    """The outcome is recorded: announce it, then roll it out."""
    meta = service.get("metadata") or {}
    namespace, name = meta["namespace"], meta["name"]
    if outcome.entry is not None:
        _post_step_event(service, outcome.entry)
    else:
        for event in outcome.events:
            effects.post_event(namespace, effects.involved(service), event.type, event.reason, event.message)
    if outcome.children is not None:
        effects.apply_children(no_switch(service, outcome.children), namespace)
    if outcome.plan is not None:
        metrics.record_plan(namespace, name, outcome.plan.fits, outcome.plan.flags,
                            outcome.plan.prediction.kv_cache_tokens)
    if outcome.entry is not None and outcome.action == "step":
        metrics.REMEDIATIONS.labels(failure_class=outcome.failure_class).inc()
    if outcome.action in ("step", "step_up"):
        logger.info("%s/%s: step %s: %s", namespace, name, outcome.entry.step if outcome.entry else "?",
                    outcome.message)
    elif outcome.action != "remember":
        logger.warning("%s/%s: %s", namespace, name, outcome.message)
    return outcome


def no_switch(service: Mapping[str, Any], children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The children a ladder step applies: never a workload of another kind than the one the status records. A switch
    between workload kinds (a Deployment whose service now needs a claim per pod, say) is the reconcile's to start,
    through the placement check (handlers/placement.py), which holds it when the new pods could not be placed beside
    the serving ones; a step applied here would create the new workload past that hold. The step's profile is
    recorded; the reconcile renders it on whichever workload it lets run."""
    kind = switch.target_kind(service.get("status") or {})
    if any(c.get("kind") == kind for c in children):
        return children
    return [c for c in children if c.get("kind") not in switch.WORKLOADS]


def _complete(namespace: str, name: str, logger: logging.Logger | kopf.Logger) -> None:
    """Finish what the status records: roll out the recorded profile, post the Events of recent steps."""
    with kube.service_lock(namespace, name):
        service = effects.read_service(namespace, name)
        if service is None:
            return
        now = _now()
        _announce(service, now)
        desired = reconcile.desired_state(observe_service(service, now))
        if desired.children is not None:
            for line in effects.apply_children(no_switch(service, desired.children), namespace):
                logger.info("%s/%s: completing the recorded step: %s", namespace, name, line)


# Events of recorded steps known to be posted, by their fixed names. Bounded; after a restart the Events of the steps
# of the last `ladder.ANNOUNCE_WINDOW` are posted again once (a 409 AlreadyExists when they are there).
_announced: set[str] = set()


def step_event_name(service: Mapping[str, Any], entry: RemediationEvent) -> str:
    """The fixed name of a recorded step's Event: the same for every post of it, by any operator process."""
    meta = service.get("metadata") or {}
    digest = hashlib.sha256(f"{meta.get('uid')}/{entry.step}/{entry.time}/{entry.failure_class}/"
                            f"{entry.pod_uid}/{entry.restart_count}".encode()).hexdigest()[:16]
    return f"{str(meta.get('name'))[:200]}.step.{digest}"


def _post_step_event(service: Mapping[str, Any], entry: RemediationEvent) -> None:
    meta = service.get("metadata") or {}
    name = step_event_name(service, entry)
    if name in _announced:
        return
    event = ladder.step_event(entry)
    if effects.post_event(meta["namespace"], effects.involved(service), event.type, event.reason, event.message,
                          name=name):
        if len(_announced) > 10000:
            _announced.clear()
        _announced.add(name)


def _announce(service: Mapping[str, Any], now: datetime) -> None:
    """Post the Events of recent recorded steps that this process has not seen posted (a crash or a failed post
    lost them; idempotent by name)."""
    for entry in ladder.unannounced(service.get("status") or {}, now):
        _post_step_event(service, entry)


# --------------------------------------------------------------------------------------------------
# Prompt retries
# --------------------------------------------------------------------------------------------------

_retries: dict[tuple[str, str], int] = {}
_timers: dict[tuple[str, str], threading.Timer] = {}
_timers_lock = threading.Lock()


def _schedule(namespace: str, name: str, delay: float | None, *, failed: bool) -> None:
    """Look at the service again soon: after a failed write (backing off along RETRY_DELAYS), or when a deferred
    step is due. One pending retry per service."""
    key = (namespace, name)
    if failed:
        attempt = _retries.get(key, 0)
        if attempt >= len(RETRY_DELAYS):
            _retries.pop(key, None)
            log.warning("%s/%s: retries exhausted; the watchdog looks again", namespace, name)
            return
        _retries[key] = attempt + 1
        delay = max(delay or 0.0, RETRY_DELAYS[attempt]) if attempt else RETRY_DELAYS[0]
    elif delay is None or delay > MAX_DEFERRAL:
        return
    with _timers_lock:
        pending = _timers.get(key)
        if pending is not None and pending.is_alive():
            return
        timer = threading.Timer(max(delay or 0.0, 0.05), _retry, args=(namespace, name))
        timer.daemon = True
        _timers[key] = timer
        timer.start()


def _retry(namespace: str, name: str) -> None:
    with _timers_lock:
        _timers.pop((namespace, name), None)
    try:
        if _step(namespace, name, log, failures=True) is None:
            _complete(namespace, name, log)
        _retries.pop((namespace, name), None)
    except kopf.TemporaryError as exc:
        log.warning("%s/%s: remediation retry deferred: %s", namespace, name, exc)
        _schedule(namespace, name, exc.delay if isinstance(exc.delay, int | float) else None, failed=True)
    except Exception:  # a retry must never kill its thread silently
        log.exception("%s/%s: remediation retry failed", namespace, name)


def cancel_retries() -> None:
    """Stop pending retries (the operator is stopping)."""
    with _timers_lock:
        for timer in _timers.values():
            timer.cancel()
        _timers.clear()
    _retries.clear()
