#!/usr/bin/env python3
"""How fast the operator turns many VLLMServices into Deployments, and how much memory it takes.

Starts the emulated Kubernetes API server (vllm_operator_sim.emulator) on 127.0.0.1 in this process, registers the
CRD, adds GPU nodes with GPU Feature Discovery labels (an L4 pool and an A100 pool, so every reconcile discovers
and picks a pool), then runs the real `vllm-operator run -A --standalone` process against it — what users run.
It creates N VLLMServices (models varied among a few catalog models, spread over 10 namespaces) as fast as a
thread pool of HTTP clients can, and records, for each one, the time from its create call returning to its
Deployment appearing on a watch of deployments. At the end it reads the operator's peak RSS (VmHWM in
/proc/<pid>/status) and CPU time (/proc/<pid>/stat).

Prints p50/p95/p99/max create-to-Deployment latency, total wall time, throughput and peak RSS; then runs the same
burst against a bare kopf operator (benchmarks/bare_kopf_operator.py: one fixed Deployment per VLLMService) and
prints the operator's throughput as a fraction of that framework floor (`--no-baseline` skips it).

Usage: python benchmarks/operator_scale.py [--count N] [--threads T] [--timeout S] [--json OUT] [--keep-log FILE]
                                         [--idle-seconds S] [--operator-command CMD] [--pairs N] [--no-baseline]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from vllm_operator_sim.emulator import EmulatedAPIServer

HERE = Path(__file__).resolve().parent
CRD_PATH = HERE.parent / "crds" / "vllmservices.vllm-operator.dev.yaml"
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3",
          "Qwen/Qwen2.5-1.5B-Instruct", "google/gemma-2-9b-it")
NAMESPACES = tuple(f"bench-{i}" for i in range(10))
NODES = [("l4", "NVIDIA-L4", 1, 23034)] * 4 + [("a100", "NVIDIA-A100-SXM4-40GB", 4, 40960)] * 2


def _operator_command(override: str | None = None) -> list[str]:
    if override:
        return shlex.split(override)
    script = Path(sys.executable).with_name("vllm-operator")
    return [str(script)] if script.exists() else [sys.executable, "-m", "vllm_operator.cli"]


def _proc_status(pid: int, field: str) -> int | None:
    """A `kB` field of /proc/<pid>/status, in bytes."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    except (OSError, IndexError, ValueError):
        return None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class DeploymentWatch:
    """Records when each Deployment first appears, from a watch stream over HTTP (one reader thread)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: dict[tuple[str, str], float] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="deployment-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        resource_version = "0"
        while not self._stop:
            query = f"watch=true&timeoutSeconds=30&resourceVersion={resource_version}"
            try:
                with urllib.request.urlopen(f"{self.url}/apis/apps/v1/deployments?{query}", timeout=60) as stream:
                    for line in stream:
                        if self._stop:
                            return
                        event = json.loads(line)
                        meta = event["object"].get("metadata") or {}
                        resource_version = meta.get("resourceVersion", resource_version)
                        if event["type"] == "ADDED":
                            key = (meta.get("namespace", ""), meta.get("name", ""))
                            with self._cond:
                                self.seen.setdefault(key, time.monotonic())
                                self._cond.notify_all()
            except OSError:
                if not self._stop:
                    time.sleep(0.1)

    def wait_for(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.seen) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 1.0))
        return True

    def stop(self) -> None:
        self._stop = True


def _wait_settled(server: EmulatedAPIServer, count: int, deadline: float) -> float | None:
    """When every VLLMService has its status written and kopf's last-handled annotation (the tail of the work
    after its Deployment appeared: Service, status, event, kopf's own patch); None on timeout."""
    while time.monotonic() < deadline:
        services = server.list_objects("vllmservices")
        done = sum(1 for o in services if (o.get("status") or {}).get("observedGeneration")
                   and "vllm-operator.dev/last-handled-configuration" in (o["metadata"].get("annotations") or {}))
        if done >= count:
            return time.monotonic()
        time.sleep(0.5)
    return None


BARE_KOPF = f"{shlex.quote(sys.executable)} {shlex.quote(str(HERE / 'bare_kopf_operator.py'))}"


