"""kopf handlers for VLLMService: observe, call the pure core (vllm_operator.reconcile), apply.

Handlers are named `<kind>_<event>`; every API call goes through `kube` (errors mapped in one place).
The operator never writes a VLLMService's spec: only its status, its children and Events.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from .. import metrics, reconcile
from ..api import conditions as cond
from ..api.v1alpha1 import DEFAULT_IMAGE, GROUP, PLURAL, VERSION
from ..render.manifests import ANNOTATION_SPEC_HASH, LABEL_SERVICE, MANAGED_BY
from ..sources import ModelFiles, ModelSourceError, load_model_files, model_files_from_inline
from . import config, kube

log = logging.getLogger("vllm_operator")
registry = kopf.OperatorRegistry()
MANAGED = {"app.kubernetes.io/managed-by": MANAGED_BY}


@kopf.on.startup(registry=registry)
def operator_startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="vllm-operator.dev", key="last-handled-configuration")
    settings.persistence.finalizer = "vllm-operator.dev/finalizer"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.execution.max_workers = 8
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)


@kopf.on.login(registry=registry)
def operator_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        return kopf.login_with_service_account(**kwargs)
    return kopf.login_with_kubeconfig(**kwargs)


def _now() -> datetime:
    return datetime.now(UTC)


def _involved(name: str, namespace: str, uid: str | None) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLLMService", "name": name, "namespace": namespace,
            "uid": uid}


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
        return load_model_files(name, revision=model.get("revision")), None
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


def apply_children(children: list[dict[str, Any]], namespace: str) -> list[str]:
    """Create what is missing, patch what changed (by spec-hash annotation); returns what was written."""
    written = []
    for child in children:
        resource = kube.KIND_RESOURCES[child["kind"]]
        name = child["metadata"]["name"]
        with kube.api_errors(f"apply {child['kind']} {name}"):
            existing = kube.get(resource, namespace, name)
            if existing is None:
                kube.create(resource, namespace, child)
                written.append(f"created {child['kind']} {name}")
                continue
            if child["kind"] == "PersistentVolumeClaim":
                continue  # immutable spec: created once, never patched
            want = child["metadata"].get("annotations", {}).get(ANNOTATION_SPEC_HASH)
            have = ((existing.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
            if want != have:
                kube.patch(resource, namespace, name, {
                    "metadata": {"labels": child["metadata"]["labels"],
                                 "annotations": child["metadata"]["annotations"],
                                 "ownerReferences": child["metadata"]["ownerReferences"]},
                    "spec": child["spec"]})
                written.append(f"updated {child['kind']} {name}")
    return written


def write_status(namespace: str, name: str, old: Mapping[str, Any], new: Any) -> bool:
    patch = cond.status_patch(dict(old), new)
    if not patch:
        return False
    with kube.api_errors(f"write status of {name}"):
        kube.patch(kube.VLLMSERVICES, namespace, name, {"status": patch}, subresource="status")
    return True


def reconcile_service(name: str, namespace: str, uid: str, generation: int, spec: Mapping[str, Any],
                      status: Mapping[str, Any], logger: logging.Logger | kopf.Logger) -> reconcile.Desired:
    """Observe, compute, apply — the whole reconcile of one VLLMService (under the service's lock, on its
    current status: the status in kopf's event may predate a ladder step the pod handler just wrote)."""
    with kube.service_lock(namespace, name):
        with kube.api_errors(f"read {name}"):
            fresh = kube.get(kube.VLLMSERVICES, namespace, name)
        if fresh is not None:
            status = dict(fresh.get("status") or {})
        return _reconcile_locked(name, namespace, uid, generation, spec, status, logger)


def _reconcile_locked(name: str, namespace: str, uid: str, generation: int, spec: Mapping[str, Any],
                      status: Mapping[str, Any], logger: logging.Logger | kopf.Logger) -> reconcile.Desired:
    spec_dict = dict(spec)
    files, model_error = (None, None)
    if isinstance(spec_dict.get("model"), Mapping) and spec_dict["model"].get("name"):
        files, model_error = load_model(spec_dict, namespace)
    # listed even with spec.gpu.product: the product's GPUs per node and the options come from the cluster's pools;
    # with the product named, a failed listing only costs those (the plan does not depend on it)
    gpu_spec = spec_dict.get("gpu") or {}
    try:
        nodes = list_gpu_nodes(dict(spec_dict.get("nodeSelector") or {}))
    except kopf.TemporaryError:
        if not (isinstance(gpu_spec, Mapping) and gpu_spec.get("product")):
            raise
        logger.warning("could not list nodes; planning for spec.gpu.product without the cluster's pools")
        nodes = []
    observed = reconcile.Observed(name=name, namespace=namespace, uid=uid, generation=generation, spec=spec_dict,
                                  status=dict(status), now=_now(), nodes=nodes, model_files=files,
                                  model_error=model_error, catalog=config.CONFIG.catalog,
                                  default_image=config.CONFIG.default_image or DEFAULT_IMAGE)
    desired = reconcile.desired_state(observed)
    if desired.plan is not None:
        metrics.record_plan(namespace, name, desired.plan.fits, desired.plan.flags,
                            desired.plan.prediction.kv_cache_tokens)
    if desired.children is not None:
        for line in apply_children(desired.children, namespace):
            logger.info(line)
    write_status(namespace, name, status, desired.status)
    involved = _involved(name, namespace, uid)
    for event in desired.events:
        with kube.api_errors("post an event"):
            kube.post_event(namespace, involved, event.type, event.reason, event.message)
    return desired


def _reset_ladder(namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
    """The user changed the spec: what the ladder learned may no longer hold. Keep the history, drop the rest."""
    new = dict(status)
    remediation = dict(status.get("remediation") or {})
    remediation.update({"profile": {}, "step": 0, "exhausted": False})
    new["remediation"] = remediation
    with kube.api_errors(f"reset remediation of {name}"):
        kube.patch(kube.VLLMSERVICES, namespace, name,
                   {"status": {"remediation": {"profile": None, "step": 0, "exhausted": False}}},
                   subresource="status")
    return new


@kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
@kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
@kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
def vllmservice_reconcile(*, name: str, namespace: str | None, uid: str, meta: kopf.Meta, spec: kopf.Spec,
                          status: Mapping[str, Any], logger: kopf.Logger, reason: str, **_: Any) -> None:
    assert namespace is not None  # VLLMService is namespaced
    if reason == "update" and (status.get("remediation") or {}).get("profile"):
        status = _reset_ladder(namespace, name, status)
    try:
        desired = reconcile_service(name, namespace, uid, int(meta.get("generation") or 1), spec, status, logger)
    except kopf.TemporaryError:
        metrics.RECONCILES.labels(outcome="retry").inc()
        raise
    metrics.RECONCILES.labels(outcome="ok" if desired.plan and desired.plan.fits else "not_deployed").inc()
    if desired.retry_after:
        raise kopf.TemporaryError("waiting: " + "; ".join(e.message for e in desired.events)[:200],
                                  delay=desired.retry_after)


@kopf.on.event("", "v1", "pods", labels=MANAGED, registry=registry)
def pod_event(body: Mapping[str, Any], type: str | None, logger: kopf.Logger, **_: Any) -> None:
    """A pod of ours changed: if its vLLM container failed, walk the remediation ladder one step."""
    if type == "DELETED":
        return
    from .remediation import remediate_service

    meta = body.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(LABEL_SERVICE)
    if not owner or not _looks_failed(body):
        return
    try:
        remediate_service(meta["namespace"], owner, logger)
    except kopf.TemporaryError as exc:  # event handlers are not retried: the watchdog timer looks again
        logger.warning("remediation deferred: %s", exc)


def _looks_failed(pod: Mapping[str, Any]) -> bool:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if (container.get("lastState") or {}).get("terminated") or (container.get("state") or {}).get("terminated"):
            return True
        if ((container.get("state") or {}).get("waiting") or {}).get("reason") in (
                "CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError"):
            return True
    return False


@kopf.timer(GROUP, VERSION, PLURAL, interval=120, initial_delay=60, idle=30, registry=registry)
def vllmservice_watchdog(name: str, namespace: str | None, uid: str, meta: kopf.Meta, spec: kopf.Spec,
                         status: kopf.Status, logger: kopf.Logger, **_: Any) -> None:
    """Periodically: catch pod failures whose events were missed (restarts, deferred steps) and re-apply the plan
    if anything drifted. Writes nothing when nothing changed."""
    from .remediation import remediate_service, step_up_service

    assert namespace is not None
    allow_step_up = bool((spec.get("remediation") or {}).get("allowStepUp"))
    if remediate_service(namespace, name, logger) is None and not (
            allow_step_up and step_up_service(namespace, name, logger)):
        reconcile_service(name, namespace, uid, int(meta.get("generation") or 1), spec, status, logger)


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED, registry=registry)
def deployment_event(body: Mapping[str, Any], type: str | None, **_: Any) -> None:
    """Fold the Deployment's readiness into the owner's status (Ready, readyReplicas)."""
    if type == "DELETED":
        return
    meta = body.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(LABEL_SERVICE)
    namespace = meta.get("namespace")
    if not owner or not namespace:
        return
    with kube.service_lock(namespace, owner):
        _fold_readiness(namespace, owner, body)


def _fold_readiness(namespace: str, owner: str, body: Mapping[str, Any]) -> None:
    with kube.api_errors("read the VLLMService"):
        service = kube.get(kube.VLLMSERVICES, namespace, owner)
    if service is None:
        return
    status = service.get("status") or {}
    if (status.get("plan") or {}).get("fits") is False:
        return  # an infeasible plan has no Deployment of ours to report on
    deployment_status = body.get("status") or {}
    replicas = int((body.get("spec") or {}).get("replicas") or 0)
    ready = int(deployment_status.get("readyReplicas") or 0)
    generation = int((service.get("metadata") or {}).get("generation") or 1)
    new = reconcile.readiness_update(status, generation=generation, now=_now(), replicas=replicas, ready=ready)
    write_status(namespace, owner, status, new)
