"""Read one VLLMService's vLLM metrics from Prometheus (prometheus-api-client), fast and without retries.

Which series belong to a service
--------------------------------
vLLM's pods are labelled ``vllm-operator.dev/service=<name>`` and ``app.kubernetes.io/instance=<name>`` and annotated
``prometheus.io/scrape: "true"``, ``prometheus.io/port``, ``prometheus.io/path: /metrics``. With the usual
``kubernetes_sd_configs`` relabelling (Prometheus' example config, kube-prometheus-stack's PodMonitor, the community
chart's ``kubernetes-pods`` job) every series carries ``namespace`` and ``pod`` labels, and vLLM adds its own
``model_name``. The matcher is a template (``--prometheus-selector``, env ``VLLM_OPERATOR_PROMETHEUS_SELECTOR``)
with these placeholders, replaced literally (so regex braces like ``{5}`` are safe):

* ``{namespace}`` — the VLLMService's namespace;
* ``{service}`` — its name;
* ``{service_regex}`` — its name escaped for a ``=~`` matcher;
* ``{model}`` — the name clients use (``spec.model.servedName``, else ``spec.model.name``), vLLM's ``model_name``;
* ``{pods_regex}`` — the exact names of the pods that serve it (``render.pods.serving_pods``, passed in by the
  caller): a Deployment's ``<deployment>-<template hash>-<suffix>``, or a LeaderWorkerSet's leaders ``<lws>-<g>``
  (never its headless workers, which export no request metrics).

The default, ``namespace="{namespace}",pod=~"{pods_regex}"``, needs only ``namespace`` and ``pod`` and is the same
matcher the KEDA triggers use: service ``qwen`` does not match the pods of ``qwen-2``. Where the pods' labels are
mapped onto the series (``labelmap`` of ``__meta_kubernetes_pod_label_(.+)``, or a PodMonitor's
``podTargetLabels``), match them instead (with a LeaderWorkerSet also ``leaderworkerset_sigs_k8s_io_worker_index="0"``,
or the workers' absent series do no harm: they export none of the request metrics)::

    namespace="{namespace}",vllm_operator_dev_service="{service}"
    namespace="{namespace}",app_kubernetes_io_instance="{service}"

What is read (aggregated over the service's pods)
-------------------------------------------------
* KV-cache usage of the fullest pod: ``max(vllm:kv_cache_usage_perc)``, or ``vllm:gpu_cache_usage_perc`` (vLLM before
  0.10) when the newer name is absent;
* preemptions per second: ``sum(rate(vllm:num_preemptions_total[R]))``, or ``vllm:num_preemptions`` (older);
* ``sum(vllm:num_requests_waiting)``, ``sum(vllm:num_requests_running)``, and the number of pods reporting;
* the mean request length over the window, from vLLM's ``vllm:request_prompt_tokens`` and
  ``vllm:request_generation_tokens`` histograms (``_sum`` / ``_count``), when requests finished.

Each is a range query over the policy's window, so the policy can tell a sustained symptom from a spike. Every
request has a short timeout and no retries, and all of them share one deadline (≤ 5 s by default): an unreachable or
slow Prometheus costs the caller at most that, never a blocked reconcile.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .policy import Observation, Point

__all__ = [
    "DEFAULT_RATE_WINDOW",
    "DEFAULT_SELECTOR",
    "DEFAULT_TIMEOUT_SECONDS",
    "PrometheusReader",
    "PrometheusUnavailable",
    "QuerySet",
    "queries_for",
    "render_selector",
]

DEFAULT_SELECTOR = 'namespace="{namespace}",pod=~"{pods_regex}"'
DEFAULT_RATE_WINDOW = "5m"
DEFAULT_TIMEOUT_SECONDS = 5.0

_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


class PrometheusUnavailable(Exception):
    """Prometheus did not answer (connection refused, timeout, HTTP error, or an answer that is not PromQL data)."""


def _promql_string(value: str) -> str:
    """A value for inside a double-quoted PromQL string."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _regex_escape(value: str) -> str:
    """Escape RE2 metacharacters (Kubernetes names only have `.` and `-`, but be thorough)."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", value)


def render_selector(template: str, *, namespace: str, service: str, model: str = "",
                    pods_regex: str | None = None) -> str:
    """The label matchers (without braces) for one service; see the module docstring for the placeholders.
    `pods_regex` (an anchored RE2 of the serving pods' names) is needed where the template uses it."""
    if "{pods_regex}" in template and pods_regex is None:
        raise ValueError("the selector template uses {pods_regex}: pass the serving pods' name regex")
    replacements = {
        "{pods_regex}": _promql_string(pods_regex or ""),
        "{namespace}": _promql_string(namespace),
        "{service_regex}": _promql_string(_regex_escape(service)),
        "{service}": _promql_string(service),
        "{model}": _promql_string(model),
    }
    out = template.strip()
    if out.startswith("{") and out.endswith("}") and not any(out.startswith(key) for key in replacements):
        out = out[1:-1].strip()  # `{a="b"}` is accepted for `a="b"`
    for key, value in replacements.items():
        out = out.replace(key, value)
    return out


@dataclass(frozen=True)
class QuerySet:
    """The PromQL expressions read for one service."""

    selector: str
    kv_cache_usage: str
    preemption_rate: str
    waiting: str
    running: str
    pods: str

    def range_queries(self) -> dict[str, str]:
        return {"kv_cache_usage": self.kv_cache_usage, "preemption_rate": self.preemption_rate,
                "waiting": self.waiting, "running": self.running, "pods": self.pods}

    def request_tokens(self, window: str) -> str:
        s = self.selector
        prompt = f"sum(increase(vllm:request_prompt_tokens_sum{{{s}}}[{window}]))"
        generation = f"(sum(increase(vllm:request_generation_tokens_sum{{{s}}}[{window}])) or vector(0))"
        count = f"sum(increase(vllm:request_prompt_tokens_count{{{s}}}[{window}]))"
        return f"({prompt} + {generation}) / {count}"


def queries_for(selector: str, rate_window: str = DEFAULT_RATE_WINDOW) -> QuerySet:
    """The queries for one service's label matchers (see `render_selector`)."""
    s = selector
    r = rate_window
    return QuerySet(
        selector=s,
        kv_cache_usage=f"max(vllm:kv_cache_usage_perc{{{s}}}) or max(vllm:gpu_cache_usage_perc{{{s}}})",
        preemption_rate=(f"sum(rate(vllm:num_preemptions_total{{{s}}}[{r}])) "
                         f"or sum(rate(vllm:num_preemptions{{{s}}}[{r}]))"),
        waiting=f"sum(vllm:num_requests_waiting{{{s}}})",
        running=f"sum(vllm:num_requests_running{{{s}}})",
        pods=f"count(vllm:num_requests_running{{{s}}})",
    )


def _seconds(value: float) -> str:
    return f"{max(int(math.ceil(value)), 1)}s"


class PrometheusReader:
    """Reads vLLM's metrics for services from one Prometheus.

    `url` is Prometheus' base URL (``http://prometheus.monitoring:9090``). `selector` is the label-matcher template;
    `rate_window` the range of `rate()` for preemptions; `timeout` the deadline for all queries of one `observe`.
    `connect` builds the prometheus-api-client connection (tests may inject one).
    """

    def __init__(self, url: str, *, selector: str | None = None, rate_window: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS, headers: Mapping[str, str] | None = None,
                 connect: Callable[..., Any] | None = None) -> None:
        rate_window = rate_window or DEFAULT_RATE_WINDOW
        if not _DURATION.match(rate_window):
            raise ValueError(f"rate window {rate_window!r} is not a Prometheus duration such as 5m or 30s")
        self.url = url.rstrip("/")
        self.selector_template = selector or DEFAULT_SELECTOR
        self.rate_window = rate_window
        self.timeout = min(max(float(timeout), 0.1), 30.0)
        self._headers = dict(headers or {})
        self._connect = connect
        self._client: Any = None

    # --- connection ----------------------------------------------------------------------------

    def _connection(self) -> Any:
        if self._client is None:
            if self._connect is not None:
                self._client = self._connect(self.url)
            else:
                from prometheus_api_client import PrometheusConnect
                from urllib3.util.retry import Retry

                self._client = PrometheusConnect(url=self.url, headers=self._headers or None, disable_ssl=True,
                                                 retry=Retry(total=0, connect=0, read=0, redirect=0, status=0,
                                                             raise_on_status=False),
                                                 timeout=self.timeout)
        return self._client

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and hasattr(client, "close"):
            client.close()

    def __enter__(self) -> PrometheusReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- queries -------------------------------------------------------------------------------

    def selector(self, namespace: str, service: str, model: str = "", pods_regex: str | None = None) -> str:
        return render_selector(self.selector_template, namespace=namespace, service=service, model=model,
                               pods_regex=pods_regex)

    def queries(self, namespace: str, service: str, model: str = "", pods_regex: str | None = None) -> QuerySet:
        return queries_for(self.selector(namespace, service, model, pods_regex), self.rate_window)

    def observe(self, namespace: str, service: str, *, pods_regex: str | None, model: str = "",
                window_seconds: float = 600.0, step_seconds: float = 30.0,
                now: datetime | None = None) -> Observation:
        """One service's metrics over `[now - window_seconds, now]`; `pods_regex`: the serving pods' names
        (`render.pods.serving_pods(...).pod_name_regex`). Raises PrometheusUnavailable."""
        end = (now or datetime.now(UTC)).astimezone(UTC)
        step = max(float(step_seconds), 1.0)
        window = max(float(window_seconds), step)
        start = end - timedelta(seconds=window)
        queries = self.queries(namespace, service, model, pods_regex)
        deadline = time.monotonic() + self.timeout
        series: dict[str, tuple[Point, ...]] = {}
        for key, query in queries.range_queries().items():
            result = self._call(deadline, "custom_query_range", query, start_time=start, end_time=end,
                                step=_seconds(step) if step == int(step) else f"{step}s")
            series[key] = _points(result)
        tokens: float | None = None
        if series.get("running") or series.get("kv_cache_usage"):
            result = self._call(deadline, "custom_query", queries.request_tokens(_seconds(window)),
                                params={"time": f"{end.timestamp():.3f}"})
            tokens = _scalar(result)
        return Observation(end=end, window_seconds=window, step_seconds=step, request_tokens=tokens,
                           selector=queries.selector, **series)

    def _call(self, deadline: float, method: str, query: str, **kwargs: Any) -> Any:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PrometheusUnavailable(f"{self.url} did not answer within {self.timeout:g}s")
        try:
            return getattr(self._connection(), method)(query, timeout=remaining, **kwargs)
        except PrometheusUnavailable:
            raise
        except Exception as exc:  # requests' errors, PrometheusApiClientException, bad JSON: all mean "unavailable"
            raise PrometheusUnavailable(_describe(self.url, exc)) from exc


def _describe(url: str, exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    name = type(exc).__name__
    if "Timeout" in name or "timed out" in text:
        return f"{url} did not answer in time ({name})"
    if "Connection" in name or "refused" in text.lower():
        return f"cannot connect to {url} ({_short(text)})"
    return f"{url} answered with an error: {_short(text)}"


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _points(result: Any) -> tuple[Point, ...]:
    """Points of a range query's aggregated result (several series are merged by time, the largest value wins)."""
    merged: dict[float, float] = {}
    if not isinstance(result, Sequence):
        return ()
    for series in result:
        values = series.get("values") if isinstance(series, Mapping) else None
        for pair in values or ():
            if not isinstance(pair, Sequence) or len(pair) != 2:
                continue
            when, value = _number(pair[0]), _number(pair[1])
            if when is None or value is None:
                continue
            merged[when] = max(value, merged.get(when, value))
    return tuple(Point(time=t, value=v) for t, v in sorted(merged.items()))


def _scalar(result: Any) -> float | None:
    if not isinstance(result, Sequence):
        return None
    for series in result:
        value = series.get("value") if isinstance(series, Mapping) else None
        if isinstance(value, Sequence) and len(value) == 2:
            number = _number(value[1])
            if number is not None and number > 0:
                return number
    return None
