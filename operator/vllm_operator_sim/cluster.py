"""A simulated GPU cluster on loopback: the emulated API server, GPU nodes with GFD labels, the simulated kubelet,
and (on request) the real operator as a subprocess.

    with SimulatedCluster(pools=[("L4", 4), ("A100-SXM4-40GB", 2)]) as cluster:
        cluster.start_operator()
        cluster.apply(vllmservice)
        cluster.wait_for(lambda: ...)

Each pool entry is one node type: ``(gpu, gpus_per_node)`` or ``(gpu, gpus_per_node, nodes)`` or a
:class:`NodePool`. Nodes carry the labels NVIDIA GPU Feature Discovery writes (``nvidia.com/gpu.product``,
``.memory``, ``.count``, ``.family``, ``.compute.major/minor``, ``.present``), ``nvidia.com/gpu`` capacity and
allocatable, host memory and CPU, and the usual ``nvidia.com/gpu:NoSchedule`` taint. The VLLMService CRD is
registered from the package's own definition (``vllm_operator.api.crd.build_crd``), so no repository files are
needed. Deployments, StatefulSets (:mod:`vllm_operator_sim.statefulset`) and DaemonSets are always served and
controlled; the LeaderWorkerSet API only with ``leaderworkerset=True`` (the default), so ``leaderworkerset=False`` is
a cluster without it. Everything listens on 127.0.0.1 only; :meth:`SimulatedCluster.stop` stops all of it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from vllm_operator.api.crd import build_crd
from vllm_operator.api.v1alpha1 import GROUP, PLURAL
from vllm_operator.planner.gpus import GPUSpec, load_gpu_catalog

from . import dra
from .clock import DEFAULT_SPEED, SimClock
from .emulator import APIError, EmulatedAPIServer, KubeEmulator
from .kubelet import Kubelet, SimEvent
from .lws import slim_crd
from .pacer import DEFAULT_QUIET_S, Pacer
from .scenarios import ScenarioSet, load_scenarios
from .volumes import NETWORK_PROVISIONER

__all__ = ["DEFAULT_POOLS", "NodePool", "SimulatedCluster", "gpu_node"]

T = TypeVar("T")
#: The field manager `SimulatedCluster.apply` writes as (kubectl's, for a client-side apply).
APPLY_MANAGER = "kubectl-client-side-apply"


@dataclass(frozen=True)
class NodePool:
    """``nodes`` nodes, each with ``gpus_per_node`` GPUs of one catalog SKU."""

    gpu: str
    gpus_per_node: int = 1
    nodes: int = 1
    memory_gib: int | None = None  # host memory per node (default: 64 GiB + 96 GiB per GPU)
    cpu: int | None = None


DEFAULT_POOLS: tuple[NodePool, ...] = (
    NodePool("L4", 4), NodePool("A100-SXM4-40GB", 4), NodePool("RTX-4090", 1), NodePool("H100-SXM-80GB", 8, 7))

_FAMILY = {"pascal": "pascal", "volta": "volta", "turing": "turing", "ampere": "ampere", "ada": "ada-lovelace",
           "hopper": "hopper", "blackwell": "blackwell"}


def _pool(entry: NodePool | Sequence[Any]) -> NodePool:
    if isinstance(entry, NodePool):
        return entry
    return NodePool(*entry)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def gpu_node(name: str, spec: GPUSpec, count: int, *, memory_gib: int | None = None, cpu: int | None = None,
             taint: bool = True) -> dict[str, Any]:
    """A Node as a GPU node with NVIDIA's device plugin and GPU Feature Discovery would look."""
    product = spec.gfd_products[0] if spec.gfd_products else spec.name
    memory = memory_gib or min(64 + 96 * count, 2048)
    cpus = cpu or min(8 + 12 * count, 224)
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": f"sim-{_slug(spec.name)}-x{count}",
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(spec.memory_mib), "nvidia.com/gpu.family": _FAMILY.get(spec.arch, spec.arch),
        "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/cuda.driver.major": "570", "nvidia.com/cuda.driver.minor": "133",
        "nvidia.com/cuda.runtime.major": "12", "nvidia.com/cuda.runtime.minor": "8",
        "nvidia.com/mig.capable": "true" if spec.arch in ("ampere", "hopper", "blackwell") and
        spec.tier == "datacenter" and spec.memory_mib >= 40000 else "false",
    }
    if spec.compute_capability:
        major, minor = spec.compute_capability.split(".")
        labels["nvidia.com/gpu.compute.major"] = major
        labels["nvidia.com/gpu.compute.minor"] = minor
    resources = {"cpu": str(cpus), "memory": f"{memory}Gi", "pods": "110", "nvidia.com/gpu": str(count),
                 "ephemeral-storage": "500Gi"}
    node: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}] if taint else []},
        "status": {
            "capacity": dict(resources), "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status (simulated)"}],
            "nodeInfo": {"kubeletVersion": "v1.32.0-sim", "kubeProxyVersion": "v1.32.0-sim",
                         "containerRuntimeVersion": "containerd://1.7.22", "kernelVersion": "5.15.0-1071-nvidia",
                         "osImage": "Ubuntu 22.04.5 LTS", "architecture": "amd64", "operatingSystem": "linux",
                         "machineID": _slug(name), "systemUUID": _slug(name), "bootID": _slug(name)},
            "addresses": [{"type": "Hostname", "address": name}],
        },
    }
    return node


