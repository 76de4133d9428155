"""Every VLLMService gets an answer (issue 10, handler part), through the operator's kopf registry in-process against
the emulated API: an unexpected error in observe/plan/render becomes a condition and ONE Event and is not retried
on a timer; a child the API server refuses (422) becomes `ChildRejected` with the server's message; a reconcile
past its time bound does not hold up other services."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kit.inprocess import Cluster, condition
from vllm_operator import reconcile
from vllm_operator.handlers import config

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.fixture
def faulty(tmp_path: Path) -> Iterator[Cluster]:
    env = Cluster(tmp_path, faults=True)
    env.add_gpu_node()
    try:
        yield env
    finally:
        env.close()


def _wait_until(cluster: Cluster, name: str, type_: str, key: str, value: str,
                timeout: float = 20.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = cluster.service(name)
        return obj if (condition(obj, type_) or {}).get(key) == value else None

    found: dict[str, Any] = cluster.wait_for(check, timeout=timeout, message=f"{name}: {type_} {key}={value}")
    return found


def _wait_degraded(cluster: Cluster, name: str, reason: str, timeout: float = 20.0) -> dict[str, Any]:
    return _wait_until(cluster, name, "Degraded", "reason", reason, timeout)


def test_an_unexpected_error_is_answered_once_and_not_retried_until_the_spec_changes(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    original = reconcile.desired_state
    calls: list[str] = []

    def failing(observed: reconcile.Observed) -> reconcile.Desired:
        calls.append(observed.name)
        if observed.name == "boom" and observed.generation == 1:
            raise ZeroDivisionError("division by zero")
        return original(observed)

    monkeypatch.setattr(reconcile, "desired_state", failing)
    cluster.start_operator()
    cluster.create_service("boom", {"model": {"name": QWEN}})
    cluster.create_service("fine", {"model": {"name": QWEN}})

    obj = _wait_degraded(cluster, "boom", "ReconcileError")
    message = condition(obj, "Degraded")["message"]  # type: ignore[index]
    assert "ZeroDivisionError: division by zero" in message and "change the spec" in message
    assert obj["status"]["state"] == "ReconcileError"
    assert condition(obj, "Ready")["status"] == "False"  # type: ignore[index]
    cluster.wait_deployment("fine")  # the other service is not held up
    cluster.wait_quiet(quiet=2.5)  # kopf's error delays start at 1 s: a retry would have come
    assert calls.count("boom") == 1
    events = cluster.events("boom", "ReconcileError")
    assert len(events) == 1 and events[0]["type"] == "Warning" and "ZeroDivisionError" in events[0]["message"]
    assert cluster.deployment("boom") is None

    cluster.patch_spec("boom", {"workload": {"concurrency": 4}})  # a new generation is reconciled again
    cluster.wait_deployment("boom")
    obj = _wait_until(cluster, "boom", "Degraded", "status", "False")
    assert condition(obj, "Degraded")["reason"] == "AsExpected"  # type: ignore[index]
    assert len(cluster.events("boom", "ReconcileError")) == 1


def test_a_child_the_api_server_refuses_is_answered_with_the_servers_message(faulty: Cluster) -> None:
    assert faulty.faults is not None
    faulty.faults.add(method="POST", path=r"/namespaces/default/deployments$", status=422, times=None,
                      name="refuse")
    faulty.start_operator()
    faulty.create_service("refused", {"model": {"name": QWEN}})
    obj = _wait_degraded(faulty, "refused", "ChildRejected")
    message = condition(obj, "Degraded")["message"]  # type: ignore[index]
    assert "apply Deployment refused" in message and "(422)" in message
    assert obj["status"]["state"] == "ChildRejected"
    faulty.wait_quiet(quiet=2.5)
    posts = [r for r in faulty.faults.log if r.method == "POST" and r.path.endswith("/deployments")]
    assert len(posts) == 1, posts  # not retried: the same object would be refused again
    assert len(faulty.events("refused", "ChildRejected")) == 1


def test_a_reconcile_past_its_time_bound_does_not_hold_up_the_others(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    original = reconcile.desired_state
    release = threading.Event()

    def slow(observed: reconcile.Observed) -> reconcile.Desired:
        if observed.name.startswith("slow"):
            release.wait(30)
        return original(observed)

    monkeypatch.setattr(reconcile, "desired_state", slow)
    monkeypatch.setattr(config.CONFIG, "reconcile_timeout_seconds", 2.0)
    try:
        cluster.start_operator()
        for i in range(4):
            cluster.create_service(f"slow-{i}", {"model": {"name": QWEN}})
        start = time.monotonic()
        cluster.create_service("fast", {"model": {"name": QWEN}})
        cluster.wait_deployment("fast")
        assert time.monotonic() - start < 2.0 + 5.0  # generous under CPU load; the slow ones take 30 s
        obj = _wait_degraded(cluster, "slow-0", "ReconcileError")
        assert "took longer than 2 s" in condition(obj, "Degraded")["message"]  # type: ignore[index]
    finally:
        release.set()


@pytest.mark.parametrize(("spec", "reason"), [
    ({"model": {"name": QWEN}, "gpu": {"product": "no-such-gpu"}}, "InvalidSpec"),
    ({"model": {"name": "no-such-org/no-such-model"}}, "ModelNotFound"),
])
def test_invalid_and_unplannable_services_fill_every_column(cluster: Cluster, spec: dict[str, Any],
                                                            reason: str) -> None:
    cluster.start_operator()
    cluster.create_service("odd", spec)
    obj = _wait_degraded(cluster, "odd", reason)
    assert obj["status"]["state"] == reason  # the STATUS column
    assert condition(obj, "Ready")["status"] == "False"  # type: ignore[index]  # the READY column
    assert condition(obj, "Ready")["reason"] == reason  # type: ignore[index]  # the REASON column
    assert len(cluster.wait_events("odd", reason)) == 1


def test_a_new_service_whose_deployment_exists_already_is_patched_not_refused(cluster: Cluster) -> None:
    """A new service's children are created without reading them first; one that exists answers 409 and is read:
    the service's own (a previous operator got that far: its ownerReference and labels) is compared and applied
    instead; a leftover of the same name that is not the service's is left alone and named (NameConflict)."""
    obj = cluster.create_service("chat", {"model": {"name": QWEN}})  # the operator is not running yet
    owner = {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService", "name": "chat",
             "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    labels = {"app.kubernetes.io/managed-by": "vllm-operator", "vllm-operator.dev/service": "chat", "app": "x"}
    cluster.server.create_object("deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "default", "labels": labels, "ownerReferences": [owner],
                     "annotations": {"vllm-operator.dev/spec-hash": "old"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "x"}},
                 "template": {"metadata": {"labels": {"app": "x"}},
                              "spec": {"containers": [{"name": "vllm", "image": "old"}]}}}}, namespace="default")
    cluster.server.create_object("services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat", "namespace": "default"},
        "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80}]}}, namespace="default")
    cluster.start_operator()
    deployment = cluster.wait_deployment(
        "chat", lambda d: d["metadata"]["annotations"].get("vllm-operator.dev/spec-hash") != "old")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].startswith("vllm/vllm-openai:")
    _wait_until(cluster, "chat", "NameConflict", "status", "True")
    assert cluster.k8s_service("chat")["spec"]["selector"] == {"app": "theirs"}  # type: ignore[index]
    obj = _wait_until(cluster, "chat", "PlanFeasible", "status", "True")
    assert obj["status"]["state"] == "RollingOut"
