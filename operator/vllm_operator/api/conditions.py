"""Condition types and reasons of a VLLMService, and pure helpers to update and fold its status.

Everything here is a pure function of its arguments (time is passed in), so handlers can compute the new
status, compare it with the old one, and write only when something changed.

Conventions, as in Kubernetes' `metav1.Condition`:

* `lastTransitionTime` moves only when a condition's `status` changes; a new reason or message alone
  does not move it.
* Each condition records the `observedGeneration` of the spec it was computed from.
* Reasons are CamelCase constants from this module, never free text; the message carries the detail.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from vllm_operator.api.times import format_time
from vllm_operator.api.v1alpha1 import Condition, VLLMServiceStatus

__all__ = [
    "ALL_REASONS",
    "CONDITION_TYPES",
    "FEATURE_CONDITION_TYPES",
    "ConditionStatus",
    "ConditionUpdate",
    "find_condition",
    "fold_conditions",
    "fold_status",
    "format_time",
    "is_true",
    "set_condition",
    "status_patch",
]

ConditionStatus = Literal["True", "False", "Unknown"]

TRUE: Final = "True"
FALSE: Final = "False"
UNKNOWN: Final = "Unknown"

# --------------------------------------------------------------------------------------------------
# Condition types
# --------------------------------------------------------------------------------------------------

#: The model is served: at least the desired number of pods is ready (or replicas is 0).
READY: Final = "Ready"
#: The operator is moving toward the desired state: rolling out, planning, or remediating.
PROGRESSING: Final = "Progressing"
#: Something needs a person: invalid spec, no plan fits, or remediation gave up.
DEGRADED: Final = "Degraded"
#: The model and workload fit the GPUs with the planned flags.
PLAN_FEASIBLE: Final = "PlanFeasible"

#: vLLM's metrics could be read from Prometheus (set only when spec.prometheus.enabled).
METRICS_AVAILABLE: Final = "MetricsAvailable"
#: Planning the spec stopped at the operator's work budget (issue 20; planner/budget.py): the message names the spec
#: field that made it expensive. Set only once a spec has hit the budget (False again when it no longer does).
PLAN_BUDGET: Final = "PlanBudget"
CONDITION_TYPES: Final[tuple[str, ...]] = (READY, PROGRESSING, DEGRADED, PLAN_FEASIBLE, METRICS_AVAILABLE, PLAN_BUDGET)

#: The model cache: True on a claim (reason PersistentVolumeClaim), False on an emptyDir (reason Ephemeral).
MODEL_CACHE: Final = "ModelCache"
#: spec.autoscaling: which autoscaler is rendered (reason its kind), or why none is.
AUTOSCALING: Final = "Autoscaling"
#: spec.routing.inferencePool: the InferencePool is rendered, or why it is not.
INFERENCE_POOL: Final = "InferencePool"
#: spec.gpu.share: how the GPU is shared (DRA, or time-slicing without memory isolation).
GPU_SHARED: Final = "GPUShared"
#: False while spec.env / spec.extraArgs carry a literal secret (reason LiteralSecret).
SECRETS_BY_REFERENCE: Final = "SecretsByReference"
#: True while a child's name is taken by an object this service does not own (reason NameConflict).
NAME_CONFLICT: Final = "NameConflict"
#: The condition types set only when a feature asks for them.
FEATURE_CONDITION_TYPES: Final[tuple[str, ...]] = (MODEL_CACHE, AUTOSCALING, INFERENCE_POOL, GPU_SHARED,
                                                   SECRETS_BY_REFERENCE, NAME_CONFLICT)

# --------------------------------------------------------------------------------------------------
# Reasons
# --------------------------------------------------------------------------------------------------

# Planning (PlanFeasible, and Degraded when it fails)
PLAN_FITS: Final = "PlanFits"
PLAN_INFEASIBLE: Final = "PlanInfeasible"
#: The plan fits, for the newest known vLLM release: the image reference names none (digest, mirror tag, latest).
VERSION_ASSUMED: Final = "VersionAssumed"
INVALID_SPEC: Final = "InvalidSpec"
GPU_NOT_FOUND: Final = "GPUNotFound"
MODEL_NOT_FOUND: Final = "ModelNotFound"

# Rollout (Ready, Progressing)
DEPLOYING: Final = "Deploying"
AVAILABLE: Final = "Available"
PODS_NOT_READY: Final = "PodsNotReady"
SCALED_TO_ZERO: Final = "ScaledToZero"
ROLLOUT_COMPLETE: Final = "RolloutComplete"
#: Pods of an earlier template still serve while the current one is not ready (Ready=False).
SERVING_PREVIOUS_PROFILE: Final = "ServingPreviousProfile"
#: The Deployment's own Progressing condition says the rollout ran past progressDeadlineSeconds.
PROGRESS_DEADLINE_EXCEEDED: Final = "ProgressDeadlineExceeded"
#: A rollout without a surge pod (no spare GPUs for one): Event reason.
ROLLING_WITHOUT_SURGE: Final = "RollingWithoutSurge"
#: A pod of the current profile is filling the model cache (its `model-download` init container runs): Progressing.
DOWNLOADING: Final = "Downloading"
#: A pod's `model-download` init container failed (gated model without a token, no such model, disk full) or cannot
#: start: Degraded. Not a vLLM failure: the remediation ladder never answers it with a memory step.
MODEL_DOWNLOAD_FAILED: Final = "ModelDownloadFailed"

# Remediation (Progressing, Degraded)
REMEDIATING: Final = "Remediating"
REMEDIATION_EXHAUSTED: Final = "RemediationExhausted"

# A vLLM pod failed (Degraded): the failure's own kind is in status.remediation and in the Event's reason,
# `PodFailed<FailureKind>` (planner.failures)
CONTAINER_OOM_KILLED: Final = "ContainerOOMKilled"
CONTAINER_CRASH_LOOP_BACK_OFF: Final = "ContainerCrashLoopBackOff"
IMAGE_PULL_FAILED: Final = "ImagePullFailed"
UNSCHEDULABLE: Final = "Unschedulable"

# The operator's own trouble (Degraded): an unexpected error while reconciling, a child the API server refused
RECONCILE_ERROR: Final = "ReconcileError"
CHILD_REJECTED: Final = "ChildRejected"

# Multi-node serving (issue 13): the LeaderWorkerSet engine is missing, the image's vLLM lacks the native
# multi-node flags, or too few nodes of the pool exist for one group
LWS_NOT_INSTALLED: Final = "LeaderWorkerSetNotInstalled"
MULTI_NODE_UNSUPPORTED: Final = "MultiNodeUnsupported"
INSUFFICIENT_NODES: Final = "InsufficientNodes"
GROUP_RECREATIONS_EXHAUSTED: Final = "GroupRecreationsExhausted"

# Share groups (issue 26): the cluster cannot share a GPU (no DRA driver, no time-slicing), or the member has no
# place in its group's plan
GPU_SHARING_UNAVAILABLE: Final = "GPUSharingUnavailable"
SHARE_DOES_NOT_FIT: Final = "ShareDoesNotFit"
#: Progressing: a share-group member's pods wait (0 replicas) for a neighbour earlier in its GPU's start order
WAITING_FOR_NEIGHBOUR: Final = "WaitingForNeighbour"

# Planning work (PlanBudget): the spec's planning stopped at the work budget, or no longer does
OVER_BUDGET: Final = "OverBudget"
WITHIN_BUDGET: Final = "WithinBudget"

# The metrics watch (MetricsAvailable)
METRICS_OBSERVED: Final = "MetricsObserved"
PROMETHEUS_UNREACHABLE: Final = "PrometheusUnreachable"
NO_METRICS_FOUND: Final = "NoMetricsFound"
METRICS_DISABLED: Final = "MetricsDisabled"
METRICS_REASONS: Final = (METRICS_OBSERVED, PROMETHEUS_UNREACHABLE, NO_METRICS_FOUND, METRICS_DISABLED)

# The model cache (ModelCache): a claim, or an emptyDir that each start fills again
PERSISTENT_CACHE: Final = "PersistentVolumeClaim"
EPHEMERAL_CACHE: Final = "Ephemeral"
CACHE_CLAIM_NOT_FOUND: Final = "ClaimNotFound"  # spec.modelCache.claimName names no claim
CACHE_CLAIM_NOT_SHARED: Final = "ClaimNotShared"  # a ReadWriteOnce(Pod) claimName, several pods

# Autoscaling and InferencePool: the autoscaler's kind, the pool rendered, the CRD missing, the feature off
HPA_RENDERED: Final = "HorizontalPodAutoscaler"
KEDA_RENDERED: Final = "ScaledObject"
INFERENCE_POOL_RENDERED: Final = "InferencePoolRendered"
CRD_NOT_INSTALLED: Final = "CRDNotInstalled"
NOT_CONFIGURED: Final = "NotConfigured"

# Share groups (GPUShared): how the GPU is shared
SHARED_BY_DRA: Final = "SharedByDRA"
MEMORY_NOT_ISOLATED: Final = "MemoryNotIsolated"

# No outage on an edit (Progressing): the rollout waits for a free GPU, or says beforehand that it interrupts
ROLLOUT_HELD: Final = "RolloutHeld"
ROLLOUT_INTERRUPTS: Final = "RolloutInterrupts"

# Literal secrets (SecretsByReference), children of another owner (NameConflict)
LITERAL_SECRET: Final = "LiteralSecret"
NO_CONFLICT: Final = "NoConflict"

# A failure the core did not foresee (a bug): the service still gets an answer, never a crash loop (Degraded)
INTERNAL_ERROR: Final = "InternalError"

#: vLLM's `--max-model-len auto` started with a shorter context than the plan expected: Event reason
#: (remediation/kvcache.context_reduced; status.kvCache.maxModelLen says it too).
CONTEXT_REDUCED: Final = "ContextReducedByVLLM"

# Healthy
AS_EXPECTED: Final = "AsExpected"

ALL_REASONS: Final[tuple[str, ...]] = (
    OVER_BUDGET,
    WITHIN_BUDGET,
    GPU_SHARING_UNAVAILABLE,
    SHARE_DOES_NOT_FIT,
    WAITING_FOR_NEIGHBOUR,
    LWS_NOT_INSTALLED,
    MULTI_NODE_UNSUPPORTED,
    INSUFFICIENT_NODES,
    GROUP_RECREATIONS_EXHAUSTED,
    PLAN_FITS,
    PLAN_INFEASIBLE,
    VERSION_ASSUMED,
    INVALID_SPEC,
    GPU_NOT_FOUND,
    MODEL_NOT_FOUND,
    DEPLOYING,
    AVAILABLE,
    PODS_NOT_READY,
    SCALED_TO_ZERO,
    ROLLOUT_COMPLETE,
    SERVING_PREVIOUS_PROFILE,
    PROGRESS_DEADLINE_EXCEEDED,
    ROLLING_WITHOUT_SURGE,
    DOWNLOADING,
    MODEL_DOWNLOAD_FAILED,
    REMEDIATING,
    REMEDIATION_EXHAUSTED,
    CONTAINER_OOM_KILLED,
    CONTAINER_CRASH_LOOP_BACK_OFF,
    IMAGE_PULL_FAILED,
    UNSCHEDULABLE,
    RECONCILE_ERROR,
    CHILD_REJECTED,
    *METRICS_REASONS,
    PERSISTENT_CACHE,
    EPHEMERAL_CACHE,
    CACHE_CLAIM_NOT_FOUND,
    CACHE_CLAIM_NOT_SHARED,
    HPA_RENDERED,
    KEDA_RENDERED,
    INFERENCE_POOL_RENDERED,
    CRD_NOT_INSTALLED,
    NOT_CONFIGURED,
    SHARED_BY_DRA,
    MEMORY_NOT_ISOLATED,
    ROLLOUT_HELD,
    ROLLOUT_INTERRUPTS,
    LITERAL_SECRET,
    NAME_CONFLICT,
    NO_CONFLICT,
    INTERNAL_ERROR,
    AS_EXPECTED,
)

#: Kubernetes caps a condition message at 32768 characters.
MAX_MESSAGE_LENGTH: Final = 32768


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConditionUpdate:
    """The desired state of one condition, without the bookkeeping fields."""

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""


def find_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    """The condition of this type, or None."""
    return next((c for c in conditions if c.type == type_), None)


def is_true(conditions: Iterable[Condition], type_: str) -> bool:
    """Whether the condition of this type exists and is True."""
    found = find_condition(conditions, type_)
    return found is not None and found.status == TRUE


def _truncate(message: str) -> str:
    if len(message) <= MAX_MESSAGE_LENGTH:
        return message
    return message[: MAX_MESSAGE_LENGTH - 3] + "..."


def set_condition(
    conditions: Sequence[Condition],
    update: ConditionUpdate,
    *,
    observed_generation: int | None,
    now: datetime,
) -> list[Condition]:
    """A new list with `update` applied; the input is not modified.

    An existing condition keeps its position and its `lastTransitionTime` unless its status changes;
    a new condition is appended with `lastTransitionTime = now`.
    """
    new_list: list[Condition] = []
    replaced = False
    for current in conditions:
        if current.type != update.type:
            new_list.append(current)
            continue
        replaced = True
        transition = current.last_transition_time if current.status == update.status else format_time(now)
        new_list.append(
            Condition(
                type=update.type,
                status=update.status,
                reason=update.reason,
                message=_truncate(update.message),
                observed_generation=observed_generation,
                last_transition_time=transition,
            )
        )
    if not replaced:
        new_list.append(
            Condition(
                type=update.type,
                status=update.status,
                reason=update.reason,
                message=_truncate(update.message),
                observed_generation=observed_generation,
                last_transition_time=format_time(now),
            )
        )
    return new_list


def fold_conditions(
    conditions: Sequence[Condition],
    updates: Iterable[ConditionUpdate],
    *,
    observed_generation: int | None,
    now: datetime,
) -> list[Condition]:
    """Apply `updates` in order with `set_condition` (a later update of the same type wins)."""
    result = list(conditions)
    for update in updates:
        result = set_condition(result, update, observed_generation=observed_generation, now=now)
    return result


def fold_status(
    status: VLLMServiceStatus | Mapping[str, Any] | None,
    *,
    conditions: Iterable[ConditionUpdate] = (),
    observed_generation: int | None,
    now: datetime,
    **changes: Any,
) -> VLLMServiceStatus:
    """The next status: `status` with condition updates folded in and the given fields replaced.

    `status` may be the model, the raw dict from the API (kopf's `status` argument) or None. `changes` are
    VLLMServiceStatus fields by their Python name (`plan=PlanStatus(...)`, `ready_replicas=2`); passing
    None clears a field. `observedGeneration` is set to `observed_generation`. The input is not modified.
    """
    current = _as_status(status)
    unknown = set(changes) - set(VLLMServiceStatus.model_fields)
    if unknown:
        raise TypeError(f"not VLLMServiceStatus fields: {', '.join(sorted(unknown))}")
    folded = fold_conditions(current.conditions, conditions, observed_generation=observed_generation, now=now)
    data = {name: getattr(current, name) for name in VLLMServiceStatus.model_fields}
    data.update(changes)
    data["conditions"] = folded
    data["observed_generation"] = observed_generation
    remediation = data.get("remediation")
    data["state"] = state_of(folded, exhausted=bool(remediation is not None and remediation.exhausted))
    return VLLMServiceStatus.model_validate(data)


#: `status.state` values (the STATUS column of `kubectl get vllms`) besides the Degraded reasons shown as they are.
STATE_READY: Final = "Ready"
STATE_ROLLING_OUT: Final = "RollingOut"
STATE_DOWNLOADING: Final = DOWNLOADING
STATE_PENDING: Final = "Pending"
STATE_SCALED_TO_ZERO: Final = "ScaledToZero"
STATE_INFEASIBLE: Final = "Infeasible"

#: Degraded reasons that name the state outright, most pressing first.
_STATE_BY_DEGRADED: Final[dict[str, str]] = {
    INVALID_SPEC: INVALID_SPEC,
    PLAN_INFEASIBLE: STATE_INFEASIBLE,
    GPU_SHARING_UNAVAILABLE: GPU_SHARING_UNAVAILABLE,
    SHARE_DOES_NOT_FIT: STATE_INFEASIBLE,
    MODEL_NOT_FOUND: MODEL_NOT_FOUND,
    GPU_NOT_FOUND: GPU_NOT_FOUND,
    CHILD_REJECTED: CHILD_REJECTED,
    RECONCILE_ERROR: RECONCILE_ERROR,
    REMEDIATION_EXHAUSTED: REMEDIATION_EXHAUSTED,
    UNSCHEDULABLE: UNSCHEDULABLE,
    PROGRESS_DEADLINE_EXCEEDED: PROGRESS_DEADLINE_EXCEEDED,
    MODEL_DOWNLOAD_FAILED: MODEL_DOWNLOAD_FAILED,
    REMEDIATING: REMEDIATING,
}


def state_of(conditions: Sequence[Condition], *, exhausted: bool = False) -> str:
    """One word for the STATUS column, read like `kubectl get pods`: what is wrong when something is (the Degraded
    reason: InvalidSpec, Infeasible, ModelNotFound, RemediationExhausted, Unschedulable, ModelDownloadFailed,
    Remediating, a pod failure such as ContainerCrashLoopBackOff), else Ready / ScaledToZero / Downloading (a pod of
    the current profile fills the model cache) / RollingOut, or Pending before the operator said anything."""
    degraded = find_condition(conditions, DEGRADED)
    if exhausted:
        return REMEDIATION_EXHAUSTED
    if degraded is not None and degraded.status == TRUE:
        return _STATE_BY_DEGRADED.get(degraded.reason, degraded.reason)
    ready = find_condition(conditions, READY)
    if ready is not None and ready.status == TRUE:
        return STATE_SCALED_TO_ZERO if ready.reason == SCALED_TO_ZERO else STATE_READY
    progressing = find_condition(conditions, PROGRESSING)
    if progressing is not None and progressing.status == TRUE and progressing.reason == DOWNLOADING:
        return STATE_DOWNLOADING
    if ready is not None or progressing is not None:
        return STATE_ROLLING_OUT
    return STATE_PENDING


def _as_status(status: VLLMServiceStatus | Mapping[str, Any] | None) -> VLLMServiceStatus:
    if status is None:
        return VLLMServiceStatus()
    if isinstance(status, VLLMServiceStatus):
        return status
    return VLLMServiceStatus.model_validate(dict(status))


def _merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch turning `old` into `new` (lists are replaced whole)."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = _merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif key not in old or before != value:
            patch[key] = value
    return patch


def status_patch(old: VLLMServiceStatus | Mapping[str, Any] | None, new: VLLMServiceStatus) -> dict[str, Any]:
    """A JSON merge patch for the status subresource turning `old` into `new`; `{}` when nothing changed.

    Both sides are compared as parsed models, so formatting differences in what the API returns (80 vs
    80.0) do not count as changes. kopf's own bookkeeping under `status.kopf`, and any field this model
    does not know, are left alone.
    """
    old_dict = _as_status(old).to_dict()
    old_dict.pop("kopf", None)
    new_dict = new.to_dict()
    new_dict.pop("kopf", None)
    patch = _merge_patch(old_dict, new_dict)
    if isinstance(old, Mapping):
        _respell(old, new_dict, patch)
    return patch


#: Where status holds flag maps (dicts, and lists of entries holding them): keys once written in vLLM's
#: snake_case (`max_model_len`), camelCase (`maxModelLen`) since v1alpha1 follows the API conventions.
_FLAG_MAPS = (("plan", "flags"), ("remediation", "profile"))
_FLAG_MAP_LISTS = (("plan", "options"), ("remediation", "history"))


def _respell(raw: Mapping[str, Any], new: Mapping[str, Any], patch: dict[str, Any]) -> None:
    """Drop flag-map keys an older operator stored in snake_case: parsed, they read the same as the new
    camelCase keys, so the model diff alone would leave both spellings in the stored object."""
    for parent, field in _FLAG_MAPS:
        stored, wanted = _at(raw, parent, field), _at(new, parent, field)
        if isinstance(stored, Mapping) and isinstance(wanted, Mapping) and stored.keys() - wanted.keys():
            patch.setdefault(parent, {})[field] = {**dict.fromkeys(stored.keys() - wanted.keys()), **wanted}
    for parent, field in _FLAG_MAP_LISTS:
        stored, wanted = _at(raw, parent, field), _at(new, parent, field)
        if isinstance(stored, list) and isinstance(wanted, list) and any(map(_snake_flags, stored)):
            patch.setdefault(parent, {})[field] = wanted


def _snake_flags(entry: Any) -> bool:
    """A history entry or plan option with a flag map keyed the old way."""
    if not isinstance(entry, Mapping):
        return False
    maps = (entry.get(name) for name in ("flags", "flagsBefore", "flagsAfter", "profileBefore"))
    return any(isinstance(m, Mapping) and any("_" in str(key) for key in m) for m in maps)


def _at(status: Mapping[str, Any], parent: str, field: str) -> Any:
    section = status.get(parent)
    return section.get(field) if isinstance(section, Mapping) else None
