"""The one way tests start the emulated Kubernetes API (``vllm_operator_sim.emulator``) on 127.0.0.1.

:func:`emulated_api` starts a server, optionally writes a kubeconfig, registers the project's CRD and creates
nodes and namespaces, and always stops the server. :func:`l4_node` is a GPU node as GPU Feature Discovery labels
it. :func:`poll` and :func:`http_get` are the waits and loopback reads the tests share.
"""

from __future__ import annotations

import contextlib
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import yaml

from vllm_operator_sim.emulator import EmulatedAPIServer

__all__ = ["CRD_PATH", "EXAMPLES", "REPO", "crd", "emulated_api", "http_get", "l4_node", "poll"]

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "vllmservices.vllm-operator.dev.yaml"
EXAMPLES = REPO / "examples"


@cache
def _crd_text() -> str:
    return CRD_PATH.read_text()


def crd() -> dict[str, Any]:
    """The project's generated CustomResourceDefinition (a fresh dict each call)."""
    loaded: dict[str, Any] = yaml.safe_load(_crd_text())
    return loaded


def l4_node(name: str = "gpu-1", count: int = 1, *, allocatable: bool = False) -> dict[str, Any]:
    """A node with NVIDIA L4 GPUs, labelled as GPU Feature Discovery labels it."""
    node: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": "23034"}}}
    if allocatable:
        node["status"] = {"allocatable": {"memory": "64Gi", "nvidia.com/gpu": str(count)}}
    return node


@contextlib.contextmanager
def emulated_api(kubeconfig: Path | None = None, *, with_crd: bool = False, nodes: Iterable[Mapping[str, Any]] = (),
                 namespaces: Iterable[str] = ()) -> Iterator[EmulatedAPIServer]:
    """A started :class:`EmulatedAPIServer` (ephemeral loopback port), stopped on exit.

    ``kubeconfig``: where to write a kubeconfig for it (``server.kubeconfig_path``); ``with_crd``: register the
    project's CRD; ``nodes``/``namespaces``: objects to create first.
    """
    server = EmulatedAPIServer().start()
    try:
        if kubeconfig is not None:
            server.write_kubeconfig(kubeconfig)
        if with_crd:
            server.create_object("customresourcedefinitions", crd())
        for node in nodes:
            server.create_object("nodes", node)
        for namespace in namespaces:
            server.create_object("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        yield server
    finally:
        server.stop()


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """(status, body) of a GET on loopback; (0, error) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback only)
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def poll(predicate: Callable[[], T], timeout: float = 20.0, message: str = "", interval: float = 0.1,
         *, retry_errors: bool = False) -> T:
    """Call ``predicate`` until it returns something truthy; AssertionError after ``timeout`` seconds.

    With ``retry_errors`` an exception counts as "not yet" (the last one is reported on timeout).
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except Exception as exc:
            if not retry_errors:
                raise
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise AssertionError((message or f"not met within {timeout}s: {predicate!r}") + detail)
        time.sleep(interval)
