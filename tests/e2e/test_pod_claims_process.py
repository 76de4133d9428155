"""Several pods of one service on ReadWriteOnce-only storage, each with a claim of its own (issue 25) — through the
real `vllm-operator run` process in the simulated cluster (a default ReadWriteOnce StorageClass, no ReadWriteMany
class, the LeaderWorkerSet API served).

The service may run up to 2 pods (spec.maxReplicas), so it runs as a LeaderWorkerSet of one-pod groups: pod
`chat-<g>` gets the claim `model-cache-chat-<g>`. Scaling 1 → 2 → 1 (the scale subresource's spec.replicas) never
changes the LeaderWorkerSet's templates; the second pod downloads into its own claim; a pod deleted and recreated
finds its weights in its claim (no second download); the second pod's claim is kept when the service scales back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kit.specs import condition as _condition
from kit.specs import vllmservice as _service
from vllm_operator_sim.cluster import NodePool, SimulatedCluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def _ready_pods(cluster: SimulatedCluster) -> list[str]:
    pods = cluster.api.list_objects("pods", "default", label_selector="vllm-operator.dev/service=chat")
    return sorted(p["metadata"]["name"] for p in pods if not (p["metadata"].get("deletionTimestamp")) and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or []))


def _fetches(cluster: SimulatedCluster) -> list[tuple[str, str, str]]:
    """(kind, pod, volume) of every weight fetch of the service's pods: `download` or `cache-hit`."""
    return [(e.kind, e.pod, str(e.details.get("volume"))) for e in cluster.kubelet.events
            if e.service == "chat" and e.kind in ("download", "cache-hit")]


def test_each_pod_has_its_own_claim_and_scaling_changes_no_template(tmp_path: Path) -> None:
    with SimulatedCluster([NodePool("L4", 1, 2)], speed=100, workdir=tmp_path) as cluster:
        cluster.start_operator()
        api = cluster.api

        def service() -> dict[str, Any]:
            return api.get_object("vllmservices", "chat", "default") or {}

        def lws() -> dict[str, Any]:
            return api.get_object("leaderworkersets", "chat", "default") or {}

        def templates() -> str:
            return json.dumps(lws()["spec"]["leaderWorkerTemplate"], sort_keys=True)

        def ready(count: int) -> None:
            cluster.wait_for(lambda: _condition(service(), "Ready").get("status") == "True"
                             and len(_ready_pods(cluster)) == count, timeout=120,
                             message=f"{count} pod(s) never served:\n" + cluster.operator_log()[-3000:])

        cluster.apply(_service({"model": {"name": MODEL}, "gpu": {"product": "NVIDIA-L4"}, "maxReplicas": 2}))
        ready(1)
        status = service()["status"]
        assert status["workload"] == "LeaderWorkerSet" and "multiNode" not in status
        assert _condition(service(), "ModelCache")["reason"] == "PersistentVolumeClaim"
        assert api.get_object("deployments", "chat", "default") is None
        assert lws()["spec"]["leaderWorkerTemplate"]["size"] == 1
        assert _ready_pods(cluster) == ["chat-0"]
        before = templates()

        api.patch_object("vllmservices", "chat", {"spec": {"replicas": 2}}, "default")  # what `kubectl scale` does
        ready(2)
        assert templates() == before and lws()["spec"]["replicas"] == 2
        assert _ready_pods(cluster) == ["chat-0", "chat-1"]
        downloads = [(pod, volume) for kind, pod, volume in _fetches(cluster) if kind == "download"]
        assert downloads == [("chat-0", "pvc:model-cache-chat-0"), ("chat-1", "pvc:model-cache-chat-1")], downloads

        # a pod deleted (a node drain, a remediation step) comes back with its own claim: no download
        seen = len(_fetches(cluster))
        uid = (api.get_object("pods", "chat-0", "default") or {})["metadata"]["uid"]
        api.delete_object("pods", "chat-0", "default")
        cluster.wait_for(lambda: ((api.get_object("pods", "chat-0", "default") or {}).get("metadata") or {}).get(
            "uid") not in (None, uid), timeout=60, message="chat-0 was not recreated")
        ready(2)
        again = _fetches(cluster)[seen:]
        assert again and all(kind == "cache-hit" and volume == "pvc:model-cache-chat-0"
                             for kind, pod, volume in again if pod == "chat-0"), again
        assert not [f for f in again if f[0] == "download"], again

        api.patch_object("vllmservices", "chat", {"spec": {"replicas": 1}}, "default")
        cluster.wait_for(lambda: _ready_pods(cluster) == ["chat-0"], timeout=120,
                         message="the second pod was not removed:\n" + cluster.operator_log()[-3000:])
        assert templates() == before and lws()["spec"]["replicas"] == 1
        # the second pod's claim is kept (whenScaled: Retain): a scale back up finds its weights
        assert api.get_object("persistentvolumeclaims", "model-cache-chat-1", "default") is not None
        assert service()["status"]["workload"] == "LeaderWorkerSet"


def test_a_one_pod_service_scaled_to_two_on_a_full_pool_switches_to_groups(tmp_path: Path) -> None:
    """A plain one-replica service (a Deployment with its own claim) on a pool of two one-GPU nodes, scaled to 2:
    it switches once to one-pod groups, make before break — group 0 takes over while the Deployment's pod holds the
    other GPU, the Deployment goes, and group 1 starts on the GPU it frees. It never stops serving."""
    with SimulatedCluster([NodePool("L4", 1, 2)], speed=100, workdir=tmp_path) as cluster:
        cluster.start_operator()
        api = cluster.api

        def service() -> dict[str, Any]:
            return api.get_object("vllmservices", "chat", "default") or {}

        cluster.apply(_service({"model": {"name": MODEL}, "gpu": {"product": "NVIDIA-L4"}}))
        cluster.wait_for(lambda: _condition(service(), "Ready").get("status") == "True", timeout=120,
                         message="never served:\n" + cluster.operator_log()[-3000:])
        assert service()["status"]["workload"] == "Deployment"
        assert api.get_object("deployments", "chat", "default") is not None

        api.patch_object("vllmservices", "chat", {"spec": {"replicas": 2}}, "default")
        gaps: list[float] = []

        def switched() -> bool:
            if not _ready_pods(cluster):
                gaps.append(cluster.clock.now())
            return (_ready_pods(cluster) == ["chat-0", "chat-1"]
                    and api.get_object("deployments", "chat", "default") is None
                    and _condition(service(), "Ready").get("status") == "True")

        cluster.wait_for(switched, timeout=180, message="the switch to one-pod groups never finished:\n"
                         + cluster.operator_log()[-3000:])
        assert not gaps, f"no pod served at simulated {gaps[:3]}"
        status = service()["status"]
        assert status["workload"] == "LeaderWorkerSet" and "workloadSwitch" not in status
        assert status["modelCache"]["shapePods"] == 2
        volumes = {v for kind, _pod, v in _fetches(cluster) if kind == "download"}
        assert {"pvc:model-cache-chat-0", "pvc:model-cache-chat-1"} <= volumes, volumes
