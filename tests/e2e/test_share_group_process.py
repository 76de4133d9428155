"""A share group end to end (issue 26): the real `vllm-operator run` process, the simulated cluster with NVIDIA's
DRA driver, and three small models that share one GPU: one ResourceClaim, every pod on it, each start seeing what
the others hold (the simulator's shared GPU), and status.gpu.share recorded on each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_operator.api.v1alpha1 import GROUP, PLURAL, VERSION
from vllm_operator_sim.cluster import SimulatedCluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TIMEOUT = 150.0
MODELS = {"chat": "Qwen/Qwen2.5-0.5B-Instruct", "router": "Qwen/Qwen2.5-1.5B-Instruct",
          "summarize": "meta-llama/Llama-3.2-1B-Instruct"}


def _service(name: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLLMService", "metadata": {"name": name, "namespace": "default"},
            "spec": {"model": {"name": MODELS[name]}, "gpu": {"product": "NVIDIA-L40S", "share": {"group": "small"}}}}


def _all_ready(cluster: SimulatedCluster) -> list[dict[str, Any]] | None:
    """Every member Ready on its share: three Ready pods, each on the claim (a member reconciled before the others
    existed first ran alone, as a service alone in its group does)."""
    services = [cluster.api.get_object(PLURAL, n, "default") or {} for n in MODELS]
    ready = all(any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (s.get("status") or {}).get("conditions") or []) for s in services)
    pods = cluster.api.list_objects("pods", "default")
    shared = len(pods) == 3 and all(p["spec"].get("resourceClaims") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or [])
        for p in pods)
    return services if ready and shared and all((s["status"].get("gpu") or {}).get("share") for s in services) \
        else None


def test_three_models_share_one_gpu_through_one_claim(tmp_path: Path) -> None:
    with SimulatedCluster(pools=[("L40S", 1, 2)], workdir=tmp_path / "sim", default_storage_class=None,
                          dra=True) as cluster:
        cluster.start_operator()
        for name in MODELS:
            cluster.apply(_service(name))
        services = cluster.wait_for(lambda: _all_ready(cluster), TIMEOUT, "all three members Ready")
        claims = cluster.api.list_objects("resourceclaims", "default")
        assert [c["metadata"]["name"] for c in claims] == ["vllm-share-small-gpu0"]
        record = cluster.api.get_object("configmaps", "vllm-share-small", "default")
        placement = json.loads(record["data"]["plan.json"])["placement"]
        assert placement == {n: 0 for n in MODELS}
        pods = [p for p in cluster.api.list_objects("pods", "default")]
        assert len(pods) == 3 and len({p["spec"]["nodeName"] for p in pods}) == 1
        assert all(p["spec"]["resourceClaims"][0]["resourceClaimName"] == "vllm-share-small-gpu0" for p in pods)
        total = 0.0
        for service in services:
            share = service["status"]["gpu"]["share"]
            assert share["group"] == "small" and share["gpuIndex"] == 0 and share["mode"] == "dra"
            assert {m["name"] for m in share["members"]} == set(MODELS)
            total = sum(m["footprintGiB"] for m in share["members"])
        assert total < share["gpuTotalGiB"]
        for name in MODELS:
            assert cluster.kubelet.stats(name).failed_starts == 0, name
        assert cluster.kubelet.errors == []


def test_without_dra_time_sliced_members_share_one_node_and_are_told_memory_is_not_isolated(tmp_path: Path) -> None:
    with SimulatedCluster(pools=[("L40S", 1, 1)], workdir=tmp_path / "sim", default_storage_class=None) as cluster:
        node = cluster.nodes[0]
        # the device plugin's time-slicing, as GPU Feature Discovery labels it: one GPU, 4 replicas
        cluster.api.patch_object("nodes", node, {
            "metadata": {"labels": {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing",
                                    "nvidia.com/gpu.product": "NVIDIA-L40S-SHARED"}}})
        cluster.api.patch_object("nodes", node, {"status": {"allocatable": {"nvidia.com/gpu": "4"},
                                                            "capacity": {"nvidia.com/gpu": "4"}}}, subresource="status")
        cluster.start_operator()
        for name in MODELS:
            cluster.apply(_service(name))

        def settled() -> list[dict[str, Any]] | None:
            services = [cluster.api.get_object(PLURAL, n, "default") or {} for n in MODELS]
            pods = cluster.api.list_objects("pods", "default")
            ready = all(any(c.get("type") == "Ready" and c.get("status") == "True"
                            for c in (p.get("status") or {}).get("conditions") or []) for p in pods)
            shared = all(((s.get("status") or {}).get("gpu") or {}).get("share") for s in services)
            pinned = all(p["spec"].get("nodeSelector", {}).get("kubernetes.io/hostname") == node for p in pods)
            return services if len(pods) == 3 and ready and shared and pinned else None

        services = cluster.wait_for(settled, TIMEOUT, "three members Ready on the time-sliced node")
        for service in services:
            shared = next(c for c in service["status"]["conditions"] if c["type"] == "GPUShared")
            assert shared["reason"] == "MemoryNotIsolated" and "isolates no memory" in shared["message"]
            assert service["status"]["gpu"]["share"]["node"] == node
        assert cluster.api.list_objects("configmaps", "default")
        for name in MODELS:
            assert cluster.kubelet.stats(name).failed_starts == 0, name
