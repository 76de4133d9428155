"""A real Prometheus (Debian's `prometheus` package) scraping a vLLM-like exporter, both on 127.0.0.1.

* `VLLMExporter` — a tiny `http.server` serving, per emulated pod, vLLM's metrics in the plain text exposition
  format (0.0.4, so the colon names stay as vLLM writes them): `vllm:kv_cache_usage_perc` (or the older
  `vllm:gpu_cache_usage_perc`), `vllm:num_requests_waiting`, `vllm:num_requests_running`,
  `vllm:num_preemptions_total` (or the older `vllm:num_preemptions`) and the request-length histograms. Tests set the
  values; counters grow at the rate the test sets, computed at every scrape.
* `PrometheusServer` — the `prometheus` binary with `scrape_interval: 1s`. Pods are discovered through
  `file_sd_configs` whose targets carry the `__meta_kubernetes_*` labels kubernetes_sd would give them, and the
  scrape config relabels them exactly as Prometheus' example Kubernetes config does (keep pods annotated
  `prometheus.io/scrape`, path and port from the annotations, `labelmap` of the pod labels, `namespace` and `pod`).
  So the series carry `namespace`, `pod`, `vllm_operator_dev_service` and `app_kubernetes_io_instance`, as in a
  cluster. A second job scrapes the operator's own `--metrics-port`.
* `PrometheusStack` — both, with helpers to add pods and poll queries. `start_stack(tmp_dir)` builds one (the
  handler tests use it too); the session fixture `prometheus_stack` shares one across this directory's tests.

Test modules import these helpers as `prometheus_testkit` (this module registers itself under that name; pytest
imports every conftest.py as `conftest`, which several directories have).

The first sample is queryable ~5 s after Prometheus starts: tests poll, never sleep a fixed time. Everything
started here is stopped by its PID. When the binary is missing and cannot be installed (apt-get as root), the
fixtures skip with the reason (fail instead with VLLM_OPERATOR_REQUIRE_PROMETHEUS=1; never try to install with
VLLM_OPERATOR_TEST_INSTALL_PROMETHEUS=0; PROMETHEUS_BIN names another binary).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
import yaml

from kit.api import poll as kit_poll
from kit.ports import HOST, free_port  # re-exported to the test modules (prometheus_testkit.free_port)

T = TypeVar("T")
INSTALL_LINE = "apt-get install -y --no-install-recommends prometheus"
FIRST_SAMPLE_TIMEOUT = 30.0


# --------------------------------------------------------------------------------------------------
# The prometheus binary
# --------------------------------------------------------------------------------------------------

_binary: str | None = None
_binary_error: str | None = None


def prometheus_binary() -> str:
    """Path of the `prometheus` binary; installs Debian's package when root and apt-get can; else skips."""
    global _binary, _binary_error
    if _binary:
        return _binary
    if _binary_error:
        _skip(_binary_error)
    found = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus")
    if not found and os.environ.get("VLLM_OPERATOR_TEST_INSTALL_PROMETHEUS", "1") != "0":
        found = _install()
    if not found:
        _binary_error = _binary_error or (
            f"the `prometheus` binary is not installed and could not be installed; run `{INSTALL_LINE}` "
            "(Debian's package, a real server) as root")
        _skip(_binary_error)
    _binary = found
    return found


def _skip(reason: str) -> None:
    """Skip — or fail, where VLLM_OPERATOR_REQUIRE_PROMETHEUS=1 (CI, where the binary must be there)."""
    if os.environ.get("VLLM_OPERATOR_REQUIRE_PROMETHEUS") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def _install() -> str | None:
    global _binary_error
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        _binary_error = (f"`prometheus` is missing and cannot be installed here (needs root and apt-get): run "
                         f"`{INSTALL_LINE}`")
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([apt, *args], env=env, capture_output=True, text=True, timeout=300, check=False)

    try:
        done = run("install", "-y", "--no-install-recommends", "prometheus")
        if done.returncode != 0:  # stale or missing package lists
            run("update")
            done = run("install", "-y", "--no-install-recommends", "prometheus")
    except (OSError, subprocess.TimeoutExpired) as exc:
        _binary_error = f"installing prometheus failed: {exc}"
        return None
    if done.returncode != 0:
        _binary_error = f"`{INSTALL_LINE}` failed: {done.stderr.strip()[-300:]}"
        return None
    return shutil.which("prometheus")


def poll(predicate: Callable[[], T], timeout: float, message: str, interval: float = 0.2) -> T:
    """kit.api.poll that keeps polling through errors (a server still starting), reporting the last one."""
    return kit_poll(predicate, timeout, f"timed out after {timeout}s: {message}", interval, retry_errors=True)


