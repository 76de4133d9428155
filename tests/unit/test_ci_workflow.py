"""The CI workflow (.github/workflows/ci.yml) and the Makefile's test tiers: CI runs on every push and pull request,
the fast tier (`make test-unit`: lint, contracts, unit tests) first, then the full run README names (`.ci/run` →
`make test`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "ci.yml"
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


def _workflow() -> dict[Any, Any]:
    data: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return data


def _make_recipe(target: str) -> tuple[list[str], list[str]]:
    """A Makefile target's prerequisites and recipe lines."""
    text = (REPO / "Makefile").read_text()
    found = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)*)", text, re.M)
    assert found, f"no {target} target in the Makefile"
    return found.group(1).split(), [line.strip() for line in found.group(2).splitlines()]


def test_the_workflow_is_valid_for_githubs_schema() -> None:
    result = subprocess.run([str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ci_runs_the_fast_tier_then_the_full_run_on_every_push_and_pull_request() -> None:
    wf = _workflow()
    on = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads the key `on` as a boolean
    assert "push" in on and "pull_request" in on
    assert "tags" not in (on["push"] or {})  # not only on release tags
    assert wf["permissions"] == {"contents": "read"}
    jobs = wf["jobs"]
    runs = {name: [s.get("run") for s in job["steps"] if "run" in s] for name, job in jobs.items()}
    assert runs["unit"] == ["make test-unit"]
    assert runs["full"] == [".ci/run"] and jobs["full"]["needs"] == "unit"
    for job in jobs.values():
        assert all("@v" in s["uses"] for s in job["steps"] if "uses" in s)  # actions pinned to a major release


def test_the_tiers_share_lint_and_contracts_and_differ_in_what_pytest_runs() -> None:
    unit_needs, unit = _make_recipe("test-unit")
    full_needs, full = _make_recipe("test")
    assert {"lint", "contracts"} <= set(unit_needs) and {"lint", "contracts"} <= set(full_needs)
    assert unit == ["$(BIN)/pytest -q $(PYTEST_PARALLEL) tests/unit"]
    assert full == ["$(BIN)/pytest -q $(PYTEST_PARALLEL)"]  # every directory under testpaths
    _, lint = _make_recipe("lint")
    assert any("check-jsonschema" in line and ".github/workflows/" in line for line in lint)
    ci = (REPO / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip().startswith("make ")]
    assert commands == ["make test", "make test-real"]  # README's command, then the real-vLLM tier
    _, real = _make_recipe("test-real")
    assert any("tests/real" in line for line in real)


def test_both_tiers_run_in_parallel_one_file_per_worker_and_xdist_is_a_dev_dependency() -> None:
    """`-n auto --dist loadfile`: a module's tests share one worker, so a module-scoped fixture (the demo's run, the
    remediation scenarios' cluster) starts once; files go out in collection order (the long end-to-end files first);
    PYTEST_WORKERS=0 runs everything in one process."""
    text = (REPO / "Makefile").read_text()
    assert re.search(r"^PYTEST_WORKERS\s*\?=\s*auto$", text, re.M)
    assert re.search(r"^PYTEST_PARALLEL\s*:=\s*-n \$\(PYTEST_WORKERS\) --dist loadfile --no-loadscope-reorder$",
                     text, re.M)
    pyproject = (REPO / "pyproject.toml").read_text()
    dev = re.search(r"^dev = \[(.*?)^\]", pyproject, re.S | re.M)
    assert dev and '"pytest-xdist' in dev.group(1)


def test_make_says_what_it_installs_before_the_venv_step() -> None:
    _, recipe = _make_recipe("$(STAMP)")
    first_pip = next(i for i, line in enumerate(recipe) if "pip install" in line)
    assert any(line.startswith("@echo") and "Installing" in line for line in recipe[:first_pip])
    assert all(" -q" not in line for line in recipe if "pip install" in line)  # pip shows what it fetches
