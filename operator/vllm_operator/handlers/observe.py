"""What the handlers read before calling the pure core: the model's files, the GPU nodes, one `reconcile.Observed`,
read once per decision: the core (and the remediation ladder re-planning through it) gets plain data, no readers.

Reads only (every write is in `effects`); shared by the reconcile (`service`), the ladder (`remediation`) and the
metrics watch, so none of them imports another.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from .. import reconcile
from ..api.v1alpha1 import DEFAULT_HF_TOKEN_KEY, DEFAULT_IMAGE
from ..hub import is_repo_id, resolve_model_id
from ..modelfiles import ModelFiles, ModelSourceError, find_in_catalog, model_files_from_inline
from ..render.cache import ObservedClaim, observed_claim, read_write_many_class
from ..sharegroup import ShareObserved
from . import config, kube

log = logging.getLogger("vllm_operator")


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
        revision = model.get("revision")
        if revision is None and is_repo_id(name) and (found := find_in_catalog(name)) is not None:
            return found, None  # the built-in catalog: no hub, no credentials read
        token, cache_dir, problem = hub_credentials(spec, namespace)
        if problem is not None:
            return None, problem
        return resolve_model_id(name, revision=revision, token=token, cache_dir=cache_dir), None
    except ModelSourceError as exc:
        return None, str(exc)


def hub_credentials(spec: Mapping[str, Any], namespace: str) -> tuple[str | bool | None, str | None, str | None]:
    """The token a service's hub lookup uses, the hub cache it reads and writes, and why there is none.

    A tenant's own token (`spec.hfTokenSecretRef`, read from its namespace) or no token at all: the operator's own
    HF_TOKEN only when the chart allows it for every namespace (`hub.operatorTokenForAllNamespaces`), since a
    lookup with it tells any tenant whether a private or gated repository that token sees exists, and its
    architecture. A tenant's token gets a cache of its own (what it downloaded is not served to another tenant,
    offline included); anonymous lookups share one."""
    ref = spec.get("hfTokenSecretRef")
    if isinstance(ref, Mapping) and ref.get("name"):
        with kube.api_errors("read the hub token Secret (spec.hfTokenSecretRef)"):
            secret = kube.get(kube.SECRETS, namespace, str(ref["name"]))
        key = str(ref.get("key") or DEFAULT_HF_TOKEN_KEY)
        encoded = ((secret or {}).get("data") or {}).get(key)
        if secret is None or not isinstance(encoded, str):
            return None, None, (f"Secret {ref['name']} (spec.hfTokenSecretRef) not found or has no key {key}: the "
                                "model's config.json is looked up with the service's own token only")
        try:
            token = base64.b64decode(encoded, validate=True).decode().strip()
        except (ValueError, UnicodeDecodeError):
            return None, None, f"Secret {ref['name']} key {key} (spec.hfTokenSecretRef) is not a token"
        digest = hashlib.sha256(token.encode()).hexdigest()[:24]
        return token, str(Path(_hub_home()) / "tenants" / digest), None
    if config.CONFIG.hub_token_all_namespaces:
        return None, None, None  # huggingface_hub's own resolution: the operator's HF_TOKEN
    return False, str(Path(_hub_home()) / "anonymous"), None  # False: huggingface_hub sends no token at all


def _hub_home() -> str:
    home = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if home:
        return home
    return str(Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub")


def _inline_index(model: Mapping[str, Any]) -> dict[str, Any] | None:
    index = model.get("safetensorsIndex")
    return dict(index) if index else None


def list_gpu_nodes(node_selector: Mapping[str, str]) -> list[dict[str, str]]:
    selector = ",".join(f"{k}={v}" for k, v in sorted(node_selector.items())) or None
    with kube.api_errors("list nodes"):
        nodes = kube.list_objects(kube.NODES, label_selector=selector)
    return [dict((n.get("metadata") or {}).get("labels") or {}) for n in nodes]


#: How long the cluster's StorageClasses are remembered (seconds): one list serves every reconcile meanwhile.
STORAGE_CLASS_MAX_AGE = 60.0
_storage_class_cache: dict[int, tuple[float, tuple[str | None, str | None]]] = {}
#: The annotation that marks a StorageClass as the cluster's default.
DEFAULT_CLASS_ANNOTATIONS = ("storageclass.kubernetes.io/is-default-class",
                             "storageclass.beta.kubernetes.io/is-default-class")


def _storage_classes() -> tuple[str | None, str | None]:
    """(the default StorageClass, a class whose claims can be ReadWriteMany), each None when the cluster has none
    or the classes cannot be listed (then the model cache is ephemeral and the ModelCache condition says so)."""
    key = id(kube.client())
    now = time.monotonic()
    hit = _storage_class_cache.get(key)
    if hit is not None and now - hit[0] < STORAGE_CLASS_MAX_AGE:
        return hit[1]
    found: str | None = None
    try:
        classes = kube.list_objects(kube.STORAGECLASSES)
    except (ApiException, HTTPError, OSError) as exc:
        log.info("cannot list StorageClasses (%s): model caches default to emptyDir", getattr(exc, "status", exc))
        classes = []
    for item in classes:
        annotations = (item.get("metadata") or {}).get("annotations") or {}
        if any(str(annotations.get(a)).lower() == "true" for a in DEFAULT_CLASS_ANNOTATIONS):
            found = str((item.get("metadata") or {}).get("name") or "") or None
            break
    answer = (found, read_write_many_class(classes))
    _storage_class_cache[key] = (now, answer)
    return answer


def default_storage_class() -> str | None:
    """The cluster's default StorageClass, or None."""
    return _storage_classes()[0]


