"""The shell around LeaderWorkerSets: is the API served (asked again every `RECHECK_SECONDS`, so installing LWS
after the operator started is noticed), and the groups' readiness folded into the owner's status."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..api import conditions as cond
from ..api import lws_status, serving, switch
from ..api.labels import ANNOTATION_PLAN
from ..remediation import groups
from ..render.lws import LWS_NAME_LABEL, lws_name
from ..render.manifests import selector_for
from . import effects, kube, placement
from .observe import LWS_RECHECK_SECONDS, lws_served

#: How long one discovery answer is trusted (seconds).
RECHECK_SECONDS = LWS_RECHECK_SECONDS


def api_served(max_age: float = RECHECK_SECONDS) -> bool:
    """Whether leaderworkerset.x-k8s.io/v1 leaderworkersets is served (the reconcile's own read: `observe`)."""
    return lws_served(max_age)


def forget() -> None:
    """Drop cached answers (tests; a new cluster)."""
    kube.forget_served()


def refresh(namespace: str, service: str) -> bool:
    """Fold the LeaderWorkerSet's groups into the service's Ready/Progressing; returns whether the status changed."""
    with kube.api_errors(f"read LeaderWorkerSet {lws_name(service)}"):
        lws = kube.get(kube.LEADERWORKERSETS, namespace, lws_name(service))
    if lws is None:
        return False
    # the groups' pods only: during a switch the Deployment's pods carry the same service labels
    selector = ",".join(f"{k}={v}" for k, v in {**selector_for(service), LWS_NAME_LABEL: lws_name(service)}.items())
    with kube.api_errors(f"list the pods of {service}"):
        pods = kube.list_objects(kube.PODS, namespace, label_selector=selector)
    view = lws_status.assess_groups(lws, pods)
    now = datetime.now(UTC)
    leaders = {str(labels.get(groups.GROUP_INDEX_LABEL)): (str(meta.get("uid")),
                                                           str((meta.get("annotations") or {}).get(ANNOTATION_PLAN)))
               for meta, labels in ((p.get("metadata") or {}, (p.get("metadata") or {}).get("labels") or {})
                                    for p in pods)
               if labels.get(groups.WORKER_INDEX_LABEL) == "0" and not meta.get("deletionTimestamp")}

    def build(stored: dict[str, Any]) -> Any:
        status = stored.get("status") or {}
        multi = status.get("multiNode")
        if (status.get("plan") or {}).get("fits") is False or switch.target_kind(status) != "LeaderWorkerSet":
            not_serving.append(True)
            return None  # the recorded plan runs on a Deployment: this LeaderWorkerSet is not the one that serves
        if multi:  # groups that span nodes: recreations and rank failures (one-pod groups restart in place)
            multi = _record_failures(groups.count_recreations(multi, leaders, view.not_failing_groups), pods, now)
        generation = int((stored.get("metadata") or {}).get("generation") or 1)
        # during a switch the workload the recorded plan runs on speaks (api.serving, as handlers/rollouts.py)
        previous = _previous_deployment(namespace, service, status)
        updates = serving.serving("LeaderWorkerSet", lws_status.group_conditions(view, status), status,
                                  previous_name=previous[0], previous_ready=previous[1])
        if updates is None:
            not_serving.append(True)
            return None
        if placement.held(status):  # a held rollout (handlers/placement.py): the old groups serve, the hold stands
            updates = [u for u in updates if u.type != cond.PROGRESSING]
        recreations = int((multi or {}).get("groupRecreations") or 0)
        limit = groups.group_recreation_limit(stored.get("spec"))
        if multi and groups.recreations_exhausted(recreations, limit):
            first: dict[str, Any] = next(iter(multi.get("failures") or []), {})
            updates.append(cond.ConditionUpdate(
                cond.DEGRADED, cond.TRUE, cond.GROUP_RECREATIONS_EXHAUSTED,
                f"LeaderWorkerSet recreated a group {recreations} times after pod failures (more than "
                f"{limit}, spec.remediation.maxGroupRecreations); first failure: {first.get('pod', '?')} (node rank "
                f"{first.get('nodeRank', '?')}, stages {first.get('stages', '?')}): {first.get('failureClass', '?')}: "
                f"{first.get('summary', 'unknown')}"))
        folded = {**status, "multiNode": multi} if multi else status
        return cond.fold_status(folded, conditions=updates, observed_generation=generation,
                                now=now, ready_replicas=view.ready_groups)

    not_serving: list[bool] = []  # set when the recorded plan does not run on this LeaderWorkerSet
    changed = effects.update_status(namespace, service, build)
    if not not_serving:  # a switch finishes when its new workload is Ready, never on the old one's events
        effects.finish_switch(namespace, lws)
    return changed


def _previous_deployment(namespace: str, service: str, status: Mapping[str, Any]) -> tuple[str, int]:
    """(name, ready pods) of the Deployment or StatefulSet a recorded switch to the LeaderWorkerSet replaces; ("", 0)
    if none."""
    record = switch.recorded(status)
    if record is None or record.previous == "LeaderWorkerSet":
        return "", 0
    name = effects.workload_names(service)[record.previous]
    with kube.api_errors(f"read {record.previous} {name}"):
        found = kube.get(kube.KIND_RESOURCES[record.previous], namespace, name)
    return name, int(((found or {}).get("status") or {}).get("readyReplicas") or 0)


def _record_failures(multi: dict[str, Any], pods: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
    """Every failed pod of the groups, attributed to its rank and stages, before LWS deletes the group."""
    from .remediation import classify_pod

    for pod in pods:
        meta = pod.get("metadata") or {}
        for _evidence, failure in classify_pod(pod):
            recorded = groups.record_failure(multi, pod=str(meta.get("name")), pod_uid=str(meta.get("uid")),
                                             labels=meta.get("labels") or {}, failure_class=str(failure.kind),
                                             summary=failure.summary, time=cond.format_time(now))
            if recorded is not None:
                multi = recorded
    return multi
