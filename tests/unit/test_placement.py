"""Before a rollout that stops the serving pod first (api/placement.py): proceed, say the interruption, or hold the
old template when the new pod would find no GPU."""

from __future__ import annotations

from typing import Any

from vllm_operator.api.labels import ANNOTATION_PLAN
from vllm_operator.api.placement import decide, free_gpus, template_gpus


def _deployment(product: str, plan: str = "p1", gpus: int = 1, surge: int = 0) -> dict[str, Any]:
    return {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge,
                                                                             "maxUnavailable": 1 - surge}},
                     "template": {"metadata": {"annotations": {ANNOTATION_PLAN: plan}},
                                  "spec": {"nodeSelector": {"nvidia.com/gpu.product": product}, "containers": [
                                      {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}}


def _node(name: str, gpus: int, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


def _pod(name: str, node: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": phase}, "spec": {"nodeName": node, "containers": [
        {"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]}}


def test_free_gpus_count_requests_of_live_pods_and_leave_out_the_leaving_ones() -> None:
    nodes = [_node("a", 8), _node("b", 4), _node("cordoned", 8, unschedulable=True)]
    pods = [_pod("x", "a", 4), _pod("y", "a", 2), _pod("done", "b", 4, phase="Succeeded"), _pod("mine", "b", 2)]
    assert free_gpus(nodes, pods) == {"a": 2, "b": 2}
    assert free_gpus(nodes, pods, leaving=["mine", "y"]) == {"a": 4, "b": 4}
    assert template_gpus(_deployment("L4", gpus=2)["spec"]["template"]) == 2


def test_nothing_to_protect_proceeds() -> None:
    new = _deployment("H100", plan="p2")
    assert decide(None, new, ready=1, nodes=[], pods=[], own_pods=[], start_seconds=None).verdict == "proceed"
    old = _deployment("L4")
    assert decide(old, new, ready=0, nodes=[], pods=[], own_pods=[], start_seconds=None).verdict == "proceed"
    assert decide(old, _deployment("L4"), ready=1, nodes=[], pods=[], own_pods=[],
                  start_seconds=None).verdict == "proceed"  # the same pods: no rollout
    surging = _deployment("H100", plan="p2", surge=1)
    assert decide(old, surging, ready=1, nodes=[], pods=[], own_pods=[], start_seconds=None).verdict == "proceed"


def test_an_edit_onto_a_full_pool_is_held_and_says_why() -> None:
    old, new = _deployment("L4"), _deployment("H100", plan="p2")
    held = decide(old, new, ready=1, nodes=[_node("h1", 1)], pods=[_pod("theirs", "h1", 1)], own_pods=["chat-a"],
                  start_seconds=None)
    assert held.verdict == "hold"
    assert "needs 1 GPU on a node of nvidia.com/gpu.product=H100" in held.message and "h1: 0 free" in held.message
    assert "stay on the previous profile" in held.message
    assert decide(old, new, ready=1, nodes=[], pods=[], own_pods=[], start_seconds=None).verdict == "hold"


def test_a_placeable_rollout_says_it_interrupts_with_the_measured_start() -> None:
    old, new = _deployment("L4"), _deployment("L4", plan="p2")
    # the only GPU is the serving pod's: it frees it first, so the new pod fits, after an interruption
    said = decide(old, new, ready=1, nodes=[_node("l1", 1)], pods=[_pod("chat-a", "l1", 1)], own_pods=["chat-a"],
                  start_seconds=212.4)
    assert said.verdict == "interrupt" and "about 212 s, the last measured start" in said.message
    assert "fits on l1" in said.message
    unmeasured = decide(old, new, ready=1, nodes=[_node("l1", 1)], pods=[], own_pods=[], start_seconds=None)
    assert "until the new pod is Ready" in unmeasured.message


def test_watching_some_namespaces_the_pods_there_are_counted(monkeypatch: Any) -> None:
    """Watching some namespaces only, the chart lets the operator list pods there, not everywhere: the nodes' pods
    are read in each watched namespace (never a cluster-wide list that would be refused)."""
    from vllm_operator.handlers import config, kube, placement

    calls: list[tuple[str | None, str | None]] = []

    def list_objects(resource: Any, namespace: str | None = None, label_selector: str | None = None,
                     field_selector: str | None = None) -> list[dict[str, Any]]:
        calls.append((namespace, field_selector))
        if resource is kube.NODES:
            return [_node("h1", 1)]
        assert namespace is not None, "a cluster-wide pod list the chart does not grant"
        return [_pod(f"theirs-{namespace}", "h1", 1)] if field_selector else []

    monkeypatch.setattr(kube, "list_objects", list_objects)
    monkeypatch.setattr(kube, "get", lambda *_a, **_k: _deployment("L4"))
    monkeypatch.setattr(config.CONFIG, "namespaces", ("team-a", "team-b"))
    current, nodes, pods, own = placement._observe("team-a", "chat", {"metadata": {"name": "chat"}, **_deployment(
        "H100", plan="p2")})
    assert current is not None and [n["metadata"]["name"] for n in nodes] == ["h1"]
    assert [p["metadata"]["name"] for p in pods] == ["theirs-team-a", "theirs-team-b"] and own == []
    assert ("team-a", "spec.nodeName=h1") in calls and ("team-b", "spec.nodeName=h1") in calls


# --- LeaderWorkerSet rollouts: a group at a time, without surge ---------------------------------------------------

def _lws(product: str, plan: str = "p1", gpus: int = 8, size: int = 2, surge: int | None = None) -> dict[str, Any]:
    template = _deployment(product, plan=plan, gpus=gpus)["spec"]["template"]
    strategy: dict[str, Any] = {"type": "RollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": 1}}
    if surge is not None:
        strategy["rollingUpdateConfiguration"]["maxSurge"] = surge
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "big"},
            "spec": {"replicas": 1, "rolloutStrategy": strategy,
                     "leaderWorkerTemplate": {"size": size, "leaderTemplate": template, "workerTemplate": template}}}


def test_a_group_rollout_onto_a_pool_without_room_for_a_whole_group_is_held() -> None:
    old, new = _lws("H100"), _lws("H200", plan="p2")
    nodes = [_node("h200-a", 8), _node("h200-b", 8)]
    # one H200 node is taken by another service: a group of two cannot start there; the serving group stays
    held = decide(old, new, ready=1, nodes=nodes, pods=[_pod("theirs", "h200-b", 8)], own_pods=["big-0", "big-0-1"],
                  start_seconds=None)
    assert held.verdict == "hold"
    assert "the new group needs 2 pods of 8 GPUs each on nodes of nvidia.com/gpu.product=H200 and 1 fits" in (
        held.message)
    assert "h200-a: 8 free, h200-b: 0 free" in held.message and "a group that would stay Pending" in held.message
    # both nodes free: it rolls, and says the one group's service is interrupted
    said = decide(old, new, ready=1, nodes=nodes, pods=[], own_pods=["big-0", "big-0-1"], start_seconds=300.0)
    assert said.verdict == "interrupt" and "stops the serving group" in said.message
    assert "about 300 s" in said.message and "fits on h200-a, h200-b" in said.message


def test_a_group_rollout_counts_the_gpus_the_replaced_group_frees() -> None:
    old, new = _lws("H100", plan="p1"), _lws("H100", plan="p2")
    nodes = [_node("a", 8), _node("b", 8)]
    mine = [_pod("big-0", "a", 8), _pod("big-0-1", "b", 8)]
    # the only nodes are the group's own: it frees them first, so the new group fits (after an interruption)
    assert decide(old, new, ready=1, nodes=nodes, pods=mine, own_pods=["big-0", "big-0-1"],
                  start_seconds=None).verdict == "interrupt"
    assert decide(old, new, ready=1, nodes=nodes, pods=mine, own_pods=[], start_seconds=None).verdict == "hold"
    # other groups keep serving while one rolls: nothing to say, it proceeds when the new group fits
    two = [*mine, _pod("big-1", "c", 8), _pod("big-1-1", "d", 8)]
    assert decide(old, new, ready=2, nodes=[*nodes, _node("c", 8), _node("d", 8)], pods=two,
                  own_pods=["big-1", "big-1-1"], start_seconds=None).verdict == "proceed"
    # ... and is held when it does not (the replaced group's nodes are the only ones, still short of the group)
    assert decide(_lws("H100", size=3), _lws("H100", plan="p2", size=3), ready=2, nodes=nodes, pods=[],
                  own_pods=[], start_seconds=None).verdict == "hold"


def test_group_rollouts_that_change_nothing_or_surge_proceed() -> None:
    old = _lws("H100")
    assert decide(old, _lws("H100"), ready=1, nodes=[], pods=[], own_pods=[], start_seconds=None).verdict == "proceed"
    assert decide(old, _lws("H100", plan="p2", surge=1), ready=1, nodes=[], pods=[], own_pods=[],
                  start_seconds=None).verdict == "proceed"
    assert decide(old, _lws("H100", plan="p2", surge=0), ready=1, nodes=[], pods=[], own_pods=[],
                  start_seconds=None).verdict == "hold"
    # a group size change is a new group, even with the same plan annotation
    assert decide(old, _lws("H100", size=3), ready=1, nodes=[], pods=[], own_pods=[],
                  start_seconds=None).verdict == "hold"


def test_a_held_group_rollout_keeps_the_leaderworkerset_and_says_why(monkeypatch: Any) -> None:
    """The shell: the LeaderWorkerSet as it is, the new pool's nodes and their pods, the group replaced first (the
    highest index); held → the LeaderWorkerSet is not applied, Progressing says RolloutHeld, one Warning Event."""
    from datetime import UTC, datetime

    from vllm_operator.api import conditions as cond
    from vllm_operator.api.v1alpha1 import PlanStatus, VLLMServiceStatus
    from vllm_operator.handlers import config, kube, placement
    from vllm_operator.reconcile import Desired
    from vllm_operator.render.lws import LWS_GROUP_INDEX_LABEL

    def own(name: str, group: str, node: str) -> dict[str, Any]:
        pod = _pod(name, node, 8)
        pod["metadata"]["labels"] = {LWS_GROUP_INDEX_LABEL: group}
        return pod

    mine = [own("big-0", "0", "h100-a"), own("big-0-1", "0", "h100-b"), own("big-1", "1", "h100-c"),
            own("big-1-1", "1", "h100-d")]

    def list_objects(resource: Any, namespace: str | None = None, label_selector: str | None = None,
                     field_selector: str | None = None) -> list[dict[str, Any]]:
        if resource is kube.NODES:
            assert label_selector == "nvidia.com/gpu.product=H200"
            return [_node("h200-a", 8)]
        return [] if field_selector else mine

    current = {**_lws("H100"), "status": {"readyReplicas": 1}}
    asked: list[Any] = []
    monkeypatch.setattr(kube, "list_objects", list_objects)
    monkeypatch.setattr(kube, "get", lambda resource, *_a, **_k: asked.append(resource) or current)
    monkeypatch.setattr(config.CONFIG, "namespaces", ())
    _, _, _, leaving = placement._observe("default", "big", _lws("H200", plan="p2"))
    assert leaving == ["big-1", "big-1-1"]  # the highest group goes first
    desired = Desired(status=VLLMServiceStatus(plan=PlanStatus(fits=True, spec_hash="new")),
                      children=[_lws("H200", plan="p2"), {"kind": "Service", "metadata": {"name": "big"}}])
    out = placement.guard("default", "big", {"plan": {"specHash": "old"}}, desired, datetime(2026, 1, 1, tzinfo=UTC))
    assert asked and set(asked) == {kube.LEADERWORKERSETS}  # never a Deployment read for a group
    assert [c["kind"] for c in out.children or []] == ["Service"]
    progressing = cond.find_condition(out.status.conditions, cond.PROGRESSING)
    assert progressing is not None and progressing.reason == "RolloutHeld"
    assert [e.reason for e in out.events] == ["RolloutHeld"]
    assert placement.held(out.status.model_dump(by_alias=True))
