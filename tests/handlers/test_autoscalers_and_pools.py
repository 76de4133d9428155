"""Autoscalers and InferencePools against the emulated API server over real HTTP, with and without their CRDs.

An HPA-like writer (the test) changes spec.replicas through the VLLMService's scale subresource, as the HPA and
KEDA do; the operator renders the Deployment from it and never scales anything itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.inprocess import Cluster, condition, harness_fixture  # noqa: F401 (`harness`)
from vllm_operator.api.v1alpha1 import GROUP, PLURAL, VERSION

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
CRDS = Path(__file__).resolve().parents[1] / "data" / "crds"
KEDA = {"engine": "KEDA", "maxReplicas": 4, "prometheusAddress": "http://prometheus.monitoring:9090"}


def _get(h: Cluster, resource: str, name: str) -> dict[str, Any] | None:
    return h.server.get_object(resource, name, h.namespace)


def test_an_hpa_writes_spec_replicas_and_the_operator_follows(harness: Cluster) -> None:
    h = harness
    h.add_node("gpu-1", "NVIDIA-L4", count=4)
    h.create("chat", {"model": {"name": QWEN}, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}})
    hpa = h.wait_for(lambda: _get(h, "horizontalpodautoscalers", "chat"), message="the HPA")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLLMService",
                                             "name": "chat"}
    h.wait_condition("chat", "Autoscaling", "True", "HorizontalPodAutoscaler")
    assert h.wait_deployment("chat")["spec"]["replicas"] == 1

    # the autoscaler's write: PATCH .../vllmservices/chat/scale, as the HPA controller does
    h.custom.patch_namespaced_custom_object_scale(GROUP, VERSION, h.namespace, PLURAL, "chat",
                                                  {"spec": {"replicas": 3}})
    h.wait_deployment("chat", lambda d: d["spec"]["replicas"] == 3)
    scale = h.custom.get_namespaced_custom_object_scale(GROUP, VERSION, h.namespace, PLURAL, "chat")
    assert scale["spec"]["replicas"] == 3 and scale["status"]["selector"]
    # the operator wrote no scale anywhere: only the autoscaler (the test) did
    assert not h.accessed("patch", "deployments", "scale") and not h.accessed("update", "deployments", "scale")
    assert sum(1 for r in h.server.accessed() if r.resource == PLURAL and r.subresource == "scale"
               and r.verb in ("patch", "update")) == 1
    h.custom.patch_namespaced_custom_object_scale(GROUP, VERSION, h.namespace, PLURAL, "chat",
                                                  {"spec": {"replicas": 2}})
    h.wait_deployment("chat", lambda d: d["spec"]["replicas"] == 2)

    # the spec drops the autoscaler: the HPA goes, the condition says so
    h.patch_spec("chat", {"autoscaling": None})
    h.wait_for(lambda: _get(h, "horizontalpodautoscalers", "chat") is None or None, message="the HPA deleted")
    h.wait_condition("chat", "Autoscaling", "False", "NotConfigured")


def test_keda_and_inference_pool_without_their_crds_are_conditions(harness: Cluster) -> None:
    h = harness
    h.add_node("gpu-1", "NVIDIA-L4")
    h.create("scaled", {"model": {"name": QWEN}, "autoscaling": KEDA,
                        "routing": {"inferencePool": {"enabled": True}}})
    h.wait_deployment("scaled")  # the service is served anyway
    obj = h.wait_condition("scaled", "Autoscaling", "False", "CRDNotInstalled")
    assert "KEDA" in (condition(obj, "Autoscaling") or {})["message"]
    h.wait_condition("scaled", "InferencePool", "False", "CRDNotInstalled")
    h.wait_condition("scaled", "PlanFeasible", "True")


@pytest.fixture
def with_crds(tmp_path: Path) -> Iterator[Cluster]:
    """The emulator with KEDA's and the Inference Extension's CRDs installed before the operator starts."""
    env = Cluster(tmp_path)
    try:
        for file in ("keda.sh_scaledobjects.yaml", "inference.networking.k8s.io_inferencepools.yaml"):
            env.server.create_object("customresourcedefinitions", yaml.safe_load((CRDS / file).read_text()))
        env.start_operator()
        yield env
    finally:
        env.close()


def test_keda_scaled_object_and_inference_pool_with_their_crds(with_crds: Cluster) -> None:
    h = with_crds
    h.add_node("gpu-1", "NVIDIA-L4", count=2)
    h.create("pool", {"model": {"name": QWEN}, "autoscaling": KEDA,
                      "routing": {"inferencePool": {"enabled": True, "endpointPicker": {"name": "pool-epp"}}}})
    # both written over HTTP: the emulator admitted them against the upstream CRD schemas
    scaled = h.wait_for(lambda: _get(h, "scaledobjects", "pool"), message="the ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["kind"] == "VLLMService"
    assert [t["type"] for t in scaled["spec"]["triggers"]] == ["prometheus"]
    pool = h.wait_for(lambda: _get(h, "inferencepools", "pool"), message="the InferencePool")
    deployment = h.wait_deployment("pool")
    assert pool["spec"]["selector"]["matchLabels"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    h.wait_condition("pool", "Autoscaling", "True", "ScaledObject")
    h.wait_condition("pool", "InferencePool", "True", "InferencePoolRendered")
    # KEDA -> HPA: the ScaledObject goes, an HPA comes
    h.patch_spec("pool", {"autoscaling": {"engine": "HPA", "prometheusAddress": None}})
    h.wait_for(lambda: _get(h, "horizontalpodautoscalers", "pool"), message="the HPA")
    h.wait_for(lambda: _get(h, "scaledobjects", "pool") is None or None, message="the ScaledObject deleted")
