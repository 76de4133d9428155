"""The reconcile core with spec.gpu.maxNodes: a plan that spans nodes renders one LeaderWorkerSet; a missing LWS API,
an old vLLM or too few nodes get a condition that says what to do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.sources import load_model_files

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
LLAMA_405B = "meta-llama/Llama-3.1-405B-Instruct"
H100_X8 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
SPEC: dict[str, Any] = {"model": {"name": LLAMA_405B}, "gpu": {"maxNodes": 2}}


def run(spec: Mapping[str, Any], *, nodes: Sequence[Mapping[str, str]] = (H100_X8, H100_X8),
        lws: bool | None = True, status: Mapping[str, Any] | None = None) -> reconcile.Desired:
    observed = reconcile.Observed(
        name="big", namespace="ns", uid="uid-1", generation=1, spec=spec, status=dict(status or {}), now=NOW,
        nodes=nodes, model_files=load_model_files(spec["model"]["name"], offline=True),
        lws_installed=None if lws is None else bool(lws))
    return reconcile.desired_state(observed)


def conditions(desired: reconcile.Desired) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in desired.status.conditions}


def test_405b_with_max_nodes_2_renders_one_lws_of_two_8_gpu_pods() -> None:
    desired = run(SPEC)
    assert desired.children is not None
    assert [c["kind"] for c in desired.children] == ["LeaderWorkerSet", "Service"]
    lws = desired.children[0]
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "8"
    args = leader["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"
    gpu = desired.status.gpu
    assert gpu is not None and (gpu.count, gpu.nodes) == (8, 2)
    multi = desired.status.multi_node
    assert multi is not None
    assert (multi.nodes, multi.gpus_per_node, multi.tensor_parallel_size, multi.pipeline_parallel_size) == (2, 8, 8, 2)
    assert multi.limiting_stage == 1 and [s.layers for s in multi.stages] == [63, 63]
    assert multi.leader_worker_set == "big"
    assert conditions(desired)[cond.PLAN_FEASIBLE] == (cond.TRUE, cond.PLAN_FITS)
    # the stored status round-trips (camelCase, as kubectl shows it)
    stored = desired.status.to_dict()
    assert stored["gpu"]["nodes"] == 2 and stored["multiNode"]["stages"][1]["kvCacheGiB"] > 0


def test_max_nodes_1_is_unchanged_and_says_how_many_nodes_would_do() -> None:
    desired = run({"model": {"name": LLAMA_405B}})
    assert desired.children is None
    assert desired.status.plan is not None and not desired.status.plan.fits
    summaries = [o.summary for o in desired.status.plan.options]
    # issue 23: the nodes it would take are offered, after the options that keep one node
    assert [s for s in summaries if s.startswith("Span 2 nodes of 8× H100")] == summaries[-1:], summaries
    assert desired.status.multi_node is None


def test_lws_not_installed_says_how_to_install_and_rechecks() -> None:
    desired = run(SPEC, lws=False)
    assert desired.children is None
    assert conditions(desired)[cond.DEGRADED] == (cond.TRUE, cond.LWS_NOT_INSTALLED)
    message = next(c.message for c in desired.status.conditions if c.type == cond.DEGRADED)
    assert "helm install lws oci://registry.k8s.io/lws/charts/lws --version=0.10.0" in message
    assert desired.retry_after == 60
    assert [e.reason for e in desired.events] == [cond.LWS_NOT_INSTALLED]
    # the same answer again: no second Warning event
    again = run(SPEC, lws=False, status=desired.status.to_dict())
    assert again.events == []
    # installed later: the next check renders it, and the problem is gone
    installed = run(SPEC, lws=True, status=desired.status.to_dict())
    assert installed.children is not None
    assert conditions(installed)[cond.DEGRADED] == (cond.FALSE, cond.AS_EXPECTED)


def test_vllm_without_native_multinode_is_refused() -> None:
    desired = run({**SPEC, "image": "vllm/vllm-openai:v0.11.0"})
    assert desired.children is None
    assert conditions(desired)[cond.DEGRADED] == (cond.TRUE, cond.MULTI_NODE_UNSUPPORTED)
    assert desired.retry_after is None


@pytest.mark.parametrize("pool", [1, 2])
def test_too_few_nodes_renders_but_says_insufficient_nodes(pool: int) -> None:
    desired = run(SPEC, nodes=[H100_X8] * pool)
    assert desired.children is not None
    progressing = conditions(desired)[cond.PROGRESSING]
    if pool == 1:
        assert progressing == (cond.TRUE, cond.INSUFFICIENT_NODES)
        message = next(c.message for c in desired.status.conditions if c.type == cond.PROGRESSING)
        assert "needs 2 × 8× H100" in message and "found 1" in message
    else:
        assert progressing[1] != cond.INSUFFICIENT_NODES
