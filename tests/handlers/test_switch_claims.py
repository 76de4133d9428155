"""After a switch from a Deployment to a claim per pod (issue 25), the Deployment's own cache claim goes with it:
through the operator's handlers over the emulated API, a one-pod service (a Deployment with its claim
`<service>-model-cache`) scaled past its bounds moves to one-pod LeaderWorkerSet groups; once they take over, the
Deployment and its claim, which nothing mounts any more, are deleted — a claim the service does not own is not.

The test plays the Deployment and LeaderWorkerSet controllers (their status); the simulated ones are not part of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kit.inprocess import Cluster, harness_fixture  # noqa: F401 (`harness`)
from vllm_operator.handlers import lws

LWS_CRD = Path(__file__).resolve().parents[1] / "data" / "crds" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
NS = "default"


def _claims(h: Cluster) -> set[str]:
    return {c["metadata"]["name"] for c in h.server.list_objects("persistentvolumeclaims", NS)}


def test_the_deployments_own_claim_goes_when_the_switch_to_a_claim_per_pod_completes(harness: Cluster) -> None:
    h = harness
    crd = next(d for d in yaml.safe_load_all(LWS_CRD.read_text()) if d)
    h.server.create_object("customresourcedefinitions", crd)
    lws.forget()
    h.server.create_object("storageclasses", {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "x",
        "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}})
    h.add_node("l4-1", "NVIDIA-L4", count=2)
    h.create("solo", {"model": {"name": MODEL}, "gpu": {"product": "NVIDIA-L4"}})
    deployment = h.wait_for(lambda: h.deployment("solo"), message="the Deployment")
    h.wait_for(lambda: "solo-model-cache" in _claims(h) or None, message="the Deployment's own claim")
    # a claim of the same service's labels that the service does not own (no ownerReference): never deleted
    claim = h.server.get_object("persistentvolumeclaims", "solo-model-cache", NS)
    h.server.create_object("persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "not-owned", "namespace": NS, "labels": dict(claim["metadata"]["labels"])},
        "spec": claim["spec"]}, NS)
    n = deployment["spec"].get("replicas", 1)
    h.server.patch_status("deployments", "solo", {
        "observedGeneration": deployment["metadata"]["generation"], "replicas": n, "updatedReplicas": n,
        "readyReplicas": n, "availableReplicas": n}, NS)

    h.patch_spec("solo", {"replicas": 2})  # past its bounds: a claim per pod (one-pod groups, the LWS API served)
    group: dict[str, Any] = h.wait_for(lambda: h.server.get_object("leaderworkersets", "solo", NS),
                                       message="the LeaderWorkerSet")
    h.wait_settled("solo")
    assert h.deployment("solo") is not None and "solo-model-cache" in _claims(h)  # the Deployment still serves
    # play the LWS controller: one group ready, as many as the Deployment served (the other waits for its GPU)
    h.server.patch_status("leaderworkersets", "solo", {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 1}, NS)
    template = group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    labels = {**template["metadata"]["labels"], "leaderworkerset.sigs.k8s.io/name": "solo",
              "leaderworkerset.sigs.k8s.io/worker-index": "0", "leaderworkerset.sigs.k8s.io/group-index": "0"}
    h.server.create_object("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "solo-0", "namespace": NS, "labels": labels}, "spec": template["spec"]}, NS)
    h.server.patch_status("pods", "solo-0", {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}, NS)

    h.wait_for(lambda: h.deployment("solo") is None or None, message="the Deployment deleted")
    h.wait_for(lambda: "solo-model-cache" not in _claims(h) or None, message="the Deployment's claim deleted")
    assert "not-owned" in _claims(h)


def test_a_ladder_step_never_starts_a_workload_switch() -> None:
    """A step's render may name another workload kind than the one serving (an upgrade to a claim per pod whose
    switch the placement check holds): the step applies the rest, never the new workload — the reconcile starts a
    switch, through the hold. A step on the kind the status records applies it all."""
    from vllm_operator.handlers.remediation import no_switch

    claim = {"kind": "PersistentVolumeClaim", "metadata": {"name": "c"}}
    sts = {"kind": "StatefulSet", "metadata": {"name": "chat-set"}}
    service = {"kind": "Service", "metadata": {"name": "chat"}}
    held = {"status": {"workload": "Deployment"}}
    assert no_switch(held, [claim, sts, service]) == [claim, service]
    assert no_switch({"status": {"workload": "StatefulSet"}}, [claim, sts, service]) == [claim, sts, service]
    deployment = {"kind": "Deployment", "metadata": {"name": "chat"}}
    assert no_switch(held, [deployment, service]) == [deployment, service]
    assert no_switch({"status": {}}, [deployment, service]) == [deployment, service]  # before status.workload
