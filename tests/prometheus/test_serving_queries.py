"""The PromQL the operator renders (KEDA triggers) and reads (its metrics watch) selects exactly the serving pods'
series, evaluated by the real Prometheus: a Deployment's pods, or a LeaderWorkerSet's leaders — never its headless
workers, never a neighbour whose name starts the same (see conftest.py for the stack)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_testkit import PrometheusStack, poll

from vllm_operator.api.v1alpha1 import AutoscalingSpec
from vllm_operator.metrics.observe import DEFAULT_SELECTOR, queries_for, render_selector
from vllm_operator.render.autoscaling import build_scaled_object
from vllm_operator.render.pods import serving_pods

NS = "serving"
# name → (service, serving in its own shape). Each pod waits 2^i requests: a sum names the pods it added up.
PODS: dict[str, str] = {
    # the Deployment-shaped service `chat`
    "chat-7f8b9c6d5-bcdfg": "chat",
    "chat-7f8b9c6d5-hjklm": "chat",
    # the multi-node service `big`: two groups of three; workers export here only to prove the matcher skips them
    "big-0": "big", "big-0-1": "big", "big-0-2": "big", "big-1": "big", "big-1-1": "big", "big-1-2": "big",
    # neighbours a loose matcher catches: `chat-2` (a Deployment) and `chat-0` / `big-1x` (LeaderWorkerSets)
    "chat-2-59d6c8b7f4-vwxz2": "chat-2",
    "chat-0-0": "chat-0", "chat-0-0-1": "chat-0",
    "big-1x-0": "big-1x",
}
SERVING = {"chat": {"chat-7f8b9c6d5-bcdfg", "chat-7f8b9c6d5-hjklm"}, "big": {"big-0", "big-1"}}
WAITING = {pod: float(2 ** i) for i, pod in enumerate(PODS)}


@pytest.fixture(scope="module")
def stack(prometheus_stack: PrometheusStack) -> Iterator[PrometheusStack]:
    keys = [prometheus_stack.add_pod(NS, pod, service, waiting=WAITING[pod], running=WAITING[pod],
                                     kv_cache_usage=0.5)
            for pod, service in PODS.items()]
    keys.append(prometheus_stack.add_pod("elsewhere", "big-0", "big", waiting=2.0 ** 40, running=1))
    try:
        poll(lambda: len(prometheus_stack.query(f'vllm:num_requests_waiting{{namespace="{NS}"}}')) == len(PODS),
             30, "every pod scraped")
        yield prometheus_stack
    finally:
        for key in keys:
            prometheus_stack.remove_pod(key)


def _pods_of(stack: PrometheusStack, matchers: str) -> set[str]:
    return {r["metric"]["pod"] for r in stack.query(f"group by (pod) (vllm:num_requests_waiting{{{matchers}}})")}


def _value(stack: PrometheusStack, promql: str) -> float:
    result = stack.query(promql)
    assert len(result) == 1, (promql, result)
    return float(result[0]["value"][1])


@pytest.mark.parametrize(("service", "multinode"), [("chat", False), ("big", True)])
def test_the_operators_queries_select_exactly_the_serving_pods(stack: PrometheusStack, service: str,
                                                               multinode: bool) -> None:
    pods = serving_pods(service, NS, multinode=multinode)
    expected = SERVING[service]
    assert _pods_of(stack, pods.promql()) == expected
    total = sum(WAITING[p] for p in expected)

    # the KEDA triggers, as rendered
    scaling = AutoscalingSpec.model_validate({"engine": "KEDA", "maxReplicas": 4, "prometheusAddress": stack.url,
                                              "metrics": [{"type": "WaitingRequests", "target": 5},
                                                          {"type": "RunningRequests", "target": 5},
                                                          {"type": "KVCacheUsage", "target": 0.8}]})
    scaled = build_scaled_object(name=service, child_name=service, namespace=NS, labels={}, owner={},
                                 spec=scaling, selector=pods.promql())
    waiting, running, kv = (t["metadata"]["query"] for t in scaled["spec"]["triggers"])
    assert _value(stack, waiting) == total
    assert _value(stack, running) == total
    assert _value(stack, kv) == pytest.approx(0.5 * len(expected))

    # the operator's metrics watch, with its default selector
    queries = queries_for(render_selector(DEFAULT_SELECTOR, namespace=NS, service=service,
                                          pods_regex=pods.pod_name_regex), "5m")
    assert queries.selector == pods.promql()
    assert _value(stack, queries.waiting) == total
    assert _value(stack, queries.running) == total
    assert _value(stack, queries.pods) == len(expected)


def test_a_service_without_serving_pods_reads_zero_not_a_neighbour(stack: PrometheusStack) -> None:
    # `chat` as a LeaderWorkerSet has no leaders yet (chat-0-0 is the leader of `chat-0`), `big` as a Deployment
    # has no pods (big-1x-0 is another LeaderWorkerSet's leader)
    for service, multinode in (("chat", True), ("big", False)):
        pods = serving_pods(service, NS, multinode=multinode)
        assert _pods_of(stack, pods.promql()) == set()
        scaling = AutoscalingSpec.model_validate({"engine": "KEDA", "maxReplicas": 2, "prometheusAddress": stack.url})
        scaled = build_scaled_object(name=service, child_name=service, namespace=NS, labels={}, owner={},
                                     spec=scaling, selector=pods.promql())
        assert _value(stack, scaled["spec"]["triggers"][0]["metadata"]["query"]) == 0
