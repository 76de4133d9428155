"""The simulated LeaderWorkerSet controller, and a model bigger than a node served end to end: the real operator
plans Llama-3.1-405B over two 8×H100 nodes (TP 8 × PP 2), renders one LeaderWorkerSet, the simulated controller
makes the group's pods, the simulated kubelet starts vLLM on both, and the service ends Ready."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_operator_sim.cluster import NodePool, SimulatedCluster
from vllm_operator_sim.lws import GROUP_INDEX, NAME, WORKER_INDEX, LWSController

LLAMA_405B = "meta-llama/Llama-3.1-405B-Instruct"


def _service(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def _condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def test_405b_on_two_h100_nodes_is_ready(tmp_path: Path) -> None:
    with SimulatedCluster([NodePool("H100-SXM-80GB", 8, 2)], speed=200, workdir=tmp_path) as cluster:
        cluster.start_operator()
        api = cluster.api
        cluster.apply(_service("big", {"model": {"name": LLAMA_405B}, "gpu": {"maxNodes": 2}}))

        def service() -> dict[str, Any] | None:
            return api.get_object("vllmservices", "big", "default")

        cluster.wait_for(lambda: _condition(service(), "Ready").get("status") == "True", timeout=90,
                         message="405B on 2x8 H100 never became Ready:\n" + cluster.operator_log()[-3000:])
        obj = service()
        assert obj is not None
        assert obj["status"]["multiNode"]["nodes"] == 2 and obj["status"]["gpu"]["nodes"] == 2
        assert _condition(obj, "Ready")["reason"] == "Available"
        pods = api.list_objects("pods", "default", label_selector=f"{NAME}=big")
        assert sorted(p["metadata"]["name"] for p in pods) == ["big-0", "big-0-1"]
        nodes = {p["spec"].get("nodeName") for p in pods}
        assert len(nodes) == 2  # one pod per node: each asks for all 8 GPUs
        worker = next(p for p in pods if p["metadata"]["name"] == "big-0-1")
        args = worker["spec"]["containers"][0]["args"]
        # the LWS env expanded like the kubelet does
        assert args[args.index("--node-rank") + 1] == "1" and args[args.index("--nnodes") + 1] == "2"
        assert args[args.index("--master-addr") + 1] == "big-0.big.default" and "--headless" in args
        env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
        assert env["LWS_WORKER_INDEX"] == "1" and env["LWS_GROUP_SIZE"] == "2"
        lws = api.get_object("leaderworkersets", "big", "default")
        assert lws is not None and lws["status"]["readyReplicas"] == 1
        assert [c["type"] for c in lws["status"]["conditions"]] == ["Available"]


class _FakeAPI:
    """Just enough of the emulator's direct API for the controller alone (pods, one LWS)."""

    def __init__(self, lws: dict[str, Any]) -> None:
        self.lws = lws
        self.pods: dict[str, dict[str, Any]] = {}
        self.uid = 0

    def list_objects(self, resource: str, namespace: str | None = None, *, label_selector: str | None = None,
                     field_selector: str | None = None) -> list[dict[str, Any]]:
        if resource == "leaderworkersets":
            return [self.lws]
        return list(self.pods.values())

    def create_object(self, resource: str, obj: Any, namespace: str | None = None) -> dict[str, Any]:
        self.uid += 1
        body = {**obj, "metadata": {**obj["metadata"], "uid": f"u{self.uid}"}}
        self.pods[body["metadata"]["name"]] = body
        return body

    def delete_object(self, resource: str, name: str, namespace: str | None = None, *,
                      propagation_policy: str | None = None) -> None:
        self.pods.pop(name, None)

    def patch_status(self, resource: str, name: str, status: Any, namespace: str | None = None) -> None:
        self.lws["status"] = dict(status)


