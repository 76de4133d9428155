"""The one way tests run the real ``vllm-operator run`` process (against an emulated API's kubeconfig).

:func:`start_operator` starts it with its output in a log file; :meth:`OperatorProcess.stop` ends it (SIGTERM,
then SIGKILL) and is idempotent; :func:`stopping` stops every process started in a ``with`` block.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kit.api import http_get, poll
from kit.ports import HOST, free_port

__all__ = ["OperatorProcess", "operator_command", "probe_args", "start_operator", "stopping"]


def operator_command() -> list[str]:
    """The installed ``vllm-operator`` script next to this Python, else ``python -m vllm_operator.cli``."""
    script = Path(sys.executable).with_name("vllm-operator")
    return [str(script)] if script.exists() else [sys.executable, "-m", "vllm_operator.cli"]


@dataclass
class OperatorProcess:
    process: subprocess.Popen[bytes]
    log_path: Path
    liveness_url: str | None = None
    metrics_url: str | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def liveness(self) -> tuple[int, str]:
        assert self.liveness_url is not None, "started without --liveness"
        return http_get(self.liveness_url)

    def metrics(self) -> tuple[int, str]:
        assert self.metrics_url is not None, "started without --metrics-port"
        return http_get(self.metrics_url)

    def wait_live(self, timeout: float = 30.0) -> OperatorProcess:
        """Return once the liveness endpoint answers 200; AssertionError (with the log) if it exits first."""
        def alive() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"vllm-operator exited with {self.process.returncode}:\n{self.log()}")
            return self.liveness()[0] == 200
        poll(alive, timeout=timeout, message=f"vllm-operator did not become live:\n{self.log()}")
        return self

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return int(self.process.returncode)


def probe_args() -> tuple[list[str], str, str]:
    """``--liveness``/``--metrics-port`` arguments on free loopback ports, with the two URLs."""
    liveness, metrics = free_port(), free_port()
    return ([f"--liveness=http://{HOST}:{liveness}/healthz", "--metrics-port", str(metrics)],
            f"http://{HOST}:{liveness}/healthz", f"http://{HOST}:{metrics}/metrics")


def start_operator(kubeconfig: Path, log_path: Path, args: Sequence[str] = ("-A", "--standalone", "--verbose"), *,
                   env: Mapping[str, str] | None = None, probes: bool = True) -> OperatorProcess:
    """Start ``vllm-operator run ARGS --kubeconfig KUBECONFIG`` (offline Hugging Face, no in-cluster config).

    With ``probes`` the liveness and metrics endpoints listen on free loopback ports (see the URLs on the result).
    The working directory is the log's folder.
    """
    extra, liveness_url, metrics_url = probe_args() if probes else ([], None, None)
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "HOME": str(log_path.parent), "PYTHONUNBUFFERED": "1",
                "KUBECONFIG": str(kubeconfig), **(env or {})}
    full_env.pop("KUBERNETES_SERVICE_HOST", None)
    with log_path.open("wb") as log:
        process = subprocess.Popen([*operator_command(), "run", *args, *extra, "--kubeconfig", str(kubeconfig)],
                                   stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=log_path.parent)
    return OperatorProcess(process, log_path, liveness_url, metrics_url)


@contextlib.contextmanager
def stopping() -> Iterator[list[OperatorProcess]]:
    """A list to append started processes to; every one is stopped when the block ends."""
    started: list[OperatorProcess] = []
    try:
        yield started
    finally:
        for process in started:
            process.stop()
