"""Scenario 1: a VLLMService becomes Ready on a real vLLM process, and a real completion is served through the
Service's port; the simulator, run on the same pod's rendered container, prints the lines the operator and its
users read (the version banner, the KV cache line, the listening line, uvicorn's startup line) as the real
process does, so a change of vLLM's wording or of the simulator's transcription fails here."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import requests
from realkit import (
    IMAGE,
    MODELS,
    TINY,
    VLLM_VERSION,
    RealCluster,
    operator_lines,
    simulated_run,
    tiny_spec,
    until,
)

from kit.specs import vllmservice
from vllm_operator.remediation.kvcache import measured_tokens

pytestmark = pytest.mark.timeout(900)


def simulated_start() -> datetime:
    return datetime(2026, 11, 27, tzinfo=UTC)


def test_a_vllmservice_is_ready_on_a_real_process_and_serves_a_completion_through_its_service(
        real: RealCluster) -> None:
    real.cluster.apply(vllmservice(tiny_spec(), name="serve"))
    try:
        real.wait_ready("serve")
        [pod] = real.ready_pods("serve")
        container = pod["spec"]["containers"][0]
        # the rendered container, probed on the path the real server answers
        assert container["image"] == IMAGE
        assert container["command"] == ["vllm", "serve"] and container["args"][0] == TINY
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"]["path"] == "/health", probe
        [run] = [r for r in real.runner.runs.values() if r.uid == pod["metadata"]["uid"]]
        assert run.ready and run.process.poll() is None
        # the pod's log, read through the emulated API as the operator reads it, is the real process's output
        log = real.pod_log(pod["metadata"]["name"])
        assert f"version {VLLM_VERSION}" in log
        assert measured_tokens(log) == 1_048_576  # the operator's reader of the KV line: 1 GiB of 1 KiB tokens
        # the simulator on this pod's rendered container says what the real process said, line for line
        simulated = simulated_run(pod, MODELS[TINY])
        assert simulated.starts and simulated.vllm_version == VLLM_VERSION, simulated.message
        real_lines = operator_lines(log, str(real.runner.models[TINY]))
        assert all(real_lines.values()), real_lines  # each kind of line is there to compare
        assert operator_lines(simulated.log_text(simulated_start()), TINY) == real_lines
        # a completion through the Service's port (the Service's selector → the Ready pod → its real process)
        proxy = real.proxy("serve")
        try:
            assert until(proxy.endpoints, 30, "the Service has an endpoint") == [
                (pod["metadata"]["name"], run.port)]
            models = requests.get(f"{proxy.url}/v1/models", timeout=30).json()
            assert [m["id"] for m in models["data"]] == [TINY]
            answer = requests.post(f"{proxy.url}/v1/completions", timeout=120, json={
                "model": TINY, "prompt": [1, 5, 7, 9], "max_tokens": 4, "temperature": 0}).json()
            assert answer["model"] == TINY, answer
            assert answer["usage"]["prompt_tokens"] == 4 and answer["usage"]["completion_tokens"] == 4, answer
            assert answer["choices"][0]["finish_reason"] == "length", answer
            assert proxy.routed and set(proxy.routed) == {pod["metadata"]["name"]}
        finally:
            proxy.close()
        status = real.service("serve")["status"]  # type: ignore[index]
        assert status["readyReplicas"] == 1, status
    finally:
        real.delete("serve")
