"""VLLMService documents and status readers shared by the handler, sim and unit tests."""

from __future__ import annotations

from typing import Any

#: Every affinity block as the Pod API writes it (kept as is by the API model, rendered unchanged into the pod).
FULL_AFFINITY: dict[str, Any] = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                                  {"key": "gpus", "operator": "Gt", "values": ["4"]},
                                  {"key": "spot", "operator": "DoesNotExist"}]},
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}}]},
    "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
        "labelSelector": {"matchLabels": {"app": "cache"}}, "namespaces": ["default"],
        "namespaceSelector": {}, "topologyKey": "topology.kubernetes.io/zone"}}]},
    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["llm"]}]},
        "topologyKey": "kubernetes.io/hostname", "matchLabelKeys": ["pod-template-hash"],
        "mismatchLabelKeys": ["tenant"]}]},
}


def vllmservice(spec: dict[str, Any], name: str = "chat", namespace: str = "default") -> dict[str, Any]:
    """A VLLMService document with `spec`."""
    return {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    """The status condition of `type_` ({} when absent)."""
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), {})
