"""The shell around LeaderWorkerSets: is the API served (asked again every `RECHECK_SECONDS`, so installing LWS
after the operator started is noticed), and the groups' readiness folded into the owner's status."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

from ..api import conditions as cond
from ..api import lws_status
from ..render.lws import lws_name
from ..render.manifests import selector_for
from . import effects, kube

#: How long one discovery answer is trusted (seconds).
RECHECK_SECONDS = 30.0

_cache: dict[int, tuple[float, bool]] = {}
_lock = threading.Lock()


def api_served(max_age: float = RECHECK_SECONDS) -> bool:
    """Whether leaderworkerset.x-k8s.io/v1 leaderworkersets is served, from an answer at most `max_age` s old."""
    key = id(kube.client())
    now = time.monotonic()
    with _lock:
        hit = _cache.get(key)
    if hit is not None and now - hit[0] < max_age:
        return hit[1]
    with kube.api_errors("discover the LeaderWorkerSet API"):
        served = kube.serves(kube.LEADERWORKERSETS)
    with _lock:
        _cache[key] = (now, served)
    return served


def forget() -> None:
    """Drop cached answers (tests; a new cluster)."""
    with _lock:
        _cache.clear()


def refresh(namespace: str, service: str) -> bool:
    """Fold the LeaderWorkerSet's groups into the service's Ready/Progressing; returns whether the status changed."""
    with kube.api_errors(f"read LeaderWorkerSet {lws_name(service)}"):
        lws = kube.get(kube.LEADERWORKERSETS, namespace, lws_name(service))
    if lws is None:
        return False
    selector = ",".join(f"{k}={v}" for k, v in selector_for(service).items())
    with kube.api_errors(f"list the pods of {service}"):
        pods = kube.list_objects(kube.PODS, namespace, label_selector=selector)
    view = lws_status.assess_groups(lws, pods)

    def build(stored: dict[str, Any]) -> Any:
        status = stored.get("status") or {}
        if (status.get("plan") or {}).get("fits") is False or not status.get("multiNode"):
            return None  # not (or no longer) a multi-node service
        generation = int((stored.get("metadata") or {}).get("generation") or 1)
        return cond.fold_status(status, conditions=lws_status.group_conditions(view), observed_generation=generation,
                                now=datetime.now(UTC), ready_replicas=view.ready_groups)

    return effects.update_status(namespace, service, build)
