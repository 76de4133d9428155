"""render.lws: one LeaderWorkerSet for a plan that spans nodes, checked against the real LWS CRD schema, the
Kubernetes pod schema, and a golden file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kit.crds import crd_schema, unknown_fields
from vllm_operator.render.lws import (
    LWS_INSTALL_HINT,
    LWS_NAME_LABEL,
    LWS_WORKER_INDEX_LABEL,
    build_leader_service,
    build_leaderworkerset,
    build_multinode_children,
    multinode_supported,
    multinode_unsupported_reason,
    rank_args,
)
from vllm_operator.render.manifests import OwnerRef, RenderInput

GOLDEN = Path(__file__).resolve().parent / "data" / "lws-llama-405b-2x8.golden.yaml"
K8S_VERSION = "1.33"
FLAGS = {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "gpu_memory_utilization": 0.92,
         "max_model_len": 131072, "max_num_seqs": 330}


def _input(**changes: Any) -> RenderInput:
    base: dict[str, Any] = dict(
        name="llama-405b", namespace="serving", owner=OwnerRef(name="llama-405b",
                                                               uid="0b6c5c1e-1111-2222-3333-444455556666"),
        model="meta-llama/Llama-3.1-405B-Instruct", image="vllm/vllm-openai:v0.26.0", vllm_version="0.26.0",
        flags=dict(FLAGS), gpu_count=8, gpu_product_label="NVIDIA-H100-80GB-HBM3", weights_gib_total=756.0)
    base.update(changes)
    return RenderInput(**base)


def _container(template: dict[str, Any]) -> dict[str, Any]:
    return dict(template["spec"]["containers"][0])


def test_lws_validates_against_the_upstream_crd_schema_and_has_no_pruned_fields() -> None:
    lws = build_leaderworkerset(_input(), 2)
    schema = crd_schema("LeaderWorkerSet")
    jsonschema.validate(lws, schema)
    assert unknown_fields(lws["spec"], schema["properties"]["spec"], ".spec") == []


def test_pod_templates_are_valid_kubernetes_pods() -> None:
    lws = build_leaderworkerset(_input(), 2)
    for role in ("leaderTemplate", "workerTemplate"):
        template = lws["spec"]["leaderWorkerTemplate"][role]
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                      "template": template}, K8S_VERSION, strict=True)
    kubernetes_validate.validate(build_leader_service(_input()), K8S_VERSION, strict=True)


def test_group_shape_and_vllm_native_multinode_args() -> None:
    lws = build_leaderworkerset(_input(replicas=3), 2)
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and lws["kind"] == "LeaderWorkerSet"
    assert lws["spec"]["replicas"] == 3
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2
    assert lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = _container(lwt["leaderTemplate"]), _container(lwt["workerTemplate"])
    # the planned flags are identical on every rank; only the rank arguments differ
    n = len(rank_args(leader=True))
    assert leader["args"][:-n] == worker["args"][:-(n + 1)]
    planned = leader["args"][:-n]
    for flag, value in (("--tensor-parallel-size", "8"), ("--pipeline-parallel-size", "2"),
                        ("--max-model-len", "131072")):
        assert planned[planned.index(flag) + 1] == value
    assert leader["args"][-n:] == ["--distributed-executor-backend", "mp", "--nnodes", "$(LWS_GROUP_SIZE)",
                                   "--node-rank", "0", "--master-addr", "$(LWS_LEADER_ADDRESS)",
                                   "--master-port", "29501"]
    assert worker["args"][-(n + 1):] == ["--distributed-executor-backend", "mp", "--nnodes", "$(LWS_GROUP_SIZE)",
                                         "--node-rank", "$(LWS_WORKER_INDEX)", "--master-addr",
                                         "$(LWS_LEADER_ADDRESS)", "--master-port", "29501", "--headless"]
    assert "--headless" not in leader["args"]
    # all GPUs of the node on each pod, memory-backed /dev/shm, the GPU pool's nodeSelector on both
    for role in ("leaderTemplate", "workerTemplate"):
        spec = lwt[role]["spec"]
        c = spec["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
        shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory"
        assert spec["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}  # no IPC_LOCK without RDMA
        # host RAM for the node's half of the 756 GiB: ceil(378 * 1.2 + 4 * 8 + 2 * 8 + 2) = 504 GiB
        assert c["resources"]["limits"]["memory"] == "504Gi"
    # probes on the leader only: workers serve no HTTP
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(leader)
    assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports"} & set(worker)


def test_service_selects_the_leaders_only() -> None:
    service = build_leader_service(_input())
    assert service["spec"]["selector"] == {LWS_NAME_LABEL: "llama-405b", LWS_WORKER_INDEX_LABEL: "0"}
    kinds = [c["kind"] for c in build_multinode_children(_input(), 2)]
    assert kinds == ["LeaderWorkerSet", "Service"]


def test_one_node_is_never_a_leaderworkerset() -> None:
    with pytest.raises(ValueError, match="2 or more nodes"):
        build_leaderworkerset(_input(), 1)


def test_gate_is_the_first_release_with_the_flags() -> None:
    assert not multinode_supported("0.11.0")
    assert multinode_supported("0.11.1") and multinode_supported("0.26.0")
    assert "0.11.1" in multinode_unsupported_reason("0.10.2")
    assert "helm install lws oci://registry.k8s.io/lws/charts/lws --version=0.10.0" in LWS_INSTALL_HINT


def test_golden() -> None:
    """The whole rendered LWS, so that any change to it is seen in review (regenerate: UPDATE_GOLDEN=1)."""
    import os

    rendered = yaml.safe_dump(build_leaderworkerset(_input(), 2), sort_keys=True)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(rendered)
    assert rendered == GOLDEN.read_text()


def test_a_claim_per_pod_validates_and_replaces_the_shared_volume() -> None:
    """The model cache per pod (render/cache.py `_per_pod`): volumeClaimTemplates kept across group recreation and
    scale-down, deleted with the LWS; the pod templates carry no model-cache volume of their own (the group's
    StatefulSets add it), and vLLM's compile caches sit on that claim too."""
    template = {"metadata": {"name": "model-cache", "labels": {"app.kubernetes.io/component": "model-cache"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1145Gi"}}}}
    lws = build_leaderworkerset(_input(cache_claim_template=template, compile_cache=True, download_init=True), 2)
    schema = crd_schema("LeaderWorkerSet")
    jsonschema.validate(lws, schema)
    assert unknown_fields(lws["spec"], schema["properties"]["spec"], ".spec") == []
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["volumeClaimTemplates"] == [template]
    assert group["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    for role in ("leaderTemplate", "workerTemplate"):
        pod = group[role]["spec"]
        assert "model-cache" not in [v["name"] for v in pod["volumes"]]
        mounts = {m["name"]: m["mountPath"] for m in _container(group[role])["volumeMounts"]}
        env = {e["name"]: e.get("value") for e in _container(group[role])["env"]}
        assert env["VLLM_CACHE_ROOT"].startswith(mounts["model-cache"] + "/vllm-compile/0.26.0/")
        assert [c["name"] for c in pod["initContainers"]] == ["model-download"]
