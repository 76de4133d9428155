"""The status hook for what vLLM measured: `status.kvCache` (its "GPU KV cache size: N tokens" next to the plan's
prediction, with the difference), through the one status writer.

A serving pod's log is read once per pod template — when a pod of it is first seen with its vLLM container Ready and
the status holds no measurement of that template yet — as a bounded tail (the line is among the first of the log).
Headless workers of a LeaderWorkerSet are never read: the leader's engine logs the cache (`render.pods`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..api.labels import ANNOTATION_PLAN
from ..api.v1alpha1 import VLLMServiceStatus
from ..remediation.kvcache import fold_measured, measured_tokens
from ..render.pods import LWS_NAME_LABEL, serving_pods
from . import effects, kube

log = logging.getLogger("vllm_operator.measured")

#: vLLM logs its KV cache size during startup: this many lines hold it (bounded to 64 KiB by kube.read_log).
LOG_LINES = 2000
#: Pods read already by this process (newest last, bounded): a pod is read at most once.
_READ: dict[str, None] = {}
_READ_LIMIT = 4096


def _vllm(pod: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """Whether the vllm container is Ready, and its args."""
    ready = any(c.get("name") == "vllm" and c.get("ready") is True
                for c in (pod.get("status") or {}).get("containerStatuses") or [])
    container: Mapping[str, Any] = next((c for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == "vllm"), {})
    return ready, [str(a) for a in container.get("args") or []]


def _remember(uid: str) -> None:
    _READ[uid] = None
    while len(_READ) > _READ_LIMIT:
        del _READ[next(iter(_READ))]


def record_kv_cache(namespace: str, service: str, pod: Mapping[str, Any], *, now: datetime | None = None) -> bool:
    """Record what a serving pod's vLLM measured of its KV cache; returns whether the status was written."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or meta.get("name") or "")
    ready, args = _vllm(pod)
    if not ready or meta.get("deletionTimestamp") or uid in _READ:
        return False
    if not serving_pods(service, namespace, multinode=LWS_NAME_LABEL in labels).selects_labels(labels):
        return False  # a headless worker: its log has no engine lines
    template = (meta.get("annotations") or {}).get(ANNOTATION_PLAN)
    stored = effects.read_service(namespace, service)
    status = (stored or {}).get("status") or {}
    recorded = status.get("kvCache") if isinstance(status.get("kvCache"), Mapping) else None
    if stored is None:
        return False
    _remember(uid)  # looked at: the pod's later events cost nothing
    if recorded is not None and template and recorded.get("template") == template:
        return False  # measured already for this template (by this or an earlier operator process)
    with kube.api_errors(f"read the log of {name}"):
        text = kube.read_log(namespace, name, container="vllm", tail_lines=LOG_LINES, previous=False) or ""
    tokens = measured_tokens(text)
    if tokens is None:
        return False
    when = now or datetime.now(UTC)

    def build(service_obj: dict[str, Any]) -> VLLMServiceStatus | None:
        current = dict(service_obj.get("status") or {})
        folded = fold_measured(current, pod=name, template=template, pod_args=args, tokens=tokens, now=when)
        if folded is None:
            return None
        return VLLMServiceStatus.model_validate({**current, "kvCache": folded.model_dump(by_alias=True)})

    written = effects.update_status(namespace, service, build)
    if written:
        log.info("%s/%s: pod %s: vLLM allocated %d KV cache tokens (predicted %s)", namespace, service, name,
                 tokens, (status.get("plan") or {}).get("kvCacheTokens"))
    return written
