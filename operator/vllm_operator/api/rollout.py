"""What a VLLMService's rollout really is, from its Deployment, ReplicaSets and pods. Pure: no API calls.

`assess` tells the pods of the *current* pod template (by the plan annotation each pod carries from the template)
from those of earlier templates (and reads the Deployment's own rollout counters), reads the Deployment's own `Progressing` condition (`ProgressDeadlineExceeded`) and the
scheduler's word on pending pods (`PodScheduled=False, Unschedulable`) and their `model-download` init container
(render/cache.py): one that runs is a download in progress (`Downloading`), one that exited non-zero or cannot start
is `ModelDownloadFailed` (Degraded; the redacted reason comes from `status.modelCache.downloadError`, which the pod
hook records). `rollout_conditions` turns that into the
VLLMService's Ready / Progressing / Degraded conditions: `Ready` means the desired configuration serves; pods of an
earlier template that still serve are reported as "serving the previous profile", never as a finished rollout.

`surge_blocked` says when a rolling update cannot add a pod before removing one: the scheduler found no
`nvidia.com/gpu` for the new pod while pods of the previous profile (serving or crash-looping) hold enough on a node
the new pod may use. The strategy then is one pod at a time, without a surge pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import conditions as cond
from .labels import ANNOTATION_PLAN

GPU_RESOURCE = "nvidia.com/gpu"
#: The init container that fills the model cache (render/cache.py DOWNLOAD_CONTAINER; a unit test ties the two: the
#: api layer sits below render).
DOWNLOAD_CONTAINER = "model-download"
#: Waiting reasons of an init container that will not run without a change (an image, a Secret, a config).
_CANNOT_START = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError")

__all__ = [
    "RolloutView",
    "assess",
    "current_degraded_reason",
    "download_detail",
    "download_failure",
    "download_running",
    "in_init",
    "rollout_conditions",
    "started_conditions",
    "surge_blocked",
]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = obj.get("status")
    found = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in found or [] if isinstance(c, Mapping)]


def _condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in _conditions(obj) if c.get("type") == type_), None)


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class RolloutView:
    """The rollout of one Deployment as the pods show it."""

    replicas: int                          # desired pods (Deployment spec.replicas)
    current_ready: int                     # ready pods of the current template
    current_pods: int                      # pods of the current template (any state)
    previous_ready: int                    # ready pods of earlier templates (serving the previous profile)
    previous_pods: int                     # pods of earlier templates (any state)
    observed: bool                         # the Deployment controller has seen the current generation
    controller_done: bool = True           # the controller's counters: every pod is of the current template
    unschedulable: str | None = None       # the scheduler's message for a pending pod of the current template
    deadline_exceeded: str | None = None   # the Deployment's ProgressDeadlineExceeded message
    downloading: str | None = None         # a pod of the current template whose model-download init container runs
    download_failed: str | None = None     # a pod of the current template whose model-download init container failed

    @property
    def complete(self) -> bool:
        return self.serves_desired and self.previous_pods == 0 and self.controller_done

    @property
    def serves_desired(self) -> bool:
        return self.observed and self.current_ready >= self.replicas


def _observed(deployment: Mapping[str, Any]) -> bool:
    generation = _int(_meta(deployment).get("generation")) or 1
    return _int((deployment.get("status") or {}).get("observedGeneration")) >= generation


def pod_ready(pod: Mapping[str, Any]) -> bool:
    if _meta(pod).get("deletionTimestamp"):
        return False
    ready = _condition(pod, "Ready")
    return ready is not None and ready.get("status") == "True"


def unschedulable_message(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message when it could not place the pod (`PodScheduled=False, Unschedulable`)."""
    scheduled = _condition(pod, "PodScheduled")
    if scheduled is None or scheduled.get("status") != "False" or scheduled.get("reason") != "Unschedulable":
        return None
    return str(scheduled.get("message") or "the scheduler found no node for the pod")


