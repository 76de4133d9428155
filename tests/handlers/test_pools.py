"""Pool choice, options from the cluster's pools and digest images with spec.vllmVersion, through the real kopf
handlers against the emulated API server over HTTP (kit.inprocess.Cluster)."""

from __future__ import annotations

from kit.inprocess import Cluster, container, flag_value, harness_fixture  # noqa: F401 (`harness`)
from vllm_operator.planner.versions import NEWEST_KNOWN_VERSION

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA3_70B = "meta-llama/Meta-Llama-3-70B-Instruct"
DIGEST = "vllm/vllm-openai@sha256:" + "0123456789abcdef" * 4


def test_mixed_cluster_picks_the_smallest_usable_pool_and_states_the_alternatives(harness: Cluster) -> None:
    h = harness
    h.add_node("h100-1", "NVIDIA-H100-80GB-HBM3", 8)
    h.add_node("l4-1", "NVIDIA-L4", 1)
    h.create("llama", {"model": {"name": LLAMA_8B}})
    deployment = h.wait_deployment("llama")
    assert deployment["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
    obj = h.wait_condition("llama", "PlanFeasible", "True", "PlanFits")
    source = obj["status"]["gpu"]["source"]
    assert "chose 1× L4" in source and "8× H100-SXM-80GB: usable" in source


def test_options_come_from_the_cluster_pools(harness: Cluster) -> None:
    h = harness
    h.add_node("gaming-1", "NVIDIA-GeForce-RTX-4090", 1)
    h.add_node("h100-1", "NVIDIA-H100-80GB-HBM3", 8)
    h.create("big", {"model": {"name": LLAMA3_70B}, "gpu": {"product": "RTX-4090"}})
    obj = h.wait_condition("big", "PlanFeasible", "False", "PlanInfeasible")
    options = obj["status"]["plan"]["options"]
    assert options and all(o["source"] == "cluster" for o in options)
    assert {o["gpuProduct"] for o in options} <= {"RTX-4090", "H100-SXM-80GB"}
    assert any(o["kind"] == "pool" and o["gpuProduct"] == "H100-SXM-80GB" for o in options)
    assert h.deployment("big") is None


def test_digest_image_with_spec_vllm_version(harness: Cluster) -> None:
    h = harness
    h.add_node("l4-1", "NVIDIA-L4", 1)
    h.create("pinned", {"model": {"name": LLAMA_8B}, "image": DIGEST, "vllmVersion": "0.10.1"})
    deployment = h.wait_deployment("pinned")
    obj = h.wait_condition("pinned", "PlanFeasible", "True", "PlanFits")
    assert obj["status"]["plan"]["vllmVersion"] == "0.10.1"
    vllm = container(deployment)
    assert vllm["image"] == DIGEST
    assert flag_value(vllm["args"], "--max-model-len") == str(obj["status"]["plan"]["flags"]["maxModelLen"])


def test_digest_image_without_a_version_is_planned_for_the_newest_and_says_so(harness: Cluster) -> None:
    h = harness
    h.add_node("l4-1", "NVIDIA-L4", 1)
    h.create("digest", {"model": {"name": LLAMA_8B}, "image": DIGEST})
    h.wait_deployment("digest")
    obj = h.wait_condition("digest", "PlanFeasible", "True", "VersionAssumed")
    feasible = next(c for c in obj["status"]["conditions"] if c["type"] == "PlanFeasible")
    assert f"vLLM {NEWEST_KNOWN_VERSION} assumed" in feasible["message"] and "spec.vllmVersion" in feasible["message"]
    assert obj["status"]["plan"]["vllmVersion"] == NEWEST_KNOWN_VERSION
