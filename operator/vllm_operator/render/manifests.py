"""Kubernetes manifests for one VLLMService, built as Python data from typed inputs.

Pure: `build_*` functions return dicts; nothing here talks to the API. No text templating: every value a user wrote
lands in a dict as a string (or a number the spec bounded), so no spec string can add a key, change a type or break
the document. Names of children are valid for their kind (`child_names`); numbers stay in Kubernetes' ranges.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..api.flags import vllm_cli_flag, vllm_cli_negation
from ..api.labels import (
    ANNOTATION_PLAN as ANNOTATION_PLAN,  # re-exported: handlers and tests import them here
)
from ..api.labels import ANNOTATION_SPEC_HASH as ANNOTATION_SPEC_HASH
from ..api.labels import ANNOTATION_VLLM_VERSION as ANNOTATION_VLLM_VERSION
from ..api.labels import LABEL_SERVICE as LABEL_SERVICE
from ..api.labels import MANAGED_BY as MANAGED_BY
from ..planner.versions import version_from_image
from .cache import build_download_container
from .coldstart import compile_cache_root
from .flags import flag_table
from .names import dns1035_label, dns1123_subdomain, label_value
from .pods import ServingPods, deployment_name, deployment_pod_labels, instance_selector, serving_pods

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
DEFAULT_PORT = 8000
DEFAULT_CACHE_MOUNT_PATH = "/root/.cache/huggingface"
#: The restricted profile's user and its writable home (an emptyDir): HOME, caches and /tmp live on volumes.
RESTRICTED_UID = 1000
RESTRICTED_HOME = "/home/vllm"
INT32_MAX = 2**31 - 1



class OwnerRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    api_version: str = "vllm-operator.dev/v1alpha1"
    kind: str = "VLLMService"
    name: str
    uid: str

    def to_k8s(self) -> dict[str, Any]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid,
                "controller": True, "blockOwnerDeletion": True}


class RenderInput(BaseModel):
    """Everything the manifests need, already decided (plan, GPU, user settings)."""

    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    owner: OwnerRef
    model: str
    revision: str | None = None
    served_name: str | None = None
    image: str
    image_pull_policy: str = "IfNotPresent"
    vllm_version: str
    flags: dict[str, Any] = Field(description="planned + pinned vLLM flags, snake_case")
    pinned: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()
    gpu_count: int = 1
    gpu_product_label: str | None = None
    weights_gib_total: float = Field(0.0, description="checkpoint size; host RAM passes it while loading")
    replicas: int = 1
    node_selector: dict[str, str] = {}
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] | None = None
    env: tuple[dict[str, Any], ...] = ()
    hf_token_secret: str | None = None
    hf_token_key: str = "HF_TOKEN"
    cache_claim: str | None = None
    cache_create: bool = False
    cache_size: str = "100Gi"
    cache_storage_class: str | None = None
    cache_mount_path: str = "/root/.cache/huggingface"
    cache_volume: dict[str, Any] | None = Field(None, description="the model-cache volume source (render/cache.py)")
    cache_claim_template: dict[str, Any] | None = Field(
        None, description="a model-cache claim per pod (the workload's volumeClaimTemplates; render/cache.py)")
    per_pod_workload: Literal["LeaderWorkerSet", "StatefulSet"] = Field(
        "LeaderWorkerSet", description="with `cache_claim_template` and one-node pods, the workload that gives each "
                                       "pod its claim (render/cache.py)")
    roll_without_surge: bool = Field(False, description="a ReadWriteOnce cache: one pod at a time")
    download_init: bool = Field(False, description="fill the cache with the model-download init container first")
    compile_cache: bool = Field(False, description="keep vLLM's compile and CUDA-graph caches on the persistent "
                                                   "model cache (per vLLM release and GPU)")
    startup_failure_threshold: int | None = Field(None, description="startup probe periods (render/cache.py)")
    memory: str | None = Field(None, description="host memory override (request = limit)")
    cpu: str | None = None
    shm_size: str | None = None
    service_type: str = "ClusterIP"
    service_port: int = DEFAULT_PORT
    trust_remote_code: bool = False
    security_profile: Literal["baseline", "restricted"] = Field(
        "baseline", description="baseline: least privilege as root; restricted: also a numeric non-root user")
    run_as_user: int = Field(RESTRICTED_UID, ge=1, le=2**31 - 1)


class ChildNames(BaseModel):
    """The names of one VLLMService's children, each valid for its kind."""

    model_config = ConfigDict(frozen=True)

    deployment: str
    service: str
    label: str = Field(description="the value of the instance/service labels (label values are at most 63 chars)")


