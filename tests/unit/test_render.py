"""The manifest renderer (pure): valid Kubernetes objects built as data (no spec string becomes structure), names
valid for their kind, least-privilege pods, secrets by reference, stable hashes, host memory from the weights, and
vLLM arguments valid for the image's release."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
import pytest

from kit.specs import FULL_AFFINITY
from vllm_operator import reconcile
from vllm_operator.render import manifests, names
from vllm_operator.render.manifests import (
    ANNOTATION_SPEC_HASH,
    OwnerRef,
    RenderInput,
    build_cache_pvc,
    build_children,
    build_deployment,
    build_service,
    child_names,
    host_memory_gib,
    render_args,
)
from vllm_operator.sources import load_model_files

K8S_VERSION = "1.33"
NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
L4_NODE = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "2"}
FLAGS = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 16}


def _input(**changes: Any) -> RenderInput:
    base: dict[str, Any] = dict(
        name="llama", namespace="serving", owner=OwnerRef(name="llama", uid="0b6c5c1e-1111-2222-3333-444455556666"),
        model="meta-llama/Llama-3.1-8B-Instruct", image="vllm/vllm-openai:v0.26.0", vllm_version="0.26.0",
        flags=dict(FLAGS), gpu_count=1, gpu_product_label="NVIDIA-L4", weights_gib_total=14.96)
    base.update(changes)
    return RenderInput(**base)


def _children(spec: dict[str, Any], nodes: tuple[dict[str, str], ...] = (L4_NODE,)) -> list[dict[str, Any]]:
    """Children rendered by the pure core for a spec, as the operator would write them."""
    files = load_model_files(spec["model"]["name"], offline=True)
    observed = reconcile.Observed(name="svc", namespace="serving", uid="0b6c5c1e-1111-2222-3333-444455556666",
                                  generation=1, spec=spec, status={}, now=NOW, nodes=nodes, model_files=files)
    desired = reconcile.desired_state(observed)
    assert desired.children is not None, desired.status.conditions
    return desired.children


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


SPECS = {
    "minimal": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}},
    "tp2": {"model": {"name": "Qwen/Qwen2.5-14B-Instruct"}},
    "pvc-cache-and-token": {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "revision": "main", "servedName": "llama"},
        "hfTokenSecretRef": {"name": "hf-token", "key": "token"},
        "modelCache": {"size": "200Gi", "storageClassName": "fast"},
        "flags": {"maxModelLen": 8192, "gpuMemoryUtilization": 0.85, "enablePrefixCaching": False},
        "extraArgs": ["--disable-log-stats"],
        "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
        "resources": {"memory": "64Gi", "cpu": "8", "shmSize": "8Gi"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
        "service": {"type": "LoadBalancer", "port": 80},
    },
    "existing-claim-old-image": {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "image": "vllm/vllm-openai:v0.4.2",
        "modelCache": {"claimName": "models"}, "nodeSelector": {"pool": "inference"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
    },
    "every-affinity-block": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "affinity": FULL_AFFINITY},
    # two pods on a sized ReadWriteOnce cache: a claim per pod, a StatefulSet (no LeaderWorkerSet API observed)
    "sized-cache-two-replicas": {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "replicas": 2,
        "modelCache": {"size": "200Gi", "storageClassName": "fast"},
    },
}


# --- official Kubernetes schemas -------------------------------------------------------------------

@pytest.mark.parametrize("case", list(SPECS))
def test_rendered_children_validate_against_kubernetes_schemas(case: str) -> None:
    children = _children(SPECS[case])
    kinds = [c["kind"] for c in children]
    assert ("StatefulSet" if case == "sized-cache-two-replicas" else "Deployment") in kinds and "Service" in kinds
    for child in children:
        kubernetes_validate.validate(child, K8S_VERSION, strict=True)


@pytest.mark.parametrize("case", ["existing-claim-old-image", "every-affinity-block"])
def test_affinity_renders_exactly_as_given(case: str) -> None:
    deployment = next(c for c in _children(SPECS[case]) if c["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["affinity"] == SPECS[case]["affinity"]


def test_tp2_deployment_asks_for_two_gpus_and_more_shm() -> None:
    deployment = next(c for c in _children(SPECS["tp2"]) if c["kind"] == "Deployment")
    vllm = _container(deployment)
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert vllm["args"][vllm["args"].index("--tensor-parallel-size") + 1] == "2"
    shm = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}


def test_pvc_cache_is_created_and_mounted() -> None:
    children = _children(SPECS["pvc-cache-and-token"])
    assert [c["kind"] for c in children] == ["PersistentVolumeClaim", "Deployment", "Service"]
    pvc, deployment, _ = children
    assert pvc["metadata"]["name"] == "svc-model-cache"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "200Gi"
    assert pvc["spec"]["storageClassName"] == "fast"
    assert pvc["metadata"]["ownerReferences"][0]["uid"] == "0b6c5c1e-1111-2222-3333-444455556666"
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "model-cache")
    assert volume == {"name": "model-cache", "persistentVolumeClaim": {"claimName": "svc-model-cache"}}
    existing = _children(SPECS["existing-claim-old-image"])
    assert [c["kind"] for c in existing] == ["Deployment", "Service"]  # an existing claim is used, not created


def test_build_functions_validate_directly() -> None:
    inp = _input(gpu_count=4, flags={**FLAGS, "tensor_parallel_size": 4}, hf_token_secret="hf",
                 cache_claim="cache", cache_create=True, cache_storage_class="standard")
    pvc = build_cache_pvc(inp)
    assert pvc is not None
    for obj in (build_deployment(inp), build_service(inp), pvc):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert build_cache_pvc(_input()) is None


# --- manifests are data ------------------------------------------------------------------------------

INJECTIONS = [
    "x\nprivileged: true",
    "x\n    securityContext: {privileged: true, capabilities: {add: [SYS_ADMIN]}}",
    "x\nhostPID: true\nhostNetwork: true",
    "}: {hostPID: true",
    "'; hostNetwork: true; '",
    "&anchor x",
    "{{ 7*7 }}",
    "\u2028hostPID: true",
]


def _keys(obj: Any, path: str = "") -> set[str]:
    if isinstance(obj, dict):
        out = set()
        for key, value in obj.items():
            out.add(f"{path}.{key}")
            out |= _keys(value, f"{path}.{key}")
        return out
    if isinstance(obj, list):
        return set().union(*(_keys(v, f"{path}[]") for v in obj)) if obj else set()
    return set()


@pytest.mark.parametrize("payload", INJECTIONS)
def test_no_string_becomes_structure(payload: str) -> None:
    """Every string field of the render input carries an injection payload: the objects keep exactly the keys of
    a plain rendering, and the payload is there as a literal value."""
    def render(value: str) -> list[dict[str, Any]]:
        return build_children(_input(
            image=value, model=value, served_name=value, revision=value, cache_claim=value,
            cache_create=True, cache_storage_class=value, cache_mount_path="/" + value, cache_size=value,
            memory=value, cpu=value, shm_size=value, extra_args=(value,), hf_token_secret=value,
            hf_token_key=value, node_selector={"pool": value}, env=({"name": "X", "value": value},)))

    plain, hostile = render("benign"), render(payload)
    assert [c["kind"] for c in hostile] == [c["kind"] for c in plain]
    for before, after in zip(plain, hostile, strict=True):
        assert _keys(after) == _keys(before), after["kind"]
    pod = hostile[1]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == payload
    assert payload in pod["containers"][0]["args"]
    assert "hostPID" not in pod and "hostNetwork" not in pod
    assert pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize(("name", "service"), [
    ("017", "v017-"),
    ("yes", "yes"),
    ("true", "true"),
    ("a.b", "a-b-"),
    ("x" * 63, "x" * 63),
])
def test_names_are_strings_valid_for_their_kind(name: str, service: str) -> None:
    children = build_children(_input(name=name, owner=OwnerRef(name=name, uid="u")))
    deployment, svc = children
    assert isinstance(deployment["metadata"]["name"], str) and isinstance(svc["metadata"]["name"], str)
    assert svc["metadata"]["name"].startswith(service) and len(svc["metadata"]["name"]) <= 63
    assert names._DNS1035_LABEL.fullmatch(svc["metadata"]["name"])
    assert names.is_dns1123_subdomain(deployment["metadata"]["name"])
    for child in children:
        kubernetes_validate.validate(child, K8S_VERSION, strict=True)
        assert all(isinstance(v, str) and len(v) <= 63 for v in child["metadata"]["labels"].values())
    assert child_names(name) == child_names(name)  # stable


def test_shortened_names_keep_distinct_services_apart() -> None:
    a, b = "a" * 70 + "1", "a" * 70 + "2"
    assert manifests.dns1035_label(a) != manifests.dns1035_label(b)
    assert len(manifests.label_value(a)) <= 63 and manifests.label_value(a) != manifests.label_value(b)
    assert manifests.dns1123_subdomain("Bad_Name..x") == manifests.dns1123_subdomain("Bad_Name..x")
    assert names.is_dns1123_subdomain(manifests.dns1123_subdomain("Bad_Name..x"))


def test_numbers_stay_in_kubernetes_ranges() -> None:
    deployment = build_deployment(_input(weights_gib_total=1e12, replicas=2**40))
    assert deployment["spec"]["replicas"] == 2**31 - 1
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["failureThreshold"] <= 2**31 - 1
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


# --- least privilege -----------------------------------------------------------------------------------

def test_vllm_pod_runs_with_least_privilege_by_default() -> None:
    pod = build_deployment(_input())["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    vllm = pod["containers"][0]["securityContext"]
    assert vllm["allowPrivilegeEscalation"] is False and vllm["privileged"] is False
    assert vllm["capabilities"] == {"drop": ["ALL"]}
    assert vllm["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"hostPID", "hostNetwork", "hostIPC", "serviceAccountName"} & set(pod)
    assert all("hostPath" not in v for v in pod["volumes"])


def test_restricted_profile_runs_as_a_numeric_non_root_user_with_writable_caches() -> None:
    deployment = build_deployment(_input(security_profile="restricted", run_as_user=2000))
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 2000
    assert pod["securityContext"]["fsGroup"] == 2000
    vllm = pod["containers"][0]
    assert vllm["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    mounts = {m["mountPath"]: m["name"] for m in vllm["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for variable in ("HOME", "HF_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT",
                     "XDG_CACHE_HOME", "TMPDIR"):
        path = env[variable]
        assert path is not None
        mount = next(m for m in sorted(mounts, key=len, reverse=True) if path == m or path.startswith(m + "/"))
        assert "emptyDir" in volumes[mounts[mount]] or "persistentVolumeClaim" in volumes[mounts[mount]], variable
    assert env["HF_HOME"] == "/home/vllm/.cache/huggingface"  # /root is not traversable by a non-root user
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


# --- secrets ----------------------------------------------------------------------------------------

def test_hf_token_only_as_a_secret_key_ref() -> None:
    deployment = next(c for c in _children(SPECS["pvc-cache-and-token"]) if c["kind"] == "Deployment")
    vllm = _container(deployment)
    token_env = [e for e in vllm["env"] if e["name"] == "HF_TOKEN"]
    assert token_env == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "hf-token", "key": "token", "optional": False}}}]
    assert not any("token" in a.lower() for a in vllm["args"] + vllm["command"])
    literal = [e for e in vllm["env"] if "value" in e and "token" in e["name"].lower()]
    assert literal == []
    no_token = _container(next(c for c in _children(SPECS["minimal"]) if c["kind"] == "Deployment"))
    assert [e["name"] for e in no_token["env"]] == ["HF_HOME"]


# --- spec-hash annotation ---------------------------------------------------------------------------

def test_spec_hash_is_stable_and_follows_the_args() -> None:
    first, again = build_deployment(_input()), build_deployment(_input())
    assert first == again
    digest = first["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
    assert len(digest) == 16
    changed = build_deployment(_input(flags={**FLAGS, "max_model_len": 4096}))
    assert changed["metadata"]["annotations"][ANNOTATION_SPEC_HASH] != digest
    assert build_service(_input())["metadata"]["annotations"][ANNOTATION_SPEC_HASH] == \
        build_service(_input(flags={**FLAGS, "max_model_len": 4096}))["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)


# --- host memory -------------------------------------------------------------------------------------

def test_host_memory_is_sized_from_the_weights() -> None:
    assert host_memory_gib(14.96, 1) == 26  # ceil(14.96 * 1.2 + 4 + 2 + 2)
    assert host_memory_gib(130.0, 4) > host_memory_gib(14.96, 1) + 100
    small = _container(build_deployment(_input(weights_gib_total=1.0)))
    big = _container(build_deployment(_input(weights_gib_total=65.0, gpu_count=2)))
    assert small["resources"]["limits"]["memory"] == f"{host_memory_gib(1.0, 1)}Gi"
    assert big["resources"]["limits"]["memory"] == f"{host_memory_gib(65.0, 2)}Gi"
    assert big["resources"]["requests"]["memory"] == big["resources"]["limits"]["memory"]
    pinned = _container(build_deployment(_input(memory="48Gi")))
    assert pinned["resources"]["limits"]["memory"] == "48Gi"


def test_startup_probe_allows_for_bigger_downloads() -> None:
    small = _container(build_deployment(_input(weights_gib_total=1.0)))["startupProbe"]["failureThreshold"]
    big = _container(build_deployment(_input(weights_gib_total=130.0)))["startupProbe"]["failureThreshold"]
    assert big > small >= 60


# --- vLLM arguments per release -----------------------------------------------------------------------

def test_render_args_drops_flags_the_release_lacks() -> None:
    flags = {"gpu_memory_utilization": 0.9, "kv_cache_memory_bytes": 2**30, "swap_space": 4}
    args, dropped = render_args(flags, "0.10.0")
    assert "--kv-cache-memory-bytes" not in args and "--swap-space" in args
    assert dropped == ["--kv-cache-memory-bytes does not exist before vLLM 0.11.0 (image is 0.10.0)"]
    args, dropped = render_args(flags, "0.18.0")
    assert "--swap-space" not in args and args[-2:] == ["--kv-cache-memory-bytes", str(2**30)]
    assert dropped == ["--swap-space was removed in vLLM 0.18.0 (image is 0.18.0)"]


def test_render_args_booleans_by_release() -> None:
    assert render_args({"enable_prefix_caching": True}, "0.4.0")[0] == ["--enable-prefix-caching"]
    assert render_args({"enable_prefix_caching": False}, "0.8.0")[0] == ["--no-enable-prefix-caching"]
    args, dropped = render_args({"enable_prefix_caching": False}, "0.6.0", ("enable_prefix_caching",))
    assert args == [] and len(dropped) == 1
    assert render_args({"enable_prefix_caching": False}, "0.6.0")[1] == []  # unpinned: silently default
    assert render_args({"max_model_len": None, "max_num_seqs": 8}, "0.26.0")[0] == ["--max-num-seqs", "8"]


@pytest.mark.parametrize(("version", "command", "model_first"), [
    ("0.4.3", ["python3", "-m", "vllm.entrypoints.openai.api_server"], False),
    ("0.5.0", ["vllm", "serve"], True),
    ("0.26.0", ["vllm", "serve"], True),
])
def test_serve_command_by_release(version: str, command: list[str], model_first: bool) -> None:
    vllm = _container(build_deployment(_input(vllm_version=version, image=f"vllm/vllm-openai:v{version}")))
    assert vllm["command"] == command
    if model_first:
        assert vllm["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    else:
        assert vllm["args"][:2] == ["--model", "meta-llama/Llama-3.1-8B-Instruct"]


def test_old_image_renders_the_module_entrypoint_end_to_end() -> None:
    deployment = next(c for c in _children(SPECS["existing-claim-old-image"]) if c["kind"] == "Deployment")
    vllm = _container(deployment)
    assert vllm["image"] == "vllm/vllm-openai:v0.4.2"
    assert vllm["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {
        "pool": "inference", "nvidia.com/gpu.product": "NVIDIA-L4"}


def test_labels_selectors_and_owner() -> None:
    deployment, service = build_deployment(_input()), build_service(_input())
    owner = deployment["metadata"]["ownerReferences"]
    assert owner == [{"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService", "name": "llama",
                      "uid": "0b6c5c1e-1111-2222-3333-444455556666", "controller": True,
                      "blockOwnerDeletion": True}]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    # the Service selects the Deployment's pods: its selector and the label only a Deployment's pods carry
    assert service["spec"]["selector"] == {**deployment["spec"]["selector"]["matchLabels"],
                                           "vllm-operator.dev/workload": "deployment"}
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert build_children(_input())[0]["kind"] == "Deployment"


def test_a_sized_cache_of_two_pods_is_a_claim_per_pod_of_that_size() -> None:
    children = _children(SPECS["sized-cache-two-replicas"])
    assert [c["kind"] for c in children] == ["StatefulSet", "Service"]  # no shared ReadWriteOnce claim
    (template,) = children[0]["spec"]["volumeClaimTemplates"]
    assert template["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert template["spec"]["resources"]["requests"]["storage"] == "200Gi"
    assert template["spec"]["storageClassName"] == "fast"
