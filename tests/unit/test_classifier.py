"""The failure classifier against a corpus of real and source-derived vLLM failure texts, and pod evidence."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from vllm_operator.planner.failures import FailureKind
from vllm_operator.remediation.classifier import (
    MEMORY_FAILURES,
    SEE_LOGS,
    Failure,
    classify,
    classify_text,
)
from vllm_operator.remediation.evidence import ContainerEvidence, evidence_from_pod

CORPUS: dict[str, Any] = yaml.safe_load((Path(__file__).parent / "data" / "vllm_failure_texts.yaml").read_text())
TEXTS: list[dict[str, Any]] = CORPUS["texts"]
NEAR_MISSES: list[dict[str, Any]] = CORPUS["near_misses"]


def _classify_entry(entry: dict[str, Any], text: str | None = None) -> Failure:
    return classify_text(
        entry["text"] if text is None else text,
        terminated_reason=entry.get("terminated_reason"),
        exit_code=entry.get("exit_code"),
        was_ready_before=entry.get("was_ready_before"),
    )


#: The whole summary of an unrecognised failure: fixed words, the exit code, the kubelet's reason, the exception name.
UNRECOGNISED = re.compile(r"Container failed( \(exit code \d+( \(SIG\w+\))?(, reason \w+)?\))? (with an error the "
                          r"operator does not recognise( \([\w.]+\))?|without a recognizable error); "
                          + re.escape(SEE_LOGS))


def _check(failure: Failure, expect: dict[str, Any]) -> None:
    assert failure.kind == FailureKind(expect["kind"]), failure
    for key, want in expect.items():
        if key == "kind":
            continue
        if key == "summary_contains":
            if failure.kind is FailureKind.UNKNOWN and SEE_LOGS in failure.summary:
                # an unrecognised failure names its exception and exit code, never its text (issue 20)
                assert UNRECOGNISED.fullmatch(failure.summary) and not failure.excerpt, failure
            else:
                assert want in failure.summary, failure.summary
            continue
        got = getattr(failure, key)
        if isinstance(want, float):
            assert got == pytest.approx(want, abs=0.01), (key, got, failure)
        else:
            assert got == want, (key, got, failure)
    assert failure.summary and "\n" not in failure.summary
    assert len(failure.excerpt) <= 500


def test_corpus_is_big_enough_and_sourced() -> None:
    assert len(TEXTS) >= 30 and len(NEAR_MISSES) >= 10
    ids = [e["id"] for e in TEXTS + NEAR_MISSES]
    assert len(ids) == len(set(ids))
    for entry in TEXTS:
        assert entry.get("source") and entry.get("vllm"), entry["id"]
    for entry in NEAR_MISSES:
        assert entry.get("why") and entry.get("must_not"), entry["id"]
    # every class is represented (ImagePull needs the kubelet's reason, tested below)
    covered = {FailureKind(e["expect"]["kind"]) for e in TEXTS}
    assert covered >= set(FailureKind) - {FailureKind.IMAGE_PULL}
    # every KV-cache wording era is represented
    kv_wordings = {e["expect"].get("wording") for e in TEXTS if e["expect"]["kind"] == "KVCacheTooSmall"}
    assert kv_wordings >= {"v0", "v1-gb", "v1-no-estimate", "v1-broken-estimate", "v1-models's", "v1"}


@pytest.mark.parametrize("entry", TEXTS, ids=[e["id"] for e in TEXTS])
def test_corpus_text(entry: dict[str, Any]) -> None:
    _check(_classify_entry(entry), entry["expect"])


@pytest.mark.parametrize("entry", NEAR_MISSES, ids=[e["id"] for e in NEAR_MISSES])
def test_near_miss(entry: dict[str, Any]) -> None:
    failure = _classify_entry(entry)
    assert failure.kind.value not in entry["must_not"], failure
    _check(failure, entry["expect"])


def _decorate(text: str) -> str:
    """The same log as `kubectl logs --timestamps` shows it, with vLLM's colour codes left in."""
    out = []
    for i, line in enumerate(text.splitlines()):
        colored = line.replace("ERROR ", "\x1b[31mERROR\x1b[0m ", 1) if i % 2 else line
        out.append(f"2025-05-20T09:14:{i % 60:02d}.123456789Z {colored}")
    return "\n".join(out)


