"""The "use a larger GPU" option names only GPUs a cluster adds: whole datacenter GPUs on Linux nodes (issue 23)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from vllm_operator.planner import PlanRequest, plan
from vllm_operator.planner.arch import ModelArch
from vllm_operator.planner.gpus import GPUCatalog, GPUSpec, load_gpu_catalog
from vllm_operator.planner.plan import offered_as_larger

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def test_only_datacenter_rows_on_linux_are_offered_as_larger_gpus() -> None:
    catalog = list(load_gpu_catalog())
    offered = {gpu.name for gpu in catalog if offered_as_larger(gpu)}
    assert {"A10", "L4", "L40S", "H100-SXM-80GB", "H200-SXM-141GB", "B200-180GB"} <= offered
    for gpu in catalog:
        if gpu.host == "wsl2" or gpu.tier != "datacenter" or gpu.uma or gpu.is_mig:
            assert gpu.name not in offered, gpu.name
    assert not {"RTX-4090-WSL2", "RTX-4090-Laptop", "RTX-4070-Laptop", "RTX-5090", "GB10", "GH200-96GB"} & offered


def test_a_laptop_that_is_too_small_is_offered_a_datacenter_gpu_not_a_wsl2_or_laptop_row(
        load_arch: Callable[[str], ModelArch], gpu: Callable[[str], GPUSpec],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the desktop rows are the next sizes up from the laptop: before the filter the first one that fits was offered
    rows = ["RTX-4070-Laptop", "RTX-4090-Laptop", "RTX-4080-16GB", "RTX-4090-WSL2", "RTX-5090", "GB10", "L40S",
            "H100-SXM-80GB"]
    small = GPUCatalog(gpu(name) for name in rows)
    monkeypatch.setattr("vllm_operator.planner.gpus.load_gpu_catalog", lambda *_a, **_k: small)
    result = plan(PlanRequest(arch=load_arch(LLAMA_8B), gpu=gpu("RTX-4070-Laptop")))
    assert not result.fits
    larger = [option for option in result.options if option.kind == "larger-gpu"]
    assert [option.gpu for option in larger] == ["L40S"], [option.summary for option in result.options]
    assert larger[0].summary.startswith("Use a larger GPU: L40S")
