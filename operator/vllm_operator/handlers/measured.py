"""The status hook for what vLLM measured: `status.kvCache` (its "GPU KV cache size: N tokens" next to the plan's
prediction, with the difference), through the one status writer.

A serving pod's log, read once when its vLLM container is first seen Ready (`downloads.ready_log`, which the cold
start and the download share), gives the measurement when the status holds none of that pod template yet. Headless
workers of a LeaderWorkerSet are skipped: the leader's engine logs the cache (`render.pods`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..api import conditions as cond
from ..api.labels import ANNOTATION_PLAN
from ..api.v1alpha1 import VLLMServiceStatus
from ..remediation.kvcache import auto_fit_length, context_reduced, fold_measured, measured_tokens
from ..render.pods import LWS_NAME_LABEL, STATEFULSET_WORKLOAD, WORKLOAD_LABEL, serving_pods
from . import effects

log = logging.getLogger("vllm_operator.measured")



def _vllm(pod: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """Whether the vllm container is Ready, and its args."""
    ready = any(c.get("name") == "vllm" and c.get("ready") is True
                for c in (pod.get("status") or {}).get("containerStatuses") or [])
    container: Mapping[str, Any] = next((c for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == "vllm"), {})
    return ready, [str(a) for a in container.get("args") or []]


def record_kv_cache(namespace: str, service: str, pod: Mapping[str, Any], text: str, *,
                    now: datetime | None = None) -> bool:
    """Record what a serving pod's vLLM measured of its KV cache (its log `text`); returns whether the status was
    written."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    name = str(meta.get("name") or "")
    ready, args = _vllm(pod)
    if not ready or meta.get("deletionTimestamp"):
        return False
    kind = ("LeaderWorkerSet" if LWS_NAME_LABEL in labels else
            "StatefulSet" if labels.get(WORKLOAD_LABEL) == STATEFULSET_WORKLOAD else "Deployment")
    if not serving_pods(service, namespace, kind=kind).selects_labels(labels):
        return False  # a headless worker: its log has no engine lines
    template = (meta.get("annotations") or {}).get(ANNOTATION_PLAN)
    tokens = measured_tokens(text)
    if tokens is None:
        return False
    when = now or datetime.now(UTC)
    auto_fit = auto_fit_length(text)
    predicted: list[Any] = []
    reduced: list[Any] = []

    def build(service_obj: dict[str, Any]) -> VLLMServiceStatus | None:
        current = dict(service_obj.get("status") or {})
        recorded = current.get("kvCache") if isinstance(current.get("kvCache"), Mapping) else None
        if recorded is not None and template and recorded.get("template") == template:
            return None  # measured already for this template (by this or an earlier operator process)
        folded = fold_measured(current, pod=name, template=template, pod_args=args, tokens=tokens, now=when,
                               auto_fit=auto_fit)
        if folded is None:
            return None
        predicted[:] = [(current.get("plan") or {}).get("kvCacheTokens")]
        warning = context_reduced(folded)
        reduced[:] = [warning, effects.involved(service_obj)] if warning else []
        return VLLMServiceStatus.model_validate({**current, "kvCache": folded.model_dump(by_alias=True)})

    written = effects.update_status(namespace, service, build)
    if written:
        log.info("%s/%s: pod %s: vLLM allocated %d KV cache tokens (predicted %s)", namespace, service, name,
                 tokens, predicted[0] if predicted else None)
        if reduced:  # recorded first (status.kvCache.maxModelLen), then said
            message, involved = reduced
            log.warning("%s/%s: %s", namespace, service, message)
            effects.post_event(namespace, involved, "Warning", cond.CONTEXT_REDUCED, message)
    return written
