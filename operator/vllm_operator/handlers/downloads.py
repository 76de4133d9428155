"""The status hooks for what a pod's start tells, recorded through the one status writer, once per pod
(render/cache.py and render/coldstart.py hold the pure parts):

* the measured download in `status.modelCache`: how many bytes a pod downloaded in how long;
* a failing download too (`status.modelCache.downloadError`: its class, never free log text; cleared by a later
  success), so a pod waiting
  in `Init:CrashLoopBackOff` (a gated model without a token, a wrong revision) is explained;
* the start, phase by phase, in `status.coldStart` (`record_ready`): image pull and volume attach, the image pull
  alone (the kubelet's `Pulled` Events of the pod: one list request per pod start), download, load, compile, CUDA
  graphs, engine start, scheduled → Ready.

Two sources of download measurements, both read without extra requests for pods that give none:

* the `model-download` init container's termination message (in the pod status the event carries);
* vLLM's own "Time spent downloading weights" line, for a pod without that init container (an emptyDir cache, or
  the init container switched off).

A pod's vLLM log is read once, when its vLLM container is first seen Ready (a bounded read: the lines are among the
first of the log). The bytes of vLLM's own download are the checkpoint's (`status.modelCache.checkpointBytes`,
written by the reconcile): vLLM downloading into an empty cache fetches all of it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from ..api.v1alpha1 import VLLMServiceStatus
from ..remediation.classifier import download_failure_summary
from ..render.cache import (
    DOWNLOAD_CONTAINER,
    DownloadMeasure,
    download_from_vllm_log,
    fold_download,
    fold_download_failure,
    measured_download,
)
from ..render.coldstart import cold_start_from_pod, compile_cache_kind, fold_cold_start
from . import effects, kube

log = logging.getLogger("vllm_operator.downloads")

#: Pods this process has looked at (recorded, found recorded, or found to have nothing): no second look.
_SEEN: dict[str, None] = {}
_SEEN_LIMIT = 4096
#: vLLM's download line comes early in its log: this many lines hold it (bounded to 64 KiB by kube.read_log).
LOG_LINES = 2000


def _remember(memo: dict[Any, None], key: Any) -> bool:
    """Whether `key` was in `memo` already; it is now, the oldest keys dropped past _SEEN_LIMIT."""
    if key in memo:
        return True
    memo[key] = None
    while len(memo) > _SEEN_LIMIT:
        del memo[next(iter(memo))]
    return False


def _seen(uid: str) -> bool:
    return _remember(_SEEN, uid)


def _has_download_init(pod: Mapping[str, Any]) -> bool:
    return any(c.get("name") == DOWNLOAD_CONTAINER for c in (pod.get("spec") or {}).get("initContainers") or [])


def _vllm_ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("name") == "vllm" and c.get("ready") is True
               for c in (pod.get("status") or {}).get("containerStatuses") or [])


def record_download(namespace: str, service: str, pod: Mapping[str, Any]) -> bool:
    """Record the pod's measured download in its service's status; returns whether the status was written.
    A pod that has the init container reports through it; one without is measured from vLLM's log once Ready
    (`record_ready`)."""
    if not _has_download_init(pod):
        return False
    meta = pod.get("metadata") or {}
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or meta.get("name") or "")
    failing = download_failure_summary(pod)  # classified, or no text of the container's (issue 20)
    measure = measured_download(pod)
    if failing is not None or (measure is not None and (name, None) not in _CLEARED):
        _record_failure(namespace, service, name, failing)
    if measure is None or not measure.telling() or _seen(uid):
        return False
    return _write(namespace, service, lambda _status: measure)


#: (pod, failure) pairs said already (a failure recorded, or a success that cleared it): no second read.
_CLEARED: dict[tuple[str, str | None], None] = {}


def _record_failure(namespace: str, service: str, pod: str, why: str | None) -> None:
    """status.modelCache.downloadError while a pod's download fails, cleared once a pod's download succeeded (the
    ModelCache condition repeats it, so `kubectl describe` says why a pod waits in Init)."""
    if (pod, why) in _CLEARED:
        return

    def build(stored: dict[str, Any]) -> VLLMServiceStatus | None:
        status = dict(stored.get("status") or {})
        folded = fold_download_failure(status.get("modelCache"), pod, why)
        return None if folded is None else VLLMServiceStatus.model_validate({**status, "modelCache": folded})

    if effects.update_status(namespace, service, build) and why:
        log.warning("%s/%s: the model download of pod %s fails: %s", namespace, service, pod, why)
    _remember(_CLEARED, (pod, why))


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


def _read_log(namespace: str, name: str) -> str:
    """The first lines of the vLLM container's log (one bounded read per pod: the lines read here are all early)."""
    with kube.api_errors(f"read the log of {name}"):
        return kube.read_log(namespace, name, container="vllm", tail_lines=LOG_LINES, previous=False) or ""


