"""The remediation ladder end to end: the real operator (its kopf registry in-process; the `vllm-operator run`
process where a restart must lose all memory) against the emulated API server over HTTP. The test plays the user (VLLMServices over HTTP), the kubelet (pods of the Deployment's
current template whose vllm container crash-loops, with the status and termination message the kubelet writes
under FallbackToLogsOnError) and vLLM (its own error texts, by release, from `planner.messages`).

Every wait is a poll with a timeout; "nothing more happened" is asserted after a barrier that proves the operator
looked (its reads of the pods, from the emulator's access log) and went quiet.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kit.inprocess import (
    Cluster,
    args_of,
    condition,
    corpus_text,
    engine_failure_log,
    flag,
    history,
    kubelet_termination_message,
    plan_annotation,
    remediation,
    serving_oom_log,
    vllm_container,
    vllm_texts,
)
from vllm_operator.handlers import kube
from vllm_operator.handlers.remediation import remediate_service
from vllm_operator.handlers.service import reconcile_service

QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"  # on one L4: TP 1, utilization 0.9, max-model-len 32768, max-num-seqs 37
NAME = "qwen"
FAST = {"minIntervalSeconds": 0}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    env = Cluster(tmp_path)
    try:
        yield env
    finally:
        env.close()


def deploy(cluster: Cluster, spec: dict[str, Any] | None = None, *, gpus: int = 1, memory: str = "64Gi",
           process: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """One GPU node, the operator, a VLLMService; returns (Deployment, VLLMService) once it is planned."""
    cluster.add_gpu_node(count=gpus, memory=memory)
    cluster.start_operator(process=process)
    body: dict[str, Any] = {"model": {"name": QWEN_7B}, "remediation": dict(FAST)}
    for key, value in (spec or {}).items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    cluster.create_service(NAME, body)
    deployment = cluster.wait_deployment(NAME)

    def planned() -> dict[str, Any] | None:
        obj = cluster.service(NAME)
        return obj if (obj.get("status") or {}).get("plan") else None
    service = cluster.wait_for(planned, message="status.plan written")
    assert service["status"]["plan"]["fits"] is True
    return deployment, service


def texts(service: dict[str, Any]) -> dict[str, Callable[..., str]]:
    """vLLM's error texts for the release the service runs."""
    return vllm_texts(service["status"]["plan"]["vllmVersion"])


def crash_message(error: str, *, loaded: bool = True) -> str:
    return kubelet_termination_message(engine_failure_log(error, loaded=loaded))


def kv_error(service: dict[str, Any], max_model_len: int, estimate: int) -> str:
    """KVCacheTooSmall as the service's release words it, with consistent numbers (57344 B/token for Qwen 7B)."""
    per_token_gib = 57344 / 2**30
    return texts(service)["kv"](max_model_len=max_model_len, needed_gib=max_model_len * per_token_gib,
                                available_gib=estimate * per_token_gib, estimated_max_len=estimate,
                                kv_tokens=estimate)


def torch_oom(service: dict[str, Any]) -> str:
    return texts(service)["oom"](device=0, tried_mib=260.0, total_gib=22.03, free_mib=120.5, in_use_gib=21.9,
                                 torch_gib=21.5)


def memory_gib(deployment: dict[str, Any]) -> float:
    value = vllm_container(deployment)["resources"]["limits"]["memory"]
    assert value.endswith("Gi"), value
    return float(value[:-2])