def run(count: int, threads: int, timeout: float, keep_log: Path | None,
        operator_command: str | None = None, idle_seconds: float = 0.0, settle: bool = True) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="operator-scale-"))
    server = EmulatedAPIServer().start()
    process: subprocess.Popen[bytes] | None = None
    watch = DeploymentWatch(server.url)
    log_path = workdir / "operator.log"
    try:
        server.emulator.history_size = max(server.emulator.history_size, 4 * count)  # no 410s on watch resumes
        kubeconfig = server.write_kubeconfig(workdir / "kubeconfig")
        server.create_object("customresourcedefinitions", yaml.safe_load(CRD_PATH.read_text()))
        for i, (pool, product, gpus, memory) in enumerate(NODES):
            server.create_object("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": f"{pool}-{i}", "labels": {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus),
                                                  "nvidia.com/gpu.memory": str(memory), "pool": pool}}})
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with log_path.open("wb") as log:
            process = subprocess.Popen([*_operator_command(operator_command), "run", "-A", "--standalone", "--kubeconfig",
                                        str(kubeconfig), "--liveness", "", "--metrics-port", "0"],
                                       stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
        # ready: the operator has opened its watch on vllmservices
        deadline = time.monotonic() + 60
        while not any(r.verb == "watch" and r.resource == "vllmservices" for r in server.emulator.accessed()):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the operator did not start:\n{log_path.read_text()}")
            time.sleep(0.05)
        rss_idle = _proc_status(process.pid, "VmRSS")
        cpu_idle = _cpu_seconds(process.pid) or 0.0
        watch.start()

        api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        api.rest_client.pool_manager.connection_pool_kw["maxsize"] = threads
        custom = kubernetes.client.CustomObjectsApi(api)
        created: dict[tuple[str, str], float] = {}
        lock = threading.Lock()

        def create(i: int) -> None:
            namespace, name = NAMESPACES[i % len(NAMESPACES)], f"svc-{i:05d}"
            body = {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"model": {"name": MODELS[i % len(MODELS)]}}}
            custom.create_namespaced_custom_object("vllm-operator.dev", "v1alpha1", namespace, "vllmservices", body)
            with lock:
                created[namespace, name] = time.monotonic()

        start = time.monotonic()
        server_cpu_start = time.process_time()  # this process: the emulated API server and the creating clients
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(create, range(count)))
        created_all = time.monotonic()
        complete = watch.wait_for(count, timeout)
        end = time.monotonic()
        api.close()

        settled = _wait_settled(server, count, deadline=start + timeout) if settle else None
        cpu = (_cpu_seconds(process.pid) or 0.0) - cpu_idle
        server_cpu = time.process_time() - server_cpu_start
        settled_seconds = round(settled - start, 3) if settled else None
        steady: dict[str, Any] = {}
        if idle_seconds > 0 and settled:  # nothing changes now: what does the operator cost at rest with `count` services?
            cpu_before, requests_before = _cpu_seconds(process.pid) or 0.0, len(server.emulator.access_log)
            deadline = time.monotonic() + idle_seconds
            while time.monotonic() < deadline and process.poll() is None:
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            window = idle_seconds
            writes = [r for r in list(server.emulator.access_log)[requests_before:]
                      if r.verb in ("create", "update", "patch", "delete")]
            steady = {"seconds": window,
                      "cpu_fraction_of_a_core": round(((_cpu_seconds(process.pid) or 0.0) - cpu_before) / window, 3),
                      "api_requests_per_s": round((len(server.emulator.access_log) - requests_before) / window, 1),
                      "api_writes": len(writes),
                      "api_writes_by_kind": dict(collections.Counter(
                          "/".join(filter(None, (r.verb, r.resource, r.subresource))) for r in writes))}
        peak_rss = _proc_status(process.pid, "VmHWM")
        latencies = [watch.seen[key] - t for key, t in created.items() if key in watch.seen]
        last = max(watch.seen.values()) if watch.seen else end
        return {
            "count": count,
            "threads": threads,
            "deployments": len(latencies),
            "complete": complete,
            "create_seconds": round(created_all - start, 3),
            "create_rate_per_s": round(count / max(created_all - start, 1e-9), 1),
            "wall_seconds": round(last - start, 3),
            "throughput_per_s": round(len(latencies) / max(last - start, 1e-9), 1),
            "settled_seconds": settled_seconds,
            "latency_s": {
                "p50": round(_percentile(latencies, 50), 3),
                "p95": round(_percentile(latencies, 95), 3),
                "p99": round(_percentile(latencies, 99), 3),
                "max": round(max(latencies), 3) if latencies else None,
                "mean": round(statistics.fmean(latencies), 3) if latencies else None,
            },
            "operator_cpu_seconds": round(cpu, 2),
            "api_server_and_clients_cpu_seconds": round(server_cpu, 2),
            "operator_rss_idle_mib": round(rss_idle / 2**20, 1) if rss_idle else None,
            "operator_peak_rss_mib": round(peak_rss / 2**20, 1) if peak_rss else None,
            "api_requests": len(server.emulator.access_log),
            "api_requests_by_kind": dict(collections.Counter(
                "/".join(filter(None, (r.verb, r.resource, r.subresource)))
                for r in list(server.emulator.access_log)).most_common()),
            "steady_state": steady,
        }
    finally:
        watch.stop()
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        server.stop()
        if keep_log is not None and log_path.exists():
            shutil.copy(log_path, keep_log)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="VLLMServices to create (default 1000)")
    parser.add_argument("--threads", type=int, default=16, help="client threads creating them (default 16)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the Deployments")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--keep-log", type=Path, help="copy the operator's log here")
    parser.add_argument("--idle-seconds", type=float, default=0.0,
                        help="afterwards, measure the operator's CPU and API traffic at rest for this long")
    parser.add_argument("--operator-command", help="run this instead of vllm-operator (e.g. a profiling wrapper); "
                                                   "`run -A --standalone ...` is appended")
    parser.add_argument("--pairs", type=int, default=1,
                        help="run the operator and the bare-kopf baseline this many times, one after the other, and "
                             "print each pair's ratio and the median (the machine's load moves single ratios)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the bare-kopf baseline (benchmarks/bare_kopf_operator.py: one fixed Deployment "
                             "per VLLMService, the framework floor) run after the operator")
    args = parser.parse_args(argv)
    ratios: list[float] = []
    for _ in range(max(1, args.pairs)):
        result = run(args.count, args.threads, args.timeout, args.keep_log, args.operator_command, args.idle_seconds)
        if not args.no_baseline:
            result["bare_kopf"] = run(args.count, args.threads, args.timeout, None, BARE_KOPF, settle=False)
            ratios.append(result["throughput_per_s"] / max(result["bare_kopf"]["throughput_per_s"], 1e-9))
            if args.pairs > 1:
                print(f"pair {len(ratios)}: operator {result['throughput_per_s']}/s, bare kopf "
                      f"{result['bare_kopf']['throughput_per_s']}/s: {ratios[-1]:.2f}", flush=True)
    result["ratios"] = [round(r, 3) for r in ratios]
    lat = result["latency_s"]
    print(f"VLLMServices created:        {result['count']} in {result['create_seconds']} s "
          f"({result['create_rate_per_s']}/s, {result['threads']} client threads)")
    print(f"Deployments seen:            {result['deployments']}/{result['count']}"
          + ("" if result["complete"] else "  (TIMED OUT)"))
    print(f"create → Deployment latency: p50 {lat['p50']} s  p95 {lat['p95']} s  p99 {lat['p99']} s  "
          f"max {lat['max']} s")
    print(f"total wall time:             {result['wall_seconds']} s (first create → last Deployment)")
    print(f"throughput:                  {result['throughput_per_s']} Deployments/s")
    print(f"settled:                     {result['settled_seconds']} s (every status written, kopf done)")
    print(f"operator CPU time:           {result['operator_cpu_seconds']} s (until settled)")
    print(f"operator RSS:                idle {result['operator_rss_idle_mib']} MiB, "
          f"peak {result['operator_peak_rss_mib']} MiB")
    print(f"API requests served:         {result['api_requests']} "
          + ", ".join(f"{kind} {n}" for kind, n in list(result["api_requests_by_kind"].items())[:10]))
    if result["steady_state"]:
        rest = result["steady_state"]
        print(f"at rest ({rest['seconds']:.0f} s):              {rest['cpu_fraction_of_a_core']} of a core, "
              f"{rest['api_requests_per_s']} API requests/s, {rest['api_writes']} writes {rest['api_writes_by_kind'] or ''}")
    if "bare_kopf" in result:
        base = result["bare_kopf"]
        per_service = result["api_requests"] / max(result["count"], 1)
        base_per_service = base["api_requests"] / max(base["count"], 1)
        print(f"bare kopf (framework floor): {base['throughput_per_s']} Deployments/s, "
              f"{base['operator_cpu_seconds'] / max(base['count'], 1) * 1000:.1f} ms CPU and "
              f"{base_per_service:.1f} API requests per service "
              f"(operator: {result['operator_cpu_seconds'] / max(result['count'], 1) * 1000:.1f} ms, "
              f"{per_service:.1f})")
        print(f"API server + clients CPU:    {base['api_server_and_clients_cpu_seconds'] / max(base['count'], 1) * 1000:.1f}"
              f" ms per service with bare kopf, "
              f"{result['api_server_and_clients_cpu_seconds'] / max(result['count'], 1) * 1000:.1f} ms with the operator "
              "(the emulated API server runs in this process)")
        print(f"operator / bare kopf:        {result['throughput_per_s'] / max(base['throughput_per_s'], 1e-9):.2f} "
              "of the framework floor's throughput")
        if len(ratios) > 1:
            print(f"over {len(ratios)} pairs:              median {statistics.median(ratios):.2f}, "
                  f"min {min(ratios):.2f}, max {max(ratios):.2f} (" + ", ".join(f"{r:.2f}" for r in ratios) + ")")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
