"""What a failed vLLM container left behind, as typed evidence for the classifier.

`ContainerEvidence` is the one input of `remediation.classifier.classify`: the container's state as the kubelet
reports it (waiting/terminated reasons, exit code, termination message, restarts) plus, optionally, the tail of its
log that the caller fetched. `evidence_from_pod` reads it out of a Pod exactly as the Kubernetes API returns it
(camelCase JSON, e.g. `kubernetes.client.ApiClient().sanitize_for_serialization(pod)` or a kopf body), tolerating
missing fields. Pure: plain mappings in, frozen models out; no Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..api.times import parse_time
from .redact import redact

__all__ = ["ContainerEvidence", "evidence_from_pod"]


class ContainerEvidence(BaseModel):
    """One container of one pod, as far as its failure is concerned."""

    model_config = ConfigDict(frozen=True)

    pod_name: str = ""
    pod_uid: str = ""
    namespace: str = ""
    container_name: str = "vllm"
    init_container: bool = Field(False, description="the status came from initContainerStatuses")
    image: str | None = Field(None, description="the image the container runs (its tag often names the vLLM release)")
    restart_count: int = 0
    ready: bool = False
    was_ready_before: bool | None = Field(
        None,
        description="whether the container had become Ready in the run that died (None: unknown); separates an OOM "
        "while serving from one at startup",
    )
    waiting_reason: str | None = Field(None, description="state.waiting.reason, e.g. CrashLoopBackOff, ImagePullBackOff")
    waiting_message: str | None = Field(None, description="state.waiting.message")
    terminated_reason: str | None = Field(None, description="terminated.reason of the last run: Error, OOMKilled, ...")
    exit_code: int | None = None
    signal: int | None = None
    termination_message: str = Field(
        "", description="terminated.message: the termination-message file, or the log tail with FallbackToLogsOnError"
    )
    log_tail: str | None = Field(None, description="the last lines of the container's log, when the caller fetched them")
    started_at: datetime | None = None
    finished_at: datetime | None = None
    pod_phase: str | None = None
    pod_reason: str | None = Field(None, description="status.reason of the pod, e.g. Evicted")
    pod_message: str | None = None


    @field_validator("waiting_message", "termination_message", "log_tail", "pod_message", mode="before")
    @classmethod
    def _redacted(cls, value: Any) -> Any:
        """Text from vLLM ends in Events, conditions, status and the log: no token-shaped string survives."""
        return redact(value) if isinstance(value, str) else value

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> ContainerEvidence:
        """As pydantic's, but text put in by `update` (e.g. a log tail the shell fetched) is redacted too."""
        if update:
            update = {key: redact(value) if key in _TEXT_FIELDS and isinstance(value, str) else value
                      for key, value in update.items()}
        return super().model_copy(update=update, deep=deep)


_TEXT_FIELDS = frozenset({"waiting_message", "termination_message", "log_tail", "pod_message"})


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value != "" else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _condition_since(pod: Mapping[str, Any], kind: str) -> tuple[str | None, datetime | None]:
    for cond in _mapping(pod.get("status")).get("conditions") or ():
        cond = _mapping(cond)
        if cond.get("type") == kind:
            return _str(cond.get("status")), parse_time(cond.get("lastTransitionTime"))
    return None, None


def _infer_was_ready_before(
    pod: Mapping[str, Any], *, ready: bool, started_at: datetime | None, finished_at: datetime | None
) -> bool | None:
    """Whether the run that ended at `finished_at` had become Ready, from the pod's readiness condition.

    The pod's `ContainersReady` (else `Ready`) condition keeps only its latest transition. If it is False now and
    turned False *after* the dead run started, it must have been True during that run (it went True, then False
    when the container died); if it has been False since before the run started, the run never became Ready.
    Exact for single-container pods; None when the timestamps are missing or the condition is True.
    """
    if ready or started_at is None or finished_at is None:
        return None
    status, since = _condition_since(pod, "ContainersReady")
    if status is None:
        status, since = _condition_since(pod, "Ready")
    if status != "False" or since is None:
        return None
    try:
        return since > started_at
    except TypeError:  # naive vs aware datetimes
        return None


def _one(
    pod: Mapping[str, Any], status: Mapping[str, Any], *, init_container: bool, was_ready_before: bool | None
) -> ContainerEvidence:
    meta = _mapping(pod.get("metadata"))
    pod_status = _mapping(pod.get("status"))
    state = _mapping(status.get("state"))
    last = _mapping(status.get("lastState"))
    waiting = _mapping(state.get("waiting"))
    # A container that is terminated right now (restartPolicy Never, or between death and restart) reports it in
    # `state`; one in CrashLoopBackOff reports the run that died in `lastState`.
    terminated = _mapping(state.get("terminated")) or _mapping(last.get("terminated"))
    ready = status.get("ready") is True
    started_at = parse_time(terminated.get("startedAt"))
    finished_at = parse_time(terminated.get("finishedAt"))
    if was_ready_before is None and terminated:
        was_ready_before = _infer_was_ready_before(pod, ready=ready, started_at=started_at, finished_at=finished_at)
    return ContainerEvidence(
        pod_name=_str(meta.get("name")) or "",
        pod_uid=_str(meta.get("uid")) or "",
        namespace=_str(meta.get("namespace")) or "",
        container_name=_str(status.get("name")) or "",
        init_container=init_container,
        image=_str(status.get("image")),
        restart_count=_int(status.get("restartCount")) or 0,
        ready=ready,
        was_ready_before=was_ready_before,
        waiting_reason=_str(waiting.get("reason")),
        waiting_message=_str(waiting.get("message")),
        terminated_reason=_str(terminated.get("reason")),
        exit_code=_int(terminated.get("exitCode")),
        signal=_int(terminated.get("signal")),
        termination_message=_str(terminated.get("message")) or "",
        started_at=started_at,
        finished_at=finished_at,
        pod_phase=_str(pod_status.get("phase")),
        pod_reason=_str(pod_status.get("reason")),
        pod_message=_str(pod_status.get("message")),
    )


def evidence_from_pod(
    pod: Mapping[str, Any],
    container: str | None = "vllm",
    *,
    log_tail: str | None = None,
    was_ready_before: bool | None = None,
) -> list[ContainerEvidence]:
    """Evidence for `container` of `pod` (a Pod as the API returns it: camelCase keys).

    `container=None` returns every container and init container that has a status. A container without a status
    yet (pod pending, not scheduled) gives no evidence: the result is then empty. `log_tail` (the caller's
    `read_namespaced_pod_log(..., previous=True)`) and `was_ready_before` (when the caller knows better than the
    pod's readiness condition, see `_infer_was_ready_before`) are attached when a container is named.
    """
    pod_status = _mapping(pod.get("status"))
    found: list[ContainerEvidence] = []
    lists: Sequence[tuple[str, bool]] = (("containerStatuses", False), ("initContainerStatuses", True))
    for key, is_init in lists:
        for raw in pod_status.get(key) or ():
            status = _mapping(raw)
            if container is not None and status.get("name") != container:
                continue
            override = was_ready_before if container is not None else None
            ev = _one(pod, status, init_container=is_init, was_ready_before=override)
            if container is not None and log_tail is not None:
                ev = ev.model_copy(update={"log_tail": redact(log_tail)})
            found.append(ev)
    return found
