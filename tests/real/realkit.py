"""Helpers of the real tier (tests/real): the VLLMService specs, the models the processes load, and
:class:`RealCluster` (the simulated cluster with real vLLM processes; conftest.py builds one per session)."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import requests

from kit.api import poll
from kit.specs import condition
from vllm_operator.api.model_config import ModelConfigSubset
from vllm_operator.modelfiles import model_files_from_inline
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator_sim.cluster import SimulatedCluster
from vllm_operator_sim.realvllm import RealVLLM, ServiceProxy, tiny_llama_config
from vllm_operator_sim.startup import HiddenFacts, StartupOutcome, simulate_startup

#: The vLLM release the tier installs (Makefile VLLM_REAL_VERSION); the operator plans for the same one.
VLLM_VERSION = os.environ.get("VLLM_REAL_VERSION", "0.32.0")
IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
#: The model id the VLLMServices name; its config is given inline and the process loads the same config.
TINY = "acme/tiny-llama"
#: A tiny Llama that claims a 2,097,152-token context: more than 1 GiB of CPU KV cache holds.
TINY_LONG = "acme/tiny-llama-long"
LONG_CONTEXT = 2_097_152
#: The same context at 1 KiB a token: an L4's KV cache holds all of it (the plan renders `--max-model-len auto`);
#: 1 GiB of CPU KV cache holds 1,048,576 tokens, so vLLM's auto-fit starts with those.
TINY_AUTO = "acme/tiny-llama-auto"
#: A 13B-parameter Llama (26 GB in bfloat16): one L4 cannot hold it, two can, so with `maxNodes: 2` on the cluster's
#: one-GPU nodes the operator renders a LeaderWorkerSet group of two (test_multinode.py).
GROUP_MODEL = "acme/llama-13b-group"
MODELS: dict[str, dict[str, Any]] = {
    TINY: tiny_llama_config(),
    TINY_AUTO: tiny_llama_config(max_position_embeddings=LONG_CONTEXT),
    # 16 layers × 2 × 4 KV heads × 64 × 2 bytes = 16 KiB a token: its 2**21-token context needs 32 GiB of KV cache,
    # more than an L4 holds, so the plan is an explicit, fitted length (never `--max-model-len auto`, which would
    # let vLLM fit it without an error) — and far more than VLLM_CPU_KVCACHE_SPACE=1 (65,536 tokens) holds
    TINY_LONG: {**tiny_llama_config(max_position_embeddings=LONG_CONTEXT), "num_hidden_layers": 16,
                "num_key_value_heads": 4},
    GROUP_MODEL: {**tiny_llama_config(), "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 40,
                  "num_hidden_layers": 40, "intermediate_size": 13824, "vocab_size": 32000},
}
#: What the processes load where it is not the model the VLLMService declares (realvllm.MAPPED "MODEL"): the group's
#: ranks run the tiny Llama (2 layers, one per pipeline stage), as 2 cores cannot run 13B parameters.
LOADS: dict[str, dict[str, Any]] = {GROUP_MODEL: tiny_llama_config()}
#: How long a real process may take to become Ready here (~60 s on 2 idle cores; CI machines are busy).
READY_S = 420.0
ECHOED: list[str] = []


def echo(line: str) -> None:
    ECHOED.append(line)
    print(line, file=sys.__stderr__, flush=True)


def inline_config(model: str) -> dict[str, Any]:
    """The model's config.json as a VLLMService carries it inline: the keys the planner reads (the CRD's typed
    subset; kubectl's strict validation, and the emulated API server's, refuse the rest)."""
    return ModelConfigSubset.model_validate(MODELS[model]).model_dump(mode="python", by_alias=True, exclude_none=True)


def tiny_spec(model: str = TINY, **extra: Any) -> dict[str, Any]:
    """A VLLMService spec for the tiny model on one L4, planned for the installed vLLM release."""
    return {"model": {"name": model, "config": inline_config(model)}, "gpu": {"product": "NVIDIA-L4"},
            "image": IMAGE, **extra}


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


# --- the simulator against the real process: the lines the operator reads ---------------------------------------

#: vLLM's record: "(APIServer pid=8765) INFO 11-27 15:53:47 [api_utils.py:347] message" (the message keeps its "\r").
RECORD = re.compile(r"^\((?P<proc>[^()]*?) pid=\d+\) (?P<level>[A-Z]+) \d\d-\d\d \d\d:\d\d:\d\d "
                    r"\[(?P<src>[^\]]+)\] (?P<msg>.*)$")
_BANNER = re.compile(r"(?:vLLM API server version|vLLM server version| version) \d+\.\d+")


def simulated_run(pod: dict[str, Any], config: dict[str, Any]) -> StartupOutcome:
    """The simulator's run of the pod's rendered vLLM container (its args, image and env) on an L4, for the model
    the VLLMService declares: what the simulated kubelet would have shown for this very pod."""
    container = pod["spec"]["containers"][0]
    args = [*container["command"], *container["args"]]
    env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
    return simulate_startup(args, container["image"], load_gpu_catalog().get("L4"), HiddenFacts(),
                            model_files_from_inline(config, None, args[2]), gpu_count=1, env=env)


def operator_lines(text: str, model: str) -> dict[str, list[str]]:
    """The lines of a vLLM log the operator and its users read, normalised where a CPU process and a simulated GPU
    differ by nature (the device word, the figures, the address, the source line of the KV line, the model path):
    ``banner`` (the record(s) stating the release: "(process) [source] message", model path → MODEL),
    ``kv`` (the KV cache line), ``listening`` ("Starting vLLM … on ADDRESS") and ``startup`` (uvicorn's)."""
    found: dict[str, list[str]] = {"banner": [], "kv": [], "listening": [], "startup": []}
    records = [(m["proc"], m["src"], m["msg"]) for line in text.split("\n") if (m := RECORD.match(line))]
    at = next((i for i, (_, _, msg) in enumerate(records) if _BANNER.search(msg)), None)
    if at is not None:
        while at > 0 and records[at - 1][:2] == records[at][:2]:  # the logo record starts lines above "version"
            at -= 1
        first = records[at][:2]
        while at < len(records) and records[at][:2] == first:
            proc, src, msg = records[at]
            found["banner"].append(f"({proc}) [{src}] {msg.replace(model, 'MODEL')}")
            at += 1
    for proc, src, msg in records:
        if "KV cache size:" in msg:
            shape = re.sub(r"\d[\d,.]*", "N", re.sub(r"\b(?:GPU|CPU)\b", "DEVICE", msg))
            found["kv"].append(f"({proc}) [{src.split(':')[0]}] {shape}")
        if msg.startswith("Starting vLLM"):
            address = re.sub(r"http://\S+", "http://ADDRESS", msg)
            found["listening"].append(f"({proc}) [{src}] {address}")
    found["startup"] = [line.strip() for line in text.split("\n")
                        if line.strip() == "INFO:     Application startup complete."]
    return found
