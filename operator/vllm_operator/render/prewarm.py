"""spec.modelCache.prewarm: pull the vLLM image and fill the model cache on the nodes of the chosen pool before the
first pod is created, so that the first start is warm. Pure: the rendered workload in, a DaemonSet and its progress
out (handlers/prewarm.py applies it and holds the workload back until it is done).

The DaemonSet runs on the nodes the workload's pods may use (the pod template's nodeSelector, affinity and
tolerations) and asks for no GPU (the pool's GPUs stay free for the service's pods):

- init container `prewarm-image`: the vLLM image itself (the kubelet pulls it onto the node; it prints one line);
- init container `model-download` (the workload's own: the same script, env, mounts), only when the cache is a
  claim every node can mount (ReadWriteMany): concurrent fills of one shared claim fetch each file once
  (huggingface_hub locks it). A ReadWriteOnce claim (one node), a LeaderWorkerSet's per-pod claims and an emptyDir
  are not filled ahead (no pod but the service's own can use them): only the image is pulled, and the
  `model-download` init container of the first pod fills the cache as before;
- container `pause`: holds nothing, so the pod reports Ready once both init containers succeeded on its node.

The pods carry none of the service's labels: they are not serving pods (no Service, remediation or metrics reaches
them). What was warmed is a key over the image, the model, the pool and the cache volume: a change of any of them
(an image upgrade, a move to another pool) warms again before the rollout; a flag edit or a remediation step does
not.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..api.labels import ANNOTATION_SPEC_HASH, LABEL_SERVICE, MANAGED_BY
from .cache import DOWNLOAD_CONTAINER
from .manifests import spec_hash
from .names import dns1123_subdomain, label_value

__all__ = ["PAUSE_IMAGE", "PREWARMING", "Progress", "build_prewarm_daemonset", "prewarm_key", "prewarm_name",
           "prewarm_progress"]

#: The Progressing reason while the pool's nodes are warmed (the workload is not created or updated yet).
PREWARMING = "Prewarming"
#: The container that holds the pod once its init containers are done (the Kubernetes pause image).
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
IMAGE_CONTAINER = "prewarm-image"
#: The pods' labels: which service they warm, and for which key (pods of an older key are being replaced).
LABEL_PREWARM = "vllm-operator.dev/prewarm"
LABEL_PREWARM_KEY = "vllm-operator.dev/prewarm-key"
#: The most nodes listed in status (the first by name).
MAX_NODES = 64
#: The kubelet's waiting reasons that mean a container will not start by itself.
_STUCK = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
          "CreateContainerError", "CrashLoopBackOff", "RunContainerError")


def prewarm_name(service: str) -> str:
    """`<service>-prewarm`, a valid DaemonSet name short enough for its pods' generated names."""
    return dns1123_subdomain(f"{service}-prewarm", limit=57)


def _pod_template(workload: Mapping[str, Any]) -> Mapping[str, Any]:
    if workload.get("kind") == "LeaderWorkerSet":
        group = (workload.get("spec") or {}).get("leaderWorkerTemplate") or {}
        return group.get("leaderTemplate") or group.get("workerTemplate") or {}
    return (workload.get("spec") or {}).get("template") or {}


def _shared_claim(volume: Mapping[str, Any] | None, children: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the cache volume is a claim the operator renders as ReadWriteMany (every node can mount it)."""
    claim = ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName")
    for child in children:
        if child.get("kind") == "PersistentVolumeClaim" and (child.get("metadata") or {}).get("name") == claim:
            return "ReadWriteMany" in ((child.get("spec") or {}).get("accessModes") or [])
    return False


def prewarm_key(daemon_set: Mapping[str, Any]) -> str:
    """What a DaemonSet warms: a hash of its pod template without the key label itself."""
    template = copy.deepcopy(dict((daemon_set.get("spec") or {}).get("template") or {}))
    (template.get("metadata") or {}).get("labels", {}).pop(LABEL_PREWARM_KEY, None)
    return spec_hash(template)


def build_prewarm_daemonset(workload: Mapping[str, Any], children: Sequence[Mapping[str, Any]], *, service: str,
                            namespace: str) -> tuple[dict[str, Any], bool]:
    """The prewarm DaemonSet for the rendered workload (a Deployment, StatefulSet or LeaderWorkerSet) and whether it
    fills the cache too (a ReadWriteMany claim among `children`), else pulls the image only."""
    template = _pod_template(workload)
    pod_spec = template.get("spec") or {}
    containers = [c for c in pod_spec.get("containers") or [] if isinstance(c, Mapping)]
    vllm = next((c for c in containers if c.get("name") == "vllm"), containers[0] if containers else {})
    image = str(vllm.get("image") or "")
    volumes = {str(v.get("name")): v for v in pod_spec.get("volumes") or [] if isinstance(v, Mapping)}
    download = next((c for c in pod_spec.get("initContainers") or []
                     if isinstance(c, Mapping) and c.get("name") == DOWNLOAD_CONTAINER), None)
    fills = download is not None and _shared_claim(volumes.get("model-cache"), children)
    security = copy.deepcopy(vllm.get("securityContext") or {"allowPrivilegeEscalation": False})
    inits: list[dict[str, Any]] = [{
        "name": IMAGE_CONTAINER, "image": image, "imagePullPolicy": vllm.get("imagePullPolicy", "IfNotPresent"),
        "command": ["python3", "-c", "print('the vLLM image is on this node')"],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": security,
    }]
    used: list[dict[str, Any]] = []
    if fills and download is not None:
        inits.append(copy.deepcopy(dict(download)))
        for mount in download.get("volumeMounts") or []:
            name = str(mount.get("name"))
            if name in volumes and all(v["name"] != name for v in used):
                used.append(copy.deepcopy(dict(volumes[name])))
    value = label_value(service)
    pod_labels = {"app.kubernetes.io/name": "vllm-prewarm", "app.kubernetes.io/component": "prewarm", "app.kubernetes.io/managed-by": MANAGED_BY,
                  LABEL_PREWARM: value}
    spec: dict[str, Any] = {
        "initContainers": inits,
        "containers": [{"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "IfNotPresent",
                        "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "32Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                            "runAsUser": 65535, "capabilities": {"drop": ["ALL"]}}}],
        "terminationGracePeriodSeconds": 5,
        "automountServiceAccountToken": False,
    }
    for key in ("nodeSelector", "affinity", "tolerations", "imagePullSecrets", "securityContext"):
        if pod_spec.get(key):
            spec[key] = copy.deepcopy(pod_spec[key])
    if used:
        spec["volumes"] = used
    meta = workload.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), "app.kubernetes.io/component": "prewarm"}
    daemon_set: dict[str, Any] = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": prewarm_name(service), "namespace": namespace, "labels": labels, "annotations": {},
                     "ownerReferences": copy.deepcopy(list(meta.get("ownerReferences") or []))},
        "spec": {"selector": {"matchLabels": {LABEL_PREWARM: value}},
                 "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
                 "template": {"metadata": {"labels": pod_labels}, "spec": spec}},
    }
    daemon_set["spec"]["template"]["metadata"]["labels"][LABEL_PREWARM_KEY] = prewarm_key(daemon_set)
    daemon_set["metadata"]["annotations"][ANNOTATION_SPEC_HASH] = spec_hash(daemon_set["spec"])
    assert LABEL_SERVICE not in pod_labels  # never a serving pod
    return daemon_set, fills


@dataclass(frozen=True)
class Progress:
    """Where warming stands: `phase` Running, Done or Skipped (no node of the pool yet), each node's state."""

    phase: Literal["Running", "Done", "Skipped"]
    ready: int
    desired: int
    nodes: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""


def _waiting(status: Mapping[str, Any] | None) -> tuple[str, str]:
    waiting = ((status or {}).get("state") or {}).get("waiting") or {}
    return str(waiting.get("reason") or ""), str(waiting.get("message") or "")


def _terminated(status: Mapping[str, Any] | None) -> Mapping[str, Any]:
    state = (status or {}).get("state") or {}
    return state.get("terminated") or {}


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [] if isinstance(c, Mapping))