@pytest.mark.parametrize("entry", TEXTS + NEAR_MISSES, ids=[e["id"] for e in TEXTS + NEAR_MISSES])
def test_corpus_with_timestamps_and_colours(entry: dict[str, Any]) -> None:
    plain = _classify_entry(entry)
    decorated = _classify_entry(entry, _decorate(entry["text"]))
    assert decorated.model_dump(exclude={"summary", "excerpt"}) == plain.model_dump(exclude={"summary", "excerpt"})


def test_last_occurrence_wins() -> None:
    text = (
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.\n"
        "ValueError: Free memory on device cuda:0 (10.0/79.19 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 71.28 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.\n"
    )
    failure = classify_text(text)
    assert failure.kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY
    assert failure.free_gib == 10.0


def test_summaries_are_informative() -> None:
    kv = classify_text(TEXTS[0]["text"])
    assert "131072" in kv.summary and "27264" in kv.summary and "3.33" in kv.summary
    assert kv.excerpt.startswith("ValueError: To serve at least one request")
    free = next(e for e in TEXTS if e["id"] == "free-device-real-codellama-tp2")
    assert "cuda:1" in _classify_entry(free).summary


def test_excerpt_is_clipped_and_summary_one_line() -> None:
    long = "ValueError: No available memory for the cache blocks. " + "x" * 2000
    failure = classify_text(long)
    assert failure.kind is FailureKind.NO_KV_CACHE_MEMORY
    assert len(failure.excerpt) == 500 and failure.excerpt.endswith("…")
    unknown = classify_text("RuntimeError: boom\n" + "y" * 3000 + "\n", exit_code=1)
    assert "\n" not in unknown.summary and len(unknown.summary) <= 400


def test_empty_text_is_unknown() -> None:
    failure = classify_text("", exit_code=1, terminated_reason="Error")
    assert failure.kind is FailureKind.UNKNOWN
    assert "exit code 1" in failure.summary


