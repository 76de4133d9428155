"""An operator upgrade that labels a Deployment's pods anew (`vllm-operator.dev/workload: deployment`, the label only a
Deployment's pods carry, render/pods.py) rolls every Deployment out once — not in a loop — and without an outage:
the Service keeps the selector the running pods match until the Deployment is Ready with the new template, then
moves to it."""

from __future__ import annotations

from typing import Any

from kit.inprocess import Cluster, harness_fixture  # noqa: F401 (`harness`)
from vllm_operator.render.pods import WORKLOAD_LABEL

QWEN = "Qwen/Qwen2.5-7B-Instruct"
HASH = "vllm-operator.dev/spec-hash"


def _ready_deployment(h: Cluster, name: str) -> None:
    """Play the Deployment controller: every replica of the current generation ready."""
    d = h.server.get_object("deployments", name, "default")
    n = d["spec"].get("replicas", 1)
    h.server.patch_status("deployments", name, {"observedGeneration": d["metadata"]["generation"], "replicas": n,
                                                "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n},
                          "default")


def _deployment_writes(h: Cluster) -> int:
    return sum(1 for r in h.writes() if r.resource == "deployments" and r.subresource is None)


def _as_the_previous_release_rendered(h: Cluster, name: str) -> dict[str, Any]:
    """The Deployment and Service as an operator without the workload label left them (pods serving)."""
    deployment = h.server.get_object("deployments", name, "default")
    labels = dict(deployment["spec"]["template"]["metadata"]["labels"])
    labels.pop(WORKLOAD_LABEL)
    h.server.patch_object("deployments", name, {
        "metadata": {"annotations": {HASH: "previous-release"}},
        "spec": {"template": {"metadata": {"labels": {WORKLOAD_LABEL: None}}}}}, "default")
    _ready_deployment(h, name)
    service = h.k8s_service(name)
    assert service is not None
    old_selector = {k: v for k, v in service["spec"]["selector"].items() if k != WORKLOAD_LABEL}
    h.server.patch_object("services", name, {"metadata": {"annotations": {HASH: "previous-release"}},
                                             "spec": {"selector": {WORKLOAD_LABEL: None}}}, "default")
    assert h.k8s_service(name)["spec"]["selector"] == old_selector  # type: ignore[index]
    return old_selector


def test_the_upgrade_rolls_out_once_and_the_service_follows_the_ready_pods(harness: Cluster) -> None:
    h = harness
    h.add_gpu_node("gpu-1", "NVIDIA-L4", count=1)
    h.create("qwen", {"model": {"name": QWEN}})
    h.wait_for(lambda: h.deployment("qwen"), message="the Deployment")
    h.wait_settled("qwen")
    h.stop_operator()
    old_selector = _as_the_previous_release_rendered(h, "qwen")

    h.clear_access_log()
    h.start_operator()  # the upgraded operator resumes the service
    h.wait_for(lambda: WORKLOAD_LABEL in h.deployment("qwen")["spec"]["template"]["metadata"]["labels"] or None,
               message="the Deployment's template labelled")
    h.wait_quiet(0.5)
    # rolling out: the old pods (without the label) still serve through the old selector
    assert h.k8s_service("qwen")["spec"]["selector"] == old_selector  # type: ignore[index]

    _ready_deployment(h, "qwen")  # the new pods serve
    new_selector = {**old_selector, WORKLOAD_LABEL: "deployment"}
    h.wait_for(lambda: h.k8s_service("qwen")["spec"]["selector"] == new_selector or None,  # type: ignore[index]
               message="the Service on the labelled pods")
    h.wait_settled("qwen")
    assert _deployment_writes(h) == 1

    h.stop_operator()  # and once more: nothing left to roll out
    h.start_operator()
    h.wait_quiet(1.0)
    h.wait_settled("qwen")
    assert _deployment_writes(h) == 1
