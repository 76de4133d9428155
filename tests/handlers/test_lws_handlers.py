"""Multi-node services through the operator's kopf handlers over the emulated API: LeaderWorkerSet absent (a
condition naming how to install it), installed later (the LWS and the leaders' Service are applied), and the groups'
readiness folded into the service's status from the LWS and its pods.

The test plays the LWS controller (its status, a leader pod); the simulated controller is not part of this test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.inprocess import Cluster, condition, harness_fixture  # noqa: F401 (`harness`)
from vllm_operator.handlers import lws
from vllm_operator.render import multinode as render_multinode
from vllm_operator.render.pods import serving_pods

LWS_CRD = Path(__file__).resolve().parents[1] / "data" / "crds" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
LLAMA_405B = "meta-llama/Llama-3.1-405B-Instruct"
SPEC: dict[str, Any] = {"model": {"name": LLAMA_405B}, "gpu": {"maxNodes": 2}}


def _install_lws(h: Cluster) -> None:
    crd = next(d for d in yaml.safe_load_all(LWS_CRD.read_text()) if d)
    h.server.create_object("customresourcedefinitions", crd)
    lws.forget()  # the operator's cached discovery answer (30 s) would hide it for a while


def _lws(h: Cluster, name: str) -> dict[str, Any] | None:
    return h.server.get_object("leaderworkersets", name, "default")


def test_lws_absent_then_installed_then_ready(harness: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness
    lws.forget()
    monkeypatch.setattr(render_multinode, "LWS_RECHECK_SECONDS", 1.0)  # production: 60 s
    for i in (1, 2):
        h.add_node(f"h100-{i}", "NVIDIA-H100-80GB-HBM3", count=8)
    h.create("big", SPEC)
    obj = h.wait_condition("big", "Degraded", "True", "LeaderWorkerSetNotInstalled")
    message = condition(obj, "Degraded")["message"]  # type: ignore[index]
    assert "helm install lws oci://registry.k8s.io/lws/charts/lws --version=0.10.0" in message
    assert obj["status"]["multiNode"]["nodes"] == 2
    assert obj["status"]["gpu"]["nodes"] == 2 and obj["status"]["gpu"]["count"] == 8
    assert h.deployment("big") is None
    assert h.wait_events("big", "LeaderWorkerSetNotInstalled")

    _install_lws(h)
    # no spec change: the waiting service is re-checked on its own and finds the API
    created = h.wait_for(lambda: _lws(h, "big"), message="the LeaderWorkerSet")
    lwt = created["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2 and lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader_args = lwt["leaderTemplate"]["spec"]["containers"][0]["args"]
    assert "--nnodes" in leader_args and "--headless" not in leader_args
    assert "--headless" in lwt["workerTemplate"]["spec"]["containers"][0]["args"]
    service = h.wait_for(lambda: h.k8s_service("big"), message="the leaders' Service")
    assert service["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": "big",
                                           "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    assert h.deployment("big") is None
    h.wait_condition("big", "Degraded", "False")

    # play the LWS controller: one group ready, Available; a Ready leader pod of ours
    h.server.patch_status("leaderworkersets", "big", {"replicas": 1, "readyReplicas": 1, "conditions": [
        {"type": "Available", "status": "True", "reason": "AllGroupsReady", "message": "All replicas are ready",
         "lastTransitionTime": "2025-01-01T00:00:00Z"}]}, "default")
    def pod(name: str, index: int, role: str) -> None:
        labels = {**lwt[role]["metadata"]["labels"], "leaderworkerset.sigs.k8s.io/name": "big",
                  "leaderworkerset.sigs.k8s.io/worker-index": str(index),
                  "leaderworkerset.sigs.k8s.io/group-index": "0"}
        h.server.create_object("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": "default", "labels": labels}, "spec": lwt[role]["spec"]}, "default")
        h.server.patch_status("pods", name, {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}, "default")

    pod("big-0", 0, "leaderTemplate")
    h.wait_condition("big", "Ready", "False", "PodsNotReady")  # the leader alone is not a group
    pod("big-0-1", 1, "workerTemplate")
    ready = h.wait_condition("big", "Ready", "True", "Available")
    assert "1/1 groups of 2 pods ready" in condition(ready, "Ready")["message"]  # type: ignore[index]
    # kopf's watch on LeaderWorkerSets (handlers/registry.py): said once while the CRD was missing, no crash, no spam
    unresolved = [line for line in h.operator_log(100_000).splitlines() if "Unresolved resources" in line]
    assert len(unresolved) == 1 and "leaderworkersets" in unresolved[0], unresolved
    assert h.running and h.accessed("watch", "leaderworkersets")  # watched since the CRD appeared


LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


def _ready_deployment(h: Cluster, name: str) -> None:
    """Play the Deployment controller: every replica of the current generation ready."""
    d = h.server.get_object("deployments", name, "default")
    n = d["spec"].get("replicas", 1)
    h.server.patch_status("deployments", name, {"observedGeneration": d["metadata"]["generation"], "replicas": n,
                                                "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n},
                          "default")


def _ready_lws(h: Cluster, name: str) -> None:
    """Play the LWS controller: every group ready, and a Ready leader pod (its event is what the operator sees)."""
    lws_obj = _lws(h, name)
    assert lws_obj is not None
    n = lws_obj["spec"].get("replicas", 1)
    h.server.patch_status("leaderworkersets", name, {"replicas": n, "readyReplicas": n, "updatedReplicas": n},
                          "default")
    lwt = lws_obj["spec"]["leaderWorkerTemplate"]
    labels = {**lwt["leaderTemplate"]["metadata"]["labels"], "leaderworkerset.sigs.k8s.io/name": name,
              "leaderworkerset.sigs.k8s.io/worker-index": "0", "leaderworkerset.sigs.k8s.io/group-index": "0"}
    h.server.create_object("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{name}-0", "namespace": "default", "labels": labels}, "spec": lwt["leaderTemplate"]["spec"]},
        "default")
    h.server.patch_status("pods", f"{name}-0", {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}, "default")


def test_moving_between_a_deployment_and_a_leaderworkerset_deletes_the_old_child(harness: Cluster) -> None:
    """A plan that starts spanning nodes (or stops) changes the workload's kind: make before break — the new child
    is applied and the plan recorded, the Service keeps selecting the old workload's pods until the new one is
    Ready, then it switches (exactly the new selector: no key of the old one left) and the old workload — this
    service's own — is deleted (no orphan keeps GPUs)."""
    h = harness
    _install_lws(h)
    for i in (1, 2):
        h.add_node(f"h100-{i}", "NVIDIA-H100-80GB-HBM3", count=8)
    h.create("big", {"model": {"name": LLAMA_70B}, "gpu": {"maxNodes": 2}})   # fits one node: a Deployment
    h.wait_for(lambda: h.deployment("big"), message="the Deployment")
    deployment_selector = h.wait_for(lambda: h.k8s_service("big"), message="the Service")["spec"]["selector"]
    assert _lws(h, "big") is None

    h.patch_spec("big", {"model": {"name": LLAMA_405B}})   # no longer fits one node: a LeaderWorkerSet
    h.wait_for(lambda: _lws(h, "big"), message="the LeaderWorkerSet")
    h.wait_for(lambda: h.service("big")["status"]["gpu"].get("nodes") == 2 or None, message="the plan recorded")
    h.wait_settled("big")
    assert h.deployment("big") is not None  # still serving: the LWS is not Ready
    assert h.k8s_service("big")["spec"]["selector"] == deployment_selector

    _ready_lws(h, "big")
    h.wait_for(lambda: h.deployment("big") is None or None, message="the Deployment deleted")
    assert h.k8s_service("big")["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": "big",
                                                        "leaderworkerset.sigs.k8s.io/worker-index": "0"}

    h.patch_spec("big", {"model": {"name": LLAMA_70B}})    # back on one node
    h.wait_for(lambda: h.deployment("big"), message="the Deployment again")
    h.wait_settled("big")
    assert _lws(h, "big") is not None
    assert h.k8s_service("big")["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    _ready_deployment(h, "big")
    h.wait_for(lambda: _lws(h, "big") is None or None, message="the LeaderWorkerSet deleted")
    assert h.k8s_service("big")["spec"]["selector"] == deployment_selector  # the LWS keys are gone
    assert (h.service("big")["status"]["gpu"].get("nodes") or 1) == 1


def deleted(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("deleted ")]


def test_only_an_owned_old_child_is_deleted(harness: Cluster) -> None:
    from vllm_operator.handlers import effects

    h = harness
    _install_lws(h)
    h.add_node("h100-1", "NVIDIA-H100-80GB-HBM3", count=8)
    h.create("solo", {"model": {"name": LLAMA_70B}})
    deployment = h.wait_for(lambda: h.deployment("solo"), message="the Deployment")
    labels = deployment["metadata"]["labels"]
    for name, meta in (("solo", {"labels": labels}),   # our labels, no ownerReference
                       ("solo", {"labels": {}, "ownerReferences": deployment["metadata"]["ownerReferences"]})):
        h.server.create_object("leaderworkersets", {
            "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": "default", **meta},
            "spec": {"leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {"containers": [
                {"name": "x", "image": "busybox"}]}}}}}, "default")
        assert deleted(effects.apply_children([deployment], "default")) == []
        assert _lws(h, name) is not None
        h.server.delete_object("leaderworkersets", name, "default")
    # ours (labels and ownerReference): deleted
    h.server.create_object("leaderworkersets", {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "solo", "namespace": "default", "labels": labels,
                     "ownerReferences": deployment["metadata"]["ownerReferences"]},
        "spec": {"leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {"containers": [
            {"name": "x", "image": "busybox"}]}}}}}, "default")
    # ours, but the Deployment that replaces it is not Ready yet: it keeps serving
    assert deleted(effects.apply_children([deployment], "default")) == []
    assert _lws(h, "solo") is not None
    _ready_deployment(h, "solo")  # the Deployment's event finishes the switch (or this call, whichever is first)
    assert deleted(effects.apply_children([h.deployment("solo")], "default")) in (
        [], ["deleted LeaderWorkerSet solo: replaced by a Deployment"])
    h.wait_for(lambda: _lws(h, "solo") is None or None, message="the replaced LeaderWorkerSet deleted")


