"""What the handlers read before calling the pure core: the model's files, the GPU nodes, one `reconcile.Observed`.

Reads only (every write is in `effects`); shared by the reconcile (`service`), the ladder (`remediation`) and the
metrics watch, so none of them imports another.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .. import reconcile
from ..api.v1alpha1 import DEFAULT_IMAGE
from ..hub import resolve_model_id
from ..modelfiles import ModelFiles, ModelSourceError, model_files_from_inline
from . import config, kube


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
    selector = ",".join(f"{k}={v}" for k, v in sorted(node_selector.items())) or None
    with kube.api_errors("list nodes"):
        nodes = kube.list_objects(kube.NODES, label_selector=selector)
    return [dict((n.get("metadata") or {}).get("labels") or {}) for n in nodes]


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
