"""A simulated kubelet, scheduler and Deployment controller for the emulated API, on a compressed clock.

:class:`Kubelet` does what a real cluster's control plane and node agents would do for the operator's objects,
through the emulator's thread-safe direct API:

* **Deployment controller**: one ReplicaSet per pod-template hash (``pod-template-hash`` label, owner references
  Deployment → ReplicaSet → Pod, so the emulator's garbage collector cascades deletes). A changed template rolls
  out: the new ReplicaSet's pods are created; old pods that are not Ready are deleted at once (as the real controller
  scales unhealthy replicas down first), Ready ones once the new pods are Ready — or first, down to
  ``replicas - maxUnavailable``, when the strategy has ``maxSurge: 0`` (or is ``Recreate``). Deployment and ReplicaSet status
  (replicas, updatedReplicas, readyReplicas, availableReplicas, observedGeneration, conditions) follow.
* **Scheduler**: a pod goes to a node whose labels match its ``nodeSelector`` and which has enough allocatable
  ``nvidia.com/gpu`` and memory left; otherwise it stays Pending with ``PodScheduled=False, Unschedulable`` and the
  scheduler's message.
* **Kubelet**: Pending → ContainerCreating (each image of the pod pulled once per node; the ``Pulling``/``Pulled``
  Events as the real kubelet prints them: "Successfully pulled image "…" in 30s (30s including waiting). Image size:
  N bytes.", or "Container image "…" already present on machine" for every later container start on that node) →
  Running, not ready while vLLM loads → Ready; or Terminated (``Error`` exit 1, ``OOMKilled`` exit 137; ``message``
  is the log tail, as with ``terminationMessagePolicy: FallbackToLogsOnError``) → ``CrashLoopBackOff`` with
  back-off 10 s, 20 s, 40 s … capped at 300 s (simulated) and a growing ``restartCount``. Each vLLM container run goes through
  :func:`vllm_operator_sim.startup.simulate_startup` with the node's GPU and the service's hidden facts; its log is
  revealed line by line as simulated time passes (``GET pods/log``).
* **StatefulSets** (:mod:`vllm_operator_sim.statefulset`): pods `<sts>-<ordinal>` with a claim per pod from
  `volumeClaimTemplates`, OrderedReady or Parallel, rolling updates from the highest ordinal (with a partition).
* **Volumes** (:mod:`vllm_operator_sim.volumes`): claims bind (Immediate, or WaitForFirstConsumer when the scheduler
  places the first pod); a pod whose claim is missing or unbound stays Pending, a node-local volume keeps its pods on
  its node, and a ReadWriteOnce network volume is attached to one node at a time: a pod on another node stays
  ContainerCreating (Multi-Attach ``FailedAttachVolume``) until no pod on the first node uses it.
* **DaemonSets** (:mod:`vllm_operator_sim.daemonsets`, e.g. the operator's prewarm DaemonSet): a pod per matching
  node, bound to it; its init containers' images are pulled like any other.
* **Model downloads**: a pod's weights come from its ``model-cache`` volume (a claim outlives the pod, an emptyDir
  lives as long as the pod). The first fetch on a volume is a ``download`` event taking ``size / download_mib_per_s``
  simulated seconds, every later one a ``cache-hit``. A ``model-download`` init container (render/cache.py) fetches
  before vLLM starts: the pod shows ``Init:0/1``, ``Initialized=False``, then ``initContainerStatuses`` with the
  run's ``startedAt``/``finishedAt`` and, as its termination message, the ``{"downloadedBytes", "seconds"}`` report
  the real script writes; vLLM then finds the weights (``cache-hit``). Without one, vLLM downloads them itself after
  "Starting to load model" and logs its own "Time spent downloading weights" line; the run is that much longer.
  A model the simulated hub gates (``gated_models``) fails the init container when its env has no ``HF_TOKEN``:
  huggingface_hub's ``GatedRepoError`` as the end of its log and termination message, exit code 1, then
  ``Init:CrashLoopBackOff`` with the kubelet's back-off and a growing ``restartCount``, as for any container.
* **Traffic**: :meth:`Kubelet.send_traffic` gives a service a standing load; a Ready pod whose hidden facts say the
  batch does not fit dies of a CUDA OOM while serving (and so does every later pod with the same flags).

Drive it with :meth:`start` (a background thread ticking every ``tick_s`` real seconds on a compressed clock), with a
:class:`~vllm_operator_sim.pacer.Pacer` (the clock moves only while the operator is idle, and stops at every
:meth:`next_due`), or call :meth:`tick` yourself with a manual :class:`~vllm_operator_sim.clock.SimClock` (tests).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import logging
import random
import re
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from vllm_operator.api.labels import ANNOTATION_VLLM_VERSION
from vllm_operator.hub import resolve_model_id
from vllm_operator.modelfiles import ModelFiles, ModelSourceError, model_files_from_inline
from vllm_operator.planner.gpus import GPUCatalog, GPUSpec, load_gpu_catalog, resolve_node_gpu
from vllm_operator.planner.memory import EngineFlags
from vllm_operator.quantity import quantity_gib

from . import shared_gpu
from .clock import SimClock
from .daemonsets import DaemonSetController, tolerated
from .lws import WORKER_INDEX, LWSController
from .realvllm import RealVLLM, advance_real_pod, container_probes, start_real_run
from .startup import (
    HiddenFacts,
    LogLine,
    StartupOutcome,
    serving_oom,
    simulate_startup,
    termination_message,
    worker_network_exit,
)
from .statefulset import COMPONENT as STATEFULSET_COMPONENT
from .statefulset import StatefulSetController
from .volumes import Volumes

__all__ = ["BACKOFF_CAP_S", "BACKOFF_INITIAL_S", "Kubelet", "ServiceStats", "SimEvent", "backoff_delay"]

log = logging.getLogger(__name__)

LABEL_SERVICE = "vllm-operator.dev/service"
LABEL_HASH = "pod-template-hash"
GPU = "nvidia.com/gpu"
GPU_COUNT = "nvidia.com/gpu.count"
BACKOFF_INITIAL_S = 10.0
BACKOFF_CAP_S = 300.0
BACKOFF_RESET_S = 600.0  # a container that ran this long before dying starts its back-off again at 10 s
TERMINATED_SHOWN_S = 1.0  # how long state.terminated shows before the kubelet reports CrashLoopBackOff
SCHEDULE_S = 1.0
MOUNT_TIMEOUT_S = 120.0  # the kubelet's wait for a pod's volumes to attach and mount before its FailedMount Warning
CREATE_S = 2.0
GENERIC_READY_S = 2.0
DOWNLOAD_MIB_PER_S = 10240.0  # the simulated network to the weights: a cluster-local mirror on 100 GbE (10 GiB/s)
CACHE_CHECK_S = 1.5           # an init container that finds the weights: listing the repository, comparing hashes
HUB_REFUSAL_S = 1.0           # an init container the hub refuses (a gated model without a token): one API call
DOWNLOAD_CONTAINER = "model-download"
#: The container runtime's pod sandbox image: on every node before any pod (containerd's sandbox_image).
SANDBOX_IMAGE = "registry.k8s.io/pause:"
IMAGE_BYTES = 9_412_003_840   # the vLLM image's size as the kubelet reports it (unpacked; vllm-openai is ~9 GB)


def backoff_delay(failures: int) -> float:
    """The kubelet's restart back-off after the n-th consecutive failure: 10 s, 20 s, 40 s, … 300 s."""
    return float(min(BACKOFF_INITIAL_S * 2.0 ** max(failures - 1, 0), BACKOFF_CAP_S))


