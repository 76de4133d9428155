"""The cold-start budget of a VLLMService, measured: how long each phase of a pod's start took, read from what the
pod already tells (its status's timestamps, the `model-download` init container, vLLM's own log lines), kept in
`status.coldStart`, and used where the operator states or budgets a start (the startup probe, the Autoscaling
condition's scale-from-zero figure).

Phases, each None when the pod did not show it:

- ``podStartSeconds``: from the pod being scheduled to its first container starting — the image pull and the volume
  attach together (from the pod's own timestamps).
- ``imagePullSeconds``: the image pull alone, from the kubelet's ``Pulled`` Events of the pod ("Successfully pulled
  image "…" in 1m23.4s (1m25s including waiting). Image size: N bytes." — the time including waiting, which is what
  the pod waited; 0 for "Container image "…" already present on machine"), with ``imageBytes`` (the sizes the kubelet
  printed, Kubernetes 1.30 and later). ``podStartSeconds`` less this is the volume attach and container creation.
- ``downloadSeconds``: the weight download, by the init container (its run time) or vLLM's own "Time spent
  downloading weights" line.
- ``loadSeconds``: vLLM's "Model loading took … and N seconds" (weights from the cache into GPU memory).
- ``compileSeconds``: vLLM's "torch.compile takes N s in total" (0 when a warm compile cache served it: vLLM then
  logs the time to load the compiled graph instead, which is this figure too).
- ``graphCaptureSeconds``: vLLM's "Graph capturing finished in N secs".
- ``engineInitSeconds``: vLLM's "init engine (profile, create kv cache, warmup model) took N seconds" (includes
  compile and capture).
- ``readySeconds``: scheduled → the vLLM container Ready: the whole start as a user waits for it.

Everything here is pure: pods and log text in, numbers out; bad input gives None, never an exception.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ..api.times import format_time, parse_time

__all__ = ["COLD_START_PHASES", "ENGINE_MARGIN", "cold_start_from_pod", "compile_cache_kind",
           "compile_cache_root", "engine_seconds_budget", "fold_cold_start", "go_duration_seconds",
           "image_pull_from_events", "phases_from_log"]

#: The phases in the order a start goes through them (status.coldStart's keys).
COLD_START_PHASES = ("podStartSeconds", "imagePullSeconds", "downloadSeconds", "loadSeconds", "compileSeconds", "graphCaptureSeconds",
                     "engineInitSeconds", "readySeconds")
#: The startup budget allows this much more than the measured engine start (a busier node, a colder cache).
ENGINE_MARGIN = 2.0
#: The floor under a measured engine budget: a start measured on a warm node must not make the probe twitchy.
MIN_ENGINE_SECONDS = 120.0

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_LOG_PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("downloadSeconds", re.compile(rf"Time spent downloading weights for \S+: {_NUMBER} seconds")),
    ("loadSeconds", re.compile(rf"Model loading took {_NUMBER} Gi?B(?: memory)? and {_NUMBER} seconds")),
    ("compileSeconds", re.compile(rf"torch\.compile takes {_NUMBER} s in total")),
    ("graphCaptureSeconds", re.compile(rf"Graph capturing finished in {_NUMBER} secs")),
    ("engineInitSeconds", re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_NUMBER} "
                                     r"seconds")),
)
#: A figure over a day is not a start: a garbled or hostile line.
_MAX_SECONDS = 86400.0
#: The kubelet's Events (pkg/kubelet/images/image_manager.go): reason Pulled for both outcomes. 1.28+ adds
#: "(D including waiting)", 1.30+ ". Image size: N bytes."; older kubelets print the pull time alone.
_PULLED = re.compile(r'Successfully pulled image "[^"]{1,1024}" in (?P<pull>[0-9.a-zµ]{1,64})'
                     r'(?: \((?P<waited>[0-9.a-zµ]{1,64}) including waiting\))?'
                     r'(?:\. Image size: (?P<size>[0-9]{1,16}) bytes)?')
_PRESENT = re.compile(r'Container image "[^"]{1,1024}" already present on machine')
_GO_UNIT = re.compile(r"([0-9]{1,20}(?:\.[0-9]{1,20})?)(ns|us|µs|ms|s|m|h)")
_GO_SCALE = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
#: The Events of one pod looked at (a pod has one Pulled per container start; more is noise or hostile).
_MAX_EVENTS = 64


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return round(value, 3) if math.isfinite(value) and 0 <= value <= _MAX_SECONDS else None


def phases_from_log(text: str) -> dict[str, float]:
    """The phases vLLM's own log lines give (the last occurrence of each: a restarted engine logs again)."""
    out: dict[str, float] = {}
    for key, pattern in _LOG_PHASES:
        found = pattern.findall(text or "")
        if not found:
            continue
        last = found[-1]
        value = _seconds(last[-1] if isinstance(last, tuple) else last)
        if value is not None:
            out[key] = value
    return out


