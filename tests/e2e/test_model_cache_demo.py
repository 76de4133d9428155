"""Weights are downloaded once: a remediation step's new pod finds them in the model cache (the real operator
against the simulated cluster, whose default StorageClass makes the default cache a PersistentVolumeClaim)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from vllm_operator_sim.cluster import SimulatedCluster
from vllm_operator_sim.demo import ServiceResult, run_services
from vllm_operator_sim.scenarios import Scenario, ScenarioSet
from vllm_operator_sim.startup import HiddenFacts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _run(name: str, spec: dict[str, Any], hidden: HiddenFacts | None = None, *, leaderworkerset: bool = True,
         ) -> tuple[ServiceResult, list[tuple[str, str, str]], dict[str, Any]]:
    """Run one service that fails its first start (a stale process holds 3 GiB, unless `hidden` says otherwise) and
    is remediated; return the result, the kubelet's (kind, pod, volume) download/cache events and the service's
    ModelCache condition."""
    hidden = hidden or HiddenFacts(other_process_gib=3.0)
    scenarios = ScenarioSet({name: Scenario(name=name, hidden=hidden)})
    manifest = {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
                "metadata": {"name": name, "namespace": "default"}, "spec": spec}
    seen: dict[str, Any] = {}

    def inspect(cluster: SimulatedCluster, _results: list[ServiceResult]) -> None:
        seen["events"] = [(e.kind, e.pod, str(e.details.get("volume"))) for e in cluster.kubelet.events
                          if e.service == name and e.kind in ("download", "cache-hit")]
        def measured() -> dict[str, Any] | None:  # the operator records the measured download soon after Ready
            found = cluster.api.get_object("vllmservices", name, "default") or {}
            return found if ((found.get("status") or {}).get("modelCache") or {}).get("measuredBy") else None
        with contextlib.suppress(TimeoutError):
            cluster.wait_for(measured, timeout=15)
        obj = cluster.api.get_object("vllmservices", name, "default") or {}
        seen["condition"] = next((c for c in (obj.get("status") or {}).get("conditions") or []
                                  if c["type"] == "ModelCache"), {})
        seen["modelCache"] = (obj.get("status") or {}).get("modelCache") or {}
        seen["by_container"] = [(e.kind, e.pod, str(e.details.get("container"))) for e in cluster.kubelet.events
                                if e.service == name and e.kind in ("download", "cache-hit")]
        seen["downloaded"] = [e.details for e in cluster.kubelet.events if e.service == name and e.kind == "download"]

    [result] = run_services([manifest], scenarios=scenarios, pools=[("L4", 1)], sim_timeout_s=3600,
                            on_results=inspect, leaderworkerset=leaderworkerset)
    SEEN[name] = seen
    return result, seen["events"], seen["condition"]


#: What `_run` saw last, per service (the init container's view, status.modelCache).
SEEN: dict[str, dict[str, Any]] = {}


def test_a_remediation_step_reuses_the_cache() -> None:
    spec = {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "gpu": {"product": "NVIDIA-L4"},
            "remediation": {"minIntervalSeconds": 0}}
    result, events, condition = _run("cached", spec)
    assert result.outcome == "Ready" and result.remediation_steps >= 1, result
    assert condition.get("status") == "True" and condition.get("reason") == "PersistentVolumeClaim", condition
    downloads = [e for e in events if e[0] == "download"]
    hits = [e for e in events if e[0] == "cache-hit"]
    assert len(downloads) == 1, events  # one download, ever
    assert hits and {e[2] for e in events} == {"pvc:cached-model-cache"}, events
    assert len({e[1] for e in events}) >= 2  # the remediation step's pod is a new pod: it found the weights
    seen = SEEN["cached"]
    # the model-download init container of the first pod downloaded; every later fetch (the first pod's vLLM, the
    # step's init container and vLLM) found the weights
    assert [(kind, container) for kind, _pod, container in seen["by_container"]][0] == ("download", "model-download")
    later_pods = {pod for kind, pod, _c in seen["by_container"]} - {seen["by_container"][0][1]}
    assert later_pods and all(kind == "cache-hit" for kind, pod, _c in seen["by_container"] if pod in later_pods)
    assert {c for _k, pod, c in seen["by_container"] if pod in later_pods} == {"model-download", "vllm"}
    # the measured download is in status.modelCache: the kubelet's own bytes over the init container's run time
    [download] = seen["downloaded"]
    cache = seen["modelCache"]
    assert cache.get("measuredBy") == "init-container" and cache.get("downloadedBytes") == download["bytes"], cache
    assert cache["downloadSeconds"] > download["seconds"]  # the download plus the cache check
    assert cache["bytesPerSecond"] == int(download["bytes"] / cache["downloadSeconds"]) and cache["downloadInit"]


def test_an_ephemeral_cache_downloads_again_on_every_new_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """The contrast (what the ModelCache condition warns about): an emptyDir, which the operator gives only when
    asked (its ephemeral mode, here from the environment its process inherits) or without a StorageClass — with the
    ReadWriteOnce default each pod gets a claim of its own (one-pod groups, or a StatefulSet without the
    LeaderWorkerSet API: the tests below and test_pod_claims_process)."""
    monkeypatch.setenv("VLLM_OPERATOR_MODEL_CACHE_MODE", "ephemeral")
    spec = {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "gpu": {"product": "NVIDIA-L4"}, "maxReplicas": 2,
            "remediation": {"minIntervalSeconds": 0}}
    # the first start dies after loading the weights (CUDA graphs need more than estimated: capture runs out of
    # memory; a larger activation peak would not do since --max-model-len auto re-fits it), so it downloaded
    # them (a start that dies at the free-memory check, before loading, downloads nothing)
    result, events, condition = _run("fresh", spec, HiddenFacts(extra_cudagraph_gib=3.0), leaderworkerset=False)
    assert result.remediation_steps >= 1, result
    assert condition.get("status") == "False" and condition.get("reason") == "Ephemeral", condition
    pods = {e[1] for e in events}
    assert len([e for e in events if e[0] == "download"]) == len(pods) >= 2, events
    # no init container on an emptyDir: the measurement is vLLM's own log line, read once the pod served
    seen = SEEN["fresh"]
    cache = seen["modelCache"]
    assert cache.get("downloadInit") is False and cache.get("measuredBy") == "vllm-log", cache
    last = seen["downloaded"][-1]
    assert cache["downloadedBytes"] == cache["checkpointBytes"] and cache["measuredPod"] in pods
    assert abs(cache["downloadSeconds"] - last["seconds"]) < 0.01


def test_a_remediation_step_of_a_one_pod_group_reuses_its_own_claim() -> None:
    """A service that may run several pods, on ReadWriteOnce storage with the LeaderWorkerSet API: it runs as
    one-pod groups, and the remediation step's new pod (group 0, recreated) finds the weights in its own claim."""
    spec = {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "gpu": {"product": "NVIDIA-L4"}, "maxReplicas": 2,
            "remediation": {"minIntervalSeconds": 0}}
    result, events, condition = _run("groups", spec, HiddenFacts(extra_cudagraph_gib=3.0))
    assert result.outcome == "Ready" and result.remediation_steps >= 1, result
    assert condition.get("status") == "True" and condition.get("reason") == "PersistentVolumeClaim", condition
    assert "one-pod groups" in condition.get("message", ""), condition
    assert len([e for e in events if e[0] == "download"]) == 1, events  # one download, ever
    assert {e[2] for e in events} == {"pvc:model-cache-groups-0"}, events
    assert [e for e in events if e[0] == "cache-hit"], events


def test_a_remediation_step_of_a_statefulset_pod_reuses_its_own_claim() -> None:
    """The same service on a cluster without the LeaderWorkerSet API: it runs as a StatefulSet, and the remediation
    step's new pod (`<service>-set-0`, recreated by the StatefulSet controller) finds the weights in its own claim."""
    spec = {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "gpu": {"product": "NVIDIA-L4"}, "maxReplicas": 2,
            "remediation": {"minIntervalSeconds": 0}}
    result, events, condition = _run("sts", spec, HiddenFacts(extra_cudagraph_gib=3.0), leaderworkerset=False)
    assert result.outcome == "Ready" and result.remediation_steps >= 1, result
    assert condition.get("status") == "True" and condition.get("reason") == "PersistentVolumeClaim", condition
    assert "StatefulSet" in condition.get("message", ""), condition
    assert len([e for e in events if e[0] == "download"]) == 1, events  # one download, ever
    assert {e[2] for e in events} == {"pvc:model-cache-sts-set-0"}, events
    assert [e for e in events if e[0] == "cache-hit"], events
