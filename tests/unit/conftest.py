"""Shared fixtures for the planner's unit tests.

Models come from the built-in catalog (``vllm_operator/catalog/models``) through ``sources.load_model_files``, so
these tests need neither the network nor anything outside the repository. The calibration tests read the public startup
records copied into ``benchmarks/data`` (with their sources).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from kit.catalog import catalog_arch, catalog_gpu
from vllm_operator.planner.arch import ModelArch, arch_from_config
from vllm_operator.planner.gpus import GPUSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
CALIBRATION_DATA = REPO_ROOT / "benchmarks" / "data"




def config_arch(config: Mapping[str, Any], model_id: str = "test/model", **kwargs: Any) -> ModelArch:
    """A ModelArch from an inline (synthetic) config.json."""
    return arch_from_config(config, model_id=model_id, **kwargs)


@pytest.fixture
def load_arch() -> Callable[[str], ModelArch]:
    """`load_arch("meta-llama/Llama-3.1-8B-Instruct")` → ModelArch from the built-in catalog."""
    return catalog_arch


@pytest.fixture
def gpu() -> Callable[[str], GPUSpec]:
    """`gpu("h100")` → GPUSpec from the built-in GPU catalog (names, aliases, GFD labels, sizes)."""
    return catalog_gpu


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """benchmarks/data (real vLLM startup records and model repo files); part of the repository, never skipped."""
    assert (CALIBRATION_DATA / "vllm-startup-logs.jsonl").is_file(), f"{CALIBRATION_DATA} is missing"
    return CALIBRATION_DATA


@pytest.fixture(scope="session")
def startup_records(shared_data: Path) -> list[dict[str, Any]]:
    lines = (shared_data / "vllm-startup-logs.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[Any, ...]]:
    """HF_HUB_OFFLINE=1 with an empty hub cache; records (and refuses) any non-loopback connection attempt."""
    import socket

    attempts: list[tuple[Any, ...]] = []
    real_connect = socket.socket.connect

    def guarded_connect(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else None
        if self.family == socket.AF_UNIX or host in ("localhost", "::1") or str(host).startswith("127."):
            return real_connect(self, address)
        attempts.append(address)
        raise OSError("network access is not allowed in unit tests")

    real_getaddrinfo = socket.getaddrinfo

    def guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in (None, "localhost", "::1") or str(host).startswith("127."):
            return real_getaddrinfo(host, *args, **kwargs)
        attempts.append((host, *args[:1]))
        raise socket.gaierror(socket.EAI_NONAME, "network access is not allowed in unit tests")

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return attempts