def go_duration_seconds(text: str) -> float | None:
    """A Go `time.Duration` as the kubelet prints it (`1m23.456s`, `812ms`, `0s`) in seconds, or None."""
    if not text or len(text) > 64:
        return None
    parts = _GO_UNIT.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return _seconds(str(sum(float(number) * _GO_SCALE[unit] for number, unit in parts)))


def image_pull_from_events(events: Sequence[Mapping[str, Any]], *, pod_uid: str | None = None
                           ) -> dict[str, Any] | None:
    """`imagePullSeconds` (and `imageBytes` when the kubelet printed sizes) from the kubelet's `Pulled` Events of
    one pod: the sum over its pulls (an init container's image and vLLM's are pulled one after the other), a
    cached image counting 0. None when no Pulled Event of the pod is there (expired, or not readable)."""
    seconds, size, seen = 0.0, 0, False
    for event in list(events)[:_MAX_EVENTS]:
        if not isinstance(event, Mapping) or event.get("reason") != "Pulled":
            continue
        involved = event.get("involvedObject") or {}
        if pod_uid and isinstance(involved, Mapping) and involved.get("uid") not in (None, "", pod_uid):
            continue  # an earlier pod of the same name (a recreated LeaderWorkerSet group's)
        message = str(event.get("message") or "")[:2048]
        if _PRESENT.search(message):
            seen = True
            continue
        found = _PULLED.search(message)
        if found is None:
            continue
        waited, pull = (found["waited"] or "").rstrip("."), found["pull"].rstrip(".")
        took = go_duration_seconds(waited) if waited else go_duration_seconds(pull)
        if took is None:
            continue
        seen, seconds = True, seconds + took
        if found["size"]:
            size += int(found["size"])
    if not seen:
        return None
    out: dict[str, Any] = {"imagePullSeconds": round(seconds, 3)}
    if size:
        out["imageBytes"] = size
    return out


def _between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return _seconds(str((end - start).total_seconds()))


def _condition_time(pod: Mapping[str, Any], type_: str) -> datetime | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == type_ and c.get("status") == "True":
            return parse_time(c.get("lastTransitionTime"))
    return None


def _started(status: Mapping[str, Any]) -> datetime | None:
    for state in (status.get("state") or {}, status.get("lastState") or {}):
        if not isinstance(state, Mapping):
            continue
        for phase in ("running", "terminated"):
            found = state.get(phase)
            if isinstance(found, Mapping) and parse_time(found.get("startedAt")) is not None:
                return parse_time(found.get("startedAt"))
    return None


