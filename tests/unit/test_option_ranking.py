"""Options rank by what the user must change least (issue 23): the same GPUs first, then fewer nodes and GPUs, then
other pools of this cluster, then another checkpoint, then GPUs the cluster lacks; an option blocked only by the
user's own limit names the limit; a multi-node option never ranks above a single-node one."""

from __future__ import annotations

from typing import Any

from kit import adversarial
from vllm_operator import reconcile
from vllm_operator.planner.plan import Option, rank_options

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
RTX4090 = {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090", "nvidia.com/gpu.count": "1"}
A10 = {"nvidia.com/gpu.product": "NVIDIA-A10", "nvidia.com/gpu.count": "1"}
MIG = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "nvidia.com/gpu.count": "7",
       "nvidia.com/mig.strategy": "single"}


def _options(spec: dict[str, Any], nodes: tuple[dict[str, str], ...]) -> list[dict[str, Any]]:
    observed = adversarial.observe(spec, "svc", nodes)
    desired = reconcile.desired_state(observed)
    assert adversarial.check(observed, desired) == "PlanInfeasible"
    assert desired.plan is not None
    return [o.model_dump() for o in desired.plan.options]


def test_a_pinned_small_gpu_is_offered_the_clusters_large_pool_naming_the_limits() -> None:
    """Llama-3-70B pinned to a one-GPU RTX 4090 node with maxCount 1, a free 8×H100 node beside it: was offered
    '8× RTX-4090 (not in this cluster)' and 'a B200 (not in this cluster)'."""
    options = _options({"model": {"name": "meta-llama/Meta-Llama-3-70B-Instruct"},
                        "gpu": {"product": "NVIDIA-GeForce-RTX-4090", "maxCount": 1}}, (RTX4090, H100))
    first = options[0]
    assert first["gpu"] == "H100-SXM-80GB" and first["source"] == "cluster", options
    assert "spec.gpu.product to NVIDIA-H100-80GB-HBM3" in first["summary"]
    assert f"raise spec.gpu.maxCount to {first['gpu_count']}" in first["summary"] and first["gpu_count"] > 1
    assert not [o for o in options if "not in this cluster" in o["summary"]], options


def test_a_mig_slice_gets_another_pool_then_a_checkpoint_before_anything_spanning() -> None:
    """Llama-3.1-8B on a MIG 1g.10gb slice: 'span 3 nodes of one MIG slice each' came first."""
    options = _options({"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                        "gpu": {"product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"}}, (MIG, MIG, MIG, A10))
    kinds = [o["kind"] for o in options]
    assert kinds[0] == "pool" and options[0]["gpu"] == "A10", options
    assert "quantized-checkpoint" in kinds and kinds.index("pool") < kinds.index("quantized-checkpoint")
    assert all(k != "nodes" for k in kinds[:kinds.index("quantized-checkpoint") + 1])


def _option(kind: str, summary: str, gpus: int = 1, source: str = "cluster") -> Option:
    return Option(summary=summary, kind=kind, source=source, flags={}, gpu="G", gpu_count=gpus, kv_cache_tokens=1,
                  max_model_len=1, max_concurrency=1.0)


def test_rank_order_and_multi_node_last_among_the_clusters() -> None:
    found = [
        _option("nodes", "span 3 nodes", gpus=3),
        _option("larger-gpu", "a B200", source="catalog"),
        _option("quantized-checkpoint", "4-bit checkpoint"),
        _option("pool", "the A10 pool"),
        _option("gpus", "4 GPUs", gpus=4),
        _option("gpus", "2 GPUs", gpus=2),
        _option("flags", "fp8 KV cache"),
        _option("gpus", "8× RTX-4090 (not in this cluster)", gpus=8, source="catalog"),
    ]
    ranked = [o.summary for o in rank_options(found, in_cluster=True)]
    assert ranked == ["fp8 KV cache", "2 GPUs", "4 GPUs", "the A10 pool", "4-bit checkpoint", "span 3 nodes",
                      "8× RTX-4090 (not in this cluster)", "a B200"]
    # the CLI (no cluster): only a larger GPU counts as GPUs one lacks
    cli = [o.summary for o in rank_options(found)]
    assert cli.index("span 3 nodes") > cli.index("4-bit checkpoint") and cli[-1] == "a B200"
