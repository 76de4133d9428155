"""A claim per pod without LeaderWorkerSet (issue 25): a service that may run several one-node pods on ReadWriteOnce
storage, where the LeaderWorkerSet API is not served, runs as an apps/v1 StatefulSet (render/statefulset.py) — its
shape, what the reconcile records, the serving pods' definition and the switch's takeover."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
import pytest

from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.api import switch
from vllm_operator.api.placement import decide, decide_switch, surges_any
from vllm_operator.handlers.effects import ready, takes_over
from vllm_operator.render.cache import MODEL_CACHE, PERSISTENT, CacheSettings
from vllm_operator.render.pods import (
    STATEFULSET_NAME_LIMIT,
    WORKLOAD_LABEL,
    dashboard_pod_regex,
    serving_now,
    serving_pods,
    statefulset_name,
)
from vllm_operator.sources import load_model_files

QWEN = "Qwen/Qwen2.5-7B-Instruct"
L4 = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1"}


def run(spec: dict[str, Any], *, lws: bool | None = False, status: dict[str, Any] | None = None,
        name: str = "svc") -> reconcile.Desired:
    spec = {"model": {"name": QWEN}, "gpu": {"product": "NVIDIA-L4"}, **spec}
    return reconcile.desired_state(reconcile.Observed(
        name=name, namespace="ns", uid=f"uid-{name}", generation=1, spec=spec, status=status or {},
        now=datetime(2026, 1, 1, tzinfo=UTC), nodes=(L4,),
        model_files=load_model_files(spec["model"]["name"], offline=True),
        cache_settings=CacheSettings(), default_storage_class="standard", lws_installed=lws))


def kinds(desired: reconcile.Desired) -> dict[str, dict[str, Any]]:
    assert desired.children is not None
    return {c["kind"]: c for c in desired.children}


def stored(desired: reconcile.Desired) -> dict[str, Any]:
    return desired.status.model_dump(by_alias=True, exclude_none=True)


def _pod(name: str, labels: dict[str, str], namespace: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}}


@pytest.mark.parametrize("spec", [{"replicas": 2}, {"maxReplicas": 4},
                                  {"autoscaling": {"minReplicas": 1, "maxReplicas": 3}}])
def test_several_pods_without_lws_run_as_a_statefulset_with_a_claim_each(spec: dict[str, Any]) -> None:
    desired = run(spec)
    children = kinds(desired)
    assert "Deployment" not in children and "LeaderWorkerSet" not in children
    assert "PersistentVolumeClaim" not in children  # no claim of the service's own: each pod gets one
    sts = children["StatefulSet"]
    assert sts["apiVersion"] == "apps/v1" and sts["metadata"]["name"] == "svc-set"
    assert sts["metadata"]["ownerReferences"][0]["uid"] == "uid-svc" and sts["metadata"]["ownerReferences"][0][
        "controller"] is True
    body = sts["spec"]
    assert body["podManagementPolicy"] == "Parallel" and body["updateStrategy"] == {"type": "RollingUpdate"}
    assert body["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    assert body["serviceName"] == children["Service"]["metadata"]["name"]
    claim = body["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "model-cache" and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    # the LeaderWorkerSet's per-pod claim, the same template (one source: render/cache.py's _per_pod)
    groups = kinds(run(spec, lws=True))["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    assert groups["volumeClaimTemplates"] == body["volumeClaimTemplates"]
    # the pod is the Deployment's pod: same containers, init container, probes, resources, node selection
    pod = body["template"]["spec"]
    assert pod == groups["leaderTemplate"]["spec"]
    assert all(v["name"] != "model-cache" for v in pod["volumes"])
    assert [c["name"] for c in pod["initContainers"]] == ["model-download"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1" and "startupProbe" in vllm
    assert any(e["name"] == "VLLM_CACHE_ROOT" for e in vllm["env"])  # compile caches on the claim
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
    labels = body["template"]["metadata"]["labels"]
    assert labels[WORKLOAD_LABEL] == "statefulset"
    assert body["selector"]["matchLabels"].items() <= labels.items()
    status = stored(desired)
    assert status["workload"] == "StatefulSet" and switch.target_kind(status) == "StatefulSet"
    assert serving_now("svc", "ns", status).shape == "StatefulSet"
    assert status["selector"] == serving_pods("svc", "ns", kind="StatefulSet").label_selector()
    assert children["Service"]["spec"]["selector"] == dict(serving_pods("svc", "ns", kind="StatefulSet").match_labels)
    found = cond.find_condition(desired.status.conditions, MODEL_CACHE)
    assert found is not None and (found.status, found.reason) == (cond.TRUE, PERSISTENT)
    assert "StatefulSet" in found.message and "kept when the service scales down" in found.message
    assert body["replicas"] == status["replicas"]  # spec.replicas comes from where the Deployment's does


@pytest.mark.parametrize("version", ["1.30", "1.33"])
def test_the_statefulset_validates_against_the_kubernetes_schema(version: str) -> None:
    children = kinds(run({"replicas": 2}))
    kubernetes_validate.validate(children["StatefulSet"], version, strict=True)
    kubernetes_validate.validate(children["Service"], version, strict=True)


def _template(desired: reconcile.Desired) -> str:
    return json.dumps(kinds(desired)["StatefulSet"]["spec"]["template"], sort_keys=True)


def test_scaling_never_changes_the_template_and_a_one_pod_service_switches_once() -> None:
    """1 → 2 → 1 → 2 within the bounds: the replicas follow, the pod template and claims stay byte for byte; a
    plain one-replica service scaled to 3 becomes a StatefulSet once and stays one when scaled back to 1."""
    status: dict[str, Any] = {}
    templates, replicas = [], []
    for count in (1, 2, 1, 2):
        desired = run({"maxReplicas": 3, "replicas": count}, status=status)
        templates.append(_template(desired))
        replicas.append(kinds(desired)["StatefulSet"]["spec"]["replicas"])
        status = stored(desired)
    assert replicas == [1, 2, 1, 2] and len(set(templates)) == 1
    one = run({})
    assert "Deployment" in kinds(one)
    three = run({"replicas": 3}, status=stored(one))
    assert "StatefulSet" in kinds(three) and stored(three)["modelCache"]["shapePods"] == 3
    back = run({"replicas": 1}, status=stored(three))
    assert "Deployment" not in kinds(back) and _template(back) == _template(three)


def test_installing_lws_later_keeps_a_statefulset_and_one_pod_groups_stay_groups() -> None:
    """Sticky: the LeaderWorkerSet API appearing must not make a serving service drop its cached weights."""
    before = run({"replicas": 2}, lws=False)
    after = run({"replicas": 2}, lws=True, status=stored(before))
    assert "StatefulSet" in kinds(after) and stored(after)["workload"] == "StatefulSet"
    assert _template(after) == _template(before)
    groups = run({"replicas": 2}, lws=True)
    again = run({"replicas": 2}, lws=True, status=stored(groups))
    assert "LeaderWorkerSet" in kinds(again) and "StatefulSet" not in kinds(again)


def test_a_plan_over_nodes_is_a_leaderworkerset_whatever_ran_before() -> None:
    before = stored(run({"replicas": 2}))
    h100_x8 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
    llama = "meta-llama/Llama-3.1-405B-Instruct"
    spanning = reconcile.desired_state(reconcile.Observed(
        name="svc", namespace="ns", uid="uid-svc", generation=1, spec={
            "model": {"name": llama}, "gpu": {"maxNodes": 2}, "replicas": 2}, status=before,
        now=datetime(2026, 1, 1, tzinfo=UTC), nodes=(h100_x8, h100_x8),
        model_files=load_model_files(llama, offline=True), cache_settings=CacheSettings(),
        default_storage_class="standard", lws_installed=True))
    assert "LeaderWorkerSet" in kinds(spanning) and "StatefulSet" not in kinds(spanning)
    assert stored(spanning)["workload"] == "LeaderWorkerSet"


def test_the_serving_pods_of_each_shape_never_overlap() -> None:
    """During a switch two workloads of one service run: each shape's selector and name pattern picks its own pods
    only (labels and the exact PromQL names), and the StatefulSet's pods are `<svc>-set-<ordinal>`."""
    deployment = serving_pods("qwen", "ns", kind="Deployment")
    groups = serving_pods("qwen", "ns", kind="LeaderWorkerSet")
    pods = serving_pods("qwen", "ns", kind="StatefulSet")
    sts_pod = _pod("qwen-set-0", {"app.kubernetes.io/instance": "qwen", "vllm-operator.dev/service": "qwen",
                                  WORKLOAD_LABEL: "statefulset"})
    sts_pod_12 = _pod("qwen-set-12", dict(sts_pod["metadata"]["labels"]))
    dep_pod = _pod("qwen-7d9f8b6c5-x2vbn", {"app.kubernetes.io/instance": "qwen", "vllm-operator.dev/service": "qwen",
                                            WORKLOAD_LABEL: "deployment"})
    leader = _pod("qwen-0", {"app.kubernetes.io/instance": "qwen", "vllm-operator.dev/service": "qwen",
                             "leaderworkerset.sigs.k8s.io/name": "qwen",
                             "leaderworkerset.sigs.k8s.io/worker-index": "0"})
    assert pods.matches(sts_pod) and pods.matches(sts_pod_12)
    assert not pods.matches(dep_pod) and not pods.matches(leader)
    assert not deployment.matches(sts_pod) and not groups.matches(sts_pod)
    assert deployment.matches(dep_pod) and groups.matches(leader)
    # names alone (PromQL): a many-digit ordinal is never a Deployment pod's name, a leader's name never the set's
    assert not deployment.selects_name("ns", "qwen-set-22222") and not groups.selects_name("ns", "qwen-set-0")
    assert not pods.selects_name("ns", "qwen-0") and not pods.selects_name("ns", "qwen-set-0-1")
    assert not pods.selects_name("ns", "qwen-set-01") and not pods.selects_name("other", "qwen-set-0")
    assert pods.promql() == 'namespace="ns",pod=~"qwen-set-(?:0|[1-9][0-9]*)"'
    assert pods.label_selector() == ("app.kubernetes.io/instance=qwen,vllm-operator.dev/service=qwen,"
                                     "vllm-operator.dev/workload=statefulset")
    dashboards = dashboard_pod_regex("qwen")
    assert re.fullmatch(dashboards, "qwen-set-3") and re.fullmatch(dashboards, "qwen-0")
    assert not re.fullmatch(dashboards, "qwen-set-3-1")


