"""A Gateway API Inference Extension `InferencePool` (`inference.networking.k8s.io/v1`) over one VLLMService's pods,
as Python data: the pool selects the pods by the service's selector labels and targets vLLM's port; a gateway
(an HTTPRoute whose backendRef is the pool) then asks the endpoint picker which pod gets each request (prefix-cache
and load aware). What to install: the Inference Extension CRDs, an endpoint picker and a gateway implementation
(README, "Routing with an InferencePool")."""

from __future__ import annotations

from typing import Any

from ..api.v1alpha1 import InferencePoolSpec


def build_inference_pool(*, child_name: str, namespace: str, labels: dict[str, str], owner: dict[str, Any],
                         selector: dict[str, str], port: int, spec: InferencePoolSpec) -> dict[str, Any]:
    pool_spec: dict[str, Any] = {
        "selector": {"matchLabels": dict(selector)},
        "targetPorts": [{"number": port}],
        "appProtocol": "http",
    }
    if spec.endpoint_picker is not None:
        pool_spec["endpointPickerRef"] = {"group": "", "kind": "Service", "name": spec.endpoint_picker.name,
                                          "port": {"number": spec.endpoint_picker.port},
                                          "failureMode": spec.endpoint_picker.failure_mode}
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": child_name, "namespace": namespace, "labels": dict(labels), "annotations": {},
                     "ownerReferences": [owner]},
        "spec": pool_spec,
    }
