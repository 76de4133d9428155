"""Fixtures for tests against the emulated Kubernetes API (served over real HTTP on loopback)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.inprocess import Cluster
from vllm_operator_sim.emulator import EmulatedAPIServer


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[EmulatedAPIServer]:
    """A started :class:`EmulatedAPIServer` on ``127.0.0.1`` with a free port, stopped at teardown.

    It has ``.url``, ``.kubeconfig_path`` (a kubeconfig in ``tmp_path``), ``.emulator`` (the state),
    and the emulator's direct helpers (``create_object``, ``get_object``, ``wait_for``...) on itself.
    """
    server = EmulatedAPIServer().start()
    try:
        server.write_kubeconfig(tmp_path / 'kubeconfig')
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """The in-process operator against the emulated API with one GPU node (a file may define its own `cluster`)."""
    env = Cluster(tmp_path)
    env.add_gpu_node()
    try:
        yield env
    finally:
        env.close()