def _download_status(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    statuses = (pod.get("status") or {}).get("initContainerStatuses")
    return next((s for s in statuses or [] if isinstance(s, Mapping) and s.get("name") == DOWNLOAD_CONTAINER), None)


def _state(status: Mapping[str, Any], key: str, which: str = "state") -> Mapping[str, Any] | None:
    state = status.get(which)
    found = state.get(key) if isinstance(state, Mapping) else None
    return found if isinstance(found, Mapping) else None


def download_running(pod: Mapping[str, Any]) -> str | None:
    """"pod X, started at T" while the pod's model-download init container runs (a first try: a retry after a
    failure is `download_failure`), else None. The start time, not an age: the status changes only when the pod
    does."""
    status = _download_status(pod)
    running = _state(status, "running") if status is not None else None
    if status is None or running is None or download_failure(pod) is not None:
        return None
    started = running.get("startedAt")
    return f"pod {_meta(pod).get('name')}" + (f", started at {started}" if started else "")


def download_failure(pod: Mapping[str, Any]) -> str | None:
    """What the kubelet says of the pod's failing model-download init container (exit code, reason, restarts,
    back-off; never its message, which is the log's tail: the pod hook records it redacted), or None when it has not
    failed or has succeeded since. A container that runs again after failing is still failing: the kubelet's retry
    of a gated or missing model fails the same way, and the status does not flap with each retry."""
    status = _download_status(pod)
    if status is None:
        return None
    done = _state(status, "terminated")
    if done is not None and done.get("exitCode") == 0:
        return None
    name = _meta(pod).get("name")
    waiting = _state(status, "waiting") or {}
    if waiting.get("reason") in _CANNOT_START:
        detail = f": {waiting.get('message')}" if waiting.get("message") else ""
        return f"pod {name}: the {DOWNLOAD_CONTAINER} init container cannot start ({waiting.get('reason')}{detail})"
    failed = done or _state(status, "terminated", "lastState")
    if failed is None or failed.get("exitCode") in (0, None):
        return None
    restarts = _int(status.get("restartCount"))
    how = f"exit code {failed.get('exitCode')} ({failed.get('reason') or 'Error'})"
    if restarts:
        how += f", {restarts} restart" + ("" if restarts == 1 else "s")
    if waiting.get("reason") == "CrashLoopBackOff":
        how += ", back-off before the next try"
    elif _state(status, "running") is not None:
        how += ", trying again"
    return f"pod {name}: the {DOWNLOAD_CONTAINER} init container failed, {how}"


def in_init(pod: Mapping[str, Any]) -> bool:
    """Whether a pod event may change what the rollout reports of the download and nothing else answers it: the pod
    has a model-download init container status and its containers have neither been ready nor failed (downloading,
    the download failing, or vLLM just started after it). A vLLM container that failed is the ladder's."""
    if _download_status(pod) is None:
        return False
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if not isinstance(container, Mapping):
            continue
        waiting = _state(container, "waiting") or {}
        if (container.get("ready") is True or _state(container, "terminated") is not None
                or _state(container, "terminated", "lastState") is not None
                or waiting.get("reason") not in (None, "PodInitializing", "ContainerCreating")):
            return False
    return True


def assess(deployment: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> RolloutView:
    """The rollout of `deployment`, from the service's pods (those its selector matches).

    Pods of the current profile carry the template's plan annotation (a hash of what vLLM runs with: arguments,
    image, memory, GPUs); a change of the template that leaves it alone (tolerations, env) is seen through the
    Deployment's own counters (`updatedReplicas`, `replicas`, `observedGeneration`, as `kubectl rollout status`),
    and so is a rollout whose pods are not (yet) in the list."""
    spec = deployment.get("spec") or {}
    replicas = _int(spec.get("replicas", 1))
    status = deployment.get("status") or {}
    observed = _observed(deployment)
    live = [p for p in pods if not _meta(p).get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    key = (((spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PLAN)

    def is_current(pod: Mapping[str, Any]) -> bool:
        return key is None or (_meta(pod).get("annotations") or {}).get(ANNOTATION_PLAN) == key

    updated, total = _int(status.get("updatedReplicas")), _int(status.get("replicas"))
    controller_done = observed and updated >= replicas and total <= updated
    if not live:
        # no pods to read (a list that lags the Deployment's status): its own counters, as `kubectl rollout status`
        available = _int(status.get("availableReplicas"))
        current_ready = min(updated, available) if observed else 0
        return RolloutView(replicas=replicas, current_ready=current_ready, current_pods=updated if observed else 0,
                           previous_ready=available - current_ready, previous_pods=max(total - updated, 0),
                           observed=observed, controller_done=controller_done,
                           deadline_exceeded=_deadline_exceeded(deployment) if observed else None)
    current = [p for p in live if is_current(p)]
    previous = [p for p in live if not is_current(p)]
    return RolloutView(
        replicas=replicas, current_ready=sum(1 for p in current if pod_ready(p)), current_pods=len(current),
        previous_ready=sum(1 for p in previous if pod_ready(p)), previous_pods=len(previous), observed=observed,
        controller_done=controller_done,
        unschedulable=next((m for p in current if (m := unschedulable_message(p))), None),
        deadline_exceeded=_deadline_exceeded(deployment) if observed else None,
        downloading=next((m for p in current if (m := download_running(p))), None),
        download_failed=next((m for p in current if (m := download_failure(p))), None))


def _deadline_exceeded(deployment: Mapping[str, Any]) -> str | None:
    progressing = _condition(deployment, "Progressing")
    if progressing is None or progressing.get("reason") != "ProgressDeadlineExceeded":
        return None
    return str(progressing.get("message") or "the Deployment exceeded its progress deadline")


#: Degraded reasons the rollout itself sets (and so may clear).
ROLLOUT_PROBLEMS = (cond.UNSCHEDULABLE, cond.PROGRESS_DEADLINE_EXCEEDED, cond.MODEL_DOWNLOAD_FAILED)
#: Degraded reasons that stand until the spec changes; a rollout never clears or overrides them.
STANDING = (cond.INVALID_SPEC, cond.PLAN_INFEASIBLE, cond.MODEL_NOT_FOUND, cond.GPU_NOT_FOUND,
            cond.REMEDIATION_EXHAUSTED, cond.RECONCILE_ERROR, cond.CHILD_REJECTED)


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def current_degraded_reason(status: Mapping[str, Any]) -> str | None:
    """The reason of the service's Degraded condition while it is True, else None."""
    degraded = next((c for c in status.get("conditions") or []
                     if isinstance(c, Mapping) and c.get("type") == cond.DEGRADED), None)
    return str(degraded.get("reason")) if degraded and degraded.get("status") == cond.TRUE else None


def _waiting_for_neighbour(status: Mapping[str, Any]) -> bool:
    return any(isinstance(c, Mapping) and c.get("type") == cond.PROGRESSING and c.get("status") == cond.TRUE
               and c.get("reason") == cond.WAITING_FOR_NEIGHBOUR for c in status.get("conditions") or [])


def rollout_conditions(view: RolloutView, status: Mapping[str, Any]) -> list[cond.ConditionUpdate]:
    """Ready / Progressing / Degraded for this rollout, given the service's current status (for Degraded)."""
    degraded_reason = current_degraded_reason(status)
    steps = _int((status.get("remediation") or {}).get("step"))
    of_current = f"{view.current_ready}/{view.replicas} pods of the current profile ready"
    serving_old = (f"; {_pods(view.previous_ready)} of the previous profile still serving"
                   if view.previous_ready else "")
    updates: list[cond.ConditionUpdate] = []
    if view.replicas == 0 and _waiting_for_neighbour(status):
        return updates  # held at 0 by its share group's start order (issue 26): the reconcile's conditions stand
    if view.replicas == 0 and view.observed:
        updates += [cond.ConditionUpdate(cond.READY, cond.TRUE, cond.SCALED_TO_ZERO, "scaled to zero replicas"),
                    cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, cond.ROLLOUT_COMPLETE,
                                         "scaled to zero replicas")]
    elif view.serves_desired:
        updates.append(cond.ConditionUpdate(cond.READY, cond.TRUE, cond.AVAILABLE, of_current))
        if view.complete:
            updates.append(cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, cond.ROLLOUT_COMPLETE, of_current))
        else:
            updates.append(cond.ConditionUpdate(
                cond.PROGRESSING, cond.TRUE, cond.DEPLOYING,
                f"{of_current}; {_pods(view.previous_pods)} of the previous profile terminating"))
        if degraded_reason is not None and degraded_reason not in STANDING:
            why = (f"ready after {steps} remediation step(s)" if degraded_reason not in ROLLOUT_PROBLEMS
                   else "the current profile is scheduled and ready")
            updates.append(cond.ConditionUpdate(cond.DEGRADED, cond.FALSE, cond.AS_EXPECTED, why))
    else:
        reason, progressing, detail, problem = _not_serving(view, f"{of_current}{serving_old}", status)
        updates.append(progressing)
        if view.previous_ready:
            updates.append(cond.ConditionUpdate(cond.READY, cond.FALSE, cond.SERVING_PREVIOUS_PROFILE,
                                                f"{of_current}{serving_old}"))
        else:
            updates.append(cond.ConditionUpdate(cond.READY, cond.FALSE, reason or cond.PODS_NOT_READY,
                                                of_current + (f": {detail}" if detail else "")))
        if problem and degraded_reason not in STANDING:
            updates.append(cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, reason, problem))
        elif not problem and degraded_reason in ROLLOUT_PROBLEMS:
            updates.append(cond.ConditionUpdate(cond.DEGRADED, cond.FALSE, cond.AS_EXPECTED,
                                                "the model download no longer fails"
                                                if degraded_reason == cond.MODEL_DOWNLOAD_FAILED
                                                else "the pods of the current profile are scheduled"))
    return updates


def _not_serving(view: RolloutView, said: str, status: Mapping[str, Any],
                 ) -> tuple[str, cond.ConditionUpdate, str, str | None]:
    """Why the current profile does not serve yet, most specific first: (reason, the Progressing condition, the
    detail for Ready's message, the Degraded message or None). A failing model download comes before the progress
    deadline it will run into (the deadline says only that time ran out); a download in progress is no problem."""
    if view.download_failed:
        detail = download_detail(view.download_failed, status)
        return (cond.MODEL_DOWNLOAD_FAILED, cond.ConditionUpdate(
            cond.PROGRESSING, cond.TRUE, cond.MODEL_DOWNLOAD_FAILED, f"{said}; the model download fails: {detail}"),
            detail, f"the model download fails: {detail}")
    if view.deadline_exceeded:
        detail = view.deadline_exceeded
        return (cond.PROGRESS_DEADLINE_EXCEEDED, cond.ConditionUpdate(
            cond.PROGRESSING, cond.FALSE, cond.PROGRESS_DEADLINE_EXCEEDED, f"{said}: {detail}"),
            detail, f"the rollout did not finish: {detail}")
    if view.unschedulable:
        detail = view.unschedulable
        return (cond.UNSCHEDULABLE, cond.ConditionUpdate(
            cond.PROGRESSING, cond.TRUE, cond.UNSCHEDULABLE, f"{said}; a new pod cannot be scheduled: {detail}"),
            detail, f"pods of the current profile cannot be scheduled: {detail}")
    if view.downloading:
        detail = f"downloading the model into the cache: {view.downloading}"
        return (cond.DOWNLOADING, cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, cond.DOWNLOADING,
                                                       f"{said}; {detail}"), detail, None)
    return "", cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, cond.DEPLOYING, said), "", None