# --------------------------------------------------------------------------------------------------
# The vLLM-like exporter
# --------------------------------------------------------------------------------------------------


@dataclass
class PodMetrics:
    """What one emulated vLLM pod reports. Rates are per second; counters grow from the moment they are set."""

    namespace: str
    pod: str
    service: str
    model_name: str = "Qwen/Qwen2.5-7B-Instruct"
    kv_cache_usage: float = 0.0
    waiting: float = 0.0
    running: float = 0.0
    preemptions_per_second: float = 0.0
    requests_per_second: float = 0.0
    prompt_tokens_per_request: float = 0.0
    generation_tokens_per_request: float = 0.0
    legacy_names: bool = False          # vLLM before 0.10: gpu_cache_usage_perc, num_preemptions
    _counters: dict[str, float] = field(default_factory=dict)
    _since: float = field(default_factory=time.monotonic)

    def advance(self) -> None:
        """Accumulate the counters up to now at the current rates."""
        now = time.monotonic()
        elapsed, self._since = now - self._since, now
        requests_done = self.requests_per_second * elapsed
        for key, increment in (("preemptions", self.preemptions_per_second * elapsed),
                               ("requests", requests_done),
                               ("prompt", requests_done * self.prompt_tokens_per_request),
                               ("generation", requests_done * self.generation_tokens_per_request)):
            self._counters[key] = self._counters.get(key, 0.0) + increment

    def exposition(self) -> str:
        self.advance()
        labels = f'engine="0",model_name="{self.model_name}"'
        c = self._counters
        kv_name = "vllm:gpu_cache_usage_perc" if self.legacy_names else "vllm:kv_cache_usage_perc"
        preempt = "vllm:num_preemptions" if self.legacy_names else "vllm:num_preemptions_total"
        lines = [
            f"# HELP {kv_name} KV-cache usage. 1 means 100 percent usage.",
            f"# TYPE {kv_name} gauge",
            f"{kv_name}{{{labels}}} {self.kv_cache_usage}",
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {self.running}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} {self.waiting}",
            f"# HELP {preempt} Cumulative number of preemption from the engine.",
            f"# TYPE {preempt} counter",
            f"{preempt}{{{labels}}} {c.get('preemptions', 0.0)}",
        ]
        for name, key in (("vllm:request_prompt_tokens", "prompt"), ("vllm:request_generation_tokens", "generation")):
            lines += [
                f"# HELP {name} Number of tokens per request.",
                f"# TYPE {name} histogram",
                f'{name}_bucket{{{labels},le="+Inf"}} {c.get("requests", 0.0)}',
                f"{name}_sum{{{labels}}} {c.get(key, 0.0)}",
                f"{name}_count{{{labels}}} {c.get('requests', 0.0)}",
            ]
        return "\n".join(lines) + "\n"


class VLLMExporter:
    """Serves `/metrics/<key>` for every emulated pod, in the plain text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pods: dict[str, PodMetrics] = {}
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                key = self.path.split("?", 1)[0].removeprefix("/metrics/")
                with exporter._lock:
                    pod = exporter.pods.get(key)
                    body = pod.exposition().encode() if pod else b""
                self.send_response(200 if pod else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, name="vllm-exporter", daemon=True)
        self._thread.start()

    def set(self, key: str, pod: PodMetrics | None = None, **values: Any) -> None:
        with self._lock:
            if pod is not None:
                self.pods[key] = pod
            current = self.pods[key]
            current.advance()
            for name, value in values.items():
                setattr(current, name, value)

    def remove(self, key: str) -> None:
        with self._lock:
            self.pods.pop(key, None)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


# --------------------------------------------------------------------------------------------------
# Prometheus
# --------------------------------------------------------------------------------------------------

# Prometheus' example kubernetes-pods job (documentation/examples/prometheus-kubernetes.yml), fed by file_sd.
POD_RELABELING: list[dict[str, Any]] = [
    {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"], "action": "keep", "regex": "true"},
    {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"], "action": "replace",
     "target_label": "__metrics_path__", "regex": "(.+)"},
    {"source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"], "action": "replace",
     "regex": r"([^:]+)(?::\d+)?;(\d+)", "replacement": "$1:$2", "target_label": "__address__"},
    {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
    {"source_labels": ["__meta_kubernetes_namespace"], "action": "replace", "target_label": "namespace"},
    {"source_labels": ["__meta_kubernetes_pod_name"], "action": "replace", "target_label": "pod"},
]


class PrometheusServer:
    """The real server on 127.0.0.1 with two file_sd jobs: `kubernetes-pods` and `vllm-operator`."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        (workdir / "pods").mkdir(parents=True, exist_ok=True)
        (workdir / "operator").mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "kubernetes-pods",
                 "file_sd_configs": [{"files": [str(workdir / "pods" / "*.json")], "refresh_interval": "1s"}],
                 "relabel_configs": POD_RELABELING},
                {"job_name": "vllm-operator",
                 "file_sd_configs": [{"files": [str(workdir / "operator" / "*.json")], "refresh_interval": "1s"}]},
            ],
        }
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
            [binary, f"--config.file={self.config_path}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address={HOST}:{self.port}", "--storage.tsdb.retention.time=1h",
             "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True)
        try:
            poll(self._ready, 30, f"Prometheus ready on {self.url}")
        except AssertionError as exc:
            self.stop()
            raise AssertionError(f"{exc}; log: {self.log_path.read_text()[-2000:]}") from None

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.process.returncode}")
        return requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200

    def write_target(self, job_dir: str, key: str, targets: list[str], labels: dict[str, str]) -> None:
        """Add or replace one file_sd target group (written atomically: Prometheus watches the directory)."""
        path = self.workdir / job_dir / f"{key}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": targets, "labels": labels}]))
        os.replace(tmp, path)

    def remove_target(self, job_dir: str, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / job_dir / f"{key}.json").unlink()

    def query(self, promql: str) -> list[dict[str, Any]]:
        response = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Stop by PID: SIGTERM, then SIGKILL after 10 s."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self._log.close()


