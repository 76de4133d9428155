"""Helpers of the real tier (tests/real): the VLLMService specs, the models the processes load, and
:class:`RealCluster` (the simulated cluster with real vLLM processes; conftest.py builds one per session)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import requests

from kit.api import poll
from kit.specs import condition
from vllm_operator_sim.cluster import SimulatedCluster
from vllm_operator_sim.realvllm import RealVLLM, ServiceProxy, tiny_llama_config

#: The vLLM release the tier installs (Makefile VLLM_REAL_VERSION); the operator plans for the same one.
VLLM_VERSION = os.environ.get("VLLM_REAL_VERSION", "0.32.0")
IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
#: The model id the VLLMServices name; its config is given inline and the process loads the same config.
TINY = "acme/tiny-llama"
#: A tiny Llama that claims a 2,097,152-token context: more than 1 GiB of CPU KV cache holds (1,048,576 tokens).
TINY_LONG = "acme/tiny-llama-long"
LONG_CONTEXT = 2_097_152
MODELS: dict[str, dict[str, Any]] = {
    TINY: tiny_llama_config(),
    TINY_LONG: tiny_llama_config(max_position_embeddings=LONG_CONTEXT),
}
#: How long a real process may take to become Ready here (~60 s on 2 idle cores; CI machines are busy).
READY_S = 420.0
ECHOED: list[str] = []


def echo(line: str) -> None:
    ECHOED.append(line)
    print(line, file=sys.__stderr__, flush=True)


def tiny_spec(model: str = TINY, **extra: Any) -> dict[str, Any]:
    """A VLLMService spec for the tiny model on one L4, planned for the installed vLLM release."""
    return {"model": {"name": model, "config": MODELS[model]}, "gpu": {"product": "NVIDIA-L4"}, "image": IMAGE,
            **extra}


class RealCluster:
    """The simulated cluster with real vLLM processes, and the operator running against it."""

    def __init__(self, cluster: SimulatedCluster, runner: RealVLLM) -> None:
        self.cluster = cluster
        self.runner = runner
        self.api = cluster.api

    def service(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self.api.get_object("vllmservices", name, namespace)

    def wait_ready(self, name: str, timeout: float = READY_S) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            obj = self.service(name)
            return obj if condition(obj, "Ready").get("status") == "True" else None
        try:
            found: dict[str, Any] = poll(ready, timeout, f"VLLMService {name} Ready", interval=0.5)
        except AssertionError:
            raise AssertionError(f"{name} not Ready within {timeout}s: {(self.service(name) or {}).get('status')}\n"
                                 f"operator log:\n{self.cluster.operator_log()[-3000:]}") from None
        return found

    def pods(self, service: str, namespace: str = "default") -> list[dict[str, Any]]:
        return [p for p in self.api.list_objects("pods", namespace)
                if (p["metadata"].get("labels") or {}).get("vllm-operator.dev/service") == service]

    def pod_log(self, pod: str, namespace: str = "default", *, previous: bool = False) -> str:
        """The pod's log through the emulated API server over HTTP, as the operator and kubectl read it."""
        response = requests.get(f"{self.cluster.server.url}/api/v1/namespaces/{namespace}/pods/{pod}/log",
                                params={"previous": "true"} if previous else {}, timeout=10)
        response.raise_for_status()
        return response.text

    def ready_pods(self, service: str) -> list[dict[str, Any]]:
        return [p for p in self.pods(service) if condition(p, "Ready").get("status") == "True"]

    def proxy(self, service: str) -> ServiceProxy:
        return ServiceProxy(self.api, self.runner, "default", service)

    def delete(self, name: str, namespace: str = "default") -> None:
        """Delete the VLLMService; its children go (garbage collection), and with its pods their processes."""
        self.api.delete_object("vllmservices", name, namespace)
        poll(lambda: not self.pods(name, namespace), 180, f"pods of {name} deleted", interval=0.2)
        poll(lambda: not any(r.key.startswith(f"{namespace}/{name}") for r in self.runner.runs.values()), 60,
             f"processes of {name} stopped", interval=0.2)


def until(predicate: Callable[[], Any], timeout: float, message: str) -> Any:
    return poll(predicate, timeout, message, interval=0.5, retry_errors=True)


def elapsed(since: float) -> str:
    return f"{time.monotonic() - since:.0f} s"
