"""Kubernetes manifests for one VLLMService, rendered from typed inputs with strict Jinja2 templates.

Pure: `build_*` functions return dicts; nothing here talks to the API.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import yaml
from jinja2 import Environment, PackageLoader, StrictUndefined, Undefined
from pydantic import BaseModel, ConfigDict, Field

from .flags import flag_table

MANAGED_BY = "vllm-operator"
LABEL_SERVICE = "vllm-operator.dev/service"
ANNOTATION_SPEC_HASH = "vllm-operator.dev/spec-hash"
ANNOTATION_PLAN = "vllm-operator.dev/plan"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
DEFAULT_PORT = 8000


_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _toyaml(value: Any, indent: int = 0) -> str:
    """Flow-style YAML on one line: safe to place after a key at any indentation."""
    if isinstance(value, Undefined):
        value._fail_with_undefined_error()  # a missing template value names itself, also behind the filter
    text: str = yaml.dump(value, Dumper=_Dumper, default_flow_style=True, sort_keys=True, width=10**9)
    return text.strip()


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("vllm_operator.render", "templates"),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["toyaml"] = _toyaml
    return env


_ENV = _environment()


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
    memory: str | None = Field(None, description="host memory override (request = limit)")
    cpu: str | None = None
    shm_size: str | None = None
    service_type: str = "ClusterIP"
    service_port: int = DEFAULT_PORT
    trust_remote_code: bool = False


def labels_for(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "server",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_SERVICE: name,
    }


def selector_for(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": name, LABEL_SERVICE: name}


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
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if value:
                args.append(flag)
            elif table.can_negate(name, version):
                args.append("--no-" + name.replace("_", "-"))
            elif name in pinned:
                dropped.append(f"{flag}=false is vLLM's default before 0.8; not passed")
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


def build_context(inp: RenderInput) -> dict[str, Any]:
    """The template variables (exposed for tests)."""
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
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": inp.cache_mount_path}]
    if inp.hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": inp.hf_token_secret, "key": inp.hf_token_key, "optional": False}}})
    env.extend(inp.env)
    memory = inp.memory or f"{host_memory_gib(inp.weights_gib_total, inp.gpu_count)}Gi"
    cpu = inp.cpu or str(2 + 2 * inp.gpu_count)
    node_selector = dict(inp.node_selector)
    if inp.gpu_product_label and GPU_PRODUCT_LABEL not in node_selector:
        node_selector[GPU_PRODUCT_LABEL] = inp.gpu_product_label
    tolerations = list(inp.tolerations)
    if not any(t.get("key") == "nvidia.com/gpu" for t in tolerations):
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    labels = labels_for(inp.name)
    pod_annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(DEFAULT_PORT),
        "prometheus.io/path": "/metrics",
        # what a pod ran with: a pod whose value differs from the template's belongs to an older profile
        ANNOTATION_PLAN: spec_hash({"args": all_args, "image": inp.image, "memory": memory, "gpus": inp.gpu_count}),
    }
    cache_claim = inp.cache_claim
    return {
        "name": inp.name,
        "namespace": inp.namespace,
        "labels": labels,
        "annotations": {},
        "owner_references": [inp.owner.to_k8s()],
        "replicas": inp.replicas,
        "progress_deadline_seconds": 60 * 60,
        "selector": selector_for(inp.name),
        "max_surge": 1,
        "pod_labels": labels,
        "pod_annotations": pod_annotations,
        "service_account": None,
        "node_selector": node_selector,
        "tolerations": tolerations,
        "affinity": inp.affinity,
        "image": inp.image,
        "image_pull_policy": inp.image_pull_policy,
        "command": command,
        "args": all_args,
        "env": env,
        "port": DEFAULT_PORT,
        "requests": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(inp.gpu_count)},
        "limits": {"memory": memory, "nvidia.com/gpu": str(inp.gpu_count)},
        "startup_failure_threshold": _startup_failures(inp.weights_gib_total),
        "shm_size": inp.shm_size or f"{_shm_gib(inp.gpu_count)}Gi",
        "cache_claim": cache_claim,
        "cache_mount_path": inp.cache_mount_path,
        "cache_size": inp.cache_size,
        "cache_storage_class": inp.cache_storage_class,
        "service_type": inp.service_type,
        "service_port": inp.service_port,
    }


def _render(template: str, context: dict[str, Any]) -> dict[str, Any]:
    text = _ENV.get_template(template).render(**context)
    data: dict[str, Any] = yaml.load(text, Loader=_Loader)
    return data


def build_deployment(inp: RenderInput, context: dict[str, Any] | None = None) -> dict[str, Any]:
    deployment = _render("deployment.yaml.j2", context or build_context(inp))
    deployment["metadata"]["annotations"][ANNOTATION_SPEC_HASH] = spec_hash(deployment["spec"])
    return deployment


def build_service(inp: RenderInput, context: dict[str, Any] | None = None) -> dict[str, Any]:
    service = _render("service.yaml.j2", context or build_context(inp))
    service["metadata"]["annotations"][ANNOTATION_SPEC_HASH] = spec_hash(service["spec"])
    return service


def build_cache_pvc(inp: RenderInput, context: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """A PVC for the model cache when the user asked us to create one."""
    if not (inp.cache_create and inp.cache_claim):
        return None
    return _render("pvc.yaml.j2", context or build_context(inp))


def build_children(inp: RenderInput) -> list[dict[str, Any]]:
    """Every object one VLLMService owns, in apply order (the template context is built once)."""
    context = build_context(inp)
    children = [build_deployment(inp, context), build_service(inp, context)]
    pvc = build_cache_pvc(inp, context)
    return ([pvc] if pvc else []) + children
