"""The operator's own metrics endpoint (`vllm-operator run --metrics-port`), scraped directly and by a real
Prometheus, and the chart's Grafana dashboard: valid JSON whose every query Prometheus accepts and answers.

`vllm-operator run` runs as a subprocess against the emulated API server (127.0.0.1), as in a cluster.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from prometheus_testkit import HOST, PrometheusStack, free_port, poll

from kit.api import REPO, emulated_api, l4_node
from kit.process import start_operator
from vllm_operator.api.v1alpha1 import flags_from_api
from vllm_operator_sim.emulator import EmulatedAPIServer

DASHBOARD = REPO / "charts" / "vllm-operator" / "dashboards" / "vllm-operator.json"
QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"
GRAFANA_VARIABLES = {"${service:regex}": "qwen", "$namespace": "default", "$service": "qwen",
                     "$__rate_interval": "10s", "$__interval": "1s", "$__range": "1m"}


@dataclass
class RunningOperator:
    server: EmulatedAPIServer
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.port}/metrics"

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """The endpoint's samples by (name, labels)."""
        text = requests.get(self.metrics_url, timeout=5).text
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


def _sample(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture(scope="module")
def operator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningOperator]:
    """The emulator with the CRD and an L4 node, and `vllm-operator run --metrics-port P` against it; one VLLMService
    that fits (qwen) and one that does not (huge)."""
    tmp = tmp_path_factory.mktemp("operator")
    with emulated_api(tmp / "kubeconfig", with_crd=True, nodes=[l4_node("gpu-1")]) as server:
        assert server.kubeconfig_path is not None
        port = free_port()
        op = start_operator(server.kubeconfig_path, tmp / "operator.log",
                            ["-A", "--standalone", "--liveness", "", "--metrics-port", str(port)], probes=False)
        try:
            running = RunningOperator(server=server, port=port, process=op.process, log=op.log_path)
            poll(lambda: op.process.poll() is None and requests.get(running.metrics_url, timeout=1).ok, 30,
                 f"the operator's metrics endpoint; log: {op.log_path}")
            for name, spec in (("qwen", {"model": {"name": QWEN_7B}}),
                               ("huge", {"model": {"name": "Qwen/Qwen2.5-72B-Instruct"}, "gpu": {"maxCount": 1}})):
                server.create_object("vllmservices", {
                    "apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
                    "metadata": {"name": name, "namespace": "default"}, "spec": spec})
            yield running
        finally:
            op.stop()


def _status(op: RunningOperator, name: str) -> dict[str, Any]:
    obj = op.server.get_object("vllmservices", name, "default") or {}
    return dict(obj.get("status") or {})


def test_the_endpoint_counts_reconciles_and_plans_and_gauges_each_service(operator: RunningOperator) -> None:
    op = operator
    plan = poll(lambda: _status(op, "qwen").get("plan") if _status(op, "qwen").get("plan", {}).get("fits") else None,
                30, "qwen planned")
    poll(lambda: _status(op, "huge").get("plan"), 30, "huge planned")
    samples = poll(lambda: s if _sample(s := op.samples(), "vllm_operator_plans_total", feasible="false") else None,
                   15, "the infeasible plan counted")
    assert (_sample(samples, "vllm_operator_reconciles_total", outcome="ok") or 0) >= 1
    assert (_sample(samples, "vllm_operator_reconciles_total", outcome="not_deployed") or 0) >= 1
    assert (_sample(samples, "vllm_operator_plans_total", feasible="true") or 0) >= 1
    assert _sample(samples, "vllm_operator_planned_kv_cache_tokens", namespace="default",
                   service="qwen") == plan["kvCacheTokens"]
    assert _sample(samples, "vllm_operator_planned_kv_cache_tokens", namespace="default", service="huge") == 0
    for flag in ("max_num_seqs", "max_model_len", "tensor_parallel_size", "gpu_memory_utilization"):
        value = _sample(samples, "vllm_operator_service_flag", namespace="default", service="qwen", flag=flag)
        assert value == pytest.approx(flags_from_api(plan["flags"])[flag]), flag
    assert _sample(samples, "vllm_operator_prometheus_reachable") == 0       # no --prometheus-url
    # The exposition is the plain text format prometheus-client writes; help and type lines are there.
    text = requests.get(op.metrics_url, timeout=5).text
    assert "# TYPE vllm_operator_reconciles_total counter" in text
    assert "# TYPE vllm_operator_planned_kv_cache_tokens gauge" in text


def _exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"]
            for target in panel.get("targets") or []]


def _substitute(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    leftover = re.findall(r"\$\{?[A-Za-z_][A-Za-z0-9_:]*\}?", expr)
    assert not leftover, f"unknown Grafana variables {leftover} in {expr}"
    return expr


def test_the_dashboard_is_grafana_json_over_the_prometheus_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 30
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert {"namespace", "service"} <= set(variables)
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        assert panel["targets"] and all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in panel["targets"])
    text = " ".join(expr for _, expr in _exprs(dashboard))
    for metric in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total",
                   "vllm:num_preemptions{", "vllm:num_requests_waiting", "vllm:num_requests_running",
                   "vllm_operator_planned_kv_cache_tokens", "vllm_operator_reconciles_total",
                   "vllm_operator_plans_total", "vllm_operator_remediation_steps_total",
                   "vllm_operator_service_flag"):
        assert metric in text, metric


def test_prometheus_scrapes_the_operator_and_every_dashboard_query_answers(
        operator: RunningOperator, prometheus_stack: PrometheusStack) -> None:
    stack = prometheus_stack
    stack.add_operator(operator.port, key="operator-under-test")
    pod = stack.add_pod("default", "qwen-6d9c8b7f5-x7k2q", "qwen", kv_cache_usage=0.6, waiting=2, running=9,
                        preemptions_per_second=0.5)
    try:
        planned = poll(lambda: _status(operator, "qwen").get("plan", {}).get("kvCacheTokens"), 30, "qwen planned")
        stack.wait_for_value('vllm_operator_planned_kv_cache_tokens{namespace="default",service="qwen"}',
                             lambda v: v == planned)
        stack.wait_for_value('count_over_time(vllm_operator_reconciles_total{outcome="ok"}[10s])', lambda v: v >= 2)
        stack.wait_for_value('count_over_time(vllm:num_preemptions_total{pod="qwen-6d9c8b7f5-x7k2q"}[10s])',
                             lambda v: v >= 2)
        dashboard = json.loads(DASHBOARD.read_text())
        empty = []
        for title, expr in _exprs(dashboard):
            response = requests.get(f"{stack.url}/api/v1/query", params={"query": _substitute(expr)}, timeout=5)
            assert response.status_code == 200, f"{title}: {expr}: {response.text}"
            if not response.json()["data"]["result"]:
                empty.append(title)
        # Only remediation steps have no series yet (none was taken).
        assert empty == ["Remediation steps by failure class"], empty
        used = stack.query(_substitute(next(e for t, e in _exprs(dashboard)
                                             if t == "Planned KV-cache tokens vs. used" and "*" in e)))
        assert float(used[0]["value"][1]) == pytest.approx(0.6 * planned)
        assert used[0]["metric"] == {"namespace": "default", "service": "qwen"}
    finally:
        stack.remove_pod(pod)
        stack.prometheus.remove_target("operator", "operator-under-test")