class DirectAPI(Protocol):
    """The part of the emulator's direct API the kubelet uses (KubeEmulator or EmulatedAPIServer)."""

    def create_object(self, resource: str, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]: ...
    def get_object(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None: ...
    def list_objects(self, resource: str, namespace: str | None = None, *, label_selector: str | None = None,
                     field_selector: str | None = None) -> list[dict[str, Any]]: ...
    def patch_object(self, resource: str, name: str, patch: Any, namespace: str | None = None, *,
                     patch_type: str = "merge", subresource: str | None = None) -> dict[str, Any]: ...
    def delete_object(self, resource: str, name: str, namespace: str | None = None, *,
                      propagation_policy: str | None = None) -> dict[str, Any] | None: ...
    def set_pod_log(self, namespace: str, name: str, text: str, container: str | None = None, *,
                    previous: bool = False) -> None: ...


@dataclass(frozen=True)
class SimEvent:
    """Something the kubelet did, for live views (``t`` in simulated seconds)."""

    t: float
    namespace: str
    service: str
    pod: str
    kind: str  # scheduled unschedulable pulling started ready failed backoff restarted deleted attached attach-failed
    #            mount-failed (volumes.py) download cache-hit …
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class ServiceStats:
    """Per VLLMService (by the pods' service label): what its pods went through, in simulated time."""

    first_pod_at: float | None = None
    ready_at: float | None = None          # first time all replicas of the current template were Ready
    failed_starts: int = 0                 # container runs that died before becoming Ready
    serving_failures: int = 0              # Ready containers that died while serving
    pods_created: int = 0
    last_failure: str = ""
    last_outcome: StartupOutcome | None = None


@dataclass
class _Pod:
    namespace: str
    name: str
    uid: str
    service: str
    owner_rs: str | None
    created: float
    image: str
    args: list[str]
    gpus: int
    memory_limit_gib: float | None
    memory_request_gib: float
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]
    vllm: bool
    declared_version: str | None = None   # the vllm-operator.dev/vllm-version annotation
    node: str | None = None
    state: str = "Unscheduled"  # Unscheduled Creating Initializing Running Ready Terminated BackOff
    due: float = float("inf")
    unschedulable_message: str = ""
    scheduled_at: float | None = None
    started_at: float | None = None       # pod startTime
    run_started: float | None = None
    run_finished: float | None = None
    restart_count: int = 0
    consecutive_failures: int = 0
    outcome: StartupOutcome | None = None
    serving: list[LogLine] = field(default_factory=list)  # serving-time lines, offsets from run start
    death: tuple[str, int, str, str] | None = None  # (reason, exit code, message, summary) of the run ending at `due`
    last_terminated: dict[str, Any] | None = None
    conditions: dict[str, tuple[str, float]] = field(default_factory=dict)  # type → (status, since)
    traffic_checked: tuple[int, int] | None = None
    pulling: bool = False
    pull_wait_s: float = 0.0     # how long its image pull took, waiting for another pod's pull of it included
    images: tuple[str, ...] = ()  # every image of its containers, init containers first (each pulled once per node)
    pull_said: bool = False      # its Pulled Event for the first container is posted
    secrets: tuple[str, ...] = ()   # Secrets the container's env needs (not optional)
    logs_as_message: bool = False   # terminationMessagePolicy: FallbackToLogsOnError
    config_error: str = ""
    log_lines_shown: int = -1
    written: dict[str, Any] | None = None
    cache_volume: str = ""   # where the weights are cached: "pvc:<claim>" (outlives the pod) or "pod:<uid>" (emptyDir)
    env: dict[str, str] = field(default_factory=dict)   # the vLLM container's literal env (VLLM_PP_LAYER_PARTITION)
    compile_cache: str = ""   # "<claim>|<VLLM_CACHE_ROOT>" when vLLM's compile cache outlives the pod, else ""
    node_rank: int | None = None   # a pod of a LeaderWorkerSet group: its worker index (vLLM --node-rank)
    death_kind: str | None = None  # what a Ready container dies of, when not a serving CUDA OOM
    init_model: str | None = None            # the model-download init container's model, while it has not succeeded
    init_status: dict[str, Any] | None = None  # its initContainerStatuses entry
    init_token: bool = False                 # its env has a Hugging Face token
    claim: str | None = None  # "<namespace>/<ResourceClaim>": the DRA-shared GPU it runs on (issue 26)
    real: bool = False                       # its vLLM container runs as a real process (realvllm.py)
    startup_probe_s: float | None = None     # the vllm container's startup probe budget (realvllm.container_probes)
    probed: bool = True                      # it has a readiness or startup probe (without: Ready once it runs)
    grace_s: float = 30.0                    # terminationGracePeriodSeconds
    volumes: tuple[tuple[str, str], ...] = ()  # (volume, claim) of each persistentVolumeClaim volume
    mounted: bool = False                    # its volumes are attached to its node (volumes.py)
    attach_since: float | None = None        # since when it waits for a volume attached to another node
    create_due: float = 0.0                  # when its creation ends, had it not waited for a volume
    mount_warnings: int = 0                  # FailedMount Warnings posted while waiting


def _cache_volume(spec: Mapping[str, Any], uid: str) -> str:
    """The pod's `model-cache` volume as a cache key: a claim is shared by every pod that mounts it, an emptyDir
    lives as long as the pod (container restarts keep it)."""
    for volume in spec.get("volumes") or []:
        if volume.get("name") == "model-cache" and volume.get("persistentVolumeClaim"):
            return f"pvc:{volume['persistentVolumeClaim'].get('claimName', '')}"
    return f"pod:{uid}"


def _compile_cache(spec: Mapping[str, Any], cache_volume: str, env: Mapping[str, str]) -> str:
    """Where the vLLM container's compile cache outlives it: "<claim volume>|<VLLM_CACHE_ROOT>" when that root lies
    on the model-cache claim (render/coldstart.py), else "" (compiled again on every start)."""
    root = env.get("VLLM_CACHE_ROOT", "")
    if not root or not cache_volume.startswith("pvc:"):
        return ""
    mounts = [str(m.get("mountPath") or "") for c in spec.get("containers") or [] for m in c.get("volumeMounts") or []
              if m.get("name") == "model-cache"]
    return f"{cache_volume}|{root}" if any(m and root.startswith(m.rstrip("/") + "/") for m in mounts) else ""


#: A warm compile cache: loading the compiled graphs takes this share of compiling them (at least a second).
WARM_COMPILE_SHARE = 0.1
_ENGINE_INIT = re.compile(r"^(init engine \(profile, create kv cache, warmup model\) took )([0-9.]+)( seconds)$")


@dataclass
class _Deploy:
    conditions: dict[str, tuple[str, str, float]] = field(default_factory=dict)  # type → (status, reason, since)
    written: dict[str, Any] | None = None
    revision: dict[str, int] = field(default_factory=dict)  # template hash → revision


def _download_init(spec: Mapping[str, Any]) -> str | None:
    """The model the pod's `model-download` init container fetches (its first argument), if it has one."""
    for container in spec.get("initContainers") or []:
        if container.get("name") == DOWNLOAD_CONTAINER and container.get("args"):
            return str(container["args"][0])
    return None


def _download_token(spec: Mapping[str, Any]) -> bool:
    """Whether the `model-download` init container's env carries a Hugging Face token (a value or a Secret's key)."""
    for container in spec.get("initContainers") or []:
        if container.get("name") == DOWNLOAD_CONTAINER:
            return any(e.get("name") in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN") and (e.get("value") or e.get(
                "valueFrom")) for e in container.get("env") or [])
    return False


def _gated_error(model: str, revision: str) -> str:
    """The end of the download script's log when the hub refuses a gated model (huggingface_hub's GatedRepoError
    from `HfApi.list_repo_files`, re-raised once the cache has no snapshot either)."""
    return ("Traceback (most recent call last):\n  File \"<string>\", line 55, in <module>\n"
            "  File \"<string>\", line 37, in main\n"
            f"huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-6746a1f0-sim)\n\n"
            f"Cannot access gated repo for url https://huggingface.co/api/models/{model}/tree/{revision or 'main'}"
            "?recursive=False&expand=False.\n"
            f"Access to model {model} is restricted. You must have access to it and be authenticated to access it. "
            "Please log in.\n")


def _template_hash(template: Mapping[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(template, sort_keys=True, default=str).encode()).hexdigest()
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    number = int(digest[:16], 16)
    chars = []
    for _ in range(10):
        number, rest = divmod(number, len(alphabet))
        chars.append(alphabet[rest])
    return "".join(chars)


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj.get("metadata") or {})


def _declared_version(meta: Mapping[str, Any]) -> str | None:
    """The vLLM release the operator planned the pod for (its annotation), if any."""
    value = (meta.get("annotations") or {}).get(ANNOTATION_VLLM_VERSION)
    return str(value) if isinstance(value, str) and value else None


def _is_vllm(container: Mapping[str, Any]) -> bool:
    words = " ".join([str(container.get("image", "")), *map(str, container.get("command") or []), str(
        container.get("name", ""))])
    return "vllm" in words.lower()


