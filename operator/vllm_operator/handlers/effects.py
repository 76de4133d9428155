"""Every write the operator makes, in one place: children, the VLLMService's status, Events.

* `apply_children` — create what is missing, merge-patch what changed (by the spec-hash annotation); idempotent, so
  a retry or a resumed operator can apply the same children again.
* `update_status` — THE status writer: read the VLLMService, let the caller build the next status from what is
  stored *now*, merge-patch it with the read's `metadata.resourceVersion` as a precondition; on 409 read and build
  again; on a 5xx or a dropped connection retry a few times at once (the write may have landed: the rebuild sees
  it and writes nothing), then raise `kopf.TemporaryError` with a short delay. `build` must therefore be
  idempotent — given a status that already holds its change it returns an equal status (or None).
* `patch_status` — one precondition write of a status computed from a known read (None on 409: rebuild).
* `post_event` — a core/v1 Event on the VLLMService (best effort: failures are retried a few times, then logged).

Handlers observe, call the pure core and hand the results here; nothing else writes to the API.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ..api import conditions as cond
from ..api.v1alpha1 import GROUP, VERSION, VLLMServiceStatus
from ..render.lws import lws_name
from ..render.manifests import ANNOTATION_SPEC_HASH, LABEL_SERVICE, MANAGED_BY, child_names
from . import kube

log = logging.getLogger("vllm_operator.effects")

#: Pauses between immediate retries of a write that failed with a 5xx or a dropped connection (seconds).
RETRY_PAUSES = (0.1, 0.3, 0.8)
#: The delay kopf waits before re-running a handler whose write kept failing (seconds; not the watchdog's 120).
RETRY_DELAY = 1.0

StatusBuild = Callable[[dict[str, Any]], VLLMServiceStatus | None]


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in (429,) or (exc.status or 0) >= 500
    return isinstance(exc, HTTPError | OSError)


def _retrying(what: str, call: Callable[[], Any]) -> Any:
    """Run an API call; retry at once on a transient failure (5xx, 429, connection), then map to kopf's errors."""
    for pause in (*RETRY_PAUSES, None):
        try:
            return call()
        except (ApiException, HTTPError, OSError) as exc:
            if pause is None or not _transient(exc):
                with kube.api_errors(what):
                    raise
            log.debug("%s: %s; retrying in %ss", what, exc, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")


def involved(service: Mapping[str, Any]) -> dict[str, Any]:
    """The `involvedObject` of an Event about this VLLMService."""
    meta = service.get("metadata") or {}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLLMService", "name": meta.get("name"),
            "namespace": meta.get("namespace"), "uid": meta.get("uid")}


# --------------------------------------------------------------------------------------------------
# Children
# --------------------------------------------------------------------------------------------------