def test_during_a_switch_the_rollout_and_the_groups_agree_on_ready(harness: Cluster) -> None:
    """Both workloads exist while a Deployment → LeaderWorkerSet switch waits for the group: the Deployment's rollout
    (a Ready Deployment: on its own it says Available) and the LeaderWorkerSet's groups (none ready) fold their
    conditions through one decision (api.serving), in any order, as often as their events come, and the reconcile
    says the same: Ready is False, the previous Deployment still serving, until the switch is done."""
    from vllm_operator.handlers import rollouts

    h = harness
    _switch_to_groups(h)
    record = h.service("big")["status"]["workloadSwitch"]
    assert record == {"previous": "Deployment", "target": "LeaderWorkerSet", "step": "WaitReady"}
    said = [(str(c["status"]), str(c["reason"]), str(c["message"]))  # the reconcile's, before either refresh
            for c in [condition(h.service("big"), "Ready") or {}]]
    for refresh in (lambda: rollouts.refresh("default", "big"), lambda: lws.refresh("default", "big"),
                    lambda: rollouts.refresh("default", "big"), lambda: lws.refresh("default", "big")):
        refresh()
        ready = condition(h.service("big"), "Ready")
        assert ready is not None
        said.append((ready["status"], ready["reason"], ready["message"]))
    assert len({(s, r) for s, r, _ in said}) == 1 and len(set(said[2:])) == 1, said
    status, reason, message = said[0]
    assert (status, reason) == ("False", "ServingPreviousProfile")
    assert message.startswith("the previous Deployment big still serves (1 pod ready) until the LeaderWorkerSet is "
                              "Ready: "), message
    assert h.deployment("big") is not None
    # the scale subresource's selector (the HPA's pods) stays on the pods that serve
    assert h.service("big")["status"]["selector"] == serving_pods("big", "default", multinode=False).label_selector()

    _ready_lws(h, "big")
    h.wait_for(lambda: h.deployment("big") is None or None, message="the Deployment deleted")
    lws.refresh("default", "big")  # the group's own word again (this test plays a leader without its worker)
    assert condition(h.service("big"), "Ready")["reason"] != "ServingPreviousProfile"  # type: ignore[index]
    assert "workloadSwitch" not in h.service("big")["status"]
    assert h.service("big")["status"]["selector"] == serving_pods("big", "default", multinode=True).label_selector()


