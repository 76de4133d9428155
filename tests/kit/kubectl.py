"""The real kubectl (``.tools/kubectl``, as ``make tools`` installs it, else on PATH) against an emulated API."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kit.api import REPO

__all__ = ["Kubectl", "kubectl_binary"]


def kubectl_binary() -> str:
    """``.tools/kubectl``, else kubectl on PATH; a test that needs it fails (never skips) without one."""
    local = REPO / ".tools" / "kubectl"
    found = str(local) if os.access(local, os.X_OK) else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is missing: run `make tools` (it installs .tools/kubectl)", pytrace=False)
    return found


@dataclass
class Kubectl:
    """``kubectl(*args)`` → stdout+stderr (AssertionError on a non-zero exit unless ``check=False``)."""

    kubeconfig: Path
    workdir: Path
    binary: str = ""

    def __post_init__(self) -> None:
        self.binary = self.binary or kubectl_binary()
        self.env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), HOME=str(self.workdir),
                        KUBECACHEDIR=str(self.workdir / "kubecache"))

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.binary, *args], cwd=REPO, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def __call__(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        result = self.run(*args, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result.stdout + result.stderr

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))
