"""The cold-start budget (render/coldstart.py): phases read from a pod's status and vLLM's own log lines, folded
into status.coldStart, and the engine budget the startup probe takes from it; compile caches on the claim."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_operator.render import coldstart
from vllm_operator.render.cache import DOWNLOAD_CONTAINER, ENGINE_START_SECONDS, startup_failure_threshold
from vllm_operator.render.manifests import OwnerRef, RenderInput, build_deployment

#: vLLM 0.32's lines as it prints them (file:line prefixes as in real logs).
LOG = """\
INFO 11-27 10:00:01 [weight_utils.py:538] Time spent downloading weights for Qwen/Qwen3-8B: 84.120000 seconds
INFO 11-27 10:00:30 [gpu_model_runner.py:2602] Model loading took 15.2683 GiB memory and 21.034512 seconds
INFO 11-27 10:00:58 [monitor.py:34] torch.compile takes 25.41 s in total
INFO 11-27 10:01:20 [gpu_model_runner.py:3480] Graph capturing finished in 12 secs, took 0.52 GiB
INFO 11-27 10:01:21 [core.py:210] init engine (profile, create kv cache, warmup model) took 61.90 seconds
"""


def _pod(*, ready: bool = True, restarts: int = 0, init: bool = True) -> dict[str, Any]:
    inits = [{"name": DOWNLOAD_CONTAINER, "state": {"terminated": {
        "exitCode": 0, "startedAt": "2026-11-27T10:00:20Z", "finishedAt": "2026-11-27T10:01:50Z"}}}] if init else []
    return {"metadata": {"name": "chat-abc"},
            "status": {"conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-27T10:00:00Z"},
                {"type": "Ready", "status": "True" if ready else "False",
                 "lastTransitionTime": "2026-11-27T10:03:40Z"}],
                "initContainerStatuses": inits,
                "containerStatuses": [{"name": "vllm", "ready": ready, "restartCount": restarts,
                                       "state": {"running": {"startedAt": "2026-11-27T10:01:51Z"}}}]}}


def test_phases_come_from_vllms_own_lines() -> None:
    assert coldstart.phases_from_log(LOG) == {"downloadSeconds": 84.12, "loadSeconds": 21.035,
                                              "compileSeconds": 25.41, "graphCaptureSeconds": 12.0,
                                              "engineInitSeconds": 61.9}
    for older in ("Model loading took 7.2 GB and 9.5 seconds",  # V0 (0.6) wording
                  "Model loading took 7.2 GiB and 9.5 seconds"):  # V1 before 'memory' was added
        assert coldstart.phases_from_log(older) == {"loadSeconds": 9.5}
    assert coldstart.phases_from_log("Loading model weights took 7.2 GB") == {}


@pytest.mark.parametrize("line", [
    "torch.compile takes 1e999 s in total",
    "torch.compile takes 99999999999 s in total",
    "Graph capturing finished in -3 secs",
    "init engine (profile, create kv cache, warmup model) took nan seconds",
])
def test_hostile_figures_are_not_phases(line: str) -> None:
    assert coldstart.phases_from_log(line) == {}


def test_a_ready_pod_gives_every_phase() -> None:
    measured = coldstart.cold_start_from_pod(_pod(), LOG, download_container=DOWNLOAD_CONTAINER)
    assert measured == {"podStartSeconds": 20.0, "downloadSeconds": 90.0, "loadSeconds": 21.035,
                        "compileSeconds": 25.41, "graphCaptureSeconds": 12.0, "engineInitSeconds": 61.9,
                        "readySeconds": 220.0, "measuredPod": "chat-abc", "measuredAt": "2026-11-27T10:03:40Z"}
    # without the init container, vLLM's own download line is the download
    alone = coldstart.cold_start_from_pod(_pod(init=False), LOG, download_container=DOWNLOAD_CONTAINER)
    assert alone is not None and alone["downloadSeconds"] == 84.12 and alone["podStartSeconds"] == 111.0


def test_not_ready_or_restarted_pods_measure_nothing() -> None:
    assert coldstart.cold_start_from_pod(_pod(ready=False), LOG, download_container=DOWNLOAD_CONTAINER) is None
    assert coldstart.cold_start_from_pod(_pod(restarts=2), LOG, download_container=DOWNLOAD_CONTAINER) is None
    assert coldstart.cold_start_from_pod({}, LOG, download_container=DOWNLOAD_CONTAINER) is None
    garbled = _pod()
    garbled["status"]["conditions"][0]["lastTransitionTime"] = "not a time"
    measured = coldstart.cold_start_from_pod(garbled, "", download_container=DOWNLOAD_CONTAINER)
    assert measured is not None and "readySeconds" not in measured and measured["downloadSeconds"] == 90.0


def test_folding_keeps_the_slowest_engine_start_and_counts_starts() -> None:
    first = coldstart.fold_cold_start(None, {"engineInitSeconds": 61.9, "measuredPod": "a"},
                                      compile_cache="persistent")
    assert first == {"engineInitSeconds": 61.9, "measuredPod": "a", "compileCache": "persistent", "starts": 1,
                     "slowestEngineInitSeconds": 61.9}
    assert coldstart.fold_cold_start(first, {"engineInitSeconds": 70.0, "measuredPod": "a"},
                                     compile_cache="persistent") is None  # that pod is recorded
    warm = coldstart.fold_cold_start(first, {"engineInitSeconds": 20.0, "measuredPod": "b"},
                                     compile_cache="persistent")
    assert warm is not None and warm["starts"] == 2 and warm["slowestEngineInitSeconds"] == 61.9
    assert coldstart.fold_cold_start(first, None, compile_cache="ephemeral") is None


def test_the_engine_budget_follows_the_slowest_measured_start() -> None:
    assert coldstart.engine_seconds_budget(None, ENGINE_START_SECONDS) == ENGINE_START_SECONDS
    assert coldstart.engine_seconds_budget({"slowestEngineInitSeconds": 100.0}, 600.0) == 200.0
    assert coldstart.engine_seconds_budget({"slowestEngineInitSeconds": 10.0}, 600.0) == coldstart.MIN_ENGINE_SECONDS
    assert coldstart.engine_seconds_budget({"slowestEngineInitSeconds": 900.0}, 600.0) == 600.0
    assert coldstart.engine_seconds_budget({"slowestEngineInitSeconds": True}, 600.0) == 600.0
    fewer = startup_failure_threshold(15.0, download_mib_per_s=100, download=False, engine_seconds=200.0)
    assert fewer < startup_failure_threshold(15.0, download_mib_per_s=100, download=False)


def _deployment(**changes: Any) -> dict[str, Any]:
    inp = RenderInput(name="chat", namespace="ns", owner=OwnerRef(name="chat", uid="u"), model="Qwen/Qwen3-8B",
                      image="vllm/vllm-openai:v0.32.0", vllm_version="0.32.0", flags={}, gpu_count=1,
                      gpu_product_label="NVIDIA-L40S", **changes)
    return build_deployment(inp)


def _env(deploy: dict[str, Any]) -> dict[str, str]:
    [container] = deploy["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_compile_caches_live_on_the_claim_per_release_and_gpu() -> None:
    claim = {"persistentVolumeClaim": {"claimName": "chat-model-cache"}}
    deploy = _deployment(cache_volume=claim, compile_cache=True)
    env = _env(deploy)
    root = "/root/.cache/huggingface/vllm-compile/0.32.0/NVIDIA-L40S"
    assert env["VLLM_CACHE_ROOT"] == root
    assert env["TORCHINDUCTOR_CACHE_DIR"] == f"{root}/torchinductor" and env["TRITON_CACHE_DIR"] == f"{root}/triton"
    assert coldstart.compile_cache_kind(deploy["spec"]["template"]) == "persistent"
    # the restricted profile's home paths are replaced, not doubled
    restricted = _deployment(cache_volume=claim, compile_cache=True, security_profile="restricted")
    [container] = restricted["spec"]["template"]["spec"]["containers"]
    names = [e["name"] for e in container["env"]]
    assert names.count("VLLM_CACHE_ROOT") == 1 and "/vllm-compile/0.32.0/" in _env(restricted)["VLLM_CACHE_ROOT"]
    assert coldstart.compile_cache_kind(restricted["spec"]["template"]) == "persistent"
    ephemeral = _deployment()
    assert "VLLM_CACHE_ROOT" not in _env(ephemeral)
    assert coldstart.compile_cache_kind(ephemeral["spec"]["template"]) == "ephemeral"


def test_a_change_of_release_or_gpu_gets_its_own_compile_cache() -> None:
    a = coldstart.compile_cache_root("/c", "0.32.0", "NVIDIA-L40S")
    assert a != coldstart.compile_cache_root("/c", "0.33.0", "NVIDIA-L40S")
    assert a != coldstart.compile_cache_root("/c", "0.32.0", "NVIDIA-H100-80GB-HBM3")
    assert coldstart.compile_cache_root("/c/", "0.32.0", "../../etc x") == "/c/vllm-compile/0.32.0/etc-x"
    assert coldstart.compile_cache_root("/c", "0.32.0", None) == "/c/vllm-compile/0.32.0/any-gpu"
    assert coldstart.compile_cache_root("/c", "..", "..") == "/c/vllm-compile/unknown/any-gpu"


# --- the image pull, from the kubelet's own Events -------------------------------------------------------------

IMAGE = "vllm/vllm-openai:v0.32.0"


def _pulled(message: str, uid: str = "u1") -> dict[str, Any]:
    return {"reason": "Pulled", "message": message, "involvedObject": {"kind": "Pod", "uid": uid}}


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30.0), ("1m23.456s", 83.456), ("812ms", 0.812), ("1h2m3s", 3723.0), ("0s", 0.0), ("1.5µs", 0.0),
])
def test_go_durations_as_the_kubelet_prints_them(text: str, seconds: float) -> None:
    assert coldstart.go_duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "s", "1x", "1m 2s", "-3s", "9" * 70 + "s", "1e9s", "nan s"])
def test_garbled_durations_are_none(text: str) -> None:
    assert coldstart.go_duration_seconds(text) is None


def test_the_pull_is_read_from_every_kubelet_wording() -> None:
    # 1.30+: pull time, time including waiting (what the pod waited), image size
    new = _pulled(f'Successfully pulled image "{IMAGE}" in 1m23.4s (1m25.012s including waiting). '
                  "Image size: 9412003840 bytes.")
    assert coldstart.image_pull_from_events([new], pod_uid="u1") == {"imagePullSeconds": 85.012,
                                                                     "imageBytes": 9412003840}
    # 1.28-1.29: no size; before 1.28: the pull time alone
    assert coldstart.image_pull_from_events([_pulled(
        f'Successfully pulled image "{IMAGE}" in 7.5s (9s including waiting)')]) == {"imagePullSeconds": 9.0}
    assert coldstart.image_pull_from_events([_pulled(
        f'Successfully pulled image "{IMAGE}" in 7.519s')]) == {"imagePullSeconds": 7.519}
    # a cached image costs nothing, and says so (1.33+ adds "and can be accessed by the pod")
    for present in (f'Container image "{IMAGE}" already present on machine',
                    f'Container image "{IMAGE}" already present on machine and can be accessed by the pod'):
        assert coldstart.image_pull_from_events([_pulled(present)]) == {"imagePullSeconds": 0.0}
    # the init container's pull and vLLM's cached image: one pull in all
    both = [new, _pulled(f'Container image "{IMAGE}" already present on machine')]
    assert coldstart.image_pull_from_events(both, pod_uid="u1") == {"imagePullSeconds": 85.012,
                                                                    "imageBytes": 9412003840}


def test_events_that_say_nothing_measure_nothing() -> None:
    assert coldstart.image_pull_from_events([]) is None
    assert coldstart.image_pull_from_events([{"reason": "Pulling", "message": f'Pulling image "{IMAGE}"'}]) is None
    hostile = [_pulled(f'Successfully pulled image "{IMAGE}" in 99999999h (1e999s including waiting)'),
               _pulled("x" * 100_000), {"reason": "Pulled", "message": None}, "not an event"]  # type: ignore[list-item]
    assert coldstart.image_pull_from_events(hostile) is None
    # another pod of the same name (a recreated group's): not this start
    other = _pulled(f'Successfully pulled image "{IMAGE}" in 30s (30s including waiting)', uid="old")
    assert coldstart.image_pull_from_events([other], pod_uid="u1") is None


def test_the_pull_is_a_phase_of_the_start_apart_from_the_volume() -> None:
    pod = _pod()
    pod["metadata"]["uid"] = "u1"
    events = [_pulled(f'Successfully pulled image "{IMAGE}" in 12s (12.5s including waiting). '
                      "Image size: 100 bytes.")]
    measured = coldstart.cold_start_from_pod(pod, LOG, download_container=DOWNLOAD_CONTAINER, events=events)
    assert measured is not None
    assert measured["podStartSeconds"] == 20.0 and measured["imagePullSeconds"] == 12.5
    assert measured["imageBytes"] == 100
    # no Events readable: the rest is measured all the same, the pull is not invented
    alone = coldstart.cold_start_from_pod(pod, LOG, download_container=DOWNLOAD_CONTAINER)
    assert alone is not None and "imagePullSeconds" not in alone and alone["podStartSeconds"] == 20.0


def test_scale_from_zero_states_the_image_pull_apart_from_the_volume() -> None:
    from vllm_operator.render.autoscaling import cold_start_message
    measured = {"readySeconds": 231.0, "podStartSeconds": 49.0, "imagePullSeconds": 41.0, "loadSeconds": 38.0,
                "compileSeconds": 0.0, "measuredPod": "qwen-0"}
    said = cold_start_message(14.2, 2.0, 600.0, True, measured)
    assert "image pull 41s" in said and "volume and container creation 8s" in said
    assert "image pull and volume" not in said and "compile 0s" in said and "on pod qwen-0" in said
    # a kubelet that printed no Pulled Event: the two are one figure, as measured
    said = cold_start_message(14.2, 2.0, 600.0, False, {k: v for k, v in measured.items() if k != "imagePullSeconds"})
    assert "image pull and volume 49s" in said and "every start downloads the weights" in said
