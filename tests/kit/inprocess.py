"""The operator under test, in one harness: the emulated API server (optionally behind the fault proxy), the CRD,
GPU nodes, and the real operator talking to it over HTTP — its kopf registry in a thread of the test process (fast),
or the `vllm-operator run` process (for restarts that must lose everything held in memory, and kill -9).

The test plays three roles:

* the user: creates and patches VLLMServices over HTTP with the kubernetes client (as kubectl would);
* the kubelet: creates the pods the Deployment would have (labels and annotations copied from its *current*
  template, as the ReplicaSet does) and writes their status exactly as the kubelet reports a crash-looping
  container: `lastState.terminated` (reason / exitCode / message / startedAt / finishedAt), `state.waiting`
  (`CrashLoopBackOff`), `restartCount`, the Ready/ContainersReady conditions; and the `pods/log` text;
* vLLM: the termination message is what `terminationMessagePolicy: FallbackToLogsOnError` leaves, the tail of a
  realistic vLLM log (the error texts come from `planner.messages`, vLLM's own format strings by release).

`Cluster(tmp_path, faults=True)` puts a `kit.faults.FaultProxy` between the operator and the API (`cluster.faults`);
the test's own requests go to the API directly. The operator can be stopped and started again against the same API
state (restart tests), or killed (`kill()`, SIGKILL). Every wait is a poll with a timeout (the emulator wakes
pollers on every change); "nothing more happened" is checked against a barrier that proves the operator has looked
(its `list pods` reads in the namespace, from the access log). Fixtures: `harness` (an in-process operator already
running, no nodes), `cluster` (`faulty_cluster_fixture`: behind the fault proxy, no operator yet), or build a
`Cluster` in the test module.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web
import attrs
import kopf
import kubernetes
import pytest
import yaml

from kit.faults import FaultProxy
from vllm_operator.api.v1alpha1 import GROUP, PLURAL, VERSION
from vllm_operator.handlers import kube
from vllm_operator.handlers import remediation as remediation_handlers
from vllm_operator.handlers.registry import registry
from vllm_operator.handlers.service import LeanAnnotationsDiffBaseStorage
from vllm_operator.planner import messages
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator.planner.versions import profile_for
from vllm_operator.render.manifests import ANNOTATION_PLAN
from vllm_operator_sim.emulator import AccessRecord, EmulatedAPIServer, KubeEmulator

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
CRD_PATH = REPO / "crds" / "vllmservices.vllm-operator.dev.yaml"
CORPUS_PATH = REPO / "tests" / "unit" / "data" / "vllm_failure_texts.yaml"
TIMEOUT = 15.0
#: Where kopf keeps the configuration it handled last, as the operator configures it (service.operator_startup).
_DIFFBASE = LeanAnnotationsDiffBaseStorage(prefix="vllm-operator.dev", key="last-handled-configuration")
# The kubelet's FallbackToLogsOnError: the last 80 lines of the log, at most 2048 bytes (kubelet/kuberuntime).
FALLBACK_LINES = 80
FALLBACK_BYTES = 2048


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------------------------------
# What vLLM prints (realistic logs around the release's own error texts)


def engine_failure_log(error: str, *, pid: int = 312, loaded: bool = True) -> str:
    """A V1 engine's last log lines when startup fails with `error` (an exception line: `ValueError: ...`).

    As vLLM ≥0.10 prints it: the engine core's ERROR records with its process tag, the traceback, the process's
    own re-raise, and the API server's wrapper exception last.
    """
    tag = f"(EngineCore_DP0 pid={pid})"
    head = f"{tag} ERROR 05-20 09:14:31 [core.py:1011]"
    lines = [
        f"{tag} INFO 05-20 09:13:20 [gpu_model_runner.py:2602] Starting to load model Qwen/Qwen2.5-7B-Instruct...",
    ]
    if loaded:
        lines += [
            f"{tag} INFO 05-20 09:14:02 [gpu_model_runner.py:2653] Model loading took 14.25 GiB and 41.2 seconds",
            f"{tag} INFO 05-20 09:14:31 [gpu_worker.py:298] Available KV cache memory: 1.71 GiB",
        ]
    lines += [
        f"{head} EngineCore failed to start.",
        f"{head} Traceback (most recent call last):",
        f'{head}   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1002, in '
        "run_engine_core",
        f"{head}     engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
        f"{head} {error}",
        f"{tag} Process EngineCore_DP0:",
        f"{tag} {error}",
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}",
    ]
    return "\n".join(lines) + "\n"


def serving_oom_log(oom: str) -> str:
    """The engine died of a CUDA OOM with nothing in the tail that says when (no request or startup lines): only
    the pod's readiness tells a run that was serving from one that never came up."""
    tag = "(EngineCore_DP0 pid=312)"
    head = f"{tag} ERROR 05-20 11:02:17 [core.py:720]"
    return "\n".join([
        f"{head} EngineCore encountered a fatal error.",
        f"{head} Traceback (most recent call last):",
        f'{head}   File "/usr/local/lib/python3.12/dist-packages/torch/utils/_contextlib.py", line 116, in '
        "decorate_context",
        f"{head} {oom}",
        "(APIServer pid=1) ERROR 05-20 11:02:17 [async_llm.py:480] AsyncLLM output_handler failed.",
        "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
        "trace (above) for the root cause.",
    ]) + "\n"