def test_the_statefulset_name_fits_its_pods_revision_label() -> None:
    """`controller-revision-hash: <sts>-<hash>` is a label value (63 characters): the name stays within 52, and two
    long service names stay apart."""
    long_a, long_b = "a" * 60 + "-x", "a" * 60 + "-y"
    for name in (long_a, long_b, "0bad.name", "svc"):
        sts = statefulset_name(name)
        assert len(sts) <= STATEFULSET_NAME_LIMIT and sts.endswith("-set")
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", sts)
    assert statefulset_name(long_a) != statefulset_name(long_b)


def _sts(replicas: int, ready_: int, *, updated: int | None = None, current: str = "r1", update: str = "r1",
         generation: int = 1, seen: int = 1) -> dict[str, Any]:
    return {"kind": "StatefulSet", "metadata": {"generation": generation, "name": "svc-set"},
            "spec": {"replicas": replicas},
            "status": {"readyReplicas": ready_, "updatedReplicas": ready_ if updated is None else updated,
                       "currentRevision": current, "updateRevision": update, "observedGeneration": seen}}


def test_a_statefulset_is_ready_when_every_pod_of_its_current_revision_serves() -> None:
    assert ready(_sts(2, 2))
    assert not ready(_sts(2, 1))
    assert not ready(_sts(2, 2, update="r2"))  # a rolling update under way
    assert not ready(_sts(2, 2, generation=2, seen=1))  # the controller has not seen the new spec
    deployment = {"kind": "Deployment", "metadata": {"generation": 1}, "spec": {"replicas": 1},
                  "status": {"readyReplicas": 1, "updatedReplicas": 1, "observedGeneration": 1}}
    assert takes_over(_sts(2, 1), deployment)  # serves as much as the one-pod Deployment did
    assert not takes_over(_sts(2, 0), deployment) and not takes_over(_sts(2, 1, generation=2, seen=1), deployment)