def download_detail(failed: str, status: Mapping[str, Any]) -> str:
    """The kubelet's word on the failing init container, with why (status.modelCache.downloadError: the end of its
    log, redacted by the pod hook that recorded it) once that is recorded."""
    cache = status.get("modelCache")
    error = cache.get("downloadError") if isinstance(cache, Mapping) else None
    if not isinstance(error, str) or not error:
        return failed
    pod = cache.get("downloadErrorPod") if isinstance(cache, Mapping) else None
    if pod and not failed.startswith(f"pod {pod}:"):
        return f"{failed}; pod {pod}'s download said: {error}"
    return f"{failed}: {error}"


def started_conditions(replicas: int, ready_before: int) -> list[cond.ConditionUpdate]:
    """The conditions right after the operator changed the pod template (before any pod of it exists)."""
    message = f"0/{replicas} pods of the current profile ready; rolling out the new profile"
    if ready_before:
        ready = cond.ConditionUpdate(cond.READY, cond.FALSE, cond.SERVING_PREVIOUS_PROFILE,
                                     f"{message}; {_pods(ready_before)} of the previous profile still serving")
    else:
        ready = cond.ConditionUpdate(cond.READY, cond.FALSE, cond.PODS_NOT_READY, message)
    return [cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, cond.DEPLOYING, message), ready]


