"""Where a VLLMService's weights are cached, decided once and purely: so that a restart or a remediation step does
not download them again.

- `spec.modelCache` (an existing claim, or one the operator creates for the service) always wins, under the same
  rule as the default: one node mounts a ReadWriteOnce claim. A size for a service that may run several pods (or a
  group over several nodes) is a claim per pod of that size and class (as below), or one ReadWriteMany claim
  `<service>-model-cache-shared` where the class asked (or the default, none asked) is the cluster's ReadWriteMany
  one; for one pod, its own ReadWriteOnce claim. A user's claim (`claimName`) is read by the shell
  (`ObservedClaim`): ReadWriteOnce(Pod) rolls without a surge pod, and the condition is False when it is missing
  (`ClaimNotFound`) or when one node (pod) can mount it and the service may run several pods (`ClaimNotShared`).
- Otherwise the operator-wide `CacheSettings.mode` decides: `auto` (the default) gives a PersistentVolumeClaim when
  the cluster has a default StorageClass (or the settings name one), `persistent` always does, `ephemeral` never.
- With `ReadWriteMany` the claim is per model and namespace: every service of that model (and revision) in the
  namespace mounts it, and it outlives them (no owner: a cache, not a child; delete it by its labels).
  Where the cluster has a class that gives such claims (`read_write_many_class`) every service gets the shared claim
  from its first pod, one replica included: any service may become several pods (the scale subresource writes
  spec.replicas whatever the spec says), so the template never changes when it scales, and its rollouts surge (no
  outage on an edit). A service that wants its own ReadWriteOnce claim on faster block storage says so
  (spec.modelCache.size and storageClassName).
  With `ReadWriteOnce` (the default: what most default classes give) one node mounts it. A service that runs one
  pod gets a claim of its own: the Deployment then rolls without a surge pod (a second pod on another node could
  never attach the volume, and the first would keep it). A service that may run several pods (spec.replicas > 1,
  spec.maxReplicas, spec.autoscaling, or scaled to several before: `status.modelCache.shapePods`) gets a claim per
  pod: where the LeaderWorkerSet API is served it runs as a LeaderWorkerSet of one-pod groups whose
  `volumeClaimTemplates` give pod `<lws>-<g>` the claim `model-cache-<lws>-<g>`; where it is not, as an apps/v1
  StatefulSet (render/statefulset.py) whose `volumeClaimTemplates` give pod `<sts>-<n>` the claim
  `model-cache-<sts>-<n>`. Either way the claims are kept when pods scale down (a scale back up finds its weights)
  and deleted with the service. The kind is sticky: a service that runs as a StatefulSet stays one when the
  LeaderWorkerSet API is installed later (a switch would drop every pod's cached weights), one on one-pod groups
  stays there while that API is served. The shape follows those bounds, never the replica count of the moment: within them a scale changes
  no pod template (a `kubectl scale` of a one-pod service past its bounds switches it once, Deployment →
  LeaderWorkerSet or StatefulSet, make before break; it then stays). An emptyDir only when the operator is told so
  (mode `ephemeral`) or the cluster has no StorageClass.
  A plan that spans nodes is a LeaderWorkerSet anyway: its pods get per-pod claims the same way.
- The condition `ModelCache` says which it is: True (reason PersistentVolumeClaim) or False (reason Ephemeral,
  ClaimNotFound or ClaimNotShared, with why and the fix).
- The startup probe's budget follows the checkpoint: a download at `download_mib_per_s` when the cache is empty
  (or the measured rate, when known), plus loading, plus a fixed allowance for engine start-up.
- A persistent cache is filled by an init container (`model-download`, the vLLM image itself, `DOWNLOAD_SCRIPT`)
  before vLLM starts, so vLLM starts from a warm cache and its startup probe no longer budgets a download: a
  remediation rollout never waits for a download it already made. The init container has no probe and no deadline
  (a probe cannot watch an init container; a deadline would kill a slow download that is progressing): a stalled
  connection fails after huggingface_hub's own read timeout (`HF_HUB_DOWNLOAD_TIMEOUT`, 10 s by default), the
  container exits non-zero, the kubelet restarts it with its back-off and `snapshot_download` resumes the partial
  files. It writes what it downloaded (bytes, seconds) to its termination message; `measured_download` reads it
  from the pod status and `fold_download` records it in `status.modelCache`, whose rate replaces the assumed one
  at the next change of vLLM's arguments (`budget_rate`), never by itself (a measurement alone never restarts a
  serving pod).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..api import conditions as cond
from ..api.labels import MANAGED_BY
from ..api.v1alpha1 import ModelCacheSpec
from .names import dns1123_subdomain

#: The condition type and its reasons (api/conditions.py).
MODEL_CACHE, PERSISTENT, EPHEMERAL = cond.MODEL_CACHE, cond.PERSISTENT_CACHE, cond.EPHEMERAL_CACHE
CLAIM_NOT_FOUND, CLAIM_NOT_SHARED = cond.CACHE_CLAIM_NOT_FOUND, cond.CACHE_CLAIM_NOT_SHARED
#: Labels of a shared cache claim (what to select to clean caches up).
LABEL_CACHE_MODEL = "vllm-operator.dev/model-cache"
#: Engine start-up besides the weights (CUDA graphs, compilation, profiling), seconds.
ENGINE_START_SECONDS = 600
#: Loading from a local disk into GPU memory, seconds per GiB (conservative: network disks).
LOAD_SECONDS_PER_GIB = 6.0
PROBE_PERIOD_SECONDS = 10
#: The init container that fills a persistent cache before vLLM starts.
DOWNLOAD_CONTAINER = "model-download"
#: Where the kubelet takes an exited container's termination message from (Kubernetes' default path).
TERMINATION_LOG = "/dev/termination-log"
#: A download smaller or shorter than this says nothing about the network (a warm cache, a few small files).
MIN_MEASURED_BYTES = 256 * 2**20
MIN_MEASURED_SECONDS = 1.0

#: What the init container runs: `python3 -c DOWNLOAD_SCRIPT <model> <revision or ""> <termination log>`. The
#: model id and revision are argv data, never part of this text. It fetches what vLLM's own loader would
#: (vllm/model_executor/model_loader/weight_utils.py, `download_weights_from_hf`, 0.33.0): the top-level
#: non-weight files (config, tokenizer, generation config) and one weight format — the files the safetensors index
#: names when there is one (so `original/` and `consolidated.safetensors` copies are skipped), else the top-level
#: `*.safetensors`, else `*.bin`, else `*.pt` — into the same Hugging Face cache (`HF_HOME`) vLLM reads. Only
#: `HfApi.list_repo_files`, `hf_hub_download`, `snapshot_download` and the hub cache constant (`HF_HUB_CACHE`, else
#: its older name `HUGGINGFACE_HUB_CACHE`) are used: present in the huggingface_hub releases vLLM images ship (0.x
#: and 1.x; vLLM 0.33 requires >= 1.31), unlike the
#: `huggingface-cli download` (removed in 1.0) or `hf download` (added in 0.34) commands. It prints vLLM's own
#: "Time spent downloading weights" line and writes {"downloadedBytes", "seconds"} as its termination message. When
#: the hub cannot be reached but the cache holds a snapshot of the revision, it exits 0 on that (vLLM falls back to
#: the cache the same way), so a network blip does not hold a remediation rollout whose weights are already there.
DOWNLOAD_SCRIPT = """\
import json, sys, time
from pathlib import Path
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download

WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt", ".onnx")
INDEX = "model.safetensors.index.json"


def weight_files(repo, revision, top):
    if INDEX in top:
        index = json.loads(Path(hf_hub_download(repo, INDEX, revision=revision)).read_text())
        names = sorted(set((index.get("weight_map") or {}).values()))
        if names:
            return names
    for ext in (".safetensors", ".bin", ".pt"):
        found = [f for f in top if f.endswith(ext)]
        if found:
            return found
    return []


def cached_bytes(blobs):
    return sum(p.stat().st_size for p in blobs.iterdir() if p.is_file()) if blobs.is_dir() else 0


def report(message_path, downloaded, seconds):
    Path(message_path).write_text(json.dumps({"downloadedBytes": downloaded, "seconds": round(seconds, 3)}))


def main(repo, revision, message_path):
    revision = revision or None
    try:
        top = [f for f in HfApi().list_repo_files(repo, revision=revision) if "/" not in f]
    except Exception as error:  # the hub unreachable: a snapshot already in the cache still serves vLLM
        try:
            snapshot_download(repo, revision=revision, local_files_only=True)
        except Exception:
            raise error from None
        print(f"the hub is unreachable ({error}); using the cached snapshot of {repo}", flush=True)
        report(message_path, 0, 0.0)
        return
    wanted = [f for f in top if not f.endswith(WEIGHTS)] + weight_files(repo, revision, top)
    hub = getattr(constants, "HF_HUB_CACHE", None) or constants.HUGGINGFACE_HUB_CACHE  # the older name
    blobs = Path(hub) / ("models--" + repo.replace("/", "--")) / "blobs"
    before, start = cached_bytes(blobs), time.monotonic()
    snapshot_download(repo, revision=revision, allow_patterns=wanted)
    seconds, downloaded = time.monotonic() - start, max(cached_bytes(blobs) - before, 0)
    print(f"Time spent downloading weights for {repo}: {seconds:.6f} seconds ({downloaded} bytes)", flush=True)
    report(message_path, downloaded, seconds)


