"""What the handlers read before calling the pure core: the model's files, the GPU nodes, one `reconcile.Observed`.

Reads only (every write is in `effects`); shared by the reconcile (`service`), the ladder (`remediation`) and the
metrics watch, so none of them imports another.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from .. import reconcile
from ..api.labels import OBSERVED_FREE_GPUS
from ..api.v1alpha1 import DEFAULT_IMAGE
from ..sources import ModelFiles, ModelSourceError, model_files_from_inline, resolve_model_id
from . import config, kube

GPU_RESOURCE = "nvidia.com/gpu"


def load_model(spec: Mapping[str, Any], namespace: str) -> tuple[ModelFiles | None, str | None]:
    """The model's config.json (+ checkpoint size): inline, from a ConfigMap, the catalog, or the hub."""
    model = spec.get("model") or {}
    name = str(model.get("name", ""))
    try:
        if model.get("config"):
            return model_files_from_inline(dict(model["config"]), _inline_index(model), name), None
        ref = model.get("configMapRef")
        if ref:
            with kube.api_errors("read the model ConfigMap"):
                config_map = kube.get(kube.CONFIGMAPS, namespace, ref["name"])
            if config_map is None:
                return None, f"ConfigMap {ref['name']} (spec.model.configMapRef) not found"
            data = config_map.get("data") or {}
            config_text = data.get(ref.get("configKey", "config.json"))
            if config_text is None:
                return None, f"ConfigMap {ref['name']} has no key {ref.get('configKey', 'config.json')}"
            index_text = data.get(ref.get("safetensorsIndexKey", "model.safetensors.index.json"))
            return model_files_from_inline(config_text, index_text, name), None
        return resolve_model_id(name, revision=model.get("revision")), None
    except ModelSourceError as exc:
        return None, str(exc)


def _inline_index(model: Mapping[str, Any]) -> dict[str, Any] | None:
    index = model.get("safetensorsIndex")
    return dict(index) if index else None


def list_gpu_nodes(node_selector: Mapping[str, str]) -> list[dict[str, str]]:
    """The nodes' labels, each with its free GPUs under OBSERVED_FREE_GPUS when every pod could be listed."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(node_selector.items())) or None
    with kube.api_errors("list nodes"):
        nodes = kube.list_objects(kube.NODES, label_selector=selector)
    free = free_gpus(nodes, _gpu_requests_by_node())
    out = []
    for node in nodes:
        labels = dict((node.get("metadata") or {}).get("labels") or {})
        name = str((node.get("metadata") or {}).get("name") or "")
        if name in free:
            labels[OBSERVED_FREE_GPUS] = str(free[name])
        out.append(labels)
    return out


def _gpu_requests_by_node() -> dict[str, int] | None:
    """GPUs requested by the pods bound to each node that have not finished; None when pods cannot be listed (a
    namespaced install cannot list other namespaces' pods): free GPUs are then unknown, not guessed."""
    try:
        pods = kube.list_objects(kube.PODS)
    except (ApiException, HTTPError, OSError):
        return None
    used: dict[str, int] = {}
    for pod in pods:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        node = spec.get("nodeName")
        if not node or status.get("phase") in ("Succeeded", "Failed"):
            continue
        used[node] = used.get(node, 0) + sum(_gpu_quantity(c) for c in spec.get("containers") or [])
    return used


def _gpu_quantity(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    value = (resources.get("limits") or {}).get(GPU_RESOURCE) or (resources.get("requests") or {}).get(GPU_RESOURCE)
    try:
        return max(int(str(value or 0)), 0)
    except ValueError:
        return 0


def free_gpus(nodes: list[dict[str, Any]], used: Mapping[str, int] | None) -> dict[str, int]:
    """Free GPUs per node name: allocatable nvidia.com/gpu minus what its pods request (empty when unknown)."""
    if used is None:
        return {}
    out: dict[str, int] = {}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name") or "")
        allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)
        try:
            total = int(str(allocatable))
        except ValueError:
            continue
        out[name] = max(total - used.get(name, 0), 0)
    return out


def observe_service(service: Mapping[str, Any], now: datetime) -> reconcile.Observed:
    """The pure core's view of one VLLMService: its spec and stored status, the model's files and the GPU nodes."""
    meta = service.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    spec = dict(service.get("spec") or {})
    return reconcile.Observed(
        name=str(meta.get("name") or ""), namespace=namespace, uid=str(meta.get("uid") or ""),
        generation=int(meta.get("generation") or 1), spec=spec, status=dict(service.get("status") or {}), now=now,
        list_nodes=list_gpu_nodes, resolve_model=lambda: load_model(spec, namespace), catalog=config.CONFIG.catalog,
        default_image=config.CONFIG.default_image or DEFAULT_IMAGE)
