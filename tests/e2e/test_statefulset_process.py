"""A claim per pod without LeaderWorkerSet (issue 25) — through the real `vllm-operator run` process in the simulated
cluster, whose StatefulSet controller (vllm_operator_sim.statefulset) makes the pods and their claims.

A default ReadWriteOnce StorageClass, no LeaderWorkerSet API: a service that may run two pods is a StatefulSet
`chat-set` whose pods each mount their own claim `model-cache-chat-set-<n>`. Scaling 1 → 2 → 1 → 2 changes no pod
template and keeps claim 1, so the second start of pod 1 downloads nothing; a flag edit rolls one pod at a time (the
Service always has a Ready endpoint); an edit onto a full pool is held; deleting the service deletes the claims. An
emptyDir Deployment (the operator's ephemeral mode) that moves to a claim per pod switches make-before-break, and is
held while its pods hold every GPU of the pool.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kit.specs import condition as _condition
from kit.specs import vllmservice as _service
from vllm_operator_sim.cluster import NodePool, SimulatedCluster

pytestmark = pytest.mark.e2e

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
L4, H100 = "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3"
WAIT = 120.0


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _pods(cluster: SimulatedCluster, name: str = "chat") -> dict[str, dict[str, Any]]:
    found = cluster.api.list_objects("pods", "default", label_selector=f"vllm-operator.dev/service={name}")
    return {p["metadata"]["name"]: p for p in found if not p["metadata"].get("deletionTimestamp")}


def _serving(cluster: SimulatedCluster, name: str = "chat") -> list[str]:
    """The Ready pods the service's Service selects (its endpoints)."""
    service = cluster.api.get_object("services", name, "default") or {}
    selector = (service.get("spec") or {}).get("selector") or {}
    return sorted(n for n, p in _pods(cluster, name).items() if _ready(p) and selector and all(
        (p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items()))


def _claims(cluster: SimulatedCluster) -> set[str]:
    return {c["metadata"]["name"] for c in cluster.api.list_objects("persistentvolumeclaims", "default")}


def _downloads(cluster: SimulatedCluster, pod: str) -> int:
    return sum(1 for e in cluster.kubelet.events if e.kind == "download" and e.pod == pod)


def _sts(cluster: SimulatedCluster, name: str = "chat-set") -> dict[str, Any] | None:
    return cluster.api.get_object("statefulsets", name, "default")


def _status(cluster: SimulatedCluster, name: str = "chat") -> dict[str, Any]:
    return (cluster.api.get_object("vllmservices", name, "default") or {}).get("status") or {}


def _settled(cluster: SimulatedCluster, pods: int) -> bool:
    status = _status(cluster)
    return bool(_condition({"status": status}, "Ready").get("status") == "True" and "workloadSwitch" not in status
                and len(_serving(cluster)) == pods)


def _scale(cluster: SimulatedCluster, replicas: int, spec: dict[str, Any]) -> dict[str, Any]:
    spec = {**spec, "replicas": replicas}
    cluster.apply(_service(spec))
    return spec


def _template(cluster: SimulatedCluster) -> str:
    return json.dumps((_sts(cluster) or {})["spec"]["template"], sort_keys=True)


def test_a_service_that_may_run_two_pods_gets_a_claim_each_without_lws(tmp_path: Path) -> None:
    with SimulatedCluster([NodePool("L4", 1, 2), NodePool("H100-SXM-80GB", 1, 1)], speed=100, workdir=tmp_path,
                          leaderworkerset=False) as cluster:
        cluster.start_operator()
        api = cluster.api
        log = cluster.operator_log
        cluster.apply(_service({"model": {"name": MODEL}, "gpu": {"product": H100}}, name="other"))
        spec: dict[str, Any] = {"model": {"name": MODEL}, "gpu": {"product": L4}, "replicas": 1, "maxReplicas": 2}
        cluster.apply(_service(spec))
        cluster.wait_for(lambda: _settled(cluster, 1), timeout=WAIT, message="never served:\n" + log()[-3000:])
        status = _status(cluster)
        assert status["workload"] == "StatefulSet" and api.get_object("deployments", "chat", "default") is None
        cache = _condition({"status": status}, "ModelCache")
        assert cache["status"] == "True" and "StatefulSet" in cache["message"]
        assert _serving(cluster) == ["chat-set-0"] and "model-cache-chat-set-0" in _claims(cluster)
        template = _template(cluster)

        # 1 → 2 → 1 → 2: no template change; claim 1 kept while pod 1 is gone; its second start downloads nothing
        spec = _scale(cluster, 2, spec)
        cluster.wait_for(lambda: _settled(cluster, 2), timeout=WAIT, message="never 2:\n" + log()[-3000:])
        assert _downloads(cluster, "chat-set-1") == 1
        spec = _scale(cluster, 1, spec)
        cluster.wait_for(lambda: "chat-set-1" not in _pods(cluster) or None, timeout=WAIT, message="pod 1 stayed")
        assert "model-cache-chat-set-1" in _claims(cluster)  # whenScaled: Retain
        spec = _scale(cluster, 2, spec)
        cluster.wait_for(lambda: _settled(cluster, 2), timeout=WAIT, message="never 2 again:\n" + log()[-3000:])
        assert _downloads(cluster, "chat-set-1") == 1  # the weights were on its claim
        assert _template(cluster) == template

        # a flag edit rolls one pod at a time from the highest ordinal: a Ready endpoint all along
        before = {n: p["metadata"]["uid"] for n, p in _pods(cluster).items()}
        cluster.apply(_service({**spec, "flags": {"maxNumSeqs": 64}}))
        seen: list[int] = []

        def rolled() -> bool:
            seen.append(len(_serving(cluster)))
            pods = _pods(cluster)
            return bool(set(pods) == set(before) and all(pods[n]["metadata"]["uid"] != before[n] for n in pods)
                        and _settled(cluster, 2))
        cluster.wait_for(rolled, timeout=WAIT, message="the edit never rolled out:\n" + log()[-3000:])
        assert min(seen) >= 1, seen
        assert _downloads(cluster, "chat-set-0") == 1 and _downloads(cluster, "chat-set-1") == 1

        # an edit onto the full H100 pool: held, both pods keep serving
        serving = _serving(cluster)
        cluster.apply(_service({**spec, "flags": {"maxNumSeqs": 64}, "gpu": {"product": H100}}))
        cluster.wait_for(lambda: _condition({"status": _status(cluster)}, "Progressing").get("reason")
                         == "RolloutHeld" or None, timeout=WAIT, message="not held:\n" + log()[-3000:])
        assert _serving(cluster) == serving
        node_selector = (_sts(cluster) or {})["spec"]["template"]["spec"]["nodeSelector"]
        assert node_selector["nvidia.com/gpu.product"] == L4

        # delete: the StatefulSet and every claim go with the service
        api.delete_object("vllmservices", "chat", "default")
        cluster.wait_for(lambda: not {c for c in _claims(cluster) if c.startswith("model-cache-chat-set-")} or None,
                         timeout=WAIT, message=f"claims left: {_claims(cluster)}")
        assert _sts(cluster) is None


def test_an_empty_dir_deployment_moves_to_a_claim_per_pod_and_waits_for_a_free_gpu(tmp_path: Path) -> None:
    """The operator ran with an ephemeral cache (an emptyDir Deployment of two pods); restarted with the default
    mode, the service needs a claim per pod: a StatefulSet beside the Deployment (make before break), which takes
    over once two of its pods serve. With the GPUs of the pool taken (the Deployment's two pods and another service's
    two) the switch is held — the Deployment keeps serving, nothing Pending is created — and proceeds once two GPUs
    are free."""
    with SimulatedCluster([NodePool("L4", 1, 4)], speed=100, workdir=tmp_path, leaderworkerset=False) as cluster:
        api = cluster.api
        log = cluster.operator_log
        cluster.start_operator("--model-cache-mode", "ephemeral")
        spec = {"model": {"name": MODEL}, "gpu": {"product": L4}, "replicas": 2}
        cluster.apply(_service({"model": {"name": MODEL}, "gpu": {"product": L4}, "replicas": 2}, name="other"))
        cluster.apply(_service(spec))
        cluster.wait_for(lambda: _settled(cluster, 2) and len(_serving(cluster, "other")) == 2 or None, timeout=WAIT,
                         message="never served:\n" + log()[-3000:])
        assert _status(cluster)["workload"] == "Deployment" and _sts(cluster) is None
        deployment_pods = _serving(cluster)

        cluster.stop_operator()
        cluster.start_operator()
        cluster.wait_for(lambda: _condition({"status": _status(cluster)}, "Progressing").get("reason")
                         == "RolloutHeld" or None, timeout=WAIT, message="not held:\n" + log()[-3000:])
        held = _condition({"status": _status(cluster)}, "Progressing")
        assert "StatefulSet" in held["message"] and "Free 2 GPUs" in held["message"]
        assert _sts(cluster) is None and _status(cluster)["workload"] == "Deployment"
        assert _serving(cluster) == deployment_pods

        api.delete_object("vllmservices", "other", "default")  # two GPUs free up
        cluster.wait_for(lambda: not _pods(cluster, "other") or None, timeout=WAIT, message="other's pod stayed")
        # the next reconcile (an edit of the spec here; the watchdog's round otherwise) finds the GPUs and switches
        spec = {**spec, "env": [{"name": "TEAM", "value": "a"}]}
        cluster.apply(_service(spec))
        try:
            cluster.wait_for(lambda: _settled(cluster, 2) and _status(cluster)["workload"] == "StatefulSet" or None,
                             timeout=WAIT * 2)
        except TimeoutError:  # the log as it is now, not as it was when the wait began
            raise AssertionError(f"the switch never completed: {_status(cluster)}\n{log()[-6000:]}") from None
        assert api.get_object("deployments", "chat", "default") is None
        assert _serving(cluster) == ["chat-set-0", "chat-set-1"]


def test_a_one_pod_service_scaled_past_its_bounds_switches_once_and_its_own_claim_goes(tmp_path: Path) -> None:
    """A plain one-replica service is a Deployment with its own claim `chat-model-cache`; `spec.replicas: 2` (what
    `kubectl scale` writes) makes it a service of several pods: one switch to a StatefulSet, make before break, and
    once the Deployment is deleted its claim, which nothing mounts any more, is deleted too."""
    with SimulatedCluster([NodePool("L4", 1, 2)], speed=100, workdir=tmp_path, leaderworkerset=False) as cluster:
        api = cluster.api
        log = cluster.operator_log
        cluster.start_operator()
        spec: dict[str, Any] = {"model": {"name": MODEL}, "gpu": {"product": L4}}
        cluster.apply(_service(spec))
        cluster.wait_for(lambda: _settled(cluster, 1), timeout=WAIT, message="never served:\n" + log()[-3000:])
        assert _status(cluster)["workload"] == "Deployment" and "chat-model-cache" in _claims(cluster)
        deployment_pod = _serving(cluster)
        seen: list[int] = []

        def switched() -> bool:
            seen.append(len(_serving(cluster)))
            return _settled(cluster, 2) and _status(cluster).get("workload") == "StatefulSet"
        _scale(cluster, 2, spec)
        cluster.wait_for(switched, timeout=WAIT * 2, message="the switch never completed:\n" + log()[-3000:])
        assert min(seen) >= 1, seen  # a Ready endpoint all along
        assert api.get_object("deployments", "chat", "default") is None
        assert _serving(cluster) == ["chat-set-0", "chat-set-1"] and deployment_pod[0] not in _serving(cluster)
        cluster.wait_for(lambda: "chat-model-cache" not in _claims(cluster) or None, timeout=WAIT,
                         message=f"the Deployment's claim stayed: {_claims(cluster)}")
        assert {"model-cache-chat-set-0", "model-cache-chat-set-1"} <= _claims(cluster)
