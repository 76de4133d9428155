"""The operator's own Prometheus metrics (prometheus-client), served on --metrics-port."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, start_http_server

RECONCILES = Counter("vllm_operator_reconciles_total", "Reconciles of VLLMServices by outcome",
                     ["outcome"])
PLANS = Counter("vllm_operator_plans_total", "Plans computed, by feasibility", ["feasible"])
REMEDIATIONS = Counter("vllm_operator_remediation_steps_total", "Remediation steps taken, by failure class",
                       ["failure_class"])
FLAG = Gauge("vllm_operator_service_flag", "Numeric vLLM flags currently planned for a service",
             ["namespace", "service", "flag"])
KV_TOKENS = Gauge("vllm_operator_planned_kv_cache_tokens", "KV-cache tokens the plan predicts per replica",
                  ["namespace", "service"])
PROMETHEUS_UP = Gauge("vllm_operator_prometheus_reachable", "1 when the configured Prometheus answered")


def record_plan(namespace: str, service: str, fits: bool, flags: Mapping[str, Any], kv_tokens: int) -> None:
    PLANS.labels(feasible=str(fits).lower()).inc()
    KV_TOKENS.labels(namespace=namespace, service=service).set(kv_tokens if fits else 0)
    for flag, value in flags.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            FLAG.labels(namespace=namespace, service=service, flag=flag).set(value)


def start_metrics_server(port: int, registry: CollectorRegistry = REGISTRY) -> None:
    start_http_server(port, registry=registry)