# --------------------------------------------------------------------------------------------------
# rolling without surge
# --------------------------------------------------------------------------------------------------


def gpu_request(pod_or_template: Mapping[str, Any]) -> int:
    """`nvidia.com/gpu` a pod (or pod template) requests, over its containers."""
    total = 0
    spec = pod_or_template.get("spec") or {}
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(GPU_RESOURCE, (resources.get("limits") or {}).get(GPU_RESOURCE))
        total += _int(value)
    return total


def _matches(labels: Mapping[str, Any], selector: Mapping[str, Any]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def surge_blocked(deployment: Mapping[str, Any], view: RolloutView, pods: Sequence[Mapping[str, Any]],
                  nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the rollout must go on without a surge pod, or None.

    It must when a pod of the current profile is unschedulable for want of `nvidia.com/gpu` while pods of the
    previous profile (ready or crash-looping) hold, on one schedulable node that matches the new pods'
    nodeSelector, at least the GPUs a new pod requests: removing one of them makes room, keeping it never does
    (a surge waits for a GPU set nobody frees). Taints and selectors that match no node are not GPU shortage:
    rolling without surge would not help them."""
    if not surges(deployment) or not view.unschedulable or GPU_RESOURCE not in view.unschedulable:
        return None
    template = (deployment.get("spec") or {}).get("template") or {}
    needed = gpu_request(template)
    selector = (template.get("spec") or {}).get("nodeSelector") or {}
    eligible = {str(_meta(n).get("name")) for n in nodes
                if not (n.get("spec") or {}).get("unschedulable") and _matches(_meta(n).get("labels") or {}, selector)}
    key = ((template.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PLAN)
    held: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in eligible and (_meta(pod).get("annotations") or {}).get(ANNOTATION_PLAN) != key:
            held[node] = held.get(node, 0) + gpu_request(pod)
    best = max(held.items(), key=lambda item: item[1], default=None)
    if best is None or best[1] < needed:
        return None
    return (f"the new pod needs {needed} {GPU_RESOURCE} and the pool has none to spare ({view.unschedulable}); "
            f"pods of the previous profile hold {best[1]} on node {best[0]}: rolling without surge (maxSurge 0, "
            "maxUnavailable 1), the service is briefly unavailable")


def surges(deployment: Mapping[str, Any]) -> bool:
    """Whether the Deployment's strategy adds pods before removing old ones."""
    strategy = (deployment.get("spec") or {}).get("strategy") or {}
    if strategy.get("type") == "Recreate":
        return False
    return str((strategy.get("rollingUpdate") or {}).get("maxSurge", "25%")) not in ("0", "0%")