class Kubelet:
    """The simulated control plane and node agents (see the module docstring)."""

    def __init__(self, api: DirectAPI, clock: SimClock, *, hidden: Callable[[str, str], HiddenFacts] | None = None,
                 catalog: GPUCatalog | None = None, image_pull_s: float = 30.0, image_bytes: int = IMAGE_BYTES,
                 tick_s: float = 0.02,
                 seed: int = 0, on_event: Callable[[SimEvent], None] | None = None,
                 post_events: bool = True, download_mib_per_s: float = DOWNLOAD_MIB_PER_S,
                 gated_models: Collection[str] = (), real: RealVLLM | None = None) -> None:
        self.api = api
        #: runs the vLLM containers of the models it has a directory for as real processes (realvllm.py)
        self.real = real
        self.clock = clock
        self._hidden = hidden or (lambda _ns, _name: HiddenFacts())
        self.catalog = catalog or load_gpu_catalog()
        self.image_pull_s = image_pull_s
        self.image_bytes = image_bytes
        self.download_mib_per_s = download_mib_per_s
        #: model ids the simulated hub serves only with a token (the model-download init container fails without)
        self.gated_models = frozenset(gated_models)
        self.tick_s = tick_s
        self.on_event = on_event
        self.post_events = post_events
        self.events: list[SimEvent] = []
        self._rng = random.Random(seed)
        self._pods: dict[str, _Pod] = {}
        self._deploys: dict[tuple[str, str], _Deploy] = {}
        self._stats: dict[tuple[str, str], ServiceStats] = {}
        self._images: dict[str, dict[str, float]] = {}  # node → image → available at
        self._traffic: dict[tuple[str, str], tuple[int, int]] = {}
        self._models: dict[str, ModelFiles | None] = {}
        self._node_gpus: dict[str, GPUSpec | None] = {}
        self._claims: dict[str, str] = {}  # DRA ResourceClaim ("<ns>/<name>") → the node whose GPU it was given
        self._shared: dict[str, shared_gpu.SharedGPU] = {}  # claim or time-sliced node → its shared GPU
        self._cached: set[tuple[str, str, str]] = set()  # (namespace, cache volume, model) already downloaded
        self._compiled: set[tuple[str, str]] = set()  # (namespace, claim|compile root) holding compiled graphs
        self._worker_exits: dict[tuple[str, str], int] = {}  # (namespace, service) → workers died behind a leader
        self.lws = LWSController(cast(Any, api), on_event=self._lws_event, on_available=self._workload_available)
        self.statefulsets = StatefulSetController(cast(Any, api), on_event=self._statefulset_event,
                                                  on_available=self._workload_available,
                                                  now=lambda: self.clock.datetime_at(self.clock.now()))
        self.daemonsets = DaemonSetController(cast(Any, api))
        #: claims' binding and the node each ReadWriteOnce volume is attached to (volumes.py)
        self.volumes = Volumes(cast(Any, api), self._volume_event)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    # --- running -------------------------------------------------------------------------------------------

    def start(self) -> Kubelet:
        if self._thread is not None:
            raise RuntimeError("the kubelet is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="sim-kubelet", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self.real is not None:
            self.real.stop_all()

    def __enter__(self) -> Kubelet:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception as exc:  # keep simulating; the error is kept for tests and logs
                log.exception("simulated kubelet tick failed")
                self.errors.append(repr(exc))

    # --- public queries and inputs -------------------------------------------------------------------------

    def stats(self, service: str, namespace: str = "default") -> ServiceStats:
        with self._lock:
            return copy.copy(self._stats.setdefault((namespace, service), ServiceStats()))

    def send_traffic(self, service: str, concurrency: int, context: int, namespace: str = "default") -> None:
        """Give the service's Ready pods (now and later) ``concurrency`` requests of ``context`` tokens."""
        with self._lock:
            self._traffic[namespace, service] = (concurrency, context)
            for pod in self._pods.values():
                if (pod.namespace, pod.service) == (namespace, service):
                    pod.traffic_checked = None

    def stop_traffic(self, service: str, namespace: str = "default") -> None:
        with self._lock:
            self._traffic.pop((namespace, service), None)

    def cached_on(self, claim: str, namespace: str = "default") -> set[str]:
        """The models whose weights the claim holds: what a pod mounting it as its `model-cache` volume (a
        Deployment's claim, or a StatefulSet's or LeaderWorkerSet's claim per pod) finds without a download."""
        with self._lock:
            return {model for ns, volume, model in self._cached if (ns, volume) == (namespace, f"pvc:{claim}")}

    def pod_outcome(self, name: str, namespace: str = "default") -> StartupOutcome | None:
        with self._lock:
            for pod in self._pods.values():
                if (pod.namespace, pod.name) == (namespace, name):
                    return pod.outcome
        return None

    def next_due(self) -> float:
        """The simulated time of the next pod transition (image pulled, container started, vLLM Ready or dead,
        back-off over, …); inf when nothing is scheduled. A pacer stops the clock there, so that one tick never
        makes two transitions of a pod that an observer should see one at a time."""
        with self._lock:
            return min((pod.due for pod in self._pods.values()), default=float("inf"))

    # --- one pass ------------------------------------------------------------------------------------------

    def tick(self) -> None:
        """Bring the cluster up to the clock's current time."""
        with self._lock:
            now = self.clock.now()
            self._sync_pods()
            if self.real is not None:  # a deleted pod's real process stops with it
                self.real.keep_only(set(self._pods))
            self._control_deployments(now)
            self.lws.control()
            self.statefulsets.control()
            self.daemonsets.control()
            self._sync_pods()
            self.volumes.sync([_meta(n)["name"] for n in self._nodes()])
            self._schedule(now)
            self._attach_volumes(now)
            for pod in sorted(self._pods.values(), key=lambda p: (p.created, p.name)):
                self._advance(pod, now)
                self._write_pod(pod, now)
            self._control_deployments(now, status_only=True)
            self.lws.control()
            self.statefulsets.control()

    # --- events --------------------------------------------------------------------------------------------

    def _event(self, pod: _Pod, t: float, kind: str, message: str, k8s_reason: str | None = None,
               warning: bool = False, **details: Any) -> None:
        """Record a SimEvent (and post a core/v1 Event with ``k8s_reason``, as the kubelet would)."""
        event = SimEvent(t=t, namespace=pod.namespace, service=pod.service, pod=pod.name, kind=kind,
                         message=message, details=details)
        self.events.append(event)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # a view must not break the cluster
                log.exception("event callback failed")
        if self.post_events and k8s_reason:
            self._post(pod, k8s_reason, message, warning)

    def _post(self, pod: _Pod, reason: str, message: str, warning: bool) -> None:
        stamp = self.clock.timestamp()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": pod.namespace,
                                   "uid": pod.uid},
                "type": "Warning" if warning else "Normal", "reason": reason, "message": message[:1024],
                "source": {"component": "default-scheduler" if reason in ("Scheduled", "FailedScheduling") else "kubelet",
                           "host": pod.node or ""},
                "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
        with contextlib.suppress(Exception):
            self.api.create_object("events", body, namespace=pod.namespace)

    def _workload_available(self, namespace: str, meta: Mapping[str, Any]) -> None:
        """Every group of a LeaderWorkerSet (every pod of a StatefulSet) is ready and updated: the service's time to
        Ready, as for a Deployment."""
        service = ((meta.get("labels") or {}).get(LABEL_SERVICE)) or meta.get("name", "")
        stats = self._stats.setdefault((namespace, service), ServiceStats())
        if stats.ready_at is None:
            stats.ready_at = self.clock.now()

    def _lws_event(self, namespace: str, name: str, reason: str, message: str) -> None:
        """An Event of the simulated LeaderWorkerSet controller (RecreateGroup)."""
        self._controller_event({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": name,
                                "namespace": namespace}, "Normal", reason, message, "lws-controller")

    def _statefulset_event(self, namespace: str, meta: Mapping[str, Any], kind: str, reason: str,
                           message: str) -> None:
        """An Event of the simulated StatefulSet controller (SuccessfulCreate, SuccessfulDelete, …)."""
        self._controller_event({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": meta.get("name", ""),
                                "namespace": namespace, "uid": meta.get("uid", "")}, kind, reason, message,
                               STATEFULSET_COMPONENT)

    def _controller_event(self, involved: Mapping[str, Any], kind: str, reason: str, message: str,
                          component: str) -> None:
        """A core/v1 Event a controller posts about its object (`involved`)."""
        stamp = self.clock.timestamp()
        namespace = str(involved.get("namespace", "default"))
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{involved.get('name', '')}.", "namespace": namespace},
                "involvedObject": dict(involved), "type": kind, "reason": reason, "message": message[:1024],
                "source": {"component": component}, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
        with contextlib.suppress(Exception):
            self.api.create_object("events", body, namespace=namespace)

    # --- pods: discovery -----------------------------------------------------------------------------------

    def _sync_pods(self) -> None:
        seen = set()
        for obj in self.api.list_objects("pods"):
            meta = _meta(obj)
            uid = meta.get("uid", "")
            seen.add(uid)
            if uid in self._pods:
                continue
            self._pods[uid] = self._new_record(obj)
        for uid in [u for u in self._pods if u not in seen]:
            pod = self._pods.pop(uid)
            self._release(pod)
            self._event(pod, self.clock.now(), "deleted", f"pod {pod.name} deleted")

    def _new_record(self, obj: Mapping[str, Any]) -> _Pod:
        meta = _meta(obj)
        spec = obj.get("spec") or {}
        containers = spec.get("containers") or [{}]
        main = next((c for c in containers if c.get("name") == "vllm"), containers[0])
        resources = main.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        gpus = int(str(limits.get(GPU) or requests.get(GPU) or 0))
        labels = meta.get("labels") or {}
        owner = next((r.get("name") for r in meta.get("ownerReferences") or [] if r.get("kind") == "ReplicaSet"), None)
        service = labels.get(LABEL_SERVICE) or labels.get("app.kubernetes.io/instance") or meta.get("name", "")
        now = self.clock.now()
        pod = _Pod(namespace=meta.get("namespace", "default"), name=meta.get("name", ""), uid=meta.get("uid", ""),
                   service=service, owner_rs=owner, created=now, image=str(main.get("image", "")),
                   args=[*map(str, main.get("command") or []), *map(str, main.get("args") or [])], gpus=gpus,
                   memory_limit_gib=quantity_gib(limits.get("memory")),
                   memory_request_gib=quantity_gib(requests.get("memory") or limits.get("memory")) or 0.0,
                   node_selector=dict(spec.get("nodeSelector") or {}),
                   tolerations=list(spec.get("tolerations") or []), vllm=_is_vllm(main), secrets=_secret_refs(main),
                   declared_version=_declared_version(meta),
                   logs_as_message=main.get("terminationMessagePolicy") == "FallbackToLogsOnError",
                   node=spec.get("nodeName"))
        pod.cache_volume = _cache_volume(spec, pod.uid)
        pod.volumes = tuple((str(v.get("name") or ""), str(v["persistentVolumeClaim"].get("claimName") or ""))
                            for v in spec.get("volumes") or [] if isinstance(v.get("persistentVolumeClaim"), dict))
        pod.images = tuple(dict.fromkeys(str(c.get("image", "")) for c in [
            *(spec.get("initContainers") or []), *containers] if c.get("image")))
        pod.startup_probe_s, pod.probed = container_probes(main)
        grace = spec.get("terminationGracePeriodSeconds")
        pod.grace_s = float(grace) if isinstance(grace, int) and not isinstance(grace, bool) and grace >= 0 else 30.0
        pod.claim = shared_gpu.pod_claim(pod.namespace, spec)
        pod.env = {str(e.get("name")): str(e["value"]) for e in main.get("env") or [] if "value" in e}
        pod.compile_cache = _compile_cache(spec, pod.cache_volume, pod.env)
        rank = str(labels.get(WORKER_INDEX, ""))
        pod.node_rank = int(rank) if rank.isdigit() else None
        pod.init_model = _download_init(spec)
        pod.init_token = _download_token(spec)
        stats = self._stats.setdefault((pod.namespace, pod.service), ServiceStats())
        stats.pods_created += 1
        if stats.first_pod_at is None:
            stats.first_pod_at = now
        self._set_condition(pod, "PodScheduled", "False", now)
        if pod.node:
            self._bind(pod, pod.node, now)
        return pod

    # --- scheduling ----------------------------------------------------------------------------------------

    def _nodes(self) -> list[dict[str, Any]]:
        return [n for n in self.api.list_objects("nodes") if not (n.get("spec") or {}).get("unschedulable")]

    def _schedule(self, now: float) -> None:
        waiting = [p for p in self._pods.values() if p.node is None]
        if not waiting:
            return
        nodes = self._nodes()
        for pod in sorted(waiting, key=lambda p: (p.created, p.name)):
            refused = self.volumes.refusal(pod.namespace, [c for _, c in pod.volumes],
                                           functools.partial(self._claim_users, pod))
            if refused is not None:  # the scheduler's PreFilter: every node fails alike
                total = len(nodes)
                chosen, message = None, (f"0/{total} nodes are available: {refused}. preemption: 0/{total} nodes "
                                         f"are available: {total} Preemption is not helpful for scheduling.")
            else:
                chosen, message = self._fit(pod, nodes)
            if chosen is None:
                if message != pod.unschedulable_message:
                    pod.unschedulable_message = message
                    self._event(pod, now, "unschedulable", message, "FailedScheduling", warning=True)
                continue
            if pod.claim is not None:  # the claim is allocated one GPU of this node; its other pods follow it
                self._claims.setdefault(pod.claim, chosen)
            self.volumes.bind_for(pod.namespace, [c for _, c in pod.volumes], chosen)  # WaitForFirstConsumer
            self._bind(pod, chosen, now)
            self.api.patch_object("pods", pod.name, {"spec": {"nodeName": chosen}}, pod.namespace)
            self._event(pod, now, "scheduled", f"Successfully assigned {pod.namespace}/{pod.name} to {chosen}",
                        "Scheduled", node=chosen, gpus=pod.gpus)
            if pod.pulling:
                self._event(pod, now, "pulling", f'Pulling image "{(pod.images or (pod.image,))[0]}"', "Pulling")

    def _claim_users(self, pod: _Pod, claim: str) -> list[str]:
        """The other pods on a node whose volumes include the claim (what the scheduler's VolumeRestrictions sees)."""
        return [p.name for p in self._pods.values() if p.uid != pod.uid and p.node is not None
                and p.namespace == pod.namespace and any(c == claim for _, c in p.volumes)]

    def _attach_volumes(self, now: float) -> None:
        """The attach/detach controller: detach what no pod on its node uses, then attach the volumes of every
        scheduled pod still being created (oldest first); a pod whose ReadWriteOnce volume is attached to another
        node in use waits (ContainerCreating) and starts once it is attached to its own."""
        users: dict[tuple[str, str], dict[str, list[str]]] = {}
        in_use = set()
        for pod in self._pods.values():
            if pod.node is None:
                continue
            for _, claim in pod.volumes:
                users.setdefault((pod.namespace, claim), {}).setdefault(pod.node, []).append(pod.name)
                volume = self.volumes.volume_of(pod.namespace, claim)
                if volume is not None:
                    in_use.add((volume, pod.node))
        self.volumes.detach_unused(in_use)
        for pod in sorted(self._pods.values(), key=lambda p: (p.created, p.name)):
            if pod.node is None or pod.mounted or pod.state != "Creating":
                continue
            involved = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
            # a pod placed without the scheduler (a DaemonSet's): its WaitForFirstConsumer claims bind to its node
            self.volumes.bind_for(pod.namespace, [c for _, c in pod.volumes], pod.node)
            ready = True
            for _, claim in pod.volumes:
                others = {node: [n for n in names if n != pod.name]
                          for node, names in users.get((pod.namespace, claim), {}).items()}
                if not self.volumes.attach(pod.namespace, claim, pod.node, others, involved):
                    ready = False
                    break
            if ready:
                pod.mounted = True
                if pod.attach_since is not None:  # mounted now: the containers are created from here
                    pod.due = max(pod.create_due, now + CREATE_S)
                    pod.attach_since = None
            elif pod.attach_since is None:
                pod.attach_since, pod.create_due = now, pod.due
                pod.due = now + MOUNT_TIMEOUT_S

    def _volume_event(self, involved: Mapping[str, Any], kind: str, reason: str, message: str,
                      component: str) -> None:
        """An Event of the simulated binder or attach/detach controller (volumes.py); a pod's is a SimEvent too."""
        if involved.get("kind") == "Pod":
            pod = self._pods.get(str(involved.get("uid")))
            if pod is not None:
                self._event(pod, self.clock.now(), "attach-failed" if kind == "Warning" else "attached", message,
                            reason=reason)
        if self.post_events:
            self._controller_event(involved, kind, reason, message, component)

    def _used(self, node: str) -> tuple[int, float]:
        gpus, memory = 0, 0.0
        for pod in self._pods.values():
            if pod.node == node:
                gpus += pod.gpus
                memory += pod.memory_request_gib
        gpus += sum(1 for claimed in self._claims.values() if claimed == node)  # a shared GPU counts once
        return gpus, memory

    def _fit(self, pod: _Pod, nodes: list[dict[str, Any]]) -> tuple[str | None, str]:
        no_match = no_gpu = no_memory = tainted = far = 0
        candidates = []
        for node in nodes:
            meta = _meta(node)
            labels = meta.get("labels") or {}
            if any(labels.get(k) != v for k, v in pod.node_selector.items()):
                no_match += 1
                continue
            taints = [t for t in (node.get("spec") or {}).get("taints") or []
                      if t.get("effect") in ("NoSchedule", "NoExecute")]
            if not all(tolerated(pod.tolerations, t) for t in taints):
                tainted += 1
                continue
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            used_gpus, used_memory = self._used(meta["name"])
            if pod.gpus and used_gpus + pod.gpus > int(str(allocatable.get(GPU) or 0)):
                no_gpu += 1
                continue
            if pod.claim is not None and not shared_gpu.claim_fits(
                    self._claims.get(pod.claim), meta["name"], used_gpus, int(str(labels.get(GPU_COUNT) or 0))):
                no_gpu += 1
                continue
            node_memory = quantity_gib(allocatable.get("memory"))
            if node_memory is not None and used_memory + pod.memory_request_gib > node_memory:
                no_memory += 1
                continue
            if not self.volumes.reachable(pod.namespace, [c for _, c in pod.volumes], meta["name"]):
                far += 1
                continue
            candidates.append((used_gpus, meta["name"]))
        if candidates:
            return min(candidates)[1], ""
        parts = []
        if no_gpu:
            parts.append(f"{no_gpu} Insufficient {GPU}")
        if no_memory:
            parts.append(f"{no_memory} Insufficient memory")
        if no_match:
            parts.append(f"{no_match} node(s) didn't match Pod's node affinity/selector")
        if tainted:
            parts.append(f"{tainted} node(s) had untolerated taint(s)")
        if far:
            parts.append(f"{far} node(s) had volume node affinity conflict")
        total = len(nodes)
        return None, (f"0/{total} nodes are available: {', '.join(parts) or 'no nodes'}. preemption: 0/{total} "
                      f"nodes are available: {total} Preemption is not helpful for scheduling.")

    def _bind(self, pod: _Pod, node: str, now: float) -> None:
        pod.node = node
        pod.scheduled_at = now
        pod.started_at = now
        self._set_condition(pod, "PodScheduled", "True", now)
        self._set_condition(pod, "Initialized", "False" if pod.init_model else "True", now)
        self._set_condition(pod, "ContainersReady", "False", now)
        self._set_condition(pod, "Ready", "False", now)
        images = self._images.setdefault(node, {})
        available = now + SCHEDULE_S
        for image in pod.images or (pod.image,):  # one after the other (the kubelet's serialized pulls)
            at = images.get(image, now if image.startswith(SANDBOX_IMAGE) else None)
            if at is None:
                at = images[image] = available + self.image_pull_s
                pod.pulling = True
            elif at > now + SCHEDULE_S and self.post_events and image == (pod.images or (pod.image,))[0]:
                self._post(pod, "Pulling", f'Pulling image "{image}"', False)  # another pod's pull: it waits
            available = max(available, at)
        pod.pull_wait_s = max(available - (now + SCHEDULE_S), 0.0)
        pod.state = "Creating"
        pod.due = max(available, now + SCHEDULE_S) + CREATE_S

    # --- the pod state machine -----------------------------------------------------------------------------

    def _set_condition(self, pod: _Pod, kind: str, status: str, now: float) -> None:
        current = pod.conditions.get(kind)
        if current is None or current[0] != status:
            pod.conditions[kind] = (status, now)

    def _advance(self, pod: _Pod, now: float) -> None:
        if pod.real:  # a real process: its /health and its exit decide when the next transition is due
            advance_real_pod(self, pod, now)
        for _ in range(100):  # several transitions may be due at once
            if pod.state == "Ready":
                self._check_traffic(pod, now)
            if pod.due > now:
                return
            t = pod.due
            if pod.state == "Creating":
                if not self._create_containers(pod, t):
                    return
            elif pod.state in ("Initializing", "InitFailed", "InitBackOff"):
                self._advance_init(pod, t)
            elif pod.state == "Running":
                if pod.death is not None:
                    self._die(pod, t)
                else:
                    self._become_ready(pod, t)
            elif pod.state == "Ready":
                self._die(pod, t)
            elif pod.state == "Terminated":
                pod.state = "BackOff"
                pod.due = (pod.run_finished or t) + backoff_delay(pod.consecutive_failures)
                delay = int(backoff_delay(pod.consecutive_failures))
                self._event(pod, t, "backoff", f"Back-off {delay}s restarting failed container=vllm "
                            f"pod={pod.name}_{pod.namespace}({pod.uid})", "BackOff", warning=True,
                            delay=delay, restarts=pod.restart_count)
            elif pod.state == "BackOff":
                pod.restart_count += 1
                self._start_run(pod, t)
            else:
                return

    def _create_containers(self, pod: _Pod, t: float) -> bool:
        """The end of ContainerCreating: the first container starts, unless a volume is not attached yet or a Secret
        its env needs is missing (CreateContainerConfigError, retried). False: nothing more is due for now."""
        if not pod.mounted:
            return self._mount_timed_out(pod, t)
        missing = next((name for name in pod.secrets
                        if self.api.get_object("secrets", name, pod.namespace) is None), None)
        if missing is not None:
            error = f'secret "{missing}" not found'
            if error != pod.config_error:
                self._event(pod, t, "config-error", f"Error: {error}", "Failed", warning=True)
            pod.config_error, pod.due = error, t + 2.0
            return True
        pod.config_error = ""
        self._pulled(pod, t)
        if pod.init_model:
            self._start_init(pod, t)
        else:
            self._start_run(pod, t)
        return True

    def _mount_timed_out(self, pod: _Pod, t: float) -> bool:
        """A pod whose volume is attached to another node stays ContainerCreating; each time the kubelet's wait for
        its volumes times out (2 min) it posts FailedMount. False when the attach pass has not seen the pod yet (it
        runs before this in each tick)."""
        if pod.attach_since is None:
            return False
        pod.mount_warnings += 1
        unattached = " ".join(v for v, _ in pod.volumes)
        self._event(pod, t, "mount-failed", f"Unable to attach or mount volumes: unmounted volumes=[{unattached}], "
                    f"unattached volumes=[{unattached}], failed to process volumes=[]: context deadline exceeded",
                    "FailedMount", warning=True)
        pod.due = pod.attach_since + MOUNT_TIMEOUT_S * (pod.mount_warnings + 1)
        return True

    def _pulled(self, pod: _Pod, t: float) -> None:
        """The kubelet's Pulled Event of the pod's first container (pkg/kubelet/images/image_manager.go, 1.30+): the
        pull's time and "including waiting" (serialized pulls: a pod that waited for another's pull of the image
        pulls it again in a moment), and the image size; or the image already present on the node."""
        if pod.pull_said:
            return
        pod.pull_said = True
        if not pod.pulling and pod.pull_wait_s <= 0:
            self._post_pulled(pod, f'Container image "{(pod.images or (pod.image,))[0]}" already present on machine')
            return
        pull = self.image_pull_s if pod.pull_wait_s >= self.image_pull_s else min(pod.pull_wait_s, 0.2)
        self._post_pulled(pod, f'Successfully pulled image "{(pod.images or (pod.image,))[0]}" in '
                               f'{_go_duration(pull)} ({_go_duration(pod.pull_wait_s)} including waiting). '
                               f'Image size: {self.image_bytes} bytes.')

    def _post_pulled(self, pod: _Pod, message: str) -> None:
        if self.post_events:
            self._post(pod, "Pulled", message, False)

    def _start_run(self, pod: _Pod, t: float) -> None:
        if self.real is not None and pod.vllm and self.real.wants(pod.args):
            start_real_run(self, pod, t)
            return
        if pod.run_started is not None:  # a restart: the finished run's log is what ``logs --previous`` shows
            self.api.set_pod_log(pod.namespace, pod.name, self._log_text(pod, None), previous=True)
        pod.state = "Running"
        pod.run_started = t
        pod.run_finished = None
        pod.serving = []
        pod.death = None
        pod.death_kind = None
        pod.traffic_checked = None
        pod.log_lines_shown = -1
        if not pod.vllm:
            pod.outcome = None
            pod.due = t + GENERIC_READY_S
            self._event(pod, t, "started", f"Started container (image {pod.image})", "Started")
            return
        if pod.restart_count or pod.init_status is not None:  # the vLLM container after the init one, a restart
            self._post_pulled(pod, f'Container image "{pod.image}" already present on machine')
        outcome = self._with_download(pod, t, self._with_compile_cache(pod, self._simulate(pod)))
        pod.outcome = outcome
        stats = self._stats.setdefault((pod.namespace, pod.service), ServiceStats())
        stats.last_outcome = outcome
        pod.due = t + outcome.duration_s
        if not outcome.starts:
            text = outcome.log_text(self.clock.datetime_at(t))
            summary = outcome.message.splitlines()[0] if outcome.message else (
                f"{outcome.reason}: killed while {outcome.phase.value} (host memory peak {outcome.host_peak_gib:.1f} GiB"
                f" over the container's limit)" if outcome.reason == "OOMKilled" else str(outcome.reason))
            pod.death = (outcome.reason or "Error", outcome.exit_code, self._message(pod, text), summary)
        what = f"restart {pod.restart_count}" if pod.restart_count else "first start"
        self._event(pod, t, "started", f"Started container vllm ({what}) on {pod.node}", "Started",
                    restart=pod.restart_count, flags=_flag_summary(outcome.flags))

    def _fetch(self, pod: _Pod, t: float, model_id: str, container: str) -> float:
        """Fetch the model's weights into the pod's cache volume: the simulated seconds it takes, 0.0 when the
        volume holds them (`cache-hit`); the first time on a volume a `download` event."""
        key = (pod.namespace, pod.cache_volume, model_id)
        kind, where = pod.cache_volume.split(":", 1)
        place = f"claim {where}" if kind == "pvc" else "the pod's emptyDir"
        if key in self._cached:
            self._event(pod, t, "cache-hit", f"{model_id}: weights found in {place}, not downloaded again",
                        volume=pod.cache_volume, container=container)
            return 0.0
        self._cached.add(key)
        files = self._model(model_id, pod)
        size = files.total_size if files is not None and files.total_size else 0
        seconds = round(size / 2**20 / self.download_mib_per_s, 3)
        self._event(pod, t, "download", f"{model_id}: downloading the weights ({size / 2**30:.1f} GiB, "
                    f"{seconds:.0f} s) into {place}", volume=pod.cache_volume, container=container, bytes=size,
                    seconds=seconds)
        return seconds

    def _with_compile_cache(self, pod: _Pod, outcome: StartupOutcome) -> StartupOutcome:
        """vLLM's compile cache on the model-cache claim: the first run that compiles fills it; a later run with the
        same root (same vLLM release and GPU, render/coldstart.py) loads the compiled graphs instead, as vLLM logs
        ("Directly load the compiled graph(s) … from the cache"), and the rest of its start moves earlier."""
        at = next((i for i, line in enumerate(outcome.log) if line.text.startswith("torch.compile takes ")), None)
        if at is None or not pod.compile_cache:
            return outcome
        key = (pod.namespace, pod.compile_cache)
        if key not in self._compiled:
            self._compiled.add(key)
            return outcome
        line = outcome.log[at]
        compile_s = float(line.text.split()[2])
        load_s = max(round(compile_s * WARM_COMPILE_SHARE, 2), 1.0)
        saved = max(compile_s - load_s, 0.0)
        loaded = line.model_copy(update={
            "offset_s": round(line.offset_s - saved, 3), "source": "backends.py:197",
            "text": f"Directly load the compiled graph(s) for dynamic shape from the cache, took {load_s:.3f} s"})
        total = line.model_copy(update={"offset_s": round(line.offset_s - saved, 3),
                                        "text": f"torch.compile takes {load_s:.2f} s in total"})

        def earlier(x: LogLine) -> LogLine:
            found = _ENGINE_INIT.match(x.text)
            text = f"{found[1]}{max(float(found[2]) - saved, 0.0):.2f}{found[3]}" if found else x.text
            return x.model_copy(update={"offset_s": round(max(x.offset_s - saved, 0.0), 3), "text": text})
        log = [*outcome.log[:at], loaded, total, *(earlier(x) for x in outcome.log[at + 1:])]
        return outcome.model_copy(update={"log": log, "duration_s": round(max(outcome.duration_s - saved, 0.0), 3)})

    def _with_download(self, pod: _Pod, t: float, outcome: StartupOutcome) -> StartupOutcome:
        """vLLM fetches the weights after "Starting to load model" (weight_utils.download_weights_from_hf): a
        download shifts the rest of the run and logs vLLM's own line; a run that dies earlier fetches nothing."""
        model_id = _model_arg(pod.args)
        marker = next((i for i, line in enumerate(outcome.log) if line.text.startswith("Starting to load model")),
                      None)
        if not model_id or marker is None:
            return outcome
        seconds = self._fetch(pod, t + outcome.log[marker].offset_s, model_id, "vllm")
        if seconds <= 0.5:  # vLLM logs only downloads over 0.5 s
            return outcome
        at = outcome.log[marker]
        line = LogLine(offset_s=round(at.offset_s + seconds, 3), process=at.process, level="INFO",
                       source="weight_utils.py:538",
                       text=f"Time spent downloading weights for {model_id}: {seconds:.6f} seconds")
        shifted = [*outcome.log[:marker + 1], line,
                   *(x.model_copy(update={"offset_s": round(x.offset_s + seconds, 3)})
                     for x in outcome.log[marker + 1:])]
        return outcome.model_copy(update={"log": shifted, "duration_s": round(outcome.duration_s + seconds, 3)})

    def _start_init(self, pod: _Pod, t: float) -> None:
        """The model-download init container: downloads into the cache volume (or finds the weights there); a model
        the hub gates, without a token, fails after one API call."""
        before = pod.init_status or {}
        pod.state = "Initializing"
        pod.init_status = {"name": DOWNLOAD_CONTAINER, "image": pod.image, "imageID": "", "ready": False,
                           "restartCount": int(before.get("restartCount") or 0), "started": True,
                           "lastState": dict(before.get("lastState") or {}),
                           "state": {"running": {"startedAt": self.clock.timestamp(t)}}}
        if pod.init_model in self.gated_models and not pod.init_token:
            pod.due = t + HUB_REFUSAL_S
            pod.init_status["error"] = _gated_error(pod.init_model or "", "")
            return
        seconds = self._fetch(pod, t, pod.init_model or "", DOWNLOAD_CONTAINER)
        files = self._model(pod.init_model or "", pod)
        fetched = (files.total_size or 0) if files is not None and seconds > 0 else 0
        duration = seconds + CACHE_CHECK_S
        pod.due = t + duration
        pod.init_status["report"] = {"downloadedBytes": fetched, "seconds": round(duration, 3)}

    def _advance_init(self, pod: _Pod, t: float) -> None:
        """Initializing → done (vLLM starts) or failed; failed → Init:CrashLoopBackOff; back-off over → again."""
        status = pod.init_status or {}
        if pod.state == "Initializing" and "error" not in status:
            self._finish_init(pod, t)
        elif pod.state == "Initializing":
            self._fail_init(pod, t)
        elif pod.state == "InitFailed":
            restarts = int(status.get("restartCount") or 0)
            failed = (status.get("state") or {}).get("terminated") or {}
            status.update(ready=False, started=False, lastState={"terminated": failed}, state={"waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {int(backoff_delay(restarts + 1))}s restarting failed "
                           f"container={DOWNLOAD_CONTAINER} pod={pod.name}_{pod.namespace}({pod.uid})"}})
            pod.state, pod.due = "InitBackOff", t + backoff_delay(restarts + 1)
        else:
            status["restartCount"] = int(status.get("restartCount") or 0) + 1
            self._start_init(pod, t)

    def _fail_init(self, pod: _Pod, t: float) -> None:
        """The init container exits 1; with FallbackToLogsOnError its log's end is the termination message."""
        status = pod.init_status or {}
        error = str(status.pop("error", ""))
        started = ((status.get("state") or {}).get("running") or {}).get("startedAt")
        status.update(ready=False, started=False, state={"terminated": {
            "exitCode": 1, "reason": "Error", "message": error[-2048:], "startedAt": started,
            "finishedAt": self.clock.timestamp(t),
            "containerID": f"containerd://{pod.uid[:8]}init{int(status.get('restartCount') or 0):04d}"}})
        self.api.set_pod_log(pod.namespace, pod.name, error, container=DOWNLOAD_CONTAINER)
        last = error.strip().splitlines()[-1] if error.strip() else "exit code 1"
        self._event(pod, t, "init-failed", f"init container {DOWNLOAD_CONTAINER} failed: {last}", "Failed",
                    warning=True, restarts=int(status.get("restartCount") or 0))
        pod.state, pod.due = "InitFailed", t + TERMINATED_SHOWN_S

    def _finish_init(self, pod: _Pod, t: float) -> None:
        status = dict(pod.init_status or {})
        report = status.pop("report", {})
        started = ((status.get("state") or {}).get("running") or {}).get("startedAt")
        status.update(ready=True, started=False, state={"terminated": {
            "exitCode": 0, "reason": "Completed", "message": json.dumps(report), "startedAt": started,
            "finishedAt": self.clock.timestamp(t), "containerID": f"containerd://{pod.uid[:8]}init"}})
        pod.init_status = status
        # what the real script prints (render/cache.py DOWNLOAD_SCRIPT): `kubectl logs POD -c model-download`
        self.api.set_pod_log(pod.namespace, pod.name, f"Time spent downloading weights for {pod.init_model}: "
                             f"{report.get('seconds', 0):.6f} seconds ({report.get('downloadedBytes', 0)} bytes)\n",
                             container=DOWNLOAD_CONTAINER)
        pod.init_model = None
        self._set_condition(pod, "Initialized", "True", t)
        self._start_run(pod, t)

    def _simulate(self, pod: _Pod) -> StartupOutcome:
        gpu = self._node_gpu(pod.node or "")
        hidden = self._hidden(pod.namespace, pod.service)
        model_id = _model_arg(pod.args)
        files = self._model(model_id, pod) if model_id else None
        key = shared_gpu.sharing_key(pod.claim, pod.node or "", self._node_labels(pod.node or ""), pod.gpus)
        if key is not None and gpu is not None:  # one GPU several pods share: each start sees what the others hold
            device = self._shared.setdefault(key, shared_gpu.SharedGPU(gpu))
            return device.start(pod.uid, pod.args, pod.image, files, hidden=hidden, gpu_count=1,
                                memory_limit_gib=pod.memory_limit_gib, declared_version=pod.declared_version,
                                env=pod.env)
        return simulate_startup(pod.args, pod.image, gpu if pod.gpus else None, hidden, files, gpu_count=pod.gpus,
                                memory_limit_gib=pod.memory_limit_gib, declared_version=pod.declared_version,
                                env=pod.env)

    def _release(self, pod: _Pod) -> None:
        """A pod's run ended (or the pod is gone): what it held on a shared GPU is free again."""
        for device in self._shared.values():
            device.stop(pod.uid)

    def _node_labels(self, node: str) -> dict[str, str]:
        obj = self.api.get_object("nodes", node) if node else None
        return dict((_meta(obj).get("labels") or {}) if obj else {})

    def _node_gpu(self, node: str) -> GPUSpec | None:
        if node not in self._node_gpus:
            obj = self.api.get_object("nodes", node)
            labels = (_meta(obj).get("labels") or {}) if obj else {}
            try:
                found = resolve_node_gpu(labels, self.catalog)
            except ValueError:
                found = None
            self._node_gpus[node] = found.spec if found else None
        return self._node_gpus[node]

    def _model(self, model_id: str, pod: _Pod) -> ModelFiles | None:
        """The model's files: an inline config on the VLLMService, else the built-in catalog (never the network)."""
        inline = self._inline_model(pod, model_id)
        if inline is not None:
            return inline
        if model_id not in self._models:
            try:
                self._models[model_id] = resolve_model_id(model_id, offline=True)  # catalog or hub cache, never a path
            except (ModelSourceError, OSError, ValueError):
                self._models[model_id] = None
        return self._models[model_id]

    def _inline_model(self, pod: _Pod, model_id: str) -> ModelFiles | None:
        try:
            service = self.api.get_object("vllmservices", pod.service, pod.namespace)
        except Exception:
            return None
        model = ((service or {}).get("spec") or {}).get("model") or {}
        if not model.get("config"):
            return None
        try:
            return model_files_from_inline(dict(model["config"]), model.get("safetensorsIndex"), model_id)
        except (ModelSourceError, ValueError):
            return None

    def _become_ready(self, pod: _Pod, t: float) -> None:
        pod.state = "Ready"
        pod.due = float("inf")
        self._set_condition(pod, "ContainersReady", "True", t)
        self._set_condition(pod, "Ready", "True", t)
        outcome = pod.outcome
        details: dict[str, Any] = {}
        if outcome is not None:
            details = {"kv_cache_tokens": outcome.kv_cache_tokens, "max_concurrency": outcome.max_concurrency,
                       "max_model_len": outcome.flags.max_model_len if outcome.flags else None}
        self._event(pod, t, "ready", "container vllm is Ready", **details)
        self._schedule_worker_exit(pod, t)

    def _schedule_worker_exit(self, pod: _Pod, t: float) -> None:
        """A dead worker behind a live leader: a Ready worker of a group whose hidden facts say so dies of an NCCL
        timeout; the leader keeps answering until LeaderWorkerSet recreates the group."""
        hidden = self._hidden(pod.namespace, pod.service)
        if hidden.worker_exit_after_s is None or not pod.node_rank or pod.outcome is None:
            return
        key = (pod.namespace, pod.service)
        if self._worker_exits.get(key, 0) >= hidden.worker_exits:
            return
        self._worker_exits[key] = self._worker_exits.get(key, 0) + 1
        lines, message = worker_network_exit(pod.outcome, pod.node_rank, pod.node_rank * max(pod.gpus, 1))
        offset = t + hidden.worker_exit_after_s - (pod.run_started or t)
        pod.serving = [line.model_copy(update={"offset_s": line.offset_s + offset}) for line in lines]
        pod.due = t + hidden.worker_exit_after_s + max(line.offset_s for line in lines)
        pod.death = ("Error", 134, self._message(pod, self._log_text(pod, None)), message)
        pod.death_kind = "Network"

    def _check_traffic(self, pod: _Pod, now: float) -> None:
        traffic = self._traffic.get((pod.namespace, pod.service))
        if traffic is None or pod.traffic_checked == traffic or pod.outcome is None:
            return
        pod.traffic_checked = traffic
        hidden = self._hidden(pod.namespace, pod.service)
        result = serving_oom(pod.outcome, hidden, traffic[0], traffic[1])
        if result is None:
            return
        lines, message = result
        offset = now - (pod.run_started or now)
        pod.serving = [line.model_copy(update={"offset_s": line.offset_s + offset}) for line in lines]
        pod.due = now + max(line.offset_s for line in lines)
        log_text = self._log_text(pod, None)
        pod.death = ("Error", 1, self._message(pod, log_text), message.splitlines()[0])

    @staticmethod
    def _message(pod: _Pod, log_text: str) -> str:
        """terminated.message: vLLM writes no termination-message file, so only FallbackToLogsOnError fills it."""
        return termination_message(log_text) if pod.logs_as_message else ""

    def _die(self, pod: _Pod, t: float) -> None:
        self._release(pod)
        reason, code, message, summary = pod.death or ("Error", 1, "", "Error")
        was_ready = pod.state == "Ready"
        pod.state = "Terminated"
        pod.run_finished = t
        pod.due = t + TERMINATED_SHOWN_S
        long_run = t - (pod.run_started or t) >= BACKOFF_RESET_S
        pod.consecutive_failures = 1 if long_run else pod.consecutive_failures + 1
        pod.last_terminated = {"exitCode": code, "reason": reason, "message": message,
                               "startedAt": self.clock.timestamp(pod.run_started),
                               "finishedAt": self.clock.timestamp(t),
                               "containerID": f"containerd://{pod.uid[:8]}{pod.restart_count:04d}"}
        self._set_condition(pod, "ContainersReady", "False", t)
        self._set_condition(pod, "Ready", "False", t)
        stats = self._stats.setdefault((pod.namespace, pod.service), ServiceStats())
        kind = pod.outcome.failure_kind if pod.outcome and not was_ready else None
        if was_ready:
            stats.serving_failures += 1
            kind_text = pod.death_kind or "CUDAOOMServing"
        else:
            stats.failed_starts += 1
            kind_text = str(kind) if kind else reason
        stats.last_failure = kind_text
        self._event(pod, t, "failed", summary, failure=kind_text, exit_code=code, term_reason=reason,
                    while_serving=was_ready, restarts=pod.restart_count)

    # --- status --------------------------------------------------------------------------------------------

    def _log_text(self, pod: _Pod, until: float | None) -> str:
        if pod.outcome is None or pod.run_started is None:
            return ""
        start = self.clock.datetime_at(pod.run_started)
        lines = [*pod.outcome.log, *pod.serving]
        limit = None if until is None else until - pod.run_started
        return "".join(line.render(start) + "\n" for line in lines if limit is None or line.offset_s <= limit)

    def _write_log(self, pod: _Pod, now: float) -> None:
        if pod.outcome is None or pod.run_started is None:
            return
        limit = now - pod.run_started
        if pod.state in ("Terminated", "BackOff"):
            limit = float("inf")
        shown = sum(1 for line in [*pod.outcome.log, *pod.serving] if line.offset_s <= limit)
        if shown != pod.log_lines_shown:
            pod.log_lines_shown = shown
            self.api.set_pod_log(pod.namespace, pod.name, self._log_text(pod, None if limit == float("inf")
                                                                          else now))

    def _pod_status(self, pod: _Pod) -> dict[str, Any]:
        ts = self.clock.timestamp
        conditions = []
        for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
            if kind not in pod.conditions:
                continue
            value, since = pod.conditions[kind]
            cond: dict[str, Any] = {"type": kind, "status": value, "lastProbeTime": None,
                                    "lastTransitionTime": ts(since)}
            if kind == "PodScheduled" and value == "False" and pod.unschedulable_message:
                cond.update(reason="Unschedulable", message=pod.unschedulable_message)
            elif kind in ("ContainersReady", "Ready") and value == "False":
                cond.update(reason="ContainersNotReady", message="containers with unready status: [vllm]")
            conditions.append(cond)
        status: dict[str, Any] = {"phase": "Pending", "conditions": conditions, "qosClass": "Burstable"}
        if pod.node is None:
            return status
        status.update(hostIP=f"10.0.{_octet(pod.node)}.1", startTime=ts(pod.started_at))
        container: dict[str, Any] = {"name": "vllm", "image": pod.image, "imageID": "", "ready": pod.state == "Ready",
                                     "started": pod.state in ("Running", "Ready"), "restartCount": pod.restart_count,
                                     "lastState": {}, "state": {}}
        if pod.last_terminated is not None:
            container["lastState"] = {"terminated": pod.last_terminated}
        if pod.init_status is not None:
            status["initContainerStatuses"] = [{k: v for k, v in pod.init_status.items()
                                                if k not in ("report", "error")}]
        if pod.state in ("Initializing", "InitFailed", "InitBackOff"):
            container["state"] = {"waiting": {"reason": "PodInitializing"}}
            status.update(phase="Pending", podIP=f"10.244.{_octet(pod.node)}.{_octet(pod.uid)}")
        elif pod.state == "Creating" and pod.config_error:
            container["state"] = {"waiting": {"reason": "CreateContainerConfigError", "message": pod.config_error}}
        elif pod.state == "Creating":
            container["state"] = {"waiting": {"reason": "ContainerCreating"}}
        else:
            status.update(phase="Running", podIP=f"10.244.{_octet(pod.node)}.{_octet(pod.uid)}")
            container["imageID"] = f"{pod.image.split(':')[0]}@sha256:{hashlib.sha256(pod.image.encode()).hexdigest()}"
            container["containerID"] = f"containerd://{pod.uid[:8]}{pod.restart_count:04d}"
            if pod.state in ("Running", "Ready"):
                container["state"] = {"running": {"startedAt": ts(pod.run_started)}}
            elif pod.state == "Terminated" and pod.last_terminated is not None:
                container["state"] = {"terminated": pod.last_terminated}
                container["lastState"] = {}
            elif pod.state == "BackOff":
                delay = int(backoff_delay(pod.consecutive_failures))
                container["state"] = {"waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {delay}s restarting failed container=vllm pod={pod.name}_{pod.namespace}"
                               f"({pod.uid})"}}
        status["containerStatuses"] = [container]
        return status

    def _write_pod(self, pod: _Pod, now: float) -> None:
        status = self._pod_status(pod)
        if status != pod.written:
            try:
                self.api.patch_object("pods", pod.name, [{"op": "replace", "path": "/status", "value": status}],
                                      pod.namespace, patch_type="json", subresource="status")
            except Exception as exc:  # deleted meanwhile
                log.debug("pod %s/%s status not written: %s", pod.namespace, pod.name, exc)
                return
            pod.written = status
        self._write_log(pod, now)

    # --- the Deployment controller -------------------------------------------------------------------------

    def _control_deployments(self, now: float, *, status_only: bool = False) -> None:
        deployments = self.api.list_objects("deployments")
        alive = set()
        for deployment in deployments:
            meta = _meta(deployment)
            key = (meta.get("namespace", "default"), meta["name"])
            alive.add(key)
            record = self._deploys.setdefault(key, _Deploy())
            try:
                self._control(deployment, record, now, status_only)
            except Exception as exc:
                log.debug("deployment %s/%s: %s", key[0], key[1], exc)
        for key in [k for k in self._deploys if k not in alive]:
            del self._deploys[key]

    def _replicasets(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        return [rs for rs in self.api.list_objects("replicasets", namespace)
                if any(r.get("uid") == uid for r in _meta(rs).get("ownerReferences") or [])]

    def _control(self, deployment: dict[str, Any], record: _Deploy, now: float, status_only: bool) -> None:
        meta = _meta(deployment)
        namespace, name, uid = meta.get("namespace", "default"), meta["name"], meta.get("uid", "")
        spec = deployment.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        template = copy.deepcopy(spec.get("template") or {})
        digest = _template_hash(template)
        rs_name = f"{name}-{digest}"
        sets = self._replicasets(namespace, uid)
        current = next((rs for rs in sets if _meta(rs)["name"] == rs_name), None)
        if digest not in record.revision:
            record.revision[digest] = max(record.revision.values(), default=0) + 1
        pods_by_rs: dict[str, list[_Pod]] = {}
        for pod in self._pods.values():
            if pod.namespace == namespace and pod.owner_rs:
                pods_by_rs.setdefault(pod.owner_rs, []).append(pod)
        new_pods = pods_by_rs.get(rs_name, [])
        old_pods = [p for rs in sets if _meta(rs)["name"] != rs_name for p in pods_by_rs.get(_meta(rs)["name"], [])]
        if not status_only:
            if current is None:
                current = self._create_replicaset(deployment, rs_name, digest, replicas, record.revision[digest])
            new_ready = sum(1 for p in new_pods if p.state == "Ready")
            surge, unavailable = _rolling_limits(spec, replicas)
            kept = []
            for pod in old_pods:
                if pod.state != "Ready" or new_ready >= replicas:
                    self._delete_pod(pod, now, "superseded by a new pod template")
                else:
                    kept.append(pod)
            if surge == 0:  # make room first: old pods go down to replicas - maxUnavailable
                while kept and len(kept) + new_ready > max(replicas - unavailable, 0):
                    self._delete_pod(kept.pop(), now, "superseded by a new pod template (rolling without surge)")
            room = replicas + surge - len(kept)
            for _ in range(min(replicas, room) - len(new_pods)):
                self._create_pod(current, template, digest)
            extra = len(new_pods) - replicas
            for pod in sorted(new_pods, key=lambda p: (p.state == "Ready", p.created))[:max(extra, 0)]:
                self._delete_pod(pod, now, "scaled down")
            for rs in sets:
                rs_meta = _meta(rs)
                want = replicas if rs_meta["name"] == rs_name else len(
                    [p for p in old_pods if p.owner_rs == rs_meta["name"] and p.uid in self._pods])
                if int((rs.get("spec") or {}).get("replicas", 0)) != want:
                    self.api.patch_object("replicasets", rs_meta["name"], {"spec": {"replicas": want}}, namespace)
            return
        self._write_statuses(deployment, record, sets, pods_by_rs, rs_name, replicas, now)

    def _create_replicaset(self, deployment: dict[str, Any], rs_name: str, digest: str, replicas: int,
                           revision: int) -> dict[str, Any]:
        meta = _meta(deployment)
        spec = deployment.get("spec") or {}
        template = copy.deepcopy(spec.get("template") or {})
        template.setdefault("metadata", {}).setdefault("labels", {})[LABEL_HASH] = digest
        selector = copy.deepcopy(spec.get("selector") or {})
        selector.setdefault("matchLabels", {})[LABEL_HASH] = digest
        body = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": rs_name, "namespace": meta.get("namespace", "default"),
                             "labels": {**(template["metadata"].get("labels") or {})},
                             "annotations": {"deployment.kubernetes.io/revision": str(revision),
                                             "deployment.kubernetes.io/desired-replicas": str(replicas)},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": meta["name"],
                                                  "uid": meta.get("uid"), "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": {"replicas": replicas, "selector": selector, "template": template}}
        return self.api.create_object("replicasets", body, namespace=meta.get("namespace", "default"))

    def _create_pod(self, rs: dict[str, Any], template: Mapping[str, Any], digest: str) -> None:
        rs_meta = _meta(rs)
        tmeta = copy.deepcopy(dict(template.get("metadata") or {}))
        labels = {**(tmeta.get("labels") or {}), LABEL_HASH: digest}
        suffix = "".join(self._rng.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
        spec = copy.deepcopy(dict(template.get("spec") or {}))
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("schedulerName", "default-scheduler")
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{rs_meta['name']}-{suffix}", "namespace": rs_meta.get("namespace", "default"),
                             "labels": labels, "annotations": tmeta.get("annotations") or {},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                  "name": rs_meta["name"], "uid": rs_meta.get("uid"),
                                                  "controller": True, "blockOwnerDeletion": True}]},
                "spec": spec, "status": {"phase": "Pending"}}
        created = self.api.create_object("pods", body, namespace=rs_meta.get("namespace", "default"))
        self._pods[_meta(created)["uid"]] = self._new_record(created)

    def _delete_pod(self, pod: _Pod, now: float, why: str) -> None:
        self.api.delete_object("pods", pod.name, pod.namespace)
        self._pods.pop(pod.uid, None)
        self._release(pod)
        self._event(pod, now, "deleted", f"pod {pod.name} deleted: {why}", "Killing",
                    state=pod.state)

    def _write_statuses(self, deployment: dict[str, Any], record: _Deploy, sets: list[dict[str, Any]],
                        pods_by_rs: dict[str, list[_Pod]], rs_name: str, replicas: int, now: float) -> None:
        meta = _meta(deployment)
        namespace, name = meta.get("namespace", "default"), meta["name"]
        all_pods = [p for rs in sets for p in pods_by_rs.get(_meta(rs)["name"], [])]
        new_pods = pods_by_rs.get(rs_name, [])
        ready = sum(1 for p in all_pods if p.state == "Ready")
        new_ready = sum(1 for p in new_pods if p.state == "Ready")
        for rs in sets:
            rs_meta = _meta(rs)
            pods = pods_by_rs.get(rs_meta["name"], [])
            rs_ready = sum(1 for p in pods if p.state == "Ready")
            rs_status = {"replicas": len(pods), "fullyLabeledReplicas": len(pods), "readyReplicas": rs_ready,
                         "availableReplicas": rs_ready, "observedGeneration": rs_meta.get("generation", 1)}
            if {k: v for k, v in (rs.get("status") or {}).items() if k in rs_status} != rs_status:
                self.api.patch_object("replicasets", rs_meta["name"],
                                      [{"op": "replace", "path": "/status", "value": rs_status}], namespace,
                                      patch_type="json", subresource="status")
        complete = new_ready >= replicas and len(all_pods) == len(new_pods)
        available = ready >= replicas
        self._transition(record, "Available", "True" if available else "False",
                         "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable", now)
        self._transition(record, "Progressing", "True",
                         "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated", now)
        conditions = []
        for kind, (value, reason, since) in record.conditions.items():
            message = (f'ReplicaSet "{rs_name}" has successfully progressed.' if reason == "NewReplicaSetAvailable"
                       else f'ReplicaSet "{rs_name}" is progressing.' if kind == "Progressing"
                       else "Deployment has minimum availability." if value == "True"
                       else "Deployment does not have minimum availability.")
            conditions.append({"type": kind, "status": value, "reason": reason, "message": message,
                               "lastUpdateTime": self.clock.timestamp(since),
                               "lastTransitionTime": self.clock.timestamp(since)})
        status: dict[str, Any] = {"observedGeneration": meta.get("generation", 1), "replicas": len(all_pods),
                                  "updatedReplicas": len(new_pods), "readyReplicas": ready,
                                  "availableReplicas": ready,
                                  "unavailableReplicas": max(replicas - ready, 0) if replicas else 0,
                                  "conditions": conditions}
        if status != record.written:
            self.api.patch_object("deployments", name, [{"op": "replace", "path": "/status", "value": status}],
                                  namespace, patch_type="json", subresource="status")
            record.written = status
        if complete and replicas > 0:
            service = ((meta.get("labels") or {}).get(LABEL_SERVICE)) or name
            stats = self._stats.setdefault((namespace, service), ServiceStats())
            if stats.ready_at is None:
                stats.ready_at = now

    @staticmethod
    def _transition(record: _Deploy, kind: str, status: str, reason: str, now: float) -> None:
        current = record.conditions.get(kind)
        if current is None or current[:2] != (status, reason):
            since = now if current is None or current[0] != status else current[2]
            record.conditions[kind] = (status, reason, since)