def test_unknown_prefers_the_last_real_exception_over_wrappers() -> None:
    text = (
        "Traceback (most recent call last):\n"
        "ImportError: libcuda.so.1: cannot open shared object file: No such file or directory\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )
    failure = classify_text(text, exit_code=1)
    assert failure.kind is FailureKind.UNKNOWN
    assert "(ImportError)" in failure.summary and "libcuda" not in failure.summary, failure.summary


def test_memory_related() -> None:
    assert classify_text(TEXTS[0]["text"]).memory_related
    assert not classify_text("vllm serve: error: unrecognized arguments: --foo").memory_related
    assert FailureKind.INVALID_PARALLELISM not in MEMORY_FAILURES
    assert FailureKind.HOST_OOM_KILLED in MEMORY_FAILURES


def test_failure_is_frozen_and_bounded() -> None:
    failure = classify_text("", exit_code=1)
    with pytest.raises(ValidationError):
        failure.kind = FailureKind.KV_CACHE_TOO_SMALL  # type: ignore[misc]
    with pytest.raises(ValidationError):
        Failure(kind=FailureKind.UNKNOWN, summary="x", excerpt="y" * 501)


def test_the_classifier_and_the_planner_share_one_failure_vocabulary() -> None:
    """What the planner predicts and what the classifier reads back are members of the same enum."""
    field_type = Failure.model_fields["kind"].annotation
    assert field_type is FailureKind
    from vllm_operator.planner import messages
    from vllm_operator.planner.versions import profile_for

    read_back = classify_text(messages.no_kv_memory_message(profile_for("0.26.0"))).kind
    assert type(read_back) is FailureKind and read_back is FailureKind.NO_KV_CACHE_MEMORY


@pytest.mark.parametrize("version", ["0.6.3", "0.7.3", "0.8.5", "0.9.2", "0.11.0", "0.13.0", "0.21.0", "0.33.0"])
def test_reads_back_what_the_planner_renders(version: str) -> None:
    """planner.messages renders vLLM's texts per release; whatever it renders, the classifier must read back."""
    from vllm_operator.planner import messages  # a rename must fail here, not skip
    from vllm_operator.planner.versions import profile_for

    p = profile_for(version)
    kv = classify_text(
        messages.kv_too_small_message(
            p, max_model_len=131072, needed_gib=16.0, available_gib=3.33, estimated_max_len=27264, kv_tokens=27264
        )
    )
    assert kv.kind is FailureKind.KV_CACHE_TOO_SMALL and kv.max_model_len == 131072
    assert classify_text(messages.no_kv_memory_message(p)).kind is FailureKind.NO_KV_CACHE_MEMORY
    free = classify_text(
        messages.free_memory_message(p, device=1, free_gib=60.87, total_gib=79.19, util=0.95, requested_gib=75.23)
    )
    assert free.kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY and free.requested_gib == 75.23
    oom = messages.cuda_oom_message(
        device=0, tried_mib=786.0, total_gib=79.19, free_mib=552.5, in_use_gib=78.64, torch_gib=74.91
    )
    weights = classify_text(messages.weights_oom_message(p, oom))
    expected = FailureKind.WEIGHTS_DO_NOT_FIT if p.version_tuple >= (0, 13, 0) else FailureKind.CUDA_OOM_STARTUP
    assert weights.kind is expected and weights.tried_to_allocate_mib == 786.0
    assert classify_text(messages.heads_divisibility_message(40, 3)).kind is FailureKind.INVALID_PARALLELISM
    shard = classify_text(messages.shard_divisibility_message(151936, 5))
    assert shard.kind is FailureKind.INVALID_PARALLELISM and shard.divisor == 5
    too_long = classify_text(messages.max_len_too_long_message(8192, 2048))
    assert too_long.kind is FailureKind.MAX_MODEL_LEN_TOO_LONG and too_long.derived_max_model_len == 2048


# --------------------------------------------------------------------------------------------------------------
# Pod evidence

KV_MESSAGE = next(e for e in TEXTS if e["id"] == "kv-v1-typo-0.11")["text"]


def _pod(
    statuses: list[dict[str, Any]],
    *,
    conditions: list[dict[str, Any]] | None = None,
    phase: str = "Running",
    init: list[dict[str, Any]] | None = None,
    **status_extra: Any,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "containerStatuses": statuses, **status_extra}
    if conditions is not None:
        status["conditions"] = conditions
    if init is not None:
        status["initContainerStatuses"] = init
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "llama-0-7c9d", "namespace": "ml", "uid": "0b6e3c1e-8f0a-4c55-9d1e-2a7f7c3e5b10"},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}]},
        "status": status,
    }


def _not_ready_since(ts: str) -> list[dict[str, Any]]:
    return [
        {"type": "Initialized", "status": "True", "lastTransitionTime": "2025-06-01T11:59:50Z"},
        {"type": "Ready", "status": "False", "lastTransitionTime": ts, "reason": "ContainersNotReady"},
        {"type": "ContainersReady", "status": "False", "lastTransitionTime": ts, "reason": "ContainersNotReady"},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2025-06-01T11:59:49Z"},
    ]


def _crashloop_status(terminated: dict[str, Any], restarts: int = 3) -> dict[str, Any]:
    return {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.11.0",
        "imageID": "docker.io/vllm/vllm-openai@sha256:0123",
        "containerID": "containerd://abc",
        "ready": False,
        "started": False,
        "restartCount": restarts,
        "state": {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": "back-off 40s restarting failed container=vllm pod=llama-0-7c9d_ml(0b6e3c1e)",
            }
        },
        "lastState": {"terminated": terminated},
    }


