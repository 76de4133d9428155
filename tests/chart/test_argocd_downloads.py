"""The documented Argo CD health check on the model-download statuses the real operator writes (the `vllm-operator
run` process in the simulated cluster): `Downloading` is Progressing, `ModelDownloadFailed` is Degraded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllm_operator_sim.cluster import NodePool, SimulatedCluster

pytestmark = pytest.mark.e2e

GATED = "Qwen/Qwen2.5-0.5B-Instruct"   # gated for this test's simulated hub
OPEN = "Qwen/Qwen2.5-1.5B-Instruct"


def _service(name: str, model: str) -> dict[str, Any]:
    return {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"model": {"name": model}}}


def test_argocd_health_of_the_download_statuses_the_operator_writes(argocd_health: Any, tmp_path: Path) -> None:
    with SimulatedCluster([NodePool("L4", 2, 1)], speed=100, workdir=tmp_path) as cluster:
        cluster.kubelet.gated_models = frozenset({GATED})
        cluster.kubelet.download_mib_per_s = 2.0  # the open model's download outlasts the test's look at it
        cluster.start_operator()
        cluster.apply(_service("gated", GATED))
        cluster.apply(_service("slow", OPEN))
        snapshots: dict[str, dict[str, Any]] = {}

        def seen(name: str, state: str) -> bool:
            obj = cluster.api.get_object("vllmservices", name, "default") or {}
            if (obj.get("status") or {}).get("state") == state:
                snapshots[state] = obj
            return state in snapshots

        cluster.wait_for(lambda: seen("slow", "Downloading"), timeout=60,
                         message="Downloading never written:\n" + cluster.operator_log()[-3000:])
        cluster.wait_for(lambda: seen("gated", "ModelDownloadFailed"), timeout=60,
                         message="ModelDownloadFailed never written:\n" + cluster.operator_log()[-3000:])
        health = {state: argocd_health(obj) for state, obj in snapshots.items()}
        assert health["Downloading"]["status"] == "Progressing"
        assert "downloading the model into the cache: pod slow-" in health["Downloading"]["message"]
        assert health["ModelDownloadFailed"]["status"] == "Degraded"
        assert health["ModelDownloadFailed"]["message"].startswith("ModelDownloadFailed: the model download fails: ")
