"""The status hook for a measured download: record in `status.modelCache`, once per pod, through the one status
writer, how many bytes a pod downloaded in how long (render/cache.py holds the pure parts).

Two sources, both read without extra requests for pods that give none:

* the `model-download` init container's termination message (in the pod status the event carries);
* vLLM's own "Time spent downloading weights" line, for a pod without that init container (an emptyDir cache, or
  the init container switched off): its log is read once, when its vLLM container is first seen Ready (a bounded
  read: the line is among the first of the log). The bytes are the checkpoint's (`status.modelCache.checkpointBytes`,
  written by the reconcile): vLLM downloading into an empty cache fetches all of it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..api.v1alpha1 import VLLMServiceStatus
from ..render.cache import (
    DOWNLOAD_CONTAINER,
    DownloadMeasure,
    download_from_vllm_log,
    fold_download,
    measured_download,
)
from . import effects, kube

log = logging.getLogger("vllm_operator.downloads")

#: Pods this process has looked at (recorded, found recorded, or found to have nothing): no second look.
_SEEN: dict[str, None] = {}
_SEEN_LIMIT = 4096
#: vLLM's download line comes early in its log: this many lines hold it (bounded to 64 KiB by kube.read_log).
LOG_LINES = 2000


def _seen(uid: str) -> bool:
    if uid in _SEEN:
        return True
    _SEEN[uid] = None
    while len(_SEEN) > _SEEN_LIMIT:
        del _SEEN[next(iter(_SEEN))]
    return False


def _has_download_init(pod: Mapping[str, Any]) -> bool:
    return any(c.get("name") == DOWNLOAD_CONTAINER for c in (pod.get("spec") or {}).get("initContainers") or [])


def _vllm_ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("name") == "vllm" and c.get("ready") is True
               for c in (pod.get("status") or {}).get("containerStatuses") or [])


def record_download(namespace: str, service: str, pod: Mapping[str, Any]) -> bool:
    """Record the pod's measured download in its service's status; returns whether the status was written."""
    meta = pod.get("metadata") or {}
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or meta.get("name") or "")
    if _has_download_init(pod):
        measure = measured_download(pod)
        if measure is None or not measure.telling() or _seen(uid):
            return False
        return _write(namespace, service, lambda _status: measure)
    if not _vllm_ready(pod) or _seen(uid):
        return False
    with kube.api_errors(f"read the log of {name}"):
        text = kube.read_log(namespace, name, container="vllm", tail_lines=LOG_LINES, previous=False) or ""

    def from_log(status: Mapping[str, Any]) -> DownloadMeasure | None:
        size = ((status.get("modelCache") or {}).get("checkpointBytes")) or 0
        return download_from_vllm_log(text, checkpoint_bytes=int(size), pod=name)
    return _write(namespace, service, from_log)


def _write(namespace: str, service: str, measure_for: Any) -> bool:
    found: list[DownloadMeasure] = []

    def build(stored: dict[str, Any]) -> VLLMServiceStatus | None:
        status = dict(stored.get("status") or {})
        measure = measure_for(status)
        folded = fold_download(status.get("modelCache"), measure)
        if folded is None or measure is None:
            return None
        found[:] = [measure]
        return VLLMServiceStatus.model_validate({**status, "modelCache": folded})

    written = effects.update_status(namespace, service, build)
    if written and found:
        m = found[0]
        log.info("%s/%s: pod %s downloaded %d bytes in %.1f s (%.0f MiB/s, %s)", namespace, service, m.pod,
                 m.downloaded_bytes, m.seconds, m.bytes_per_second / 2**20, m.source)
    return written
