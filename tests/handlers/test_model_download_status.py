"""The measured and the failing model download, recorded by the pod hook (handlers/downloads.py) against the
emulated API over HTTP: the test plays the kubelet and writes the model-download init container's status."""

from __future__ import annotations

import copy
import json
from typing import Any

from kit.inprocess import Cluster, harness_fixture  # noqa: F401 (`harness`)
from vllm_operator.render.cache import startup_failure_threshold

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
GATED = ("huggingface_hub.errors.GatedRepoError: 401 Client Error.\nCannot access gated repo for url "
         "https://huggingface.co/api/models/org/model.\nAccess to model org/model is restricted (token "
         "hf_abcdefghijklmnopqrstuvwxyz0123456789).\n")


def _pod(h: Cluster, deployment: dict[str, Any], name: str, init: dict[str, Any]) -> dict[str, Any]:
    template = deployment["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": h.namespace, "labels": copy.deepcopy(template["metadata"]["labels"]),
                        "annotations": copy.deepcopy(template["metadata"].get("annotations") or {})},
           "spec": {**copy.deepcopy(template["spec"]), "nodeName": "gpu-1"},
           "status": {"phase": "Pending", "initContainerStatuses": [{"name": "model-download", **init}],
                      "containerStatuses": [{"name": "vllm", "ready": False, "restartCount": 0,
                                             "state": {"waiting": {"reason": "PodInitializing"}}}]}}
    return h.server.create_object("pods", pod, h.namespace)


def _model_cache(h: Cluster, key: str) -> dict[str, Any] | None:
    cache = ((h.service("chat") or {}).get("status") or {}).get("modelCache") or {}
    return cache if key in cache else None


