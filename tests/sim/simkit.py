"""Fixtures for the simulated cluster's tests: a startup-simulator toolbox, and a kubelet on a manual clock.

The kubelet tests use the emulator's direct API without serving HTTP and a :meth:`SimClock.manual` clock, so every
transition happens exactly when the test advances time (no sleeps, no threads).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest

from kit.api import emulated_api
from vllm_operator.planner.gpus import GPUSpec, load_gpu_catalog
from vllm_operator.render.manifests import OwnerRef, RenderInput, build_deployment
from vllm_operator.sources import ModelFiles, load_model_files
from vllm_operator_sim.clock import SimClock
from vllm_operator_sim.cluster import gpu_node
from vllm_operator_sim.emulator import EmulatedAPIServer, KubeEmulator
from vllm_operator_sim.kubelet import Kubelet, SimEvent
from vllm_operator_sim.startup import HiddenFacts
from vllm_operator_sim.volumes import NETWORK_PROVISIONER

IMAGE_026 = "vllm/vllm-openai:v0.26.0"
IMAGE_011 = "vllm/vllm-openai:v0.11.0"


@cache
def model(model_id: str) -> ModelFiles:
    return load_model_files(model_id, offline=True)


@cache
def gpu(name: str) -> GPUSpec:
    return load_gpu_catalog().get(name)


def serve_args(model_id: str, **flags: Any) -> list[str]:
    """`vllm serve MODEL --flag value ...` as the operator renders it (True → bare switch)."""
    args = ["vllm", "serve", model_id, "--host", "0.0.0.0", "--port", "8000"]
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False and value is not None:
            args += [flag, str(value)]
    return args


def deployment(name: str, model_id: str, flags: Mapping[str, Any], *, product: str = "NVIDIA-L4", gpus: int = 1,
               image: str = IMAGE_026, replicas: int = 1, memory: str | None = None,
               vllm_version: str | None = None, cached: bool = False, compile_cache: bool = False,
               hf_token_secret: str | None = None) -> dict[str, Any]:
    """A Deployment exactly as the operator renders it (labels, nodeSelector, tolerations, resources, args);
    `cached`: the model cache on a claim (`<name>-model-cache`) filled by the model-download init container;
    `compile_cache`: vLLM's compile caches on that claim too (what the operator renders for a persistent cache)."""
    files = model(model_id)
    cache: dict[str, Any] = {"cache_volume": {"persistentVolumeClaim": {"claimName": f"{name}-model-cache"}},
                             "download_init": True, "compile_cache": compile_cache} if cached else {}
    inp = RenderInput(name=name, namespace="default", owner=OwnerRef(name=name, uid=f"uid-{name}"), model=model_id,
                      image=image, vllm_version=vllm_version or image.rsplit(":v", 1)[-1], flags=dict(flags), gpu_count=gpus,
                      gpu_product_label=product, weights_gib_total=(files.total_size or 0) / 2**30,
                      replicas=replicas, memory=memory, hf_token_secret=hf_token_secret, **cache)
    deploy = build_deployment(inp)
    deploy["metadata"].pop("ownerReferences", None)  # no VLLMService owner in these tests
    return deploy


@dataclass
class SimHarness:
    api: KubeEmulator
    clock: SimClock
    kubelet: Kubelet
    server: EmulatedAPIServer
    hidden: dict[str, HiddenFacts] = field(default_factory=dict)
    events: list[SimEvent] = field(default_factory=list)

    def create_deployment(self, deploy: Mapping[str, Any]) -> dict[str, Any]:
        """Create the claims the Deployment's pods mount (ReadWriteOnce, the default class), as the operator creates
        its cache claim with the Deployment, then the Deployment: without them its pods would stay Pending
        (`persistentvolumeclaim "…" not found`), as on a cluster."""
        spec = ((deploy.get("spec") or {}).get("template") or {}).get("spec") or {}
        for volume in spec.get("volumes") or []:
            name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if name and self.api.get_object("persistentvolumeclaims", name, "default") is None:
                self.api.create_object("persistentvolumeclaims", {
                    "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "100Gi"}}}}, "default")
        return self.api.create_object("deployments", dict(deploy), "default")

    def run(self, seconds: float, step: float = 0.5) -> None:
        """Advance simulated time by ``seconds`` in steps, ticking the kubelet after each."""
        self.kubelet.tick()
        elapsed = 0.0
        while elapsed < seconds:
            self.clock.advance(min(step, seconds - elapsed))
            elapsed += step
            self.kubelet.tick()

    def run_until(self, predicate: Callable[[], Any], limit: float = 900.0, step: float = 0.5) -> float:
        """Advance until ``predicate()`` is truthy; returns the simulated time then. Fails after ``limit`` s."""
        self.kubelet.tick()
        start = self.clock.now()
        while not predicate():
            if self.clock.now() - start > limit:
                raise AssertionError(f"not reached within {limit} simulated seconds")
            self.clock.advance(step)
            self.kubelet.tick()
        return self.clock.now()

    def pods(self, service: str) -> list[dict[str, Any]]:
        return self.api.list_objects("pods", "default", label_selector=f"vllm-operator.dev/service={service}")

    def log(self, pod: str) -> str:
        """`GET pods/log` over HTTP, as kubectl logs and the operator read it."""
        url = f"{self.server.url}/api/v1/namespaces/default/pods/{pod}/log"
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback only
            text: str = response.read().decode()
        return text

    def container(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        return dict(statuses[0])


def default_storage_class(name: str = "standard") -> dict[str, Any]:
    """The simulated cluster's default class (network block storage, WaitForFirstConsumer), as SimulatedCluster
    creates it: without a class, claims never bind and their pods stay Pending, as on a cluster."""
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": NETWORK_PROVISIONER, "volumeBindingMode": "WaitForFirstConsumer"}


@pytest.fixture
def sim() -> Iterator[SimHarness]:
    """An emulated API (served on 127.0.0.1 for log reads) with one 4×L4 node and one 2×A100-40GB node, a default
    StorageClass, and a kubelet on a manual clock, driven by the test."""
    nodes = [gpu_node("gpu-l4-0", gpu("L4"), 4), gpu_node("gpu-a100-0", gpu("A100-SXM4-40GB"), 2)]
    with emulated_api(nodes=nodes) as server:
        api = server.emulator
        api.create_object("storageclasses", default_storage_class())
        clock = SimClock.manual()
        hidden: dict[str, HiddenFacts] = {}
        harness_events: list[SimEvent] = []
        kubelet = Kubelet(api, clock, hidden=lambda _ns, name: hidden.get(name, HiddenFacts()), image_pull_s=30.0,
                          on_event=harness_events.append)
        yield SimHarness(api=api, clock=clock, kubelet=kubelet, server=server, hidden=hidden, events=harness_events)
