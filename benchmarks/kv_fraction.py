"""KV capacity as a fraction of the physical limit, over the catalog models × the catalog GPUs.

The physical limit of a plan is the KV memory vLLM could use at the GPU's highest safe utilization
(`planner.gpus.safe_utilization`: CUDA context/NCCL, a desktop on GeForce/workstation cards and slack for fragmentation
left outside the budget) minus the plan's own weights, activation and overhead. For every model × GPU the planner
fits on one GPU (no workload: the default objective), this prints the fraction the plan reaches, next to what the
former blanket per-tier margin (the catalog's `default_utilization`) and vLLM's own default utilization would reach
with the same weights, activation and overhead. Above 1.0 means that margin leaves less outside the budget than the
GPU needs (a desktop's memory, the CUDA context, slack): a start that may fail or be killed later.

    .venv/bin/python benchmarks/kv_fraction.py            # per-GPU table and the totals
    .venv/bin/python benchmarks/kv_fraction.py --models   # one line per model × GPU as well
"""

from __future__ import annotations

import argparse
import statistics
import sys
from importlib import resources

from vllm_operator.planner import PlanRequest, plan
from vllm_operator.planner.arch import ModelArch, arch_from_config
from vllm_operator.planner.gpus import GPUSpec, load_gpu_catalog, safe_utilization
from vllm_operator.planner.memory import init_nontorch_gib
from vllm_operator.planner.versions import profile_for
from vllm_operator.sources import load_model_files


def _models() -> list[ModelArch]:
    names = sorted(path.name[:-5].replace("__", "/", 1)
                   for path in resources.files("vllm_operator.catalog").joinpath("models").iterdir()
                   if path.name.endswith(".json"))
    archs = []
    for name in names:
        files = load_model_files(name, offline=True)
        archs.append(arch_from_config(files.config, model_id=files.model_id, total_size=files.total_size,
                                      total_size_estimated=files.total_size_estimated))
    return archs


def _fraction_at(util: float, gpu: GPUSpec, physical: float, other: float) -> float:
    """The KV fraction a plan with the same weights/activation/overhead reaches at another utilization."""
    return max(util * gpu.reported_gib - other, 0.0) / physical


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", action="store_true", help="print every model × GPU")
    args = parser.parse_args()
    profile = profile_for(None)
    graphs_in_budget = profile.cudagraph_subtracted
    archs = _models()
    print(f"vLLM {profile.version}; {len(archs)} catalog models; plans on 1 GPU with no workload (default objective)")
    print(f"{'GPU':<18} {'util':>5} {'tier util':>9} {'fits':>5} {'planned':>8} {'tier':>6} {'vLLM dflt':>9} "
          f"{'min':>6}")
    planned_all: list[float] = []
    tier_all: list[float] = []
    default_all: list[float] = []
    for gpu in load_gpu_catalog():
        safe, _ = safe_utilization(gpu, init_nontorch_gib(1, gpu.nvlink))
        planned: list[float] = []
        tier: list[float] = []
        default: list[float] = []
        for arch in archs:
            result = plan(PlanRequest(arch=arch, gpu=gpu))
            if not result.fits or result.kv_fraction is None:
                continue
            mem = result.memory
            other = mem.weights_gib + mem.activation_gib + mem.non_torch_gib + (
                mem.cudagraph_gib if graphs_in_budget else 0.0)
            physical = safe * gpu.reported_gib - other
            if physical <= 0:
                continue
            planned.append(result.kv_fraction)
            tier.append(_fraction_at(gpu.default_utilization, gpu, physical, other))
            default.append(_fraction_at(profile.default_utilization, gpu, physical, other))
            if args.models:
                print(f"    {arch.model_id:<52} {result.kv_fraction:6.3f} {tier[-1]:6.3f} {default[-1]:6.3f}")
        if planned:
            print(f"{gpu.name:<18} {safe:5.2f} {gpu.default_utilization:9.2f} {len(planned):5d} "
                  f"{statistics.median(planned):8.3f} {statistics.median(tier):6.3f} "
                  f"{statistics.median(default):9.3f} {min(planned):6.3f}")
        planned_all += planned
        tier_all += tier
        default_all += default
    print(f"\nall: {len(planned_all)} fitting model × GPU plans; median KV fraction of the physical limit: planned "
          f"{statistics.median(planned_all):.3f} (min {min(planned_all):.3f}), blanket tier margin "
          f"{statistics.median(tier_all):.3f}, vLLM's default utilization {statistics.median(default_all):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
