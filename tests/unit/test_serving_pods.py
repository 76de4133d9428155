"""render.pods: one definition of the pods that serve a VLLMService, and every rendered object that addresses them
uses it (Service, InferencePool, KEDA triggers, status.selector for the HPA, the metrics watch's default)."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from vllm_operator import reconcile
from vllm_operator.metrics.observe import DEFAULT_SELECTOR, render_selector
from vllm_operator.render.lws import build_leader_service
from vllm_operator.render.manifests import OwnerRef, RenderInput, build_deployment, build_service
from vllm_operator.render.pods import (
    LWS_GROUP_INDEX_LABEL,
    LWS_NAME_LABEL,
    LWS_WORKER_INDEX_LABEL,
    SAFE_ALPHABET,
    WORKLOAD_LABEL,
    deployment_pod_regex,
    serving_pods,
)
from vllm_operator.sources import load_model_files

QWEN = "Qwen/Qwen2.5-7B-Instruct"
L4 = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1"}


def _safe(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(SAFE_ALPHABET, k=n))


def deployment_pods(deployment: str, service: str, namespace: str, rng: random.Random,
                    count: int = 2) -> list[dict[str, Any]]:
    """Pods as the ReplicaSet controller and the API server name them: `<rs>-<5>`, the base cut to 58; labelled as
    the operator's Deployment template labels them (`test_the_objects_use_it` checks the template)."""
    template_hash = _safe(rng, rng.randint(1, 10))
    base = f"{deployment}-{template_hash}-"[:58]
    labels = {"app.kubernetes.io/instance": service, "vllm-operator.dev/service": service,
              WORKLOAD_LABEL: "deployment", "pod-template-hash": template_hash}
    return [{"metadata": {"name": base + _safe(rng, 5), "namespace": namespace, "labels": dict(labels)}}
            for _ in range(count)]


def lws_pods(lws: str, service: str, namespace: str, groups: int, size: int) -> list[dict[str, Any]]:
    """Pods as the LeaderWorkerSet controller names them: leaders `<lws>-<g>`, workers `<lws>-<g>-<w>`."""
    pods = []
    for g in range(groups):
        for w in range(size):
            labels = {"app.kubernetes.io/instance": service, "vllm-operator.dev/service": service,
                      LWS_NAME_LABEL: lws, LWS_GROUP_INDEX_LABEL: str(g), LWS_WORKER_INDEX_LABEL: str(w)}
            name = f"{lws}-{g}" if w == 0 else f"{lws}-{g}-{w}"
            pods.append({"metadata": {"name": name, "namespace": namespace, "labels": labels}})
    return pods


def names(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["name"] for p in pods}


def cluster(rng: random.Random) -> list[dict[str, Any]]:
    """Neighbours that a loose matcher would catch: `qwen-2` (a Deployment and a LeaderWorkerSet of that name),
    `qwen` in another namespace, and pods of both shapes of `qwen` itself."""
    return [*deployment_pods("qwen-2", "qwen-2", "team", rng), *lws_pods("qwen-2", "qwen-2", "team", 12, 3),
            *deployment_pods("qwen", "qwen", "other", rng), *lws_pods("qwen", "qwen", "other", 2, 2),
            *deployment_pods("q", "q", "team", rng)]


@pytest.mark.parametrize("seed", range(20))
def test_each_shape_selects_exactly_its_serving_pods(seed: int) -> None:
    rng = random.Random(seed)
    served = deployment_pods("qwen", "qwen", "team", rng, count=3)
    leaders_and_workers = lws_pods("qwen", "qwen", "team", groups=11, size=4)
    everything = cluster(rng) + served + leaders_and_workers
    leaders = [p for p in leaders_and_workers if p["metadata"]["labels"][LWS_WORKER_INDEX_LABEL] == "0"]
    for multinode, expected in ((False, served), (True, leaders)):
        pods = serving_pods("qwen", "team", multinode=multinode)
        # a label selector acts in its object's namespace
        assert names([p for p in everything if p["metadata"]["namespace"] == "team"
                      and pods.selects_labels(p["metadata"]["labels"])]) == names(expected)
        assert names([p for p in everything if pods.selects_name(p["metadata"]["namespace"],
                                                                 p["metadata"]["name"])]) == names(expected)
        assert names([p for p in everything if pods.matches(p)]) == names(expected)


@pytest.mark.parametrize("length", [1, 20, 45, 46, 47, 50, 56, 57, 63])
def test_long_deployment_names_match_the_cut_pod_names(length: int) -> None:
    rng = random.Random(length)
    deployment = ("m" * length)[:length]
    regex = deployment_pod_regex(deployment)
    for hash_length in range(1, 11):
        template_hash = _safe(rng, hash_length)
        pod = f"{deployment}-{template_hash}-"[:58] + _safe(rng, 5)
        assert re.fullmatch(regex, pod), (pod, regex)
    assert not re.fullmatch(regex, f"{deployment}-0-1")          # a LeaderWorkerSet worker of that name
    assert not re.fullmatch(regex, f"{deployment}-0")            # its leader
    if length < 58:  # past 58 characters the API server keeps only the prefix: Kubernetes' own limit
        assert not re.fullmatch(regex, f"{deployment}x-bcd-bcdfg"[:63])


