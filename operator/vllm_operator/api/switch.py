"""A switch between workload kinds (Deployment, LeaderWorkerSet, StatefulSet) as a sequence of recorded steps, and
which workload says whether the service serves while two exist (pure).

A service runs on exactly one workload kind: a Deployment; a LeaderWorkerSet when one replica spans nodes, or when
each pod needs a cache claim of its own and the LeaderWorkerSet API is served (render/cache.py: several pods on
ReadWriteOnce storage, one pod per group); a StatefulSet for such a claim per pod where that API is not served. When
its plan changes kind the switch makes before it breaks, one idempotent step at a time, each recorded in
`status.workloadSwitch` *before* it acts, so that a process killed at any point resumes from what the API shows:

1. `CreateTarget` — recorded together with the plan that chose the new kind (the reconcile's status), then the new
   workload is created;
2. `WaitReady` — the new workload exists; the Service and InferencePool still address the previous one's pods;
3. `SwitchAddressing` — the new workload is Ready: the Service and InferencePool move to its pods;
4. `DeletePrevious` — nothing addresses the previous workload any more: it is deleted;

then the record is cleared. `next_step` decides the step from what exists, never from the record itself (the record
says what was about to happen; the API says what did).

`api.serving.serving` decides Ready while both workloads exist, from this record and `target_kind`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Kind = Literal["Deployment", "LeaderWorkerSet", "StatefulSet"]
WORKLOADS: Final[tuple[Kind, Kind, Kind]] = ("Deployment", "LeaderWorkerSet", "StatefulSet")

CREATE_TARGET: Final = "CreateTarget"
WAIT_READY: Final = "WaitReady"
SWITCH_ADDRESSING: Final = "SwitchAddressing"
DELETE_PREVIOUS: Final = "DeletePrevious"
STEPS: Final = (CREATE_TARGET, WAIT_READY, SWITCH_ADDRESSING, DELETE_PREVIOUS)


class WorkloadSwitch(BaseModel):
    """`status.workloadSwitch`: a switch between workload kinds under way, and its step."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    previous: Kind = Field(description="The workload kind that served before the switch (kept until the new one is "
                                       "Ready and addressed).")
    target: Kind = Field(description="The workload kind the current plan runs on.")
    step: Literal["CreateTarget", "WaitReady", "SwitchAddressing", "DeletePrevious"] = Field(
        description="The step recorded before it acts: CreateTarget, WaitReady, SwitchAddressing (the Service and "
                    "InferencePool move to the new workload's pods), DeletePrevious.")


def others(kind: str) -> tuple[Kind, ...]:
    """The workload kinds a service running on `kind` may switch from (to `kind`)."""
    return tuple(k for k in WORKLOADS if k != kind)


def next_step(*, previous_exists: bool, target_applied: bool, target_ready: bool,
              addressing_moved: bool) -> str | None:
    """The step a switch takes next, from what the API shows; None: no switch (or it is complete).

    `target_applied`: the new workload exists as rendered (its spec hash); `target_ready`: it serves with all its
    replicas; `addressing_moved`: every Service/InferencePool is applied as rendered for the new workload."""
    if not previous_exists:
        return None
    if not target_applied:
        return CREATE_TARGET
    if not target_ready:
        return WAIT_READY
    if not addressing_moved:
        return SWITCH_ADDRESSING
    return DELETE_PREVIOUS


def record(previous: str, target: str, step: str | None) -> WorkloadSwitch | None:
    """The status record of a step (None once the switch is complete)."""
    if step is None:
        return None
    return WorkloadSwitch.model_validate({"previous": previous, "target": target, "step": step})


def target_kind(status: Mapping[str, Any]) -> Kind:
    """The workload kind the recorded plan runs on: `status.workload` as the reconcile recorded it (a LeaderWorkerSet
    when one replica spans nodes, or when each pod needs a cache claim of its own; a StatefulSet for that claim where
    the LeaderWorkerSet API is not served); for a status written before that field existed, a LeaderWorkerSet exactly
    when the status has `multiNode`."""
    kind = status.get("workload")
    for known in WORKLOADS:
        if kind == known:
            return known
    return "LeaderWorkerSet" if status.get("multiNode") else "Deployment"


def recorded(status: Mapping[str, Any]) -> WorkloadSwitch | None:
    """The switch recorded in a status as stored (None: none, or one this operator version cannot read)."""
    raw = status.get("workloadSwitch")
    if not isinstance(raw, Mapping):
        return None
    try:
        return WorkloadSwitch.model_validate(raw)
    except ValueError:
        return None
