"""A claim per pod for a service that may run several one-node pods on ReadWriteOnce-only storage (issue 25): the
shape decision (render/cache.py), the LeaderWorkerSet of one-pod groups it renders (render/lws.py), and what the
reconcile records (status.workload, status.selector, the Service's and autoscaler's targets)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from kit.crds import crd_schema, unknown_fields
from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.api import switch
from vllm_operator.render.cache import EPHEMERAL, MODEL_CACHE, PERSISTENT, CacheSettings, plan_cache
from vllm_operator.render.lws import LWS_NAME_LABEL, LWS_WORKER_INDEX_LABEL
from vllm_operator.render.pods import WORKLOAD_LABEL, serving_now
from vllm_operator.sources import load_model_files

QWEN = "Qwen/Qwen2.5-7B-Instruct"
L4 = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1"}
K8S_VERSION = "1.33"
SCALE_FROM_ZERO = {"engine": "KEDA", "minReplicas": 0, "maxReplicas": 2,
                   "prometheusAddress": "http://prometheus.monitoring:9090",
                   "activationQuery": 'sum(rate(gw_requests{svc="svc"}[1m]))'}


def run(spec: dict[str, Any], *, lws: bool | None = True, status: dict[str, Any] | None = None,
        shared_class: str | None = None, storage_class: str | None = "standard") -> reconcile.Desired:
    spec = {"model": {"name": QWEN}, "gpu": {"product": "NVIDIA-L4"}, **spec}
    return reconcile.desired_state(reconcile.Observed(
        name="svc", namespace="ns", uid="uid-svc", generation=1, spec=spec, status=status or {},
        now=datetime(2026, 1, 1, tzinfo=UTC), nodes=(L4,), model_files=load_model_files(QWEN, offline=True),
        cache_settings=CacheSettings(), default_storage_class=storage_class, shared_storage_class=shared_class,
        lws_installed=lws))


def kinds(desired: reconcile.Desired) -> dict[str, dict[str, Any]]:
    assert desired.children is not None
    return {c["kind"]: c for c in desired.children}


def cache_condition(desired: reconcile.Desired) -> tuple[str, str, str]:
    found = cond.find_condition(desired.status.conditions, MODEL_CACHE)
    assert found is not None
    return found.status, found.reason, found.message


def stored(desired: reconcile.Desired) -> dict[str, Any]:
    return desired.status.model_dump(by_alias=True, exclude_none=True)


def _plan(max_pods: int, *, lws_served: bool, group_pods: bool = False, shared: str | None = None) -> Any:
    return plan_cache(service="svc", namespace="ns", model=QWEN, revision=None, spec=None, settings=CacheSettings(),
                      default_storage_class="standard", checkpoint_gib=14.2, max_pods=max_pods, labels={"a": "b"},
                      owner={}, shared_storage_class=shared, group_pods=group_pods, lws_served=lws_served)


def test_the_shape_follows_what_the_service_may_become_and_what_the_cluster_offers() -> None:
    one = _plan(1, lws_served=True)
    assert one.claim is not None and one.claim_template is None and one.exclusive  # one pod: its own claim
    several = _plan(3, lws_served=True)
    assert several.persistent and several.claim is None and several.volume == {}
    assert several.claim_template is not None and several.claim_template["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "one-pod groups" in several.message and "3 pods" in several.message
    shared = _plan(3, lws_served=True, shared="nfs")  # a ReadWriteMany class wins: one claim for every pod
    assert shared.claim_template is None and shared.claim is not None
    assert shared.claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert several.per_pod_workload == "LeaderWorkerSet"
    # no LWS API, no RWX class: a claim per pod all the same, from a StatefulSet's volumeClaimTemplates
    nowhere = _plan(3, lws_served=False)
    assert nowhere.persistent and nowhere.reason == PERSISTENT and nowhere.volume == {} and nowhere.claim is None
    assert nowhere.per_pod_workload == "StatefulSet" and nowhere.claim_template == several.claim_template
    assert "StatefulSet" in nowhere.message and "kept when the service scales down" in nowhere.message
    assert "deleted with the service" in nowhere.message and "install" not in nowhere.message


@pytest.mark.parametrize("spec", [{"replicas": 2}, {"maxReplicas": 4},
                                  {"autoscaling": {"minReplicas": 1, "maxReplicas": 3}},
                                  {"autoscaling": SCALE_FROM_ZERO}])
def test_several_pods_on_read_write_once_storage_run_as_one_pod_groups(spec: dict[str, Any]) -> None:
    desired = run(spec)
    children = kinds(desired)
    assert "Deployment" not in children and "PersistentVolumeClaim" not in children
    lws = children["LeaderWorkerSet"]
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 1 and template["restartPolicy"] == "None"
    assert template["volumeClaimTemplates"][0]["metadata"]["name"] == "model-cache"
    assert template["volumeClaimTemplates"][0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert template["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    pod = template["leaderTemplate"]["spec"]
    args = next(c for c in pod["containers"] if c["name"] == "vllm")["args"]
    assert not {"--nnodes", "--node-rank", "--headless", "--master-addr"} & set(args), args
    assert all(v["name"] != "model-cache" for v in pod.get("volumes") or [])  # the claim template gives it
    assert WORKLOAD_LABEL not in template["leaderTemplate"]["metadata"]["labels"]
    assert [c["name"] for c in pod["initContainers"]][:1] == ["model-download"]  # a persistent cache is filled
    # the Service and the scale subresource's selector address the groups' pods (their leaders)
    selector = children["Service"]["spec"]["selector"]
    assert selector == {LWS_NAME_LABEL: lws["metadata"]["name"], LWS_WORKER_INDEX_LABEL: "0"}
    status = stored(desired)
    assert status["workload"] == "LeaderWorkerSet" and "multiNode" not in status
    assert status["selector"] == f"{LWS_NAME_LABEL}={lws['metadata']['name']},{LWS_WORKER_INDEX_LABEL}=0"
    assert switch.target_kind(status) == "LeaderWorkerSet"
    assert serving_now("svc", "ns", status).shape == "LeaderWorkerSet"
    assert cache_condition(desired)[:2] == (cond.TRUE, PERSISTENT)
    for autoscaler in ("HorizontalPodAutoscaler", "ScaledObject"):  # they scale the VLLMService (its /scale)
        if autoscaler in children:
            assert children[autoscaler]["spec"]["scaleTargetRef"]["kind"] == "VLLMService"


def test_one_pod_groups_validate_against_the_upstream_schemas() -> None:
    children = kinds(run({"replicas": 2}))
    lws = children["LeaderWorkerSet"]
    schema = crd_schema("LeaderWorkerSet")
    jsonschema.validate(lws, schema)
    assert unknown_fields(lws["spec"], schema["properties"]["spec"], ".spec") == []
    for role in ("leaderTemplate", "workerTemplate"):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                      "template": lws["spec"]["leaderWorkerTemplate"][role]}, K8S_VERSION, strict=True)
    kubernetes_validate.validate(children["Service"], K8S_VERSION, strict=True)


def _lws_template(desired: reconcile.Desired) -> str:
    return json.dumps(kinds(desired)["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"], sort_keys=True)


@pytest.mark.parametrize("bounds", [{"maxReplicas": 3}, {"autoscaling": {"minReplicas": 1, "maxReplicas": 3}}])
def test_scaling_within_the_bounds_never_changes_the_template(bounds: dict[str, Any]) -> None:
    """The scale subresource (an HPA, KEDA, `kubectl scale`) writes spec.replicas 1 → 2 → 1: the groups follow,
    the LeaderWorkerSet's templates stay byte for byte the same (no rollout; each pod keeps its own claim)."""
    status: dict[str, Any] = {}
    templates, replicas = [], []
    for count in (1, 2, 1):
        desired = run({**bounds, "replicas": count}, status=status)
        templates.append(_lws_template(desired))
        replicas.append(kinds(desired)["LeaderWorkerSet"]["spec"]["replicas"])
        status = stored(desired)
    assert replicas == [1, 2, 1]
    assert templates[0] == templates[1] == templates[2]


