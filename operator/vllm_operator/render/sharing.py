"""How the members of a share group get onto one GPU (issue 26): DRA, time-slicing, or a refusal (pure).

Three cluster set-ups, in the order the operator prefers them:

1. **DRA** (Kubernetes 1.34+, `resource.k8s.io/v1`, NVIDIA's DRA driver serving the device class `gpu.nvidia.com`):
   one ResourceClaim per shared GPU, owned by the group's members, with the driver's time-slicing sharing config;
   every member on that GPU names the claim in its pod spec (`resourceClaims`) and its container
   (`resources.claims`), so the scheduler and the driver put them on the same device.
2. **Time-slicing** with the NVIDIA device plugin (GPU Feature Discovery labels `nvidia.com/gpu.replicas` > 1,
   `nvidia.com/gpu.sharing-strategy: time-slicing`, product `…-SHARED`): each member asks for one `nvidia.com/gpu`
   replica, and all members of one shared GPU are pinned to the same node with a single physical GPU (with several,
   the plugin may hand replicas of different GPUs to them). Nothing isolates memory.
3. Neither: the group is refused, and the condition says what to install.

Every function here returns plain data; the handlers observe the cluster and apply.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from .names import dns1123_subdomain, label_value

#: NVIDIA's DRA driver (k8s-dra-driver-gpu) serves whole GPUs under this device class.
DRA_DEVICE_CLASS = "gpu.nvidia.com"
DRA_API_VERSION = "resource.k8s.io/v1"
#: The driver's opaque per-claim configuration (GpuConfig) selects how the pods of one claim share the GPU.
DRA_CONFIG_API_VERSION = "resource.nvidia.com/v1beta1"
CLAIM_REQUEST = "gpu"
#: The name of the claim inside the member's pod spec.
POD_CLAIM_NAME = "shared-gpu"

GROUP_LABEL = "vllm-operator.dev/share-group"
GPU_INDEX_LABEL = "vllm-operator.dev/shared-gpu"
MANAGED_BY = {"app.kubernetes.io/managed-by": "vllm-operator"}

REPLICAS_LABEL = "nvidia.com/gpu.replicas"
STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
COUNT_LABEL = "nvidia.com/gpu.count"
PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME_LABEL = "kubernetes.io/hostname"
SHARED_SUFFIX = "-SHARED"

INSTALL_HINT = (
    "install NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu, Helm chart nvidia/nvidia-dra-driver-gpu, on "
    "Kubernetes 1.34+ where resource.k8s.io/v1 is served) so that the device class gpu.nvidia.com exists, or enable "
    "the device plugin's time-slicing (a sharing config with timeSlicing.resources nvidia.com/gpu replicas > 1) on "
    "nodes with one GPU; see docs/packing.md")

Mode = Literal["dra", "time-slicing"]


class SharingSupport(BaseModel):
    """What the cluster offers for sharing one GPU between pods."""

    mode: Mode | None
    nodes: list[str] = Field(default_factory=list, description="time-slicing: single-GPU nodes that time-slice")
    message: str


def time_sliced_single_gpu(labels: Mapping[str, str]) -> bool:
    """A node whose one physical GPU the device plugin time-slices (GFD labels)."""
    product = str(labels.get(PRODUCT_LABEL, ""))
    try:
        replicas = int(str(labels.get(REPLICAS_LABEL, "1")))
        count = int(str(labels.get(COUNT_LABEL, "0")))
    except ValueError:
        return False
    shared = labels.get(STRATEGY_LABEL) == "time-slicing" or product.endswith(SHARED_SUFFIX)
    return shared and replicas > 1 and count == 1


def sharing_support(*, dra_served: bool, device_classes: Sequence[str],
                    nodes: Sequence[tuple[str, Mapping[str, str]]], product: str | None = None) -> SharingSupport:
    """Which way this cluster can share a GPU: DRA when resource.k8s.io/v1 is served and the device class exists,
    else time-slicing on single-GPU nodes (of `product`, when given: with or without its '-SHARED' suffix), else
    None with what to install."""
    if dra_served and DRA_DEVICE_CLASS in device_classes:
        return SharingSupport(mode="dra", message=f"DRA: one ResourceClaim of device class {DRA_DEVICE_CLASS} per "
                                                  "shared GPU, time-sliced by NVIDIA's DRA driver")
    base = product.removesuffix(SHARED_SUFFIX) if product else None
    sliced = sorted(name for name, labels in nodes if time_sliced_single_gpu(labels) and (
        base is None or str(labels.get(PRODUCT_LABEL, "")).removesuffix(SHARED_SUFFIX) == base))
    if sliced:
        return SharingSupport(
            mode="time-slicing", nodes=sliced,
            message="time-slicing (NVIDIA device plugin): the members of one shared GPU are placed on the same "
                    "single-GPU node; memory is NOT isolated — a member that grows beyond its budget takes its "
                    "neighbours' memory")
    why = "resource.k8s.io/v1 is not served" if not dra_served else f"no DeviceClass {DRA_DEVICE_CLASS}"
    return SharingSupport(mode=None, message=f"no way to share a GPU: {why}, and no single-GPU node time-slices "
                                             f"(label {REPLICAS_LABEL} > 1); {INSTALL_HINT}")


def claim_name(group: str, gpu_index: int) -> str:
    """The ResourceClaim of one shared GPU of a group (namespaced, like the group)."""
    return dns1123_subdomain(f"vllm-share-{group}-gpu{gpu_index}")


def build_resource_claim(*, group: str, gpu_index: int, namespace: str,
                         owners: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One `resource.k8s.io/v1` ResourceClaim for one shared GPU: exactly one device of class gpu.nvidia.com,
    time-sliced by the driver, owned by the members placed on it (garbage-collected when the last one goes)."""
    owner_refs = [{**dict(o), "blockOwnerDeletion": False, "controller": False} for o in owners]
    return {
        "apiVersion": DRA_API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {
            "name": claim_name(group, gpu_index),
            "namespace": namespace,
            "labels": {**MANAGED_BY, GROUP_LABEL: label_value(group), GPU_INDEX_LABEL: str(gpu_index)},
            "annotations": {},
            "ownerReferences": owner_refs,
        },
        "spec": {
            "devices": {
                "requests": [{"name": CLAIM_REQUEST, "exactly": {
                    "deviceClassName": DRA_DEVICE_CLASS, "allocationMode": "ExactCount", "count": 1}}],
                "config": [{"requests": [CLAIM_REQUEST], "opaque": {
                    "driver": DRA_DEVICE_CLASS,
                    "parameters": {"apiVersion": DRA_CONFIG_API_VERSION, "kind": "GpuConfig",
                                   "sharing": {"strategy": "TimeSlicing",
                                               "timeSlicingConfig": {"interval": "Default"}}}}}],
            },
        },
    }


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def _label(workload: dict[str, Any], group: str, gpu_index: int) -> None:
    for meta in (workload["metadata"], workload["spec"]["template"]["metadata"]):
        meta.setdefault("labels", {}).update({GROUP_LABEL: label_value(group), GPU_INDEX_LABEL: str(gpu_index)})


