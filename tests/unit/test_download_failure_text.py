"""What is said about a failing model-download init container (issue 20): a recognised failure's classified,
redacted summary; an unrecognised one only its class, the container, the exit code and where to read the log —
none of the container's own text, which can hold a credential in a shape the redactor does not know."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vllm_operator.remediation.classifier import download_failure_summary

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123456789"
GATED = ("huggingface_hub.errors.GatedRepoError: 401 Client Error.\nCannot access gated repo for url "
         f"https://huggingface.co/api/models/org/model.\nAccess to model org/model is restricted ({TOKEN}).\n")


def _pod(state: dict[str, Any], last: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "svc-abc", "namespace": "team-a"},
            "spec": {"initContainers": [{"name": "model-download"}], "containers": [{"name": "vllm"}]},
            "status": {"phase": "Pending",
                       "initContainerStatuses": [{"name": "model-download", "ready": False, "restartCount": 2,
                                                  "state": state, "lastState": last or {}}],
                       "containerStatuses": [{"name": "vllm", "ready": False, "restartCount": 0,
                                              "state": {"waiting": {"reason": "PodInitializing"}}}]}}


def _crashed(message: str, code: int = 1, reason: str = "Error") -> dict[str, Any]:
    return _pod({"waiting": {"reason": "CrashLoopBackOff"}},
                {"terminated": {"exitCode": code, "reason": reason, "message": message}})


@pytest.mark.parametrize("message", [
    "mirror.errors.MirrorRefused: session q7Zk-SECRET-SHAPE-3nT1 refused\n",
    "OSError: [Errno 5] Input/output error: '/cache/q7Zk-SECRET-SHAPE-3nT1'\n",
    "q7Zk-SECRET-SHAPE-3nT1",
    "",
])
def test_an_unrecognised_failure_carries_no_text_of_the_container(message: str) -> None:
    said = download_failure_summary(_crashed(message, code=3))
    assert said is not None
    assert said.startswith("Unknown: init container model-download failed (exit code 3, reason Error)")
    assert said.endswith("see `kubectl logs -n team-a svc-abc -c model-download --previous`")
    assert "SECRET-SHAPE" not in said and "MirrorRefused" not in said and "OSError" not in said


def test_a_recognised_failure_is_its_redacted_summary() -> None:
    said = download_failure_summary(_crashed(GATED))
    assert said is not None and "not found or not accessible" in said and TOKEN not in said
    oom = download_failure_summary(_crashed("", code=137, reason="OOMKilled"))
    assert oom is not None and "OOM killer" in oom and oom.startswith("init container model-download (not vLLM)")


def test_a_hostile_kubelet_reason_is_not_copied_either() -> None:
    said = download_failure_summary(_crashed("x", code=2, reason=f"Error {TOKEN}"))
    assert said is not None and TOKEN not in said and "(exit code 2, reason Error)" in said


def test_nothing_is_said_before_a_failure_or_after_a_success() -> None:
    assert download_failure_summary(_pod({"running": {}})) is None
    ok = _pod({"terminated": {"exitCode": 0, "message": json.dumps({"downloadedBytes": 0, "seconds": 1})}},
              {"terminated": {"exitCode": 1, "message": "x"}})
    assert download_failure_summary(ok) is None
    assert download_failure_summary({"status": {}}) is None
    # running again after a failure: still failing (the last run's exit code)
    again = download_failure_summary(_pod({"running": {}}, {"terminated": {"exitCode": 4, "message": "x"}}))
    assert again is not None and "exit code 4" in again