def child_names(name: str) -> ChildNames:
    """Deployment: the service's own name when it is a valid DNS-1123 label (the pods' names derive from it);
    Service: a DNS-1035 label; labels: a label value. Each is the name itself when valid, else shortened with a
    stable hash (see `dns1035_label`)."""
    return ChildNames(deployment=deployment_name(name), service=dns1035_label(name), label=label_value(name))


def labels_for(name: str) -> dict[str, str]:
    value = label_value(name)
    return {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": value,
        "app.kubernetes.io/component": "server",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_SERVICE: value,
    }


def selector_for(name: str) -> dict[str, str]:
    """Every pod of the service, of any workload (`render.pods.instance_selector`); the serving pods are
    `render.pods.serving_pods`."""
    return instance_selector(name)


def spec_hash(obj: Any) -> str:
    """A short stable hash of anything JSON-serialisable (sorted keys)."""
    payload = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def render_args(flags: dict[str, Any], version: str, pinned: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """vLLM arguments valid for `version`, and the sentences saying what was dropped and why.

    Pinned flags the release lacks must be rejected earlier (see `unsupported_pinned`); here they are dropped too,
    so a rendered pod never carries an argument its vLLM would refuse.
    """
    table = flag_table()
    args: list[str] = []
    dropped: list[str] = []
    for name, value in flags.items():
        if value is None:
            continue
        if not table.supports(name, version):
            dropped.append(table.unsupported_reason(name, version))
            continue
        flag = vllm_cli_flag(name)
        if isinstance(value, bool):
            if value:
                args.append(flag)
            elif table.can_negate(name, version):
                args.append(vllm_cli_negation(name))
            elif name in pinned:
                dropped.append(f"{flag}=false is vLLM's default before 0.8; not passed")
        elif isinstance(value, (list, tuple)):  # nargs='+' options (--lora-modules name=source ...)
            if value:
                args.extend([flag, *(str(v) for v in value)])
        else:
            args.extend([flag, str(value)])
    return args, dropped


def unsupported_pinned(flags: dict[str, Any], version: str) -> list[tuple[str, str]]:
    """Pinned flags that do not exist in the image's vLLM release: (flag name, reason)."""
    table = flag_table()
    return [(name, table.unsupported_reason(name, version))
            for name, value in flags.items() if value is not None and not table.supports(name, version)]


def host_memory_gib(weights_gib_total: float, gpu_count: int) -> int:
    """Host RAM for the vLLM container: the weights pass through it while loading, plus each worker's runtime
    (Python, torch, CUDA libraries: ~4 GiB each) and /dev/shm for tensor parallelism."""
    return int(math.ceil(weights_gib_total * 1.2 + 4 * gpu_count + _shm_gib(gpu_count) + 2))


def _shm_gib(gpu_count: int) -> int:
    return 2 if gpu_count <= 1 else 2 * gpu_count


def _startup_failures(weights_gib_total: float) -> int:
    """Startup probe budget in 10 s periods: 10 min, plus 1 min per 10 GiB of weights to download and load."""
    return int(60 + 6 * math.ceil(weights_gib_total / 10))


def _security(inp: RenderInput) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod securityContext, container securityContext): least privilege by default (Pod Security *baseline*
    plus the *restricted* checks that do not need a user id); `restricted` also runs as a numeric non-root user."""
    pod: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    container: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if inp.security_profile == "restricted":
        pod.update({"runAsNonRoot": True, "runAsUser": inp.run_as_user, "runAsGroup": inp.run_as_user,
                    "fsGroup": inp.run_as_user})
        container.update({"runAsNonRoot": True, "runAsUser": inp.run_as_user, "runAsGroup": inp.run_as_user})
    return pod, container


def cache_mount_path(inp: RenderInput) -> str:
    """Where the Hugging Face cache is mounted: under the writable home in the restricted profile unless the user
    chose a path (a non-root user cannot traverse /root)."""
    if inp.security_profile == "restricted" and inp.cache_mount_path == DEFAULT_CACHE_MOUNT_PATH:
        return f"{RESTRICTED_HOME}/.cache/huggingface"
    return inp.cache_mount_path


def _restricted_env() -> list[dict[str, Any]]:
    """HOME and every cache vLLM, torch and Triton write, on the writable home volume; temp files on /tmp."""
    return [
        {"name": "HOME", "value": RESTRICTED_HOME},
        {"name": "XDG_CACHE_HOME", "value": f"{RESTRICTED_HOME}/.cache"},
        {"name": "VLLM_CACHE_ROOT", "value": f"{RESTRICTED_HOME}/.cache/vllm"},
        {"name": "TRITON_CACHE_DIR", "value": f"{RESTRICTED_HOME}/.triton"},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{RESTRICTED_HOME}/.cache/torchinductor"},
        {"name": "NUMBA_CACHE_DIR", "value": f"{RESTRICTED_HOME}/.cache/numba"},
        {"name": "TMPDIR", "value": "/tmp"},
    ]


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(int(value), high))


def _pod_parts(inp: RenderInput) -> dict[str, Any]:
    """Everything the Deployment needs that is computed (args, env, resources), as plain data."""
    args, _dropped = render_args(inp.flags, inp.vllm_version, inp.pinned)
    table = flag_table()
    served = inp.served_name or inp.model
    base_args = ["--host", "0.0.0.0", "--port", str(DEFAULT_PORT), "--served-model-name", served]
    if inp.revision:
        base_args += ["--revision", inp.revision]
    if inp.trust_remote_code:
        base_args.append("--trust-remote-code")
    if table.uses_serve_command(inp.vllm_version):
        command = ["vllm", "serve"]
        all_args = [inp.model, *base_args, *args, *inp.extra_args]
    else:
        command = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
        all_args = ["--model", inp.model, *base_args, *args, *inp.extra_args]
    mount = cache_mount_path(inp)
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": mount}]
    if inp.security_profile == "restricted":
        env.extend(_restricted_env())
    if inp.hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": inp.hf_token_secret, "key": inp.hf_token_key, "optional": False}}})
    if inp.compile_cache:
        # on the claim, per release and GPU: a restart (a remediation step too) loads the compiled graphs instead
        # of compiling again; these replace the restricted profile's emptyDir paths
        root = compile_cache_root(mount, inp.vllm_version, inp.gpu_product_label)
        cache_env = {"VLLM_CACHE_ROOT": root, "TORCHINDUCTOR_CACHE_DIR": f"{root}/torchinductor",
                     "TRITON_CACHE_DIR": f"{root}/triton"}
        env = [e for e in env if e["name"] not in cache_env]
        env.extend({"name": k, "value": v} for k, v in cache_env.items())
    env.extend(dict(e) for e in inp.env)
    memory = inp.memory or f"{host_memory_gib(inp.weights_gib_total, inp.gpu_count)}Gi"
    cpu = inp.cpu or str(2 + 2 * inp.gpu_count)
    return {"command": [str(c) for c in command], "args": [str(a) for a in all_args], "env": env,
            "memory": memory, "cpu": cpu, "mount": mount}


def build_deployment(inp: RenderInput) -> dict[str, Any]:
    names = child_names(inp.name)
    parts = _pod_parts(inp)
    gpus = str(inp.gpu_count)
    node_selector = {str(k): str(v) for k, v in inp.node_selector.items()}
    if inp.gpu_product_label and GPU_PRODUCT_LABEL not in node_selector:
        node_selector[GPU_PRODUCT_LABEL] = str(inp.gpu_product_label)
    tolerations = [dict(t) for t in inp.tolerations]
    if not any(t.get("key") == "nvidia.com/gpu" for t in tolerations):
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    labels = labels_for(inp.name)
    pod_annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(DEFAULT_PORT),
        "prometheus.io/path": "/metrics",
        # what a pod ran with: a pod whose value differs from the template's belongs to an older profile
        ANNOTATION_PLAN: spec_hash({"args": parts["args"], "image": inp.image, "memory": parts["memory"],
                                    "gpus": inp.gpu_count}),
    }
    if version_from_image(inp.image) is None:
        # a digest, mirror tag or `latest`: say which release the plan was made for (spec.vllmVersion, else the
        # newest known). Only then, so a tagged image's pod template stays as it was (no rollout on upgrade).
        pod_annotations[ANNOTATION_VLLM_VERSION] = inp.vllm_version
    pod_security, container_security = _security(inp)
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"},
                                    {"name": "model-cache", "mountPath": parts["mount"]}]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": inp.shm_size or f"{_shm_gib(inp.gpu_count)}Gi"}},
    ]
    if inp.cache_claim_template is None:  # else each pod's claim comes from the workload's volumeClaimTemplates
        volumes.append({"name": "model-cache", **(
            dict(inp.cache_volume) if inp.cache_volume is not None else
            {"persistentVolumeClaim": {"claimName": dns1123_subdomain(inp.cache_claim)}} if inp.cache_claim
            else {"emptyDir": {}})})
    if inp.security_profile == "restricted":
        mounts += [{"name": "home", "mountPath": RESTRICTED_HOME}, {"name": "tmp", "mountPath": "/tmp"}]
        volumes += [{"name": "home", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]
    container: dict[str, Any] = {
        "name": "vllm",
        "image": inp.image,
        "imagePullPolicy": inp.image_pull_policy,
        "command": parts["command"],
        "args": parts["args"],
        "env": parts["env"],
        "ports": [{"name": "http", "containerPort": DEFAULT_PORT, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": parts["cpu"], "memory": parts["memory"], "nvidia.com/gpu": gpus},
            "limits": {"memory": parts["memory"], "nvidia.com/gpu": gpus},
        },
        "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                         "failureThreshold": _clamp(inp.startup_failure_threshold or
                                                    _startup_failures(inp.weights_gib_total), 1, INT32_MAX)},
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5,
                           "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 15,
                          "timeoutSeconds": 5, "failureThreshold": 4},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security,
        "volumeMounts": mounts,
    }
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 60,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security,
        "nodeSelector": node_selector,
        "tolerations": tolerations,
        "containers": [container],
        "volumes": volumes,
    }
    if inp.download_init:  # the weights land in the cache before vLLM starts (render/cache.py)
        pod_spec["initContainers"] = [build_download_container(
            image=inp.image, image_pull_policy=inp.image_pull_policy, model=inp.model, revision=inp.revision,
            env=parts["env"], mounts=mounts, security_context=container_security)]
    if inp.affinity:
        pod_spec["affinity"] = dict(inp.affinity)
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": names.deployment, "namespace": inp.namespace, "labels": labels, "annotations": {},
                     "ownerReferences": [inp.owner.to_k8s()]},
        "spec": {
            "replicas": _clamp(inp.replicas, 0, INT32_MAX),
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 60 * 60,
            "selector": {"matchLabels": selector_for(inp.name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": (
                {"maxSurge": 0, "maxUnavailable": 1} if inp.roll_without_surge else
                {"maxSurge": 1, "maxUnavailable": 0})},
            # the template's labels: the service's, and the one only a Deployment's pods carry (render/pods.py)
            "template": {"metadata": {"labels": {**labels, **deployment_pod_labels(inp.name)},
                                      "annotations": pod_annotations}, "spec": pod_spec},
        },
    }
    deployment["metadata"]["annotations"][ANNOTATION_SPEC_HASH] = spec_hash(deployment["spec"])
    return deployment


def build_service(inp: RenderInput, pods: ServingPods | None = None) -> dict[str, Any]:
    """The Service: it selects the serving pods (`pods`; the Deployment's when None)."""
    pods = pods or serving_pods(inp.name, inp.namespace, kind="Deployment")
    service: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": child_names(inp.name).service, "namespace": inp.namespace,
                     "labels": labels_for(inp.name), "annotations": {},
                     "ownerReferences": [inp.owner.to_k8s()]},
        "spec": {
            "type": inp.service_type,
            "selector": dict(pods.match_labels),
            "ports": [{"name": "http", "port": _clamp(inp.service_port, 1, 65535), "targetPort": "http",
                       "protocol": "TCP"}],
        },
    }
    service["metadata"]["annotations"][ANNOTATION_SPEC_HASH] = spec_hash(service["spec"])
    return service


def build_cache_pvc(inp: RenderInput) -> dict[str, Any] | None:
    """A PVC for the model cache when the user asked us to create one."""
    if not (inp.cache_create and inp.cache_claim):
        return None
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": inp.cache_size}}}
    if inp.cache_storage_class:
        spec["storageClassName"] = inp.cache_storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": dns1123_subdomain(inp.cache_claim), "namespace": inp.namespace,
                     "labels": labels_for(inp.name), "ownerReferences": [inp.owner.to_k8s()]},
        "spec": spec,
    }


def build_children(inp: RenderInput) -> list[dict[str, Any]]:
    """Every object one VLLMService owns, in apply order."""
    children = [build_deployment(inp), build_service(inp)]
    pvc = build_cache_pvc(inp)
    return ([pvc] if pvc else []) + children