def test_a_one_pod_service_scaled_past_its_bounds_switches_once_and_stays() -> None:
    """A plain one-replica service is a Deployment with its own claim; `kubectl scale --replicas=3` makes it a
    service of several pods: one switch to one-pod groups (recorded, make before break), which a scale back to 1
    keeps (status.modelCache.shapePods)."""
    one = run({})
    assert "Deployment" in kinds(one) and stored(one)["workload"] == "Deployment"
    three = run({"replicas": 3}, status=stored(one))
    assert "LeaderWorkerSet" in kinds(three) and stored(three)["modelCache"]["shapePods"] == 3
    back = run({"replicas": 1}, status=stored(three))
    assert "Deployment" not in kinds(back) and kinds(back)["LeaderWorkerSet"]["spec"]["replicas"] == 1
    assert _lws_template(back) == _lws_template(three)


def test_without_the_lws_api_several_pods_get_a_claim_each_from_a_statefulset() -> None:
    for lws in (False, None):  # not served, or not asked
        desired = run({"replicas": 2}, lws=lws)
        assert "Deployment" not in kinds(desired) and "LeaderWorkerSet" not in kinds(desired)
        assert "StatefulSet" in kinds(desired) and stored(desired)["workload"] == "StatefulSet"
        status, reason, message = cache_condition(desired)
        assert (status, reason) == (cond.TRUE, PERSISTENT) and "StatefulSet" in message