main(*sys.argv[1:4])
"""
#: vLLM's own line (weight_utils.py, `download_weights_from_hf`; logged when the download took over 0.5 s).
_VLLM_DOWNLOAD_LINE = re.compile(r"Time spent downloading weights for \S+: ([0-9]+(?:\.[0-9]+)?) seconds")
_TRUE_WORDS = ("1", "on", "true", "yes")


class CacheSettings(BaseModel):
    """The operator-wide default (`vllm-operator run --model-cache-*`, the chart's `modelCache` values)."""

    model_config = ConfigDict(frozen=True)

    mode: Literal["auto", "persistent", "ephemeral"] = "auto"
    storage_class: str | None = Field(None, description="class of the default claims; None: the cluster default")
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = "ReadWriteOnce"
    size: str | None = Field(None, description="size of the default claims; None: from the checkpoint")
    download_mib_per_s: float = Field(100.0, gt=0, description="assumed download rate for the startup budget")
    download_init: bool = Field(True, description="fill a persistent cache with the model-download init container")


class CachePlan(BaseModel):
    """The decision: the pod's cache volume, the claim to create (if any), the condition and the probe budget."""

    model_config = ConfigDict(frozen=True)

    volume: dict[str, Any] = Field(description="the `model-cache` volume source (persistentVolumeClaim/emptyDir); "
                                               "empty when each pod gets its own claim from `claim_template`")
    claim: dict[str, Any] | None = Field(None, description="a PersistentVolumeClaim to create when missing")
    claim_template: dict[str, Any] | None = Field(
        None, description="a claim per pod (the workload's volumeClaimTemplates), kept across recreation and scale "
                          "down")
    per_pod_workload: Literal["LeaderWorkerSet", "StatefulSet"] | None = Field(
        None, description="with `claim_template`, the workload that gives one-node pods their claims (a plan over "
                          "nodes is a LeaderWorkerSet anyway)")
    persistent: bool
    exclusive: bool = Field(False, description="a ReadWriteOnce claim: roll without a surge pod")
    fits: bool = Field(True, description="False: the cache as asked cannot serve every pod, or is missing (the "
                                         "ModelCache condition is False)")
    reason: str
    message: str


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]


def shared_claim_name(model: str, revision: str | None) -> str:
    """`model-cache-<readable model>-<hash>`: one per model (and revision) and namespace, a valid DNS-1123 name."""
    key = f"{model}@{revision or 'main'}"
    readable = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")[:40].strip("-")
    return f"model-cache-{readable}-{_hash(key)}" if readable else f"model-cache-{_hash(key)}"


def own_claim_name(service: str) -> str:
    """`<service>-model-cache`, as a valid PVC name (a DNS-1123 subdomain) whatever the service is called."""
    return dns1123_subdomain(f"{service}-model-cache")


def default_size(checkpoint_gib: float) -> str:
    """Room for the checkpoint, a second revision's worth of partial downloads and the adapters: 1.5x + 10 GiB."""
    return f"{max(int(math.ceil(checkpoint_gib * 1.5 + 10)), 10)}Gi"


def startup_failure_threshold(checkpoint_gib: float, *, download_mib_per_s: float,
                              measured_mib_per_s: float | None = None, download: bool = True,
                              engine_seconds: float = ENGINE_START_SECONDS) -> int:
    """Startup probe periods (10 s): engine start + loading + the download. A persistent cache is empty on the
    first start too, so the download is budgeted (a probe that kills the first download would make the cache
    useless) unless the `model-download` init container made it (`download=False`); the measured rate, when known,
    replaces the assumed one, and the measured engine start (render/coldstart.py) the assumed 600 s."""
    rate = measured_mib_per_s if measured_mib_per_s and measured_mib_per_s > 0 else download_mib_per_s
    download_s = checkpoint_gib * 1024 / rate if download else 0.0
    seconds = engine_seconds + LOAD_SECONDS_PER_GIB * checkpoint_gib + 1.25 * download_s
    return max(int(math.ceil(seconds / PROBE_PERIOD_SECONDS)), 60)


