#!/usr/bin/env python3
"""How long one plan takes in-process (the issue asks for < 50 ms).

Plans a spread of catalog models on a spread of GPUs (dense, MoE, MLA, hybrid sliding-window, quantized; fitting,
needing TP, and infeasible — the slow path that also computes options), repeats each, and reports p50/p95/max
per plan. Model files are loaded once (that is I/O, not planning).

Usage: python benchmarks/planner_speed.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from vllm_operator.planner import PlanRequest, Workload, plan
from vllm_operator.planner.arch import arch_from_config
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator.sources import load_model_files

CASES = [
    ("meta-llama/Llama-3.1-8B-Instruct", "L4", 1, None),
    ("meta-llama/Llama-3.1-8B-Instruct", "H100-SXM-80GB", 1, Workload(context_length=8192, concurrency=64)),
    ("meta-llama/Llama-3.1-70B-Instruct", "H100-SXM-80GB", 8, None),
    ("meta-llama/Llama-3.1-70B-Instruct", "RTX-4090", 1, None),           # infeasible: options computed
    ("Qwen/Qwen2.5-7B-Instruct-AWQ", "RTX-4080-16GB", 1, None),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "A100-SXM4-80GB", 4, None),
    ("deepseek-ai/DeepSeek-V2-Lite", "L4", 4, None),
    ("google/gemma-3-27b-it", "H100-SXM-80GB", 2, None),
    ("openai/gpt-oss-20b", "H100-SXM-80GB", 1, None),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    catalog = load_gpu_catalog()
    requests = []
    for model, gpu, count, workload in CASES:
        files = load_model_files(model)
        arch = arch_from_config(files.config, model_id=files.model_id, total_size=files.total_size)
        requests.append((model, gpu, PlanRequest(arch=arch, gpu=catalog.get(gpu), gpu_count=count,
                                                 workload=workload or Workload())))
    print(f"{'model':42} {'gpu':16} {'fits':5} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    everything = []
    for model, gpu, request in requests:
        plan(request)  # warm caches (catalog, version eras)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = plan(request)
            times.append((time.perf_counter() - start) * 1000)
        times.sort()
        everything.extend(times)
        p95 = times[int(len(times) * 0.95) - 1]
        print(f"{model[:42]:42} {gpu:16} {str(result.fits):5} {statistics.median(times):8.2f} {p95:8.2f} "
              f"{times[-1]:8.2f}")
    everything.sort()
    p95_all = everything[int(len(everything) * 0.95) - 1]
    print(f"\nall plans: n={len(everything)} p50 {statistics.median(everything):.2f} ms, p95 {p95_all:.2f} ms, "
          f"max {everything[-1]:.2f} ms (target < 50 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