def _rolling_limits(spec: Mapping[str, Any], replicas: int) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) of a Deployment's strategy as pod counts (Recreate: no surge, all unavailable)."""
    strategy = spec.get("strategy") or {}
    if strategy.get("type") == "Recreate":
        return 0, replicas
    rolling = strategy.get("rollingUpdate") or {}

    def count(value: Any, default: str, round_up: bool) -> int:
        text = str(value if value is not None else default)
        if text.endswith("%"):
            share = replicas * float(text[:-1]) / 100
            return int(-(-share // 1)) if round_up else int(share)
        return int(text)

    surge = count(rolling.get("maxSurge"), "25%", True)
    unavailable = count(rolling.get("maxUnavailable"), "25%", False)
    return surge, max(unavailable, 1) if surge == 0 else unavailable


def _secret_refs(container: Mapping[str, Any]) -> tuple[str, ...]:
    names = []
    for env in container.get("env") or []:
        ref = ((env.get("valueFrom") or {}).get("secretKeyRef")) or {}
        if ref.get("name") and not ref.get("optional"):
            names.append(str(ref["name"]))
    for source in container.get("envFrom") or []:
        ref = source.get("secretRef") or {}
        if ref.get("name") and not ref.get("optional"):
            names.append(str(ref["name"]))
    return tuple(dict.fromkeys(names))


def _go_duration(seconds: float) -> str:
    """A Go `time.Duration` truncated to the millisecond, as the kubelet prints it: `30s`, `1m23.456s`, `200ms`."""
    ms = int(round(max(seconds, 0.0) * 1000))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + f"{secs}s"


def _octet(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:4], 16) % 250 + 1


def _model_arg(args: list[str]) -> str | None:
    items = list(args)
    if items[:2] == ["vllm", "serve"] and len(items) > 2 and not items[2].startswith("-"):
        return items[2]
    if "--model" in items:
        index = items.index("--model")
        if index + 1 < len(items):
            return items[index + 1]
    return None


def _flag_summary(flags: EngineFlags | None) -> str:
    if flags is None:
        return ""
    parts = [f"TP={flags.tensor_parallel_size}", f"util={flags.gpu_memory_utilization:g}",
             f"max-model-len={flags.max_model_len}", f"max-num-seqs={flags.max_num_seqs}"]
    if flags.kv_cache_dtype != "auto":
        parts.append(f"kv={flags.kv_cache_dtype}")
    if flags.enforce_eager:
        parts.append("eager")
    return " ".join(parts)