def kubelet_termination_message(log: str) -> str:
    """What FallbackToLogsOnError puts in `terminated.message`: the log's tail, 80 lines and 2048 bytes at most."""
    tail = "".join(log.splitlines(keepends=True)[-FALLBACK_LINES:])
    return tail.encode()[-FALLBACK_BYTES:].decode(errors="ignore")


def corpus_text(entry_id: str) -> str:
    """A text of the failure-text corpus (tests/unit/data/vllm_failure_texts.yaml) by its id."""
    for entry in yaml.safe_load(CORPUS_PATH.read_text())["texts"]:
        if entry["id"] == entry_id:
            return str(entry["text"])
    raise KeyError(entry_id)


def vllm_texts(version: str) -> dict[str, Callable[..., str]]:
    """The error texts of one vLLM release, by failure class (`planner.messages`, one place for all)."""
    profile = profile_for(version)
    return {
        "kv": lambda **kw: messages.kv_too_small_message(profile, **kw),
        "no_kv": lambda: messages.no_kv_memory_message(profile),
        "free": lambda **kw: messages.free_memory_message(profile, **kw),
        "oom": lambda **kw: messages.cuda_oom_message(**kw),
        "weights": lambda oom: messages.weights_oom_message(profile, oom),
    }


# --------------------------------------------------------------------------------------------------------------
# The cluster


def gpu_node(name: str, product: str = "NVIDIA-L4", count: int = 1, memory: str = "64Gi",
             memory_mib: int | None = None, *, memory_label: bool = False, **labels: str) -> dict[str, Any]:
    """A GPU node as GPU Feature Discovery labels it (product, count; `memory_label`: also nvidia.com/gpu.memory in
    MiB, from the catalog unless `memory_mib` is given), with allocatable host memory and extra `labels`."""
    if memory_label and memory_mib is None:
        with contextlib.suppress(Exception):
            memory_mib = load_gpu_catalog().get(product).memory_mib
    node_labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count),
                   "kubernetes.io/hostname": name, **labels}
    if memory_mib:
        node_labels["nvidia.com/gpu.memory"] = str(memory_mib)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": node_labels},
        "status": {"capacity": {"nvidia.com/gpu": str(count), "memory": memory, "cpu": "32"},
                   "allocatable": {"nvidia.com/gpu": str(count), "memory": memory, "cpu": "32"}},
    }


def vllmservice(name: str, spec: Mapping[str, Any], namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLLMService",
            "metadata": {"name": name, "namespace": namespace}, "spec": dict(spec)}


def container(deployment: Mapping[str, Any]) -> dict[str, Any]:
    """The vllm container of a rendered Deployment."""
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return dict(next(c for c in containers if c["name"] == "vllm"))


def flag_value(args: list[str], flag: str) -> str | None:
    """The value after `flag` in an argument list (None when absent or when it is a bare switch)."""
    if flag not in args:
        return None
    index = args.index(flag)
    return args[index + 1] if index + 1 < len(args) and not args[index + 1].startswith("--") else None


