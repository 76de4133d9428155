"""The simulated kubelet, scheduler and Deployment controller, on a manual clock (no threads, no sleeps)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from simkit import SimHarness, deployment

from vllm_operator.planner.failures import FailureKind
from vllm_operator.remediation.classifier import classify
from vllm_operator.remediation.evidence import evidence_from_pod
from vllm_operator_sim.kubelet import backoff_delay
from vllm_operator_sim.startup import HiddenFacts

LLAMA3_8B = "meta-llama/Meta-Llama-3-8B-Instruct"
FLAGS = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 13}


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def one_pod(sim: SimHarness, service: str) -> dict[str, Any]:
    pods = sim.pods(service)
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def test_a_deployment_becomes_a_ready_pod_through_every_phase(sim: SimHarness) -> None:
    sim.api.create_object("deployments", deployment("chat", LLAMA3_8B, FLAGS))
    sim.kubelet.tick()
    rs = sim.api.list_objects("replicasets", "default")
    assert len(rs) == 1 and rs[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    pod = one_pod(sim, "chat")
    assert pod["metadata"]["ownerReferences"][0]["name"] == rs[0]["metadata"]["name"]
    assert pod["metadata"]["labels"]["pod-template-hash"] in rs[0]["metadata"]["name"]
    # scheduled at once, then the image pull
    assert pod["spec"]["nodeName"] == "gpu-l4-0"
    assert pod["status"]["phase"] == "Pending"
    assert sim.container(pod)["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert condition(pod, "PodScheduled")["status"] == "True"
    # Running but not ready while vLLM loads; the log grows as simulated time passes
    sim.run_until(lambda: one_pod(sim, "chat")["status"]["phase"] == "Running")
    pod = one_pod(sim, "chat")
    assert sim.container(pod)["ready"] is False and "running" in sim.container(pod)["state"]
    assert condition(pod, "Ready")["status"] == "False"
    early = sim.log(pod["metadata"]["name"])
    ready_at = sim.run_until(lambda: sim.container(one_pod(sim, "chat")).get("ready"))
    pod = one_pod(sim, "chat")
    assert condition(pod, "Ready")["status"] == "True" and condition(pod, "ContainersReady")["status"] == "True"
    full = sim.log(pod["metadata"]["name"])
    assert len(full) > len(early) and "GPU KV cache size:" in full and "GPU KV cache size:" not in early
    sim.kubelet.tick()
    status = sim.api.get_object("deployments", "chat")["status"]
    assert status["observedGeneration"] == 1
    assert (status["replicas"], status["updatedReplicas"], status["readyReplicas"], status["availableReplicas"]) \
        == (1, 1, 1, 1)
    assert condition({"status": status}, "Available")["status"] == "True"
    stats = sim.kubelet.stats("chat")
    assert stats.failed_starts == 0 and stats.ready_at == ready_at
    assert 60 < ready_at < 120  # 30 s image pull + vLLM's startup, in simulated seconds


def test_a_failing_start_crash_loops_with_growing_back_off(sim: SimHarness) -> None:
    sim.hidden["chat"] = HiddenFacts(other_process_gib=6.0)
    sim.api.create_object("deployments", deployment("chat", LLAMA3_8B, FLAGS))
    sim.run_until(lambda: "terminated" in sim.container(one_pod(sim, "chat")).get("state", {}))
    pod = one_pod(sim, "chat")
    terminated = sim.container(pod)["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("Error", 1)
    assert "Free memory on device cuda:0 (15.33/21.84 GiB) on startup is less than desired" in terminated["message"]
    assert terminated["startedAt"] < terminated["finishedAt"]
    starts: list[float] = []
    for restarts in (1, 2, 3, 4):
        sim.run_until(lambda: sim.container(one_pod(sim, "chat")).get("state", {}).get("waiting", {}).get("reason")
                      == "CrashLoopBackOff")
        container = sim.container(one_pod(sim, "chat"))
        assert container["lastState"]["terminated"]["exitCode"] == 1
        assert container["restartCount"] == restarts - 1
        assert f"back-off {int(backoff_delay(restarts))}s" in container["state"]["waiting"]["message"]
        starts.append(sim.run_until(lambda r=restarts: sim.container(one_pod(sim, "chat"))["restartCount"] == r))
        assert one_pod(sim, "chat")["status"]["phase"] == "Running"
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert gaps[1] > gaps[0] + 8 and gaps[2] > gaps[1] + 18  # 10 s → 20 s → 40 s of back-off
    assert sim.kubelet.stats("chat").failed_starts >= 4
    failure = classify(evidence_from_pod(one_pod(sim, "chat"))[0])
    assert failure is not None and failure.kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY


def test_backoff_delays() -> None:
    assert [backoff_delay(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [10, 20, 40, 80, 160, 300, 300]


def test_host_memory_over_the_limit_is_oom_killed(sim: SimHarness) -> None:
    sim.hidden["chat"] = HiddenFacts(host_memory_limit_gib=8.0)
    sim.api.create_object("deployments", deployment("chat", LLAMA3_8B, FLAGS))
    sim.run_until(lambda: sim.container(one_pod(sim, "chat")).get("lastState", {}).get("terminated")
                  or "terminated" in sim.container(one_pod(sim, "chat")).get("state", {}))
    container = sim.container(one_pod(sim, "chat"))
    terminated = container["state"].get("terminated") or container["lastState"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)
    failure = classify(evidence_from_pod(one_pod(sim, "chat"))[0])
    assert failure is not None and failure.kind is FailureKind.HOST_OOM_KILLED


def test_scheduling_by_free_gpus_and_node_selector(sim: SimHarness) -> None:
    # 3 pods × 2 L4 GPUs on a 4×L4 node: two fit, the third waits
    sim.api.create_object("deployments", deployment("wide", LLAMA3_8B, {**FLAGS, "tensor_parallel_size": 2},
                                                    gpus=2, replicas=3))
    sim.kubelet.tick()
    pods = sim.pods("wide")
    assert len(pods) == 3
    placed = [p for p in pods if p["spec"].get("nodeName")]
    pending = [p for p in pods if not p["spec"].get("nodeName")]
    assert len(placed) == 2 and {p["spec"]["nodeName"] for p in placed} == {"gpu-l4-0"}
    scheduled = condition(pending[0], "PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert "1 Insufficient nvidia.com/gpu" in scheduled["message"]
    assert "1 node(s) didn't match Pod's node affinity/selector" in scheduled["message"]  # the A100 node
    # an A100 workload lands on the A100 node only
    sim.api.create_object("deployments", deployment("awq", "casperhansen/llama-3-70b-instruct-awq",
                                                    {"tensor_parallel_size": 2}, product="NVIDIA-A100-SXM4-40GB",
                                                    gpus=2))
    sim.kubelet.tick()
    assert one_pod(sim, "awq")["spec"]["nodeName"] == "gpu-a100-0"
    # when GPUs are freed, the waiting pod is placed
    sim.api.patch_object("deployments", "wide", {"spec": {"replicas": 1}})
    sim.run(2)
    assert all(p["spec"].get("nodeName") for p in sim.pods("wide"))


def test_untolerated_gpu_taint_keeps_pods_off_gpu_nodes(sim: SimHarness) -> None:
    deploy = deployment("chat", LLAMA3_8B, FLAGS)
    deploy["spec"]["template"]["spec"]["tolerations"] = []
    sim.api.create_object("deployments", deploy)
    sim.kubelet.tick()
    assert "untolerated taint" in condition(one_pod(sim, "chat"), "PodScheduled")["message"]


def test_a_new_template_replaces_a_crash_looping_pod_at_once(sim: SimHarness) -> None:
    sim.hidden["chat"] = HiddenFacts(other_process_gib=2.0)
    sim.api.create_object("deployments", deployment("chat", LLAMA3_8B, FLAGS))
    sim.run_until(lambda: sim.kubelet.stats("chat").failed_starts == 1)
    old = one_pod(sim, "chat")["metadata"]["name"]
    fixed = deployment("chat", LLAMA3_8B, {**FLAGS, "gpu_memory_utilization": 0.85})
    sim.api.patch_object("deployments", "chat", {"spec": fixed["spec"]})
    sim.kubelet.tick()
    pod = one_pod(sim, "chat")  # the old, failing pod is gone at once
    assert pod["metadata"]["name"] != old
    assert len(sim.api.list_objects("replicasets", "default")) == 2
    sim.run_until(lambda: sim.container(one_pod(sim, "chat")).get("ready"))
    sim.kubelet.tick()
    status = sim.api.get_object("deployments", "chat")["status"]
    assert (status["observedGeneration"], status["updatedReplicas"], status["readyReplicas"]) == (2, 1, 1)
    assert sim.kubelet.stats("chat").failed_starts == 1


def test_a_new_template_replaces_a_ready_pod_only_once_the_new_one_is_ready(sim: SimHarness) -> None:
    sim.api.create_object("deployments", deployment("chat", LLAMA3_8B, FLAGS))
    sim.run_until(lambda: sim.container(one_pod(sim, "chat")).get("ready"))
    old = one_pod(sim, "chat")["metadata"]["name"]
    newer = deployment("chat", LLAMA3_8B, {**FLAGS, "max_num_seqs": 8})
    sim.api.patch_object("deployments", "chat", {"spec": newer["spec"]})
    sim.run(5)
    names = {p["metadata"]["name"] for p in sim.pods("chat")}
    assert old in names and len(names) == 2  # surge: both run while the new one loads
    sim.run_until(lambda: len(sim.pods("chat")) == 1)
    assert one_pod(sim, "chat")["metadata"]["name"] != old
    assert sim.container(one_pod(sim, "chat"))["ready"] is True


def test_traffic_over_the_hidden_limit_kills_a_ready_pod_while_serving(sim: SimHarness) -> None:
    sim.hidden["chat"] = HiddenFacts(serving_oom_above_seqs=8)
    sim.api.create_object("deployments", deployment("chat", LLAMA3_8B, FLAGS))
    sim.run_until(lambda: sim.container(one_pod(sim, "chat")).get("ready"))
    sim.kubelet.send_traffic("chat", concurrency=4, context=2048)
    sim.run(30)
    assert sim.container(one_pod(sim, "chat"))["ready"] is True  # 4 sequences fit
    sim.kubelet.send_traffic("chat", concurrency=64, context=2048)
    sim.run_until(lambda: sim.kubelet.stats("chat").serving_failures == 1, limit=60)
    pod = one_pod(sim, "chat")
    terminated = sim.container(pod)["state"].get("terminated") or sim.container(pod)["lastState"]["terminated"]
    assert terminated["exitCode"] == 1 and "CUDA out of memory" in terminated["message"]
    failure = classify(evidence_from_pod(pod)[0])
    assert failure is not None and failure.kind is FailureKind.CUDA_OOM_SERVING
    assert sim.kubelet.stats("chat").failed_starts == 0
    # the same flags die again under the same load; fewer sequences survive it
    smaller = deployment("chat", LLAMA3_8B, {**FLAGS, "max_num_seqs": 6})
    sim.api.patch_object("deployments", "chat", {"spec": smaller["spec"]})
    sim.run_until(lambda: len(sim.pods("chat")) == 1 and sim.container(one_pod(sim, "chat")).get("ready"))
    sim.run(60)
    assert sim.container(one_pod(sim, "chat"))["ready"] is True
    assert sim.kubelet.stats("chat").serving_failures == 1


def test_deleting_the_deployment_removes_its_pods(sim: SimHarness) -> None:
    sim.api.create_object("deployments", deployment("chat", LLAMA3_8B, FLAGS))
    sim.run(5)
    sim.api.delete_object("deployments", "chat")
    sim.run(1)
    assert sim.pods("chat") == [] and sim.api.list_objects("replicasets", "default") == []
    assert any(e.kind == "deleted" for e in sim.events)


def test_events_for_kubectl_describe(sim: SimHarness) -> None:
    sim.hidden["chat"] = HiddenFacts(other_process_gib=6.0)
    sim.api.create_object("deployments", deployment("chat", LLAMA3_8B, FLAGS))
    sim.run_until(lambda: sim.container(one_pod(sim, "chat")).get("restartCount") == 1)
    reasons = {e["reason"] for e in sim.api.list_objects("events", "default")}
    assert {"Scheduled", "Pulling", "Started", "BackOff"} <= reasons


def test_without_fallback_to_logs_the_message_is_empty_and_the_log_has_the_error(sim: SimHarness) -> None:
    sim.hidden["chat"] = HiddenFacts(other_process_gib=6.0)
    deploy = deployment("chat", LLAMA3_8B, FLAGS)
    deploy["spec"]["template"]["spec"]["containers"][0].pop("terminationMessagePolicy")
    sim.api.create_object("deployments", deploy)
    sim.run_until(lambda: sim.kubelet.stats("chat").failed_starts == 1)
    pod = one_pod(sim, "chat")
    container = sim.container(pod)
    terminated = container["state"].get("terminated") or container["lastState"]["terminated"]
    assert terminated["message"] == ""
    assert "Free memory on device cuda:0" in sim.log(pod["metadata"]["name"])


DIGEST_IMAGE = "vllm/vllm-openai@sha256:" + "ab" * 32


@pytest.mark.parametrize("version", ["0.26.0", "0.33.0"])
def test_a_digest_image_runs_as_the_declared_vllm_version(sim: SimHarness, version: str) -> None:
    sim.api.create_object("deployments", deployment("pinned", LLAMA3_8B, FLAGS, image=DIGEST_IMAGE,
                                                    vllm_version=version))
    sim.kubelet.tick()
    pod = one_pod(sim, "pinned")
    assert pod["metadata"]["annotations"]["vllm-operator.dev/vllm-version"] == version
    sim.run_until(lambda: sim.container(one_pod(sim, "pinned")).get("ready"))
    text = sim.log(one_pod(sim, "pinned")["metadata"]["name"])
    assert re.search(rf"█ ▀▄▀ █  version {re.escape(version)}\r$", text, re.M), text[:2000]


def test_only_pods_of_untagged_images_carry_the_declared_version() -> None:
    tagged = deployment("tagged", LLAMA3_8B, FLAGS)["spec"]["template"]["metadata"]["annotations"]
    assert "vllm-operator.dev/vllm-version" not in tagged  # the tag says it; the template of tagged images is unchanged
    digest = deployment("digest", LLAMA3_8B, FLAGS, image=DIGEST_IMAGE, vllm_version="0.26.0")
    assert digest["spec"]["template"]["metadata"]["annotations"]["vllm-operator.dev/vllm-version"] == "0.26.0"