def plan_cache(*, service: str, namespace: str, model: str, revision: str | None, spec: ModelCacheSpec | None,
               settings: CacheSettings, default_storage_class: str | None, checkpoint_gib: float,
               max_pods: int, labels: dict[str, str], owner: dict[str, Any],
               shared_storage_class: str | None = None, group_pods: bool = False,
               lws_served: bool = False, previous_workload: str | None = None,
               user_claim: ObservedClaim | None = None) -> CachePlan:
    """Where this service's weights live; see the module docstring. `max_pods`: the most pods the service may run
    (its bounds, not the replica count of the moment); `shared_storage_class`: a class of the cluster that gives
    ReadWriteMany claims (see `read_write_many_class`); `group_pods`: the pods are a LeaderWorkerSet's (each pod
    can have a claim of its own); `lws_served`: the LeaderWorkerSet API is served, so several one-node pods each
    get a claim of their own as one-pod groups (else as a StatefulSet); `previous_workload`: the kind the service
    runs on now (`status.workload`), which a claim per pod keeps; `user_claim`: the claim spec.modelCache.claimName
    names, as read (None: not read). A plan with `claim_template` runs as its `per_pod_workload` (a LeaderWorkerSet
    when `group_pods`)."""
    if spec is not None and spec.claim_name:
        return _user_claim(spec.claim_name, namespace, user_claim, max_pods)
    if spec is not None and spec.size:
        size, size_class = str(spec.size), spec.storage_class_name
        if max_pods > 1:  # one claim that every pod mounts only where the class gives ReadWriteMany
            chosen = size_class or default_storage_class
            if chosen is not None and chosen == shared_storage_class:
                return _sized_shared(service, namespace, labels, owner, size, size_class, chosen, max_pods)
            return _per_pod(service, labels, size_class or default_storage_class, size, size_class, max_pods,
                            group_pods=group_pods, workload=_per_pod_workload(lws_served, previous_workload),
                            asked=f"spec.modelCache.size {size}")
        name = own_claim_name(service)
        claim_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
        if size_class:
            claim_spec["storageClassName"] = size_class
        claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                              "ownerReferences": [owner]}, "spec": claim_spec}
        return CachePlan(volume={"persistentVolumeClaim": {"claimName": name}}, claim=claim, persistent=True,
                         exclusive=True, reason=PERSISTENT,
                         message=f"weights are cached on the claim {name} (spec.modelCache.size {size})")
    storage_class = settings.storage_class or default_storage_class
    if settings.mode == "ephemeral":
        return _ephemeral("the operator's model cache mode is ephemeral; set spec.modelCache, or run the operator "
                          "with --model-cache-mode auto", checkpoint_gib)
    # every service shares one ReadWriteMany claim per model where the cluster has a class that gives one: even a
    # one-replica service may be scaled (the scale subresource), and a scale must never change the pod template
    detected = (settings.access_mode == "ReadWriteOnce" and settings.storage_class is None
                and shared_storage_class is not None)
    if detected:
        storage_class = shared_storage_class
    if settings.mode == "auto" and storage_class is None:
        return _ephemeral("the cluster has no default StorageClass; set spec.modelCache, mark a StorageClass as "
                          "default, or run the operator with --model-cache-storage-class", checkpoint_gib)
    shared = settings.access_mode == "ReadWriteMany" or detected
    access_mode = "ReadWriteMany" if shared else settings.access_mode
    if not shared and max_pods > 1:
        return _per_pod(service, labels, storage_class, settings.size or default_size(checkpoint_gib),
                        settings.storage_class, max_pods, group_pods=group_pods,
                        workload=_per_pod_workload(lws_served, previous_workload))
    name = shared_claim_name(model, revision) if shared else own_claim_name(service)
    claim_labels = {"app.kubernetes.io/managed-by": MANAGED_BY, "app.kubernetes.io/component": "model-cache",
                    LABEL_CACHE_MODEL: _hash(f"{model}@{revision or 'main'}")}
    if not shared:
        claim_labels.update(labels)
    claim_spec = {"accessModes": [access_mode],
                  "resources": {"requests": {"storage": settings.size or default_size(checkpoint_gib)}}}
    if settings.storage_class or detected:
        claim_spec["storageClassName"] = storage_class
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": claim_labels,
                                "annotations": {"vllm-operator.dev/model": model[:253]}}
    if not shared:
        metadata["ownerReferences"] = [owner]  # the service's own cache goes with it
    where = (f"shared by the services of {model} in {namespace}" if shared else "this service's own")
    return CachePlan(volume={"persistentVolumeClaim": {"claimName": name}},
                     claim={"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata,
                            "spec": claim_spec},
                     persistent=True, exclusive=not shared, reason=PERSISTENT,
                     message=f"weights are cached on the claim {name} ({access_mode}, {where}; "
                     f"storage class {storage_class}): restarts and remediation steps do not download them again")


