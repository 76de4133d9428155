"""remediation.groups: a failing pod of a multi-node group attributed to its rank and pipeline stage; network
failures (NCCL, Gloo, ZMQ, rendezvous) read as `Network`, which the ladder surfaces without touching a memory flag."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from vllm_operator.planner.failures import FailureKind
from vllm_operator.remediation.classifier import classify_text
from vllm_operator.remediation.groups import attribute, failed_stage, network_failure, recreations_exhausted
from vllm_operator.remediation.policy import Action, Current, decide

LWS = "leaderworkerset.sigs.k8s.io/"


def test_tp_per_node_each_node_is_one_stage() -> None:
    # Llama-3.1-405B on 2 x 8 H100: TP 8 x PP 2; the worker holds ranks 8..15 = stage 1 (the lm_head stage)
    worker = attribute({LWS + "worker-index": "1", LWS + "group-index": "3"}, gpus_per_node=8, tensor_parallel_size=8)
    assert worker is not None
    assert (worker.group, worker.node_rank, worker.ranks, worker.stages) == (3, 1, tuple(range(8, 16)), (1,))
    assert worker.describe() == "worker 1 (node rank 1, ranks 8–15, pipeline stage 1)"
    leader = attribute({LWS + "worker-index": "0"}, gpus_per_node=8, tensor_parallel_size=8)
    assert leader is not None and leader.stages == (0,) and leader.group is None


def test_tp1_pp_on_pcie_nodes_spans_stages_per_node() -> None:
    # 70B on 2 x 2 L40S as TP 1 x PP 4: node 1 holds ranks 2, 3 = stages 2 and 3
    node = attribute({LWS + "worker-index": "1"}, gpus_per_node=2, tensor_parallel_size=1)
    assert node is not None and node.stages == (2, 3)
    assert "pipeline stages 2, 3" in node.describe()


@pytest.mark.parametrize("labels", [{}, {LWS + "worker-index": "x"}, {LWS + "worker-index": "-1"}])
def test_not_a_group_pod(labels: dict[str, str]) -> None:
    assert attribute(labels, gpus_per_node=8, tensor_parallel_size=8) is None


@pytest.mark.parametrize(("text", "what"), [
    ("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error",
     "Gloo"),
    ("[Rank 9] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600000 "
     "milliseconds before timing out. ProcessGroupNCCL.cpp:1234 timed out", "NCCL"),
    ("NCCL WARN NET/Socket : Connect to 10.0.0.2<43210> failed : Connection refused", "NCCL"),
    ("zmq.error.ZMQError: Cannot assign requested address (addr='tcp://10.0.0.5:13345')", "ZMQ"),
    ("torch.distributed.DistNetworkError: The client socket has timed out after 600s while trying to connect to "
     "(llama-405b-0.llama-405b.default, 29501).", "rendezvous"),
    ("OSError: [Errno 99] Cannot assign requested address", "network"),
])
def test_network_failures_are_recognised(text: str, what: str) -> None:
    assert network_failure(text) == what
    failure = classify_text(text, exit_code=1)
    assert failure.kind is FailureKind.NETWORK and what in failure.summary


@pytest.mark.parametrize("text", [
    "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",  # a CUDA fault
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.57 GiB is free.",
    "INFO 05-20 09:15:02 [parallel_state.py:1165] world_size=16 rank=8 backend=nccl",
])
def test_not_network(text: str) -> None:
    assert classify_text(text, exit_code=1).kind is not FailureKind.NETWORK


def test_a_network_failure_never_changes_a_memory_flag() -> None:
    failure = classify_text("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/"
                            "tcp/pair.cc:144] no error", exit_code=1)
    current = Current(flags={"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "gpu_memory_utilization": 0.92,
                             "max_model_len": 131072, "max_num_seqs": 330}, gpu_total_gib=79.19)
    decision = decide(failure, "uid/1", current, datetime(2025, 6, 1, tzinfo=UTC))
    assert decision.action is Action.SURFACE and decision.constraints is None and decision.changed == {}


def test_group_recreations_are_bounded() -> None:
    assert not recreations_exhausted(3, 3) and recreations_exhausted(4, 3)


def test_failures_are_recorded_once_with_rank_and_stage_first_failure_first() -> None:
    from vllm_operator.remediation.groups import record_failure

    multi = {"nodes": 2, "gpusPerNode": 8, "tensorParallelSize": 8, "pipelineParallelSize": 2}
    worker = {LWS + "worker-index": "1", LWS + "group-index": "0"}
    first = record_failure(multi, pod="big-0-1", pod_uid="u1", labels=worker, failure_class="CUDAOOMStartup",
                           summary="CUDA out of memory on the last stage", time="2025-01-01T00:00:00Z")
    assert first is not None
    assert first["failures"] == [{"pod": "big-0-1", "podUID": "u1", "nodeRank": 1, "stages": [1],
                                  "failureClass": "CUDAOOMStartup", "summary": "CUDA out of memory on the last stage",
                                  "time": "2025-01-01T00:00:00Z"}]
    assert record_failure(first, pod="big-0-1", pod_uid="u1", labels=worker, failure_class="x", summary="y",
                          time="t") is None
    second = record_failure(first, pod="big-0", pod_uid="u2", labels={LWS + "worker-index": "0"},
                            failure_class="Network", summary="NCCL failure", time="2025-01-01T00:00:01Z")
    assert second is not None and [f["pod"] for f in second["failures"]] == ["big-0-1", "big-0"]


def test_recreations_count_leader_changes_under_the_same_plan_only() -> None:
    from vllm_operator.remediation.groups import count_recreations

    multi = count_recreations({}, {"0": ("a", "p1")})
    assert multi["groupRecreations"] == 0 and multi["leaders"] == {"0": "a/p1"}
    multi = count_recreations(multi, {"0": ("b", "p1")})     # recreated after a failure: counted
    assert multi["groupRecreations"] == 1
    multi = count_recreations(multi, {"0": ("b", "p1")})     # the same leader: nothing
    assert multi["groupRecreations"] == 1
    multi = count_recreations(multi, {"0": ("c", "p2")})     # a new profile (remediation step): not a failure
    assert multi["groupRecreations"] == 1 and multi["leaders"] == {"0": "c/p2"}


def test_a_group_recreated_because_its_download_failed_is_not_counted() -> None:
    """LWS's RecreateGroupOnPodRestart reads init containers too: a gated model's failing model-download retry
    recreates the group, again and again; none of those count toward maxGroupRecreations. Once the download no
    longer fails, a recreation after a pod failure counts again."""
    from vllm_operator.remediation.groups import count_recreations

    multi = count_recreations({}, {"0": ("a", "p1"), "1": ("x", "p1")}, download_failed={"0"})
    assert multi["leaders"] == {"0": "a/p1/download-failed", "1": "x/p1"}
    for leader in ("b", "c", "d"):  # each retry of the init container: a new group, still failing
        multi = count_recreations(multi, {"0": (leader, "p1"), "1": ("x", "p1")}, download_failed={"0"})
    assert multi["groupRecreations"] == 0
    multi = count_recreations(multi, {"0": ("d", "p1"), "1": ("y", "p1")}, download_failed={"0"})
    assert multi["groupRecreations"] == 1  # group 1's vLLM failed: counted
    multi = count_recreations(multi, {"0": ("d", "p1"), "1": ("y", "p1")})  # the download succeeded since
    assert multi["leaders"]["0"] == "d/p1"
    multi = count_recreations(multi, {"0": ("e", "p1"), "1": ("y", "p1")})
    assert multi["groupRecreations"] == 2


@pytest.mark.parametrize(("spec", "limit"), [
    ({}, 5), ({"remediation": {}}, 5), ({"remediation": {"maxGroupRecreations": 2}}, 2),
    ({"remediation": {"maxGroupRecreations": 0}}, 0),
    # written around the CRD (out of bounds, wrong type, not a mapping): the default, never a crash
    ({"remediation": {"maxGroupRecreations": 1000}}, 5), ({"remediation": {"maxGroupRecreations": "3"}}, 5),
    ({"remediation": "x"}, 5), (None, 5)])
def test_the_group_recreation_bound_is_spec_remediation_max_group_recreations(spec: Any, limit: int) -> None:
    from vllm_operator.remediation.groups import group_recreation_limit

    assert group_recreation_limit(spec) == limit


def test_max_group_recreations_is_bounded_in_the_api() -> None:
    from vllm_operator.api.v1alpha1 import SpecValidationError, parse_spec

    assert parse_spec({"model": {"name": "m/x"}}).remediation.max_group_recreations == 5
    assert parse_spec({"model": {"name": "m/x"}, "remediation": {"maxGroupRecreations": 7}}) \
        .remediation.max_group_recreations == 7
    with pytest.raises(SpecValidationError, match="maxGroupRecreations"):
        parse_spec({"model": {"name": "m/x"}, "remediation": {"maxGroupRecreations": 101}})


SYSTEM_ERROR = "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"


@pytest.mark.parametrize("before", ["", "INFO 05-20 09:15:02 [parallel_state.py:1165] world_size=2 rank=0 backend=nccl\n"])
def test_a_bare_nccl_system_error_is_not_the_network(before: str) -> None:
    """ncclSystemError means a system call failed; on one node NCCL uses shared memory and P2P, no network. The
    usual cause in a pod is /dev/shm: the summary says so, the class is Unknown, and no flag changes."""
    failure = classify_text(before + SYSTEM_ERROR, exit_code=1)
    assert failure.kind is FailureKind.UNKNOWN
    assert "NCCL error: unhandled system error" in failure.summary and "/dev/shm" in failure.summary
    assert "spec.resources.shmSize" in failure.summary
    current = Current(flags={"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9, "max_model_len": 8192})
    assert decide(failure, "uid/1", current, datetime(2025, 6, 1, tzinfo=UTC)).action is Action.SURFACE


def test_an_nccl_system_error_quotes_its_own_line_only() -> None:
    """Issue 20: the rest of the log is text nothing recognised; it stays in the pod (the excerpt went to
    status.remediation.history)."""
    text = "worker said: session q7Zk-SECRET-SHAPE-3nT1 refused\n" + SYSTEM_ERROR
    failure = classify_text(text, exit_code=1)
    assert failure.kind is FailureKind.UNKNOWN and "NCCL error: unhandled system error" in failure.excerpt
    assert "SECRET-SHAPE" not in failure.model_dump_json()


def test_nccl_shared_memory_failures_are_named() -> None:
    text = ("NCCL WARN Error: failed to extend /dev/shm/nccl-4Lq1 to 9637892 bytes\n"
            "NCCL WARN Error while creating shared memory segment /dev/shm/nccl-4Lq1 (size 9637888)\n" + SYSTEM_ERROR)
    failure = classify_text(text, exit_code=1)
    assert failure.kind is FailureKind.UNKNOWN
    assert failure.summary.startswith("NCCL could not allocate its shared memory")


def test_a_system_error_with_the_network_transport_in_the_log_is_network() -> None:
    text = "NCCL WARN NET/Socket : Connect to 10.0.0.2<43210> failed : Connection refused\n" + SYSTEM_ERROR
    failure = classify_text(text, exit_code=1)
    assert failure.kind is FailureKind.NETWORK and failure.summary.startswith("NCCL failure between ranks")


@pytest.mark.parametrize(("node_rank", "device", "stage"), [
    (1, "cuda:1", 3),   # 2 x 2 L40S, TP 1 x PP 4: node 1's GPU 1 is rank 3 = stage 3
    (1, "cuda:0", 2),
    (0, "cuda:1", 1),
    (1, "cuda:2", None),  # not a GPU of this pod
    (1, None, None),      # the failure names no GPU
    (1, "GPU", None),
])
def test_the_gpu_a_cuda_oom_names_picks_one_stage_of_a_node_holding_several(
        node_rank: int, device: str | None, stage: int | None) -> None:
    node = attribute({LWS + "worker-index": str(node_rank)}, gpus_per_node=2, tensor_parallel_size=1)
    assert node is not None
    assert failed_stage(node, device, 1) == stage


def test_with_tp_2_on_a_node_of_8_the_gpu_picks_its_tp_groups_stage() -> None:
    # TP 2 x PP 8 over 2 x 8 GPUs: node 1 holds ranks 8..15 = stages 4..7; its GPU 5 is rank 13 = stage 6
    node = attribute({LWS + "worker-index": "1"}, gpus_per_node=8, tensor_parallel_size=2)
    assert node is not None and node.stages == (4, 5, 6, 7)
    assert failed_stage(node, "cuda:5", 2) == 6 and failed_stage(node, "cuda:4", 2) == 6
    assert failed_stage(node, "cuda:0", 2) == 4