def test_the_objects_use_it() -> None:
    inp = RenderInput(name="qwen", namespace="team", owner=OwnerRef(name="qwen", uid="u"), model=QWEN,
                      image="vllm/vllm-openai:v0.26.0", vllm_version="0.26.0", flags={}, gpu_count=1,
                      weights_gib_total=15.0)
    deployment = build_deployment(inp)
    assert build_service(inp)["spec"]["selector"] == serving_pods("qwen", "team", multinode=False).match_labels
    assert build_leader_service(inp)["spec"]["selector"] == serving_pods("qwen", "team", multinode=True).match_labels
    # the Deployment's own selector is every pod of the service (immutable; its pods are the serving ones)
    pod = {"metadata": {"name": "qwen-bcdfgh-jklmn", "namespace": "team",
                        "labels": deployment["spec"]["template"]["metadata"]["labels"]}}
    assert serving_pods("qwen", "team", multinode=False).matches(pod)
    assert deployment["spec"]["template"]["metadata"]["labels"][WORKLOAD_LABEL] == "deployment"


def test_during_a_switch_neither_shape_selects_the_other_workloads_pods() -> None:
    """A Deployment → LeaderWorkerSet switch runs both workloads of one service: the Deployment-shaped Service and
    InferencePool (equality labels only) must not select the group's leaders or headless workers, nor the
    LeaderWorkerSet-shaped ones the Deployment's pods — with the labels the rendered templates give the pods."""
    from vllm_operator.render.lws import build_leaderworkerset

    inp = RenderInput(name="qwen", namespace="team", owner=OwnerRef(name="qwen", uid="u"), model=QWEN,
                      image="vllm/vllm-openai:v0.26.0", vllm_version="0.26.0", flags={}, gpu_count=8,
                      weights_gib_total=15.0)
    template = build_deployment(inp)["spec"]["template"]["metadata"]["labels"]
    group = build_leaderworkerset(inp, nodes=2)["spec"]["leaderWorkerTemplate"]
    deployment_pod = {**template, "pod-template-hash": "bcd"}
    lws_labels = {LWS_NAME_LABEL: "qwen", LWS_GROUP_INDEX_LABEL: "0"}
    leader = {**group["leaderTemplate"]["metadata"]["labels"], **lws_labels, LWS_WORKER_INDEX_LABEL: "0"}
    worker = {**group["workerTemplate"]["metadata"]["labels"], **lws_labels, LWS_WORKER_INDEX_LABEL: "1"}
    by_deployment = serving_pods("qwen", "team", multinode=False).match_labels
    by_group = serving_pods("qwen", "team", multinode=True).match_labels

    def selects(selector: Any, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in selector.items())

    assert [selects(by_deployment, p) for p in (deployment_pod, leader, worker)] == [True, False, False]
    assert [selects(by_group, p) for p in (deployment_pod, leader, worker)] == [False, True, False]


def _desired(spec: dict[str, Any]) -> reconcile.Desired:
    return reconcile.desired_state(reconcile.Observed(
        name="qwen", namespace="team", uid="uid-1", generation=1, spec={"model": {"name": QWEN}, **spec},
        status={}, now=datetime(2025, 1, 1, tzinfo=UTC), nodes=(L4,), model_files=load_model_files(QWEN, offline=True),
        served_kinds=frozenset({"ScaledObject", "InferencePool"})))


def test_reconcile_hands_the_same_pods_to_pool_triggers_and_scale_selector() -> None:
    desired = _desired({"autoscaling": {"engine": "KEDA", "maxReplicas": 3,
                                        "prometheusAddress": "http://prometheus:9090"},
                        "routing": {"inferencePool": {"enabled": True}}})
    pods = serving_pods("qwen", "team", multinode=False)
    by_kind = {c["kind"]: c for c in desired.children or []}
    assert by_kind["InferencePool"]["spec"]["selector"]["matchLabels"] == pods.match_labels
    assert by_kind["Service"]["spec"]["selector"] == pods.match_labels
    for trigger in by_kind["ScaledObject"]["spec"]["triggers"]:
        assert "{" + pods.promql() + "}" in trigger["metadata"]["query"]
    assert desired.status.selector == pods.label_selector()
    assert render_selector(DEFAULT_SELECTOR, namespace="team", service="qwen",
                           pods_regex=pods.pod_name_regex) == pods.promql()


def test_a_multi_node_plan_addresses_the_leaders() -> None:
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
    llama = "meta-llama/Llama-3.1-405B-Instruct"
    desired = reconcile.desired_state(reconcile.Observed(
        name="big", namespace="team", uid="uid-1", generation=1,
        spec={"model": {"name": llama}, "gpu": {"maxNodes": 2},
              "autoscaling": {"engine": "KEDA", "maxReplicas": 3, "prometheusAddress": "http://prometheus:9090"},
              "routing": {"inferencePool": {"enabled": True}}},
        status={}, now=datetime(2025, 1, 1, tzinfo=UTC), nodes=(h100, h100),
        model_files=load_model_files(llama, offline=True), served_kinds=frozenset({"ScaledObject", "InferencePool"}),
        lws_installed=True))
    by_kind = {c["kind"]: c for c in desired.children or []}
    assert "LeaderWorkerSet" in by_kind, [c["kind"] for c in desired.children or []]
    pods = serving_pods("big", "team", multinode=True)
    assert by_kind["InferencePool"]["spec"]["selector"]["matchLabels"] == pods.match_labels
    assert pods.match_labels[LWS_WORKER_INDEX_LABEL] == "0"
    assert by_kind["Service"]["spec"]["selector"] == pods.match_labels
    for trigger in by_kind["ScaledObject"]["spec"]["triggers"]:
        assert f'pod=~"{pods.pod_name_regex}"' in trigger["metadata"]["query"]
    assert desired.status.selector == pods.label_selector()
    assert pods.match_labels[LWS_NAME_LABEL] == by_kind["LeaderWorkerSet"]["metadata"]["name"]