def node_state(pod: Mapping[str, Any], failure: str | None = None) -> dict[str, Any]:
    """One prewarm pod's node and state: Pending (not on a node yet), Pulling, Filling, Done, or Failing (why).
    `failure`: the model-download init container's failure, as `render.cache.download_failure` reads it."""
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if _ready(pod):
        return {"node": node, "state": "Done"}
    if not node:
        return {"node": "(unscheduled)", "state": "Pending"}
    inits = {str(s.get("name")): s for s in (pod.get("status") or {}).get("initContainerStatuses") or []
             if isinstance(s, Mapping)}
    for name in (IMAGE_CONTAINER, DOWNLOAD_CONTAINER, "pause"):
        reason, message = _waiting(inits.get(name))
        if reason in _STUCK:
            return {"node": node, "state": "Failing", "message": f"{name}: {reason}: {message}"[:512]}
    if failure:
        return {"node": node, "state": "Failing", "message": f"{DOWNLOAD_CONTAINER}: {failure}"[:512]}
    if _terminated(inits.get(IMAGE_CONTAINER)).get("exitCode") == 0:
        return {"node": node, "state": "Filling" if DOWNLOAD_CONTAINER in inits else "Done"}
    return {"node": node, "state": "Pulling"}


def prewarm_progress(daemon_set: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]], key: str,
                     failures: Mapping[str, str] | None = None) -> Progress:
    """How far the DaemonSet (as read; None: not created yet) has warmed the pool, from its status and its pods of
    this `key` (pods of an older key are being replaced). Done: every node it runs on reports Ready; Skipped: the
    controller found no node of the pool (nodes an autoscaler adds on demand do not exist yet — a DaemonSet does
    not make them appear, the workload's pods do)."""
    if daemon_set is None:
        return Progress("Running", 0, 0, message="creating the prewarm DaemonSet")
    status = daemon_set.get("status") or {}
    generation = (daemon_set.get("metadata") or {}).get("generation")
    observed = status.get("observedGeneration")
    if "desiredNumberScheduled" not in status or (isinstance(generation, int) and isinstance(observed, int)
                                                 and observed < generation):
        return Progress("Running", 0, 0, message="waiting for the DaemonSet controller")
    desired = int(status.get("desiredNumberScheduled") or 0)
    if desired <= 0:
        return Progress("Skipped", 0, 0, message="no node of the pool to warm yet")
    current = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_PREWARM_KEY) == key
               and not (p.get("metadata") or {}).get("deletionTimestamp")]
    states = sorted((node_state(p, (failures or {}).get(str((p.get("metadata") or {}).get("name")))) for p in current),
                    key=lambda n: n["node"])
    ready = sum(1 for n in states if n["state"] == "Done")
    said = ", ".join(f"{n['node']}: {n['state'].lower()}" for n in states[:8]) + (
        f", … {len(states) - 8} more" if len(states) > 8 else "")
    if ready >= desired and len(current) >= desired:
        return Progress("Done", ready, desired, states[:MAX_NODES], f"{ready}/{desired} nodes warm")
    return Progress("Running", ready, desired, states[:MAX_NODES],
                    f"{ready}/{desired} nodes warm" + (f" ({said})" if said else ""))
