"""An edit never takes a serving service down for a pod that cannot start (issue 25) — through the real
`vllm-operator run` process in the simulated cluster.

One L4 and one H100 node, one GPU each, a default StorageClass: the service's model cache is a ReadWriteOnce claim,
so its Deployment rolls without a surge pod (the new pod waits for the old to let go of the claim). Another service
holds the H100. Moving the service to the H100 pool would stop the serving pod for a pod that stays Pending: the
operator holds the rollout (the L4 pod keeps serving), says why, and proceeds once the H100 is free; that rollout
says beforehand that it interrupts service.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kit.specs import condition as _condition
from kit.specs import vllmservice as _service
from vllm_operator_sim.cluster import NodePool, SimulatedCluster

pytestmark = pytest.mark.e2e

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
L4, H100 = "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3"


def _selector(cluster: SimulatedCluster, name: str) -> str | None:
    deployment = cluster.api.get_object("deployments", name, "default") or {}
    spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    return (spec.get("nodeSelector") or {}).get("nvidia.com/gpu.product")


def _serving(cluster: SimulatedCluster, name: str) -> list[str]:
    """The names of the service's Ready pods."""
    pods = cluster.api.list_objects("pods", "default", label_selector=f"vllm-operator.dev/service={name}")
    return [p["metadata"]["name"] for p in pods if any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or [])]


def _events(cluster: SimulatedCluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.api.list_objects("events", "default")
            if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == "chat"]


def test_an_edit_onto_a_full_pool_is_held_while_the_old_profile_serves(tmp_path: Path) -> None:
    with SimulatedCluster([NodePool("L4", 1, 1), NodePool("H100-SXM-80GB", 1, 1)], speed=100,
                          workdir=tmp_path) as cluster:
        cluster.start_operator()
        api = cluster.api

        def service(name: str = "chat") -> dict[str, Any] | None:
            return api.get_object("vllmservices", name, "default")

        cluster.apply(_service({"model": {"name": MODEL}, "gpu": {"product": H100}}, name="other"))
        cluster.apply(_service({"model": {"name": MODEL}, "gpu": {"product": L4}}))
        for name in ("other", "chat"):
            cluster.wait_for(lambda n=name: _condition(service(n), "Ready").get("status") == "True", timeout=90,
                             message=f"{name} never served:\n" + cluster.operator_log()[-3000:])
        deployment = api.get_object("deployments", "chat", "default") or {}
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0  # a ReadWriteOnce cache claim
        serving = _serving(cluster, "chat")
        assert len(serving) == 1

        cluster.apply(_service({"model": {"name": MODEL}, "gpu": {"product": H100}}))  # onto the full pool
        cluster.wait_for(lambda: _condition(service(), "Progressing").get("reason") == "RolloutHeld", timeout=60,
                         message="the rollout was not held:\n" + cluster.operator_log()[-3000:])
        held = _condition(service(), "Progressing")
        assert held["status"] == "False" and "none has them free" in held["message"]
        assert _selector(cluster, "chat") == L4 and _serving(cluster, "chat") == serving  # the old pod serves on
        cluster.wait_for(lambda: _events(cluster, "RolloutHeld"), timeout=30, message="no RolloutHeld Event")

        api.delete_object("vllmservices", "other", "default")  # the H100 frees up
        cluster.wait_for(lambda: not [p for p in api.list_objects("pods", "default")
                                      if p["metadata"]["name"].startswith("other")], timeout=60,
                         message="the other service's pod never went")
        # the next reconcile (an edit here; the watchdog's round otherwise) finds the GPU and proceeds, saying so
        cluster.apply({**_service({"model": {"name": MODEL}, "gpu": {"product": H100}}),
                       "metadata": {"name": "chat", "namespace": "default", "annotations": {"team": "a"}}})
        cluster.wait_for(lambda: _selector(cluster, "chat") == H100, timeout=60,
                         message="the held rollout never proceeded:\n" + cluster.operator_log()[-3000:])
        announced = _events(cluster, "RolloutInterrupts")  # posted before the Deployment changed
        assert len(announced) == 1 and "unavailable" in announced[0]["message"]
        assert len(_events(cluster, "RolloutHeld")) == 1  # said once, not at every look
        cluster.wait_for(lambda: _condition(service(), "Ready").get("status") == "True" and _serving(
            cluster, "chat") and _serving(cluster, "chat") != serving, timeout=90,
            message="the new profile never served:\n" + cluster.operator_log()[-3000:])