def test_crashloop_with_kv_error() -> None:
    terminated = {
        "exitCode": 1,
        "reason": "Error",
        "message": KV_MESSAGE,
        "startedAt": "2025-06-01T12:01:00Z",
        "finishedAt": "2025-06-01T12:02:10Z",
        "containerID": "containerd://abc",
    }
    pod = _pod([_crashloop_status(terminated)], conditions=_not_ready_since("2025-06-01T11:59:50Z"))
    [ev] = evidence_from_pod(pod)
    assert ev.pod_name == "llama-0-7c9d" and ev.pod_uid.startswith("0b6e3c1e") and ev.namespace == "ml"
    assert ev.container_name == "vllm" and ev.image == "vllm/vllm-openai:v0.11.0"
    assert ev.restart_count == 3 and ev.ready is False
    assert ev.waiting_reason == "CrashLoopBackOff" and ev.terminated_reason == "Error" and ev.exit_code == 1
    assert ev.started_at is not None and ev.finished_at is not None and ev.started_at.tzinfo is not None
    assert ev.was_ready_before is False  # never Ready since before the run started
    failure = classify(ev)
    assert failure is not None and failure.kind is FailureKind.KV_CACHE_TOO_SMALL
    assert failure.estimated_max_model_len == 101088 and failure.exit_code == 1


def test_oom_killed() -> None:
    terminated = {
        "exitCode": 137,
        "reason": "OOMKilled",
        "startedAt": "2025-06-01T12:01:00Z",
        "finishedAt": "2025-06-01T12:01:40Z",
    }
    [ev] = evidence_from_pod(_pod([_crashloop_status(terminated, restarts=1)]))
    assert ev.terminated_reason == "OOMKilled" and ev.termination_message == ""
    failure = classify(ev)
    assert failure is not None and failure.kind is FailureKind.HOST_OOM_KILLED and failure.memory_related


def test_running_and_ready_is_healthy() -> None:
    status = {
        "name": "vllm",
        "ready": True,
        "started": True,
        "restartCount": 0,
        "state": {"running": {"startedAt": "2025-06-01T12:00:00Z"}},
        "lastState": {},
    }
    [ev] = evidence_from_pod(_pod([status]))
    assert ev.ready and ev.exit_code is None
    assert classify(ev) is None


def test_ready_after_an_earlier_crash_is_healthy() -> None:
    status = {
        "name": "vllm",
        "ready": True,
        "restartCount": 1,
        "state": {"running": {"startedAt": "2025-06-01T12:05:00Z"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": KV_MESSAGE}},
    }
    [ev] = evidence_from_pod(_pod([status]))
    assert ev.exit_code == 1 and classify(ev) is None


def test_pending_pod() -> None:
    unscheduled = _pod([], phase="Pending")
    del unscheduled["status"]["containerStatuses"]
    assert evidence_from_pod(unscheduled) == []
    creating = {
        "name": "vllm",
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": "ContainerCreating"}},
        "lastState": {},
    }
    [ev] = evidence_from_pod(_pod([creating], phase="Pending"))
    assert ev.waiting_reason == "ContainerCreating" and ev.pod_phase == "Pending"
    assert classify(ev) is None


def test_starting_container_without_a_previous_run() -> None:
    status = {"name": "vllm", "ready": False, "restartCount": 0, "state": {"running": {"startedAt": "x"}}}
    [ev] = evidence_from_pod(_pod([status]))
    assert classify(ev) is None


def test_image_pull_backoff() -> None:
    status = {
        "name": "vllm",
        "ready": False,
        "restartCount": 0,
        "image": "vllm/vllm-openai:v0.99.0",
        "state": {
            "waiting": {
                "reason": "ImagePullBackOff",
                "message": 'Back-off pulling image "vllm/vllm-openai:v0.99.0"',
            }
        },
    }
    [ev] = evidence_from_pod(_pod([status], phase="Pending"))
    failure = classify(ev)
    assert failure is not None and failure.kind is FailureKind.IMAGE_PULL and not failure.memory_related
    assert "v0.99.0" in failure.summary


def test_create_container_config_error() -> None:
    status = {
        "name": "vllm",
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}},
    }
    [ev] = evidence_from_pod(_pod([status], phase="Pending"))
    failure = classify(ev)
    assert failure is not None and failure.kind is FailureKind.UNKNOWN
    assert failure.summary == 'CreateContainerConfigError: secret "hf-token" not found'


