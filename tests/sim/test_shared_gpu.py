"""The simulated shared GPU (vllm_operator_sim/shared_gpu.py): a start sees what the running members hold; the
packing benchmark's fleet starts in every order tried without a failure."""

from __future__ import annotations

import sys
from pathlib import Path

from vllm_operator.modelfiles import find_in_catalog
from vllm_operator.planner.arch import ModelArch, arch_from_config
from vllm_operator.planner.failures import FailureKind
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator_sim.shared_gpu import SharedGPU

IMAGE = "vllm/vllm-openai:v0.33.0"


def _arch(ref: str) -> ModelArch:
    files = find_in_catalog(ref)
    assert files is not None
    return arch_from_config(files.config, model_id=files.model_id, total_size=files.total_size,
                            total_size_estimated=files.total_size_estimated)


def test_a_second_process_fails_the_free_memory_check_when_the_first_holds_too_much() -> None:
    gpu = load_gpu_catalog().get("L40S")
    arch = _arch("Qwen/Qwen2.5-1.5B-Instruct")
    device = SharedGPU(gpu)
    first = device.start("a", [arch.model_id, "--gpu-memory-utilization", "0.6", "--max-model-len", "8192"], IMAGE,
                         arch)
    assert first.starts and device.used_gib() > 0.6 * gpu.reported_gib
    second = device.start("b", [arch.model_id, "--gpu-memory-utilization", "0.5", "--max-model-len", "8192"], IMAGE,
                          arch)
    assert not second.starts and second.failure_kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY
    assert "b" not in device.held
    smaller = device.start("b", [arch.model_id, "--gpu-memory-utilization", "0.3", "--max-model-len", "8192"], IMAGE,
                           arch)
    assert smaller.starts and not device.over_committed()
    device.stop("a")
    assert device.used_gib() == device.held["b"]


def test_the_packed_fleet_starts_in_every_order_tried(capsys) -> None:  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import packing
    finally:
        sys.path.pop(0)
    code = packing.main(["--orders", "1", "--gpu", "L40S"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "failed starts: 0 of" in out
