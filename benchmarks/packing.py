#!/usr/bin/env python3
"""GPUs used by a fleet of small and mid models packed onto shared GPUs, versus one GPU set per service, and the
startups that fail in the simulator (issue 26; target: 0).

The fleet: 12 catalog services with stated workloads (context tokens × concurrent requests), on a pool of one GPU
kind. Packed: `planner.packing.pack` (one share group). One per service: the planner's own plan for each service
alone (its GPU count, up to 8). Then, on every shared GPU, the members are started in the simulator
(`vllm_operator_sim.shared_gpu`: each start sees what the running members hold, as the simulator measures it with
its hidden perturbations, not the planner's figures) — in the plan's start order, in the reverse order, and in up to
`--orders` more random orders (seeded) — and every start that fails is counted, as is any moment when the Ready
members' serving peaks together exceed the GPU. Then each member is restarted with every other member of its GPU
running (a pod restart), and those are counted too.

Usage: python benchmarks/packing.py [--gpu H100] [--vllm-version 0.33.0] [--orders 20] [-o json]
Prints a markdown table per GPU and the totals (deterministic: no timing).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any

from vllm_operator.modelfiles import find_in_catalog
from vllm_operator.planner.arch import ModelArch, arch_from_config
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator.planner.packing import GroupPlan, PackMember, PackRequest, gpus_alone, pack
from vllm_operator.planner.plan import Workload
from vllm_operator.planner.versions import NEWEST_KNOWN_VERSION
from vllm_operator_sim.shared_gpu import SharedGPU

#: (service name, catalog model, context tokens, concurrent requests)
FLEET: tuple[tuple[str, str, int, int], ...] = (
    ("chat-small", "Qwen/Qwen2.5-0.5B-Instruct", 8192, 8),
    ("router", "Qwen/Qwen2.5-1.5B-Instruct", 4096, 16),
    ("summarize", "meta-llama/Llama-3.2-1B-Instruct", 16384, 4),
    ("extract", "meta-llama/Llama-3.2-3B-Instruct", 8192, 8),
    ("classify", "ibm-granite/granite-3.1-2b-instruct", 4096, 8),
    ("assistant", "meta-llama/Llama-3.1-8B-Instruct", 16384, 8),
    ("code", "Qwen/Qwen2.5-7B-Instruct", 8192, 8),
    ("team-a", "Qwen/Qwen3-4B", 8192, 4),
    ("team-b", "Qwen/Qwen3-8B", 8192, 4),
    ("docs", "mistralai/Mistral-7B-Instruct-v0.3", 8192, 4),
    ("search", "google/gemma-2-2b-it", 4096, 8),
    ("phi", "microsoft/Phi-3-mini-4k-instruct", 4096, 8),
)


def _arch(ref: str) -> ModelArch:
    files = find_in_catalog(ref)
    if files is None:
        raise SystemExit(f"{ref} is not in the catalog")
    return arch_from_config(files.config, model_id=files.model_id, total_size=files.total_size,
                            total_size_estimated=files.total_size_estimated)


def members() -> tuple[PackMember, ...]:
    return tuple(PackMember(name=name, arch=_arch(ref), workload=Workload(context_length=ctx, concurrency=conc))
                 for name, ref, ctx, conc in FLEET)


def simulate(group: GroupPlan, fleet: dict[str, PackMember], gpu_name: str, version: str,
             orders: int, seed: int) -> list[dict[str, Any]]:
    """Per shared GPU: starts tried, starts failed, over-committed moments, and the failures' first lines."""
    gpu = load_gpu_catalog().get(gpu_name)
    image = f"vllm/vllm-openai:v{version}"
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for shared in group.gpus:
        if not shared.members:
            continue
        names = [m.name for m in shared.members]
        args = {m.name: [fleet[m.name].arch.model_id, *m.args] for m in shared.members}
        sequences = [list(group.start_order_of(names)), list(reversed(group.start_order_of(names)))]
        for _ in range(orders):
            sequences.append(rng.sample(names, len(names)))
        tried = failed = over = 0
        failures: list[str] = []
        for sequence in sequences:
            device = SharedGPU(gpu)
            for name in sequence:
                outcome = device.start(name, args[name], image, fleet[name].arch)
                tried += 1
                if not outcome.starts:
                    failed += 1
                    failures.append(f"{name}: {outcome.failure_kind}")
                over += device.over_committed()
            for name in names:  # each member restarts with every other one running
                outcome = device.start(name, args[name], image, fleet[name].arch)
                tried += 1
                if not outcome.starts:
                    failed += 1
                    failures.append(f"{name} (restart): {outcome.failure_kind}")
                over += device.over_committed()
        rows.append({"gpu": shared.index, "members": names, "used_gib": shared.used_gib, "free_gib": shared.free_gib,
                     "orders": len(sequences), "starts": tried, "failed": failed, "over_committed": over,
                     "failures": sorted(set(failures))[:10]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", default="H100")
    p.add_argument("--vllm-version", default=NEWEST_KNOWN_VERSION)
    p.add_argument("--orders", type=int, default=20, help="random start orders per GPU beside the plan's and reverse")
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    args = p.parse_args(argv)
    gpu = load_gpu_catalog().get(args.gpu)
    fleet = members()
    group = pack(PackRequest(group="fleet", gpu=gpu, members=fleet, vllm_version=args.vllm_version))
    alone = gpus_alone(fleet, gpu, args.vllm_version)
    rows = simulate(group, {m.name: m for m in fleet}, args.gpu, args.vllm_version, args.orders, args.seed)
    used = sum(1 for g in group.gpus if g.members)
    result = {"gpu": gpu.name, "vllm_version": args.vllm_version, "services": len(fleet),
              "gpus_packed": used, "gpus_one_per_service": alone,
              "unplaced": [u.model_dump() for u in group.unplaced],
              "starts": sum(r["starts"] for r in rows), "failed_starts": sum(r["failed"] for r in rows),
              "over_committed": sum(r["over_committed"] for r in rows), "per_gpu": rows}
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        print(f"{len(fleet)} services on {gpu.name} (vLLM {args.vllm_version}): {used} GPUs packed, "
              f"{alone} with one GPU set per service; unplaced: {len(group.unplaced)}")
        print()
        print("| GPU | members | held GiB | free GiB | start orders | starts | failed | over-committed |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['gpu']} | {', '.join(r['members'])} | {r['used_gib']:.2f} | {r['free_gib']:.2f} | "
                  f"{r['orders']} | {r['starts']} | {r['failed']} | {r['over_committed']} |")
        print()
        print(f"failed starts: {result['failed_starts']} of {result['starts']}; over-committed moments: "
              f"{result['over_committed']}")
        for r in rows:
            for line in r["failures"]:
                print(f"  GPU {r['gpu']}: {line}")
    return 0 if result["failed_starts"] == 0 and result["over_committed"] == 0 and not group.unplaced else 1


if __name__ == "__main__":
    sys.exit(main())