def changed_from(before: dict[str, Any]) -> Callable[[dict[str, Any]], bool]:
    return lambda d: d["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]


def assert_step_recorded(cluster: Cluster, obj: dict[str, Any], pod: dict[str, Any], failure_class: str, *,
                         step: int, evidence: str, restart_count: int = 1) -> dict[str, Any]:
    """The history entry, the Event and the Degraded condition of one step; returns the entry."""
    rem = remediation(obj)
    assert rem["step"] == step and rem.get("exhausted") is False
    entry = rem["history"][-1]
    assert entry["step"] == step
    assert entry["failureClass"] == failure_class
    assert evidence in entry["evidence"], entry["evidence"]
    assert entry["podUID"] == pod["metadata"]["uid"] and entry["restartCount"] == restart_count
    taken = datetime.fromisoformat(entry["time"].replace("Z", "+00:00"))
    assert abs(datetime.now(UTC) - taken) < timedelta(minutes=1)
    assert entry["flagsBefore"] and entry["flagsAfter"] and entry["message"]
    assert rem["lastFailureKey"] == f"{pod['metadata']['uid']}/{restart_count}"
    degraded = condition(obj, "Degraded")
    assert degraded is not None and (degraded["status"], degraded["reason"]) == ("True", "Remediating")
    assert f"step {step}" in degraded["message"]
    events = cluster.wait_events(NAME, f"Remediated{failure_class}")
    assert events[-1]["involvedObject"]["uid"] == obj["metadata"]["uid"]
    assert events[-1]["type"] == "Warning" and f"step {step}" in events[-1]["message"]
    return dict(entry)


# --- each class: evidence in the pod → the Deployment's args change, history, Event, Degraded -----------------

@dataclass(frozen=True)
class Case:
    failure_class: str
    evidence: str                                                       # in the history entry's excerpt
    crash: Callable[[Cluster, dict[str, Any], dict[str, Any]], dict[str, Any]]
    check: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], None]  # Deployment before, after, entry
    spec: dict[str, Any] = field(default_factory=dict)
    gpus: int = 1


