"""The kubelet's probes for a container that runs as a real process (realvllm.py), on the simulated clock: past its
startup probe's budget (initialDelaySeconds + failureThreshold × periodSeconds) a container that is not Ready is
killed as the kubelet kills it (Unhealthy and Killing Events, SIGTERM, SIGKILL after the grace period, its children
too) and restarted after the back-off; one whose /health answers in time is Ready; one without probes (a
LeaderWorkerSet's headless worker) is Ready once it runs.

The process is a stand-in for vLLM (a Python script: it prints a line, starts a child as vLLM starts its engine core,
and, as asked, ignores SIGTERM or answers /health), so these run without vLLM; tests/real does the same with vLLM.
"""

from __future__ import annotations

import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from simkit import SimHarness, deployment

from vllm_operator_sim.realvllm import RealVLLM, container_probes

LLAMA3_8B = "meta-llama/Meta-Llama-3-8B-Instruct"
FLAGS = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_model_len": 4096}

FAKE = r'''
import http.server, os, signal, subprocess, sys, threading, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"(APIServer pid={os.getpid()}) INFO 01-01 00:00:00 [api_utils.py:347] version 0.32.0; engine {child.pid}",
      flush=True)
mode = os.environ.get("FAKE_MODE", "")
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "serve":
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *_):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
time.sleep(600)
'''


def _runner(tmp_path: Path, mode: str) -> RealVLLM:
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "model").mkdir()
    return RealVLLM(str(python), tmp_path, {LLAMA3_8B: tmp_path / "model"}, max_processes=2,
                    env={"FAKE_MODE": mode}, echo=lambda _line: None)


def _apply(sim: SimHarness, name: str, edit: Callable[[dict[str, Any], dict[str, Any]], None] | None = None) -> None:
    deploy = deployment(name, LLAMA3_8B, FLAGS)
    if edit is not None:
        spec = deploy["spec"]["template"]["spec"]
        edit(spec, spec["containers"][0])
    sim.api.create_object("deployments", deploy)


