"""The status hook for a measured download: a pod's `model-download` init container reported how many bytes it
fetched in how long (render/cache.py); record it in `status.modelCache`, once per pod, through the one status writer.

Pure parts (`measured_download`, `fold_download`) live in render/cache.py; this module only reads and writes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..api.v1alpha1 import VLLMServiceStatus
from ..render.cache import fold_download, measured_download
from . import effects

log = logging.getLogger("vllm_operator.downloads")

#: Pods whose measurement this process recorded (or found recorded): later events of the pod read nothing.
_SEEN: dict[str, None] = {}
_SEEN_LIMIT = 4096


def record_download(namespace: str, service: str, pod: Mapping[str, Any]) -> bool:
    """Record the pod's measured download in its service's status; returns whether the status was written."""
    measure = measured_download(pod)
    if measure is None or not measure.telling():
        return False
    uid = str((pod.get("metadata") or {}).get("uid") or measure.pod)
    if uid in _SEEN:
        return False

    def build(stored: dict[str, Any]) -> VLLMServiceStatus | None:
        status = dict(stored.get("status") or {})
        folded = fold_download(status.get("modelCache"), measure)
        return None if folded is None else VLLMServiceStatus.model_validate({**status, "modelCache": folded})

    written = effects.update_status(namespace, service, build)
    _SEEN[uid] = None
    while len(_SEEN) > _SEEN_LIMIT:
        del _SEEN[next(iter(_SEEN))]
    if written:
        log.info("%s/%s: pod %s downloaded %d bytes in %.1f s (%.0f MiB/s)", namespace, service, measure.pod,
                 measure.downloaded_bytes, measure.seconds, measure.bytes_per_second / 2**20)
    return written
