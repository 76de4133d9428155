"""Autoscaling end to end: the real `vllm-operator run` process, the simulated cluster, and an HPA-like writer.

The writer is the real kubectl: `kubectl scale vllm NAME --replicas=N` writes spec.replicas through the
VLLMService's scale subresource, exactly as the HorizontalPodAutoscaler and KEDA controllers do. The operator must
follow (the Deployment gets N replicas and the simulated kubelet brings N pods up) and never write a scale itself:
every write to a scale subresource in the API's access log is the writer's, and spec.replicas (and so
metadata.generation) changes only when the writer writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kit.kubectl import Kubectl
from vllm_operator.api.v1alpha1 import GROUP, PLURAL, VERSION
from vllm_operator_sim.cluster import SimulatedCluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

NAME = "chat"
TIMEOUT = 90.0  # real seconds; the simulated kubelet runs 20x faster


def _scale_writes(cluster: SimulatedCluster) -> list[tuple[str, str]]:
    """Every write to any scale subresource so far: (verb, resource)."""
    with cluster.api._state_lock:
        return [(r.verb, r.resource) for r in cluster.api.access_log
                if r.subresource == "scale" and r.verb in ("create", "update", "patch")]


def _deployment(cluster: SimulatedCluster) -> dict[str, Any]:
    return cluster.api.get_object("deployments", NAME, "default") or {}


def _serving(cluster: SimulatedCluster, replicas: int) -> dict[str, Any] | None:
    """The Deployment once it asks for `replicas` pods and that many are ready."""
    deployment = _deployment(cluster)
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    done = spec.get("replicas") == replicas and status.get("readyReplicas", 0) == replicas == status.get("replicas")
    return deployment if done else None


def test_an_hpa_like_writer_scales_the_service_and_the_operator_follows(tmp_path: Path) -> None:
    with SimulatedCluster(pools=[("L4", 1, 4)], workdir=tmp_path / "sim", default_storage_class=None) as cluster:
        cluster.start_operator()
        kubectl = Kubectl(cluster.kubeconfig_path, tmp_path)
        cluster.apply({"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLLMService",
                       "metadata": {"name": NAME, "namespace": "default"},
                       "spec": {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "gpu": {"product": "NVIDIA-L4"},
                                "autoscaling": {"engine": "HPA", "minReplicas": 1, "maxReplicas": 4}}})
        hpa = cluster.wait_for(lambda: cluster.api.get_object("horizontalpodautoscalers", NAME, "default"),
                               TIMEOUT, "the HorizontalPodAutoscaler")
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLLMService",
                                                 "name": NAME}
        cluster.wait_for(lambda: _serving(cluster, 1), TIMEOUT, "one pod serving")
        generation = int(cluster.api.get_object(PLURAL, NAME, "default")["metadata"]["generation"])
        assert _scale_writes(cluster) == []

        for replicas, step in ((3, 1), (2, 2)):
            kubectl("scale", "vllm", NAME, f"--replicas={replicas}")  # PUT .../vllmservices/chat/scale
            cluster.wait_for(lambda r=replicas: _serving(cluster, r), TIMEOUT, f"{replicas} pods serving")
            scale = json.loads(kubectl("get", "--raw", f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}/{NAME}/scale"))
            assert scale["spec"]["replicas"] == replicas
            assert scale["status"]["selector"] == ("app.kubernetes.io/instance=chat,vllm-operator.dev/service=chat,"
                                                   "vllm-operator.dev/workload=deployment,"
                                                   "!leaderworkerset.sigs.k8s.io/name")  # the Deployment's pods
            service = cluster.api.get_object(PLURAL, NAME, "default")
            # spec.replicas is the writer's, and only the writer changed the spec
            assert service["spec"]["replicas"] == replicas
            assert int(service["metadata"]["generation"]) == generation + step
            writes = _scale_writes(cluster)
            assert len(writes) == step and {resource for _verb, resource in writes} == {PLURAL}, writes
        cluster.wait_for(lambda: (cluster.api.get_object(PLURAL, NAME, "default")["status"].get("readyReplicas")
                                  == 2) or None, TIMEOUT, "status.readyReplicas follows")
        # the operator never scaled the Deployment through its scale subresource either
        assert not any(resource == "deployments" for _verb, resource in _scale_writes(cluster))
