"""The metrics watch against the emulated API server and a real Prometheus scraping a vLLM-like exporter.

The operator runs in-process (kit.inprocess.Cluster) with a Prometheus URL and a 1 s interval; the test plays the
kubelet (a vLLM pod appears to Prometheus, see tests/prometheus/conftest.py) and drives the pod's metrics. Checks:
status.metrics gets filled; sustained preemptions lower max-num-seqs in the Deployment's args and are recorded;
Prometheus stopped → MetricsAvailable=False (PrometheusUnreachable) and reconciles still work; a full cache with a
queue scales the Deployment within spec.maxReplicas, and turning the watch off scales it back. Two tests call one
round (`watch_service`) directly with a canned observation: a recommendation is recorded once; status writes are
rebuilt on a conflict.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import kopf
import pytest
import yaml

from kit.faults import FaultProxy
from kit.inprocess import (  # noqa: F401 (`harness`)
    CRD_PATH,
    Cluster,
    condition,
    container,
    flag_value,
    gpu_node,
    harness_fixture,
    vllmservice,
)
from vllm_operator.api import conditions as cond
from vllm_operator.handlers import config, kube
from vllm_operator.handlers import metrics_watch as watch  # registers the metrics daemon on the registry
from vllm_operator.handlers.service import reconcile_service
from vllm_operator.metrics.policy import MetricsAction, Observation, Point

QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"
POD = "qwen-7d9f8b6c5-x2x4z"


def _testkit() -> ModuleType:
    """tests/prometheus/conftest.py (the Prometheus + exporter helpers), under a name of its own."""
    name = "prometheus_testkit"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "prometheus" / "conftest.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Any]:
    """A Prometheus of this test's own (the test stops it), started before the operator."""
    started = _testkit().start_stack(tmp_path / "prometheus")
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def fast_metrics(stack: Any, monkeypatch: pytest.MonkeyPatch) -> config.OperatorConfig:
    """The operator reads `stack` every second; the policy window is 3 s (production: 10 min)."""
    cfg = config.OperatorConfig(prometheus_url=stack.url, metrics_interval_seconds=1, extra={
        "prometheus_rate_window": "3s",
        "metrics_policy": {"window_seconds": 3, "step_seconds": 1, "cooldown_seconds": 300},
    })
    monkeypatch.setattr(config, "CONFIG", cfg)
    return cfg


def _args(h: Cluster, name: str) -> list[str]:
    deployment = h.deployment(name)
    assert deployment is not None
    return list(container(deployment)["args"])


