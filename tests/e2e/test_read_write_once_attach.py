"""The real `vllm-operator run` process against a simulated cluster that attaches a ReadWriteOnce volume to one node
at a time (vllm_operator_sim/volumes.py), as Kubernetes does: a pod on another node than the one using the volume
stays ContainerCreating (Multi-Attach `FailedAttachVolume`) until that node lets go of it.

Two L4 nodes with one GPU each, so that two pods of a service, or a surge pod beside a serving one, are on different
nodes; the default StorageClass gives ReadWriteOnce (network block) claims, and there is no ReadWriteMany class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kit.specs import condition as _condition
from kit.specs import vllmservice as _service
from vllm_operator_sim.cluster import NodePool, SimulatedCluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def _pods(cluster: SimulatedCluster, name: str = "chat") -> list[dict[str, Any]]:
    return [p for p in cluster.api.list_objects("pods", "default", label_selector=f"vllm-operator.dev/service={name}")
            if not p["metadata"].get("deletionTimestamp")]


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _multi_attach(cluster: SimulatedCluster) -> list[str]:
    return [e["message"] for e in cluster.api.list_objects("events", "default")
            if e.get("reason") == "FailedAttachVolume"]


def test_a_one_pod_service_on_its_own_claim_rolls_onto_the_other_node(tmp_path: Path) -> None:
    """The default cache of a one-pod service is its own ReadWriteOnce claim and the Deployment rolls without a
    surge: an edit deletes the old pod first, the new one attaches the volume wherever it lands, and serves."""
    with SimulatedCluster([NodePool("L4", 1, 2)], speed=100, workdir=tmp_path) as cluster:
        cluster.start_operator()
        api = cluster.api
        cluster.apply(_service({"model": {"name": MODEL}, "gpu": {"product": "NVIDIA-L4"}}))
        cluster.wait_for(lambda: _condition(api.get_object("vllmservices", "chat", "default"), "Ready").get(
            "status") == "True", timeout=90, message="never served:\n" + cluster.operator_log()[-3000:])
        deployment = api.get_object("deployments", "chat", "default") or {}
        assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
        old = [p["metadata"]["name"] for p in _pods(cluster)]
        cluster.apply(_service({"model": {"name": MODEL}, "gpu": {"product": "NVIDIA-L4"},
                                "env": [{"name": "EDITED", "value": "1"}]}))
        cluster.wait_for(lambda: [p["metadata"]["name"] not in old and _ready(p) for p in _pods(cluster)] == [True],
                         timeout=120, message="the edit never rolled:\n" + cluster.operator_log()[-3000:])
        assert _multi_attach(cluster) == []
        assert cluster.errors == []


def test_a_sized_cache_of_a_two_replica_service_serves_both_replicas(tmp_path: Path) -> None:
    with SimulatedCluster([NodePool("L4", 1, 2)], speed=100, workdir=tmp_path) as cluster:
        cluster.start_operator()
        cluster.apply(_service({"model": {"name": MODEL}, "gpu": {"product": "NVIDIA-L4"}, "replicas": 2,
                                "modelCache": {"size": "40Gi"}}))
        cluster.wait_for(lambda: len(_pods(cluster)) == 2 and any(_ready(p) for p in _pods(cluster)), timeout=90,
                         message="never served:\n" + cluster.operator_log()[-3000:])
        cluster.wait_for(lambda: _multi_attach(cluster) or all(_ready(p) for p in _pods(cluster)), timeout=60)
        assert _multi_attach(cluster) == [], _multi_attach(cluster)
        assert all(_ready(p) for p in _pods(cluster))
        # a claim per pod of the size asked, none shared
        claims = {c["metadata"]["name"]: c for c in cluster.api.list_objects("persistentvolumeclaims", "default")}
        mounted = {v["persistentVolumeClaim"]["claimName"] for p in _pods(cluster) for v in p["spec"]["volumes"]
                   if "persistentVolumeClaim" in v}
        assert len(mounted) == 2 and all(claims[name]["spec"]["resources"]["requests"]["storage"] == "40Gi"
                                         for name in mounted)


def test_an_edit_of_a_service_on_a_read_write_once_claim_of_its_own_lands(tmp_path: Path) -> None:
    with SimulatedCluster([NodePool("L4", 1, 2)], speed=100, workdir=tmp_path) as cluster:
        cluster.start_operator()
        api = cluster.api
        api.create_object("persistentvolumeclaims", {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "weights", "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "40Gi"}}}}, "default")
        spec = {"model": {"name": MODEL}, "gpu": {"product": "NVIDIA-L4"}, "modelCache": {"claimName": "weights"}}
        cluster.apply(_service(spec))
        cluster.wait_for(lambda: [_ready(p) for p in _pods(cluster)] == [True], timeout=90,
                         message="never served:\n" + cluster.operator_log()[-3000:])
        # the operator read the claim: ReadWriteOnce, so the Deployment rolls without a surge pod
        deployment = api.get_object("deployments", "chat", "default") or {}
        assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
        old = [p["metadata"]["name"] for p in _pods(cluster)]
        cluster.apply(_service({**spec, "env": [{"name": "EDITED", "value": "1"}]}))
        cluster.wait_for(lambda: _multi_attach(cluster) or [
            p["metadata"]["name"] not in old and _ready(p) for p in _pods(cluster)] == [True], timeout=120,
            message="neither rolled nor stalled:\n" + cluster.operator_log()[-3000:])
        assert _multi_attach(cluster) == [], _multi_attach(cluster)