def _per_pod_workload(lws_served: bool, previous: str | None) -> Literal["LeaderWorkerSet", "StatefulSet"]:
    """Which workload gives one-node pods a claim each: the one they run on (installing or removing LeaderWorkerSet
    never drops a serving service's cached weights), else one-pod groups where the LeaderWorkerSet API is served,
    else a StatefulSet (apps/v1: always served)."""
    if previous == "StatefulSet":
        return "StatefulSet"
    return "LeaderWorkerSet" if lws_served else "StatefulSet"


def _per_pod(service: str, labels: dict[str, str], storage_class: str | None, size: str, claim_class: str | None,
             max_pods: int, *, group_pods: bool = True,
             workload: Literal["LeaderWorkerSet", "StatefulSet"] = "LeaderWorkerSet", asked: str = "") -> CachePlan:
    """A ReadWriteOnce claim per pod of `size` (and `claim_class`; None: the cluster's default class) from the
    workload's volumeClaimTemplates (`model-cache-<pod>`), kept when a pod is recreated or scaled down, deleted with
    the workload (so with the service). With `group_pods` the pods are a LeaderWorkerSet's groups; one-node pods run
    as one-pod groups (`workload` LeaderWorkerSet) or a StatefulSet. `storage_class`: the class the claims get, for
    the message; `asked`: what the spec asked, for the message."""
    claim_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if claim_class:
        claim_spec["storageClassName"] = claim_class
    template = {"metadata": {"name": "model-cache", "labels": {
        **labels, "app.kubernetes.io/component": "model-cache"}}, "spec": claim_spec}
    if group_pods:
        message = (f"weights are cached on a claim per pod (the LeaderWorkerSet's volumeClaimTemplates, "
                   f"ReadWriteOnce, storage class {storage_class}; up to {max_pods} pods): a recreated group finds "
                   f"its weights and compiled graphs again; the claims go with the service")
        workload = "LeaderWorkerSet"
    elif workload == "StatefulSet":
        message = (f"weights are cached on a claim per pod (ReadWriteOnce, storage class {storage_class}; this "
                   f"service may run {max_pods} pods, so it runs as a StatefulSet whose volumeClaimTemplates give "
                   f"each pod its own claim): a restarted or recreated pod finds its weights and compiled graphs "
                   f"again; the claims are kept when the service scales down (a scale back up finds its weights) "
                   f"and deleted with the service; scaling changes no pod template")
    else:
        message = (f"weights are cached on a claim per pod (ReadWriteOnce, storage class {storage_class}; this "
                   f"service may run {max_pods} pods, so it runs as a LeaderWorkerSet of one-pod groups whose "
                   f"volumeClaimTemplates give each pod its own claim): a restarted, recreated or re-added pod finds "
                   f"its weights and compiled graphs again; scaling changes no pod template; the claims go with "
                   f"the service")
    if asked:
        message = f"{message} ({asked} each)"
    return CachePlan(volume={}, claim_template=template, per_pod_workload=workload, persistent=True,
                     reason=PERSISTENT, message=message)


def _sized_shared(service: str, namespace: str, labels: dict[str, str], owner: dict[str, Any], size: str,
                  claim_class: str | None, storage_class: str, max_pods: int) -> CachePlan:
    """spec.modelCache.size for a service that may run several pods, on a class that gives ReadWriteMany claims: one
    claim of that size that every pod mounts (`<service>-model-cache-shared`: never the name of the ReadWriteOnce
    claim the same service gets while it runs one pod, whose access mode cannot change), owned by the service."""
    name = dns1123_subdomain(f"{service}-model-cache-shared")
    claim_spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}}
    if claim_class:
        claim_spec["storageClassName"] = claim_class
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": name, "namespace": namespace,
                          "labels": {**labels, "app.kubernetes.io/component": "model-cache"},
                          "ownerReferences": [owner]}, "spec": claim_spec}
    return CachePlan(volume={"persistentVolumeClaim": {"claimName": name}}, claim=claim, persistent=True,
                     reason=PERSISTENT,
                     message=f"weights are cached on the claim {name} (spec.modelCache.size {size}, ReadWriteMany, "
                     f"storage class {storage_class}): every pod of this service (up to {max_pods}) mounts it, so "
                     "a rollout surges and scaling changes no pod template")


