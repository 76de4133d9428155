"""Stage-specific remediation of a multi-node group (issue 13): a memory failure of ONE pipeline stage first moves a
layer off that stage (VLLM_PP_LAYER_PARTITION on every rank) or spans one more node within spec.gpu.maxNodes, before
the uniform steps; recorded like every step, never against a pinned env or flag, bounded by maxSteps.

Hand-checked partitions: Llama-3.1-405B has 126 layers; vLLM's get_pp_indices splits them 63/63 over PP 2. A CUDA
OOM on the last stage (lm_head + sampler) moves one layer to stage 0: 64/62; on stage 0 (embedding): 62/64.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from vllm_operator import reconcile
from vllm_operator.api.v1alpha1 import parse_spec
from vllm_operator.planner import messages
from vllm_operator.planner.arch import ModelArch
from vllm_operator.planner.failures import FailureKind
from vllm_operator.planner.memory import EngineFlags, GPUFacts
from vllm_operator.planner.multinode import pp_partition, stage_memory
from vllm_operator.planner.versions import profile_for
from vllm_operator.remediation import ladder
from vllm_operator.remediation.classifier import Failure, classify_text
from vllm_operator.remediation.evidence import ContainerEvidence
from vllm_operator.remediation.policy import Action, Current, decide, failure_key
from vllm_operator.render.manifests import ANNOTATION_PLAN
from vllm_operator.sources import load_model_files

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
LLAMA_405B = "meta-llama/Llama-3.1-405B-Instruct"
H100_X8 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
SPEC: dict[str, Any] = {"model": {"name": LLAMA_405B}, "gpu": {"maxNodes": 2},
                        "remediation": {"minIntervalSeconds": 0}}
OOM = classify_text(messages.cuda_oom_message(device=0, tried_mib=1024.0, total_gib=79.19, free_mib=310.0,
                                              in_use_gib=78.8, torch_gib=76.1), exit_code=1)
PP2_FLAGS = {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "gpu_memory_utilization": 0.9,
             "max_model_len": 131072, "max_num_seqs": 8}


def current(**changes: Any) -> Current:
    values: dict[str, Any] = {"flags": dict(PP2_FLAGS), "stage_layers": (63, 63), "failed_stages": (1,), "nodes": 2,
                              "max_nodes": 2, "gpu_total_gib": 79.19}
    values.update(changes)
    return Current(**values)


def test_the_oom_texts_are_startup_ooms() -> None:
    assert OOM.kind is FailureKind.CUDA_OOM_STARTUP


def test_vllms_own_split_of_405b_is_63_63_and_the_override_is_checked() -> None:
    assert pp_partition(126, 2) == [63, 63]
    assert pp_partition(126, 2, "64,62") == [64, 62]
    with pytest.raises(ValueError, match="sum to 126"):
        pp_partition(126, 2, "64,63")


@pytest.mark.parametrize(("stage", "expected"), [(1, "64,62"), (0, "62,64")])
def test_an_oom_of_one_stage_moves_one_layer_off_it(stage: int, expected: str) -> None:
    decision = decide(OOM, "uid/1", current(failed_stages=(stage,)), NOW)
    assert decision.action is Action.STEP
    assert decision.changed == {"pp_layer_partition": expected}
    assert decision.constraints is not None and decision.constraints.pp_layer_partition == expected
    assert f"63,63 → {expected}" in decision.message
    assert ("lm_head and sampler" in decision.message) == (stage == 1)


def test_a_stage_that_keeps_failing_gives_more_layers_up_to_an_eighth_then_the_uniform_ladder() -> None:
    layers, cur = (63, 63), current()
    partitions = []
    for _ in range(12):
        decision = decide(OOM, f"uid/{len(partitions)}", cur.model_copy(update={"stage_layers": layers}), NOW)
        assert decision.action is Action.STEP and decision.constraints is not None
        if "pp_layer_partition" not in decision.changed:
            break
        partitions.append(decision.changed["pp_layer_partition"])
        layers = tuple(int(p) for p in decision.changed["pp_layer_partition"].split(","))
        cur = cur.model_copy(update={"constraints": decision.constraints})
    # int(63 × 0.125) = 7 layers at most leave stage 1
    assert partitions == ["64,62", "65,61", "66,60", "67,59", "68,58", "69,57", "70,56"]
    assert decision.changed == {"force_enforce_eager": True}   # then the uniform ladder (one node allowed more: no)


def test_a_stage_that_received_layers_is_not_emptied_back() -> None:
    """Stage 0 took a layer from stage 1; its own OOM does not move the layer back (no ping-pong)."""
    decision = decide(OOM, "uid/1", current(stage_layers=(64, 62), failed_stages=(0,)), NOW)
    assert decision.changed == {"force_enforce_eager": True}


def test_with_the_partition_pinned_a_node_is_added_within_max_nodes() -> None:
    decision = decide(OOM, "uid/1", current(partition_pinned=True, max_nodes=3), NOW)
    assert decision.changed == {"min_nodes": 3, "pp_layer_partition": None}
    assert "2 → 3" in decision.message
    # at maxNodes: the uniform ladder
    assert decide(OOM, "uid/1", current(partition_pinned=True), NOW).changed == {"force_enforce_eager": True}


def test_a_pinned_layout_never_gets_another_node() -> None:
    cur = current(partition_pinned=True, max_nodes=4, pinned=frozenset({"pipeline_parallel_size"}))
    assert "min_nodes" not in decide(OOM, "uid/1", cur, NOW).changed


@pytest.mark.parametrize("changes", [{"failed_stages": ()}, {"failed_stages": (0, 1)}, {"stage_layers": ()}])
def test_failures_of_no_single_stage_take_the_uniform_ladder(changes: Mapping[str, Any]) -> None:
    assert decide(OOM, "uid/1", current(**changes), NOW).changed == {"force_enforce_eager": True}


def test_a_network_failure_of_a_stage_changes_nothing() -> None:
    nccl = classify_text("RuntimeError: NCCL error: remote process exited or there was a network error", exit_code=1)
    assert nccl.kind is FailureKind.NETWORK
    assert decide(nccl, "uid/1", current(), NOW).action is Action.SURFACE


def test_the_planner_splits_memory_by_the_partition(load_arch: Callable[[str], ModelArch]) -> None:
    arch = load_arch(LLAMA_405B)
    flags = EngineFlags(tensor_parallel_size=8, pipeline_parallel_size=2, max_model_len=8192, max_num_seqs=8,
                        max_num_batched_tokens=8192)
    gpu, profile = GPUFacts(total_gib=79.19), profile_for("0.26.0")
    even = stage_memory(arch, flags, gpu, profile)
    moved = stage_memory(arch, flags.model_copy(update={"pp_layer_partition": (64, 62)}), gpu, profile)
    assert [s.layers for s in even] == [63, 63] and [s.layers for s in moved] == [64, 62]
    assert moved[1].first_layer == 64
    assert moved[0].weights_gib > even[0].weights_gib and moved[1].weights_gib < even[1].weights_gib
    assert moved[1].kv_cache_gib > even[1].kv_cache_gib


# --- the ladder over the real planner and renderer -------------------------------------------------------------

def _observed(status: Mapping[str, Any], spec: Mapping[str, Any],
              nodes: Sequence[Mapping[str, str]] = (H100_X8, H100_X8)) -> ladder.Observed:
    base = reconcile.Observed(name="big", namespace="ns", uid="uid-1", generation=1, spec=dict(spec),
                              status=dict(status), now=NOW, nodes=nodes,
                              model_files=load_model_files(LLAMA_405B, offline=True), lws_installed=True)
    return ladder.Observed(status=dict(status), generation=1, now=NOW, render=reconcile.renderer(base))


def _worker_oom(node_rank: int, failure: Failure = OOM) -> ladder.PodFailure:
    pod = "big-0" if node_rank == 0 else f"big-0-{node_rank}"
    evidence = ContainerEvidence(namespace="ns", pod_name=pod, pod_uid=f"uid-{pod}", restart_count=1,
                                 terminated_reason="Error", exit_code=1)
    return ladder.PodFailure(evidence, failure, failure_key(evidence.pod_uid, 1), node_rank=node_rank)


def _lws(children: Sequence[Mapping[str, Any]] | None) -> Mapping[str, Any]:
    assert children is not None
    return next(c for c in children if c["kind"] == "LeaderWorkerSet")


def _env(lws: Mapping[str, Any], role: str) -> dict[str, str]:
    container = lws["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def test_a_last_stage_oom_is_recorded_then_every_rank_gets_the_partition() -> None:
    spec = dict(SPEC)
    first = _observed({}, spec)
    planned = first.render({})
    status = planned.status.to_dict()
    assert [s["layers"] for s in status["multiNode"]["stages"]] == [63, 63]
    outcome = ladder.next_step(_observed(status, spec), parse_spec(spec), failures=[_worker_oom(1)])
    assert isinstance(outcome, ladder.Outcome) and outcome.action == "step"
    recorded = outcome.status.to_dict()
    # recorded: the profile, the history entry, and the stages as the partition makes them
    assert recorded["remediation"]["profile"] == {"ppLayerPartition": "64,62"}
    assert recorded["remediation"]["history"][-1]["message"].startswith("out of memory on pipeline stage 1")
    assert [s["layers"] for s in recorded["multiNode"]["stages"]] == [64, 62]
    # then acted on: the same env on leader and workers, a new plan hash, nothing else in the args changed
    lws, before = _lws(outcome.children), _lws(planned.children)
    for role in ("leaderTemplate", "workerTemplate"):
        assert _env(lws, role)["VLLM_PP_LAYER_PARTITION"] == "64,62"
        assert "VLLM_PP_LAYER_PARTITION" not in _env(before, role)
    plan_of = [t["metadata"]["annotations"][ANNOTATION_PLAN]
               for t in (lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"],
                         lws["spec"]["leaderWorkerTemplate"]["workerTemplate"],
                         before["spec"]["leaderWorkerTemplate"]["leaderTemplate"])]
    assert plan_of[0] == plan_of[1] != plan_of[2]
    # the same failure again, on the recorded status: nothing more (record-then-act is idempotent)
    again = ladder.next_step(_observed(recorded, spec), parse_spec(spec), failures=[_worker_oom(1)])
    assert not isinstance(again, ladder.Outcome) or again.action != "step"
    # a reconcile of the recorded status renders the very same pods (it completes the step, never undoes it)
    assert _lws(_observed(recorded, spec).render(recorded).children) == lws


def test_a_partition_set_by_the_user_is_never_changed_a_node_is_added_instead() -> None:
    spec = {**SPEC, "gpu": {"maxNodes": 3}, "env": [{"name": "VLLM_PP_LAYER_PARTITION", "value": "63,63"}]}
    nodes = (H100_X8, H100_X8, H100_X8)
    status = _observed({}, spec, nodes).render({}).status.to_dict()
    assert status["multiNode"]["nodes"] == 2
    outcome = ladder.next_step(_observed(status, spec, nodes), parse_spec(spec), failures=[_worker_oom(1)])
    assert isinstance(outcome, ladder.Outcome) and outcome.action == "step"
    recorded = outcome.status.to_dict()
    assert recorded["remediation"]["profile"] == {"minNodes": 3}
    assert recorded["multiNode"]["nodes"] == 3
    assert [s["layers"] for s in recorded["multiNode"]["stages"]] == [42, 42, 42]
    lws = _lws(outcome.children)
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 3
    assert _env(lws, "workerTemplate")["VLLM_PP_LAYER_PARTITION"] == "63,63"   # the user's, untouched


# --- spec.network: RDMA / InfiniBand passthrough on every pod of a group ---------------------------------------

def test_rdma_resources_and_ipc_lock_reach_every_pod_of_a_group_and_nothing_else() -> None:
    spec = {**SPEC, "network": {"rdmaResources": [{"name": "rdma/rdma_shared_device_a", "count": 1}],
                                "ipcLock": True},
            "env": [{"name": "NCCL_IB_HCA", "value": "mlx5_0,mlx5_1"}]}
    desired = _observed({}, spec).render({})
    lws = _lws(desired.children)
    for role in ("leaderTemplate", "workerTemplate"):
        container = lws["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"][0]
        assert container["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
        assert container["resources"]["requests"]["rdma/rdma_shared_device_a"] == "1"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert _env(lws, role)["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    # without spec.network: no capability is added, no device requested
    plain = _lws(_observed({}, SPEC).render({}).children)
    container = plain["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    assert "add" not in container["securityContext"]["capabilities"]
    assert not any(k.startswith("rdma/") for k in container["resources"]["limits"])
    # a plan on one node is a Deployment: spec.network does not apply there
    one = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "gpu": {"maxNodes": 2},
           "network": {"rdmaResources": [{"name": "rdma/ib", "count": 1}], "ipcLock": True}}
    base = reconcile.Observed(name="small", namespace="ns", uid="uid-2", generation=1, spec=one, status={},
                              now=NOW, nodes=(H100_X8,),
                              model_files=load_model_files("meta-llama/Llama-3.1-8B-Instruct", offline=True))
    children = reconcile.desired_state(base).children
    assert children is not None
    deployment = next(c for c in children if c["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "rdma/ib" not in container["resources"]["limits"] and "add" not in container["securityContext"][
        "capabilities"]


@pytest.mark.parametrize(("network", "security", "field"), [
    ({"rdmaResources": [{"name": "nvidia.com/gpu", "count": 8}]}, {}, "rdmaResources[0].name"),
    ({"rdmaResources": [{"name": "memory", "count": 1}]}, {}, "rdmaResources[0].name"),
    ({"rdmaResources": [{"name": "rdma/ib", "count": 0}]}, {}, "rdmaResources[0].count"),
    ({"rdmaResources": [{"name": f"rdma/d{i}", "count": 1} for i in range(5)]}, {}, "rdmaResources"),
    ({"ipcLock": True}, {"profile": "restricted"}, "network.ipcLock"),
    ({"hostNetwork": True}, {}, "hostNetwork"),
])
def test_spec_network_is_bounded(network: dict[str, Any], security: dict[str, Any], field: str) -> None:
    from vllm_operator.api.v1alpha1 import SpecValidationError

    with pytest.raises(SpecValidationError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_spec({**SPEC, "network": network, **({"security": security} if security else {})})


def test_the_engines_kv_checks_are_not_one_stages() -> None:
    """No KV memory / a KV cache too small is decided over the minimum of every stage (vLLM's
    unify_kv_cache_configs): a stage step would not be justified by it, whichever rank reported it."""
    no_kv = classify_text(messages.no_kv_memory_message(profile_for("0.26.0")), exit_code=1)
    assert no_kv.kind is FailureKind.NO_KV_CACHE_MEMORY
    assert "pp_layer_partition" not in decide(no_kv, "uid/1", current(), NOW).changed


@pytest.mark.parametrize("stages", [[{"layers": -3}, {"layers": 129}], [{"layers": "x"}, {"layers": 63}], "nope",
                                    [{"layers": 0}, {"layers": 126}]])
def test_a_status_edited_by_hand_takes_no_stage_step_and_never_crashes(stages: Any) -> None:
    status = {"multiNode": {"nodes": 2, "gpusPerNode": 8, "tensorParallelSize": 8, "stages": stages}}
    cur = ladder.current_from(parse_spec(SPEC), status, node_rank=1)
    assert cur.stage_layers == ()
    assert "pp_layer_partition" not in decide(OOM, "uid/1", cur.model_copy(update={"flags": PP2_FLAGS}), NOW).changed


def _tp1_status() -> dict[str, Any]:
    # Llama-3.1-70B (80 layers) on 2 nodes x 2 L40S as TP 1 x PP 4: vLLM's split 20/20/20/20; node 1 holds stages 2, 3
    return {"multiNode": {"nodes": 2, "gpusPerNode": 2, "tensorParallelSize": 1, "pipelineParallelSize": 4,
                          "stages": [{"layers": 20}, {"layers": 20}, {"layers": 20}, {"layers": 20}]}}


def _oom_on(gpu: int) -> Failure:
    return classify_text(messages.cuda_oom_message(device=gpu, tried_mib=512.0, total_gib=44.42, free_mib=120.0,
                                                   in_use_gib=44.3, torch_gib=41.0), exit_code=1)


@pytest.mark.parametrize(("gpu", "stage", "partition"), [(1, 3, "20,20,21,19"), (0, 2, "20,21,19,20")])
def test_a_node_holding_several_stages_moves_a_layer_off_the_stage_whose_gpu_failed(
        gpu: int, stage: int, partition: str) -> None:
    """Ranks are TP-fastest and each worker runs on cuda:<local rank>: the GPU torch's message names on node 1 is
    rank 2 + gpu, i.e. stage 2 + gpu at TP 1. The layer goes to the stage with the fewest layers, nearest first."""
    failure = _oom_on(gpu)
    assert failure.kind is FailureKind.CUDA_OOM_STARTUP and failure.device == f"cuda:{gpu}"
    cur = ladder.current_from(parse_spec(SPEC), _tp1_status(), node_rank=1, device=failure.device)
    assert cur.failed_stages == (stage,) and cur.stage_layers == (20, 20, 20, 20)
    flags = {"tensor_parallel_size": 1, "pipeline_parallel_size": 4, "max_model_len": 32768}
    decision = decide(failure, "uid/1", cur.model_copy(update={"flags": flags}), NOW)
    assert decision.action is Action.STEP and decision.changed == {"pp_layer_partition": partition}
    assert f"pipeline stage {stage}" in decision.message


def test_a_node_holding_several_stages_without_a_named_gpu_takes_the_uniform_ladder() -> None:
    failure = classify_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB.",
                            exit_code=1)
    assert failure.kind is FailureKind.CUDA_OOM_STARTUP and failure.device is None
    cur = ladder.current_from(parse_spec(SPEC), _tp1_status(), node_rank=1, device=failure.device)
    assert cur.failed_stages == (2, 3)
    flags = {"tensor_parallel_size": 1, "pipeline_parallel_size": 4, "max_model_len": 32768}
    assert "pp_layer_partition" not in decide(failure, "uid/1", cur.model_copy(update={"flags": flags}), NOW).changed


@pytest.mark.parametrize("multi", [{"tensorParallelSize": "x"}, {"gpusPerNode": [1]}])
def test_a_hand_edited_layout_with_a_named_gpu_never_crashes(multi: dict[str, Any]) -> None:
    status = {"multiNode": {**_tp1_status()["multiNode"], **multi}}
    cur = ladder.current_from(parse_spec(SPEC), status, node_rank=1, device="cuda:1")
    assert cur.stage_layers == () and cur.failed_stages == ()
