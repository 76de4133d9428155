"""An autoscaler on the VLLMService's scale subresource, as Python data: an `autoscaling/v2` HorizontalPodAutoscaler
or a KEDA `keda.sh/v1alpha1` ScaledObject, both following vLLM's own metrics.

The target is the VLLMService itself (its CRD advertises `/scale` with `spec.replicas` and `status.selector`), so the
autoscaler writes spec.replicas and the operator renders the Deployment from it: one writer of the pod count.

- HPA: `Pods` metrics served by a custom-metrics adapter (prometheus-adapter) under Prometheus-safe names
  (`vllm_num_requests_waiting`, `vllm_num_requests_running`, `vllm_kv_cache_usage_perc`; see README for the rule).
- KEDA: one `prometheus` trigger per metric, `sum(...)` over the service's pods with KEDA's default `AverageValue`,
  i.e. the same per-pod target. Scale to zero needs a signal that exists without pods (`activationQuery`): it is a
  trigger with a threshold no load reaches (it never adds pods) and `activationThreshold: 0` (it wakes the service).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api.v1alpha1 import GROUP, VERSION, AutoscalingMetric, AutoscalingSpec

#: The signal when spec.autoscaling.metrics is empty.
DEFAULT_METRIC = AutoscalingMetric(type="WaitingRequests", target=5)
#: The custom-metrics names the HPA asks for (prometheus-adapter renames vLLM's `vllm:` series to these).
ADAPTER_METRIC = {"WaitingRequests": "vllm_num_requests_waiting", "RunningRequests": "vllm_num_requests_running",
                  "KVCacheUsage": "vllm_kv_cache_usage_perc"}
#: The activation trigger's threshold: no load reaches it, so it never adds pods; it only wakes the service.
WAKE_ONLY_THRESHOLD = "1000000000"


def prometheus_query(metric: AutoscalingMetric, selector: str) -> str:
    """The PromQL sum over the service's serving pods (`selector`: `render.pods.ServingPods.promql()`, the same
    matchers the operator's metrics watch uses) for one metric. vLLM labels each series `engine` and `model_name`;
    the sum is over every engine of every serving pod."""
    if metric.type == "WaitingRequests":
        return f"sum(vllm:num_requests_waiting{{{selector}}}) or vector(0)"
    if metric.type == "RunningRequests":
        return f"sum(vllm:num_requests_running{{{selector}}}) or vector(0)"
    # vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc (0.10): either series, whichever the image exports
    return (f"sum(vllm:kv_cache_usage_perc{{{selector}}}) or sum(vllm:gpu_cache_usage_perc{{{selector}}}) "
            "or vector(0)")


def quantity(value: float) -> str:
    """A Kubernetes quantity for a per-pod target: `5`, `800m`."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def _target_ref(name: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLLMService", "name": name}


def _metrics(spec: AutoscalingSpec) -> list[AutoscalingMetric]:
    return list(spec.metrics) or [DEFAULT_METRIC]


def build_hpa(*, name: str, child_name: str, namespace: str, labels: dict[str, str], owner: dict[str, Any],
              spec: AutoscalingSpec) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": child_name, "namespace": namespace, "labels": dict(labels), "annotations": {},
                     "ownerReferences": [owner]},
        "spec": {
            "scaleTargetRef": _target_ref(name),
            "minReplicas": max(spec.min_replicas, 1),  # 0 is KEDA's (the HPA needs an alpha gate for it)
            "maxReplicas": spec.max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": ADAPTER_METRIC[m.type]},
                "target": {"type": "AverageValue", "averageValue": quantity(m.target)}}} for m in _metrics(spec)],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": min(spec.cooldown_seconds, 3600)}},
        },
    }


def build_scaled_object(*, name: str, child_name: str, namespace: str, labels: dict[str, str],
                        owner: dict[str, Any], spec: AutoscalingSpec, selector: str) -> dict[str, Any]:
    address = spec.prometheus_address or ""
    triggers: list[dict[str, Any]] = [
        {"type": "prometheus", "name": f"vllm-{m.type.lower()}",
         "metadata": {"serverAddress": address, "query": prometheus_query(m, selector),
                      "threshold": str(m.target)}}
        for m in _metrics(spec)]
    if spec.activation_query:
        triggers.append({"type": "prometheus", "name": "wake",
                         "metadata": {"serverAddress": address, "query": spec.activation_query,
                                      "threshold": WAKE_ONLY_THRESHOLD, "activationThreshold": "0"}})
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": child_name, "namespace": namespace, "labels": dict(labels), "annotations": {},
                     "ownerReferences": [owner]},
        "spec": {
            "scaleTargetRef": _target_ref(name),
            "minReplicaCount": spec.min_replicas,
            "maxReplicaCount": spec.max_replicas,
            "cooldownPeriod": spec.cooldown_seconds,
            "pollingInterval": 15,
            "triggers": triggers,
        },
    }


def cold_start_message(checkpoint_gib: float, load_seconds_per_gib: float, engine_seconds: float,
                       persistent_cache: bool, measured: Mapping[str, Any] | None = None) -> str:
    """What scaling from zero costs: the last measured start (status.coldStart) when there is one, else loading
    the weights (and downloading them without a persistent cache) at the assumed rates."""
    total = (measured or {}).get("readySeconds")
    if isinstance(total, (int, float)) and not isinstance(total, bool) and total > 0:
        phases = _phases(measured or {})
        said = ", ".join(f"{label} {format_seconds(v)}" for label, v in phases
                         if isinstance(v, (int, float)) and not isinstance(v, bool))
        cache = "" if persistent_cache else "; the model cache is ephemeral: every start downloads the weights"
        return (f"a start from zero took {format_seconds(total)} before the first request was served (measured on "
                f"pod {(measured or {}).get('measuredPod')}: {said}){cache}")
    minutes = (engine_seconds + load_seconds_per_gib * checkpoint_gib) / 60
    cache = ("from the persistent model cache" if persistent_cache
             else "after downloading them again (the model cache is ephemeral)")
    return (f"a cold start from zero loads {checkpoint_gib:.1f} GiB of weights {cache}: up to about "
            f"{minutes:.0f} min before the first request is served")


_PHASE_LABELS = (("download", "downloadSeconds"), ("weights load", "loadSeconds"), ("compile", "compileSeconds"),
                 ("CUDA graphs", "graphCaptureSeconds"))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _phases(measured: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The measured phases in start order: the image pull apart from the volume attach and container creation when
    the kubelet's Pulled Events told it (imagePullSeconds), else the two together (podStartSeconds)."""
    pod_start, pull = _number(measured.get("podStartSeconds")), _number(measured.get("imagePullSeconds"))
    if pull is None:
        head: list[tuple[str, Any]] = [("image pull and volume", pod_start)]
    else:
        head = [("image pull", pull)]
        if pod_start is not None:
            head.append(("volume and container creation", max(pod_start - pull, 0.0)))
    return head + [(label, measured.get(key)) for label, key in _PHASE_LABELS]


def format_seconds(seconds: float) -> str:
    """`95.2` → `1m35s`, `7.4` → `7s`."""
    whole = int(round(seconds))
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"
