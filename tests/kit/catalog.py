"""Models and GPUs from the built-in catalogs, as the planner's tests use them (offline: never asks the hub)."""

from __future__ import annotations

from functools import cache

from vllm_operator.planner.arch import ModelArch, arch_from_config
from vllm_operator.planner.gpus import GPUSpec, load_gpu_catalog
from vllm_operator.sources import load_model_files


@cache
def catalog_arch(model_id: str) -> ModelArch:
    """A model's architecture from the built-in catalog (offline: never asks the hub)."""
    files = load_model_files(model_id, offline=True)
    return arch_from_config(files.config, model_id=files.model_id, total_size=files.total_size,
                            total_size_estimated=files.total_size_estimated)


@cache
def catalog_gpu(name: str) -> GPUSpec:
    return load_gpu_catalog().get(name)