def test_a_failing_then_measured_download_is_recorded(harness: Cluster) -> None:
    h = harness
    h.add_node("gpu-1", "NVIDIA-L4")
    h.server.create_object("storageclasses", {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "x",
        "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}})
    h.create("chat", {"model": {"name": QWEN}})
    deployment = h.wait_deployment("chat", lambda d: bool(d["spec"]["template"]["spec"].get("initContainers")))
    # a gated model without a token: the init container crash-loops; the status says why (the token redacted)
    _pod(h, deployment, "chat-a", {"restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                   "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": GATED}}})
    cache = h.wait_for(lambda: _model_cache(h, "downloadError"), message="downloadError recorded")
    assert cache["downloadErrorPod"] == "chat-a" and "not accessible" in cache["downloadError"]
    assert "hf_abcdefghijklmnopqrstuvwxyz0123456789" not in json.dumps(h.service("chat"))
    # a new pod downloads 3 GiB in 12 s: measured, and the error cleared
    report = {"downloadedBytes": 3 * 2**30, "seconds": 12.0}
    _pod(h, deployment, "chat-b", {"restartCount": 0, "state": {"terminated": {
        "exitCode": 0, "reason": "Completed", "message": json.dumps(report), "finishedAt": "2025-01-01T00:00:12Z"}}})
    cache = h.wait_for(lambda: _model_cache(h, "bytesPerSecond"), message="the measurement recorded")
    assert cache["bytesPerSecond"] == 3 * 2**30 // 12 and cache["measuredPod"] == "chat-b"
    assert cache["measuredBy"] == "init-container" and cache["measuredAt"] == "2025-01-01T00:00:12Z"
    h.wait_for(lambda: "downloadError" not in (_model_cache(h, "bytesPerSecond") or {"downloadError": 1}) or None,
               message="the error cleared")


#: An error the classifier does not know, holding a credential in a shape the redactor does not know either.
UNRECOGNISED = ("Traceback (most recent call last):\n  ...\nmirror.errors.MirrorRefused: the mirror refused "
                "session q7Zk-SECRET-SHAPE-3nT1 for org/model\n")


def test_an_unrecognised_download_failure_copies_no_text_of_the_container(harness: Cluster) -> None:
    """Issue 20: only its class, the container, the exit code and where to read the log (the log's own text went
    to status.modelCache.downloadError, the ModelDownloadFailed condition and a Warning Event, redacted only)."""
    h = harness
    h.add_node("gpu-1", "NVIDIA-L4")
    h.server.create_object("storageclasses", {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "x",
        "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}})
    h.create("chat", {"model": {"name": QWEN}})
    deployment = h.wait_deployment("chat", lambda d: bool(d["spec"]["template"]["spec"].get("initContainers")))
    _pod(h, deployment, "chat-a", {"restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                   "lastState": {"terminated": {"exitCode": 3, "reason": "Error",
                                                                "message": UNRECOGNISED}}})
    cache = h.wait_for(lambda: _model_cache(h, "downloadError"), message="downloadError recorded")
    said = cache["downloadError"]
    assert "Unknown" in said and "model-download" in said and "exit code 3" in said
    assert "kubectl logs -n default chat-a -c model-download --previous" in said
    assert "SECRET-SHAPE" not in json.dumps(h.service("chat")) and "MirrorRefused" not in said
    events = h.server.list_objects("events", h.namespace)
    assert not [e for e in events if "SECRET-SHAPE" in json.dumps(e)]


VLLM_LOG = """\
INFO 01-01 00:02:00 [gpu_model_runner.py:2602] Model loading took 0.9277 GiB memory and 4.500000 seconds
INFO 01-01 00:02:20 [monitor.py:34] torch.compile takes 15.00 s in total
INFO 01-01 00:02:30 [gpu_model_runner.py:3480] Graph capturing finished in 6 secs, took 0.12 GiB
INFO 01-01 00:02:31 [core.py:210] init engine (profile, create kv cache, warmup model) took 100.00 seconds
"""


def _arg(deployment: dict[str, Any], flag: str) -> str | None:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return next((args[i + 1] for i, a in enumerate(args[:-1]) if a == flag), None)


def _probe_budget(deployment: dict[str, Any]) -> int:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return int(container["startupProbe"]["failureThreshold"])


def test_a_ready_pods_start_is_recorded_and_budgets_the_next_rollout(harness: Cluster) -> None:
    """status.coldStart from the pod's timestamps, the init container and vLLM's own lines; the startup probe takes
    the measured engine start at the next change of vLLM's arguments, never by itself."""
    h = harness
    h.add_node("gpu-1", "NVIDIA-L4")
    h.server.create_object("storageclasses", {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "x",
        "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}})
    h.create("chat", {"model": {"name": QWEN}})
    deployment = h.wait_deployment("chat", lambda d: bool(d["spec"]["template"]["spec"].get("initContainers")))
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "/vllm-compile/" in env["VLLM_CACHE_ROOT"]  # compile caches on the claim
    before = _probe_budget(deployment)
    report = {"downloadedBytes": 2**30, "seconds": 30.0}
    pod = _pod(h, deployment, "chat-a", {"restartCount": 0, "state": {"terminated": {
        "exitCode": 0, "reason": "Completed", "message": json.dumps(report), "startedAt": "2025-01-01T00:00:30Z",
        "finishedAt": "2025-01-01T00:01:00Z"}}})
    h.server.set_pod_log(h.namespace, "chat-a", VLLM_LOG, container="vllm")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    for message in (f'Successfully pulled image "{image}" in 20.5s (21s including waiting). Image size: 9000 bytes.',
                    f'Container image "{image}" already present on machine'):  # the init container's, vLLM's
        h.server.create_object("events", {
            "apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "chat-a.", "namespace": h.namespace},
            "involvedObject": {"kind": "Pod", "name": "chat-a", "namespace": h.namespace,
                               "uid": pod["metadata"]["uid"]},
            "type": "Normal", "reason": "Pulled", "message": message, "source": {"component": "kubelet"}},
            h.namespace)
    pod["status"] = {"phase": "Running", "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"},
        {"type": "Ready", "status": "True", "lastTransitionTime": "2025-01-01T00:03:00Z"}],
        "initContainerStatuses": pod["status"]["initContainerStatuses"],
        "containerStatuses": [{"name": "vllm", "ready": True, "restartCount": 0,
                               "state": {"running": {"startedAt": "2025-01-01T00:01:01Z"}}}]}
    h.server.patch_status("pods", "chat-a", pod["status"], h.namespace)

    def cold_start() -> dict[str, Any] | None:
        found = ((h.service("chat") or {}).get("status") or {}).get("coldStart") or {}
        return found if found.get("measuredPod") == "chat-a" else None
    start = h.wait_for(cold_start, message="the start recorded")
    assert start["readySeconds"] == 180.0 and start["podStartSeconds"] == 30.0
    assert start["imagePullSeconds"] == 21.0 and start["imageBytes"] == 9000  # of the 30 s: the pull, by the kubelet
    assert start["downloadSeconds"] == 30.0 and start["loadSeconds"] == 4.5 and start["compileSeconds"] == 15.0
    assert start["engineInitSeconds"] == 100.0 and start["slowestEngineInitSeconds"] == 100.0
    assert start["compileCache"] == "persistent" and start["starts"] == 1
    assert _probe_budget(h.deployment("chat")) == before  # a measurement alone rolls nothing out
    h.patch_spec("chat", {"flags": {"maxNumSeqs": 8}})  # vLLM's arguments change: the budget follows the measure
    h.wait_for(lambda: (h.service("chat")["status"].get("observedGeneration") or 0) >= 2, message="re-planned")
    after = h.wait_deployment("chat", lambda d: _arg(d, "--max-num-seqs") == "8")
    checkpoint_gib = h.service("chat")["status"]["modelCache"]["checkpointBytes"] / 2**30
    assert before == startup_failure_threshold(checkpoint_gib, download_mib_per_s=100, download=False)
    assert _probe_budget(after) == startup_failure_threshold(checkpoint_gib, download_mib_per_s=100, download=False,
                                                             engine_seconds=200.0) < before  # 2 × 100 s measured
    assert cold_start()["budgetEngineSeconds"] == 200.0
