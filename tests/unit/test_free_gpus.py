"""Free GPUs per node (allocatable minus the GPU requests of the pods bound to it) and per pool."""

from __future__ import annotations

from typing import Any

from vllm_operator.api.labels import OBSERVED_FREE_GPUS
from vllm_operator.handlers.observe import free_gpus
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator.reconcile import pool_free_gpus


def node(name: str, gpus: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"nvidia.com/gpu": gpus}}}


def test_free_is_allocatable_minus_requests_and_unknown_without_the_pods() -> None:
    nodes = [node("a", "8"), node("b", "4"), node("c", "lots"), {"metadata": {"name": "d"}}]
    assert free_gpus(nodes, {"a": 6, "b": 5}) == {"a": 2, "b": 0}  # never negative; unreadable counts left out
    assert free_gpus(nodes, None) == {}  # pods could not be listed: unknown, not free


def _labels(product: str, count: int, free: str | None) -> dict[str, str]:
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count)}
    if free is not None:
        labels[OBSERVED_FREE_GPUS] = free
    return labels


def test_a_pool_reports_the_most_free_on_one_node_and_unknown_stays_unknown() -> None:
    catalog = load_gpu_catalog()
    nodes = [_labels("NVIDIA-H100-80GB-HBM3", 8, "0"), _labels("NVIDIA-H100-80GB-HBM3", 8, "3"),
             _labels("NVIDIA-L4", 1, "1"), _labels("NVIDIA-A100-SXM4-80GB", 8, "8"),
             _labels("NVIDIA-A100-SXM4-80GB", 8, None)]
    assert pool_free_gpus(nodes, catalog) == {("H100-SXM-80GB", 8): 3, ("L4", 1): 1}
