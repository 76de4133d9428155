"""Where a VLLMService's weights are cached, decided once and purely: so that a restart or a remediation step does
not download them again.

- `spec.modelCache` (an existing claim, or one the operator creates for the service) always wins.
- Otherwise the operator-wide `CacheSettings.mode` decides: `auto` (the default) gives a PersistentVolumeClaim when
  the cluster has a default StorageClass (or the settings name one), `persistent` always does, `ephemeral` never.
- With `ReadWriteMany` the claim is per model and namespace: every service of that model (and revision) in the
  namespace mounts it, and it outlives them (no owner: a cache, not a child; delete it by its labels).
  With `ReadWriteOnce` (the default: what most default classes give) one node mounts it, so the claim is per
  service and the service must run one pod: the Deployment then rolls without a surge pod (a second pod on another
  node could never attach the volume, and the first would keep it). A service allowed more pods gets an emptyDir
  and a condition saying how to get a persistent cache.
- The condition `ModelCache` says which it is: True (reason PersistentVolumeClaim) or False (reason Ephemeral,
  with why and the fix).
- The startup probe's budget follows the checkpoint: a download at `download_mib_per_s` when the cache is empty
  (or the measured rate, when known), plus loading, plus a fixed allowance for engine start-up.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..api.labels import MANAGED_BY
from ..api.v1alpha1 import ModelCacheSpec
from .manifests import dns1123_subdomain

#: The condition type and its reasons.
MODEL_CACHE = "ModelCache"
PERSISTENT = "PersistentVolumeClaim"
EPHEMERAL = "Ephemeral"
#: Labels of a shared cache claim (what to select to clean caches up).
LABEL_CACHE_MODEL = "vllm-operator.dev/model-cache"
#: Engine start-up besides the weights (CUDA graphs, compilation, profiling), seconds.
ENGINE_START_SECONDS = 600
#: Loading from a local disk into GPU memory, seconds per GiB (conservative: network disks).
LOAD_SECONDS_PER_GIB = 6.0
PROBE_PERIOD_SECONDS = 10


class CacheSettings(BaseModel):
    """The operator-wide default (`vllm-operator run --model-cache-*`, the chart's `modelCache` values)."""

    model_config = ConfigDict(frozen=True)

    mode: Literal["auto", "persistent", "ephemeral"] = "auto"
    storage_class: str | None = Field(None, description="class of the default claims; None: the cluster default")
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = "ReadWriteOnce"
    size: str | None = Field(None, description="size of the default claims; None: from the checkpoint")
    download_mib_per_s: float = Field(100.0, gt=0, description="assumed download rate for the startup budget")


class CachePlan(BaseModel):
    """The decision: the pod's cache volume, the claim to create (if any), the condition and the probe budget."""

    model_config = ConfigDict(frozen=True)

    volume: dict[str, Any] = Field(description="the `model-cache` volume source (persistentVolumeClaim/emptyDir)")
    claim: dict[str, Any] | None = Field(None, description="a PersistentVolumeClaim to create when missing")
    persistent: bool
    exclusive: bool = Field(False, description="a ReadWriteOnce claim: roll without a surge pod")
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
                              measured_mib_per_s: float | None = None) -> int:
    """Startup probe periods (10 s): engine start + loading + the download. A persistent cache is empty on the
    first start too, so the download is always budgeted (a probe that kills the first download would make the
    cache useless); the measured rate, when known, replaces the assumed one."""
    rate = measured_mib_per_s if measured_mib_per_s and measured_mib_per_s > 0 else download_mib_per_s
    download = checkpoint_gib * 1024 / rate
    seconds = ENGINE_START_SECONDS + LOAD_SECONDS_PER_GIB * checkpoint_gib + 1.25 * download
    return max(int(math.ceil(seconds / PROBE_PERIOD_SECONDS)), 60)


def plan_cache(*, service: str, namespace: str, model: str, revision: str | None, spec: ModelCacheSpec | None,
               settings: CacheSettings, default_storage_class: str | None, checkpoint_gib: float,
               max_pods: int, labels: dict[str, str], owner: dict[str, Any]) -> CachePlan:
    """Where this service's weights live; see the module docstring."""
    if spec is not None and spec.claim_name:
        return CachePlan(volume={"persistentVolumeClaim": {"claimName": spec.claim_name}}, persistent=True,
                         reason=PERSISTENT, message=f"weights are cached on the claim {spec.claim_name} "
                         "(spec.modelCache.claimName)")
    if spec is not None and spec.size:
        name = own_claim_name(service)
        claim_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                      "resources": {"requests": {"storage": str(spec.size)}}}
        if spec.storage_class_name:
            claim_spec["storageClassName"] = spec.storage_class_name
        claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                              "ownerReferences": [owner]}, "spec": claim_spec}
        return CachePlan(volume={"persistentVolumeClaim": {"claimName": name}}, claim=claim, persistent=True,
                         exclusive=max_pods <= 1, reason=PERSISTENT,
                         message=f"weights are cached on the claim {name} (spec.modelCache.size {spec.size})")
    storage_class = settings.storage_class or default_storage_class
    if settings.mode == "ephemeral":
        return _ephemeral("the operator's model cache mode is ephemeral; set spec.modelCache, or run the operator "
                          "with --model-cache-mode auto")
    if settings.mode == "auto" and storage_class is None:
        return _ephemeral("the cluster has no default StorageClass; set spec.modelCache, mark a StorageClass as "
                          "default, or run the operator with --model-cache-storage-class")
    shared = settings.access_mode == "ReadWriteMany"
    if not shared and max_pods > 1:
        return _ephemeral(f"this service may run {max_pods} pods and the default cache claim is ReadWriteOnce (one "
                          "node); set spec.modelCache.claimName to a ReadWriteMany claim, or run the operator with "
                          "--model-cache-access-mode ReadWriteMany")
    name = shared_claim_name(model, revision) if shared else own_claim_name(service)
    claim_labels = {"app.kubernetes.io/managed-by": MANAGED_BY, "app.kubernetes.io/component": "model-cache",
                    LABEL_CACHE_MODEL: _hash(f"{model}@{revision or 'main'}")}
    if not shared:
        claim_labels.update(labels)
    claim_spec = {"accessModes": [settings.access_mode],
                  "resources": {"requests": {"storage": settings.size or default_size(checkpoint_gib)}}}
    if settings.storage_class:
        claim_spec["storageClassName"] = settings.storage_class
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": claim_labels,
                                "annotations": {"vllm-operator.dev/model": model[:253]}}
    if not shared:
        metadata["ownerReferences"] = [owner]  # the service's own cache goes with it
    where = (f"shared by the services of {model} in {namespace}" if shared else "this service's own")
    return CachePlan(volume={"persistentVolumeClaim": {"claimName": name}},
                     claim={"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata,
                            "spec": claim_spec},
                     persistent=True, exclusive=not shared, reason=PERSISTENT,
                     message=f"weights are cached on the claim {name} ({settings.access_mode}, {where}; "
                     f"storage class {storage_class}): restarts and remediation steps do not download them again")


def _ephemeral(why: str) -> CachePlan:
    return CachePlan(volume={"emptyDir": {}}, persistent=False, reason=EPHEMERAL,
                     message=f"weights are cached in an emptyDir: every pod restart and remediation step downloads "
                     f"them again; {why}")
