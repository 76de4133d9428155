"""The demo's pure parts: which manifests it applies, how it judges a service, how it prints the summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vllm_operator_sim.clock import SimClock, format_duration
from vllm_operator_sim.demo import ServiceResult, find_manifests, format_flags, service_outcome, summary_table
from vllm_operator_sim.scenarios import Expectation, load_scenarios


def _service(*conditions: tuple[str, str, str]) -> dict[str, object]:
    return {"status": {"conditions": [{"type": t, "status": s, "reason": r} for t, s, r in conditions]}}


def test_terminal_states_of_a_service() -> None:
    assert service_outcome(_service(("Ready", "True", "Available"))) == "Ready"
    assert service_outcome(_service(("PlanFeasible", "False", "PlanInfeasible"))) == "Infeasible"
    assert service_outcome(_service(("Degraded", "True", "RemediationExhausted"))) == "Exhausted"
    assert service_outcome(_service(("Degraded", "True", "InvalidSpec"))) == "Degraded"
    assert service_outcome(_service(("Degraded", "True", "Remediating"), ("Ready", "False", "PodsNotReady"))) is None
    assert service_outcome(None) is None


def test_expectations() -> None:
    fits = Expectation(outcome="Ready", failed_starts=0)
    assert fits.check("Ready", 0) == (True, "")
    assert fits.check("Ready", 1)[0] is False
    assert "expected Ready, ended Infeasible" in fits.check("Infeasible", 0)[1]
    recovers = Expectation(outcome="Ready", min_failed_starts=1, max_failed_starts=2)
    assert recovers.check("Ready", 1)[0] and not recovers.check("Ready", 0)[0] and not recovers.check("Ready", 3)[0]
    assert recovers.describe() == "Ready, 1..2 failed start(s)"
    pinned = Expectation(flags={"max_model_len": 8192})
    assert pinned.check("Ready", 0, {"max_model_len": 8192})[0]
    assert not pinned.check("Ready", 0, {"max_model_len": 4096})[0]


def test_manifests_from_a_directory_or_the_built_in_scenarios(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("apiVersion: vllm-operator.dev/v1alpha1\nkind: VLLMService\nmetadata: {name: a}\n"
                                     "spec: {model: {name: m}}\n---\nkind: ConfigMap\nmetadata: {name: x}\n")
    scenarios = load_scenarios()
    docs, source = find_manifests(tmp_path, scenarios)
    assert [d["metadata"]["name"] for d in docs] == ["a"] and source == str(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no VLLMService manifests"):
        find_manifests(empty, scenarios)
    with pytest.raises(FileNotFoundError):
        find_manifests(tmp_path / "missing", scenarios)


def test_format_flags_and_durations() -> None:
    flags = {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 13,
             "kv_cache_dtype": "fp8", "enforce_eager": True, "enable_prefix_caching": True}
    assert format_flags(flags) == "TP=2 util=0.90 len=8192 seqs=13 kv=fp8 eager prefix-caching"
    assert format_flags({}) == "-"
    assert [format_duration(s) for s in (None, 5, 95, 3725, float("inf"))] == ["-", "5s", "1m35s", "1h02m05s",
                                                                               "never"]


def test_summary_table() -> None:
    rows = [ServiceResult(name="chat", model="m", gpu="1× NVIDIA-L4", outcome="Ready",
                          flags={"tensor_parallel_size": 1, "max_model_len": 8192}, failed_starts=1,
                          serving_failures=0, remediation_steps=1, time_to_ready_s=95.0, expected="Ready",
                          as_expected=True),
            ServiceResult(name="big", model="m70", gpu="1× RTX", outcome="Timeout", flags={}, failed_starts=0,
                          serving_failures=0, remediation_steps=0, time_to_ready_s=None, expected="Infeasible",
                          as_expected=False, why="expected Infeasible, ended Timeout")]
    table = summary_table(rows).splitlines()
    assert table[0].split()[:3] == ["service", "model", "GPU"]
    assert "Ready after 1 step(s)" in table[2] and "1m35s" in table[2] and table[2].endswith("ok")
    assert table[3].endswith("UNEXPECTED: expected Infeasible, ended Timeout")


def test_the_clock_compresses_time_and_a_manual_one_stands_still() -> None:
    manual = SimClock.manual()
    assert manual.now() == 0.0 and manual.advance(12.5) == 12.5 and manual.now() == 12.5
    assert manual.timestamp() == "2026-01-01T00:00:12Z" and manual.log_time(3600) == "01-01 01:00:00"
    fast = SimClock(1000.0)
    assert fast.real_seconds(100) == pytest.approx(0.1)
    fast.set_speed(0.0)
    frozen = fast.now()
    assert fast.now() == frozen


@pytest.mark.parametrize("missing", ["kmock", "celpy"])
def test_demo_without_the_sim_extra_says_which_extra_to_install(missing: str) -> None:
    """As in the operator image (no `sim` extra): one line naming the extra, exit 2, no traceback."""
    code = (f"import sys; sys.modules[{missing!r}] = None; "  # the import fails as if the module were not installed
            "from vllm_operator.cli import main; sys.exit(main(['demo']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and "vllm-operator[sim]" in lines[0] and missing in lines[0], lines
