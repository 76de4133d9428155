"""Read pod failures and walk the remediation ladder (observe → classify → decide → apply).

All state lives in the VLLMService's status (`status.remediation`: step, profile, history with the failure keys
pod UID + restart count), so a restarted operator neither repeats nor loses a step. Pods running an older
profile than the Deployment's current template are ignored (their failure was already answered).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from .. import metrics, reconcile
from ..api import conditions as cond
from ..api.v1alpha1 import DEFAULT_IMAGE, RemediationEvent, RemediationStatus
from ..quantity import quantity_gib
from ..remediation.classifier import Failure, classify, classify_text
from ..remediation.evidence import ContainerEvidence, evidence_from_pod
from ..remediation.policy import (
    Action,
    Current,
    Decision,
    constraints_to_profile,
    decide,
    failure_key,
    profile_constraints,
)
from ..render.manifests import ANNOTATION_PLAN, LABEL_SERVICE
from . import config, kube

log = logging.getLogger("vllm_operator.remediation")
LOG_TAIL_LINES = 80
_REASON_BY_ACTION = {Action.STEP: cond.REMEDIATING, Action.EXHAUSTED: cond.REMEDIATION_EXHAUSTED}


def _now() -> datetime:
    return datetime.now(UTC)


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _failing(evidence: ContainerEvidence) -> bool:
    return bool(evidence.terminated_reason or evidence.exit_code or evidence.waiting_reason in (
        "CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError"))


def classify_pod(pod: Mapping[str, Any]) -> list[tuple[ContainerEvidence, Failure]]:
    """The failures a pod's vLLM container shows; fetches a bounded log tail when the message is empty."""
    found = []
    for evidence in evidence_from_pod(pod, container="vllm"):
        if not _failing(evidence):
            continue
        failure = classify(evidence)
        if failure is None:
            continue
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
        found.append((evidence, failure))
    return found


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
    try:
        return kube.read_log(namespace, pod, container="vllm", tail_lines=LOG_TAIL_LINES, previous=True)
    except Exception as exc:  # a missing log is not worth failing the handler for
        log.debug("no log for %s/%s: %s", namespace, pod, exc)
        return None


