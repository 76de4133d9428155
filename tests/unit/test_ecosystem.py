"""spec.autoscaling (HPA / KEDA ScaledObject on the scale subresource) and spec.routing.inferencePool, rendered by
the pure core: with and without their CRDs, validated against the upstream schemas (tests/data/crds)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest

from kit.crds import crd_schema
from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.api.v1alpha1 import SpecValidationError, parse_spec, validate_spec
from vllm_operator.metrics.observe import DEFAULT_SELECTOR, render_selector
from vllm_operator.metrics.policy import MetricsAction
from vllm_operator.render.autoscaling import prometheus_query, quantity
from vllm_operator.render.pods import serving_pods
from vllm_operator.sources import load_model_files

QWEN = "Qwen/Qwen2.5-7B-Instruct"
L4 = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1"}
ALL = frozenset({"ScaledObject", "InferencePool"})
KEDA = {"engine": "KEDA", "maxReplicas": 4, "prometheusAddress": "http://prometheus.monitoring:9090"}


def run(spec: dict[str, Any], *, served: frozenset[str] | None = ALL,
        status: dict[str, Any] | None = None) -> reconcile.Desired:
    return reconcile.desired_state(reconcile.Observed(
        name="qwen", namespace="team", uid="uid-1", generation=1, spec={"model": {"name": QWEN}, **spec},
        status=status or {}, now=datetime(2025, 1, 1, tzinfo=UTC), nodes=(L4,),
        model_files=load_model_files(QWEN, offline=True), served_kinds=served))


def child(desired: reconcile.Desired, kind: str) -> dict[str, Any] | None:
    assert desired.children is not None
    return next((c for c in desired.children if c["kind"] == kind), None)


def condition(desired: reconcile.Desired, type_: str) -> tuple[str, str, str] | None:
    found = cond.find_condition(desired.status.conditions, type_)
    return (found.status, found.reason, found.message) if found else None




def test_hpa_targets_the_vllmservice_scale_subresource() -> None:
    desired = run({"autoscaling": {"minReplicas": 1, "maxReplicas": 4,
                                   "metrics": [{"type": "WaitingRequests", "target": 5},
                                               {"type": "KVCacheUsage", "target": 0.8}]}})
    hpa = child(desired, "HorizontalPodAutoscaler")
    assert hpa is not None and child(desired, "ScaledObject") is None
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
                                             "name": "qwen"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    assert hpa["spec"]["metrics"] == [
        {"type": "Pods", "pods": {"metric": {"name": "vllm_num_requests_waiting"},
                                  "target": {"type": "AverageValue", "averageValue": "5"}}},
        {"type": "Pods", "pods": {"metric": {"name": "vllm_kv_cache_usage_perc"},
                                  "target": {"type": "AverageValue", "averageValue": "800m"}}}]
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    status, reason, message = condition(desired, cond.AUTOSCALING) or ("", "", "")
    assert (status, reason) == (cond.TRUE, "HorizontalPodAutoscaler") and "only recommends" in message


def test_hpa_is_valid_for_the_built_in_schema() -> None:
    from kubernetes_validate import validate  # type: ignore[import-untyped]

    hpa = child(run({"autoscaling": {"maxReplicas": 3}}), "HorizontalPodAutoscaler")
    assert hpa is not None
    validate(hpa, "1.30", strict=True)


def test_keda_scaled_object_with_prometheus_triggers_and_scale_to_zero() -> None:
    desired = run({"autoscaling": {**KEDA, "minReplicas": 0, "activationQuery": 'sum(rate(gw_requests{svc="qwen"}[1m]))',
                                   "metrics": [{"type": "WaitingRequests", "target": 3},
                                               {"type": "KVCacheUsage", "target": 0.75}]}})
    scaled = child(desired, "ScaledObject")
    assert scaled is not None and child(desired, "HorizontalPodAutoscaler") is None
    jsonschema.validate(scaled, crd_schema("ScaledObject"))
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
                                      "name": "qwen"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (0, 4)
    safe = "[bcdfghjklmnpqrstvwxz2456789]"
    selector = f'namespace="team",pod=~"qwen-{safe}{{1,10}}-{safe}{{5}}"'
    waiting, kv, wake = spec["triggers"]
    assert waiting["metadata"] == {"serverAddress": "http://prometheus.monitoring:9090",
                                   "query": f"sum(vllm:num_requests_waiting{{{selector}}}) or vector(0)",
                                   "threshold": "3.0"}
    assert "vllm:kv_cache_usage_perc" in kv["metadata"]["query"] and kv["metadata"]["threshold"] == "0.75"
    assert wake["metadata"]["activationThreshold"] == "0"
    assert wake["metadata"]["query"] == 'sum(rate(gw_requests{svc="qwen"}[1m]))'
    status, reason, message = condition(desired, cond.AUTOSCALING) or ("", "", "")
    assert (status, reason) == (cond.TRUE, "ScaledObject")
    assert "cold start from zero loads 14.2 GiB" in message and "about" in message


def test_the_keda_matchers_are_the_metrics_watch_default() -> None:
    for multinode in (False, True):
        pods = serving_pods("qwen", "team", multinode=multinode)
        assert pods.promql() == render_selector(DEFAULT_SELECTOR, namespace="team", service="qwen",
                                                pods_regex=pods.pod_name_regex)
    with pytest.raises(ValueError, match="pods_regex"):
        render_selector(DEFAULT_SELECTOR, namespace="team", service="qwen")
    assert "vllm:gpu_cache_usage_perc" in prometheus_query(
        parse_spec({"model": {"name": QWEN}, "autoscaling": {"maxReplicas": 2, "metrics": [
            {"type": "KVCacheUsage", "target": 0.5}]}}).autoscaling.metrics[0], "x")  # type: ignore[union-attr]
    assert (quantity(5), quantity(0.8), quantity(2.5)) == ("5", "800m", "2500m")


def test_keda_without_its_crd_is_a_condition_not_a_crash() -> None:
    desired = run({"autoscaling": KEDA}, served=frozenset({"InferencePool"}))
    assert child(desired, "ScaledObject") is None and child(desired, "Deployment") is not None
    status, reason, message = condition(desired, cond.AUTOSCALING) or ("", "", "")
    assert (status, reason) == (cond.FALSE, "CRDNotInstalled") and "KEDA" in message and "engine HPA" in message


def test_inference_pool_selects_the_pods_on_vllms_port() -> None:
    desired = run({"routing": {"inferencePool": {"enabled": True,
                                                 "endpointPicker": {"name": "qwen-epp", "failureMode": "FailOpen"}}}})
    pool = child(desired, "InferencePool")
    assert pool is not None
    jsonschema.validate(pool, crd_schema("InferencePool"))
    deployment = child(desired, "Deployment")
    assert deployment is not None
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {"group": "", "kind": "Service", "name": "qwen-epp",
                                                 "port": {"number": 9002}, "failureMode": "FailOpen"}
    assert (condition(desired, cond.INFERENCE_POOL) or ("",))[0] == cond.TRUE


def test_inference_pool_without_its_crd_is_a_condition() -> None:
    desired = run({"routing": {"inferencePool": {"enabled": True}}}, served=frozenset())
    assert child(desired, "InferencePool") is None
    status, reason, message = condition(desired, cond.INFERENCE_POOL) or ("", "", "")
    assert (status, reason) == (cond.FALSE, "CRDNotInstalled") and "Inference Extension" in message


def test_nothing_asked_nothing_rendered_and_stale_children_go() -> None:
    plain = run({})
    assert {c["kind"] for c in plain.children or []} == {"Deployment", "Service"}
    assert condition(plain, cond.AUTOSCALING) is None and plain.stale == []
    had = {"conditions": [{"type": cond.AUTOSCALING, "status": "True", "reason": "HorizontalPodAutoscaler",
                           "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"},
                          {"type": cond.INFERENCE_POOL, "status": "True", "reason": "InferencePoolRendered",
                           "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}
    removed = run({}, status=had)
    assert sorted(removed.stale) == [("HorizontalPodAutoscaler", "qwen"), ("InferencePool", "qwen"),
                                     ("ScaledObject", "qwen")]
    assert (condition(removed, cond.AUTOSCALING) or ("", ""))[:2] == (cond.FALSE, "NotConfigured")
    switched = run({"autoscaling": KEDA}, status=had)
    assert ("HorizontalPodAutoscaler", "qwen") in switched.stale and ("ScaledObject", "qwen") not in switched.stale


def test_operator_follows_spec_replicas_under_an_autoscaler() -> None:
    spec = parse_spec({"model": {"name": QWEN}, "replicas": 3, "prometheus": {"enabled": True},
                       "autoscaling": {"maxReplicas": 5}})
    # the metrics watch's scaled count is ignored: the autoscaler owns the count
    assert reconcile.desired_replicas(spec, {"metrics": {"desiredReplicas": 5}}) == 3
    desired = run({"replicas": 3, "autoscaling": {"maxReplicas": 5}})
    deployment = child(desired, "Deployment")
    assert deployment is not None and deployment["spec"]["replicas"] == 3


def test_the_metrics_policy_only_recommends_under_an_autoscaler() -> None:
    from vllm_operator.metrics.policy import Observation, Point, PolicySettings, decide

    end = datetime(2025, 6, 1, 12, tzinfo=UTC)

    def series(value: float) -> tuple[Point, ...]:
        return tuple(Point(time=end.timestamp() - (20 - i) * 30, value=value) for i in range(21))

    saturated = Observation(end=end, window_seconds=600, step_seconds=30, kv_cache_usage=series(0.99),
                            preemption_rate=series(0.0), waiting=series(40), running=series(64), pods=series(4))
    settings = PolicySettings(window_seconds=600, step_seconds=30, preemption_rate_threshold=0.1, kv_full=0.95,
                              cooldown_seconds=900)
    own = parse_spec({"model": {"name": QWEN}, "replicas": 2, "maxReplicas": 6})
    assert decide(saturated, spec=own, status={}, replicas=4, now=end, settings=settings).action is \
        MetricsAction.SCALE_UP  # the operator's own loop, without an autoscaler
    scaled = parse_spec({"model": {"name": QWEN}, "replicas": 2, "autoscaling": {"maxReplicas": 6}})
    decision = decide(saturated, spec=scaled, status={}, replicas=4, now=end, settings=settings)
    assert decision.action is MetricsAction.RECOMMEND_REPLICAS and "HPA autoscaler decides" in decision.message
    idle = Observation(end=end, window_seconds=600, step_seconds=30, kv_cache_usage=series(0.1),
                       preemption_rate=series(0.0), waiting=series(0), running=series(1), pods=series(4))
    # 4 pods written by the autoscaler while spec.replicas still says 2: never "too many", never scaled down
    assert decide(idle, spec=scaled, status={}, replicas=4, now=end, settings=settings).action is MetricsAction.NONE


@pytest.mark.parametrize(("autoscaling", "extra", "fragment"), [
    ({"maxReplicas": 2, "minReplicas": 3}, {}, "must not exceed"),
    ({"maxReplicas": 2, "minReplicas": 0}, {}, "needs engine KEDA and an activationQuery"),
    ({"maxReplicas": 2, "engine": "KEDA"}, {}, "prometheusAddress"),
    ({"maxReplicas": 2, "activationQuery": "up"}, {}, "engine KEDA only"),
    ({"maxReplicas": 2, "metrics": [{"type": "KVCacheUsage", "target": 80}]}, {}, "at most 1"),
    ({"maxReplicas": 2}, {"maxReplicas": 3}, "exclude each other"),
])
def test_bad_autoscaling_specs_are_rejected(autoscaling: dict[str, Any], extra: dict[str, Any],
                                            fragment: str) -> None:
    spec = {"model": {"name": QWEN}, "autoscaling": autoscaling, **extra}
    errors = validate_spec(spec)
    assert any(fragment in e.message for e in errors), errors
    with pytest.raises(SpecValidationError):
        parse_spec(spec)