def test_a_restart_on_any_rank_recreates_the_whole_group() -> None:
    lws = {"metadata": {"name": "big", "namespace": "default", "uid": "lws-1"},
           "spec": {"replicas": 2, "leaderWorkerTemplate": {
               "size": 3, "restartPolicy": "RecreateGroupOnPodRestart",
               "workerTemplate": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [
                   {"name": "vllm", "args": ["--node-rank", "$(LWS_WORKER_INDEX)", "--master-addr",
                                             "$(LWS_LEADER_ADDRESS)"]}]}}}}}
    api = _FakeAPI(lws)
    events: list[tuple[str, str]] = []
    controller = LWSController(api, on_event=lambda _ns, _n, reason, message: events.append((reason, message)))
    controller.control()
    assert sorted(api.pods) == ["big-0", "big-0-1", "big-0-2", "big-1", "big-1-1", "big-1-2"]
    assert api.pods["big-1-2"]["metadata"]["labels"][WORKER_INDEX] == "2"
    assert api.pods["big-1-2"]["spec"]["containers"][0]["args"] == ["--node-rank", "2", "--master-addr",
                                                                   "big-1.big.default"]
    assert lws["status"]["readyReplicas"] == 0 and lws["status"]["conditions"][0]["type"] == "Progressing"
    before = {n: p["metadata"]["uid"] for n, p in api.pods.items()}
    # a worker of group 1 restarts: group 1 goes (all three pods), group 0 stays
    api.pods["big-1-2"]["status"] = {"containerStatuses": [{"name": "vllm", "restartCount": 1}]}
    controller.control()
    assert events == [("RecreateGroup", "group 1 of big recreated: a pod of the group restarted")]
    assert sorted(api.pods) == ["big-0", "big-0-1", "big-0-2"]
    controller.control()  # the next pass makes the group again, with new pods
    assert sorted(api.pods) == ["big-0", "big-0-1", "big-0-2", "big-1", "big-1-1", "big-1-2"]
    assert api.pods["big-1"]["metadata"]["uid"] != before["big-1"]
    assert api.pods["big-0"]["metadata"]["uid"] == before["big-0"]
    assert {p["metadata"]["labels"][GROUP_INDEX] for p in api.pods.values()} == {"0", "1"}
    # every pod Ready: both groups ready, Available
    for pod in api.pods.values():
        pod["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    controller.control()
    assert lws["status"]["readyReplicas"] == 2 and lws["status"]["conditions"][0]["type"] == "Available"
    assert controller.recreations == {("default", "big"): 1}


def test_a_group_that_fails_for_memory_is_remediated_on_every_rank(tmp_path: Path) -> None:
    """The stages' GPUs hold more than the planner can see (hidden extra activation): vLLM's KV check fails on
    every rank; the ladder steps once (the same flags for the whole group), the LeaderWorkerSet is re-rendered,
    and the group comes up Ready."""
    from vllm_operator_sim.scenarios import Scenario, ScenarioSet
    from vllm_operator_sim.startup import HiddenFacts

    scenarios = ScenarioSet({"big": Scenario(name="big", hidden=HiddenFacts(extra_activation_gib=20.0))})
    with SimulatedCluster([NodePool("H100-SXM-80GB", 8, 2)], scenarios=scenarios, speed=200,
                          workdir=tmp_path) as cluster:
        cluster.start_operator()
        api = cluster.api
        cluster.apply(_service("big", {"model": {"name": LLAMA_405B}, "gpu": {"maxNodes": 2},
                                       "remediation": {"minIntervalSeconds": 0}}))

        def service() -> dict[str, Any] | None:
            return api.get_object("vllmservices", "big", "default")

        cluster.wait_for(lambda: _condition(service(), "Ready").get("status") == "True", timeout=90,
                         message="never Ready after remediation:\n" + cluster.operator_log()[-3000:])
        obj = service()
        assert obj is not None
        history = obj["status"]["remediation"]["history"]
        assert len(history) >= 1
        flags = obj["status"]["plan"]["flags"]
        assert flags["maxModelLen"] < 131072 and flags["pipelineParallelSize"] == 2
        # recorded before LWS deleted the group: each failed pod with its rank and pipeline stage
        failures = obj["status"]["multiNode"]["failures"]
        # every rank fails alike; LWS deletes the group on the first restart, so how many ranks' failures are seen
        # before that depends on timing — at least the first one is recorded, each with its own rank's stage
        recorded = {(f["nodeRank"], tuple(f["stages"]), f["failureClass"]) for f in failures}
        assert recorded and recorded <= {(0, (0,), "KVCacheTooSmall"), (1, (1,), "KVCacheTooSmall")}, failures
        assert obj["status"]["multiNode"]["leaders"]  # what recreations are counted against
        lws = api.get_object("leaderworkersets", "big", "default")
        assert lws is not None
        for role in ("leaderTemplate", "workerTemplate"):
            args = lws["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"][0]["args"]
            assert args[args.index("--max-model-len") + 1] == str(flags["maxModelLen"])