def _vllm_container(pod: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod["containers"]
    return next(c for c in containers if c.get("name") == "vllm")


def _no_surge(workload: dict[str, Any]) -> None:
    """A new pod beside the old one would find the old one's memory held and fail vLLM's startup check: roll by
    replacing."""
    if workload.get("kind") == "Deployment":
        workload["spec"]["strategy"] = {"type": "RollingUpdate",
                                        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def with_claim(deployment: Mapping[str, Any], *, group: str, gpu_index: int) -> dict[str, Any]:
    """`deployment` (build_deployment's) with its GPU from the shared ResourceClaim instead of `nvidia.com/gpu`."""
    out = copy.deepcopy(dict(deployment))
    pod = _pod_spec(out)
    container = _vllm_container(pod)
    for part in ("requests", "limits"):
        container.get("resources", {}).get(part, {}).pop("nvidia.com/gpu", None)
    container.setdefault("resources", {})["claims"] = [{"name": POD_CLAIM_NAME}]
    pod["resourceClaims"] = [{"name": POD_CLAIM_NAME, "resourceClaimName": claim_name(group, gpu_index)}]
    _label(out, group, gpu_index)
    _no_surge(out)
    return out


def on_time_sliced_node(deployment: Mapping[str, Any], *, group: str, gpu_index: int, node: str) -> dict[str, Any]:
    """`deployment` pinned to the time-sliced single-GPU node that holds its shared GPU (one `nvidia.com/gpu`
    replica each)."""
    out = copy.deepcopy(dict(deployment))
    pod = _pod_spec(out)
    container = _vllm_container(pod)
    for part in ("requests", "limits"):
        if "nvidia.com/gpu" in container.get("resources", {}).get(part, {}):
            container["resources"][part]["nvidia.com/gpu"] = "1"
    selector = dict(pod.get("nodeSelector") or {})
    selector.pop(PRODUCT_LABEL, None)  # the node's product reads '…-SHARED'; the node name decides
    selector[HOSTNAME_LABEL] = node
    pod["nodeSelector"] = selector
    _label(out, group, gpu_index)
    _no_surge(out)
    return out


def time_slicing_nodes(gpu_count: int, nodes: Sequence[str], taken: Mapping[int, str]) -> dict[int, str] | None:
    """A node per shared GPU: the ones recorded before (`taken`) when still offered, then the others in name order;
    None when the pool has fewer single-GPU time-sliced nodes than the group has GPUs."""
    out = {i: n for i, n in taken.items() if n in nodes and 0 <= i < gpu_count}
    free = [n for n in nodes if n not in out.values()]
    for index in range(gpu_count):
        if index not in out:
            if not free:
                return None
            out[index] = free.pop(0)
    return out
