"""Pool choice and options from the cluster (reconcile, pure): the smallest pool that meets the objective, the choice
and the alternatives in status, and options that only name GPUs the cluster has."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from vllm_operator import reconcile
from vllm_operator.sources import load_model_files

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA3_70B = "meta-llama/Meta-Llama-3-70B-Instruct"
L4 = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1"}
H100_X8 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
RTX4090 = {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090", "nvidia.com/gpu.count": "1"}
MIG = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "nvidia.com/gpu.count": "2",
       "nvidia.com/gpu.memory": "20096"}
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(spec: Mapping[str, Any], nodes: Sequence[Mapping[str, str]]) -> reconcile.Desired:
    return reconcile.desired_state(reconcile.Observed(
        name="svc", namespace="ns", uid="uid-1", generation=1, spec=spec, status={},
        now=datetime(2025, 1, 2, tzinfo=UTC), nodes=nodes,
        model_files=load_model_files(spec["model"]["name"], offline=True)))


def test_minimal_example_on_a_mixed_cluster_goes_to_the_l4() -> None:
    spec = yaml.safe_load((EXAMPLES / "minimal.yaml").read_text())["spec"]
    desired = run(spec, [H100_X8, L4, RTX4090])
    assert desired.status.gpu is not None and desired.status.gpu.product == "NVIDIA-L4"
    assert desired.plan is not None and desired.plan.usable
    source = desired.status.gpu.source or ""
    assert "chose 1× L4" in source
    for pool in ("1× L4: usable", "8× H100-SXM-80GB: usable", "1× RTX-4090"):
        assert pool in source, source
    assert desired.children is not None
    deployment = next(c for c in desired.children if c["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}


def test_a_model_that_needs_the_big_pool_gets_it() -> None:
    desired = run({"model": {"name": LLAMA3_70B}}, [RTX4090, L4, H100_X8])
    assert desired.status.gpu is not None and desired.status.gpu.product == "NVIDIA-H100-80GB-HBM3"
    assert desired.plan is not None and desired.plan.usable


def test_options_name_only_pools_the_cluster_has() -> None:
    # the case: Llama-3-70B pinned to a 1-GPU RTX-4090 node while the cluster has a free 8×H100 node
    desired = run({"model": {"name": LLAMA3_70B}, "gpu": {"product": "RTX-4090"}}, [RTX4090, H100_X8])
    assert desired.plan is not None and not desired.plan.fits and desired.children is None
    options = desired.plan.options
    assert options
    assert {o.gpu for o in options} <= {"RTX-4090", "H100-SXM-80GB"}
    assert all(o.source == "cluster" for o in options)
    assert all(not (o.gpu == "RTX-4090" and o.gpu_count > 1) for o in options)  # the node has one
    pool = next(o for o in options if o.kind == "pool")
    assert pool.gpu == "H100-SXM-80GB" and "change spec.gpu.product to NVIDIA-H100-80GB-HBM3" in pool.summary
    status_options = desired.status.plan.options if desired.status.plan else []
    assert any(o.model_dump(by_alias=True).get("source") == "cluster" for o in status_options)


def test_without_a_pool_that_fits_catalog_options_say_they_are_not_in_this_cluster() -> None:
    desired = run({"model": {"name": LLAMA3_70B}}, [RTX4090])
    assert desired.plan is not None and not desired.plan.fits
    assert desired.plan.options
    assert all(o.source == "catalog" and o.summary.endswith("(not in this cluster)") for o in desired.plan.options)


def test_no_tensor_parallelism_across_mig_slices() -> None:
    desired = run({"model": {"name": "Qwen/Qwen2.5-14B-Instruct"}}, [MIG])
    assert desired.plan is not None
    assert desired.plan.flags["tensor_parallel_size"] == 1
    assert all(not (o.gpu.endswith("3g.20gb") and o.gpu_count > 1) for o in desired.plan.options)


def test_a_degenerate_plan_says_its_trade_off_in_the_condition() -> None:
    from vllm_operator.api import conditions as cond

    # one RTX 5090 starts Qwen2.5-14B's 27.56 GiB of weights only degenerate (gemma-2-9b on an L4 with 0.26 was the
    # case before max-model-len was re-fitted for the chosen max-num-seqs: now usable)
    rtx5090 = {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-5090", "nvidia.com/gpu.count": "1"}
    desired = run({"model": {"name": "Qwen/Qwen2.5-14B-Instruct"}, "gpu": {"maxCount": 1}}, [rtx5090])
    assert desired.plan is not None and desired.plan.fits and not desired.plan.usable
    feasible = cond.find_condition(desired.status.conditions, cond.PLAN_FEASIBLE)
    assert feasible is not None and "Trade-off: no configuration within the 1 GPU(s) allowed" in feasible.message


def test_an_infeasible_digest_image_says_the_version_was_assumed() -> None:
    from vllm_operator.api import conditions as cond

    desired = run({"model": {"name": LLAMA3_70B}, "image": "vllm/vllm-openai@sha256:" + "ab" * 32}, [RTX4090])
    feasible = cond.find_condition(desired.status.conditions, cond.PLAN_FEASIBLE)
    assert feasible is not None and feasible.reason == cond.PLAN_INFEASIBLE
    assert "assumed" in feasible.message and "spec.vllmVersion" in feasible.message
