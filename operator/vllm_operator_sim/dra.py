"""Dynamic Resource Allocation in the simulated cluster (issue 26): the `resource.k8s.io/v1` kinds the operator uses
(ResourceClaim, DeviceClass) served through slim definitions, and the device class NVIDIA's DRA driver installs.

Kubernetes serves these kinds natively from 1.34; the emulator serves what it is given definitions for, so a
simulated cluster "with the DRA driver" registers them (and `gpu.nvidia.com`) at start. The kubelet allocates one GPU
per claim and runs every pod of a claim on it (`kubelet.py`, `shared_gpu.py`).
"""

from __future__ import annotations

from typing import Any

GROUP = "resource.k8s.io"
DEVICE_CLASS = "gpu.nvidia.com"

_KEEP = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _crd(plural: str, kind: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {"group": GROUP, "scope": scope,
                 "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "metadata": {"type": "object"}, "spec": _KEEP, "status": _KEEP}}}}]}}


def slim_crds() -> list[dict[str, Any]]:
    """Definitions that make the emulator serve resourceclaims (namespaced) and deviceclasses (cluster)."""
    return [_crd("resourceclaims", "ResourceClaim", "Namespaced"), _crd("deviceclasses", "DeviceClass", "Cluster")]


def nvidia_device_class() -> dict[str, Any]:
    """The DeviceClass NVIDIA's DRA driver for GPUs creates."""
    return {"apiVersion": f"{GROUP}/v1", "kind": "DeviceClass", "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                          "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}