#: Access modes of a claim that only one node (ReadWriteOnce) or one pod (ReadWriteOncePod) can mount.
_ONE_NODE_MODES = ("ReadWriteOnce", "ReadWriteOncePod")
_KNOWN_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


class ObservedClaim(BaseModel):
    """The user's claim (spec.modelCache.claimName) as the shell read it: whether it exists and its access modes."""

    model_config = ConfigDict(frozen=True)

    name: str
    found: bool
    access_modes: tuple[str, ...] = ()


def observed_claim(name: str, claim: Mapping[str, Any] | None) -> ObservedClaim:
    """What the core needs of a PersistentVolumeClaim as read from the API (None: not found): the access modes of
    its bound volume (`status.accessModes`), else the ones it asks (`spec.accessModes`); only the modes Kubernetes
    knows, each once (a hostile object cannot grow the plan)."""
    if claim is None:
        return ObservedClaim(name=name, found=False)
    modes: list[str] = []
    for part in ("status", "spec"):
        section = claim.get(part)
        said = section.get("accessModes") if isinstance(section, Mapping) else None
        if isinstance(said, list):
            modes = [m for m in _KNOWN_MODES if m in said[:16]]
            if modes:
                break
    return ObservedClaim(name=name, found=True, access_modes=tuple(modes))


def _user_claim(name: str, namespace: str, seen: ObservedClaim | None, max_pods: int) -> CachePlan:
    """spec.modelCache.claimName: the user's claim, mounted as it is. Where it was read (`seen`), a claim only one
    node (or one pod) can mount rolls without a surge pod (one on another node would never attach it), and the
    condition says when the service may run more pods than can mount it; a missing claim is said too."""
    volume = {"persistentVolumeClaim": {"claimName": name}}
    base = f"weights are cached on the claim {name} (spec.modelCache.claimName)"
    if seen is None:  # not read (the operator may not get claims): as asked, nothing more known
        return CachePlan(volume=volume, persistent=True, reason=PERSISTENT, message=base)
    if not seen.found:
        return CachePlan(volume=volume, persistent=True, fits=False, reason=CLAIM_NOT_FOUND,
                         message=f"the claim {name} (spec.modelCache.claimName) does not exist in namespace "
                         f"{namespace}: the pods stay Pending until it is created; create it, or drop claimName for "
                         "a claim the operator creates")
    one_pod = "ReadWriteOncePod" in seen.access_modes
    one_node = not one_pod and "ReadWriteMany" not in seen.access_modes and "ReadOnlyMany" not in seen.access_modes \
        and "ReadWriteOnce" in seen.access_modes
    if not (one_pod or one_node):
        return CachePlan(volume=volume, persistent=True, reason=PERSISTENT,
                         message=f"{base}; {', '.join(seen.access_modes) or 'access mode unknown'}: every pod can "
                         "mount it, so a rollout surges")
    mode = "ReadWriteOncePod" if one_pod else "ReadWriteOnce"
    if max_pods <= 1:
        return CachePlan(volume=volume, persistent=True, exclusive=True, reason=PERSISTENT,
                         message=f"{base}; {mode}: the service rolls without a surge pod (one pod mounts it at a "
                         "time)")
    who = ("a second pod cannot mount it and stays Pending" if one_pod else
           "a pod on another node than the one that mounts it cannot attach it and stays ContainerCreating "
           "(Multi-Attach)")
    return CachePlan(volume=volume, persistent=True, exclusive=True, fits=False, reason=CLAIM_NOT_SHARED,
                     message=f"the claim {name} (spec.modelCache.claimName) is {mode}, but this service may run "
                     f"{max_pods} pods: {who}; use a "
                     "ReadWriteMany claim, or drop claimName (spec.modelCache.size, or the operator's default) "
                     "for a claim per pod")


def _ephemeral(why: str, checkpoint_gib: float) -> CachePlan:
    return CachePlan(volume={"emptyDir": {}}, persistent=False, reason=EPHEMERAL,
                     message=f"weights are cached in an emptyDir: every pod start, restart and remediation step "
                     f"downloads them again ({checkpoint_gib:.1f} GiB each time); {why}")


#: A StorageClass annotation that says which access mode its claims give (for provisioners not known below).
ACCESS_MODE_ANNOTATION = "vllm-operator.dev/access-mode"
#: Provisioners of shared file systems, whose claims may be ReadWriteMany (substrings of the provisioner name).
READ_WRITE_MANY_PROVISIONERS = ("nfs", "cephfs", "efs.csi.aws.com", "filestore.csi.storage.gke.io",
                                "file.csi.azure.com", "kubernetes.io/azure-file", "fsx.csi.aws.com",
                                "juicefs", "driver.longhorn.io", "csi.weka.io", "spectrumscale.csi.ibm.com")


