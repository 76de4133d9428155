"""metrics.observe against a real Prometheus scraping a vLLM-like exporter (see conftest.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_testkit import HOST, PrometheusStack, free_port, poll

from vllm_operator.metrics.observe import (
    DEFAULT_SELECTOR,
    PrometheusReader,
    PrometheusUnavailable,
    queries_for,
    render_selector,
)
from vllm_operator.metrics.policy import Observation
from vllm_operator.render.pods import serving_pods

NS = "observe"
RATE_WINDOW = "3s"      # with 1 s scrapes; production uses 5m
WINDOW, STEP = 3.0, 1.0


@pytest.fixture(scope="module")
def pods(prometheus_stack: PrometheusStack) -> Iterator[PrometheusStack]:
    """Every pod these tests read, added at once so that their first scrapes overlap."""
    stack = prometheus_stack
    keys = [
        stack.add_pod(NS, "alpha-5d8f7c9b4-bcdfg", "alpha", kv_cache_usage=0.42, waiting=3, running=7,
                      preemptions_per_second=2.0, requests_per_second=4.0, prompt_tokens_per_request=1000,
                      generation_tokens_per_request=200),
        stack.add_pod(NS, "legacy-6c7d8f9f5-fghjk", "legacy", legacy_names=True, kv_cache_usage=0.8, waiting=0,
                      running=2, preemptions_per_second=1.0),
        stack.add_pod(NS, "multi-7f8b9c6d5-klmnp", "multi", kv_cache_usage=0.3, waiting=1, running=4),
        stack.add_pod(NS, "multi-7f8b9c6d5-pqrst", "multi", kv_cache_usage=0.9, waiting=2, running=5),
        # A service whose name starts with "multi-", and one of the same name in another namespace: not "multi".
        stack.add_pod(NS, "multi-2-59d6c8b7f4-vwxz2", "multi-2", kv_cache_usage=1.0, waiting=100, running=1),
        stack.add_pod("elsewhere", "multi-7f8b9c6d5-zzzzz", "multi", kv_cache_usage=1.0, waiting=50, running=1),
        # Not annotated for scraping: Prometheus drops the target, as for a pod without prometheus.io/scrape.
        stack.add_pod(NS, "quiet-6b5c4d2f2-bbbbb", "quiet", annotated=False, kv_cache_usage=0.5, running=1),
    ]
    try:
        yield stack
    finally:
        for key in keys:
            stack.remove_pod(key)


def pods_regex(service: str, multinode: bool = False) -> str:
    return serving_pods(service, NS, multinode=multinode).pod_name_regex


def reader(stack: PrometheusStack, **kwargs: Any) -> PrometheusReader:
    return PrometheusReader(stack.url, rate_window=RATE_WINDOW, **kwargs)


def observe_until(stack: PrometheusStack, service: str, ready: Any, timeout: float = 30.0,
                  **kwargs: Any) -> Observation:
    """Poll `observe` until `ready(observation)` holds (the first samples take ~5 s after Prometheus starts)."""
    with reader(stack, **kwargs) as r:
        found: Observation = poll(lambda: (o if ready(o := r.observe(
            NS, service, pods_regex=pods_regex(service), window_seconds=WINDOW, step_seconds=STEP)) else None),
                                  timeout, f"metrics of {service}")
        return found


def test_reads_vllm_metrics_of_one_service(pods: PrometheusStack) -> None:
    obs = observe_until(pods, "alpha", lambda o: o.request_tokens and len(o.preemption_rate) >= 2)
    assert obs.latest(obs.kv_cache_usage) == pytest.approx(0.42)
    assert obs.latest(obs.waiting) == 3
    assert obs.latest(obs.running) == 7
    assert obs.pod_count == 1
    assert 1.0 < (obs.latest(obs.preemption_rate) or 0) < 3.0           # 2 per second
    assert obs.request_tokens == pytest.approx(1200, rel=0.05)             # 1000 prompt + 200 generated
    assert obs.selector == serving_pods("alpha", NS, multinode=False).promql()
    times = [p.time for p in obs.kv_cache_usage]
    assert times == sorted(times) and all(b - a == STEP for a, b in zip(times, times[1:], strict=False))
    # The series carry what a kubernetes_sd setup gives them: namespace, pod, the pod labels, vLLM's model_name.
    labels = pods.query(f'vllm:kv_cache_usage_perc{{namespace="{NS}",pod="alpha-5d8f7c9b4-bcdfg"}}')[0]["metric"]
    assert labels["vllm_operator_dev_service"] == "alpha" and labels["app_kubernetes_io_instance"] == "alpha"
    assert labels["model_name"] == "Qwen/Qwen2.5-7B-Instruct"


def test_reads_the_older_metric_names(pods: PrometheusStack) -> None:
    obs = observe_until(pods, "legacy", lambda o: o.kv_cache_usage and len(o.preemption_rate) >= 2)
    assert obs.latest(obs.kv_cache_usage) == pytest.approx(0.8)            # vllm:gpu_cache_usage_perc
    assert 0.4 < (obs.latest(obs.preemption_rate) or 0) < 1.6              # rate(vllm:num_preemptions)
    assert obs.latest(obs.running) == 2
    assert obs.request_tokens is None                                      # no request finished


def test_aggregates_the_pods_of_the_service_and_no_others(pods: PrometheusStack) -> None:
    obs = observe_until(pods, "multi", lambda o: o.pod_count == 2)
    assert obs.latest(obs.kv_cache_usage) == pytest.approx(0.9)            # the fullest pod
    assert obs.latest(obs.waiting) == 3                                    # summed; not multi-2's nor elsewhere's
    assert obs.latest(obs.running) == 9
    assert obs.latest(obs.preemption_rate) == 0


@pytest.mark.parametrize("selector", [
    'namespace="{namespace}",vllm_operator_dev_service="{service}"',
    '{namespace="{namespace}",app_kubernetes_io_instance="{service}"}',
])
def test_the_label_matcher_is_configurable(pods: PrometheusStack, selector: str) -> None:
    obs = observe_until(pods, "multi", lambda o: o.pod_count == 2, selector=selector)
    assert obs.latest(obs.waiting) == 3
    assert "{" not in obs.selector and 'namespace="observe"' in obs.selector


def test_no_series_gives_an_empty_observation(pods: PrometheusStack) -> None:
    observe_until(pods, "alpha", lambda o: o.pod_count == 1)               # Prometheus has scraped by now
    with reader(pods) as r:
        for service in ("quiet", "absent"):
            obs = r.observe(NS, service, pods_regex=pods_regex(service), window_seconds=WINDOW,
                           step_seconds=STEP)
            assert obs.empty and obs.pod_count == 0 and obs.request_tokens is None


def test_unreachable_prometheus_fails_fast() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(PrometheusUnavailable, match="cannot connect"), \
            PrometheusReader(f"http://{HOST}:{port}") as r:
        r.observe(NS, "alpha", pods_regex=pods_regex("alpha"), window_seconds=WINDOW, step_seconds=STEP)
    assert time.monotonic() - started < 1.0                                # no retries, no backoff


def test_a_silent_prometheus_times_out_within_the_deadline() -> None:
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen(8)                                                  # accepts, never answers
        port = listener.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(PrometheusUnavailable, match="did not answer"), \
                PrometheusReader(f"http://{HOST}:{port}", timeout=1.0) as r:
            r.observe(NS, "alpha", pods_regex=pods_regex("alpha"), window_seconds=WINDOW, step_seconds=STEP)
        assert time.monotonic() - started < 2.0                            # one deadline for all the queries


def test_an_http_error_is_unavailable_without_retries() -> None:
    calls: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            calls.append(self.path)
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer((HOST, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(PrometheusUnavailable, match="503"), \
                PrometheusReader(f"http://{HOST}:{server.server_address[1]}") as r:
            r.observe(NS, "alpha", pods_regex=pods_regex("alpha"), window_seconds=WINDOW, step_seconds=STEP)
        assert len(calls) == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_selector_rendering_escapes_names() -> None:
    assert render_selector(DEFAULT_SELECTOR, namespace="ns", service="my.model", pods_regex="my\\.model-0") == \
        'namespace="ns",pod=~"my\\\\.model-0"'
    assert render_selector('model_name="{model}",namespace="{namespace}"', namespace="a", service="b",
                           model="org/m") == 'model_name="org/m",namespace="a"'
    assert render_selector('pod=~"{service}-[a-z0-9]{5}"', namespace="a", service="b") == 'pod=~"b-[a-z0-9]{5}"'
    queries = queries_for('namespace="a"', "5m")
    assert queries.kv_cache_usage == ('max(vllm:kv_cache_usage_perc{namespace="a"}) '
                                      'or max(vllm:gpu_cache_usage_perc{namespace="a"})')
    assert "rate(vllm:num_preemptions_total{namespace=\"a\"}[5m])" in queries.preemption_rate
    assert "rate(vllm:num_preemptions{namespace=\"a\"}[5m])" in queries.preemption_rate
    with pytest.raises(ValueError, match="duration"):
        PrometheusReader("http://127.0.0.1:1", rate_window="five minutes")
