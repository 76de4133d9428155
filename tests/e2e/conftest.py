"""Fixtures for end-to-end tests: the real `vllm-operator run` process and kubectl against the emulated API server.

Everything comes from the test kit (`kit.api`, `kit.process`, `kit.kubectl`): everything listens on 127.0.0.1 only,
every process started here is stopped (terminate, then kill) at teardown, and the operator's log is printed when a
test fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kit.api import CRD_PATH, EXAMPLES, emulated_api, http_get, l4_node, poll
from kit.kubectl import Kubectl
from kit.process import OperatorProcess, start_operator
from vllm_operator_sim.emulator import EmulatedAPIServer

__all__ = ["CRD_PATH", "EXAMPLES", "Kubectl", "OperatorProcess", "http_get", "poll"]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember each phase's outcome on the item, so fixtures can print logs when a test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmulatedAPIServer]:
    """The emulated API server on 127.0.0.1 with one L4 GPU node (GPU Feature Discovery labels); no CRD yet."""
    with emulated_api(tmp_path / "kubeconfig", nodes=[l4_node("gpu-1")]) as server:
        yield server


@pytest.fixture
def kubectl(cluster: EmulatedAPIServer, tmp_path: Path) -> Kubectl:
    """The real kubectl (.tools/kubectl, else on PATH) against `cluster`, with a private cache dir."""
    assert cluster.kubeconfig_path is not None
    return Kubectl(cluster.kubeconfig_path, tmp_path)


@pytest.fixture
def operator_process(cluster: EmulatedAPIServer, tmp_path: Path,
                     request: pytest.FixtureRequest) -> Iterator[Callable[[], OperatorProcess]]:
    """A factory that starts the real `vllm-operator run -A --standalone` against the cluster (call it once the
    CRD is registered); returns once its liveness endpoint answers. Stopped at teardown (SIGTERM, then SIGKILL)."""
    started: list[OperatorProcess] = []

    def start() -> OperatorProcess:
        assert cluster.kubeconfig_path is not None
        op = start_operator(cluster.kubeconfig_path, tmp_path / f"operator-{len(started)}.log")
        started.append(op)
        return op.wait_live()

    yield start

    for op in started:
        op.stop()
    failed = any(getattr(getattr(request.node, f"rep_{when}", None), "failed", False) for when in ("setup", "call"))
    if failed:
        for op in started:
            print(f"\n----- {op.log_path.name} (exit {op.process.returncode}) -----\n{op.log()[-20000:]}")
