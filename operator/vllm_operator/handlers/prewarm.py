"""spec.modelCache.prewarm in the reconcile: warm the pool's nodes (render/prewarm.py), then create the workload.

While what the workload needs is not warm (its key differs from status.modelCache.prewarm's, or that one is not
Done): the prewarm DaemonSet is applied, the workload (Deployment or LeaderWorkerSet) is held back — a new service
gets none yet, a serving one keeps its pods and template (an image upgrade or a move to another pool is pulled
before the rollout) — Progressing says Prewarming with each node's state, one Normal Event says it started, and the
reconcile runs again in PREWARM_RECHECK_SECONDS. Once every node of the pool reports done (or the pool has no node
yet: Skipped), the workload is applied in the same reconcile and the DaemonSet is deleted, unless
spec.modelCache.prewarm.keep. A steady service costs no request: a Done key is not read again.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..api import conditions as cond
from ..api import switch
from ..api.status import ModelCacheStatus, PrewarmStatus
from ..reconcile import EVENT_NORMAL, Desired, Event
from ..remediation.redact import redact
from ..render.cache import download_failure
from ..render.names import label_value
from ..render.prewarm import (
    LABEL_PREWARM,
    LABEL_PREWARM_KEY,
    PREWARMING,
    build_prewarm_daemonset,
    prewarm_name,
    prewarm_progress,
)
from . import kube

#: How soon a reconcile looks again while the nodes are warmed (seconds).
PREWARM_RECHECK_SECONDS = 10.0
WORKLOADS = switch.WORKLOADS


def _settings(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    cache = spec.get("modelCache")
    prewarm = cache.get("prewarm") if isinstance(cache, Mapping) else None
    if not isinstance(prewarm, Mapping) or prewarm.get("enabled") is False:
        return None
    return prewarm


def _record(desired: Desired, prewarm: PrewarmStatus | None) -> None:
    current = desired.status.model_cache or ModelCacheStatus()
    desired.status = desired.status.model_copy(update={"model_cache": current.model_copy(update={"prewarm": prewarm})})


def _observe(namespace: str, service: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    name = prewarm_name(service)
    with kube.api_errors(f"read DaemonSet {name}"):
        daemon_set = kube.get(kube.DAEMONSETS, namespace, name)
    with kube.api_errors(f"list the pods of DaemonSet {name}"):
        pods = kube.list_objects(kube.PODS, namespace, label_selector=f"{LABEL_PREWARM}={label_value(service)}")
    return daemon_set, pods


def guard(namespace: str, service: str, spec: Mapping[str, Any], status: Mapping[str, Any], desired: Desired,
          now: datetime) -> Desired:
    """The desired state with the prewarm DaemonSet, and the workload held back until the pool is warm."""
    children = desired.children
    recorded = dict(((status.get("modelCache") or {}).get("prewarm")) or {})
    settings = _settings(spec)
    name = prewarm_name(service)
    if settings is None or children is None:
        if settings is None and recorded:
            if recorded.get("daemonSet"):
                desired.stale.append(("DaemonSet", name))
            if children is not None:
                _record(desired, None)  # prewarm switched off: nothing to say any more
        return desired
    workload = next((c for c in children if c.get("kind") in WORKLOADS), None)
    if workload is None:
        return desired
    daemon_set, fills = build_prewarm_daemonset(workload, children, service=service, namespace=namespace)
    key = str(daemon_set["spec"]["template"]["metadata"]["labels"][LABEL_PREWARM_KEY])
    keep = bool(settings.get("keep"))
    if recorded.get("key") == key and recorded.get("phase") in ("Done", "Skipped"):
        return _finish(desired, daemon_set, recorded, keep)
    current, pods = _observe(namespace, service)
    if current is not None and (((current.get("spec") or {}).get("template") or {}).get("metadata") or {}) \
            .get("labels", {}).get(LABEL_PREWARM_KEY) != key:
        current = None  # an older key's DaemonSet: it is replaced by this apply
    failures = {str((p.get("metadata") or {}).get("name")): redact(why) for p in pods
                if (why := download_failure(p)) is not None}
    progress = prewarm_progress(current, pods, key, failures)
    record = PrewarmStatus.model_validate({
        "key": key, "phase": progress.phase, "nodes": progress.nodes, "ready": progress.ready,
        "desired": progress.desired, "daemonSet": name})
    if progress.phase != "Running":
        return _finish(desired, daemon_set, record.model_dump(by_alias=True, exclude_none=True), keep)
    _record(desired, record)
    desired.children = [*(c for c in children if c.get("kind") not in WORKLOADS), daemon_set]
    what = "pulling the vLLM image and filling the model cache" if fills else "pulling the vLLM image"
    held = "the workload is created" if status.get("readyReplicas") in (None, 0) else "the rollout proceeds"
    message = (f"{what} on the pool's nodes before the first pod (spec.modelCache.prewarm): {progress.message}; "
               f"{held} once every node is warm")
    said = any(c.get("type") == cond.PROGRESSING and c.get("reason") == PREWARMING
               for c in status.get("conditions") or [] if isinstance(c, Mapping))
    desired.status = cond.fold_status(desired.status, conditions=[
        cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, PREWARMING, message)],
        observed_generation=desired.status.observed_generation, now=now)
    if not said:
        desired.events.append(Event(EVENT_NORMAL, PREWARMING, message))
    desired.retry_after = PREWARM_RECHECK_SECONDS
    return desired


def _finish(desired: Desired, daemon_set: dict[str, Any], recorded: Mapping[str, Any], keep: bool) -> Desired:
    """Warm: the workload is applied as rendered; the DaemonSet is kept converged, or deleted."""
    assert desired.children is not None
    record = dict(recorded)
    if keep:
        desired.children = [*desired.children, daemon_set]
        record["daemonSet"] = daemon_set["metadata"]["name"]
    elif record.get("daemonSet"):
        desired.stale.append(("DaemonSet", str(daemon_set["metadata"]["name"])))
        record.pop("daemonSet", None)
    _record(desired, PrewarmStatus.model_validate(record))
    return desired


def warmed_service(pod: Mapping[str, Any]) -> str | None:
    """The service a prewarm pod warms, when it just reported done (Ready): its reconcile should look now rather
    than at its next retry, whose delay doubles while the nodes pull."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    service = labels.get(LABEL_PREWARM)
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (pod.get("status") or {}).get("conditions") or [] if isinstance(c, Mapping))
    return str(service) if service and ready else None