def _switch_to_groups(h: Cluster) -> dict[str, Any]:
    """A Ready one-node service `big` (70B, a Deployment) edited to 405B over two H100 nodes: the LeaderWorkerSet
    it switches to, once the reconcile has settled (the switch waits for the group)."""
    _install_lws(h)
    for i in (1, 2):
        h.add_node(f"h100-{i}", "NVIDIA-H100-80GB-HBM3", count=8)
    h.create("big", {"model": {"name": LLAMA_70B}, "gpu": {"maxNodes": 2}})
    h.wait_for(lambda: h.deployment("big"), message="the Deployment")
    _ready_deployment(h, "big")
    h.wait_condition("big", "Ready", "True", "Available")
    h.patch_spec("big", {"model": {"name": LLAMA_405B}})
    created: dict[str, Any] = h.wait_for(lambda: _lws(h, "big"), message="the LeaderWorkerSet")
    h.wait_settled("big")
    return created


@pytest.fixture
def no_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog's first round an hour after the operator starts (it is 60 s): what finishes the switch below can
    only be an event, so the test needs no wall-clock bound to tell it from the sweep."""
    from vllm_operator.handlers import watchdog

    monkeypatch.setattr(watchdog, "WATCHDOG_INITIAL_DELAY", 3600.0)


def test_a_switch_finishes_on_the_leaderworkersets_own_status(no_watchdog: None, harness: Cluster,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The LWS controller counts a group ready after its pods are Ready (as the real one does): the pods' events come
    first and find `status.readyReplicas` still 0. The switch from the Deployment then finishes on the
    LeaderWorkerSet's own status change — not at the watchdog's next round (off here)."""
    h = harness
    created = _switch_to_groups(h)
    assert h.service("big")["status"]["workloadSwitch"]["step"] == "WaitReady"

    # every pod event handled, and whether its pod was Ready then: a pod's last event is its Ready one
    from vllm_operator.handlers import service as service_handlers

    real_pod_event, handled = service_handlers.pod_event, []

    def counted(body: Any, **kwargs: Any) -> None:
        real_pod_event(body=body, **kwargs)
        handled.append((body["metadata"]["name"], any(c.get("type") == "Ready" and c.get("status") == "True"
                                                      for c in (body.get("status") or {}).get("conditions") or [])))

    monkeypatch.setattr(service_handlers, "pod_event", counted)
    lwt = created["spec"]["leaderWorkerTemplate"]
    pods = ("big-0", 0, "leaderTemplate"), ("big-0-1", 1, "workerTemplate")
    for name, index, role in pods:
        labels = {**lwt[role]["metadata"]["labels"], "leaderworkerset.sigs.k8s.io/name": "big",
                  "leaderworkerset.sigs.k8s.io/worker-index": str(index), "leaderworkerset.sigs.k8s.io/group-index": "0"}
        h.server.create_object("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": "default", "labels": labels}, "spec": lwt[role]["spec"]}, "default")
        h.server.patch_status("pods", name, {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}, "default")
    # barrier: every pod's last (Ready) event handled — each refreshed the groups — while the LWS counts none ready
    h.wait_for(lambda: all((name, True) in handled for name, _, _ in pods) or None,
               message="the Ready pods' events handled")
    assert h.deployment("big") is not None  # the pods alone do not finish it: the LWS's count does
    assert h.service("big")["status"]["workloadSwitch"]["step"] == "WaitReady"

    # the LWS controller catches up: its status event alone finishes the switch
    h.server.patch_status("leaderworkersets", "big", {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1},
                          "default")
    h.wait_for(lambda: h.deployment("big") is None or None, message="the Deployment deleted on the LWS's status")
    assert h.k8s_service("big")["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": "big",
                                                        "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    h.wait_for(lambda: "workloadSwitch" not in h.service("big")["status"] or None, message="the switch record gone")
    h.wait_condition("big", "Ready", "True")
    h.wait_quiet(1.0)  # no loop: the refresh writes the service's status, never the LeaderWorkerSet
