"""Sharing one GPU (render/sharing.py): a DRA ResourceClaim per shared GPU that the members name, valid against the
Kubernetes 1.34 schemas; time-slicing pins members to one single-GPU node; neither is refused with what to install."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from vllm_operator.render.manifests import OwnerRef, RenderInput, build_deployment
from vllm_operator.render.sharing import (
    DRA_DEVICE_CLASS,
    POD_CLAIM_NAME,
    build_resource_claim,
    claim_name,
    on_time_sliced_node,
    sharing_support,
    time_slicing_nodes,
    with_claim,
)

K8S = "1.34"
UID = "0b6c5c1e-1111-2222-3333-444455556666"


def _deployment(name: str = "small") -> dict[str, Any]:
    return build_deployment(RenderInput(
        name=name, namespace="serving", owner=OwnerRef(name=name, uid=UID), model="Qwen/Qwen2.5-1.5B-Instruct",
        image="vllm/vllm-openai:v0.33.0", vllm_version="0.33.0", gpu_count=1, gpu_product_label="NVIDIA-L40S",
        flags={"tensor_parallel_size": 1, "gpu_memory_utilization": 0.2, "max_model_len": 8192},
        weights_gib_total=2.9))


def test_claim_and_members_validate_and_name_the_same_claim() -> None:
    owners = [OwnerRef(name=n, uid=UID).to_k8s() for n in ("a", "b")]
    claim = build_resource_claim(group="team", gpu_index=0, namespace="serving", owners=owners)
    kubernetes_validate.validate(claim, K8S, strict=True)
    request = claim["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == DRA_DEVICE_CLASS and request["exactly"]["count"] == 1
    assert [o["name"] for o in claim["metadata"]["ownerReferences"]] == ["a", "b"]
    assert claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["strategy"] == "TimeSlicing"
    for name in ("a", "b"):
        shared = with_claim(_deployment(name), group="team", gpu_index=0)
        kubernetes_validate.validate(shared, K8S, strict=True)
        pod = shared["spec"]["template"]["spec"]
        assert pod["resourceClaims"] == [{"name": POD_CLAIM_NAME, "resourceClaimName": claim["metadata"]["name"]}]
        container = pod["containers"][0]
        assert container["resources"]["claims"] == [{"name": POD_CLAIM_NAME}]
        assert "nvidia.com/gpu" not in container["resources"]["limits"]
        assert shared["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_claim_names_are_valid_and_distinct_for_hostile_group_names() -> None:
    names = {claim_name("Team_A" * 50, i) for i in range(3)} | {claim_name("team-a", 0)}
    assert len(names) == 4 and all(len(n) <= 253 for n in names)


def test_time_slicing_pins_every_member_to_one_single_gpu_node() -> None:
    shared = on_time_sliced_node(_deployment(), group="team", gpu_index=1, node="node-b")
    kubernetes_validate.validate(shared, K8S, strict=True)
    pod = shared["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["kubernetes.io/hostname"] == "node-b"
    assert "nvidia.com/gpu.product" not in pod["nodeSelector"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


SLICED = {"nvidia.com/gpu.product": "NVIDIA-L40S-SHARED", "nvidia.com/gpu.replicas": "4",
          "nvidia.com/gpu.count": "1", "nvidia.com/gpu.sharing-strategy": "time-slicing"}


@pytest.mark.parametrize(("dra", "classes", "nodes", "mode"), [
    (True, [DRA_DEVICE_CLASS], [], "dra"),
    (True, [], [("n1", SLICED)], "time-slicing"),
    (False, [DRA_DEVICE_CLASS], [("n1", SLICED)], "time-slicing"),
    (False, [], [("n1", {**SLICED, "nvidia.com/gpu.count": "2"})], None),  # two GPUs: replicas may differ
    (False, [], [("n1", {**SLICED, "nvidia.com/gpu.replicas": "1"})], None),
    (False, [], [("n1", {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "1"})], None),
])
def test_sharing_support(dra: bool, classes: list[str], nodes: list[tuple[str, dict[str, str]]],
                         mode: str | None) -> None:
    support = sharing_support(dra_served=dra, device_classes=classes, nodes=nodes, product="NVIDIA-L40S")
    assert support.mode == mode
    if mode is None:
        assert "k8s-dra-driver-gpu" in support.message and "time-slicing" in support.message
    if mode == "time-slicing":
        assert support.nodes == ["n1"] and "NOT isolated" in support.message


def test_time_slicing_nodes_keep_recorded_nodes_and_run_out() -> None:
    assert time_slicing_nodes(2, ["a", "b", "c"], {1: "c"}) == {0: "a", 1: "c"}
    assert time_slicing_nodes(2, ["a"], {}) is None
    assert time_slicing_nodes(1, ["b"], {0: "gone"}) == {0: "b"}