def _current_plan_hash(deployment: Mapping[str, Any] | None) -> str | None:
    if deployment is None:
        return None
    template = ((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}
    annotations = template.get("annotations") or {}
    value = annotations.get(ANNOTATION_PLAN)
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


def current_from(spec: Any, status: Mapping[str, Any], deployment: Mapping[str, Any] | None) -> Current:
    remediation = status.get("remediation") or {}
    history = remediation.get("history") or []
    last = _parse_time(history[-1].get("time")) if history else None
    keys = {f"{h.get('podUID')}/{h.get('restartCount')}" for h in history if h.get("podUID")}
    if remediation.get("lastFailureKey"):
        keys.add(remediation["lastFailureKey"])
    keys.update(remediation.get("handledKeys") or [])
    return Current(
        flags=dict((status.get("plan") or {}).get("flags") or {}),
        planned_kv_gib=((status.get("plan") or {}).get("memory") or {}).get("kvCacheGiB"),
        pinned=frozenset(spec.flags.to_vllm()),
        constraints=profile_constraints(remediation.get("profile") or {}),
        step=int(remediation.get("step") or 0),
        history_keys=frozenset(keys),
        last_step_time=last,
        max_steps=spec.remediation.max_steps,
        min_interval_seconds=spec.remediation.min_interval_seconds,
        enabled=spec.remediation.enabled,
        max_gpus=spec.gpu.count or spec.gpu.max_count,
        gpu_count_fixed=bool(spec.gpu.count),
        min_context=spec.workload.context_length,
        gpu_total_gib=(status.get("gpu") or {}).get("memoryGiB"),
        host_memory_gib=_container_memory_gib(deployment),
        node_memory_gib=None,
        memory_pinned=bool(spec.resources.memory),
    )


def remediate_service(namespace: str, name: str, logger: logging.Logger | kopf.Logger = log) -> Decision | None:
    """Look at the service's pods; take at most one ladder step. Returns the decision taken, if any."""
    with kube.service_lock(namespace, name):
        return _remediate_locked(namespace, name, logger)


def _remediate_locked(namespace: str, name: str, logger: logging.Logger | kopf.Logger) -> Decision | None:
    found = kube.get_service(namespace, name)
    if found is None:
        return None
    service, spec = found
    status = dict(service.get("status") or {})
    with kube.api_errors("read the Deployment and pods"):
        deployment = kube.get(kube.DEPLOYMENTS, namespace, name)
        pods = kube.list_objects(kube.PODS, namespace, label_selector=f"{LABEL_SERVICE}={name}")
    current_hash = _current_plan_hash(deployment)
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if current_hash and annotations.get(ANNOTATION_PLAN) not in (None, current_hash):
            continue  # a pod of an older profile: its failure was already answered by the step that replaced it
        for evidence, failure in classify_pod(pod):
            current = current_from(spec, status, deployment)
            if failure.kind == "HostOOMKilled":
                current = current.model_copy(update={"node_memory_gib": _node_memory_gib()})
            key = failure_key(evidence.pod_uid, death_index(pod, evidence))
            decision = decide(failure, key, current, _now())
            if decision.action in (Action.IGNORE, Action.WAIT):
                continue
            if decision.action is Action.EXHAUSTED and (status.get("remediation") or {}).get("exhausted"):
                _remember(namespace, name, status, key)  # the verdict stands: note the failure, announce nothing
                continue
            return apply_decision(service, spec, status, decision, evidence, failure, key, logger, deployment)
    return None


def apply_decision(service: Mapping[str, Any], spec: Any, status: dict[str, Any], decision: Decision,
                   evidence: ContainerEvidence, failure: Failure, key: str,
                   logger: logging.Logger | kopf.Logger, deployment: Mapping[str, Any] | None = None) -> Decision:
    """Write what the decision says: a step (status, Deployment, event) or a verdict (status, event)."""
    meta = service.get("metadata") or {}
    name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", "")
    generation = int(meta.get("generation") or 1)
    now = _now()
    remediation = RemediationStatus.model_validate(status.get("remediation") or {})
    involved = {"apiVersion": service.get("apiVersion"), "kind": "VLLMService", "name": name,
                "namespace": namespace, "uid": uid}
    flags_before = dict((status.get("plan") or {}).get("flags") or {})
    if decision.action is Action.STEP and decision.constraints is not None:
        remediation = remediation.model_copy(update={
            "step": remediation.step + 1,
            "profile": constraints_to_profile(decision.constraints),
            "last_failure_key": key,
            "exhausted": False,
        })
        stepped = dict(status)
        stepped["remediation"] = remediation.model_dump(by_alias=True, exclude_none=True)
        files, model_error = _model_files(service, namespace)
        desired = reconcile.desired_state(reconcile.Observed(
            name=name, namespace=namespace, uid=uid, generation=generation, spec=dict(service.get("spec") or {}),
            status=stepped, now=now, nodes=_nodes_for(spec), model_files=files, model_error=model_error,
            catalog=config.CONFIG.catalog,
                                  default_image=config.CONFIG.default_image or DEFAULT_IMAGE))
        if desired.plan is None or not desired.plan.fits:
            why = desired.plan.failure.message if desired.plan and desired.plan.failure else "no plan"
            options = "; ".join(o.summary for o in (desired.plan.options if desired.plan else [])[:3])
            exhausted = decision.model_copy(update={
                "action": Action.EXHAUSTED,
                "message": f"{decision.message}, but then nothing fits: {why}"
                           + (f" Options: {options}" if options else "")})
            return apply_decision(service, spec, status, exhausted, evidence, failure, key, logger, deployment)
        if not _changes_pods(desired, deployment):
            nothing = decision.model_copy(update={
                "action": Action.EXHAUSTED,
                "message": f"{decision.message}, but the plan cannot change accordingly ("
                           f"{_why_unchanged(desired)}); {failure.summary}"})
            return apply_decision(service, spec, status, nothing, evidence, failure, key, logger, deployment)
        flags_after = desired.plan.flags
        entry = RemediationEvent(step=remediation.step, time=cond.format_time(now), failure_class=str(failure.kind),
                                 evidence=(failure.excerpt or failure.summary)[:500], podUID=evidence.pod_uid,
                                 restart_count=evidence.restart_count, flags_before=flags_before,
                                 flags_after=flags_after, message=decision.message,
                                 profile_before=dict((status.get("remediation") or {}).get("profile") or {}))
        remediation = remediation.model_copy(update={"history": [*remediation.history, entry]})
        new_status = cond.fold_status(desired.status, conditions=[cond.ConditionUpdate(
            cond.DEGRADED, cond.TRUE, cond.REMEDIATING, f"step {remediation.step}: {decision.message}")],
            observed_generation=generation, now=now, remediation=remediation)
        if desired.children is not None:
            from .service import apply_children

            apply_children(desired.children, namespace)
        _write(namespace, name, status, new_status)
        metrics.REMEDIATIONS.labels(failure_class=str(failure.kind)).inc()
        _event(namespace, involved, "Warning", f"Remediated{failure.kind}",
               f"step {remediation.step}: {decision.message}. Evidence: {failure.summary}")
        logger.info("remediation step %s for %s/%s: %s", remediation.step, namespace, name, decision.message)
        return decision
    handled = [*[k for k in remediation.handled_keys if k != key], key][-20:]
    remediation = remediation.model_copy(update={"last_failure_key": key, "handled_keys": handled,
                                                 "exhausted": decision.action is Action.EXHAUSTED})
    if decision.action is Action.EXHAUSTED:
        update = cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, cond.REMEDIATION_EXHAUSTED, decision.message)
        reason = cond.REMEDIATION_EXHAUSTED
    else:
        update = cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, _surface_reason(failure), decision.message)
        reason = f"PodFailed{failure.kind}"
    new_status = cond.fold_status(status, conditions=[update], observed_generation=generation, now=now,
                                  remediation=remediation)
    _write(namespace, name, status, new_status)
    _event(namespace, involved, "Warning", reason, decision.message)
    logger.warning("%s/%s: %s", namespace, name, decision.message)
    return decision