def test_the_empty_dir_is_left_for_no_storage_class_or_the_ephemeral_mode() -> None:
    """The issue allows an emptyDir only when asked for or without a StorageClass; its message no longer points at
    LeaderWorkerSet for a claim per pod."""
    for desired in (run({"replicas": 2}, lws=False, storage_class=None),
                    run({"replicas": 2}, lws=True, storage_class=None)):
        assert "Deployment" in kinds(desired) and stored(desired)["workload"] == "Deployment"
        status, reason, message = cache_condition(desired)
        assert (status, reason) == (cond.FALSE, EPHEMERAL) and "no default StorageClass" in message
        assert "LeaderWorkerSet" not in message


def test_a_read_write_many_class_keeps_a_deployment() -> None:
    desired = run({"replicas": 2}, shared_class="nfs-client")
    assert "Deployment" in kinds(desired) and "LeaderWorkerSet" not in kinds(desired)
    assert stored(desired)["workload"] == "Deployment"


def test_the_shell_asks_for_the_lws_api_when_the_service_may_run_several_pods() -> None:
    def wants(spec: dict[str, Any], status: dict[str, Any] | None = None) -> bool:
        observed = reconcile.Observed(name="svc", namespace="ns", uid="u", generation=1,
                                      spec={"model": {"name": QWEN}, **spec}, status=status or {},
                                      now=datetime(2026, 1, 1, tzinfo=UTC))
        found = reconcile.wants(observed)
        assert found is not None
        return found.lws

    assert not wants({})
    assert wants({"replicas": 2}) and wants({"autoscaling": SCALE_FROM_ZERO})
    assert wants({}, {"modelCache": {"shapePods": 2}})


def test_a_status_without_the_workload_field_reads_as_before() -> None:
    assert switch.target_kind({"multiNode": {"nodes": 2}}) == "LeaderWorkerSet"
    assert switch.target_kind({}) == "Deployment"
    assert switch.target_kind({"workload": "LeaderWorkerSet"}) == "LeaderWorkerSet"
    assert switch.target_kind({"workload": "Something"}) == "Deployment"


def _workload(kind: str, replicas: int, ready: int, updated: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"readyReplicas": ready}
    if updated is not None:
        status["updatedReplicas"] = updated
    return {"kind": kind, "metadata": {"generation": 1}, "spec": {"replicas": replicas},
            "status": {**status, "observedGeneration": 1}}


def test_a_switch_target_takes_over_when_it_serves_no_less_than_the_previous_workload() -> None:
    from vllm_operator.handlers.effects import takes_over

    deployment = _workload("Deployment", 1, 1)
    assert takes_over(_workload("LeaderWorkerSet", 2, 2), deployment)  # all of it
    # the previous pod holds the GPU the second group needs: one ready group serves as much as the one pod did
    assert takes_over(_workload("LeaderWorkerSet", 2, 1), deployment)
    assert not takes_over(_workload("LeaderWorkerSet", 2, 0), deployment)
    assert not takes_over(_workload("LeaderWorkerSet", 3, 1), _workload("Deployment", 2, 2))  # less than before
    assert not takes_over(_workload("LeaderWorkerSet", 2, 1, updated=0), deployment)  # not its current revision
    assert not takes_over(None, deployment)
    assert takes_over(_workload("LeaderWorkerSet", 2, 1), None) and not takes_over(
        _workload("LeaderWorkerSet", 2, 0), None)
