"""A container's first death, before the kubelet restarts it: `state.terminated`, no `lastState`, restartCount 0.
`kubectl logs --previous` has no previous run then (the API server answers 400), and the dead run's log is the
current one. vLLM 0.32 prints its KV-cache refusal ~60 lines above the end of its log (the API server's traceback
follows), out of the 2 KB termination message: the operator must read the current log to see it. Found by the real
tier (tests/real/test_startup_failure.py); the log below is the end of a real vLLM 0.32.0 (CPU build) run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.inprocess import Cluster, args_of, flag, history, kubelet_termination_message, vllm_container
from vllm_operator_sim.realvllm import tiny_llama_config

REAL_LOG = Path(__file__).resolve().parents[1] / "real" / "data" / "vllm-0.32.0-cpu-kv-refusal.log"
NAME = "long"
#: The model of that run (tests/real: a tiny Llama claiming a 2,097,152-token context), declared inline.
MODEL = {"name": "acme/tiny-llama-long", "config": tiny_llama_config(max_position_embeddings=2_097_152)}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    env = Cluster(tmp_path)
    try:
        yield env
    finally:
        env.close()


def test_a_first_death_is_read_from_the_current_log_when_there_is_no_previous_run(cluster: Cluster) -> None:
    log = REAL_LOG.read_text()
    message = kubelet_termination_message(log)
    assert "KV cache" not in message and "Engine core initialization failed" in message  # the 2 KB end is vague
    cluster.add_gpu_node(count=1, memory="64Gi")
    cluster.start_operator()
    cluster.create_service(NAME, {"model": MODEL, "gpu": {"product": "NVIDIA-L4"}, "image": "vllm/vllm-openai:v0.32.0",
                                  "remediation": {"minIntervalSeconds": 0}})
    deployment = cluster.wait_deployment(NAME)
    # the full context fits as planned (2097152): rendered as vLLM's auto-fit (planner/plan.py::_operator_auto)
    assert flag(args_of(deployment), "--max-model-len") == "auto"
    cluster.server.set_pod_log(cluster.namespace, "long-7d9f-first", log, container="vllm")
    status = cluster.crashed_status(vllm_container(deployment)["image"], restart_count=0, message=message,
                                    reason="Error", exit_code=1, ready_before=False)
    container = status["containerStatuses"][0]
    container["state"], container["lastState"] = {"terminated": container["lastState"]["terminated"]}, {}
    cluster._pod_of(deployment, "long-7d9f-first", status)

    obj = cluster.wait_history(NAME, 1)
    [entry] = history(obj)
    assert entry["failureClass"] == "KVCacheTooSmall", entry
    after = cluster.wait_deployment(NAME, lambda d: args_of(d) != args_of(deployment))
    assert int(flag(args_of(after), "--max-model-len") or 0) <= 1048448
