"""Fixtures for end-to-end tests: the real `vllm-operator run` process and kubectl against the emulated API server.

Everything listens on 127.0.0.1 only; every process started here is stopped (terminate, then kill) at teardown,
and the operator's log is printed when a test fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from vllm_operator_sim.emulator import EmulatedAPIServer

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "vllmservices.vllm-operator.dev.yaml"
EXAMPLES = REPO / "examples"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """(status, body) of a GET on loopback; (0, error) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback only)
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def poll(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.1, message: str = "") -> Any:
    """Call `predicate` until it returns something truthy; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(message or f"not met within {timeout}s: {predicate!r}")
        time.sleep(interval)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember each phase's outcome on the item, so fixtures can print logs when a test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmulatedAPIServer]:
    """The emulated API server on 127.0.0.1 with one L4 GPU node (GPU Feature Discovery labels); no CRD yet."""
    server = EmulatedAPIServer().start()
    try:
        server.write_kubeconfig(tmp_path / "kubeconfig")
        server.create_object("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1", "labels": {
            "nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "23034"}}})
        yield server
    finally:
        server.stop()


@dataclass
class Kubectl:
    binary: str
    kubeconfig: Path
    cwd: Path
    env: dict[str, str]

    def __call__(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        result = subprocess.run([self.binary, "--kubeconfig", str(self.kubeconfig), *args], cwd=self.cwd,
                                env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result.stdout + result.stderr

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))


@pytest.fixture
def kubectl(cluster: EmulatedAPIServer, tmp_path: Path) -> Kubectl:
    """The real kubectl (/usr/bin/kubectl or on PATH), with a private cache dir; skips where there is none."""
    binary = shutil.which("kubectl") or ("/usr/bin/kubectl" if os.access("/usr/bin/kubectl", os.X_OK) else None)
    if binary is None:
        pytest.skip("no kubectl binary")
    assert cluster.kubeconfig_path is not None
    env = dict(os.environ, KUBECACHEDIR=str(tmp_path / "kubecache"), KUBECONFIG=str(cluster.kubeconfig_path),
               HOME=str(tmp_path))
    return Kubectl(binary, cluster.kubeconfig_path, tmp_path, env)


@dataclass
class OperatorProcess:
    process: subprocess.Popen[bytes]
    log_path: Path
    liveness_url: str
    metrics_url: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def liveness(self) -> tuple[int, str]:
        return http_get(self.liveness_url)

    def metrics(self) -> tuple[int, str]:
        return http_get(self.metrics_url)


def operator_command() -> list[str]:
    script = Path(sys.executable).with_name("vllm-operator")
    return [str(script)] if script.exists() else [sys.executable, "-m", "vllm_operator.cli"]


@pytest.fixture
def operator_process(cluster: EmulatedAPIServer, tmp_path: Path,
                     request: pytest.FixtureRequest) -> Iterator[Callable[[], OperatorProcess]]:
    """A factory that starts the real `vllm-operator run -A --standalone` against the cluster (call it once the
    CRD is registered); returns once its liveness endpoint answers. Stopped at teardown (SIGTERM, then SIGKILL)."""
    started: list[OperatorProcess] = []

    def start() -> OperatorProcess:
        assert cluster.kubeconfig_path is not None
        liveness_port, metrics_port = free_port(), free_port()
        log_path = tmp_path / f"operator-{len(started)}.log"
        env = dict(os.environ, HF_HUB_OFFLINE="1", HOME=str(tmp_path))
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [*operator_command(), "run", "-A", "--standalone", "--kubeconfig", str(cluster.kubeconfig_path),
                 "--liveness", f"http://127.0.0.1:{liveness_port}/healthz", "--metrics-port", str(metrics_port),
                 "--verbose"],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
        op = OperatorProcess(process, log_path, f"http://127.0.0.1:{liveness_port}/healthz",
                             f"http://127.0.0.1:{metrics_port}/metrics")
        started.append(op)

        def alive() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"vllm-operator exited with {process.returncode}:\n{op.log()}")
            return http_get(op.liveness_url, timeout=1)[0] == 200
        poll(alive, timeout=30, message=f"vllm-operator did not become live:\n{op.log()}")
        return op

    yield start

    for op in started:
        if op.process.poll() is None:
            op.process.terminate()
            try:
                op.process.wait(15)
            except subprocess.TimeoutExpired:
                op.process.kill()
                op.process.wait(5)
    failed = any(getattr(getattr(request.node, f"rep_{when}", None), "failed", False) for when in ("setup", "call"))
    if failed:
        for op in started:
            print(f"\n----- {op.log_path.name} (exit {op.process.returncode}) -----\n{op.log()[-20000:]}")
