"""What a remediation step costs in downloads, three ways (the real operator process on the simulated cluster).

One service (Qwen2.5-7B-Instruct on one L4) whose first start dies after loading the weights (its CUDA graphs need
3 GiB more than the planner's estimate: `--max-model-len auto` would absorb a larger activation peak by fitting a
shorter context, so the failure is one vLLM cannot fit around), so the operator takes one remediation step and the
step's new pod starts. The
simulated network gives the operator's assumed rate, 100 MiB/s (`--rate`). Three configurations:

* ephemeral: no default StorageClass, the cache is an emptyDir, vLLM downloads in every new pod;
* persistent, vLLM downloads: a claim, `--no-model-cache-download-init`: vLLM downloads once under its probe;
* persistent + init container (the default): the `model-download` init container downloads once, before vLLM.

Reported per configuration: downloads and GiB downloaded (the simulated kubelet's events), failed starts, the
simulated time from the first pod to Ready, and the startup probe's budget on the final Deployment.

    .venv/bin/python benchmarks/model_cache_download.py [--rate 100]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from vllm_operator_sim.cluster import SimulatedCluster
from vllm_operator_sim.scenarios import Scenario, ScenarioSet
from vllm_operator_sim.startup import HiddenFacts

NAME = "qwen"
MODEL = "Qwen/Qwen2.5-7B-Instruct"


@dataclass(frozen=True)
class Config:
    label: str
    storage_class: str | None
    operator_args: tuple[str, ...] = ()


CONFIGS = (
    Config("ephemeral (emptyDir)", None),
    Config("persistent, vLLM downloads", "standard", ("--no-model-cache-download-init",)),
    Config("persistent + init container", "standard"),
)


def _ready(cluster: SimulatedCluster) -> dict[str, Any] | None:
    obj = cluster.api.get_object("vllmservices", NAME, "default") or {}
    status = obj.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    stepped = ((status.get("remediation") or {}).get("step") or 0) >= 1
    return obj if ready and stepped else None


def run(config: Config, rate: float, timeout: float) -> dict[str, Any]:
    scenarios = ScenarioSet({NAME: Scenario(name=NAME, hidden=HiddenFacts(extra_cudagraph_gib=3.0))})
    with SimulatedCluster(pools=[("L4", 1, 1)], scenarios=scenarios,
                          default_storage_class=config.storage_class) as cluster:
        cluster.kubelet.download_mib_per_s = rate
        cluster.start_operator(*config.operator_args)
        cluster.apply({"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
                       "metadata": {"name": NAME, "namespace": "default"},
                       "spec": {"model": {"name": MODEL}, "gpu": {"product": "NVIDIA-L4"},
                                "remediation": {"minIntervalSeconds": 0}}})
        cluster.wait_for(lambda: _ready(cluster), timeout=timeout, message=f"{config.label}: Ready after a step")
        events = [e for e in cluster.kubelet.events if e.service == NAME]
        downloads = [e.details for e in events if e.kind == "download"]
        stats = cluster.kubelet.stats(NAME)
        deployment = cluster.api.get_object("deployments", NAME, "default") or {}
        vllm = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
        return {"config": config.label, "downloads": len(downloads),
                "gib": sum(d.get("bytes", 0) for d in downloads) / 2**30,
                "cache_hits": sum(1 for e in events if e.kind == "cache-hit"),
                "failed_starts": stats.failed_starts,
                "to_ready_s": (stats.ready_at or 0.0) - (stats.first_pod_at or 0.0),
                "probe_budget_s": vllm["startupProbe"]["failureThreshold"] * vllm["startupProbe"]["periodSeconds"]}


def _duration(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="simulated download rate, MiB/s (default 100)")
    parser.add_argument("--timeout", type=float, default=240.0, help="real seconds per configuration")
    args = parser.parse_args(argv)
    rows = [run(config, args.rate, args.timeout) for config in CONFIGS]
    print(f"{MODEL} on 1x L4, one remediation step (first start dies after loading), network {args.rate:g} MiB/s")
    print("| configuration | downloads | GiB downloaded | cache hits | failed starts | first pod to Ready "
          "| vLLM startup probe budget |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['downloads']} | {r['gib']:.1f} | {r['cache_hits']} | {r['failed_starts']} | "
              f"{_duration(r['to_ready_s'])} | {_duration(r['probe_budget_s'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