#: Pods whose first Ready this process has handled: one log read per pod.
_STARTS: dict[str, None] = {}


def ready_log(namespace: str, pod: Mapping[str, Any]) -> str | None:
    """The vLLM container's log, read once per pod, when its vLLM container is first seen Ready (None: not Ready,
    or read already). What a start tells is all in it: the phases, vLLM's own download, the KV cache's size."""
    meta = pod.get("metadata") or {}
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or meta.get("name") or "")
    if not _vllm_ready(pod) or meta.get("deletionTimestamp") or uid in _STARTS:
        return None
    text = _read_log(namespace, name)
    _remember(_STARTS, uid)
    return text


def _pull_events(namespace: str, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The kubelet's `Pulled` Events of the pod (one list per pod start, by its uid). An Event read that fails (an
    older chart without `list` on events, events expired) costs only the image-pull figure, never the rest."""
    meta = pod.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if not uid:
        return []
    try:
        with kube.api_errors(f"list the Events of {meta.get('name')}"):
            return kube.list_objects(kube.EVENTS, namespace,
                                     field_selector=f"involvedObject.uid={uid},reason=Pulled")
    except kopf.TemporaryError as exc:
        log.info("%s/%s: the image pull is not measured: %s", namespace, meta.get("name"), exc)
        return []


def record_ready(namespace: str, service: str, pod: Mapping[str, Any], text: str) -> bool:
    """Record what a pod's start tells (its log `text`, from `ready_log`): how long the start took, phase by phase
    (status.coldStart), and — for a pod without the init container — vLLM's own download (status.modelCache).
    Returns whether the status was written."""
    meta = pod.get("metadata") or {}
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or meta.get("name") or "")
    written = False
    if not _has_download_init(pod) and not _seen(uid):
        def from_log(status: Mapping[str, Any]) -> DownloadMeasure | None:
            size = ((status.get("modelCache") or {}).get("checkpointBytes")) or 0
            return download_from_vllm_log(text, checkpoint_bytes=int(size), pod=name)
        written = _write(namespace, service, from_log)
    measured = cold_start_from_pod(pod, text, download_container=DOWNLOAD_CONTAINER,
                                   events=_pull_events(namespace, pod))
    kind = compile_cache_kind(pod)

    def build(stored: dict[str, Any]) -> VLLMServiceStatus | None:
        status = dict(stored.get("status") or {})
        folded = fold_cold_start(status.get("coldStart"), measured, compile_cache=kind)
        return None if folded is None else VLLMServiceStatus.model_validate({**status, "coldStart": folded})

    if measured and effects.update_status(namespace, service, build):
        written = True
        log.info("%s/%s: pod %s started in %s s (%s)", namespace, service, name, measured.get("readySeconds"),
                 ", ".join(f"{k} {v}" for k, v in measured.items() if k.endswith("Seconds")))
    return written