def vllm_container(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The vllm container of a Deployment or a Pod."""
    spec = obj["spec"]["template"]["spec"] if obj.get("kind") == "Deployment" else obj["spec"]
    return dict(next(c for c in spec["containers"] if c["name"] == "vllm"))


def args_of(deployment: Mapping[str, Any]) -> list[str]:
    return list(vllm_container(deployment)["args"])


def flag(args: list[str], name: str) -> str | None:
    """The value after `--name` (None when absent; "" for a bare switch)."""
    if name not in args:
        return None
    i = args.index(name)
    return args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""


def condition(obj: Mapping[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def remediation(obj: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(((obj or {}).get("status") or {}).get("remediation") or {})


def history(obj: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return list(remediation(obj).get("history") or [])


@attrs.define(kw_only=True, eq=False)
class SlowAPI(KubeEmulator):
    """The emulator with injectable latency: `slow[(method, path suffix)] = seconds` delays matching requests
    (before they are served), to make interleavings of concurrent handlers deterministic."""

    slow: dict[tuple[str, str], float] = attrs.field(factory=dict)

    async def _serve(self, raw: aiohttp.web.BaseRequest, body: bytes, params: dict[str, str]
                     ) -> aiohttp.web.StreamResponse:
        for (method, suffix), seconds in list(self.slow.items()):
            if raw.method == method and raw.path.endswith(suffix):
                await asyncio.sleep(seconds)
        return await super()._serve(raw, body, params)


class Cluster:
    """The emulator + CRD + nodes, and the operator: in-process (kopf with the operator's registry in a thread,
    its own event loop; fast) or as the real `vllm-operator run -A --standalone` process (`process=True`: a
    restart then loses everything held in memory, as a rescheduled operator pod does)."""

    def __init__(self, tmp_path: Path, namespace: str = "default", *, faults: bool = False) -> None:
        self.tmp_path = tmp_path
        self.namespace = namespace
        self.api_state = SlowAPI()
        self.server = EmulatedAPIServer(self.api_state).start()
        self.kubeconfig = self.server.write_kubeconfig(tmp_path / "kubeconfig")
        #: between the operator and the API when `faults`; the test's own requests go to the API directly
        self.faults: FaultProxy | None = FaultProxy(self.server.url).start() if faults else None
        self.operator_kubeconfig = (self.faults.write_kubeconfig(tmp_path / "operator-kubeconfig")
                                    if self.faults is not None else self.kubeconfig)
        self.server.create_object("customresourcedefinitions", yaml.safe_load(CRD_PATH.read_text()))
        self.api = kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        self.process: subprocess.Popen[bytes] | None = None
        self.thread: threading.Thread | None = None
        self._stop_flag: threading.Event | None = None
        self._thread_errors: list[BaseException] = []
        self._log_handler: logging.Handler | None = None
        self._kopf_level = logging.NOTSET
        self._saved_env = {k: os.environ.get(k) for k in ("KUBECONFIG", "HF_HUB_OFFLINE")}
        self.log_path = tmp_path / "operator.log"
        self.starts = 0

    # --- the operator -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return (self.process is not None and self.process.poll() is None) or (
            self.thread is not None and self.thread.is_alive())

    def start_operator(self, process: bool = False) -> None:
        assert self.process is None and self.thread is None, "the operator is already running"
        self.starts += 1
        with self.log_path.open("a") as log:
            log.write(f"\n===== operator start #{self.starts} ({'process' if process else 'in-process'}) =====\n")
        if process:
            self._start_process()
        else:
            self._start_thread()

    def _start_process(self) -> None:
        exe = Path(sys.executable).parent / "vllm-operator"
        command = [str(exe)] if exe.exists() else [sys.executable, "-m", "vllm_operator.cli"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "KUBECONFIG": str(self.operator_kubeconfig)}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [*command, "run", "-A", "--kubeconfig", str(self.operator_kubeconfig), "--standalone", "--liveness", "",
                 "--metrics-port", "0"], stdout=log, stderr=subprocess.STDOUT, env=env)

    def _start_thread(self, timeout: float = 10.0) -> None:
        # as `vllm-operator run` does: credentials for kopf's login handler and for the operator's REST helper
        os.environ["KUBECONFIG"] = str(self.operator_kubeconfig)
        os.environ["HF_HUB_OFFLINE"] = "1"
        kube.configure(str(self.operator_kubeconfig))
        handler = logging.FileHandler(self.log_path)
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(name)-20.20s [%(levelname)-8s] %(message)s"))
        for name in ("kopf", "vllm_operator"):
            logging.getLogger(name).addHandler(handler)
        self._kopf_level = logging.getLogger("kopf").level
        logging.getLogger("kopf").setLevel(logging.INFO)  # as `vllm-operator run`: kopf posts INFO logs as Events
        self._log_handler = handler
        stop, ready = threading.Event(), threading.Event()
        settings = kopf.OperatorSettings()  # the registry's operator_startup fills in the operator's own
        settings.peering.standalone = True
        # kopf keeps a per-object worker alive for idle_timeout (5 s) after its last event and waits for the
        # workers when stopping: a short one keeps teardowns and restarts fast without changing what is written.
        settings.queueing.idle_timeout = 0.3

        def target() -> None:
            try:
                asyncio.run(kopf.operator(registry=registry, settings=settings, clusterwide=True, standalone=True,
                                          stop_flag=stop, ready_flag=ready))
            except BaseException as exc:  # reported at stop
                self._thread_errors.append(exc)
                ready.set()

        self._stop_flag = stop
        self.thread = threading.Thread(target=target, name="vllm-operator-under-test", daemon=True)
        self.thread.start()
        if not ready.wait(timeout) or self._thread_errors:
            self.stop_operator()
            raise AssertionError(f"the operator did not start: {self._thread_errors!r}")

    def stop_operator(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM for the process, the stop flag in-process) once in-flight handlers finished."""
        if self.running:
            with contextlib.suppress(AssertionError):
                self.wait_quiet(0.2, timeout=5)  # kopf exits at once when no handler is running
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        thread, self.thread = self.thread, None
        if thread is not None and self._stop_flag is not None:
            self._stop_flag.set()
            thread.join(timeout)
            remediation_handlers.cancel_retries()  # the in-process operator's pending prompt retries
            assert not thread.is_alive(), "the operator did not stop in time"
        if self._log_handler is not None:
            for name in ("kopf", "vllm_operator"):
                logging.getLogger(name).removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None
            logging.getLogger("kopf").setLevel(self._kopf_level)
        errors, self._thread_errors = self._thread_errors, []
        assert not errors, f"the operator failed: {errors!r}"

    def kill(self) -> None:
        """kill -9 the operator process (nothing it holds in memory survives, nothing is finished)."""
        process, self.process = self.process, None
        assert process is not None, "kill() needs the operator process (start_operator(process=True))"
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def close(self) -> None:
        try:
            self.stop_operator()
        finally:
            with contextlib.suppress(Exception):
                self.api.close()
            if self.faults is not None:
                self.faults.stop()
            self.server.stop()
            for key, value in self._saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def operator_log(self, last: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-last:])

    # --- waiting ------------------------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], T | None], timeout: float = TIMEOUT, message: str = "") -> T:
        """Poll `predicate` (woken up on every API change) until it returns something truthy; return that."""
        try:
            result: T = self.server.wait_for(predicate, timeout=timeout, message=message)
            return result
        except TimeoutError as exc:
            died = (self.process is not None or self.thread is not None) and not self.running
            raise AssertionError(f"{exc}{' (the operator exited)' if died else ''}\n--- operator log ---\n"
                                 f"{self.operator_log()}") from None

    def remediation_reads(self) -> int:
        """How many times the operator listed the namespace's pods (once per remediation look)."""
        with self.server.emulator._state_lock:
            return sum(1 for r in self.server.emulator.access_log
                       if r.verb == "list" and r.resource == "pods" and r.namespace == self.namespace)

    def accessed(self, verb: str, resource: str, subresource: str | None = None) -> bool:
        return any(r.verb == verb and r.resource == resource and r.subresource == subresource
                   for r in self.server.accessed())

    # --- objects ------------------------------------------------------------------------------------

    def add_gpu_node(self, name: str = "gpu-1", product: str = "NVIDIA-L4", count: int = 1,
                     memory: str = "64Gi") -> None:
        self.server.create_object("nodes", gpu_node(name, product, count, memory))

    def add_node(self, name: str, product: str, count: int = 1, **labels: str) -> dict[str, Any]:
        """A GPU node with GFD's memory label too (from the catalog), and extra labels."""
        return self.server.create_object("nodes", gpu_node(name, product, count, memory_label=True, **labels))

    def create_service(self, name: str, spec: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create a VLLMService over HTTP, as a user (kubectl) would."""
        namespace = namespace or self.namespace
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, vllmservice(name, spec, namespace))
        return created

    create = create_service

    def create_unadmitted(self, name: str, spec: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Store a VLLMService the CRD's schema would refuse today (one stored before a CRD upgrade tightened it, or
        on a server that does not validate): the operator must still answer it."""
        namespace = namespace or self.namespace
        return dict(self.server.create_object(PLURAL, vllmservice(name, spec, namespace), namespace))

    def patch_spec(self, name: str, spec_patch: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Merge-patch the spec over HTTP, as a user would."""
        patched: dict[str, Any] = self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace or self.namespace, PLURAL, name, {"spec": dict(spec_patch)})
        return patched

    def delete(self, name: str, namespace: str | None = None) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace or self.namespace, PLURAL, name)

    def service(self, name: str, namespace: str | None = None) -> Any:
        """The VLLMService as stored now (None when it is gone)."""
        return self.server.get_object(PLURAL, name, namespace or self.namespace)

    def deployment(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.server.get_object("deployments", name, namespace or self.namespace)

    def k8s_service(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.server.get_object("services", name, namespace or self.namespace)

    def events(self, name: str | None = None, reason: str | None = None, namespace: str | None = None,
               component: str | None = "vllm-operator") -> list[dict[str, Any]]:
        """core/v1 Events about a VLLMService (by name; all when None), optionally by reason; by default only those
        the operator posted itself (kopf's own log events excluded)."""
        found = []
        for event in self.server.list_objects("events", namespace or self.namespace):
            involved = event.get("involvedObject") or {}
            if involved.get("kind") != "VLLMService" or name not in (None, involved.get("name")):
                continue
            if component is not None and (event.get("source") or {}).get("component") != component:
                continue
            if reason is None or event.get("reason") == reason:
                found.append(event)
        return found

    def wait_deployment(self, name: str, predicate: Callable[[dict[str, Any]], bool] = lambda _: True,
                        namespace: str | None = None, timeout: float = TIMEOUT, message: str = "") -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            deployment = self.deployment(name, namespace)
            return deployment if deployment is not None and predicate(deployment) else None
        return self.wait_for(check, timeout, message or f"Deployment {name} as expected")

    def wait_history(self, name: str, length: int, timeout: float = TIMEOUT) -> dict[str, Any]:
        """Wait until status.remediation.history has `length` entries (fails at once if it overshoots)."""
        def check() -> dict[str, Any] | None:
            obj = self.service(name)
            found = len(history(obj))
            assert found <= length, f"{found} remediation steps, expected {length}: {history(obj)}"
            return obj if found == length else None
        return self.wait_for(check, timeout, f"{name}: {length} remediation step(s)")

    def wait_remediation(self, name: str, predicate: Callable[[dict[str, Any]], bool],
                         timeout: float = TIMEOUT, message: str = "") -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            obj = self.service(name)
            return obj if predicate(remediation(obj)) else None
        return self.wait_for(check, timeout, message or f"{name}: status.remediation as expected")

    def wait_condition(self, name: str, type_: str, status: str, reason: str | None = None,
                       namespace: str | None = None, timeout: float = TIMEOUT) -> dict[str, Any]:
        """Wait until the VLLMService has the condition; returns the whole object."""
        def check() -> dict[str, Any] | None:
            obj = self.service(name, namespace)
            found = condition(obj, type_)
            ok = found is not None and found["status"] == status and (reason is None or found["reason"] == reason)
            return obj if ok else None
        return self.wait_for(check, timeout, f"{name}: {type_}={status} ({reason})")

    def wait_events(self, name: str, reason: str, count: int = 1, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
        def check() -> list[dict[str, Any]] | None:
            found = self.events(name, reason)
            return found if len(found) >= count else None
        return self.wait_for(check, timeout, f"{count} Event(s) {reason} about {name}")

    def wait_settled(self, name: str, namespace: str | None = None, timeout: float = TIMEOUT,
                     quiet: float = 0.5) -> dict[str, Any]:
        """Wait until kopf has finished with the object as it is now (the last-handled configuration it stored is
        this spec's, no handler progress is pending) and the API has seen no request for `quiet` seconds.

        The stored configuration is compared, not merely found: after an edit the previous one is still there, and
        on a busy machine the operator may not have looked at the edit before the API was quiet for `quiet` s."""
        def handled() -> dict[str, Any] | None:
            obj = self.service(name, namespace)
            if obj is None:
                return None
            body = kopf.Body(obj)
            progress = ((obj.get("status") or {}).get("kopf") or {}).get("progress")
            stored = _DIFFBASE.fetch(body=body)
            done = stored is not None and stored == _DIFFBASE.build(body=body) and not progress
            return obj if done and (obj.get("status") or {}).get("observedGeneration") else None
        self.wait_for(handled, timeout, f"kopf finished handling {name}")
        self.wait_quiet(quiet, timeout)
        result = self.service(name, namespace)
        assert result is not None
        return dict(result)

    def wait_looked(self, since: int, timeout: float = TIMEOUT) -> None:
        """Barrier: the operator has read the pods again since `since` (a `remediation_reads()` value)."""
        self.wait_for(lambda: self.remediation_reads() > since, timeout, "the operator looked at the pods")

    def wait_quiet(self, quiet: float = 0.3, timeout: float = TIMEOUT) -> None:
        """Poll the access log until the operator sent no request for `quiet` seconds (open watches excluded)."""
        emulator = self.server.emulator
        deadline = time.monotonic() + timeout
        last, since = len(emulator.access_log), time.monotonic()
        while time.monotonic() - since < quiet:
            assert time.monotonic() < deadline, f"the operator did not go quiet for {quiet}s within {timeout}s"
            with emulator._changed:
                emulator._changed.wait(0.05)
            count = len(emulator.access_log)
            if count != last:
                last, since = count, time.monotonic()

    # --- what was written (the access log is appended to under the emulator's state lock: read it under it) ---

    def request_count(self) -> int:
        with self.server.emulator._state_lock:
            return len(self.server.emulator.access_log)

    def clear_access_log(self) -> None:
        with self.server.emulator._state_lock:
            self.server.emulator.access_log.clear()

    def writes(self) -> list[AccessRecord]:
        """Write requests (create/update/patch/delete) in the access log, in order."""
        with self.server.emulator._state_lock:
            return [r for r in self.server.emulator.access_log if r.verb in WRITE_VERBS]

    def recorded_requests(self) -> list[Any]:
        """kmock's request records (method, url, data), newest last; bounded by max_recorded_requests."""
        return list(self.server.emulator)

    # --- the kubelet --------------------------------------------------------------------------------

    def crashed_pod(self, deployment: Mapping[str, Any], pod_name: str, *, restart_count: int = 1,
                    message: str = "", reason: str = "Error", exit_code: int = 1, ready_before: bool = False,
                    log: str | None = None) -> dict[str, Any]:
        """Create a pod of `deployment`'s current template whose vllm container is crash-looping.

        `ready_before`: the run that died had become Ready (the Ready/ContainersReady conditions turned False
        when it died, after it started), as after a CUDA OOM while serving. `log`: the container's log
        (`pods/log`), set before the pod appears so the operator's first look finds it.
        """
        if log is not None:
            self.server.set_pod_log(self.namespace, pod_name, log, container="vllm")
        return self._pod_of(deployment, pod_name, self.crashed_status(
            vllm_container(deployment)["image"], restart_count=restart_count, message=message, reason=reason,
            exit_code=exit_code, ready_before=ready_before))

    def _pod_of(self, deployment: Mapping[str, Any], pod_name: str, status: dict[str, Any]) -> dict[str, Any]:
        """The pod the ReplicaSet would create from the Deployment's current template, on gpu-1, with `status`."""
        template = deployment["spec"]["template"]
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": self.namespace,
                         "labels": copy.deepcopy(template["metadata"].get("labels") or {}),
                         "annotations": copy.deepcopy(template["metadata"].get("annotations") or {})},
            "spec": {**copy.deepcopy(template["spec"]), "nodeName": "gpu-1"},
            "status": status,
        }
        return self.server.create_object("pods", pod, self.namespace)

    def crash_again(self, pod_name: str, *, restart_count: int, message: str = "", reason: str = "Error",
                    exit_code: int = 1, ready_before: bool = False) -> dict[str, Any]:
        """The same pod's container died once more (the kubelet's status update after the next run)."""
        pod = self.server.get_object("pods", pod_name, self.namespace)
        assert pod is not None
        image = vllm_container(pod)["image"]
        status = self.crashed_status(image, restart_count=restart_count, message=message, reason=reason,
                                     exit_code=exit_code, ready_before=ready_before)
        return self.server.patch_status("pods", pod_name, status, self.namespace)

    def touch_pod_status(self, pod_name: str, n: int) -> dict[str, Any]:
        """An unrelated status update (what the kubelet re-sends on every sync): same failure, new details."""
        pod = self.server.get_object("pods", pod_name, self.namespace)
        assert pod is not None
        status = copy.deepcopy(pod["status"])
        vllm = next(c for c in status["containerStatuses"] if c["name"] == "vllm")
        vllm["state"] = {"waiting": {"reason": "CrashLoopBackOff",
                                     "message": f"back-off {10 * 2 ** n}s restarting failed container=vllm "
                                                f"pod={pod_name}_{self.namespace}"}}
        status["podIPs"] = [{"ip": f"10.0.7.{n + 10}"}]
        status["podIP"] = f"10.0.7.{n + 10}"
        return self.server.patch_status("pods", pod_name, status, self.namespace)

    @staticmethod
    def crashed_status(image: str, *, restart_count: int, message: str, reason: str, exit_code: int,
                       ready_before: bool) -> dict[str, Any]:
        now = datetime.now(UTC)
        started = now - timedelta(minutes=30 if ready_before else 2)
        finished = now - timedelta(seconds=5)
        # Ready turned False when the container died (after it had started) if it had been Ready; else it has
        # been False since the pod was created, before this run started.
        not_ready_since = finished if ready_before else started - timedelta(minutes=1)
        conditions = [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": _rfc3339(started)},
            {"type": "Initialized", "status": "True", "lastTransitionTime": _rfc3339(started)},
            {"type": "Ready", "status": "False", "lastTransitionTime": _rfc3339(not_ready_since),
             "reason": "ContainersNotReady", "message": "containers with unready status: [vllm]"},
            {"type": "ContainersReady", "status": "False", "lastTransitionTime": _rfc3339(not_ready_since),
             "reason": "ContainersNotReady", "message": "containers with unready status: [vllm]"},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": _rfc3339(started)},
        ]
        terminated: dict[str, Any] = {"exitCode": exit_code, "reason": reason, "startedAt": _rfc3339(started),
                                      "finishedAt": _rfc3339(finished),
                                      "containerID": f"containerd://{restart_count:064x}"}
        if message:
            terminated["message"] = message
        return {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": "10.0.0.11",
            "podIP": "10.0.7.9",
            "startTime": _rfc3339(started - timedelta(minutes=1)),
            "containerStatuses": [{
                "name": "vllm", "image": image, "imageID": f"docker.io/{image}@sha256:{'ab' * 32}",
                "ready": False, "started": False, "restartCount": restart_count,
                "state": {"waiting": {"reason": "CrashLoopBackOff",
                                      "message": "back-off 40s restarting failed container=vllm"}},
                "lastState": {"terminated": terminated},
            }],
        }

    def image_pull_pod(self, deployment: Mapping[str, Any], pod_name: str,
                       reason: str = "ImagePullBackOff") -> dict[str, Any]:
        """A pod whose image cannot be pulled (never started: restartCount 0, no lastState)."""
        return self._pod_of(deployment, pod_name, self.image_pull_status(vllm_container(deployment)["image"], reason))

    @staticmethod
    def image_pull_status(image: str, reason: str) -> dict[str, Any]:
        message = (f'Back-off pulling image "{image}"' if reason == "ImagePullBackOff" else
                   f'rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/{image}": '
                   f'failed to resolve reference "docker.io/{image}": docker.io/{image}: not found')
        return {
            "phase": "Pending",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
            "containerStatuses": [{"name": "vllm", "image": image, "imageID": "", "ready": False,
                                   "started": False, "restartCount": 0,
                                   "state": {"waiting": {"reason": reason, "message": message}},
                                   "lastState": {}}],
        }


def plan_annotation(obj: Mapping[str, Any]) -> str | None:
    meta = obj["spec"]["template"]["metadata"] if obj.get("kind") == "Deployment" else obj["metadata"]
    return (meta.get("annotations") or {}).get(ANNOTATION_PLAN)


@pytest.fixture(name="harness")
def harness_fixture(tmp_path: Path) -> Iterator[Cluster]:
    """The emulator with the CRD and an operator running in-process; no GPU nodes (tests add their own)."""
    env = Cluster(tmp_path)
    try:
        env.start_operator()
        yield env
    finally:
        env.close()


@pytest.fixture(name="cluster")
def faulty_cluster_fixture(tmp_path: Path) -> Iterator[Cluster]:
    """The emulator with the CRD behind the fault proxy (`cluster.faults`); the test starts the operator."""
    env = Cluster(tmp_path, faults=True)
    try:
        yield env
    finally:
        env.close()


# --------------------------------------------------------------------------------------------------------------
# Ladder scenarios (shared by the handler and e2e tests of record-then-act)

QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"  # on one L4: TP 1, utilization 0.9, max-model-len 32768


def deploy(cluster: Cluster, name: str, spec: Mapping[str, Any] | None = None, *, process: bool = False,
           memory: str = "64Gi", timeout: float = 30.0) -> tuple[dict[str, Any], dict[str, Any]]:
    """One L4 node, the operator, a VLLMService of Qwen 7B (remediation without minimum interval, unless `spec`
    says otherwise); returns (Deployment, VLLMService) once it is planned."""
    cluster.add_gpu_node(memory=memory)
    cluster.start_operator(process=process)
    body: dict[str, Any] = {"model": {"name": QWEN_7B}, "remediation": {"minIntervalSeconds": 0}}
    for key, value in (spec or {}).items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    cluster.create_service(name, body)
    deployment = cluster.wait_deployment(name, timeout=timeout)

    def planned() -> dict[str, Any] | None:
        obj = cluster.service(name)
        return obj if ((obj or {}).get("status") or {}).get("plan") else None
    service = cluster.wait_for(planned, timeout, "status.plan written")
    return deployment, service


def no_kv_crash(service: Mapping[str, Any]) -> str:
    """NoKVCacheMemory as the service's vLLM release words it, as the kubelet's termination message."""
    error = vllm_texts(service["status"]["plan"]["vllmVersion"])["no_kv"]()
    return kubelet_termination_message(engine_failure_log(error))


def recorded_event_messages(cluster: Cluster, name: str) -> list[str]:
    return [str(e.get("message")) for e in cluster.events(name)]


def template_patches(cluster: Cluster, name: str) -> list[str]:
    """The plan annotations of the pod templates written to the Deployment `name`, in order (create, patches), as
    the API received them (from kmock's request records; consecutive repeats — a retried write — collapsed)."""
    seen: list[str] = []
    for record in cluster.recorded_requests():
        method = str(record.method).split(".")[-1].upper()
        url = str(record.url.path)
        if method not in ("POST", "PATCH") or "/deployments" not in url:
            continue
        if method == "PATCH" and not url.endswith(f"/deployments/{name}"):
            continue
        data = getattr(record, "data", None)
        if not isinstance(data, Mapping):
            continue
        if method == "POST" and (data.get("metadata") or {}).get("name") != name:
            continue
        template = (data.get("spec") or {}).get("template") or {}
        value = ((template.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PLAN)
        if value is not None and (not seen or seen[-1] != value):
            seen.append(value)
    return seen


def assert_ladder_invariants(cluster: Cluster, name: str, *, max_steps: int) -> list[dict[str, Any]]:
    """What must hold whatever failed on the way: every pod-template change appears exactly once in the history,
    steps never exceed maxSteps and count up one by one, the profile never moves back, and every recorded step's
    Event was posted. Returns the history."""
    from vllm_operator.api.v1alpha1 import RemediationEvent
    from vllm_operator.remediation.ladder import step_event

    obj = cluster.service(name)
    steps = history(obj)
    assert len(steps) <= max_steps and remediation(obj)["step"] <= max_steps, steps
    assert [h["step"] for h in steps] == list(range(1, len(steps) + 1)), steps
    keys = [f"{h['podUID']}/{h['restartCount']}" for h in steps]
    assert len(set(keys)) == len(keys), f"one failure, two steps: {keys}"
    for before, after in zip(steps, steps[1:], strict=False):
        assert after["flagsBefore"] == before["flagsAfter"], "a step did not start where the previous one ended"
    templates = template_patches(cluster, name)
    assert len(templates) == len(steps) + 1, f"{len(templates)} pod templates written for {len(steps)} steps"
    assert len(set(templates)) == len(templates), f"the profile moved back: {templates}"
    deployment = cluster.deployment(name)
    assert deployment is not None and plan_annotation(deployment) == templates[-1]
    posted = recorded_event_messages(cluster, name)
    for entry in steps:
        expected = step_event(RemediationEvent.model_validate(entry)).message[:1024]
        assert expected in posted, f"no Event for step {entry['step']}: {expected!r}"
    return steps