def _wait_real(sim: SimHarness, predicate: Callable[[], Any], what: str, limit_s: float = 60.0) -> Any:
    """Tick the kubelet (without moving simulated time) until ``predicate()`` holds: for what real processes do."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        sim.kubelet.tick()
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {limit_s} s")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _engine_pid(runner: RealVLLM, index: int) -> int:
    run = runner.history[index]
    text = _wait_text(run.log_path, "engine ")
    return int(text.split("engine ")[1].split()[0])


def _wait_text(path: Path, marker: str) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if marker in text:
            return text
        time.sleep(0.05)
    raise AssertionError(f"{marker!r} not in {path}")


@pytest.mark.parametrize(("mode", "grace", "exit_code"), [("", 60, 143), ("ignore-term", 1, 137)])
def test_a_real_process_not_ready_by_its_startup_probe_deadline_is_killed_and_restarted(
        sim: SimHarness, tmp_path: Path, mode: str, grace: int, exit_code: int) -> None:
    sim.kubelet.real = runner = _runner(tmp_path, mode)
    try:
        _apply(sim, "slow", lambda spec, _c: spec.update(terminationGracePeriodSeconds=grace))
        sim.run_until(lambda: runner.history)  # scheduled, image pulled, started
        [pod] = sim.pods("slow")
        budget, probed = container_probes(pod["spec"]["containers"][0])
        assert probed and budget == 10 * pod["spec"]["containers"][0]["startupProbe"]["failureThreshold"] >= 600
        started = sim.kubelet._pods[pod["metadata"]["uid"]].run_started
        assert started is not None
        engine = _engine_pid(runner, 0)
        # one simulated second before the deadline: still starting, nothing killed
        sim.clock.advance_to(started + budget - 1)
        sim.kubelet.tick()
        assert runner.history[0].process.poll() is None and not sim.container(sim.pods("slow")[0]).get("ready")
        assert not [e for e in sim.events if e.kind in ("probe-failed", "killing")]
        # the deadline: the probe's last try fails, the kubelet kills the container (SIGTERM; SIGKILL after grace)
        sim.clock.advance_to(started + budget)
        terminated = _wait_real(sim, lambda: ((sim.container(sim.pods("slow")[0]).get("state") or {})
                                              .get("terminated")), "the killed container's state")
        assert terminated["exitCode"] == exit_code and terminated["reason"] == "Error", terminated
        probe, killing = [e for e in sim.events if e.kind in ("probe-failed", "killing")]
        assert probe.t == killing.t == started + budget
        assert probe.message.startswith('Startup probe failed: Get "http://127.0.0.1:') and \
            probe.message.endswith("connect: connection refused"), probe.message
        assert killing.message == "Container vllm failed startup probe, will be restarted"
        events = {e["reason"]: e for e in sim.api.list_objects("events", "default")
                  if e["involvedObject"]["name"] == pod["metadata"]["name"]}
        assert events["Unhealthy"]["type"] == "Warning" and events["Killing"]["type"] == "Normal"
        assert not _alive(runner.history[0].pid)
        _wait_real(sim, lambda: not _alive(engine), "its engine core killed with it")
        # the kubelet's back-off, then a new process
        sim.run_until(lambda: len(runner.history) == 2, limit=60)
        assert sim.container(sim.pods("slow")[0])["restartCount"] == 1
        assert runner.history[1].process.poll() is None
    finally:
        runner.stop_all()
    assert not runner.leftovers()


def test_a_real_process_whose_health_answers_in_time_is_ready_and_never_killed(
        sim: SimHarness, tmp_path: Path) -> None:
    sim.kubelet.real = runner = _runner(tmp_path, "serve")
    try:
        _apply(sim, "quick")
        sim.run_until(lambda: runner.history)
        _wait_real(sim, lambda: sim.container(sim.pods("quick")[0]).get("ready"), "Ready on /health 200")
        [pod] = sim.pods("quick")
        budget, _ = container_probes(pod["spec"]["containers"][0])
        sim.run(2 * (budget or 0), step=60)
        assert sim.container(sim.pods("quick")[0]).get("ready") and len(runner.history) == 1
        assert runner.history[0].process.poll() is None
        assert not [e for e in sim.events if e.kind in ("probe-failed", "killing")]
    finally:
        runner.stop_all()
    assert not runner.leftovers()


def test_a_real_container_without_probes_is_ready_once_it_runs(sim: SimHarness, tmp_path: Path) -> None:
    """A LeaderWorkerSet's headless worker has no probes (render/lws.py): Kubernetes counts it Ready once it runs,
    though it serves no /health."""
    sim.kubelet.real = runner = _runner(tmp_path, "")

    def no_probes(_spec: dict[str, Any], container: dict[str, Any]) -> None:
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            container.pop(probe)
    try:
        _apply(sim, "worker", no_probes)
        sim.run_until(lambda: runner.history)
        [pod] = sim.pods("worker")
        assert container_probes(pod["spec"]["containers"][0]) == (None, False)
        assert sim.container(pod).get("ready") is True
        assert not runner.health(pod["metadata"]["uid"])[0]  # nothing answers /health
        sim.run(1200, step=60)
        assert len(runner.history) == 1 and runner.history[0].process.poll() is None
    finally:
        runner.stop_all()
    assert not runner.leftovers()


def test_the_probe_budget_is_kubernetes_arithmetic() -> None:
    assert container_probes({"startupProbe": {"periodSeconds": 10, "failureThreshold": 87,
                                              "initialDelaySeconds": 5}}) == (875.0, True)
    assert container_probes({"startupProbe": {"httpGet": {"path": "/health"}}}) == (30.0, True)  # defaults 10 × 3
    assert container_probes({"readinessProbe": {"periodSeconds": 5}}) == (None, True)
    assert container_probes({"startupProbe": {"failureThreshold": "many"}}) == (30.0, True)
    assert container_probes({}) == (None, False)