def apply_children(children: list[dict[str, Any]], namespace: str) -> list[str]:
    """Create what is missing, patch what changed (by spec-hash annotation); returns what was written."""
    written = []
    for child in children:
        resource = kube.KIND_RESOURCES[child["kind"]]
        name = child["metadata"]["name"]
        what = f"apply {child['kind']} {name}"
        existing = _retrying(what, partial(kube.get, resource, namespace, name))
        if existing is None:
            try:
                _retrying(what, partial(kube.create, resource, namespace, child))
            except kopf.TemporaryError:
                # a create that landed but answered 5xx: the retry's 409 AlreadyExists means it exists now
                if _retrying(what, partial(kube.get, resource, namespace, name)) is None:
                    raise
            written.append(f"created {child['kind']} {name}")
            continue
        if child["kind"] in ("PersistentVolumeClaim", "ResourceClaim"):
            continue  # immutable spec: created once, never patched
        want = child["metadata"].get("annotations", {}).get(ANNOTATION_SPEC_HASH)
        have = ((existing.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
        if want != have:
            body = {"metadata": {"labels": child["metadata"]["labels"],
                                 "annotations": child["metadata"]["annotations"],
                                 "ownerReferences": child["metadata"]["ownerReferences"]},
                    **({"data": child["data"]} if child["kind"] == "ConfigMap" else {"spec": child["spec"]})}
            _retrying(what, partial(kube.patch, resource, namespace, name, body))
            written.append(f"updated {child['kind']} {name}")
    return written


def delete_stale(stale: list[tuple[str, str]], namespace: str) -> list[str]:
    """Delete optional children (autoscaler, InferencePool) the spec no longer asks for; gone ones are fine."""
    written = []
    for kind, name in stale:
        resource = kube.KIND_RESOURCES[kind]
        existing = _retrying(f"read {kind} {name}", partial(kube.get, resource, namespace, name))
        labels = ((existing or {}).get("metadata") or {}).get("labels") or {}
        if existing is None or labels.get("app.kubernetes.io/managed-by") != MANAGED_BY:
            continue  # not there, or not ours
        try:
            _retrying(f"delete {kind} {name}", partial(kube.delete, resource, namespace, name))
        except kopf.TemporaryError:
            if _retrying(f"read {kind} {name}", partial(kube.get, resource, namespace, name)) is not None:
                raise
        written.append(f"deleted {kind} {name}")
    return written


def delete_replaced_workload(namespace: str, name: str, uid: str, children: list[dict[str, Any]]) -> list[str]:
    """Delete the workload of the other kind once the new one is applied and the plan that chose it is recorded
    (call it after the status write): a Deployment when the service now runs on a LeaderWorkerSet (its plan spans
    nodes), a LeaderWorkerSet when it is back on one node. Only a child this service owns — an ownerReference to its
    UID and the operator's labels — is deleted; one that is gone or someone else's is left alone."""
    kinds = ("Deployment", "LeaderWorkerSet")
    now = [c["kind"] for c in children if c.get("kind") in kinds]
    if len(now) != 1:
        return []
    old = kinds[1] if now[0] == kinds[0] else kinds[0]
    old_name = lws_name(name) if old == "LeaderWorkerSet" else child_names(name).deployment
    resource = kube.KIND_RESOURCES[old]
    existing = _retrying(f"read {old} {old_name}", partial(kube.get, resource, namespace, old_name)) or {}
    meta = existing.get("metadata") or {}
    labels = meta.get("labels") or {}
    owned = any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or [])
    if not owned or labels.get("app.kubernetes.io/managed-by") != MANAGED_BY or labels.get(LABEL_SERVICE) != name:
        return []
    try:
        _retrying(f"delete {old} {old_name}", partial(kube.delete, resource, namespace, old_name))
    except kopf.TemporaryError:
        if _retrying(f"read {old} {old_name}", partial(kube.get, resource, namespace, old_name)) is not None:
            raise
    return [f"deleted {old} {old_name}: replaced by a {now[0]}"]


def scale_deployment(namespace: str, name: str, replicas: int) -> None:
    _retrying(f"scale Deployment {name}",
              lambda: kube.patch(kube.DEPLOYMENTS, namespace, name, {"spec": {"replicas": replicas}}))


# --------------------------------------------------------------------------------------------------
# Status: the one writer
# --------------------------------------------------------------------------------------------------


def patch_status(namespace: str, name: str, service: Mapping[str, Any], new: VLLMServiceStatus) -> bool | None:
    """Merge-patch status with `service`'s resourceVersion as a precondition. True: written; False: nothing to
    write; None: the object changed since it was read (409) — read and build again. Transient failures are
    retried at once; what still fails raises kopf.TemporaryError."""
    patch = cond.status_patch(dict(service.get("status") or {}), new)
    if not patch:
        return False
    body: dict[str, Any] = {"status": patch}
    version = (service.get("metadata") or {}).get("resourceVersion")
    if version:
        body["metadata"] = {"resourceVersion": version}
    try:
        kube.patch(kube.VLLMSERVICES, namespace, name, body, subresource="status", discard=True)
    except ApiException as exc:
        if exc.status == 409:
            return None
        if not _transient(exc):
            with kube.api_errors(f"write status of {name}"):
                raise
        return None  # the write may have landed: the caller reads again and rebuilds
    except (HTTPError, OSError):
        return None
    return True


def read_service(namespace: str, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = _retrying(f"read VLLMService {name}",
                                             lambda: kube.get(kube.VLLMSERVICES, namespace, name))
    return found


def update_status(namespace: str, name: str, build: StatusBuild, *, attempts: int = 6) -> bool:
    """Read the VLLMService, build its next status from the stored one (`build(service)`; None: nothing to write),
    write it with the read's resourceVersion; on a conflict or a failed write read and build again. Returns whether
    anything was written. Raises kopf.TemporaryError (delay `RETRY_DELAY`) when every attempt failed.

    Holds the service's lock, as the reconcile and the ladder do, so writers in this process never interleave."""
    with kube.service_lock(namespace, name):
        for attempt in range(attempts):
            service = read_service(namespace, name)
            if service is None:
                return False
            new = build(service)
            if new is None:
                return False
            written = patch_status(namespace, name, service, new)
            if written is not None:
                return written
            time.sleep(RETRY_PAUSES[min(attempt, len(RETRY_PAUSES) - 1)])
    raise kopf.TemporaryError(f"the status of {namespace}/{name} could not be written", delay=RETRY_DELAY)


# --------------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------------


def post_event(namespace: str, involved_object: Mapping[str, Any], type_: str, reason: str, message: str, *,
               name: str | None = None) -> bool:
    """Post an Event (best effort: transient failures retried at once, then logged). Returns whether it is there.

    With a fixed `name` (the Event of a recorded step) posting is idempotent: a retry after a 5xx that landed, or
    a re-post after a restart, answers 409 AlreadyExists and counts as posted. Without one, such a retry may post
    it twice (kubectl shows both, better than none)."""
    try:
        _retrying(f"post event {reason}", lambda: _post(namespace, involved_object, type_, reason, message, name))
    except kopf.TemporaryError as exc:
        log.warning("event %s on %s/%s not posted: %s", reason, namespace, involved_object.get("name"), exc)
        return False
    return True


def _post(namespace: str, involved_object: Mapping[str, Any], type_: str, reason: str, message: str,
          name: str | None) -> None:
    try:
        kube.post_event(namespace, dict(involved_object), type_, reason, message, event_name=name)
    except ApiException as exc:
        if not (name and exc.status == 409):
            raise
        # 409 is AlreadyExists only when the Event is there: a 409 Conflict (or a proxy's) posted nothing, and
        # counting it as posted lost the Event for good (issue 20); it stays unannounced and is posted again
        if kube.get(kube.EVENTS, namespace, name) is None:
            raise
