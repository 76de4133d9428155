"""benchmarks/restarts_to_ready.py's baselines for a plan that spans nodes: (a) vLLM's defaults and (b) the manual
recipe run as one LeaderWorkerSet group, every node with its own stages (the simulator's per-rank startup)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from vllm_operator.api.v1alpha1 import DEFAULT_IMAGE
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator.sources import load_model_files
from vllm_operator_sim.kubelet import CREATE_S, SCHEDULE_S
from vllm_operator_sim.scenarios import load_scenarios
from vllm_operator_sim.startup import simulate_startup

ROOT = Path(__file__).resolve().parents[2]
MODEL = "meta-llama/Llama-3.1-405B-Instruct"


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("restarts_to_ready", ROOT / "benchmarks" / "restarts_to_ready.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["restarts_to_ready"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


BENCH = _benchmark()


def group(scenario: str) -> Any:
    hidden = load_scenarios().get(scenario).hidden
    return BENCH.GroupAttempts(MODEL, DEFAULT_IMAGE, "H100-SXM-80GB", 8, hidden, 1800.0, pp=2, nodes=2)


def test_each_node_gets_the_multi_node_flags_the_operator_renders() -> None:
    base = BENCH._args(MODEL, 8, 4096)
    leader, worker = (BENCH.node_args(base, 2, 2, rank) for rank in (0, 1))
    assert leader[leader.index("--node-rank") + 1] == "0" and "--headless" not in leader
    assert worker[worker.index("--node-rank") + 1] == "1" and worker[-1] == "--headless"
    for words in (leader, worker):
        assert words[words.index("--nnodes") + 1] == "2" and words[words.index("--pipeline-parallel-size") + 1] == "2"


def test_a_failed_group_counts_the_nodes_that_failed_and_costs_one_recreation() -> None:
    attempts = group("llama-405b-tight")  # 20 GiB of hidden activation per GPU: vLLM's defaults cannot start
    hidden = load_scenarios().get("llama-405b-tight").hidden
    gpu, files = load_gpu_catalog().get("H100-SXM-80GB"), load_model_files(MODEL, offline=True)
    runs = [simulate_startup(BENCH.node_args(BENCH._args(MODEL, 8, None), 2, 2, rank), DEFAULT_IMAGE, gpu, hidden,
                             files, gpu_count=8) for rank in (0, 1)]
    own = [run for run in runs if not run.starts and not BENCH._waited_for_a_peer(run)]
    assert own, "the scenario's group must fail on at least one node of its own"
    before = attempts.t
    assert attempts.start(None) is False
    assert attempts.failures == len(own)
    # LeaderWorkerSet recreates the group once the failed container restarts: the first back-off (10 s), new pods
    assert attempts.t - before == min(run.duration_s for run in own) + 10.0 + SCHEDULE_S + CREATE_S


def test_a_group_that_starts_is_ready_when_its_slowest_node_is() -> None:
    attempts = group("llama-405b")
    before = attempts.t
    assert attempts.start(4096) is True and attempts.failures == 0
    hidden = load_scenarios().get("llama-405b").hidden
    gpu, files = load_gpu_catalog().get("H100-SXM-80GB"), load_model_files(MODEL, offline=True)
    runs = [simulate_startup(BENCH.node_args(BENCH._args(MODEL, 8, 4096), 2, 2, rank), DEFAULT_IMAGE, gpu, hidden,
                             files, gpu_count=8) for rank in (0, 1)]
    assert attempts.t - before == max(run.duration_s for run in runs)