def read_write_many_class(classes: Sequence[Mapping[str, Any]]) -> str | None:
    """The StorageClass whose claims can be ReadWriteMany (the annotation says so, or a shared file system's
    provisioner), the default class first; None when the cluster has none."""
    def default(item: Mapping[str, Any]) -> bool:
        annotations = (item.get("metadata") or {}).get("annotations") or {}
        return str(annotations.get("storageclass.kubernetes.io/is-default-class", "")).lower() == "true"

    for item in sorted(classes, key=lambda c: not default(c)):
        meta = item.get("metadata") or {}
        said = str((meta.get("annotations") or {}).get(ACCESS_MODE_ANNOTATION, ""))
        provisioner = str(item.get("provisioner") or "").lower()
        if said == "ReadWriteMany" or (not said and any(p in provisioner for p in READ_WRITE_MANY_PROVISIONERS)):
            name = str(meta.get("name") or "")
            if name:
                return name
    return None


# --- the model-download init container ---------------------------------------------------------------------------


def download_init_wanted(plan: CachePlan, settings: CacheSettings, env: Sequence[Mapping[str, Any]],
                         extra_args: Sequence[str]) -> tuple[bool, str]:
    """Whether the `model-download` init container fills the cache, and why (for the ModelCache message).

    Only a persistent cache (an emptyDir dies with the pod: vLLM's own download is as good), only when the operator
    setting allows it, and never when vLLM would not read the Hugging Face cache: `HF_HUB_OFFLINE` set in
    spec.env (the weights are already there), or `--download-dir`/`--load-format` in spec.extraArgs.
    (spec.model.name is always a hub id; a model on a volume is served with spec.modelCache.claimName and
    HF_HUB_OFFLINE=1.)"""
    if not plan.persistent:
        return False, ""
    if not settings.download_init:
        return False, "vLLM downloads the weights itself (the operator runs with --no-model-cache-download-init)"
    offline = next((e for e in env if e.get("name") == "HF_HUB_OFFLINE"), None)
    if offline is not None and str(offline.get("value", "")).strip().lower() in _TRUE_WORDS:
        return False, "no download: spec.env sets HF_HUB_OFFLINE"
    for arg in extra_args:
        flag = str(arg).split("=", 1)[0]
        if flag in ("--download-dir", "--load-format"):
            return False, f"vLLM downloads the weights itself ({flag} in spec.extraArgs)"
    return True, "the model-download init container fills it before vLLM starts"


def build_download_container(*, image: str, image_pull_policy: str, model: str, revision: str | None,
                             env: list[dict[str, Any]], mounts: list[dict[str, Any]],
                             security_context: dict[str, Any]) -> dict[str, Any]:
    """The init container: the vLLM image's own huggingface_hub, the model id and revision as argv data, the same
    env (HF_HOME, token, the user's mirrors and proxies) and mounts as vLLM. No probe, no deadline (module
    docstring)."""
    return {
        "name": DOWNLOAD_CONTAINER,
        "image": image,
        "imagePullPolicy": image_pull_policy,
        "command": ["python3", "-c", DOWNLOAD_SCRIPT],
        "args": [model, revision or "", TERMINATION_LOG],
        "env": copy.deepcopy(env),
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # copies, not shared dicts: what a LeaderWorkerSet adds to the vLLM container (IPC_LOCK) stays off this one
        "securityContext": copy.deepcopy(security_context),
        "volumeMounts": copy.deepcopy(mounts),
    }


# --- the measured download ---------------------------------------------------------------------------------------


class DownloadMeasure(BaseModel):
    """One download that was observed: how many bytes in how many seconds, by which pod and how it was seen."""

    model_config = ConfigDict(frozen=True)

    downloaded_bytes: int = Field(ge=0)
    seconds: float = Field(gt=0)
    pod: str
    source: Literal["init-container", "vllm-log"]
    finished_at: str | None = None

    @property
    def bytes_per_second(self) -> float:
        return self.downloaded_bytes / self.seconds

    def telling(self) -> bool:
        """Large and long enough to say something about the network (a warm cache's check is not a download)."""
        return self.downloaded_bytes >= MIN_MEASURED_BYTES and self.seconds >= MIN_MEASURED_SECONDS


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def measured_download(pod: Mapping[str, Any]) -> DownloadMeasure | None:
    """The download the pod's `model-download` init container reported (its termination message, exit code 0), or
    None. Bad or foreign messages give None, never an exception."""
    name = str((pod.get("metadata") or {}).get("name") or "")
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if not isinstance(status, Mapping) or status.get("name") != DOWNLOAD_CONTAINER:
            continue
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated.get("exitCode") != 0:
            return None
        try:
            report = json.loads(str(terminated.get("message") or ""))
        except ValueError:
            return None
        if not isinstance(report, Mapping):
            return None
        size, seconds = _as_int(report.get("downloadedBytes")), _as_float(report.get("seconds"))
        if size is None or seconds is None:
            return None
        finished = terminated.get("finishedAt")
        return DownloadMeasure(downloaded_bytes=size, seconds=seconds, pod=name, source="init-container",
                               finished_at=str(finished) if finished else None)
    return None


