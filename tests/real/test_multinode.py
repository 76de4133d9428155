"""Scenario 6: vLLM's native multi-node mode on the CPU build. The operator renders a LeaderWorkerSet group of two for
a model one L4 cannot hold (pipeline parallel 2 over two one-GPU nodes: `--nnodes 2 --node-rank $(LWS_WORKER_INDEX)
--master-addr $(LWS_LEADER_ADDRESS) --master-port 29501`, `--headless` on the worker); its leader's and its worker's
command lines, with the variables LeaderWorkerSet injects expanded as the kubelet does, run as two real processes
(the tiny model; the master address is loopback and the master port a free one, as realvllm.MAPPED says); the pair
serves one completion, the worker without an API server.

What this does not do: run the group's pods through the simulated kubelet under the operator process (the pods'
readiness would need a rule for the headless worker, which serves no /health). The rendering is the operator's own
(`reconcile.desired_state`, what it writes for the VLLMService); the processes are real.
"""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from realkit import IMAGE, READY_S, until

from kit.ports import HOST, free_port
from vllm_operator import reconcile
from vllm_operator.modelfiles import model_files_from_inline
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator_sim.cluster import gpu_node
from vllm_operator_sim.realvllm import RealVLLM, tiny_llama_config, write_model_dir

pytestmark = pytest.mark.timeout(900)
GROUP_MODEL = "acme/llama-13b-like"
#: 13B parameters (26 GB in bfloat16): one L4 cannot hold it, two can.
GROUP_CONFIG = {**tiny_llama_config(), "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 40,
                "num_hidden_layers": 40, "intermediate_size": 13824, "vocab_size": 32000}


def _group_commands() -> dict[int, tuple[list[str], dict[str, str]]]:
    """worker index → (command + args, literal env) of the vLLM container the operator renders for each rank."""
    nodes = [gpu_node(f"gpu-l4-{i}", load_gpu_catalog().get("L4"), 1)["metadata"]["labels"] for i in range(2)]
    spec = {"model": {"name": GROUP_MODEL, "config": GROUP_CONFIG}, "gpu": {"product": "NVIDIA-L4", "maxNodes": 2},
            "image": IMAGE}
    observed = reconcile.Observed(name="group", namespace="default", uid="uid-1", generation=1, spec=spec, status={},
                                  now=datetime.now(UTC), model_files=model_files_from_inline(GROUP_CONFIG, None,
                                                                                              GROUP_MODEL),
                                  nodes=nodes, lws_installed=True)
    desired = reconcile.desired_state(observed)
    [lws] = [c for c in desired.children or [] if c["kind"] == "LeaderWorkerSet"]
    group = lws["spec"]["leaderWorkerTemplate"]
    size = int(group["size"])
    assert size == 2, group
    commands = {}
    for index, template in ((0, group.get("leaderTemplate") or group["workerTemplate"]), (1, group["workerTemplate"])):
        [container] = [c for c in template["spec"]["containers"] if c["name"] == "vllm"]
        injected = {"LWS_LEADER_ADDRESS": "group-0.group.default", "LWS_GROUP_SIZE": str(size),
                    "LWS_WORKER_INDEX": str(index)}
        env = {**injected, **{e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}}
        command = [re.sub(r"\$\((\w+)\)", lambda m, e=env: e.get(m.group(1), m.group(0)), part)  # type: ignore[misc]
                   for part in [*container["command"], *container["args"]]]
        commands[index] = (command, env)
    return commands


def test_the_rendered_leader_and_headless_worker_serve_one_completion_on_the_cpu_build(tmp_path: Path) -> None:
    commands = _group_commands()
    leader, worker = commands[0][0], commands[1][0]
    assert "--headless" in worker and "--headless" not in leader
    assert leader[leader.index("--node-rank") + 1] == "0" and worker[worker.index("--node-rank") + 1] == "1"
    assert leader[leader.index("--nnodes") + 1] == worker[worker.index("--nnodes") + 1] == "2"
    port = str(free_port())  # the rendered --master-port (29501), free on this shared machine
    runner = RealVLLM(sys.executable, tmp_path, {GROUP_MODEL: write_model_dir(tmp_path / "tiny", tiny_llama_config())},
                      max_processes=2)
    try:
        runs: dict[int, Any] = {}
        for index, (command, env) in commands.items():
            args = [port if i > 0 and command[i - 1] == "--master-port" else part for i, part in enumerate(command)]
            runs[index] = runner.start("default", f"group-0{'-1' if index else ''}", f"uid-{index}", "group", args,
                                       env)
            assert runs[index] is not None
        until(lambda: runner.poll("uid-0")[0] == "ready" or runner.poll("uid-0")[0] == "exited", READY_S,
              "the leader's /health")
        assert runner.poll("uid-0")[0] == "ready", runner.log("uid-0")[-3000:]
        assert runner.poll("uid-1")[0] == "starting", runner.log("uid-1")[-3000:]  # headless: alive, no /health
        answer = requests.post(f"http://{HOST}:{runs[0].port}/v1/completions", timeout=120, json={
            "model": GROUP_MODEL, "prompt": [1, 5, 7, 9], "max_tokens": 4, "temperature": 0}).json()
        assert answer["usage"]["completion_tokens"] == 4, answer
        assert "pp2" in answer.get("system_fingerprint", ""), answer
        assert runs[1].process.poll() is None
        worker_log = runner.log("uid-1")
        assert "APIServer" not in worker_log and "Application startup" not in worker_log, worker_log[-2000:]
    finally:
        runner.stop_all()
        assert not runner.leftovers()
