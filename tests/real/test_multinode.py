"""Scenario 6: vLLM's native multi-node mode on the CPU build, through the operator. A VLLMService for a model one L4
cannot hold (13B parameters in bfloat16, `maxNodes: 2` on the cluster's one-GPU L4 nodes) makes the operator render a
LeaderWorkerSet group of two (pipeline parallel 2: `--nnodes 2 --node-rank $(LWS_WORKER_INDEX) --master-addr
$(LWS_LEADER_ADDRESS) --master-port 29501`, `--headless` on the worker). The simulated LeaderWorkerSet controller
creates the leader and worker pods with the variables expanded as the kubelet does; the simulated kubelet runs both
vLLM containers as real processes, with the command lines the operator rendered changed only as realvllm.MAPPED says:

* the model: the processes load the tiny Llama (``realkit.LOADS``), not the 13B configuration the operator planned
  for (2 cores cannot run 13B parameters; the planner needs them to choose a group of two);
* ``--master-addr group-0.group.default`` → 127.0.0.1 and ``--master-port 29501`` → a free loopback port shared by
  the group's two ranks: in a cluster the address is the leader pod's own DNS name and 29501 is free in its network
  namespace; here both ranks, and every other pod, share this machine's.

The leader is Ready when its real /health answers (its startup probe), which vLLM's API server does only once the
engine with both pipeline stages is up; the worker has no probe, so Kubernetes counts it Ready once it runs. The
VLLMService becomes Ready through the real operator process and serves a completion through its Service's port.
"""

from __future__ import annotations

import pytest
import requests
from realkit import GROUP_MODEL, RealCluster, inline_config, tiny_spec, until

from kit.specs import vllmservice

pytestmark = pytest.mark.timeout(900)
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_a_multi_node_vllmservice_is_ready_on_two_real_ranks_under_the_kubelet_and_serves_a_completion(
        real: RealCluster) -> None:
    spec = {"model": {"name": GROUP_MODEL, "config": inline_config(GROUP_MODEL)}, "image": tiny_spec()["image"],
            "gpu": {"product": "NVIDIA-L4", "maxNodes": 2}}
    real.cluster.apply(vllmservice(spec, name="group"))
    try:
        obj = real.wait_ready("group")
        assert real.api.get_object("leaderworkersets.leaderworkerset.x-k8s.io", "group", "default") is not None
        pods = {p["metadata"]["labels"][WORKER_INDEX]: p for p in real.pods("group")}
        assert set(pods) == {"0", "1"}, sorted(pods)
        leader, worker = pods["0"], pods["1"]
        assert leader["spec"]["nodeName"] != worker["spec"]["nodeName"]  # one rank per one-GPU node
        # the rendered ranks, as the LeaderWorkerSet controller expanded them
        rendered = {i: [*p["spec"]["containers"][0]["command"], *p["spec"]["containers"][0]["args"]]
                    for i, p in pods.items()}
        for i, argv in rendered.items():
            assert _flag(argv, "--nnodes") == "2" and _flag(argv, "--node-rank") == i, argv
            assert _flag(argv, "--master-addr") == "group-0.group.default", argv
            assert _flag(argv, "--pipeline-parallel-size") == "2", argv
        assert "--headless" in rendered["1"] and "--headless" not in rendered["0"]
        # both containers run as real processes, which meet on loopback at one port of their own
        runs = {i: next(r for r in real.runner.runs.values() if r.uid == p["metadata"]["uid"]) for i, p in pods.items()}
        assert all(r.process.poll() is None for r in runs.values())
        assert _flag(runs["0"].argv, "--master-addr") == _flag(runs["1"].argv, "--master-addr") == "127.0.0.1"
        assert _flag(runs["0"].argv, "--master-port") == _flag(runs["1"].argv, "--master-port") != "29501"
        assert runs["0"].ready  # the leader's /health, through its startup probe
        assert not real.runner.health(worker["metadata"]["uid"])[0]  # a headless worker serves no HTTP ...
        assert {c["type"]: c["status"] for c in worker["status"]["conditions"]}["Ready"] == "True"  # ... no probe
        worker_log = real.pod_log(worker["metadata"]["name"])
        assert "headless multiproc executor" in worker_log and "APIServer" not in worker_log, worker_log[-2000:]
        assert "version 0." in real.pod_log(leader["metadata"]["name"])
        # a completion through the Service's port: the Service selects the leader, the pair runs both stages
        proxy = real.proxy("group")
        try:
            assert until(proxy.endpoints, 30, "the Service has an endpoint") == [
                (leader["metadata"]["name"], runs["0"].port)]
            answer = requests.post(f"{proxy.url}/v1/completions", timeout=120, json={
                "model": GROUP_MODEL, "prompt": [1, 5, 7, 9], "max_tokens": 4, "temperature": 0}).json()
            assert answer["usage"]["completion_tokens"] == 4, answer
            assert "pp2" in answer.get("system_fingerprint", ""), answer
        finally:
            proxy.close()
        assert all(r.process.poll() is None for r in runs.values())
        assert obj["status"]["readyReplicas"] == 1, obj["status"]  # one group
    finally:
        real.delete("group")
