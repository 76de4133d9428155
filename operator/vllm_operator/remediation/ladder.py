"""The remediation ladder as one pure decision: (observed service, pod failures, metric evidence, now) → the next
status to record (profile, history entry, failure key), the children to roll out once it is recorded, and Events.

`next_step` covers the three ways the operator changes a service's pods on its own:

* a classified pod failure (`PodFailure`) — a step down the ladder (`policy.decide`), or a verdict;
* a metric-driven change of the profile (`ProfileChange`, e.g. lower max-num-seqs under sustained preemption);
* a step back up after a stable window (`spec.remediation.allowStepUp`).

Every step is re-planned here with the stepped profile (the planner computes the next flags) and must render a
different pod template than the one recorded; a step whose plan no longer fits or does not change the pods becomes
a verdict. The shell records `Outcome.status` first (a precondition write) and only then applies `Outcome.children`
— record, then act: a reconcile renders from the recorded profile, so it completes a recorded step and never undoes
it; a step whose failure key is recorded is never taken again.

No Kubernetes, no kopf, no clock: `now`, everything observed and the planner (`Observed.render`) are arguments.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from pydantic import BaseModel

from ..api import conditions as cond
from ..api.times import parse_time
from ..api.v1alpha1 import (
    RemediationEvent,
    RemediationStatus,
    SpecValidationError,
    VLLMServiceSpec,
    VLLMServiceStatus,
    flags_from_api,
    parse_spec,
)
from ..render.lws import PARTITION_ENV
from ..render.manifests import ANNOTATION_PLAN
from . import groups
from .classifier import Failure
from .evidence import ContainerEvidence
from .policy import Action, Current, Decision, constraints_to_profile, decide, profile_constraints

STEP_UP = "StepUp"
#: How long after a step its Event is still checked for (and re-posted when a crash lost it).
ANNOUNCE_WINDOW = timedelta(minutes=10)
HANDLED_KEYS_KEPT = 20


class Rendered(Protocol):
    """What the planner and renderer make of a service with a given status (`reconcile.Desired`)."""

    @property
    def status(self) -> VLLMServiceStatus: ...
    @property
    def children(self) -> list[dict[str, Any]] | None: ...
    @property
    def plan(self) -> Any: ...


@dataclass(frozen=True)
class Observed:
    """The service as the ladder sees it: the recorded status, the spec's generation, the time, and `render` — the
    pure planner + renderer for this service (`reconcile.renderer`: `reconcile.desired_state` over the plain data
    the shell read once — spec, model files, nodes; it reads nothing), called with a status to learn the pods a
    profile would give."""

    status: Mapping[str, Any]
    generation: int
    now: datetime
    render: Callable[[Mapping[str, Any]], Rendered]


class Event(NamedTuple):
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class PodFailure:
    """One classified failure of a pod of the current template, with its key (pod UID / death index)."""

    evidence: ContainerEvidence
    failure: Failure
    key: str
    template: str | None = None  # the plan annotation of the pod (None: unknown)
    node_rank: int | None = None  # the pod's LeaderWorkerSet worker index (None: not a pod of a group)


@dataclass(frozen=True)
class ProfileChange:
    """A profile change asked for by evidence other than a pod failure (the metrics watch).

    `changes` are constraint fields; for `max_num_seqs` the lower of the asked and the recorded value is kept. The
    change is taken only when the re-plan lowers `lowers` (a flag name), if set."""

    failure_class: str
    changes: Mapping[str, Any]
    message: str
    evidence: str = ""
    lowers: str | None = None
    conditions: tuple[cond.ConditionUpdate, ...] = ()
    status_changes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What to record (`status`), then do (`children`, when a step changes the pods), then announce (`events`)."""

    action: str                      # "step", "step_up", "verdict", "surface", "remember"
    status: VLLMServiceStatus
    message: str
    failure_class: str = ""
    children: list[dict[str, Any]] | None = None
    events: list[Event] = field(default_factory=list)
    entry: RemediationEvent | None = None
    plan: Any = None
    decision: Decision | None = None


