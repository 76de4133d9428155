"""The measured and the failing model download, recorded by the pod hook (handlers/downloads.py) against the
emulated API over HTTP: the test plays the kubelet and writes the model-download init container's status."""

from __future__ import annotations

import copy
import json
from typing import Any

from kit.inprocess import Cluster, harness_fixture  # noqa: F401 (`harness`)

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
    assert cache["downloadErrorPod"] == "chat-a" and "GatedRepoError: 401" in cache["downloadError"]
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
