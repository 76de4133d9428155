"""Status tells what is true after the fact (issue 21), against the emulated API server over HTTP:

* an edit whose plan does not fit leaves the previous Deployment serving — and the status says so;
* optional CRDs (KEDA, the Inference Extension) installed after the operator started are picked up by the next
  watchdog round, with no edit of the service.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.inprocess import Cluster, condition
from vllm_operator.handlers import watchdog

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
LLAMA_405B = "meta-llama/Llama-3.1-405B-Instruct"  # on one L4: no plan fits
CRDS = Path(__file__).resolve().parents[1] / "data" / "crds"
KEDA = {"engine": "KEDA", "maxReplicas": 4, "prometheusAddress": "http://prometheus.monitoring:9090"}


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Cluster]:
    """One L4 node and an operator whose watchdog goes round every second."""
    monkeypatch.setattr(watchdog, "WATCHDOG_INITIAL_DELAY", 0.0)
    monkeypatch.setattr(watchdog, "WATCHDOG_MIN_AGE", 0.0)
    monkeypatch.setattr(watchdog, "WATCHDOG_INTERVAL", 1.0)
    monkeypatch.setattr(watchdog, "PEERING_RECHECK", 0.0)
    env = Cluster(tmp_path)
    env.add_node("gpu-1", "NVIDIA-L4")
    try:
        yield env
    finally:
        env.close()


def test_an_infeasible_edit_says_the_previous_deployment_still_serves(cluster: Cluster) -> None:
    cluster.start_operator()
    cluster.create("chat", {"model": {"name": QWEN}})
    deployment = cluster.wait_deployment("chat")
    cluster.wait_condition("chat", "PlanFeasible", "True")
    # the Deployment controller's part: its pod serves
    cluster.api_state.patch_status("deployments", "chat", {"replicas": 1, "readyReplicas": 1,
                                                           "availableReplicas": 1}, "default")

    cluster.patch_spec("chat", {"model": {"name": LLAMA_405B}})
    obj = cluster.wait_condition("chat", "PlanFeasible", "False", "PlanInfeasible")

    def said() -> dict[str, Any] | None:
        found = cluster.service("chat")
        progressing = condition(found, "Progressing") or {}
        return found if "previous Deployment chat still serves" in progressing.get("message", "") else None
    obj = cluster.wait_for(said, message="the previous Deployment's service said")
    ready = condition(obj, "Ready") or {}
    assert ready["status"] == "False" and "still serves (1 pod ready)" in ready["message"]
    assert "no Deployment" not in str(obj["status"]["conditions"])
    assert obj["status"]["readyReplicas"] == 1
    kept = cluster.deployment("chat")
    assert kept is not None and kept["spec"]["template"] == deployment["spec"]["template"]  # not deleted, not changed


def test_optional_crds_installed_later_are_picked_up_within_one_watchdog_round(cluster: Cluster) -> None:
    cluster.start_operator()
    cluster.create("scaled", {"model": {"name": QWEN}, "autoscaling": KEDA,
                              "routing": {"inferencePool": {"enabled": True}}})
    cluster.wait_deployment("scaled")
    cluster.wait_condition("scaled", "Autoscaling", "False", "CRDNotInstalled")
    cluster.wait_condition("scaled", "InferencePool", "False", "CRDNotInstalled")

    for file in ("keda.sh_scaledobjects.yaml", "inference.networking.k8s.io_inferencepools.yaml"):
        cluster.server.create_object("customresourcedefinitions", yaml.safe_load((CRDS / file).read_text()))
    # no edit of the service; the operator's discovery answer is remembered for a minute, a round takes a second
    scaled = cluster.wait_for(lambda: cluster.server.get_object("scaledobjects", "scaled", "default"), timeout=20,
                              message="the ScaledObject, from the watchdog's next round")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "scaled"
    cluster.wait_for(lambda: cluster.server.get_object("inferencepools", "scaled", "default"), timeout=20,
                     message="the InferencePool")
    cluster.wait_condition("scaled", "Autoscaling", "True", "ScaledObject", timeout=20)
    cluster.wait_condition("scaled", "InferencePool", "True", "InferencePoolRendered", timeout=20)