class PrometheusStack:
    """The exporter and Prometheus; `add_pod` makes a pod appear to Prometheus as kubernetes_sd would show it."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.exporter = VLLMExporter()
        try:
            self.prometheus = PrometheusServer(binary, workdir)
        except BaseException:
            self.exporter.stop()
            raise
        self.url = self.prometheus.url

    def add_pod(self, namespace: str, pod: str, service: str, *, annotated: bool = True,
                **values: Any) -> str:
        """A vLLM pod of `service` (labelled like the operator's pods) with these metric values; returns its key."""
        key = f"{namespace}.{pod}"
        self.exporter.set(key, PodMetrics(namespace=namespace, pod=pod, service=service), **values)
        labels = {
            "__meta_kubernetes_namespace": namespace,
            "__meta_kubernetes_pod_name": pod,
            "__meta_kubernetes_pod_label_vllm_operator_dev_service": service,
            "__meta_kubernetes_pod_label_app_kubernetes_io_instance": service,
            "__meta_kubernetes_pod_label_app_kubernetes_io_name": "vllm",
            "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true" if annotated else "false",
            "__meta_kubernetes_pod_annotation_prometheus_io_port": str(self.exporter.port),
            "__meta_kubernetes_pod_annotation_prometheus_io_path": f"/metrics/{key}",
        }
        self.prometheus.write_target("pods", key, [f"{HOST}:8000"], labels)
        return key

    def set_pod(self, key: str, **values: Any) -> None:
        self.exporter.set(key, **values)

    def remove_pod(self, key: str) -> None:
        self.prometheus.remove_target("pods", key)
        self.exporter.remove(key)

    def add_operator(self, port: int, key: str = "operator") -> None:
        """Scrape a `vllm-operator run --metrics-port` endpoint (job `vllm-operator`)."""
        self.prometheus.write_target("operator", key, [f"{HOST}:{port}"], {})

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.prometheus.query(promql)

    def wait_for_value(self, promql: str, check: Callable[[float], bool] = lambda _: True,
                       timeout: float = FIRST_SAMPLE_TIMEOUT) -> float:
        """Poll an instant query until its first value satisfies `check`; returns the value."""
        def ready() -> float | None:
            result = self.query(promql)
            if not result:
                return None
            value = float(result[0]["value"][1])
            return value if check(value) else None
        found: float = poll(lambda: (v,) if (v := ready()) is not None else None, timeout,
                            f"{promql} as expected")[0]
        return found

    def stop(self) -> None:
        try:
            self.prometheus.stop()
        finally:
            self.exporter.stop()


def start_stack(workdir: Path) -> PrometheusStack:
    return PrometheusStack(prometheus_binary(), workdir)


@pytest.fixture(scope="session")
def prometheus_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusStack]:
    """One Prometheus + exporter for the session (tests use pods of their own; nothing is reset between tests)."""
    stack = start_stack(tmp_path_factory.mktemp("prometheus"))
    try:
        yield stack
    finally:
        stack.stop()


# pytest imports every conftest.py as `conftest`; test modules import the helpers under a name of their own.
sys.modules.setdefault("prometheus_testkit", sys.modules[__name__])