def shared_storage_class() -> str | None:
    """A StorageClass whose claims can be ReadWriteMany (render/cache.py `read_write_many_class`), or None."""
    return _storage_classes()[1]


#: The optional kinds the core may render, and where the API serves them.
OPTIONAL_KINDS = {"ScaledObject": kube.SCALEDOBJECTS, "InferencePool": kube.INFERENCEPOOLS}
_served_cache: dict[int, tuple[float, frozenset[str]]] = {}


def served_kinds(max_age: float = STORAGE_CLASS_MAX_AGE) -> frozenset[str] | None:
    """The optional kinds (KEDA ScaledObject, InferencePool) whose CRDs the cluster serves; None when discovery
    fails (the core then renders them and the API server's answer says the rest). Remembered for a minute; the
    watchdog asks afresh (`max_age=0`) at the start of each round, so a CRD installed after the operator started is
    picked up by the next round's reconciles."""
    key = id(kube.client())
    now = time.monotonic()
    hit = _served_cache.get(key)
    if hit is not None and now - hit[0] < max_age:
        return hit[1]
    found = set()
    try:
        for kind, resource in OPTIONAL_KINDS.items():
            if resource.plural in kube.served_resources(resource.group, resource.version):
                found.add(kind)
    except (ApiException, HTTPError, OSError) as exc:
        log.info("API discovery failed (%s): optional CRDs assumed installed", getattr(exc, "status", exc))
        return None
    _served_cache[key] = (now, frozenset(found))
    return frozenset(found)


#: How old an answer to "is the LeaderWorkerSet API served?" may be (s): installing LWS is noticed within this.
LWS_RECHECK_SECONDS = 30.0

#: The shell's readers `complete` calls: the model's files, the nodes matching a selector, the LWS API check.
ModelReader = Callable[[], "tuple[ModelFiles | None, str | None]"]
NodeReader = Callable[[Mapping[str, str]], "Sequence[Mapping[str, str]]"]
#: Reads the claim spec.modelCache.claimName names: what the core needs of it, None when it cannot be read.
ClaimReader = Callable[[str], "ObservedClaim | None"]


def read_claim(namespace: str, name: str) -> ObservedClaim | None:
    """The user's cache claim (spec.modelCache.claimName): found or not, its access modes. None when the operator
    may not read claims (403): the core then mounts it as asked, knowing nothing more."""
    try:
        claim = kube.get(kube.PVCS, namespace, name)
    except ApiException as exc:
        if exc.status != 403:
            raise
        log.info("cannot read PersistentVolumeClaim %s/%s (forbidden): its access modes are not known", namespace,
                 name)
        return None
    return observed_claim(name, claim)


def lws_served(max_age: float = LWS_RECHECK_SECONDS) -> bool:
    """Whether leaderworkerset.x-k8s.io/v1 leaderworkersets is served, from an answer at most `max_age` s old."""
    return kube.served(kube.LEADERWORKERSETS, max_age)


def complete(base: reconcile.Observed, *, model: ModelReader | None, nodes: NodeReader | None,
             lws: Callable[[], bool] | None, claim: ClaimReader | None = None) -> reconcile.Observed:
    """`base` (spec, status, operator settings) with what `reconcile.wants` asks for, read once, here: the model's
    files, the nodes, the LWS answer, the user's cache claim. Nothing is read for an invalid spec; a reader left None is not asked (`base`
    keeps what it holds). An API error propagates for kopf to retry, except a failed node listing when the spec
    names its GPU (then only the pools' options are missing)."""
    wanted = reconcile.wants(base)
    if wanted is None:
        return base
    files, error = model() if wanted.model and model is not None else (base.model_files, base.model_error)
    listed = base.nodes
    if nodes is not None:
        try:
            listed = tuple(nodes(wanted.node_selector))
        except (kopf.TemporaryError, ApiException, HTTPError, OSError):
            if not wanted.nodes_optional:
                raise
            listed = ()
    served = lws() if wanted.lws and lws is not None else base.lws_installed
    seen = claim(wanted.cache_claim) if wanted.cache_claim and claim is not None else base.cache_claim
    return replace(base, model_files=files, model_error=error, nodes=listed, lws_installed=served, cache_claim=seen)


def observe_service(service: Mapping[str, Any], now: datetime, *, nodes: NodeReader | None = None,
                    share: ShareObserved | None = None) -> reconcile.Observed:
    """The pure core's view of one VLLMService, read once: its spec and stored status, the operator's settings, the
    cluster's StorageClasses and optional kinds, and (for a valid spec) the model's files, the GPU nodes and whether
    LeaderWorkerSets are served. `nodes` lists the nodes (a cached listing for the reconcile's retries)."""
    meta = service.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    spec = dict(service.get("spec") or {})
    base = reconcile.Observed(
        name=str(meta.get("name") or ""), namespace=namespace, uid=str(meta.get("uid") or ""),
        generation=int(meta.get("generation") or 1), spec=spec, status=dict(service.get("status") or {}), now=now,
        catalog=config.CONFIG.catalog, default_image=config.CONFIG.default_image or DEFAULT_IMAGE,
        cache_settings=config.CONFIG.model_cache, default_storage_class=default_storage_class(),
        shared_storage_class=shared_storage_class(), served_kinds=served_kinds(), share=share)
    return complete(base, model=lambda: load_model(spec, namespace), nodes=nodes or list_gpu_nodes, lws=lws_served,
                    claim=lambda name: read_claim(namespace, name))