class SimulatedCluster:
    """The emulated API server + GPU nodes + simulated kubelet (+ the operator, see :meth:`start_operator`)."""

    def __init__(self, pools: Iterable[NodePool | Sequence[Any]] = DEFAULT_POOLS, scenarios: ScenarioSet | None = None,
                 *, speed: float = DEFAULT_SPEED, clock: SimClock | None = None, workdir: str | Path | None = None,
                 image_pull_s: float = 30.0, tick_s: float = 0.02,
                 on_event: Callable[[SimEvent], None] | None = None,
                 default_storage_class: str | None = "standard", leaderworkerset: bool = True,
                 paced: bool = True, quiet_s: float = DEFAULT_QUIET_S, dra: bool = False) -> None:
        self.pools = [_pool(p) for p in pools]
        #: a StorageClass marked default, as most clusters have: the operator's default model cache is then a claim
        #: (network block storage: ReadWriteOnce, attached to one node at a time, reaching every node; volumes.py)
        self.default_storage_class = default_storage_class
        self.leaderworkerset = leaderworkerset
        self.dra = dra  # the resource.k8s.io/v1 API and NVIDIA's DRA driver's device class (vllm_operator_sim.dra)
        self.scenarios = scenarios if scenarios is not None else load_scenarios()
        self.clock = clock or SimClock(speed, paced=paced)
        # One clock for the API server and the kubelet: creation times, status times and ages agree.
        self.server = EmulatedAPIServer(KubeEmulator(now=self.clock.datetime_at))
        self.kubelet = Kubelet(self.server.emulator, self.clock, hidden=self.scenarios.hidden,
                               image_pull_s=image_pull_s, tick_s=tick_s, on_event=on_event)
        #: drives a paced clock: time moves only while the API and the operator are idle (vllm_operator_sim.pacer)
        self.pacer = Pacer(self.clock, self.kubelet, self.server.emulator, tick_s=tick_s, quiet_s=quiet_s,
                           processes=self._operator_pids) if self.clock.paced else None
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="vllm-sim-"))
        self.kubeconfig_path = self.workdir / "kubeconfig"
        self.operator: subprocess.Popen[bytes] | None = None
        self.operator_log_path = self.workdir / "operator.log"
        self._operator_log: IO[bytes] | None = None
        self.operator_returncode: int | None = None
        self.nodes: list[str] = []
        self._started = False

    @property
    def api(self) -> KubeEmulator:
        """The emulator's thread-safe direct API (create_object, get_object, list_objects, patch_*, …)."""
        return self.server.emulator

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> SimulatedCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.server.start()
        try:
            self.server.write_kubeconfig(self.kubeconfig_path)
            self.api.create_object("customresourcedefinitions", build_crd())
            if self.default_storage_class:
                self.api.create_object("storageclasses", {
                    "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                    "metadata": {"name": self.default_storage_class,
                                 "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
                    "provisioner": NETWORK_PROVISIONER, "volumeBindingMode": "WaitForFirstConsumer"})
            if self.leaderworkerset:  # the engine multi-node services run on (vllm_operator_sim.lws)
                self.api.create_object("customresourcedefinitions", slim_crd())
            if self.dra:  # GPUs shared by share groups (issue 26)
                for crd in dra.slim_crds():
                    self.api.create_object("customresourcedefinitions", crd)
                self.api.create_object("deviceclasses", dra.nvidia_device_class())
            catalog = load_gpu_catalog()
            for pool in self.pools:
                spec = catalog.get(pool.gpu)
                for i in range(pool.nodes):
                    name = f"gpu-{_slug(spec.name)}-{i}"
                    self.api.create_object("nodes", gpu_node(name, spec, pool.gpus_per_node,
                                                             memory_gib=pool.memory_gib, cpu=pool.cpu))
                    self.nodes.append(name)
            if self.pacer is not None:
                self.pacer.start()
            else:
                self.kubelet.start()
        except BaseException:
            self.stop()
            raise
        self._started = True
        return self

    def stop(self) -> None:
        """Stop the operator, the kubelet and the API server (idempotent); remove a temporary workdir."""
        self.stop_operator()
        if self.pacer is not None:
            self.pacer.stop()
        self.kubelet.stop()
        self.server.stop()
        self._started = False
        if self._own_workdir and os.environ.get("VLLM_OPERATOR_SIM_KEEP_WORKDIR") != "1":
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> SimulatedCluster:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # --- the operator ------------------------------------------------------------------------------------------

    def operator_command(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "vllm_operator.cli", "run", "-A", "--standalone", "--kubeconfig",
                str(self.kubeconfig_path), "--liveness", "", "--metrics-port", "0", *extra]

    def start_operator(self, *extra: str, env: Mapping[str, str] | None = None, timeout: float = 30.0) -> int:
        """Start `vllm-operator run` against this cluster; returns its pid once it watches VLLMServices."""
        if self.operator is not None:
            raise RuntimeError("the operator is already running")
        environment = {**os.environ, "KUBECONFIG": str(self.kubeconfig_path), "HF_HUB_OFFLINE": "1",
                       "PYTHONUNBUFFERED": "1", **(env or {})}
        self._operator_log = open(self.operator_log_path, "ab")  # noqa: SIM115 - closed in stop_operator
        self.operator = subprocess.Popen(self.operator_command(*extra), stdout=self._operator_log,
                                         stderr=subprocess.STDOUT, env=environment, cwd=str(self.workdir))
        deadline = time.monotonic() + timeout
        while not self._operator_watching():
            if self.operator.poll() is not None:
                tail = self.operator_log()[-2000:]
                self.stop_operator()
                raise RuntimeError(f"the operator exited with {self.operator_returncode} before it started:\n{tail}")
            if time.monotonic() > deadline:
                tail = self.operator_log()[-2000:]
                self.stop_operator()
                raise TimeoutError(f"the operator did not start watching VLLMServices in {timeout}s:\n{tail}")
            with contextlib.suppress(TimeoutError):
                self.api.wait_for(self._operator_watching, timeout=0.2, interval=0.05)
        return self.operator.pid

    def _operator_pids(self) -> tuple[int, ...]:
        process = self.operator
        return (process.pid,) if process is not None and process.returncode is None else ()

    @property
    def errors(self) -> list[str]:
        """What failed inside the simulation (kubelet ticks, the pacer), for tests and logs."""
        return [*self.kubelet.errors, *(self.pacer.errors if self.pacer is not None else [])]

    def _operator_watching(self) -> bool:
        return any(r.verb == "watch" and r.group == GROUP and r.resource == PLURAL for r in self.api.accessed())

    def operator_log(self) -> str:
        try:
            return self.operator_log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop_operator(self, timeout: float = 10.0) -> None:
        process = self.operator
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout)
            self.operator_returncode = process.returncode
            self.operator = None
        if self._operator_log is not None:
            self._operator_log.close()
            self._operator_log = None

    # --- objects -----------------------------------------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create the object, or update its spec (labels, annotations) if it exists — like `kubectl apply`: admitted
        as the API server admits a client's write (schema, CRD defaults such as `spec.replicas`, CEL rules; a 422
        :class:`APIError` when refused), so the operator's first write does not add a default and bump generation."""
        resource = self._resource_for(obj)
        ns = namespace or (obj.get("metadata") or {}).get("namespace") or "default"
        try:
            return self.api.create_object(resource, obj, namespace=ns, manager=APPLY_MANAGER)
        except APIError as exc:
            if exc.code != 409:
                raise
        meta = obj.get("metadata") or {}
        # every top-level field the object carries (spec, or data for a ConfigMap; none for a ServiceAccount)
        patch: dict[str, Any] = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}
        if meta.get("labels") or meta.get("annotations"):
            patch["metadata"] = {k: meta[k] for k in ("labels", "annotations") if meta.get(k)}
        return self.api.patch_object(resource, meta["name"], patch, ns, manager=APPLY_MANAGER)

    def _resource_for(self, obj: Mapping[str, Any]) -> str:
        kind = obj.get("kind") or ""
        api_version = obj.get("apiVersion") or ""
        group = api_version.rpartition("/")[0]
        for rdef in self.api.served_resources():
            if rdef.kind == kind and rdef.group == group:
                return rdef.plural if not group else f"{rdef.plural}.{group}"
        raise ValueError(f"the cluster does not serve {api_version} {kind}")

    def wait_for(self, predicate: Callable[[], T], timeout: float = 30.0, message: str = "") -> T:
        """Poll ``predicate`` (waking up on every API change) until truthy, for up to ``timeout`` real seconds."""
        return self.api.wait_for(predicate, timeout=timeout, message=message)
