"""The real tier (`make test-real`): real vLLM processes (the CPU build of vLLM 0.32.0) under the real operator
process, in the simulated cluster.

The cluster is :class:`~vllm_operator_sim.cluster.SimulatedCluster` on a clock that runs at real speed (a real
process takes real seconds), with three one-GPU L4 nodes. Its kubelet is given a
:class:`~vllm_operator_sim.realvllm.RealVLLM`, so the vLLM container of a pod whose model is one of :data:`MODELS`
runs as a real process: the command line the operator rendered, rewritten only as ``realvllm.MAPPED`` lists (printed
at the start of the session). What is mapped, and why:

* the model: the VLLMService declares its model inline (``spec.model.config``: the tiny Llama of
  ``realvllm.tiny_llama_config``), so the operator plans for exactly the model the process loads; the process gets a
  local directory holding that config.json, with ``--load-format dummy --skip-tokenizer-init`` (no weights, no
  tokenizer exist here, and 2 cores cannot run a real checkpoint);
* the KV cache: the CPU build sizes it from ``VLLM_CPU_KVCACHE_SPACE`` (GiB) and ignores
  ``--gpu-memory-utilization``; one token of the tiny model's KV cache is 1 KiB, so 1 GiB holds 1,048,576 tokens;
* host and port: loopback, a free port per process (the Service's port is a :class:`ServiceProxy`).

Only collected where vLLM is importable (`.venv-real`, made by `make test-real`); `make test` never sees it.
At most two real processes run at once (the runner's limit; each is ~3 GiB); each test deletes its VLLMService and
waits for its processes (and their EngineCore/Worker children) to be gone.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:  # the ordinary suite's venv: nothing here is collected
    collect_ignore_glob = ["test_*.py"]

from realkit import ECHOED, LOADS, MODELS, RealCluster, echo  # noqa: E402

from vllm_operator_sim.cluster import NodePool, SimulatedCluster  # noqa: E402
from vllm_operator_sim.realvllm import MAPPED, RealVLLM, write_model_dir  # noqa: E402


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if ECHOED:
        terminalreporter.section("real vLLM processes (version banners, KV cache lines)")
        for line in ECHOED:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {name: write_model_dir(root / name.replace("/", "--"), LOADS.get(name, config))
            for name, config in MODELS.items()}


@pytest.fixture(scope="session")
def kv_space() -> dict[str, int]:
    """VLLM_CPU_KVCACHE_SPACE (whole GiB) per VLLMService name (1 GiB when a test sets none)."""
    return {}


@pytest.fixture(scope="session")
def real(tmp_path_factory: pytest.TempPathFactory, model_dirs: dict[str, Path],
         kv_space: dict[str, int]) -> Iterator[RealCluster]:
    workdir = tmp_path_factory.mktemp("real-vllm")
    for rendered, why in MAPPED:
        echo(f"[real vLLM mapping] {rendered}: {why}")
    runner = RealVLLM(sys.executable, workdir, model_dirs, kvcache_gib=lambda _ns, svc: kv_space.get(svc, 1),
                      max_processes=2, echo=echo)
    cluster = SimulatedCluster(pools=[NodePool("L4", 1, 3)], speed=1.0, image_pull_s=1.0,
                               workdir=tmp_path_factory.mktemp("cluster"))
    cluster.kubelet.real = runner

    def interrupted(signum: int, _frame: Any) -> None:  # a CI timeout's SIGTERM: still stop every process below
        raise KeyboardInterrupt(f"signal {signum}")
    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        cluster.start()
        cluster.start_operator(timeout=120)
        yield RealCluster(cluster, runner)
    finally:
        signal.signal(signal.SIGTERM, previous)
        cluster.stop()
        runner.stop_all()
        left = runner.leftovers()
        assert not left, f"real vLLM processes left running: {left}"