def _changes_pods(desired: reconcile.Desired, deployment: Mapping[str, Any] | None) -> bool:
    """Whether the stepped plan renders a different pod template than the one running."""
    if deployment is None or desired.children is None:
        return True
    for child in desired.children:
        if child.get("kind") == "Deployment":
            want = (((child.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations", {})
            return bool(want.get(ANNOTATION_PLAN) != _current_plan_hash(deployment))
    return True


def _why_unchanged(desired: reconcile.Desired) -> str:
    plan = desired.plan
    if plan is None:
        return "no plan"
    return (f"the planner still chooses {plan.gpu_count} GPU(s) per pod on {plan.gpu} with the same flags: the "
            "nodes or spec.gpu limit it")


def _remember(namespace: str, name: str, status: dict[str, Any], key: str) -> None:
    remediation = RemediationStatus.model_validate(status.get("remediation") or {})
    handled = [*[k for k in remediation.handled_keys if k != key], key][-20:]
    new = cond.fold_status(status, observed_generation=_generation(status), now=_now(), remediation=remediation.model_copy(
        update={"last_failure_key": key, "handled_keys": handled}))
    _write(namespace, name, status, new)


def _generation(status: Mapping[str, Any]) -> int | None:
    value = status.get("observedGeneration")
    return int(value) if value is not None else None


def _surface_reason(failure: Failure) -> str:
    return {"ImagePull": cond.IMAGE_PULL_FAILED, "HostOOMKilled": cond.CONTAINER_OOM_KILLED}.get(
        str(failure.kind), cond.CONTAINER_CRASH_LOOP_BACK_OFF)


def _write(namespace: str, name: str, old: Mapping[str, Any], new: Any) -> None:
    from .service import write_status

    write_status(namespace, name, old, new)


def _event(namespace: str, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
    with kube.api_errors("post an event"):
        kube.post_event(namespace, involved, type_, reason, message)


def _nodes_for(spec: Any) -> list[dict[str, str]]:
    from .service import list_gpu_nodes

    if spec.gpu.product:
        return []
    return list_gpu_nodes(dict(spec.node_selector))


def _model_files(service: Mapping[str, Any], namespace: str) -> tuple[Any, str | None]:
    from .service import load_model

    return load_model(service.get("spec") or {}, namespace)


STEP_UP = "StepUp"


def step_up_service(namespace: str, name: str, logger: logging.Logger | kopf.Logger = log) -> bool:
    """spec.remediation.allowStepUp: after a stable window, restore the profile from before the last step, once
    per profile (a profile that failed again after a step back is not retried). Returns whether it stepped."""
    with kube.service_lock(namespace, name):
        found = kube.get_service(namespace, name)
        if found is None:
            return False
        service, spec = found
        status = dict(service.get("status") or {})
        target = step_up_target(spec, status, _now())
        if target is None:
            return False
        profile, entry = target
        return _apply_step_up(service, spec, status, profile, entry, logger)


def step_up_target(spec: Any, status: Mapping[str, Any], now: datetime) -> tuple[dict[str, Any], Any] | None:
    """The profile a step back would restore, or None when not allowed or not due (pure)."""
    if not (spec.remediation.allow_step_up and spec.remediation.enabled):
        return None
    remediation = RemediationStatus.model_validate(status.get("remediation") or {})
    if not remediation.profile or not remediation.history:
        return None
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == cond.READY), None)
    if not ready or ready.get("status") != cond.TRUE:
        return None
    last = remediation.history[-1]
    since = max(filter(None, [_parse_time(ready.get("lastTransitionTime")), _parse_time(last.time)]))
    if (now - since).total_seconds() < spec.remediation.stable_window_seconds:
        return None
    # entries that only scaled replicas or advised (metrics watch) did not change the profile
    steps = [h for h in remediation.history if h.failure_class != STEP_UP and set(h.flags_before) != {"replicas"}
             and "recommendedReplicas" not in h.flags_after]
    if not steps:
        return None
    restore = dict(steps[-1].profile_before)
    tried = [h.profile_before for h in remediation.history if h.failure_class == STEP_UP]
    if restore in tried or restore == dict(remediation.profile):
        return None
    return restore, steps[-1]


def _apply_step_up(service: Mapping[str, Any], spec: Any, status: dict[str, Any], profile: dict[str, Any],
                   undone: Any, logger: logging.Logger | kopf.Logger) -> bool:
    meta = service.get("metadata") or {}
    name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", "")
    generation = int(meta.get("generation") or 1)
    now = _now()
    remediation = RemediationStatus.model_validate(status.get("remediation") or {})
    stepped = dict(status)
    stepped["remediation"] = {**(status.get("remediation") or {}), "profile": profile}
    files, model_error = _model_files(service, namespace)
    desired = reconcile.desired_state(reconcile.Observed(
        name=name, namespace=namespace, uid=uid, generation=generation, spec=dict(service.get("spec") or {}),
        status=stepped, now=now, nodes=_nodes_for(spec), model_files=files, model_error=model_error,
        catalog=config.CONFIG.catalog, default_image=config.CONFIG.default_image or DEFAULT_IMAGE))
    if desired.plan is None or not desired.plan.fits or desired.children is None:
        return False
    message = (f"stable for {spec.remediation.stable_window_seconds}s: stepping back from step "
               f"{remediation.step} ({undone.message})")
    entry = RemediationEvent(step=max(remediation.step - 1, 0), time=cond.format_time(now), failure_class=STEP_UP,
                             evidence="", flags_before=dict((status.get("plan") or {}).get("flags") or {}),
                             flags_after=desired.plan.flags, message=message, profile_before=profile)
    remediation = remediation.model_copy(update={"step": max(remediation.step - 1, 0), "profile": profile,
                                                 "history": [*remediation.history, entry]})
    from .service import apply_children

    apply_children(desired.children, namespace)
    new_status = cond.fold_status(desired.status, observed_generation=generation, now=now, remediation=remediation)
    _write(namespace, name, status, new_status)
    involved = {"apiVersion": service.get("apiVersion"), "kind": "VLLMService", "name": name,
                "namespace": namespace, "uid": uid}
    _event(namespace, involved, "Normal", "SteppedUp", message)
    logger.info("%s/%s: %s", namespace, name, message)
    return True