def _kv(c: Cluster, d: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    return c.crashed_pod(d, "qwen-7d9f-kv", message=crash_message(kv_error(s, 32768, 20000)))


def _kv_check(before: dict[str, Any], after: dict[str, Any], entry: dict[str, Any]) -> None:
    # vLLM's estimate 20000, rounded down: the next attempt is computed, not halved. The full context fits as
    # planned, so it is rendered as vLLM's auto-fit (planner/plan.py::_operator_auto); the crash stands for a start
    # that still failed the KV check (status.plan keeps the planned 32768)
    assert flag(args_of(before), "--max-model-len") == "auto"
    assert flag(args_of(after), "--max-model-len") == "19456"
    assert entry["flagsBefore"]["maxModelLen"] == 32768 and entry["flagsAfter"]["maxModelLen"] == 19456


FREE_GIB, TOTAL_GIB = 17.4, 21.84


def _free(c: Cluster, d: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    error = texts(s)["free"](device=0, free_gib=FREE_GIB, total_gib=TOTAL_GIB, util=0.9, requested_gib=19.66)
    return c.crashed_pod(d, "qwen-7d9f-free", message=crash_message(error, loaded=False))


def _free_check(before: dict[str, Any], after: dict[str, Any], entry: dict[str, Any]) -> None:
    util = float(flag(args_of(after), "--gpu-memory-utilization") or 0)
    assert util < 0.9
    assert util * TOTAL_GIB <= FREE_GIB  # vLLM's own startup check passes next time
    assert entry["flagsAfter"]["gpuMemoryUtilization"] == util


def _no_kv(c: Cluster, d: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    return c.crashed_pod(d, "qwen-7d9f-nokv", message=crash_message(texts(s)["no_kv"]()))


def _no_kv_check(before: dict[str, Any], after: dict[str, Any], entry: dict[str, Any]) -> None:
    assert flag(args_of(before), "--gpu-memory-utilization") == "0.92"  # the L4's highest safe one (issue 16)
    assert flag(args_of(after), "--gpu-memory-utilization") == "0.95"


def _weights(c: Cluster, d: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    error = texts(s)["weights"](torch_oom(s))
    return c.crashed_pod(d, "qwen-7d9f-weights", message=crash_message(error, loaded=False))


def _weights_check(before: dict[str, Any], after: dict[str, Any], entry: dict[str, Any]) -> None:
    assert flag(args_of(before), "--tensor-parallel-size") == "1"
    assert flag(args_of(after), "--tensor-parallel-size") == "2"
    resources = vllm_container(after)["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == "2"


def _oom_serving(c: Cluster, d: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    message = kubelet_termination_message(serving_oom_log(torch_oom(s)))
    return c.crashed_pod(d, "qwen-7d9f-serving", message=message, ready_before=True)


def _oom_serving_check(before: dict[str, Any], after: dict[str, Any], entry: dict[str, Any]) -> None:
    seqs = int(flag(args_of(before), "--max-num-seqs") or 0)
    assert seqs > 1
    assert flag(args_of(after), "--max-num-seqs") == str(seqs // 2)


def _oom_startup(c: Cluster, d: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    # the same allocator text as while serving, but this run never became Ready
    message = kubelet_termination_message(serving_oom_log(torch_oom(s)))
    return c.crashed_pod(d, "qwen-7d9f-startup", message=message, ready_before=False)


def _oom_startup_check(before: dict[str, Any], after: dict[str, Any], entry: dict[str, Any]) -> None:
    assert "--enforce-eager" not in args_of(before)
    assert "--enforce-eager" in args_of(after)


def _host_oom(c: Cluster, d: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    return c.crashed_pod(d, "qwen-7d9f-host", reason="OOMKilled", exit_code=137)


def _host_oom_check(before: dict[str, Any], after: dict[str, Any], entry: dict[str, Any]) -> None:
    limit = memory_gib(before)
    assert memory_gib(after) == math.ceil(limit * 1.5)
    resources = vllm_container(after)["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert args_of(after) == args_of(before)  # a host-memory step changes no vLLM flag


CASES = {
    "KVCacheTooSmall": Case("KVCacheTooSmall", "estimated maximum model length is 20000", _kv, _kv_check),
    "InsufficientFreeGPUMemory": Case("InsufficientFreeGPUMemory", "Free memory on device cuda:0 (17.40/21.84 GiB)",
                                      _free, _free_check),
    "NoKVCacheMemory": Case("NoKVCacheMemory", "No available memory for the cache blocks", _no_kv, _no_kv_check),
    "WeightsDoNotFit": Case("WeightsDoNotFit", "Failed to load model - not enough GPU memory", _weights,
                            _weights_check, spec={"gpu": {"maxCount": 2}}, gpus=2),
    "CUDAOOMServing": Case("CUDAOOMServing", "CUDA out of memory. Tried to allocate 260.00 MiB", _oom_serving,
                           _oom_serving_check),
    "CUDAOOMStartup": Case("CUDAOOMStartup", "CUDA out of memory. Tried to allocate 260.00 MiB", _oom_startup,
                           _oom_startup_check),
    "HostOOMKilled": Case("HostOOMKilled", "OOMKilled", _host_oom, _host_oom_check),
}


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_a_failing_pod_gets_its_class_step(cluster: Cluster, case: Case) -> None:
    deployment, service = deploy(cluster, case.spec, gpus=case.gpus)
    pod = case.crash(cluster, deployment, service)

    obj = cluster.wait_history(NAME, 1)
    after = cluster.wait_deployment(NAME, changed_from(deployment), message="the Deployment rolled out the step")
    entry = assert_step_recorded(cluster, obj, pod, case.failure_class, step=1, evidence=case.evidence)
    case.check(deployment, after, entry)
    plan = cluster.service(NAME)["status"]["plan"]
    assert plan["flags"] == entry["flagsAfter"]
    assert _contains(args_of(after), plan["args"]), (plan["args"], args_of(after))


def _contains(whole: list[str], part: list[str]) -> bool:
    return any(whole[i:i + len(part)] == part for i in range(len(whole) - len(part) + 1))


def test_an_empty_termination_message_is_read_from_the_log_tail(cluster: Cluster) -> None:
    deployment, service = deploy(cluster)
    log = engine_failure_log(kv_error(service, 32768, 20000))
    pod = cluster.crashed_pod(deployment, "qwen-7d9f-log", message="", log=log)

    obj = cluster.wait_history(NAME, 1)
    assert cluster.accessed("get", "pods", "log"), "the operator did not read pods/log"
    entry = assert_step_recorded(cluster, obj, pod, "KVCacheTooSmall", step=1,
                                 evidence="estimated maximum model length is 20000")
    after = cluster.wait_deployment(NAME, changed_from(deployment))
    assert flag(args_of(after), "--max-model-len") == "19456" == str(entry["flagsAfter"]["maxModelLen"])


# --- bounded -------------------------------------------------------------------------------------------------------

def test_exhaustion_stops_the_ladder(cluster: Cluster) -> None:
    deployment, service = deploy(cluster, {"remediation": {"maxSteps": 2}})
    no_kv = crash_message(texts(service)["no_kv"]())
    pods = []
    for n in (1, 2):  # each failure on a pod of the newest template
        pods.append(cluster.crashed_pod(deployment, f"qwen-step{n}", message=no_kv, restart_count=n))
        cluster.wait_history(NAME, n)
        deployment = cluster.wait_deployment(NAME, changed_from(deployment))
    args = args_of(deployment)
    assert flag(args, "--gpu-memory-utilization") == "0.95" and "--enforce-eager" in args

    third = cluster.crashed_pod(deployment, "qwen-step3", message=no_kv, restart_count=3)
    obj = cluster.wait_condition(NAME, "Degraded", "True", "RemediationExhausted")
    rem = remediation(obj)
    assert rem["exhausted"] is True and rem["step"] == 2 and len(rem["history"]) == 2
    assert rem["lastFailureKey"] == f"{third['metadata']['uid']}/3"
    message = condition(obj, "Degraded")["message"]  # type: ignore[index]
    assert "spec.remediation.maxSteps=2" in message and "The next step would have been" in message
    warning = cluster.wait_events(NAME, "RemediationExhausted")
    assert [e["type"] for e in warning] == ["Warning"]
    final = cluster.deployment(NAME)
    assert final is not None and final["metadata"]["resourceVersion"] == deployment["metadata"]["resourceVersion"]

    # and it stays stopped: a further failure changes nothing
    fourth = cluster.crashed_pod(deployment, "qwen-step4", message=no_kv, restart_count=4)
    cluster.wait_remediation(NAME, lambda r: r.get("lastFailureKey") == f"{fourth['metadata']['uid']}/4")
    cluster.wait_quiet()
    still = cluster.deployment(NAME)
    assert still is not None and still["metadata"]["resourceVersion"] == deployment["metadata"]["resourceVersion"]
    assert len(history(cluster.service(NAME))) == 2
    assert len(cluster.events(NAME, "RemediatedNoKVCacheMemory")) == 2


# --- idempotent and restart-safe -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Restart:
    crash: Callable[[Cluster, dict[str, Any], dict[str, Any], str, int, int], dict[str, Any]]  # nth failure
    applied: Callable[[dict[str, Any], int], bool]   # the Deployment after n steps
    profile: dict[str, Any]                          # after both steps


def _kv_nth(c: Cluster, d: dict[str, Any], s: dict[str, Any], pod: str, restarts: int, n: int) -> dict[str, Any]:
    # with the smaller budget of step 1, vLLM's estimate is lower too
    length, estimate = ((32768, 20000), (19456, 15000))[n - 1]
    return c.crashed_pod(d, pod, message=crash_message(kv_error(s, length, estimate)), restart_count=restarts)


def _host_nth(c: Cluster, d: dict[str, Any], s: dict[str, Any], pod: str, restarts: int, n: int) -> dict[str, Any]:
    return c.crashed_pod(d, pod, reason="OOMKilled", exit_code=137, restart_count=restarts)


RESTARTS = {
    # the args change: the handled pod is of an older template after the step
    "KVCacheTooSmall": Restart(_kv_nth, lambda d, n: flag(args_of(d), "--max-model-len") == ("19456", "14336")[n - 1],
                               {"maxModelLen": 14336}),
    # only the memory limit changes: the handled pod stays a pod of the current template (same plan annotation),
    # so only its failure key, kept in the status, keeps it from being acted on again
    "HostOOMKilled": Restart(_host_nth, lambda d, n: memory_gib(d) == (39, 59)[n - 1], {"hostMemoryGib": 59.0}),
}


@pytest.mark.parametrize("flow", RESTARTS.values(), ids=list(RESTARTS))
def test_an_operator_restart_mid_ladder_neither_loses_nor_repeats_a_step(cluster: Cluster, flow: Restart) -> None:
    deployment, service = deploy(cluster, memory="128Gi")
    first = flow.crash(cluster, deployment, service, "qwen-a", 1, 1)
    cluster.wait_history(NAME, 1)
    stepped = cluster.wait_deployment(NAME, lambda d: flow.applied(d, 1))
    cluster.stop_operator()

    # while the operator is down: a pod of the new template fails too (a new failure key), and the handled pod
    # is still there, re-reported by its kubelet
    second = flow.crash(cluster, stepped, service, "qwen-b", 2, 2)
    cluster.touch_pod_status("qwen-a", 1)
    reads = cluster.remediation_reads()
    cluster.start_operator(process=True)  # a new process: nothing survives but what is in the API

    cluster.wait_history(NAME, 2)
    cluster.wait_looked(reads)
    cluster.wait_quiet()
    obj = cluster.service(NAME)
    keys = [f"{h['podUID']}/{h['restartCount']}" for h in history(obj)]
    assert keys == [f"{first['metadata']['uid']}/1", f"{second['metadata']['uid']}/2"]
    assert [h["step"] for h in history(obj)] == [1, 2] and remediation(obj)["step"] == 2
    assert remediation(obj)["profile"] == flow.profile  # the first step's lesson was not lost
    # record, then act: the resumed reconcile renders the recorded profile, so it never reverts a step
    cluster.wait_deployment(NAME, lambda d: flow.applied(d, 2), message="the Deployment runs step 2")


def test_a_restart_does_not_surface_a_handled_failure_again(cluster: Cluster) -> None:
    deployment, _ = deploy(cluster)
    cluster.crashed_pod(deployment, "qwen-nf", message=kubelet_termination_message(corpus_text("hf-repo-not-found")))
    cluster.wait_events(NAME, "PodFailedModelNotFound")
    cluster.stop_operator()
    reads = cluster.remediation_reads()
    cluster.start_operator(process=True)
    cluster.wait_looked(reads)  # it saw the pod again
    cluster.wait_quiet()
    assert len(cluster.events(NAME, "PodFailedModelNotFound")) == 1


def test_the_same_failure_redelivered_never_causes_two_steps(cluster: Cluster) -> None:
    deployment, service = deploy(cluster)
    kv = crash_message(kv_error(service, 32768, 20000))
    pod = cluster.crashed_pod(deployment, "qwen-a", message=kv)
    cluster.wait_history(NAME, 1)
    stepped = cluster.wait_deployment(NAME, changed_from(deployment))

    def redeliver(times: int) -> None:  # the kubelet re-reports the same dead run with unrelated changes
        for n in range(times):
            reads = cluster.remediation_reads()
            cluster.touch_pod_status("qwen-a", n)
            cluster.wait_looked(reads)
        cluster.wait_quiet()

    redeliver(4)
    assert len(history(cluster.service(NAME))) == 1
    same = cluster.deployment(NAME)
    assert same is not None and same["metadata"]["resourceVersion"] == stepped["metadata"]["resourceVersion"]

    # A change of the plan's inputs resets the ladder (workload.concurrency 1: the same plan as before): the
    # Deployment is back on the first plan, so the pod is of the current template again, and only the failure key
    # kept in the history stops it from being acted on twice.
    cluster.patch_spec(NAME, {"workload": {"concurrency": 1}})
    cluster.wait_remediation(NAME, lambda r: r.get("step") == 0 and not r.get("profile"))
    replanned = cluster.wait_deployment(NAME, lambda d: flag(args_of(d), "--max-model-len") == "auto")
    assert plan_annotation(replanned) == plan_annotation(pod)
    redeliver(4)
    obj = cluster.service(NAME)
    assert len(history(obj)) == 1 and remediation(obj)["step"] == 0

    # the next restart of that container is a new failure: exactly one more step
    cluster.crash_again("qwen-a", restart_count=2, message=kv)
    obj = cluster.wait_history(NAME, 2)
    assert history(obj)[-1]["podUID"] == pod["metadata"]["uid"] and history(obj)[-1]["restartCount"] == 2
    cluster.wait_events(NAME, "RemediatedKVCacheTooSmall", count=2)  # posted after the record: wait, then count
    cluster.wait_quiet()
    assert len(history(cluster.service(NAME))) == 2
    assert len(cluster.events(NAME, "RemediatedKVCacheTooSmall")) == 2


# --- pinned flags, spec changes ----------------------------------------------------------------------------------

def test_a_pinned_max_model_len_is_never_changed(cluster: Cluster) -> None:
    deployment, service = deploy(cluster, {"flags": {"maxModelLen": 32768}})
    assert flag(args_of(deployment), "--max-model-len") == "32768"
    kv = crash_message(kv_error(service, 32768, 20000))

    cluster.crashed_pod(deployment, "qwen-p1", message=kv, restart_count=1)
    obj = cluster.wait_history(NAME, 1)
    stepped = cluster.wait_deployment(NAME, changed_from(deployment))
    assert flag(args_of(stepped), "--max-model-len") == "32768"
    assert flag(args_of(stepped), "--gpu-memory-utilization") == "0.95"  # raised instead
    assert "maxModelLen" not in remediation(obj)["profile"]

    # again at the top of utilization: stop, naming the flag and the length that would fit
    cluster.crashed_pod(stepped, "qwen-p2", message=kv, restart_count=1)
    obj = cluster.wait_condition(NAME, "Degraded", "True", "RemediationExhausted")
    message = condition(obj, "Degraded")["message"]  # type: ignore[index]
    assert "spec.flags.maxModelLen" in message and "20000" in message
    assert remediation(obj)["exhausted"] is True and len(history(obj)) == 1
    cluster.wait_events(NAME, "RemediationExhausted")
    final = cluster.deployment(NAME)
    assert final is not None and flag(args_of(final), "--max-model-len") == "32768"
    assert final["metadata"]["resourceVersion"] == stepped["metadata"]["resourceVersion"]


def test_a_plan_input_change_resets_the_profile_but_keeps_the_history(cluster: Cluster) -> None:
    deployment, service = deploy(cluster)
    cluster.crashed_pod(deployment, "qwen-s1", message=crash_message(kv_error(service, 32768, 20000)))
    cluster.wait_history(NAME, 1)
    stepped = cluster.wait_deployment(NAME, changed_from(deployment))
    assert flag(args_of(stepped), "--max-model-len") == "19456"

    # an env var leaves the plan's inputs as they were: the learned max-model-len stays
    cluster.patch_spec(NAME, {"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]})
    with_env = cluster.wait_deployment(NAME, lambda d: any(e["name"] == "VLLM_LOGGING_LEVEL"
                                                           for e in vllm_container(d).get("env") or []))
    assert flag(args_of(with_env), "--max-model-len") == "19456"
    assert remediation(cluster.service(NAME))["step"] == 1

    cluster.patch_spec(NAME, {"workload": {"concurrency": 1}})
    obj = cluster.wait_remediation(NAME, lambda r: r.get("step") == 0 and not r.get("profile"),
                                   message="the ladder was reset")
    rem = remediation(obj)
    assert len(rem["history"]) == 1 and rem["history"][0]["failureClass"] == "KVCacheTooSmall"
    assert not rem.get("exhausted")
    replanned = cluster.wait_deployment(NAME, lambda d: flag(args_of(d), "--max-model-len") == "auto",
                                        message="re-planned without the learned constraint (the full context: auto)")
    env = {e["name"]: e.get("value") for e in vllm_container(replanned).get("env") or []}
    assert env.get("VLLM_LOGGING_LEVEL") == "DEBUG"


# --- not a memory failure: surface, change nothing --------------------------------------------------------------

def _model_not_found(c: Cluster, d: dict[str, Any]) -> tuple[str, Callable[[int], None]]:
    text = corpus_text("hf-repo-not-found")  # huggingface_hub's RepositoryNotFoundError for a mistyped id
    c.crashed_pod(d, "qwen-nf", message=kubelet_termination_message(text))

    def touch(n: int) -> None:
        c.touch_pod_status("qwen-nf", n)
    return "PodFailedModelNotFound", touch


def _image_pull(c: Cluster, d: dict[str, Any]) -> tuple[str, Callable[[int], None]]:
    c.image_pull_pod(d, "qwen-pull")
    image = vllm_container(d)["image"]

    def flip(n: int) -> None:  # the kubelet alternates ErrImagePull and ImagePullBackOff
        c.server.patch_status("pods", "qwen-pull",
                              Cluster.image_pull_status(image, "ErrImagePull" if n % 2 == 0 else "ImagePullBackOff"),
                              c.namespace)
    return "PodFailedImagePull", flip


@pytest.mark.parametrize(("fail", "summary"), [(_model_not_found, "not found or not accessible"),
                                               (_image_pull, "Cannot pull the container image")],
                         ids=["ModelNotFound", "ImagePullBackOff"])
def test_a_failure_no_flag_can_fix_is_surfaced_once_and_changes_nothing(
        cluster: Cluster, fail: Callable[[Cluster, dict[str, Any]], tuple[str, Callable[[int], None]]],
        summary: str) -> None:
    deployment, _ = deploy(cluster)
    reason, redeliver = fail(cluster, deployment)

    obj = cluster.wait_condition(NAME, "Degraded", "True")
    degraded = condition(obj, "Degraded")
    assert degraded is not None and summary in degraded["message"]
    assert degraded["reason"] not in ("Remediating", "RemediationExhausted")
    events = cluster.wait_events(NAME, reason)
    assert events[0]["type"] == "Warning" and summary in events[0]["message"]

    for n in range(3):
        reads = cluster.remediation_reads()
        redeliver(n)
        cluster.wait_looked(reads)
    cluster.wait_quiet()
    assert len(cluster.events(NAME, reason)) == 1
    assert not any(e["reason"].startswith("Remediat") for e in cluster.events(NAME))
    same = cluster.deployment(NAME)
    assert same is not None and same["metadata"]["resourceVersion"] == deployment["metadata"]["resourceVersion"]
    rem = remediation(cluster.service(NAME))
    assert rem.get("step", 0) == 0 and not rem.get("history") and not rem.get("profile")


# --- bugs found ------------------------------------------------------------------------------------------------------

def test_weights_on_a_one_gpu_node_stop_instead_of_taking_an_empty_step(cluster: Cluster) -> None:
    deployment, service = deploy(cluster, gpus=1)
    cluster.crashed_pod(deployment, "qwen-w1", message=crash_message(texts(service)["weights"](torch_oom(service)),
                                                                      loaded=False))
    obj = cluster.wait_remediation(NAME, lambda r: bool(r.get("lastFailureKey")))
    cluster.wait_quiet()
    obj = cluster.service(NAME)
    for entry in history(obj):
        assert entry["flagsAfter"] != entry["flagsBefore"], entry
    degraded = condition(obj, "Degraded")
    assert degraded is not None and degraded["reason"] == "RemediationExhausted"


def test_two_pods_with_the_same_surfaced_failure_post_one_event_each(cluster: Cluster) -> None:
    deployment, _ = deploy(cluster, {"replicas": 2})
    image = vllm_container(deployment)["image"]
    for pod in ("qwen-a", "qwen-b"):
        cluster.image_pull_pod(deployment, pod)
    cluster.wait_events(NAME, "PodFailedImagePull", count=2)
    for n in range(2):
        for pod in ("qwen-a", "qwen-b"):
            reads = cluster.remediation_reads()
            cluster.server.patch_status("pods", pod, Cluster.image_pull_status(
                image, "ErrImagePull" if n % 2 == 0 else "ImagePullBackOff"), cluster.namespace)
            cluster.wait_looked(reads)
    cluster.wait_quiet()
    assert len(cluster.events(NAME, "PodFailedImagePull")) == 2


def test_pods_that_ran_with_the_old_memory_limit_do_not_raise_it_again(cluster: Cluster) -> None:
    deployment, _ = deploy(cluster, {"replicas": 2}, memory="256Gi")
    cluster.crashed_pod(deployment, "qwen-a", reason="OOMKilled", exit_code=137)
    cluster.wait_history(NAME, 1)
    stepped = cluster.wait_deployment(NAME, changed_from(deployment))
    assert memory_gib(stepped) == 39
    cluster.wait_quiet()
    reads = cluster.remediation_reads()
    # the old pod (26 Gi) restarts and is OOM-killed again while the new one (39 Gi) is still starting
    cluster.crash_again("qwen-a", restart_count=2, reason="OOMKilled", exit_code=137)
    cluster.wait_looked(reads)
    cluster.wait_quiet()
    assert len(history(cluster.service(NAME))) == 1
    final = cluster.deployment(NAME)
    assert final is not None and memory_gib(final) == 39


def test_two_pods_failing_together_give_one_step_and_one_event(cluster: Cluster) -> None:
    deployment, service = deploy(cluster, {"replicas": 2})
    cluster.wait_quiet()
    # API latency on status writes, so that both handlers read the status before either write lands
    latency = 0.8
    cluster.api_state.slow[("PATCH", f"/vllmservices/{NAME}/status")] = latency
    kv = crash_message(kv_error(service, 32768, 20000))
    cluster.crashed_pod(deployment, "qwen-a", message=kv)
    cluster.crashed_pod(deployment, "qwen-b", message=kv)
    cluster.wait_history(NAME, 1)
    cluster.wait_quiet(latency + 0.3)  # a delayed write is logged only when it is served
    assert len(cluster.events(NAME, "RemediatedKVCacheTooSmall")) == 1


def test_a_reconcile_with_the_status_from_before_a_step_does_not_revert_it(cluster: Cluster) -> None:
    deployment, service = deploy(cluster)
    cluster.crashed_pod(deployment, "qwen-a", message=crash_message(kv_error(service, 32768, 20000)))
    cluster.wait_history(NAME, 1)
    stepped = cluster.wait_deployment(NAME, lambda d: flag(args_of(d), "--max-model-len") == "19456")
    cluster.stop_operator()
    # the handlers by hand, in the order kopf ran them after a restart: the resume handler got the VLLMService
    # from the initial listing (step 1), then the pod handler took step 2, then the resume handler applied
    kube.configure(str(cluster.kubeconfig))
    as_listed = cluster.service(NAME)
    cluster.crashed_pod(stepped, "qwen-b", message=crash_message(kv_error(service, 19456, 15000)), restart_count=2)
    remediate_service(cluster.namespace, NAME, logging.getLogger("test"))
    assert remediation(cluster.service(NAME))["profile"] == {"maxModelLen": 14336}
    meta = as_listed["metadata"]
    reconcile_service(NAME, cluster.namespace, meta["uid"], meta["generation"], as_listed["spec"],
                      as_listed["status"], logging.getLogger("test"))
    final = cluster.deployment(NAME)
    assert final is not None and flag(args_of(final), "--max-model-len") == "14336"
    assert cluster.service(NAME)["status"]["plan"]["flags"]["maxModelLen"] == 14336