@dataclass(frozen=True)
class Deferred:
    """No move now; look again at `retry_at` (the ladder's minimum interval)."""

    retry_at: datetime
    message: str



def remediation_of(status: Mapping[str, Any]) -> RemediationStatus:
    return RemediationStatus.model_validate(status.get("remediation") or {})


def recorded_keys(remediation: RemediationStatus) -> frozenset[str]:
    keys = {f"{h.pod_uid}/{h.restart_count}" for h in remediation.history if h.pod_uid}
    if remediation.last_failure_key:
        keys.add(remediation.last_failure_key)
    keys.update(remediation.handled_keys)
    return frozenset(keys)


# --- what a profile was learned on ------------------------------------------------------------------------------

#: The spec fields a plan is computed from. A learned profile belongs to them: it is reset when one of them changes,
#: never for replicas, labels, annotations, env, autoscaling, routing, the Service or any other plan-neutral field.
PLAN_INPUT_FIELDS = ("model", "gpu", "vllm_version", "flags", "extra_args", "workload", "lora")


def _essence(value: Any) -> Any:
    """A field as JSON without the values left at their defaults: a field a newer CRD adds with a default (an
    operator upgrade) changes no hash."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    return value


def plan_inputs_hash(spec: VLLMServiceSpec, image: str) -> str:
    """A stable hash of what the plan is computed from: `PLAN_INPUT_FIELDS`, the image the pods run (`image`: the
    spec's or the operator's default) and the layer split pinned in spec.env (the one env var the plan reads)."""
    inputs = {name: _essence(getattr(spec, name)) for name in PLAN_INPUT_FIELDS}
    inputs["image"] = image
    inputs["layerPartition"] = next((e.value for e in spec.env if e.name == PARTITION_ENV), None)
    payload = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def spec_inputs_hash(spec: Mapping[str, Any], default_image: str) -> str | None:
    """`plan_inputs_hash` of a raw spec (None when it is invalid: nothing is learned or reset for it)."""
    try:
        parsed = parse_spec(spec)
    except SpecValidationError:
        return None
    return plan_inputs_hash(parsed, parsed.image or default_image)


@dataclass(frozen=True)
class Relearn:
    """What an edit does to the ladder: the remediation to record, and whether a learned profile was dropped."""

    remediation: RemediationStatus
    reset: bool
    message: str = ""


def for_inputs(remediation: RemediationStatus, inputs_hash: str | None) -> Relearn | None:
    """The ladder after the plan's inputs hash to `inputs_hash`; None when nothing changes.

    The same inputs keep everything. A status without a hash (written before hashes were kept, or a new service)
    adopts it and keeps its profile: an operator upgrade resets nothing. Other inputs drop the profile, the step and
    the exhausted mark — the history and the failure keys stay, so no failure is acted on twice — and record the new
    hash in the same write, so a retried or repeated reconcile of the same change finds nothing left to reset."""
    if inputs_hash is None or remediation.inputs_hash == inputs_hash:
        return None
    if remediation.inputs_hash is None:
        return Relearn(remediation.model_copy(update={"inputs_hash": inputs_hash}), reset=False)
    learned = bool(remediation.profile) or remediation.step > 0 or remediation.exhausted
    update: dict[str, Any] = {"inputs_hash": inputs_hash}
    message = ""
    if learned:
        update.update(profile={}, step=0, exhausted=False)
        shown = ", ".join(f"{k}={v}" for k, v in sorted(remediation.profile.items())) or "none"
        message = (f"the plan's inputs changed (model, GPU, image, pinned flags, workload or LoRA): what the ladder "
                   f"learned on the previous ones ({shown}; step {remediation.step}) no longer applies; the plan "
                   "starts over, the history is kept")
    return Relearn(remediation.model_copy(update=update), reset=learned, message=message)


def _group_layout(spec: VLLMServiceSpec, status: Mapping[str, Any], node_rank: int | None,
                  device: str | None = None) -> dict[str, Any]:
    """The multi-node facts of Current: layers per stage, nodes, and the stages of the failed pod's ranks — the one
    stage whose GPU failed when the pod holds several (TP < GPUs per node) and the failure names the GPU."""
    multi = status.get("multiNode") if isinstance(status.get("multiNode"), Mapping) else None
    layout: dict[str, Any] = {"max_nodes": spec.gpu.max_nodes,
                              "partition_pinned": any(e.name == PARTITION_ENV for e in spec.env)}
    if not multi:
        return layout
    try:
        layers = tuple(int(s.get("layers") or 0) for s in multi.get("stages") or [] if isinstance(s, Mapping))
        nodes = max(int(multi.get("nodes") or 1), 1)
        tp, per_node = int(multi.get("tensorParallelSize") or 1), int(multi.get("gpusPerNode") or 1)
    except (TypeError, ValueError):  # a status edited by hand: no stage step, never a crash
        return layout
    layout.update(nodes=nodes, stage_layers=layers if layers and min(layers) > 0 else ())
    if node_rank is not None:
        where = groups.attribute({groups.WORKER_INDEX_LABEL: node_rank}, gpus_per_node=per_node,
                                 tensor_parallel_size=tp)
        stage = groups.failed_stage(where, device, tp) if where and len(where.stages) > 1 else None
        layout["failed_stages"] = (stage,) if stage is not None else where.stages if where else ()
    return layout


def current_from(spec: VLLMServiceSpec, status: Mapping[str, Any], *, host_memory_gib: float | None = None,
                 node_memory_gib: float | None = None, node_rank: int | None = None,
                 device: str | None = None) -> Current:
    """What `policy.decide` needs to know, from the spec and the recorded status (and, for a pod of a group, its
    node rank and the GPU its failure names: a stage-specific step needs the failed stage)."""
    remediation = remediation_of(status)
    last = parse_time(remediation.history[-1].time) if remediation.history else None
    plan = status.get("plan") or {}
    return Current(
        flags=dict(_flags(status)),
        planned_kv_gib=(plan.get("memory") or {}).get("kvCacheGiB"),
        pinned=frozenset(spec.flags.to_vllm()),
        constraints=profile_constraints(remediation.profile),
        step=remediation.step,
        history_keys=recorded_keys(remediation),
        last_step_time=last,
        max_steps=spec.remediation.max_steps,
        min_interval_seconds=spec.remediation.min_interval_seconds,
        enabled=spec.remediation.enabled,
        max_gpus=spec.gpu.count or spec.gpu.max_count,
        gpu_count_fixed=bool(spec.gpu.count),
        min_context=spec.workload.context_length,
        gpu_total_gib=(status.get("gpu") or {}).get("memoryGiB"),
        host_memory_gib=host_memory_gib,
        node_memory_gib=node_memory_gib,
        memory_pinned=bool(spec.resources.memory),
        **_group_layout(spec, status, node_rank, device),
    )


def template_hash(children: Sequence[Mapping[str, Any]] | None) -> str | None:
    """The plan hash of the Deployment's or StatefulSet's pod template (a LeaderWorkerSet's leader template) among
    rendered children."""
    for child in children or ():
        if child.get("kind") in ("Deployment", "LeaderWorkerSet", "StatefulSet"):
            spec = child.get("spec") or {}
            template = spec.get("template") or (spec.get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {}
            annotations = (template.get("metadata") or {}).get("annotations") or {}
            value = annotations.get(ANNOTATION_PLAN)
            return str(value) if value is not None else None
    return None


def _with_remediation(status: Mapping[str, Any], remediation: RemediationStatus) -> dict[str, Any]:
    stepped = dict(status)
    stepped["remediation"] = remediation.model_dump(by_alias=True, exclude_none=True)
    return stepped


def _replan(observed: Observed, remediation: RemediationStatus) -> Rendered:
    return observed.render(_with_remediation(observed.status, remediation))


def _reuse(render: Callable[[Mapping[str, Any]], Rendered], status: Mapping[str, Any],
           rendered: Rendered) -> Callable[[Mapping[str, Any]], Rendered]:
    """`render`, answering `status` (the recorded one) with what was already rendered for it."""
    def cached(asked: Mapping[str, Any]) -> Rendered:
        return rendered if asked is status else render(asked)
    return cached


def next_step(observed: Observed, spec: VLLMServiceSpec, *, failures: Sequence[PodFailure] = (),
              change: ProfileChange | None = None, step_up: bool = False, host_memory_gib: float | None = None,
              node_memory_gib: float | None = None) -> Outcome | Deferred | None:
    """The ladder's one move for this service now, or None (nothing to do), or Deferred (a step is due later).

    Pod failures come first (in order; the first that moves wins), then a metric-driven change, then a step up."""
    now = observed.now
    status = observed.status
    deferred: Deferred | None = None
    exhausted = remediation_of(status).exhausted
    if not failures and change is None and not step_up:
        return None
    # the pods the recorded profile renders (planned once per call: the filter and the comparison share it)
    baseline = observed.render(status)
    observed = replace(observed, render=_reuse(observed.render, status, baseline))
    if any(f.template for f in failures):
        # a pod of another template than the recorded profile's ran a profile a recorded step already replaced
        recorded = template_hash(baseline.children)
        failures = [f for f in failures if not (f.template and recorded and f.template != recorded)]
    for found in failures:
        current = current_from(spec, status, host_memory_gib=host_memory_gib, node_memory_gib=node_memory_gib,
                               node_rank=found.node_rank, device=found.failure.device)
        decision = decide(found.failure, found.key, current, now)
        if decision.action is Action.IGNORE:
            continue
        if decision.action is Action.WAIT:
            due = (current.last_step_time or now) + timedelta(seconds=current.min_interval_seconds)
            deferred = deferred or Deferred(due, decision.message)
            continue
        if decision.action is Action.EXHAUSTED and exhausted:
            return _remember(observed, found.key)  # the verdict stands: note the failure, announce nothing
        return _remediate(observed, decision, found)
    if deferred is not None:
        return deferred
    if change is not None:
        outcome = _change_profile(observed, spec, change)
        if outcome is not None:
            return outcome
    if step_up:
        return _step_up(observed, spec)
    return None


def _remediate(observed: Observed, decision: Decision, found: PodFailure) -> Outcome:
    failure, key = found.failure, found.key
    if decision.action is Action.STEP and decision.constraints is not None:
        before = remediation_of(observed.status)
        stepped = before.model_copy(update={"step": before.step + 1, "exhausted": False, "last_failure_key": key,
                                            "profile": constraints_to_profile(decision.constraints)})
        desired = _replan(observed, stepped)
        if desired.plan is None or not desired.plan.fits or desired.children is None:
            why = desired.plan.failure.message if desired.plan and desired.plan.failure else "no plan"
            options = "; ".join(o.summary for o in (desired.plan.options if desired.plan else [])[:3])
            return _verdict(observed, decision.model_copy(update={
                "action": Action.EXHAUSTED,
                "message": f"{decision.message}, but then nothing fits: {why}"
                           + (f" Options: {options}" if options else "")}), failure, key)
        if template_hash(desired.children) == template_hash(observed.render(observed.status).children):
            plan = desired.plan
            return _verdict(observed, decision.model_copy(update={
                "action": Action.EXHAUSTED,
                "message": f"{decision.message}, but the plan cannot change accordingly (the planner still chooses "
                           f"{plan.gpu_count} GPU(s) per pod on {plan.gpu} with the same flags: the nodes or "
                           f"spec.gpu limit it); {failure.summary}"}), failure, key)
        entry = RemediationEvent(
            step=stepped.step, time=cond.format_time(observed.now), failure_class=str(failure.kind),
            evidence=(failure.excerpt or failure.summary)[:500], podUID=found.evidence.pod_uid,
            restart_count=found.evidence.restart_count, flags_before=dict(_flags(observed.status)),
            flags_after=desired.plan.flags, message=decision.message, profile_before=dict(before.profile))
        recorded = stepped.model_copy(update={"history": [*before.history, entry]})
        status = cond.fold_status(desired.status, conditions=[cond.ConditionUpdate(
            cond.DEGRADED, cond.TRUE, cond.REMEDIATING, f"step {recorded.step}: {decision.message}")],
            observed_generation=observed.generation, now=observed.now, remediation=recorded)
        return Outcome("step", status, decision.message, str(failure.kind), desired.children,
                       [step_event(entry)], entry, desired.plan, decision)
    return _verdict(observed, decision, failure, key)


def _flags(status: Mapping[str, Any]) -> Mapping[str, Any]:
    return flags_from_api((status.get("plan") or {}).get("flags")) or {}


def _handled(remediation: RemediationStatus, key: str) -> list[str]:
    return [*[k for k in remediation.handled_keys if k != key], key][-HANDLED_KEYS_KEPT:]


def _verdict(observed: Observed, decision: Decision, failure: Failure, key: str) -> Outcome:
    remediation = remediation_of(observed.status)
    exhausted = decision.action is Action.EXHAUSTED
    remediation = remediation.model_copy(update={"last_failure_key": key, "handled_keys": _handled(remediation, key),
                                                 "exhausted": exhausted})
    if exhausted:
        update = cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, cond.REMEDIATION_EXHAUSTED, decision.message)
        reason = cond.REMEDIATION_EXHAUSTED
    else:
        update = cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, surface_reason(failure), decision.message)
        reason = f"PodFailed{failure.kind}"
    status = cond.fold_status(dict(observed.status), conditions=[update], observed_generation=observed.generation,
                              now=observed.now, remediation=remediation)
    return Outcome("verdict" if exhausted else "surface", status, decision.message, str(failure.kind),
                   events=[Event("Warning", reason, decision.message)], decision=decision)


def _remember(observed: Observed, key: str) -> Outcome:
    remediation = remediation_of(observed.status)
    remediation = remediation.model_copy(update={"last_failure_key": key, "handled_keys": _handled(remediation, key)})
    generation = observed.status.get("observedGeneration")
    status = cond.fold_status(dict(observed.status), observed_generation=int(generation) if generation else None,
                              now=observed.now, remediation=remediation)
    return Outcome("remember", status, f"failure {key}: the verdict stands")


def surface_reason(failure: Failure) -> str:
    return {"ImagePull": cond.IMAGE_PULL_FAILED, "HostOOMKilled": cond.CONTAINER_OOM_KILLED}.get(
        str(failure.kind), cond.CONTAINER_CRASH_LOOP_BACK_OFF)


def step_event(entry: RemediationEvent) -> Event:
    """The Event announcing a recorded history entry — a function of the entry alone, so a retry or a restarted
    operator posts the very same Event (and can tell whether it was posted)."""
    if entry.failure_class == STEP_UP:
        return Event("Normal", "SteppedUp", entry.message)
    reason = CHANGE_REASONS.get(entry.failure_class, f"Remediated{entry.failure_class}")
    evidence = f" Evidence: {entry.evidence[:300]}" if entry.evidence else ""
    return Event("Warning", reason, f"step {entry.step}: {entry.message}.{evidence}")


#: The Event reasons of profile changes not caused by a pod failure, by failure class (metrics.policy's classes).
CHANGE_REASONS: Mapping[str, str] = {"SustainedPreemption": "MaxNumSeqsLowered"}


def _change_profile(observed: Observed, spec: VLLMServiceSpec, change: ProfileChange) -> Outcome | None:
    if not spec.remediation.enabled:
        return None
    before = remediation_of(observed.status)
    if before.step >= spec.remediation.max_steps:
        return None
    learned = profile_constraints(before.profile)
    updates = dict(change.changes)
    if "max_num_seqs" in updates and learned.max_num_seqs is not None:
        updates["max_num_seqs"] = min(int(updates["max_num_seqs"]), learned.max_num_seqs)
    stepped = before.model_copy(update={"step": before.step + 1, "exhausted": False,
                                        "profile": constraints_to_profile(learned.model_copy(update=updates))})
    desired = _replan(observed, stepped)
    if desired.plan is None or not desired.plan.fits or desired.children is None:
        return None
    flags_before = dict(_flags(observed.status))
    if change.lowers:
        after, was = desired.plan.flags.get(change.lowers), flags_before.get(change.lowers)
        if not isinstance(after, int) or (isinstance(was, int) and after >= was):
            return None
    entry = RemediationEvent(step=stepped.step, time=cond.format_time(observed.now),
                             failure_class=change.failure_class, evidence=change.evidence[:500],
                             flags_before=flags_before, flags_after=desired.plan.flags, message=change.message,
                             profile_before=dict(before.profile))
    recorded = stepped.model_copy(update={"history": [*before.history, entry]})
    status = cond.fold_status(desired.status, conditions=list(change.conditions),
                              observed_generation=observed.generation, now=observed.now, remediation=recorded,
                              **dict(change.status_changes))
    return Outcome("step", status, change.message, change.failure_class, desired.children, [step_event(entry)],
                   entry, desired.plan)


def step_up_target(spec: VLLMServiceSpec, status: Mapping[str, Any],
                   now: datetime) -> tuple[dict[str, Any], RemediationEvent] | None:
    """The profile a step back would restore (the one before the last step down), once per profile, after the
    stable window; None when not allowed or not due."""
    if not (spec.remediation.allow_step_up and spec.remediation.enabled):
        return None
    remediation = remediation_of(status)
    if not remediation.profile or not remediation.history:
        return None
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == cond.READY), None)
    if not ready or ready.get("status") != cond.TRUE:
        return None
    last = remediation.history[-1]
    times = [t for t in (parse_time(ready.get("lastTransitionTime")), parse_time(last.time)) if t is not None]
    if not times or (now - max(times)).total_seconds() < spec.remediation.stable_window_seconds:
        return None
    # entries that only scaled replicas or advised (metrics watch) did not change the profile
    steps = [h for h in remediation.history if h.failure_class != STEP_UP and set(h.flags_before) != {"replicas"}
             and "recommended_replicas" not in h.flags_after]
    if not steps:
        return None
    restore = dict(steps[-1].profile_before)
    tried = [h.profile_before for h in remediation.history if h.failure_class == STEP_UP]
    if restore in tried or restore == dict(remediation.profile):
        return None
    return restore, steps[-1]


def _step_up(observed: Observed, spec: VLLMServiceSpec) -> Outcome | None:
    target = step_up_target(spec, observed.status, observed.now)
    if target is None:
        return None
    profile, undone = target
    before = remediation_of(observed.status)
    stepped = before.model_copy(update={"step": max(before.step - 1, 0), "profile": profile})
    desired = _replan(observed, stepped)
    if desired.plan is None or not desired.plan.fits or desired.children is None:
        return None
    message = (f"stable for {spec.remediation.stable_window_seconds}s: stepping back from step "
               f"{before.step} ({undone.message})")
    entry = RemediationEvent(step=stepped.step, time=cond.format_time(observed.now), failure_class=STEP_UP,
                             evidence="", flags_before=dict(_flags(observed.status)), flags_after=desired.plan.flags,
                             message=message, profile_before=profile)
    recorded = stepped.model_copy(update={"history": [*before.history, entry]})
    status = cond.fold_status(desired.status, observed_generation=observed.generation, now=observed.now,
                              remediation=recorded)
    return Outcome("step_up", status, message, STEP_UP, desired.children, [step_event(entry)], entry, desired.plan)


def unannounced(status: Mapping[str, Any], now: datetime) -> list[RemediationEvent]:
    """Recorded history entries recent enough that their Event must be checked for (and posted when missing)."""
    remediation = remediation_of(status)
    out = []
    for entry in remediation.history:
        when = parse_time(entry.time)
        if when is not None and now - when <= ANNOUNCE_WINDOW and entry.flags_after and \
                "recommended_replicas" not in entry.flags_after and set(entry.flags_before) != {"replicas"}:
            out.append(entry)
    return out