def test_metrics_fill_status_and_sustained_preemptions_lower_max_num_seqs(
        stack: Any, fast_metrics: config.OperatorConfig, harness: Cluster) -> None:
    h = harness
    h.add_node("gpu-1", "NVIDIA-L4")
    h.create("qwen", {"model": {"name": QWEN_7B}, "prometheus": {"enabled": True},
                      "remediation": {"minIntervalSeconds": 0}})
    h.wait_deployment("qwen")
    planned = h.wait_condition("qwen", "PlanFeasible", "True")["status"]["plan"]
    seqs = int(flag_value(_args(h, "qwen"), "--max-num-seqs") or 0)
    assert seqs == planned["flags"]["maxNumSeqs"] and seqs >= 4
    kv_tokens = planned["kvCacheTokens"]

    # No pod yet: Prometheus answers, but has no series of this service.
    h.wait_condition("qwen", cond.METRICS_AVAILABLE, "False", cond.NO_METRICS_FOUND)

    # The kubelet's part: a vLLM pod whose cache is full and preempts 2/s, with requests of a length such that the
    # cache holds 3/4 of max-num-seqs.
    holds = seqs * 3 // 4
    typical = kv_tokens // holds
    stack.add_pod("default", POD, "qwen", kv_cache_usage=0.99, waiting=6, running=seqs,
                  preemptions_per_second=2.0, requests_per_second=2.0,
                  prompt_tokens_per_request=typical * 3 // 4, generation_tokens_per_request=typical - typical * 3 // 4)

    observed = h.wait_condition("qwen", cond.METRICS_AVAILABLE, "True", cond.METRICS_OBSERVED, timeout=30)
    def filled() -> dict[str, Any] | None:
        m = ((h.service("qwen") or {}).get("status") or {}).get("metrics") or {}
        full = m.get("waiting") == 6 and m.get("kvCacheUsage") == 0.99 and m.get("running") == seqs
        return m if full and (m.get("preemptionRate") or 0) > 0.5 else None   # rate() needs two scrapes
    metrics = h.wait_for(filled, 30, "status.metrics filled")
    assert metrics["time"]
    assert "1 pod(s) reporting" in condition(observed, cond.METRICS_AVAILABLE)["message"]

    # Sustained preemptions over the window → max-num-seqs lowered to what the cache holds, in the Deployment.
    lowered = h.wait_deployment("qwen", lambda d: flag_value(container(d)["args"], "--max-num-seqs") != str(seqs),
                                timeout=30)
    expected = int(flag_value(container(lowered)["args"], "--max-num-seqs") or 0)
    assert max(seqs // 2, holds - 1) <= expected <= holds + 1 < seqs + 1   # kvCacheTokens / observed length
    service = h.wait_for(lambda: s if ((s := h.service("qwen")) or {}).get("status", {}).get("plan", {})
                         .get("flags", {}).get("maxNumSeqs") == expected else None, 10, "plan re-written")
    remediation = service["status"]["remediation"]
    assert remediation["step"] == 1 and remediation["profile"] == {"maxNumSeqs": expected}
    step = remediation["history"][-1]
    assert step["failureClass"] == "SustainedPreemption"
    assert (step["flagsBefore"]["maxNumSeqs"], step["flagsAfter"]["maxNumSeqs"]) == (seqs, expected)
    assert f"max-num-seqs {seqs} → {expected}" in step["message"] and "preemptions/s" in step["evidence"]
    events = h.wait_for(lambda: h.events("qwen", reason=watch.MAX_NUM_SEQS_LOWERED), 10, "an Event")
    assert len(events) == 1 and events[0]["type"] == "Warning"

    # One step per cooldown: the pod still preempts, status.metrics follows, the flags stay.
    stack.set_pod(f"default.{POD}", waiting=2)
    h.wait_for(lambda: ((h.service("qwen") or {}).get("status", {}).get("metrics") or {}).get("waiting") == 2,
               30, "status.metrics follows the pod")
    assert flag_value(_args(h, "qwen"), "--max-num-seqs") == str(expected)
    assert (h.service("qwen") or {})["status"]["remediation"]["step"] == 1

    # Prometheus goes away: the condition says so, status.metrics keeps the last values, reconciles go on.
    stack.prometheus.stop()
    down = h.wait_condition("qwen", cond.METRICS_AVAILABLE, "False", cond.PROMETHEUS_UNREACHABLE, timeout=15)
    assert "cannot connect" in condition(down, cond.METRICS_AVAILABLE)["message"]
    assert down["status"]["metrics"]["waiting"] == 2
    h.create("other", {"model": {"name": QWEN_7B}, "prometheus": {"enabled": True}})
    h.wait_deployment("other", timeout=15)
    h.wait_condition("other", "PlanFeasible", "True")
    h.wait_condition("other", cond.METRICS_AVAILABLE, "False", cond.PROMETHEUS_UNREACHABLE, timeout=15)

    # Deleting a watched service is not held up by its watch.
    h.delete("qwen")
    h.wait_for(lambda: h.service("qwen") is None, 15, "qwen deleted")


def test_a_full_cache_with_a_queue_scales_within_max_replicas_until_the_watch_is_turned_off(
        stack: Any, fast_metrics: config.OperatorConfig, harness: Cluster) -> None:
    h = harness
    h.add_node("gpu-1", "NVIDIA-L4")
    h.create("plain", {"model": {"name": QWEN_7B}})                       # not watched: prometheus not enabled
    h.create("busy", {"model": {"name": QWEN_7B}, "prometheus": {"enabled": True}, "replicas": 1,
                      "maxReplicas": 3})
    h.wait_settled("busy")
    h.wait_condition("busy", cond.METRICS_AVAILABLE, "False", cond.NO_METRICS_FOUND, timeout=15)

    # A full cache, 8 running and 8 waiting, no preemption: twice the capacity is needed → 2 replicas.
    stack.add_pod("default", "busy-5f6d7c8b9-bcdfg", "busy", kv_cache_usage=0.97, waiting=8, running=8)
    scaled = h.wait_deployment("busy", lambda d: d["spec"].get("replicas") == 2, timeout=30)
    assert scaled["spec"]["replicas"] == 2
    service = h.wait_for(lambda: s if (((s := h.service("busy")) or {}).get("status", {}).get("remediation") or {})
                         .get("history") else None, 10, "the scaling recorded")
    entry = service["status"]["remediation"]["history"][-1]
    assert entry["failureClass"] == "KVCacheSaturated"
    assert (entry["flagsBefore"], entry["flagsAfter"]) == ({"replicas": 1}, {"replicas": 2})
    assert "spec.maxReplicas 3" in entry["message"]
    assert service["spec"]["replicas"] == 1                               # the spec is never written
    assert h.wait_for(lambda: h.events("busy", reason=watch.SCALED_UP), 10, "an Event")[0]["type"] == "Normal"
    assert condition(h.service("plain"), cond.METRICS_AVAILABLE) is None

    # Turning the watch off: the daemon stops, replicas go back to spec.replicas, the condition says so.
    h.patch_spec("busy", {"prometheus": {"enabled": False}})
    h.wait_condition("busy", cond.METRICS_AVAILABLE, "Unknown", cond.METRICS_DISABLED, timeout=15)
    h.wait_deployment("busy", lambda d: d["spec"].get("replicas") == 1, timeout=10)


# --- one round, without kopf: watch_service with a canned observation ----------------------------


class _CannedReader:
    """Stands in for PrometheusReader: returns a fixed observation (the policy window's worth of samples)."""

    def __init__(self, observation: Observation) -> None:
        self.observation = observation

    def __enter__(self) -> _CannedReader:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def observe(self, namespace: str, service: str, **_: Any) -> Observation:
        return self.observation


def _saturated(now: datetime) -> Observation:
    end = now.timestamp()
    points = lambda value: tuple(Point(end - 30 * (20 - i), value) for i in range(21))  # noqa: E731
    return Observation(end=now, window_seconds=600, step_seconds=30, kv_cache_usage=points(0.98),
                       preemption_rate=points(0.0), waiting=points(8), running=points(8), pods=points(1),
                       selector='namespace="default"')


@pytest.fixture
def served(emulator: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The emulator with the CRD, an L4 node and one reconciled VLLMService (no operator running)."""


    emulator.create_object("customresourcedefinitions", yaml.safe_load(CRD_PATH.read_text()))
    emulator.create_object("nodes", gpu_node("gpu-1", "NVIDIA-L4", memory_label=True))
    obj = emulator.create_object("vllmservices", vllmservice("svc", {"model": {"name": QWEN_7B},
                                                                      "prometheus": {"enabled": True}}))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(config, "CONFIG", config.OperatorConfig(prometheus_url="http://127.0.0.1:9"))
    kube.configure(str(emulator.kubeconfig_path))
    reconcile_service("svc", "default", obj["metadata"]["uid"], 1, obj["spec"], {}, logging.getLogger("test"))
    return emulator


def test_a_recommendation_is_recorded_once_and_stays_within_the_spec(served: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime.now(UTC)
    monkeypatch.setattr(watch, "reader_for", lambda cfg=None: _CannedReader(_saturated(now)))
    decision = watch.watch_service("default", "svc", now=now)
    assert decision is not None and decision.action is MetricsAction.RECOMMEND_REPLICAS
    svc = served.get_object("vllmservices", "svc", "default")
    entry = svc["status"]["remediation"]["history"][-1]
    assert entry["failureClass"] == "KVCacheSaturated"
    assert entry["flagsAfter"] == {"replicas": 1, "recommendedReplicas": 2}
    assert "set spec.maxReplicas to 2" in entry["message"]
    observed = dict(svc["status"]["metrics"])
    assert "set spec.maxReplicas to 2" in observed.pop("recommendation")
    assert observed == {"kvCacheUsage": 0.98, "preemptionRate": 0.0, "waiting": 8.0, "running": 8.0,
                        "time": cond.format_time(now)}
    assert condition(svc, cond.METRICS_AVAILABLE)["reason"] == cond.METRICS_OBSERVED
    assert svc["spec"] == {"model": {"name": QWEN_7B}, "prometheus": {"enabled": True}}      # never written
    assert served.get_object("deployments", "svc", "default")["spec"]["replicas"] == 1   # only advised

    # The next round (same load): nothing new is recorded, nothing is written.
    version = svc["metadata"]["resourceVersion"]
    again = watch.watch_service("default", "svc", now=now)
    assert again is not None and again.action is MetricsAction.NONE
    svc = served.get_object("vllmservices", "svc", "default")
    assert len(svc["status"]["remediation"]["history"]) == 1 and svc["metadata"]["resourceVersion"] == version
    events = [e for e in served.list_objects("events", "default") if e["reason"] == watch.REPLICAS_RECOMMENDED]
    assert len(events) == 1 and events[0]["type"] == "Warning"


def test_status_writes_are_rebuilt_when_someone_wrote_in_between(served: Any) -> None:
    calls = []

    def build(status: dict[str, Any]) -> Any:
        calls.append(status)
        if len(calls) == 1:  # another writer gets in between this read and the write
            served.patch_status("vllmservices", "svc", {**status, "readyReplicas": 1}, "default")
        update = cond.ConditionUpdate(cond.METRICS_AVAILABLE, cond.FALSE, cond.PROMETHEUS_UNREACHABLE, "down")
        return cond.fold_status(status, conditions=[update], observed_generation=status.get("observedGeneration"),
                                now=datetime.now(UTC))

    assert watch.update_status("default", "svc", build) is True
    assert len(calls) == 2                                                  # 409, read again, built again
    svc = served.get_object("vllmservices", "svc", "default")
    assert svc["status"]["readyReplicas"] == 1                              # the other write survives
    assert condition(svc, cond.METRICS_AVAILABLE)["reason"] == cond.PROMETHEUS_UNREACHABLE


@pytest.fixture
def faulty(served: Any, tmp_path: Path) -> Iterator[FaultProxy]:
    """`served`, with the operator's client behind the fault proxy."""
    with FaultProxy(served.url) as proxy:
        kube.configure(str(proxy.write_kubeconfig(tmp_path / "faulty-kubeconfig")))
        try:
            yield proxy
        finally:
            kube.configure(str(served.kubeconfig_path))


def test_a_metrics_decision_whose_record_landed_but_answered_500_is_recorded_once(
        served: Any, faulty: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime.now(UTC)
    monkeypatch.setattr(watch, "reader_for", lambda cfg=None: _CannedReader(_saturated(now)))
    rule = faulty.add(method="PATCH", path=r"/status$", body="recommendedReplicas", land_then=500)
    decision = watch.watch_service("default", "svc", now=now)
    assert decision is not None and decision.action is MetricsAction.RECOMMEND_REPLICAS and rule.fired == 1
    history = served.get_object("vllmservices", "svc", "default")["status"]["remediation"]["history"]
    assert [h["flagsAfter"] for h in history] == [{"replicas": 1, "recommendedReplicas": 2}]


def test_a_scale_up_is_recorded_first_and_completed_by_the_reconcile_when_the_scale_fails(
        served: Any, faulty: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    served.patch_object("vllmservices", "svc", {"spec": {"maxReplicas": 2}}, "default")
    now = datetime.now(UTC)
    monkeypatch.setattr(watch, "reader_for", lambda cfg=None: _CannedReader(_saturated(now)))
    rule = faulty.add(method="PATCH", path=r"/deployments/svc$", body='"replicas"', status=503, times=4)
    with pytest.raises(kopf.TemporaryError):  # every immediate retry of the scale failed
        watch.watch_service("default", "svc", now=now)
    assert rule.fired == 4
    svc = served.get_object("vllmservices", "svc", "default")
    assert [h["flagsAfter"] for h in svc["status"]["remediation"]["history"]] == [{"replicas": 2}]  # recorded
    assert svc["status"]["metrics"]["desiredReplicas"] == 2
    assert served.get_object("deployments", "svc", "default")["spec"]["replicas"] == 1
    # the next reconcile (the watchdog's) renders the recorded replicas: the scale is completed, not undone
    reconcile_service("svc", "default", svc["metadata"]["uid"], int(svc["metadata"]["generation"]), svc["spec"],
                      svc["status"], logging.getLogger("test"))
    assert served.get_object("deployments", "svc", "default")["spec"]["replicas"] == 2
    assert len(served.get_object("vllmservices", "svc", "default")["status"]["remediation"]["history"]) == 1