def download_from_vllm_log(text: str, *, checkpoint_bytes: int, pod: str) -> DownloadMeasure | None:
    """The download vLLM made itself, from its own log line; the bytes are the checkpoint's (a vLLM that downloads
    into an empty cache fetches all of it; a warm cache logs no line, vLLM logs only downloads over 0.5 s)."""
    found = _VLLM_DOWNLOAD_LINE.findall(text or "")
    if not found or checkpoint_bytes <= 0:
        return None
    seconds = _as_float(float(found[-1]))
    if seconds is None:
        return None
    return DownloadMeasure(downloaded_bytes=checkpoint_bytes, seconds=seconds, pod=pod, source="vllm-log")


def fold_download(model_cache: Mapping[str, Any] | None, measure: DownloadMeasure | None) -> dict[str, Any] | None:
    """`status.modelCache` with this measurement, or None when there is nothing new to record (no measure, one that
    says nothing about the network, or the pod's measurement already recorded)."""
    if measure is None or not measure.telling():
        return None
    current = dict(model_cache or {})
    if current.get("measuredPod") == measure.pod and current.get("downloadedBytes") == measure.downloaded_bytes:
        return None
    current.update({"downloadedBytes": measure.downloaded_bytes, "downloadSeconds": round(measure.seconds, 3),
                    "bytesPerSecond": int(measure.bytes_per_second), "measuredPod": measure.pod,
                    "measuredBy": measure.source})
    if measure.finished_at:
        current["measuredAt"] = measure.finished_at
    return current


def download_failure(pod: Mapping[str, Any]) -> str | None:
    """Why the pod's `model-download` init container failed (the end of its message: with FallbackToLogsOnError the
    log's last lines, e.g. a gated repository without a token), or None when it did not fail."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if not isinstance(status, Mapping) or status.get("name") != DOWNLOAD_CONTAINER:
            continue
        now = status.get("state") or {}
        if isinstance(now, Mapping) and ((now.get("terminated") or {}).get("exitCode") == 0):
            return None  # it succeeded after earlier failures (lastState keeps the last one)
        for state in (now, status.get("lastState") or {}):
            terminated = state.get("terminated") if isinstance(state, Mapping) else None
            if isinstance(terminated, Mapping) and terminated.get("exitCode") not in (0, None):
                lines = [line.strip() for line in str(terminated.get("message") or "").splitlines() if line.strip()]
                why = " / ".join(lines[-3:]) or f"exit code {terminated.get('exitCode')} " \
                    f"({terminated.get('reason') or 'Error'})"
                return why[-400:]
    return None


def fold_download_failure(model_cache: Mapping[str, Any] | None, pod: str, why: str | None,
                          ) -> dict[str, Any] | None:
    """`status.modelCache` saying the pod's download fails (`why`), or no longer failing (`why` None after a pod's
    init container succeeded); None when that is already what it says."""
    current = dict(model_cache or {})
    if why is None:
        if "downloadError" not in current:
            return None
        current.pop("downloadError", None)
        current.pop("downloadErrorPod", None)
        return current
    if current.get("downloadError") == why and current.get("downloadErrorPod") == pod:
        return None
    current.update({"downloadError": why, "downloadErrorPod": pod})
    return current


def budget_rate(model_cache: Mapping[str, Any] | None, *, args_changed: bool) -> float | None:
    """The download rate (MiB/s) the startup budget uses, None for the assumed one. A new measurement applies when
    vLLM's arguments change anyway (a remediation step, a spec change); until then the rate the current template
    was budgeted with stays, so a measurement alone never rolls the pods out."""
    status = model_cache or {}
    key = "bytesPerSecond" if args_changed else "budgetBytesPerSecond"
    rate = _as_float(status.get(key))
    return rate / 2**20 if rate is not None else None
