"""Scenario 3: vLLM's metrics as vLLM exports them. A real Prometheus scrapes real vLLM processes under the pod names
and labels a Deployment and a LeaderWorkerSet give them; the operator's own metrics watch, every KEDA trigger query
it renders and the pods its HPA metrics are read for are evaluated against those real series, and must select
exactly the serving pods: the Deployment's pod, and the LeaderWorkerSet group's leader (the pod that runs vLLM's API
server; a `--headless` worker serves no HTTP, so no /metrics).

What is real: the vLLM processes and their /metrics, Prometheus, its relabelling (Prometheus' example
kubernetes-pods job, tests/prometheus), the operator process and every query it sends (read back from Prometheus'
own query log). What stands in for the cluster: file_sd target groups carrying the `__meta_kubernetes_pod_*` labels
kubernetes_sd would give each pod of the simulated cluster, with the pod's address mapped to its process's loopback
port. The LeaderWorkerSet's pods are simulated (with the Deployment's process, the group's two real ranks would make
three processes; the tier runs at most two — test_multinode.py runs a group for real), so the leader's target is the
Deployment pod's real process under the leader's name and labels, and the worker's target is a port nothing listens
on, as a headless worker's 8000 is.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from realkit import TINY, RealCluster, tiny_llama_config, tiny_spec, until

from kit.ports import HOST, free_port
from kit.specs import condition, vllmservice
from vllm_operator.api.model_config import ModelConfigSubset
from vllm_operator_sim.emulator_selectors import parse_label_selector

pytestmark = pytest.mark.timeout(900)
REPO = Path(__file__).resolve().parents[2]
#: A 13B-parameter Llama (26 GB in bfloat16): one L4 cannot hold it, two can, so with `maxNodes: 2` on the cluster's
#: one-GPU nodes the operator renders a LeaderWorkerSet group of two. The runner has no directory for it, so the
#: group's pods are left to the simulator.
GROUP_MODEL = "acme/llama-13b-like"
GROUP_CONFIG = ModelConfigSubset.model_validate({
    **tiny_llama_config(), "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 40,
    "num_hidden_layers": 40, "intermediate_size": 13824, "vocab_size": 32000,
}).model_dump(mode="python", by_alias=True, exclude_none=True)  # the keys a spec carries inline (the CRD's subset)
#: A vLLM series selector: the metric name and its matchers, whose quoted values may hold braces (`{1,10}` in the
#: pod-name regex of render/pods.py).
SERIES = re.compile(r'(vllm:[a-z_]+)\{((?:[^{}"]|"(?:[^"\\]|\\.)*")*)\}')
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def _testkit() -> Any:
    """tests/prometheus/conftest.py (the relabelling and the binary lookup), importable as `prometheus_testkit`."""
    if "prometheus_testkit" not in sys.modules:
        spec = importlib.util.spec_from_file_location("prometheus_testkit", REPO / "tests/prometheus/conftest.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["prometheus_testkit"] = module
        spec.loader.exec_module(module)
    return sys.modules["prometheus_testkit"]


class Prometheus:
    """The real server on loopback, scraping file_sd pod targets every second and logging every query it answers."""

    def __init__(self, workdir: Path) -> None:
        kit = _testkit()
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.query_log = workdir / "queries.jsonl"
        (workdir / "pods").mkdir(parents=True, exist_ok=True)
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s",
                             "query_log_file": str(self.query_log)},
                  "scrape_configs": [{"job_name": "kubernetes-pods", "file_sd_configs": [
                      {"files": [str(workdir / "pods" / "*.json")], "refresh_interval": "1s"}],
                      "relabel_configs": kit.POD_RELABELING}]}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._log = (workdir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [kit.prometheus_binary(), f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address={HOST}:{self.port}",
             "--log.level=warn"], stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        until(lambda: requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200, 60, "Prometheus ready")

    def publish(self, pod: dict[str, Any], address: str) -> None:
        """The pod as kubernetes_sd would show it (its labels and annotations), scraped at `address`."""
        meta = pod["metadata"]
        labels = {"__meta_kubernetes_namespace": meta["namespace"], "__meta_kubernetes_pod_name": meta["name"]}
        for key, value in (meta.get("labels") or {}).items():
            labels[f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', key)}"] = value
        for key, value in (meta.get("annotations") or {}).items():
            labels[f"__meta_kubernetes_pod_annotation_{re.sub(r'[^a-zA-Z0-9_]', '_', key)}"] = value
        labels["__meta_kubernetes_pod_annotation_prometheus_io_port"] = address.rsplit(":", 1)[1]  # IP:8000 → here
        path = self.workdir / "pods" / f"{meta['name']}.json"
        path.with_suffix(".tmp").write_text(json.dumps([{"targets": [address], "labels": labels}]))
        os.replace(path.with_suffix(".tmp"), path)

    def query(self, promql: str) -> list[dict[str, Any]]:
        response = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result

    def pods(self, selector_query: str) -> set[str]:
        return {r["metric"].get("pod", "") for r in self.query(selector_query)}

    def logged_queries(self) -> list[str]:
        """The operator's queries from Prometheus' query log: its range queries and its request-length query (this
        test itself only sends instant queries without `increase(`)."""
        if not self.query_log.exists():
            return []
        entries = [json.loads(line) for line in self.query_log.read_text().splitlines() if line]
        return [e["params"]["query"] for e in entries
                if e["httpRequest"]["path"].endswith("/query_range") or "increase(" in e["params"]["query"]]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    server = Prometheus(tmp_path / "prometheus")
    try:
        yield server
    finally:
        server.stop()


def _selected(prometheus: Prometheus, query: str) -> dict[str, set[str]]:
    """For every vLLM series selector in a query: the pods whose series it selects (evaluated by Prometheus)."""
    return {f"{name}{{{matchers}}}": prometheus.pods(f"{name}{{{matchers}}}")
            for name, matchers in SERIES.findall(query)}


def _selects_exactly(selected: dict[str, set[str]], pods: set[str]) -> bool:
    """No selector reaches a pod that does not serve, and together they reach every serving pod (a query's `or`
    fallback to a name older releases export, e.g. vllm:gpu_cache_usage_perc, selects nothing from vLLM 0.32)."""
    return bool(selected) and all(found <= pods for found in selected.values()) and set().union(
        *selected.values()) == pods


def test_the_operators_metrics_queries_select_exactly_the_serving_pods_of_a_deployment_and_a_leaderworkerset(
        real: RealCluster, prometheus: Prometheus) -> None:
    keda_crd = next(d for d in yaml.safe_load_all((REPO / "tests/data/crds/keda.sh_scaledobjects.yaml").read_text())
                    if d)
    if real.api.get_object("customresourcedefinitions", keda_crd["metadata"]["name"]) is None:
        real.api.create_object("customresourcedefinitions", keda_crd)
    real.cluster.stop_operator()
    real.cluster.start_operator("--prometheus-url", prometheus.url, "--metrics-interval", "5", timeout=120)
    autoscaling = {"engine": "KEDA", "minReplicas": 1, "maxReplicas": 2, "prometheusAddress": prometheus.url,
                   "metrics": [{"type": "WaitingRequests", "target": 5}, {"type": "RunningRequests", "target": 8},
                               {"type": "KVCacheUsage", "target": 0.8}]}
    group_spec = {"model": {"name": GROUP_MODEL, "config": GROUP_CONFIG}, "image": tiny_spec()["image"],
                  "gpu": {"product": "NVIDIA-L4", "maxNodes": 2}, "prometheus": {"enabled": True},
                  "autoscaling": autoscaling}
    real.cluster.apply(vllmservice(tiny_spec(prometheus={"enabled": True}, autoscaling=autoscaling), name="metrics"))
    real.cluster.apply(vllmservice(group_spec, name="group"))
    try:
        real.wait_ready("metrics")
        [pod] = real.ready_pods("metrics")
        port = real.runner.port(pod["metadata"]["uid"])
        assert port is not None
        prometheus.publish(pod, f"{HOST}:{port}")
        real.wait_ready("group")
        assert real.api.get_object("leaderworkersets.leaderworkerset.x-k8s.io", "group", "default") is not None
        group = real.pods("group")
        leaders = [p for p in group if p["metadata"]["labels"].get(WORKER_INDEX) == "0"]
        workers = [p for p in group if p["metadata"]["labels"].get(WORKER_INDEX) != "0"]
        assert len(leaders) == 1 and len(workers) == 1, [p["metadata"]["name"] for p in group]
        prometheus.publish(leaders[0], f"{HOST}:{port}")            # the leader serves vLLM's API and /metrics
        prometheus.publish(workers[0], f"{HOST}:{free_port()}")     # a headless worker serves nothing
        serving = {"metrics": {pod["metadata"]["name"]}, "group": {leaders[0]["metadata"]["name"]}}
        # vLLM's real series, under the pod names and labels the cluster gives them
        until(lambda: prometheus.pods("vllm:num_requests_running") == serving["metrics"] | serving["group"], 90,
              "both serving pods scraped")
        names = {r["metric"]["__name__"] for r in prometheus.query('{__name__=~"vllm:.+"}')}
        assert {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                "vllm:num_preemptions_total"} <= names, sorted(names)
        for service, pods in serving.items():
            # every KEDA trigger the operator rendered
            scaled = until(lambda s=service: real.api.get_object("scaledobjects.keda.sh", s, "default"), 60,
                           f"{service}'s ScaledObject")
            for trigger in scaled["spec"]["triggers"]:
                query = trigger["metadata"]["query"]
                selected = _selected(prometheus, query)
                assert _selects_exactly(selected, pods), (service, query, selected)
                assert prometheus.query(query), (service, query)
            # the pods the HPA's Pods metrics are read for: those the scale subresource's selector matches
            selector = until(lambda s=service: (real.service(s) or {}).get("status", {}).get("selector"), 60,
                             f"{service}'s status.selector")
            selects = parse_label_selector(selector)  # as the API server reads it (set-based terms too)
            matched = {p["metadata"]["name"] for p in real.pods(service) if selects(p["metadata"].get("labels") or {})}
            assert matched == pods, (service, selector, matched)
            # the operator's own metrics watch: what it asked Prometheus, and what it wrote
            try:
                until(lambda s=service: (o := real.service(s)) and condition(o, "MetricsAvailable").get(
                    "status") == "True" and o, 90, f"{service}'s MetricsAvailable")
            except AssertionError:
                raise AssertionError((service, condition(real.service(service), "MetricsAvailable"))) from None
            asked = [q for q in prometheus.logged_queries() if f'pod=~"{service}-' in q or f'"{service}"' in q]
            assert asked, (service, prometheus.logged_queries()[-5:])
            for query in asked:
                selected = _selected(prometheus, query)
                assert _selects_exactly(selected, pods), (service, query, selected)
        assert real.service("metrics")["status"]["metrics"]["kvCacheUsage"] is not None  # type: ignore[index]
        assert TINY in json.dumps(prometheus.query("vllm:num_requests_running"))
    finally:
        real.delete("group")
        real.delete("metrics")