def test_was_ready_before_inferred_from_the_ready_condition() -> None:
    """Ready went False after the dead run started: that run had been Ready, so its OOM was while serving."""
    terminated = {
        "exitCode": 1,
        "reason": "Error",
        "message": (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. GPU 0 has a total capacity "
            "of 22.05 GiB of which 512.00 MiB is free."
        ),
        "startedAt": "2025-06-01T12:01:00Z",
        "finishedAt": "2025-06-01T14:30:00Z",
    }
    pod = _pod([_crashloop_status(terminated, restarts=1)], conditions=_not_ready_since("2025-06-01T14:30:01Z"))
    [ev] = evidence_from_pod(pod)
    assert ev.was_ready_before is True
    failure = classify(ev)
    assert failure is not None and failure.kind is FailureKind.CUDA_OOM_SERVING
    # never Ready in that run -> startup OOM; the caller may also override the inference
    [ev2] = evidence_from_pod(pod, was_ready_before=False)
    failure2 = classify(ev2)
    assert failure2 is not None and failure2.kind is FailureKind.CUDA_OOM_STARTUP


def test_termination_message_falls_back_to_the_log_tail() -> None:
    terminated = {
        "exitCode": 1,
        "reason": "Error",
        "message": "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    }
    [ev] = evidence_from_pod(_pod([_crashloop_status(terminated)]), log_tail=KV_MESSAGE)
    assert ev.log_tail == KV_MESSAGE
    failure = classify(ev)
    assert failure is not None and failure.kind is FailureKind.KV_CACHE_TOO_SMALL
    # without a log tail the wrapper is all there is
    bare = classify(ev.model_copy(update={"log_tail": None}))
    assert bare is not None and bare.kind is FailureKind.UNKNOWN and "(RuntimeError)" in bare.summary
    assert "Engine core" not in bare.summary + bare.excerpt


def test_evicted_for_memory() -> None:
    pod = _pod(
        [{"name": "vllm", "ready": False, "restartCount": 0, "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}],
        phase="Failed",
        reason="Evicted",
        message="The node was low on resource: memory. Threshold quantity: 100Mi, available: 60Mi. Container vllm "
        "was using 61Gi, request is 32Gi, has larger consumption of memory.",
    )
    [ev] = evidence_from_pod(pod)
    failure = classify(ev)
    assert failure is not None and failure.kind is FailureKind.HOST_OOM_KILLED
    assert "low on resource: memory" in failure.summary


def test_clean_exit_is_not_a_failure() -> None:
    status = {
        "name": "vllm",
        "ready": False,
        "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
    }
    [ev] = evidence_from_pod(_pod([status], phase="Succeeded"))
    assert classify(ev) is None


def test_all_containers_and_init_containers() -> None:
    init = [
        {
            "name": "fetch-weights",
            "ready": False,
            "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "OSError: [Errno 28] No space"}},
        }
    ]
    sidecar = {"name": "proxy", "ready": True, "restartCount": 0, "state": {"running": {}}}
    main = {"name": "vllm", "ready": False, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}
    pod = _pod([main, sidecar], phase="Pending", init=init)
    everything = evidence_from_pod(pod, container=None)
    assert [(e.container_name, e.init_container) for e in everything] == [
        ("vllm", False),
        ("proxy", False),
        ("fetch-weights", True),
    ]
    [fetch] = evidence_from_pod(pod, container="fetch-weights")
    failure = classify(fetch)
    assert failure is not None and failure.kind is FailureKind.UNKNOWN and "(OSError)" in failure.summary
    assert "No space" not in failure.summary + failure.excerpt
    assert evidence_from_pod(pod, container="missing") == []


def test_tolerates_missing_and_odd_fields() -> None:
    assert evidence_from_pod({}) == []
    assert evidence_from_pod({"status": None}) == []
    odd = {
        "metadata": None,
        "status": {
            "containerStatuses": [
                {
                    "name": "vllm",
                    "restartCount": "2",
                    "ready": "yes",
                    "state": None,
                    "lastState": {"terminated": {"exitCode": None, "startedAt": "not-a-time", "message": None}},
                }
            ]
        },
    }
    [ev] = evidence_from_pod(odd)
    assert ev.pod_name == "" and ev.restart_count == 2 and ev.ready is False
    assert ev.exit_code is None and ev.started_at is None and ev.termination_message == ""
    assert ev.was_ready_before is None
    assert classify(ev) is None


def test_evidence_is_frozen() -> None:
    ev = ContainerEvidence(pod_name="p")
    with pytest.raises(ValidationError):
        ev.pod_name = "q"  # type: ignore[misc]


# --- LoRA on a model class without SupportsLoRA (issue 14; releases and files in catalog/lora_support.yaml) --------

_LORA_0_33 = """\
(APIServer pid=1) INFO 11-26 06:00:00 [api_server.py:1839] vLLM API server version 0.33.0
(APIServer pid=1) Traceback (most recent call last):
(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/engine/arg_utils.py", line 1790, in create_engine_config
(APIServer pid=1)     config = VllmConfig(
(APIServer pid=1)              ^^^^^^^^^^^
(APIServer pid=1) pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig
(APIServer pid=1)   Value error, LoRA is not supported for MambaForCausalLM (state-spaces/mamba-2.8b-hf). Supported models implement the `SupportsLoRA` interface. Run this model without `enable_lora`. [type=value_error, input_value=ArgsKwargs((), {'model_config': ...}), input_type=ArgsKwargs]
(APIServer pid=1)     For further information visit https://errors.pydantic.dev/2.12/v/value_error
"""
_LORA_0_10 = """\
(EngineCore_0 pid=281) INFO 09-20 10:00:00 [default_loader.py:267] Loading weights took 6.12 seconds
(EngineCore_0 pid=281) ERROR 09-20 10:00:01 [core.py:700] EngineCore failed to start.
(EngineCore_0 pid=281) ERROR 09-20 10:00:01 [core.py:700] Traceback (most recent call last):
(EngineCore_0 pid=281) ERROR 09-20 10:00:01 [core.py:700]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/lora_model_runner_mixin.py", line 41, in load_lora_model
(EngineCore_0 pid=281) ERROR 09-20 10:00:01 [core.py:700] ValueError: GptOssForCausalLM does not support LoRA yet.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
_LORA_0_7 = """\
INFO 02-20 10:00:00 model_runner.py:1110] Starting to load model Qwen/Qwen1.5-MoE-A2.7B...
[rank0]: AssertionError: Qwen2MoeForCausalLM does not support LoRA yet.
"""
_LORA_0_5 = ("ValueError: Model Qwen2MoeForCausalLM does not support LoRA, but LoRA is enabled. Support for this "
             "model may be added in the future. If this is important to you, please open an issue on github.\n")


@pytest.mark.parametrize(("text", "architecture"), [
    (_LORA_0_33, "MambaForCausalLM"),
    (_LORA_0_10, "GptOssForCausalLM"),
    (_LORA_0_7, "Qwen2MoeForCausalLM"),
    (_LORA_0_5, "Qwen2MoeForCausalLM"),
])
def test_lora_not_supported_is_an_invalid_argument(text: str, architecture: str) -> None:
    failure = classify_text(text, exit_code=1)
    assert failure.kind is FailureKind.INVALID_ARGUMENT
    assert failure.wording == "lora-unsupported"
    assert failure.architecture == architecture
    assert failure.summary.startswith(f"LoRA is not supported for {architecture} by this vLLM release")


@pytest.mark.parametrize("text", [
    "AssertionError: V1 does not support LoRA yet.\n",  # 0.7.0's V1 scheduler: the engine, not the model
    "NotImplementedError: MRV2 PCP does not support LoRA yet.\n",
    "WARNING 11-26 06:00:00 [lora.py:12] LoRA is not supported for MambaForCausalLM (m). Supported models implement "
    "the `SupportsLoRA` interface.\n",  # a warning quoting it is context, never the failure
    "ValueError: the docs say LoRA is not supported for MambaForCausalLM (m). Supported models implement the "
    "`SupportsLoRA` interface.\n",  # not at the start of the message
])
def test_lora_near_misses_are_not_lora_unsupported(text: str) -> None:
    failure = classify_text(text, exit_code=1)
    assert failure.wording != "lora-unsupported"


def test_a_lora_rank_the_release_refuses_is_an_invalid_argument() -> None:
    # vllm 0.8.1 config.py LoRAConfig.__post_init__ (possible_max_ranks), raised in the API server
    failure = classify_text("ValueError: max_lora_rank (1) must be one of (8, 16, 32, 64, 128, 256, 320, 512).\n",
                            exit_code=1)
    assert failure.kind is FailureKind.INVALID_ARGUMENT and failure.wording == "value"
    near = classify_text("ValueError: the adapter's max_lora_rank (1) must be one of the served ranks\n", exit_code=1)
    assert near.kind is FailureKind.UNKNOWN


@pytest.mark.parametrize("text", [
    # LogitsProcessorWithLoRA.create_lora_weights: lora/layers.py in 0.5.5-0.9.x, lora/layers/logits_processor.py
    # after; the words of 0.5.0-0.16.0 and of 0.17.0+ (catalog/lora_support.yaml vocab_limits)
    "ValueError: When using LoRA, vocab size must be 32000 >= vocab_size <= 257024\n",
    "(EngineCore_0 pid=281) ERROR 11-26 06:00:01 [core.py:700] ValueError: When using LoRA, vocab size must be "
    "<= 258048\n",
])
def test_an_lm_head_above_the_lora_vocabulary_limit_is_an_invalid_argument(text: str) -> None:
    failure = classify_text(text, exit_code=1)
    assert failure.kind is FailureKind.INVALID_ARGUMENT and failure.wording == "lora-vocab"
    assert failure.summary.startswith("LoRA on this model's LM head is refused by this vLLM release (When using "
                                      "LoRA, vocab size must be")


@pytest.mark.parametrize(("terminated", "said"), [
    ({"exitCode": 137, "reason": "OOMKilled"}, "Killed by the kernel OOM killer"),
    ({"exitCode": 1, "reason": "Error", "message": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                                   "2.00 GiB. GPU 0 has a total capacity of 22.05 GiB"}, "CUDA"),
    ({"exitCode": 1, "reason": "Error", "message": "huggingface_hub.errors.GatedRepoError: 401 Client Error.\n"
                                                   "Access to model org/m is restricted (hf_abcdefghijklmnopqrstuvwx)."},
     "restricted"),
], ids=["oom-killed", "cuda-oom-text", "gated"])
def test_a_model_download_failure_is_never_a_memory_failure(terminated: dict[str, Any], said: str) -> None:
    """The model-download init container's failure is described, never as a class a memory step answers."""
    init = [{"name": "model-download", "ready": False, "restartCount": 1,
             "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": terminated}}]
    main = {"name": "vllm", "ready": False, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}
    pod = _pod([main], phase="Pending", init=init)
    [download] = evidence_from_pod(pod, container="model-download")
    failure = classify(download)
    assert failure is not None and failure.kind not in MEMORY_FAILURES and said in failure.summary
    assert "hf_abcdefghijklmnopqrstuvwx" not in failure.model_dump_json()
    if terminated["exitCode"] == 137:
        assert failure.kind is FailureKind.UNKNOWN and failure.summary.startswith("init container model-download")
    # the vllm container waiting for it shows nothing to answer: the ladder reads only that one
    [vllm] = evidence_from_pod(pod)
    assert classify(vllm) is None
