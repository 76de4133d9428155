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
