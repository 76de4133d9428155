"""The release workflow (.github/workflows/release.yml): valid for GitHub's workflow schema (check-jsonschema's
vendored copy), shaped as the README says (test, then image + chart to the registry), and its version step run
here against the repository's own files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


def _workflow() -> dict[Any, Any]:
    data: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return data


def _lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_workflow_is_valid_for_githubs_schema(tmp_path: Path) -> None:
    result = _lint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = _workflow()
    del broken["jobs"]["release"]["runs-on"]
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(broken))
    assert _lint(tmp_path / "broken.yml").returncode != 0  # the linter does reject a broken workflow


def test_release_needs_the_tests_and_pushes_image_and_chart() -> None:
    wf = _workflow()
    on = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads the key `on` as a boolean
    assert on["push"]["tags"] == ["v*.*.*"]
    assert wf["permissions"] == {"contents": "read"}
    jobs = wf["jobs"]
    assert jobs["release"]["needs"] == "test"
    assert any(step.get("run") == ".ci/run" for step in jobs["test"]["steps"])
    assert jobs["release"]["permissions"] == {"contents": "read", "packages": "write"}
    steps = jobs["release"]["steps"]
    uses = [s["uses"] for s in steps if "uses" in s]
    assert all("@v" in u for u in uses), uses  # actions pinned to a major release
    build = next(s for s in steps if s.get("uses", "").startswith("docker/build-push-action@"))
    assert build["with"]["push"] is True and "linux/arm64" in build["with"]["platforms"]
    chart = next(s for s in steps if "helm push" in s.get("run", ""))
    assert "helm package charts/vllm-operator" in chart["run"] and "$CHARTS" in chart["run"]
    for step in steps:  # secrets reach scripts through env, never pasted into the script text
        assert "secrets." not in step.get("run", ""), step


def _version_step(tag: str, tmp_path: Path) -> tuple[int, dict[str, str], str]:
    step = next(s for s in _workflow()["jobs"]["release"]["steps"] if s.get("id") == "version")
    output = tmp_path / "github_output"
    output.write_text("")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TAG": tag, "REGISTRY": "ghcr.io",
           "GITHUB_REPOSITORY_OWNER": "vLLM-Operator", "GITHUB_OUTPUT": str(output)}
    result = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=30, check=False)
    values = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
    return result.returncode, values, result.stdout + result.stderr


def test_version_step_reads_the_chart_and_the_package(tmp_path: Path) -> None:
    chart = yaml.safe_load((REPO / "charts" / "vllm-operator" / "Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "charts" / "vllm-operator" / "values.yaml").read_text())
    code, out, log = _version_step(f"v{chart['version']}", tmp_path)
    assert code == 0, log
    assert out["version"] == chart["version"] == chart["appVersion"]
    assert out["image"] == values["image"]["repository"]  # what the chart pulls by default is what is pushed
    assert out["charts"] == "oci://ghcr.io/vllm-operator/charts"


@pytest.mark.parametrize("tag", ["v9.9.9", "v0.1"])
def test_version_step_refuses_a_tag_the_files_do_not_carry(tmp_path: Path, tag: str) -> None:
    code, _, log = _version_step(tag, tmp_path)
    assert code != 0 and "does not match" in log
