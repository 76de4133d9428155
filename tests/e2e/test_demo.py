"""`vllm-operator demo` end to end: the real operator process against the simulated GPU cluster.

One run of the demo (as `make demo` runs it, from the repository root) serves every test here; its results come
from the JSON report the demo writes when VLLM_OPERATOR_DEMO_REPORT is set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from vllm_operator_sim.demo import run_services
from vllm_operator_sim.scenarios import Scenario, ScenarioSet, Traffic
from vllm_operator_sim.startup import HiddenFacts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
#: A safety net only: the demo's clock is paced (it stands still while the operator works), so on a busy machine it
#: takes longer in real time but ends the same way; what bounds it is its limit in simulated time.
SAFETY_NET_S = 900.0


@dataclass
class DemoRun:
    returncode: int
    stdout: str
    report: list[dict[str, Any]]
    seconds: float

    def row(self, name: str) -> dict[str, Any]:
        return next(r for r in self.report if r["name"] == name)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    report = tmp_path_factory.mktemp("demo") / "report.json"
    env = {**os.environ, "VLLM_OPERATOR_DEMO_REPORT": str(report), "VLLM_OPERATOR_DEMO_TIMEOUT": str(SAFETY_NET_S),
           "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "demo"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=SAFETY_NET_S + 30)
    seconds = time.monotonic() - started
    rows = json.loads(report.read_text()) if report.exists() else []
    return DemoRun(result.returncode, result.stdout + result.stderr, rows, seconds)


def _needs(row: dict[str, Any], what: str) -> bool:
    return what in (row.get("needs") or [])


def test_the_demo_prints_a_live_view_and_a_summary_table(demo: DemoRun) -> None:
    assert demo.report, demo.stdout[-3000:]
    out = demo.stdout
    assert "service" in out and "failed starts" in out and "time to Ready" in out
    assert "services ended as expected" in out
    assert "plan:" in out and "Ready" in out
    assert "stands still while the operator works" in out


def test_every_scenario_that_does_not_need_remediation_ends_as_expected(demo: DemoRun) -> None:
    unexpected = [f"{r['name']}: {r['why']}" for r in demo.report
                  if not r["as_expected"] and not _needs(r, "remediation")]
    assert not unexpected, demo.stdout[-4000:]
    if all(r["as_expected"] for r in demo.report):
        assert demo.returncode == 0
    else:
        assert demo.returncode == 1


def test_planned_services_start_first_time_and_infeasible_ones_start_nothing(demo: DemoRun) -> None:
    ready_first_time = [r for r in demo.report if r["outcome"] == "Ready" and not _needs(r, "remediation")]
    assert ready_first_time
    for row in ready_first_time:
        assert row["failed_starts"] == 0, row
        assert row["time_to_ready_s"] is not None and row["time_to_ready_s"] > 0
        assert row["flags"]["max_model_len"] > 0
    for row in (r for r in demo.report if r["outcome"] == "Infeasible"):
        assert row["failed_starts"] == 0 and row["time_to_ready_s"] is None


def test_the_shared_gpu_service_recovers_after_remediation(demo: DemoRun) -> None:
    rows = [r for r in demo.report if _needs(r, "remediation")]
    assert rows
    for row in rows:
        assert row["as_expected"], row["why"]
        assert row["outcome"] == "Ready" and row["failed_starts"] >= 1 and row["remediation_steps"] >= 1
    assert demo.returncode == 0


def test_a_serving_time_oom_under_traffic_is_remediated() -> None:
    """A Ready server given more concurrent sequences than its GPU holds dies while serving; the operator lowers
    max-num-seqs until it survives the same traffic (the demo's traffic path, with the real operator)."""
    scenarios = ScenarioSet({"busy": Scenario(name="busy", hidden=HiddenFacts(serving_oom_above_seqs=16),
                                              traffic=Traffic(concurrency=64, context=2048))})
    manifest = {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
                "metadata": {"name": "busy", "namespace": "default"},
                "spec": {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "gpu": {"product": "NVIDIA-L4"},
                         "remediation": {"minIntervalSeconds": 0}}}
    [result] = run_services([manifest], scenarios=scenarios, pools=[("L4", 1)], sim_timeout_s=3600)
    assert result.outcome == "Ready", result
    assert result.serving_failures >= 1 and result.failed_starts == 0
    assert result.remediation_steps >= 1
    assert result.flags["max_num_seqs"] <= 16
