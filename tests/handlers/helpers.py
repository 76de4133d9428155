"""A harness for handler tests: the emulated API server + the CRD + GPU nodes + the operator, in-process.

`OperatorHarness` starts an :class:`EmulatedAPIServer` on 127.0.0.1, registers the VLLMService CRD, and runs
kopf with the operator's own registry (``vllm_operator.handlers.service.registry``) in a background thread
with its own event loop and standalone peering. Credentials: kopf logs in through the registry's
``operator_login`` (``kopf.login_with_kubeconfig``, which reads ``$KUBECONFIG``) and the operator's REST helper
is configured explicitly with ``kube.configure(path)``. The operator can be stopped and started again against
the same API state (restart tests). Tests write through the kubernetes client over HTTP, as a user would, and
read through the emulator's thread-safe direct API; every wait is a poll with a timeout.

Use the ``harness`` fixture: import it into the test module with ``from helpers import harness_fixture``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import kopf
import kubernetes
import pytest
import yaml

from vllm_operator.api.v1alpha1 import GROUP, PLURAL, VERSION
from vllm_operator.handlers import kube
from vllm_operator.handlers.service import registry
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator_sim.emulator import AccessRecord, EmulatedAPIServer

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "vllmservices.vllm-operator.dev.yaml"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
DEFAULT_TIMEOUT = 15.0


def gpu_node(name: str, product: str, count: int = 1, memory_mib: int | None = None,
             **labels: str) -> dict[str, Any]:
    """A Node with NVIDIA GPU Feature Discovery labels (product, count, memory in MiB from the catalog)."""
    if memory_mib is None:
        with contextlib.suppress(Exception):
            memory_mib = load_gpu_catalog().get(product).memory_mib
    node_labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count),
                   "kubernetes.io/hostname": name, **labels}
    if memory_mib:
        node_labels["nvidia.com/gpu.memory"] = str(memory_mib)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels},
            "status": {"capacity": {"nvidia.com/gpu": str(count)}, "allocatable": {"nvidia.com/gpu": str(count)}}}


def vllmservice(name: str, spec: Mapping[str, Any], namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLLMService",
            "metadata": {"name": name, "namespace": namespace}, "spec": dict(spec)}


def condition(obj: Mapping[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The condition of this type in an object's status, or None."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


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


class OperatorHarness:
    """The emulator, the CRD, nodes and an in-process operator; see the module docstring."""

    def __init__(self, tmp_path: Path) -> None:
        self.server = EmulatedAPIServer().start()
        self.kubeconfig = self.server.write_kubeconfig(tmp_path / "kubeconfig")
        self.server.create_object("customresourcedefinitions", yaml.safe_load(CRD_PATH.read_text()))
        self.api = kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        self._thread: threading.Thread | None = None
        self._stop: threading.Event | None = None
        self._errors: list[BaseException] = []

    # --- lifecycle ----------------------------------------------------------------------------

    def start_operator(self, timeout: float = 10.0) -> None:
        """Run the operator's kopf registry in a thread (its own loop, standalone); returns once kopf is ready."""
        assert self._thread is None, "the operator is already running"
        kube.configure(str(self.kubeconfig))  # the REST helper the handlers use
        stop, ready = threading.Event(), threading.Event()
        settings = kopf.OperatorSettings()  # operator_startup fills in the operator's own settings
        settings.peering.standalone = True
        # kopf keeps a per-object worker alive for idle_timeout (5 s) after its last event and waits for the
        # workers when stopping: a short one keeps teardowns and restarts fast without changing what is written.
        settings.queueing.idle_timeout = 0.3

        def target() -> None:
            try:
                asyncio.run(kopf.operator(registry=registry, settings=settings, clusterwide=True, standalone=True,
                                          stop_flag=stop, ready_flag=ready))
            except BaseException as exc:  # reported at stop
                self._errors.append(exc)
                ready.set()

        self._stop = stop
        self._thread = threading.Thread(target=target, name="vllm-operator-under-test", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or self._errors:
            self.stop_operator()
            raise AssertionError(f"the operator did not start: {self._errors}")

    def stop_operator(self, timeout: float = 15.0) -> None:
        """Stop kopf and join its thread; fail if it did not stop or died with an error.

        It first lets the API go quiet briefly: kopf (1.45) does not cancel a timer spawned while it is stopping,
        and then waits 5 s for that "hung" task; letting in-flight handling finish avoids the race.
        """
        if self._thread is None or self._stop is None:
            return
        with contextlib.suppress(AssertionError):
            self.wait_quiet(quiet=0.2, timeout=5)
        self._stop.set()
        self._thread.join(timeout)
        alive = self._thread.is_alive()
        self._thread = self._stop = None
        assert not alive, "the operator did not stop in time"
        errors, self._errors = self._errors, []
        assert not errors, f"the operator failed: {errors!r}"

    def close(self) -> None:
        try:
            self.stop_operator()
        finally:
            self.api.close()
            self.server.stop()

    # --- the cluster --------------------------------------------------------------------------

    def add_node(self, name: str, product: str, count: int = 1, **labels: str) -> dict[str, Any]:
        return self.server.create_object("nodes", gpu_node(name, product, count, **labels))

    def create(self, name: str, spec: Mapping[str, Any], namespace: str = "default") -> dict[str, Any]:
        """Create a VLLMService over HTTP (the kubernetes client), as kubectl would."""
        result: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, vllmservice(name, spec, namespace))
        return result

    def patch_spec(self, name: str, spec_patch: Mapping[str, Any], namespace: str = "default") -> dict[str, Any]:
        """Merge-patch the spec over HTTP."""
        result: dict[str, Any] = self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, {"spec": dict(spec_patch)})
        return result

    def delete(self, name: str, namespace: str = "default") -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def service(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        """The VLLMService as stored now."""
        return self.server.get_object(PLURAL, name, namespace)

    def deployment(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self.server.get_object("deployments", name, namespace)

    def k8s_service(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self.server.get_object("services", name, namespace)

    def events(self, name: str | None = None, reason: str | None = None, namespace: str = "default",
               component: str | None = "vllm-operator") -> list[dict[str, Any]]:
        """core/v1 Events about a VLLMService (by involvedObject.name), optionally by reason and source."""
        found = []
        for event in self.server.list_objects("events", namespace):
            involved = event.get("involvedObject") or {}
            if involved.get("kind") != "VLLMService":
                continue
            if name is not None and involved.get("name") != name:
                continue
            if reason is not None and event.get("reason") != reason:
                continue
            if component is not None and (event.get("source") or {}).get("component") != component:
                continue
            found.append(event)
        return found

    # --- waiting ------------------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], T], timeout: float = DEFAULT_TIMEOUT, message: str = "") -> T:
        """Poll (waking up on every API change) until `predicate()` is truthy; fail with `message` otherwise."""
        try:
            return self.server.wait_for(predicate, timeout=timeout, message=message)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; operator errors: {self._errors!r}") from None

    def wait_deployment(self, name: str, predicate: Callable[[dict[str, Any]], bool] = lambda _: True,
                        namespace: str = "default", timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            deployment = self.deployment(name, namespace)
            return deployment if deployment is not None and predicate(deployment) else None
        return self.wait_for(check, timeout, f"Deployment {namespace}/{name} as expected")

    def wait_condition(self, name: str, type_: str, status: str, reason: str | None = None,
                       namespace: str = "default", timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        """Wait until the VLLMService has the condition; returns the whole object."""
        def check() -> dict[str, Any] | None:
            obj = self.service(name, namespace)
            found = condition(obj, type_)
            ok = found is not None and found["status"] == status and (reason is None or found["reason"] == reason)
            return obj if ok else None
        return self.wait_for(check, timeout, f"{namespace}/{name}: {type_}={status} ({reason})")

    def wait_settled(self, name: str, namespace: str = "default", timeout: float = DEFAULT_TIMEOUT,
                     quiet: float = 0.5) -> dict[str, Any]:
        """Wait until kopf has finished with the object (its last-handled annotation is there, no handler
        progress is pending) and the API has seen no request for `quiet` seconds."""
        def handled() -> dict[str, Any] | None:
            obj = self.service(name, namespace)
            if obj is None:
                return None
            annotations = obj["metadata"].get("annotations") or {}
            progress = ((obj.get("status") or {}).get("kopf") or {}).get("progress")
            done = "vllm-operator.dev/last-handled-configuration" in annotations and not progress
            return obj if done and (obj.get("status") or {}).get("observedGeneration") else None
        self.wait_for(handled, timeout, f"kopf finished handling {namespace}/{name}")
        self.wait_quiet(quiet, timeout)
        result = self.service(name, namespace)
        assert result is not None
        return result

    def wait_quiet(self, quiet: float = 0.5, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Poll the access log until no request arrived for `quiet` seconds (watches stay open, not counted)."""
        deadline = time.monotonic() + timeout
        last = self.request_count()
        since = time.monotonic()
        while time.monotonic() - since < quiet:
            if time.monotonic() > deadline:
                raise AssertionError(f"the API did not go quiet for {quiet}s within {timeout}s")
            time.sleep(0.02)  # the poll interval
            count = self.request_count()
            if count != last:
                last, since = count, time.monotonic()

    # --- what was written ---------------------------------------------------------------------

    # The access log is a deque the server thread appends to under the emulator's state lock: read it under it.

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


@pytest.fixture(name="harness")
def harness_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OperatorHarness]:
    """The emulator with the CRD and an operator running in-process; no GPU nodes (tests add their own)."""
    env = OperatorHarness(tmp_path)
    kopf_logger = logging.getLogger("kopf")
    level = kopf_logger.level
    kopf_logger.setLevel(logging.INFO)  # as `vllm-operator run` (kopf.configure): kopf posts INFO logs as Events
    monkeypatch.setenv("KUBECONFIG", str(env.kubeconfig))  # read by kopf.login_with_kubeconfig
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # catalog models only: never the network
    try:
        env.start_operator()
        yield env
    finally:
        env.close()
        kopf_logger.setLevel(level)
