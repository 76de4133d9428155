"""The simulated cluster binds claims and attaches their volumes as Kubernetes does (vllm_operator_sim/volumes.py).

A ReadWriteOnce network volume is attached to one node at a time: a pod on another node that mounts it stays
ContainerCreating with the attach/detach controller's Multi-Attach `FailedAttachVolume` Warning until no pod on the
first node uses it; pods on one node share it; a ReadWriteMany claim attaches anywhere; WaitForFirstConsumer binds
at the first pod's scheduling, Immediate at once; a node-local volume's pods fit only its node. A Deployment that
surges with such a claim stalls; one that rolls without a surge (`maxSurge: 0`) rolls.

Two 1-GPU L4 nodes, so that a second GPU pod must go to the other node; a manual clock, ticked by the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from simkit import SimHarness, default_storage_class, gpu

from kit.api import emulated_api
from vllm_operator_sim.clock import SimClock
from vllm_operator_sim.cluster import gpu_node
from vllm_operator_sim.kubelet import Kubelet, SimEvent
from vllm_operator_sim.volumes import NODE_LOCAL_PROVISIONER

NODES = ("gpu-l4-0", "gpu-l4-1")


@pytest.fixture
def two() -> Iterator[SimHarness]:
    """Two nodes of one L4 each, the default StorageClass (network block storage, WaitForFirstConsumer)."""
    with emulated_api(nodes=[gpu_node(name, gpu("L4"), 1) for name in NODES]) as server:
        api = server.emulator
        api.create_object("storageclasses", default_storage_class())
        clock = SimClock.manual()
        events: list[SimEvent] = []
        kubelet = Kubelet(api, clock, image_pull_s=5.0, on_event=events.append)
        yield SimHarness(api=api, clock=clock, kubelet=kubelet, server=server, events=events)


def claim(name: str, *, mode: str = "ReadWriteOnce", storage_class: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": [mode], "resources": {"requests": {"storage": "20Gi"}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
            "spec": spec}


def pod_spec(claim_name: str | None, *, gpus: int = 1, node: str | None = None) -> dict[str, Any]:
    """A one-container pod mounting the claim (if any) as `data`; `gpus` L4s (the scheduler places it), `node`:
    pinned by a nodeSelector."""
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    if claim_name is not None:
        spec["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return spec


def make_pod(sim: SimHarness, name: str, claim_name: str | None, **kw: Any) -> None:
    sim.api.create_object("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                                                 "labels": {"app": "t"}},
                                   "spec": pod_spec(claim_name, **kw)}, "default")


def pod(sim: SimHarness, name: str) -> dict[str, Any]:
    return sim.api.get_object("pods", name, "default") or {}


def node_of(sim: SimHarness, name: str) -> str | None:
    return (pod(sim, name).get("spec") or {}).get("nodeName")


def waiting(sim: SimHarness, name: str) -> str | None:
    statuses = (pod(sim, name).get("status") or {}).get("containerStatuses") or [{}]
    return ((statuses[0].get("state") or {}).get("waiting") or {}).get("reason")


def ready(sim: SimHarness, name: str) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod(sim, name).get("status") or {}).get("conditions") or [])


def events(sim: SimHarness, name: str, kind: str = "Pod") -> list[tuple[str, str, str, str]]:
    """(type, reason, source component, message) of the Events about the object, oldest first."""
    found = [e for e in sim.api.list_objects("events", "default")
             if (e.get("involvedObject") or {}).get("name") == name and (e.get("involvedObject") or {}).get("kind") == kind]
    return [(e["type"], e["reason"], (e.get("source") or {}).get("component", ""), e["message"]) for e in found]


def reasons(sim: SimHarness, name: str, kind: str = "Pod") -> list[str]:
    return [reason for _, reason, _, _ in events(sim, name, kind)]


def stored_claim(sim: SimHarness, name: str) -> dict[str, Any]:
    return sim.api.get_object("persistentvolumeclaims", name, "default") or {}


def test_a_second_node_cannot_attach_a_read_write_once_volume_until_the_first_lets_go(two: SimHarness) -> None:
    sim = two
    sim.api.create_object("persistentvolumeclaims", claim("data"), "default")
    make_pod(sim, "first", "data", node="gpu-l4-0")
    sim.run_until(lambda: ready(sim, "first"))
    volume = stored_claim(sim, "data")["spec"]["volumeName"]
    assert ("Normal", "SuccessfulAttachVolume", "attachdetach-controller",
            f'AttachVolume.Attach succeeded for volume "{volume}"') in events(sim, "first")

    make_pod(sim, "second", "data", node="gpu-l4-1")
    sim.run(150)  # past the kubelet's two-minute wait for its volumes
    assert node_of(sim, "second") == "gpu-l4-1"  # ReadWriteOnce is no scheduling constraint: it is placed
    assert waiting(sim, "second") == "ContainerCreating" and not ready(sim, "second")
    assert (pod(sim, "second").get("status") or {}).get("phase") == "Pending"
    said = events(sim, "second")
    assert ("Warning", "FailedAttachVolume", "attachdetach-controller",
            f'Multi-Attach error for volume "{volume}" Volume is already used by pod(s) first') in said
    assert ("Warning", "FailedMount", "kubelet",
            "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[data], failed to "
            "process volumes=[]: context deadline exceeded") in said
    assert "Started" not in reasons(sim, "second") and "SuccessfulAttachVolume" not in reasons(sim, "second")
    assert ready(sim, "first")

    sim.api.delete_object("pods", "first", "default")  # released: detached from gpu-l4-0, attached to gpu-l4-1
    sim.run_until(lambda: ready(sim, "second"), limit=60)
    assert ("Normal", "SuccessfulAttachVolume", "attachdetach-controller",
            f'AttachVolume.Attach succeeded for volume "{volume}"') in events(sim, "second")
    assert sim.kubelet.volumes.attached == {volume: "gpu-l4-1"}
    assert sim.kubelet.errors == []


def test_pods_on_one_node_share_a_read_write_once_volume(two: SimHarness) -> None:
    sim = two
    sim.api.create_object("persistentvolumeclaims", claim("data"), "default")
    make_pod(sim, "a", "data", gpus=0, node="gpu-l4-0")
    make_pod(sim, "b", "data", gpus=0, node="gpu-l4-0")
    sim.run_until(lambda: ready(sim, "a") and ready(sim, "b"), limit=120)
    assert "FailedAttachVolume" not in reasons(sim, "a") + reasons(sim, "b")
    assert sorted(reasons(sim, "a") + reasons(sim, "b")).count("SuccessfulAttachVolume") == 1  # attached once


def test_a_read_write_once_pod_claim_refuses_a_second_pod_even_on_the_same_node(two: SimHarness) -> None:
    sim = two
    sim.api.create_object("persistentvolumeclaims", claim("solo", mode="ReadWriteOncePod"), "default")
    make_pod(sim, "a", "solo", gpus=0, node="gpu-l4-0")
    make_pod(sim, "b", "solo", gpus=0, node="gpu-l4-0")  # both wait for the scheduler: the first placed wins
    sim.run_until(lambda: ready(sim, "a"), limit=120)
    sim.run(10)
    assert node_of(sim, "b") is None
    assert ("Warning", "FailedScheduling", "default-scheduler",
            "0/2 nodes are available: node has pod using PersistentVolumeClaim with the same name and "
            "ReadWriteOncePod access mode. preemption: 0/2 nodes are available: 2 Preemption is not helpful for "
            "scheduling.") in events(sim, "b")
    sim.api.delete_object("pods", "a", "default")
    sim.run_until(lambda: ready(sim, "b"), limit=60)


def test_a_read_write_many_claim_attaches_on_every_node(two: SimHarness) -> None:
    sim = two
    sim.api.create_object("storageclasses", {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                             "metadata": {"name": "nfs"}, "provisioner": "nfs.csi.k8s.io"})
    sim.api.create_object("persistentvolumeclaims", claim("shared", mode="ReadWriteMany", storage_class="nfs"),
                          "default")
    sim.run(1)
    assert stored_claim(sim, "shared")["status"]["phase"] == "Bound"  # Immediate (the default binding mode)
    make_pod(sim, "a", "shared", node="gpu-l4-0")
    make_pod(sim, "b", "shared", node="gpu-l4-1")
    sim.run_until(lambda: ready(sim, "a") and ready(sim, "b"), limit=120)
    assert not {"FailedAttachVolume", "SuccessfulAttachVolume"} & set(reasons(sim, "a") + reasons(sim, "b"))
    assert sim.kubelet.volumes.attached == {}  # a shared file system is mounted, never attached


def test_wait_for_first_consumer_binds_where_the_first_pod_is_scheduled_immediate_at_once(two: SimHarness) -> None:
    sim = two
    sim.api.create_object("persistentvolumeclaims", claim("later"), "default")  # no class: the default one
    sim.run(2)
    stored = stored_claim(sim, "later")
    assert stored["spec"]["storageClassName"] == "standard"  # retroactive default StorageClass assignment
    assert (stored.get("status") or {}).get("phase") == "Pending" and "volumeName" not in stored["spec"]
    assert ("Normal", "WaitForFirstConsumer", "persistentvolume-controller",
            "waiting for first consumer to be created before binding") in events(sim, "later", "PersistentVolumeClaim")

    make_pod(sim, "consumer", "later", node="gpu-l4-1")
    sim.run_until(lambda: ready(sim, "consumer"), limit=120)
    stored = stored_claim(sim, "later")
    uid = stored["metadata"]["uid"]
    assert stored["status"] == {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "20Gi"}}
    assert stored["spec"]["volumeName"] == f"pvc-{uid}"
    assert stored["metadata"]["annotations"] == {
        "pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes",
        "volume.beta.kubernetes.io/storage-provisioner": "sim.vllm-operator.dev/network-block",
        "volume.kubernetes.io/storage-provisioner": "sim.vllm-operator.dev/network-block",
        "volume.kubernetes.io/selected-node": "gpu-l4-1"}
    assert "ProvisioningSucceeded" in reasons(sim, "later", "PersistentVolumeClaim")

    sim.api.create_object("storageclasses", {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                             "metadata": {"name": "now"}, "provisioner": "ebs.csi.aws.com",
                                             "volumeBindingMode": "Immediate"})
    sim.api.create_object("persistentvolumeclaims", claim("early", storage_class="now"), "default")
    sim.run(1)
    stored = stored_claim(sim, "early")
    assert stored["status"]["phase"] == "Bound" and "volume.kubernetes.io/selected-node" not in stored["metadata"][
        "annotations"]


def test_a_claim_no_class_can_serve_stays_pending_and_so_does_its_pod(two: SimHarness) -> None:
    sim = two
    sim.api.create_object("persistentvolumeclaims", claim("wide", mode="ReadWriteMany"), "default")  # block class
    sim.api.create_object("persistentvolumeclaims", claim("nowhere", storage_class="gone"), "default")
    make_pod(sim, "p", "wide", gpus=0)
    make_pod(sim, "q", "missing", gpus=0)
    sim.run(10)
    assert stored_claim(sim, "wide")["status"]["phase"] == "Pending"
    kind, reason, _, message = events(sim, "wide", "PersistentVolumeClaim")[-1]
    assert (kind, reason) == ("Warning", "ProvisioningFailed") and "ReadWriteMany not supported" in message
    assert ("Warning", "ProvisioningFailed", "persistentvolume-controller",
            'storageclass.storage.k8s.io "gone" not found') in events(sim, "nowhere", "PersistentVolumeClaim")
    assert node_of(sim, "p") is None and node_of(sim, "q") is None
    assert events(sim, "p")[-1][3].startswith("0/2 nodes are available: pod has unbound immediate "
                                              "PersistentVolumeClaims. preemption:")
    assert events(sim, "q")[-1][3].startswith('0/2 nodes are available: persistentvolumeclaim "missing" not found.')
    sim.api.create_object("persistentvolumeclaims", claim("missing"), "default")
    sim.run_until(lambda: ready(sim, "q"), limit=60)  # the claim appears: the pod is scheduled, it binds


def test_a_node_local_volume_keeps_its_pods_on_its_node(two: SimHarness) -> None:
    sim = two
    sim.api.create_object("storageclasses", {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                             "metadata": {"name": "local"}, "provisioner": NODE_LOCAL_PROVISIONER,
                                             "volumeBindingMode": "WaitForFirstConsumer"})
    sim.api.create_object("persistentvolumeclaims", claim("disk", storage_class="local"), "default")
    make_pod(sim, "first", "disk", node="gpu-l4-1")
    sim.run_until(lambda: ready(sim, "first"), limit=120)
    assert "SuccessfulAttachVolume" not in reasons(sim, "first")  # a local disk is not attached
    sim.api.delete_object("pods", "first", "default")
    make_pod(sim, "busy", None, node="gpu-l4-1")  # takes gpu-l4-1's only GPU
    sim.run(1)
    assert node_of(sim, "busy") == "gpu-l4-1"
    make_pod(sim, "again", "disk")  # fits gpu-l4-0 by its GPU, but the volume lives on gpu-l4-1
    sim.run(10)
    assert node_of(sim, "again") is None
    assert events(sim, "again")[-1][3] == (
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had volume node affinity conflict. "
        "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.")
    sim.api.delete_object("pods", "busy", "default")
    sim.run_until(lambda: ready(sim, "again"), limit=60)
    assert node_of(sim, "again") == "gpu-l4-1"


def deployment(name: str, claim_name: str, strategy: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": strategy},
                     "template": {"metadata": {"labels": labels, "annotations": {"edit": "1"}},
                                  "spec": pod_spec(claim_name)}}}


def deployment_pods(sim: SimHarness, name: str) -> list[dict[str, Any]]:
    return sim.api.list_objects("pods", "default", label_selector=f"app={name}")


def edit(sim: SimHarness, name: str) -> None:
    sim.api.patch_object("deployments", name, {"spec": {"template": {"metadata": {"annotations": {"edit": "2"}}}}},
                         "default")


def test_a_deployment_that_surges_with_a_read_write_once_claim_stalls(two: SimHarness) -> None:
    sim = two
    sim.api.create_object("persistentvolumeclaims", claim("cache"), "default")
    sim.api.create_object("deployments", deployment("web", "cache", {"maxSurge": 1, "maxUnavailable": 0}), "default")
    sim.run_until(lambda: [ready(sim, p["metadata"]["name"]) for p in deployment_pods(sim, "web")] == [True])
    old = deployment_pods(sim, "web")[0]["metadata"]["name"]
    edit(sim, "web")
    sim.run(300)
    pods = {p["metadata"]["name"]: p for p in deployment_pods(sim, "web")}
    surge = next(name for name in pods if name != old)
    assert set(pods) == {old, surge} and ready(sim, old)
    assert node_of(sim, surge) != node_of(sim, old)  # the old pod holds the only GPU of its node
    assert waiting(sim, surge) == "ContainerCreating"
    assert "FailedAttachVolume" in reasons(sim, surge) and "Started" not in reasons(sim, surge)
    assert sim.kubelet.errors == []


def test_a_deployment_that_rolls_without_a_surge_moves_its_read_write_once_claim(two: SimHarness) -> None:
    sim = two
    sim.api.create_object("persistentvolumeclaims", claim("cache"), "default")
    sim.api.create_object("deployments", deployment("web", "cache", {"maxSurge": 0, "maxUnavailable": 1}), "default")
    sim.run_until(lambda: [ready(sim, p["metadata"]["name"]) for p in deployment_pods(sim, "web")] == [True])
    old = deployment_pods(sim, "web")[0]["metadata"]["name"]
    edit(sim, "web")
    sim.run_until(lambda: [(p["metadata"]["name"] != old, ready(sim, p["metadata"]["name"]))
                           for p in deployment_pods(sim, "web")] == [(True, True)], limit=120)
    new = deployment_pods(sim, "web")[0]["metadata"]["name"]
    assert "FailedAttachVolume" not in reasons(sim, new)
    assert sim.kubelet.errors == []