def _template_of(gpus: int, product: str = "NVIDIA-L4", plan: str = "a") -> dict[str, Any]:
    return {"metadata": {"annotations": {"vllm-operator.dev/plan": plan}},
            "spec": {"nodeSelector": {"nvidia.com/gpu.product": product},
                     "containers": [{"name": "vllm", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]}}


def _node(name: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


def _running(name: str, node: str, gpus: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [
        {"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]}, "status": {"phase": "Running"}}


def test_a_statefulset_rollout_never_surges_and_one_pod_says_it_interrupts() -> None:
    current = {"kind": "StatefulSet", "spec": {"template": _template_of(1, plan="a")}}
    desired = {"kind": "StatefulSet", "spec": {"template": _template_of(1, plan="b")}}
    assert not surges_any(desired)
    nodes, pods = [_node("n1", 1)], [_running("svc-set-0", "n1")]
    one = decide(current, desired, ready=1, nodes=nodes, pods=pods, own_pods=["svc-set-0"], start_seconds=40)
    assert one.verdict == "interrupt" and "StatefulSet" in one.message and "about 40 s" in one.message
    two = decide(current, desired, ready=2, nodes=[_node("n1", 1), _node("n2", 1)],
                 pods=[*pods, _running("svc-set-1", "n2")], own_pods=["svc-set-1"], start_seconds=40)
    assert two.verdict == "proceed"  # the other pod serves while the highest ordinal rolls
    full = {"kind": "StatefulSet", "spec": {"template": _template_of(1, product="NVIDIA-H100-80GB-HBM3", plan="b")}}
    held = decide(current, full, ready=1, nodes=[_node("h1", 1)], pods=[_running("other", "h1")],
                  own_pods=["svc-set-0"], start_seconds=None)
    assert held.verdict == "hold" and "Free a GPU" in held.message


def test_a_switch_whose_pods_cannot_be_placed_beside_the_serving_pods_is_held() -> None:
    """The new workload takes over once it serves as many replicas as the previous one: that many pods must fit
    beside the serving ones, or the switch would wait forever."""
    previous = {"kind": "Deployment", "metadata": {"name": "svc"}, "spec": {"template": _template_of(1)}}
    target = {"kind": "StatefulSet", "metadata": {"name": "svc-set"},
              "spec": {"replicas": 2, "template": _template_of(1)}}
    nodes = [_node("n1", 1), _node("n2", 1), _node("n3", 1)]
    serving = [_running("svc-abc-d2f4g", "n1"), _running("svc-abc-h5j6k", "n2")]  # the emptyDir Deployment's pods
    held = decide_switch(previous, target, ready=2, nodes=nodes, pods=serving, why="each pod needs a claim")
    assert held.verdict == "hold"
    assert "2 pods of it must serve before it takes over" in held.message and "and 1 fits" in held.message
    assert "Free 1 GPU of nvidia.com/gpu.product=NVIDIA-L4" in held.message
    assert "spec.modelCache" in held.message and "ReadWriteMany" in held.message
    assert "Deployment svc keeps serving" in held.message
    assert decide_switch(previous, target, ready=2, nodes=[*nodes, _node("n4", 1)], pods=serving,
                         why="x").verdict == "proceed"
    # one serving pod: one new pod must fit (the rest may wait for the GPU the previous pod frees)
    assert decide_switch(previous, target, ready=1, nodes=nodes[:2], pods=serving[:1], why="x").verdict == "proceed"
    assert decide_switch(previous, target, ready=1, nodes=nodes[:1], pods=serving[:1], why="x").verdict == "hold"
    assert decide_switch(previous, target, ready=0, nodes=nodes, pods=serving, why="x").verdict == "proceed"


def test_an_edit_keeps_what_the_api_server_refuses_to_change() -> None:
    """A new model renders claims of another size: apps/v1 refuses a change of volumeClaimTemplates (and selector,
    serviceName, podManagementPolicy), so the applied StatefulSet keeps them — and the render's spec hash, so the
    next reconcile applies nothing — while the pod template changes."""
    from vllm_operator.render.statefulset import IMMUTABLE_FIELDS, keep_immutable

    before = kinds(run({"replicas": 2}))["StatefulSet"]
    after = kinds(run({"replicas": 2, "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}}))["StatefulSet"]
    assert after["spec"]["volumeClaimTemplates"] != before["spec"]["volumeClaimTemplates"]
    applied = keep_immutable(after, before)
    assert all(applied["spec"][f] == before["spec"][f] for f in IMMUTABLE_FIELDS)
    assert applied["spec"]["template"] == after["spec"]["template"] != before["spec"]["template"]
    assert applied["metadata"]["annotations"] == after["metadata"]["annotations"]
    assert keep_immutable(after, None) is after
