"""spec.modelCache.prewarm (issue 25) through the real `vllm-operator run` process in the simulated cluster: the
pool's nodes pull the vLLM image and the shared cache is filled before the first pod is created, so that pod's
start pulls and downloads nothing.

Two L4 nodes, a default StorageClass and an NFS class (ReadWriteMany: the prewarm DaemonSet fills the shared claim).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kit.specs import condition as _condition
from kit.specs import vllmservice as _service
from vllm_operator.render.prewarm import prewarm_name
from vllm_operator_sim.cluster import NodePool, SimulatedCluster

pytestmark = pytest.mark.e2e

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def test_the_pool_is_warmed_before_the_first_pod_and_its_start_pulls_nothing(tmp_path: Path) -> None:
    with SimulatedCluster([NodePool("L4", 1, 2)], speed=100, workdir=tmp_path) as cluster:
        api = cluster.api
        api.create_object("storageclasses", {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                             "metadata": {"name": "nfs"}, "provisioner": "nfs.csi.k8s.io"})
        cluster.start_operator()

        def service() -> dict[str, Any]:
            return api.get_object("vllmservices", "chat", "default") or {}

        seen: list[tuple[bool, bool, str | None]] = []  # (DaemonSet, Deployment, Progressing reason) as polled

        def watch() -> bool:
            daemon_set = api.get_object("daemonsets", prewarm_name("chat"), "default") is not None
            deployment = api.get_object("deployments", "chat", "default") is not None
            seen.append((daemon_set, deployment, _condition(service(), "Progressing").get("reason")))
            return _condition(service(), "Ready").get("status") == "True"

        cluster.apply(_service({"model": {"name": MODEL}, "gpu": {"product": "NVIDIA-L4"},
                                "modelCache": {"prewarm": {}}}))
        cluster.wait_for(watch, timeout=120,
                         message="never served:\n" + cluster.operator_log()[-3000:])
        # warmed first: the DaemonSet without the Deployment, said in Progressing, then the Deployment
        assert any(ds and not dep and reason == "Prewarming" for ds, dep, reason in seen), seen
        assert not any(dep for ds, dep, _ in seen[:next(i for i, s in enumerate(seen) if s[0])]), seen
        status = service()["status"]
        prewarm = status["modelCache"]["prewarm"]
        assert prewarm["phase"] == "Done" and prewarm["desired"] == prewarm["ready"] == 2
        assert sorted(n["node"] for n in prewarm["nodes"]) == sorted(
            n["metadata"]["name"] for n in api.list_objects("nodes")) and {n["state"] for n in prewarm["nodes"]} == {
            "Done"}
        assert "daemonSet" not in prewarm
        # the model's shared claim (no owner: it outlives the service) is the operator's own, not a name conflict
        assert _condition(service(), "NameConflict").get("status") != "True", _condition(service(), "NameConflict")
        cluster.wait_for(lambda: api.get_object("daemonsets", prewarm_name("chat"), "default") is None, timeout=30,
                         message="the prewarm DaemonSet was not deleted once done")
        # the first pod found the image on its node and the weights on the shared claim
        cluster.wait_for(lambda: (service()["status"].get("coldStart") or {}).get("imagePullSeconds") is not None,
                         timeout=30, message="the start was not measured")
        start = service()["status"]["coldStart"]
        assert start["imagePullSeconds"] == 0.0
        assert start.get("downloadSeconds", 0.0) < 5.0
        downloads = [e for e in cluster.kubelet.events if e.kind == "download"]
        assert len(downloads) == 1 and downloads[0].service.startswith(prewarm_name("chat"))
        # the serving pods are the Deployment's only: the prewarm pods never carried the service's labels
        serving = api.list_objects("pods", "default", label_selector="vllm-operator.dev/service=chat")
        assert serving and all(p["metadata"]["name"].startswith("chat-") and "prewarm" not in p["metadata"]["name"]
                               for p in serving)