def _statuses(pod: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    return [s for s in (pod.get("status") or {}).get(key) or [] if isinstance(s, Mapping)]


def cold_start_from_pod(pod: Mapping[str, Any], log_text: str, *, download_container: str,
                        vllm_container: str = "vllm", events: Sequence[Mapping[str, Any]] = ()
                        ) -> dict[str, Any] | None:
    """The measured start of a pod whose vLLM container is Ready, or None (not Ready yet, or nothing measured).
    `events`: the pod's Events, for the image pull (`image_pull_from_events`).

    Only a first start counts: a vLLM container that restarted within the pod measures a crash loop, not a start."""
    vllm = next((s for s in _statuses(pod, "containerStatuses") if s.get("name") == vllm_container), None)
    if vllm is None or vllm.get("ready") is not True or (vllm.get("restartCount") or 0) > 0:
        return None
    scheduled = _condition_time(pod, "PodScheduled")
    ready = _condition_time(pod, "Ready")
    inits = _statuses(pod, "initContainerStatuses")
    starts = [t for t in (_started(s) for s in [*inits, vllm]) if t is not None]
    phases: dict[str, Any] = {"podStartSeconds": _between(scheduled, min(starts) if starts else None),
                              "readySeconds": _between(scheduled, ready)}
    download = next((s for s in inits if s.get("name") == download_container), None)
    if download is not None:
        done = ((download.get("state") or {}).get("terminated") or {})
        if done.get("exitCode") == 0:
            phases["downloadSeconds"] = _between(parse_time(done.get("startedAt")), parse_time(done.get("finishedAt")))
    for key, value in phases_from_log(log_text).items():
        if key != "downloadSeconds" or phases.get("downloadSeconds") is None:
            phases[key] = value
    meta = pod.get("metadata") or {}
    pulled = image_pull_from_events(events, pod_uid=str(meta.get("uid") or "") or None) or {}
    phases["imagePullSeconds"] = pulled.get("imagePullSeconds")
    measured = {k: phases[k] for k in COLD_START_PHASES if phases.get(k) is not None}
    if not measured:
        return None
    if "imageBytes" in pulled:
        measured["imageBytes"] = pulled["imageBytes"]
    name = str(meta.get("name") or "")
    return {**measured, "measuredPod": name, "measuredAt": format_time(ready) if ready else None}


def compile_cache_root(mount: str, vllm_version: str, gpu: str | None) -> str:
    """Where vLLM's compile and CUDA-graph caches live on a persistent model cache: one directory per vLLM release
    and GPU (a compiled graph of one release or GPU architecture is not reused by another), under the mount."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", gpu or "any-gpu")[:63].strip("-.") or "any-gpu"  # never "." or ".."
    release = re.sub(r"[^A-Za-z0-9.]+", "-", vllm_version)[:32].strip("-.") or "unknown"
    return f"{mount.rstrip('/')}/vllm-compile/{release}/{slug}"


def compile_cache_kind(pod: Mapping[str, Any], *, vllm_container: str = "vllm") -> str:
    """persistent when the pod's VLLM_CACHE_ROOT lies on its model-cache claim, else ephemeral."""
    spec = pod.get("spec") or {}
    claim = any(isinstance(v, Mapping) and v.get("name") == "model-cache" and v.get("persistentVolumeClaim")
                for v in spec.get("volumes") or [])
    for container in spec.get("containers") or []:
        if not isinstance(container, Mapping) or container.get("name") != vllm_container:
            continue
        mounts = [str(m.get("mountPath") or "") for m in container.get("volumeMounts") or []
                  if isinstance(m, Mapping) and m.get("name") == "model-cache"]
        root = next((str(e.get("value") or "") for e in container.get("env") or []
                     if isinstance(e, Mapping) and e.get("name") == "VLLM_CACHE_ROOT"), "")
        if claim and root and any(m and root.startswith(m.rstrip("/") + "/") for m in mounts):
            return "persistent"
    return "ephemeral"


def fold_cold_start(current: Mapping[str, Any] | None, measured: Mapping[str, Any] | None,
                    *, compile_cache: str) -> dict[str, Any] | None:
    """`status.coldStart` with this pod's start, or None when there is nothing new (no measure, or this pod's
    start already recorded). `compile_cache` says where the compile caches were (persistent / ephemeral)."""
    if not measured:
        return None
    before = dict(current or {})
    if before.get("measuredPod") == measured.get("measuredPod"):
        return None
    folded = {k: v for k, v in measured.items() if v is not None}
    folded["compileCache"] = compile_cache
    starts = int(before.get("starts") or 0) + 1
    folded["starts"] = starts
    engine = measured.get("engineInitSeconds")
    slowest = before.get("slowestEngineInitSeconds")
    if isinstance(engine, (int, float)):
        folded["slowestEngineInitSeconds"] = max(float(engine), float(slowest)) if isinstance(
            slowest, (int, float)) else float(engine)
    elif isinstance(slowest, (int, float)):
        folded["slowestEngineInitSeconds"] = float(slowest)
    return folded


def engine_seconds_budget(cold_start: Mapping[str, Any] | None, default: float) -> float:
    """What the startup probe allows for vLLM's engine start (compile, profiling, graphs): ENGINE_MARGIN × the
    slowest engine start measured for this service, at least MIN_ENGINE_SECONDS, at most `default` (the assumed
    figure, used while nothing is measured)."""
    slowest = (cold_start or {}).get("slowestEngineInitSeconds")
    if not isinstance(slowest, (int, float)) or isinstance(slowest, bool) or not math.isfinite(slowest):
        return default
    return min(max(ENGINE_MARGIN * float(slowest), MIN_ENGINE_SECONDS), default)
