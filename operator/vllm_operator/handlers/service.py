"""kopf handlers for VLLMService: observe, call the pure core (vllm_operator.reconcile), apply.

Handlers are named `<kind>_<event>`; every API call goes through `kube` (errors mapped in one place).
The operator never writes a VLLMService's spec: only its status, its children and Events.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from .. import metrics, reconcile
from ..api import conditions as cond
from ..api import rollout, serving, switch
from ..api.switch import WorkloadSwitch
from ..api.v1alpha1 import DEFAULT_IMAGE, GROUP, VERSION
from ..remediation import ladder
from ..render.lws import LWS_NAME_LABEL, lws_name
from ..render.manifests import LABEL_SERVICE, MANAGED_BY, child_names
from ..render.pods import serving_now, statefulset_name
from ..render.sharing import GROUP_LABEL
from . import config, decode, downloads, effects, kube, lws, measured, placement, prewarm, rollouts
from .effects import apply_children
from .observe import list_gpu_nodes, observe_service
from .remediation import remediate_service
from .share import group_members, group_of, observe_share

log = logging.getLogger("vllm_operator")
MANAGED = {"app.kubernetes.io/managed-by": MANAGED_BY}


#: The largest diff base kept in an annotation. All annotations of an object share 256 KiB (the API server refuses
#: more: kopf then stopped handling the service) and `kubectl apply` keeps another copy of the spec in one of them;
#: a larger diff base is kept in status (`status.kopf.lastHandledConfiguration`), where etcd's object limit applies.
ANNOTATION_DIFFBASE_BYTES = 96 * 1024
#: Where a diff base too large for an annotation is kept.
STATUS_DIFFBASE_FIELD = "lastHandledConfiguration"


class LeanAnnotationsDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff base with the same essence, built without deep-copying the status and the system
    metadata it drops at once (kopf copies the whole body first: on every event of every VLLMService); kept in
    status when it does not fit an annotation."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        if extra_fields:  # fields kopf tracks beyond the essence (none today): kopf's own way
            return super().build(body=body, extra_fields=extra_fields)
        meta = body.get("metadata") or {}
        lean: dict[str, Any] = {key: value for key, value in body.items() if key not in ("metadata", "status")}
        # what the essence keeps (labels, annotations) and what kopf reads to name its own annotation (owners)
        lean["metadata"] = {key: meta[key] for key in ("labels", "annotations", "ownerReferences") if key in meta}
        return super().build(body=kopf.Body(cast(kopf.RawBody, lean)), extra_fields=extra_fields)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        found = super().fetch(body=body)
        if found is not None:
            return found
        kept = ((body.get("status") or {}).get("kopf") or {}).get(STATUS_DIFFBASE_FIELD)
        return cast(kopf.BodyEssence, decode.loads(kept)) if isinstance(kept, str) else None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        in_status = ((body.get("status") or {}).get("kopf") or {}).get(STATUS_DIFFBASE_FIELD) is not None
        encoded = json.dumps(essence, separators=(",", ":"))
        if len(encoded.encode()) <= ANNOTATION_DIFFBASE_BYTES:
            super().store(body=body, patch=patch, essence=essence)
            if in_status:
                patch.setdefault("status", {}).setdefault("kopf", {})[STATUS_DIFFBASE_FIELD] = None
            return
        annotations = body.metadata.annotations
        for key in self.make_keys(self.key, body=body):
            if key in annotations:
                patch.metadata.annotations[key] = None
        patch.setdefault("status", {}).setdefault("kopf", {})[STATUS_DIFFBASE_FIELD] = encoded


#: How long kopf waits for the watch to show its own last patch (seconds; see operator_startup).
CONSISTENCY_TIMEOUT = 30.0


def operator_startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    decode.install()  # before any watch starts: objects nested past Python's recursion limit are cut, not fatal
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.diffbase_storage = LeanAnnotationsDiffBaseStorage(
        prefix="vllm-operator.dev", key="last-handled-configuration")
    settings.persistence.finalizer = "vllm-operator.dev/finalizer"
    # after its own patch kopf waits this long for the watch to bring the patched version before it handles an older
    # one (which lacks the last-handled annotation, so the creation would run again); a burst of creations delays
    # the watch by more than kopf's default 5 s
    settings.persistence.consistency_timeout = CONSISTENCY_TIMEOUT
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.execution.max_workers = 8
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)


def operator_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        return kopf.login_with_service_account(**kwargs)
    return kopf.login_with_kubeconfig(**kwargs)


def _now() -> datetime:
    return datetime.now(UTC)


def _involved(name: str, namespace: str, uid: str | None) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLLMService", "name": name, "namespace": namespace,
            "uid": uid}


def _bare(status: Mapping[str, Any]) -> dict[str, Any]:
    """A status without kopf's own bookkeeping (`status.kopf`: handler progress, a large diff base)."""
    return {key: value for key, value in status.items() if key != "kopf"}


class Superseded(Exception):  # noqa: N818 - an outcome, not an error
    """The spec changed while it was reconciled: what this reconcile would record is for an older generation. Its
    handler ends without a retry; kopf handles the newer spec at once (its diff is not handled yet)."""


#: How often a status write whose precondition failed only on metadata or kopf's bookkeeping is sent again.
REWRITES = 3


def write_status(namespace: str, name: str, stored: Mapping[str, Any], new: Any) -> bool:
    """The reconcile's status, through the one status writer (`effects.patch_status`): with the resourceVersion of
    `stored` (the VLLMService as read) as a precondition. On a 409 (or a write whose answer was lost) the service is
    read again: the write landed — done; the spec moved past the generation reconciled (an edit while the children
    were applied: the usual 409 of several edits in a row) — `Superseded`, no retry delay; only metadata or kopf's
    own bookkeeping moved (its diff base, its progress) — the same status is written again on the new version;
    the status itself changed — kopf runs the reconcile again in a second, on what is stored then."""
    for _ in range(REWRITES):
        written = effects.patch_status(namespace, name, stored, new)
        if written is not None:
            return written
        fresh = effects.read_service(namespace, name)
        if fresh is None:
            break
        if int((fresh.get("metadata") or {}).get("generation") or 1) > int(new.observed_generation or 0):
            raise Superseded(f"{namespace}/{name} changed while generation {new.observed_generation} was reconciled")
        current = dict(fresh.get("status") or {})
        if not cond.status_patch(current, new):
            return True  # the write landed; its answer was lost
        if _bare(current) != _bare(stored.get("status") or {}):
            break  # another writer changed the status: build it again from what is stored now
        stored = fresh
    raise kopf.TemporaryError(f"the status of {name} changed while it was reconciled; again", delay=1)


def reconcile_service(name: str, namespace: str, uid: str, generation: int, spec: Mapping[str, Any],
                      status: Mapping[str, Any], logger: logging.Logger | kopf.Logger,
                      new: bool = False, node_max_age: float = 0.0) -> reconcile.Desired:
    """Observe, compute, apply — the whole reconcile of one VLLMService (under the service's lock, on its
    current status: the status in kopf's event may predate a ladder step the pod handler just wrote).

    `new`: kopf's creation event of a service without status — nothing else has written to it or made its
    children yet, so neither is read first (a burst of creations costs half the requests).
    `node_max_age`: a list of the GPU nodes this recent (seconds) will do (0: list them now)."""
    with kube.service_lock(namespace, name):
        stored: Mapping[str, Any] = {"status": dict(status)}  # a new service: written without a precondition
        if not new:
            with kube.api_errors(f"read {name}"):
                fresh = kube.get(kube.VLLMSERVICES, namespace, name)
            if fresh is not None:
                stored, status = fresh, dict(fresh.get("status") or {})
        return _reconcile_locked(name, namespace, uid, generation, spec, status, logger, new=new,
                                 node_max_age=max(node_max_age, NODE_CACHE_SECONDS if new else 0.0),
                                 stored=stored)


def reconcile_current(name: str, namespace: str, generation: int, logger: logging.Logger | kopf.Logger,
                      node_max_age: float = 0.0) -> bool:
    """The watchdog's reconcile: on the service as stored now, only while it is still at `generation` (a newer
    spec is its update handler's to apply, never an older one the watchdog listed). False when it moved or is gone."""
    with kube.service_lock(namespace, name):
        with kube.api_errors(f"read {name}"):
            fresh = kube.get(kube.VLLMSERVICES, namespace, name)
        meta = (fresh or {}).get("metadata") or {}
        if fresh is None or meta.get("deletionTimestamp") or int(meta.get("generation") or 1) != generation:
            return False
        try:
            _reconcile_locked(name, namespace, str(meta.get("uid") or ""), generation, dict(fresh.get("spec") or {}),
                              dict(fresh.get("status") or {}), logger, node_max_age=node_max_age, stored=fresh)
        except Superseded:
            return False  # a newer spec arrived meanwhile: its update handler applies it
    return True


#: How long a list of GPU nodes serves the creation of other services (a burst of creations lists the nodes once a
#: second, not once per service; updates, resumes and the watchdog always list them afresh).
NODE_CACHE_SECONDS = 1.0
_node_cache: dict[tuple[int, tuple[tuple[str, str], ...]], tuple[float, list[dict[str, str]]]] = {}
_node_cache_lock = threading.Lock()


def gpu_nodes(node_selector: Mapping[str, str], max_age: float = NODE_CACHE_SECONDS) -> list[dict[str, str]]:
    """The labels of the nodes matching `node_selector`, from a list at most `max_age` seconds old."""
    key = (id(kube.client()), tuple(sorted((str(k), str(v)) for k, v in node_selector.items())))
    now = time.monotonic()
    with _node_cache_lock:
        hit = _node_cache.get(key)
    if hit is not None and now - hit[0] < max_age:
        return hit[1]
    nodes = list_gpu_nodes(dict(node_selector))
    with _node_cache_lock:
        _node_cache[key] = (now, nodes)
    return nodes


def _reconcile_locked(name: str, namespace: str, uid: str, generation: int, spec: Mapping[str, Any],
                      status: Mapping[str, Any], logger: logging.Logger | kopf.Logger,
                      new: bool = False, node_max_age: float = 0.0,
                      stored: Mapping[str, Any] | None = None) -> reconcile.Desired:
    status, stored = relearn(name, namespace, uid, spec, status, stored, logger)
    spec_dict = dict(spec)
    service = {"metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": generation},
               "spec": spec_dict, "status": dict(status)}
    observed = observe_service(service, _now(), share=observe_share(name, namespace, spec_dict),
                               nodes=(lambda selector: gpu_nodes(selector, node_max_age)) if node_max_age > 0
                               else list_gpu_nodes)
    desired = reconcile.desired_state(observed)
    if desired.children is None and desired.plan is not None and not desired.plan.fits:
        previous = previous_workload(namespace, name)
        if previous is not None:  # nothing is deleted for a plan that does not fit: say what still serves
            desired.status = reconcile.previous_still_serves(desired.status, kind=previous[0], name=previous[1],
                                                             ready=previous[2], generation=generation,
                                                             now=observed.now)
    if cond.find_condition(desired.status.conditions, cond.READY) is None:
        # every service has a Ready condition (the READY column), invalid and unplannable ones included
        degraded = cond.find_condition(desired.status.conditions, cond.DEGRADED)
        reason = degraded.reason if degraded is not None and degraded.status == cond.TRUE else cond.PODS_NOT_READY
        desired.status = cond.fold_status(desired.status, conditions=[cond.ConditionUpdate(
            cond.READY, cond.FALSE, reason, "nothing of this spec serves")], observed_generation=generation,
            now=observed.now)
    if answered_failure(desired.status.model_dump(by_alias=True), generation=None):
        # the last attempt failed (ReconcileError, ChildRejected); this one got through: the answer no longer holds
        desired.status = cond.fold_status(desired.status, conditions=[cond.ConditionUpdate(
            cond.DEGRADED, cond.FALSE, cond.AS_EXPECTED, "the spec is reconciled")], observed_generation=generation,
            now=observed.now)
    if desired.plan is not None:
        metrics.record_plan(namespace, name, desired.plan.fits, desired.plan.flags,
                            desired.plan.prediction.kv_cache_tokens)
    desired = prewarm.guard(namespace, name, spec_dict, status, desired, observed.now)  # warm nodes first
    desired = placement.guard(namespace, name, status, desired, observed.now)
    if placement.announces(desired):
        # record, then act: the interruption is in the status (and said) before the Deployment changes
        write_status(namespace, name, stored if stored is not None else {"status": dict(status)}, desired.status)
        stored = effects.read_service(namespace, name) or stored
        placement.post_announcement(namespace, _involved(name, namespace, uid), desired)
    written: list[str] = []

    recorder = SwitchRecorder(namespace, name, generation, observed.now, desired,
                              stored if stored is not None else {"status": dict(status)})
    if desired.children is not None:
        for line in effects.delete_stale(desired.stale, namespace):
            logger.info(line)
        apply = effects.create_children if new else functools.partial(apply_children, record=recorder)
        for line in apply(desired.children, namespace):
            written.append(line)
            logger.info(line)
            if line.startswith(("updated Deployment ", "updated StatefulSet ")) and _profile_changed(status, desired):
                # a new profile: none of its pods runs yet, whatever readyReplicas says
                desired.status = cond.fold_status(
                    desired.status, conditions=rollout.started_conditions(
                        desired.status.replicas or 0, int(status.get("readyReplicas") or 0)),
                    observed_generation=generation, now=observed.now)
        recorder.fold_ready()
    write_status(namespace, name, recorder.stored, desired.status)
    group = group_of(spec_dict)
    if group is not None and any(line.startswith(("created ConfigMap vllm-share-", "updated ConfigMap vllm-share-"))
                                 for line in written):
        poke_share_group(namespace, group, besides=name)  # the group's plan changed: the others' shares may have
    involved = _involved(name, namespace, uid)
    for event in desired.events:
        effects.post_event_or_retry(namespace, involved, event.type, event.reason, event.message)
    return desired


class SwitchRecorder:
    """Record, then act: a switch between workload kinds: its next step goes into the status (the reconcile's
    `desired.status`, through the one status writer) before `effects.apply_children` takes it; the first step,
    `CreateTarget`, together with the plan choosing the new kind. A step the stored status says already is not
    written again. `stored`: the service as last read, the precondition of the next status write."""

    def __init__(self, namespace: str, name: str, generation: int, now: datetime, desired: reconcile.Desired,
                 stored: Mapping[str, Any]) -> None:
        self.namespace, self.name, self.generation, self.now = namespace, name, generation, now
        self.desired, self.stored = desired, stored

    def __call__(self, step: WorkloadSwitch | None) -> None:
        self.desired.status = cond.fold_status(self.desired.status, observed_generation=self.generation,
                                               now=self.now, workload_switch=step)
        said = switch.recorded(self.stored.get("status") or {})
        if step == said and (step is None or step.step != switch.CREATE_TARGET):
            return  # recorded already: the reconcile's own status write carries it on
        if write_status(self.namespace, self.name, self.stored, self.desired.status):
            self.stored = effects.read_service(self.namespace, self.name) or self.stored

    def fold_ready(self) -> None:
        """While the new workload is not Ready the reconcile says what the Deployment's rollout and the groups say
        (`api.serving`): Ready False, the previous workload still serving; what they wrote for this switch stands."""
        record = self.desired.status.workload_switch
        if record is None or record.step not in (switch.CREATE_TARGET, switch.WAIT_READY):
            return
        said: Mapping[str, Any] = next((c for c in (self.stored.get("status") or {}).get("conditions") or []
                                        if c.get("type") == cond.READY), {})
        if said.get("reason") == cond.SERVING_PREVIOUS_PROFILE and str(said.get("message") or "").startswith(
                f"the previous {record.previous} "):
            update: cond.ConditionUpdate | None = cond.ConditionUpdate(
                cond.READY, cond.FALSE, cond.SERVING_PREVIOUS_PROFILE, str(said["message"]))
        else:
            name = effects.workload_names(self.name)[record.previous]
            with kube.api_errors(f"read {record.previous} {name}"):
                previous = kube.get(kube.KIND_RESOURCES[record.previous], self.namespace, name)
            update = serving.switching(record, previous_name=name, previous_ready=int(
                ((previous or {}).get("status") or {}).get("readyReplicas") or 0),
                target_said=f"the {record.target} is not Ready yet")
        # the scale subresource's selector (the HPA's pods) stays on the pods that serve until the Service moves
        selector = serving_now(self.name, self.namespace,
                               self.desired.status.model_dump(by_alias=True, exclude_none=True)).label_selector()
        self.desired.status = cond.fold_status(self.desired.status, conditions=[update] if update else [],
                                               observed_generation=self.generation, now=self.now, selector=selector)


def previous_workload(namespace: str, name: str) -> tuple[str, str, int] | None:
    """The workload of ours that an earlier plan rolled out, if one exists: (kind, name, ready pods or groups)."""
    names = child_names(name)
    with kube.api_errors("read the Deployment"):
        deployment = kube.get(kube.DEPLOYMENTS, namespace, names.deployment)
    if deployment is not None and _ours(deployment, name):
        return "Deployment", names.deployment, int((deployment.get("status") or {}).get("readyReplicas") or 0)
    with kube.api_errors("read the StatefulSet"):
        pods = kube.get(kube.STATEFULSETS, namespace, statefulset_name(name))
    if pods is not None and _ours(pods, name):
        return "StatefulSet", statefulset_name(name), int((pods.get("status") or {}).get("readyReplicas") or 0)
    if lws.api_served():
        with kube.api_errors("read the LeaderWorkerSet"):
            group = kube.get(kube.LEADERWORKERSETS, namespace, lws_name(name))
        if group is not None and _ours(group, name):
            return "LeaderWorkerSet", lws_name(name), int((group.get("status") or {}).get("readyReplicas") or 0)
    return None


def _ours(obj: Mapping[str, Any], service: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_SERVICE) == child_names(service).label and labels.get(
        "app.kubernetes.io/managed-by") == MANAGED_BY


def _profile_changed(status: Mapping[str, Any], desired: reconcile.Desired) -> bool:
    before = status.get("plan") or {}
    after = desired.status.plan
    return after is not None and before.get("args") != after.args


def relearn(name: str, namespace: str, uid: str, spec: Mapping[str, Any], status: Mapping[str, Any],
            stored: Mapping[str, Any] | None, logger: logging.Logger | kopf.Logger,
            ) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    """The ladder belongs to the plan's inputs it was learned on (`ladder.for_inputs`): a profile learned on other
    inputs is dropped — recorded first, through the one status writer, before anything is rendered without it — and
    once: the write carries the new inputs' hash, so a retry, a 409 or the next event of the same change finds
    nothing to reset. A status without the hash adopts it in the reconcile's own write. Returns the status to
    reconcile and the service it was read from (the precondition of the reconcile's write)."""
    inputs = ladder.spec_inputs_hash(spec, config.CONFIG.default_image or DEFAULT_IMAGE)
    change = ladder.for_inputs(ladder.remediation_of(status), inputs)
    if change is None:
        return status, stored
    if not change.reset:
        return {**status, "remediation": change.remediation.model_dump(by_alias=True, exclude_none=True)}, stored

    def build(service: dict[str, Any]) -> Any:
        current = service.get("status") or {}
        again = ladder.for_inputs(ladder.remediation_of(current), inputs)
        if again is None:
            return None  # recorded already (an earlier write landed before its answer was lost)
        generation = current.get("observedGeneration")
        return cond.fold_status(current, observed_generation=generation if isinstance(generation, int) else None,
                                now=_now(), remediation=again.remediation)

    if effects.update_status(namespace, name, build):
        logger.info("%s", change.message)
        effects.post_event(namespace, _involved(name, namespace, uid), "Normal", PROFILE_RESET, change.message)
    with kube.api_errors(f"read {name}"):
        fresh = kube.get(kube.VLLMSERVICES, namespace, name)
    if fresh is None:
        raise kopf.TemporaryError(f"{name} is gone", delay=1)
    return dict(fresh.get("status") or {}), fresh


#: The Event reason of a learned profile dropped because the plan's inputs changed.
PROFILE_RESET = "ProfileReset"


#: Reconciles run here, off the event loop, each bounded in time: one slow service never holds up the others.
RECONCILE_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="reconcile")
#: The longest pause between retries of a transient failure (seconds).
MAX_RETRY_DELAY = 600.0


def backoff(delay: float | None, retry: int) -> float:
    """A transient failure's delay, doubled with each retry of the same handler, capped."""
    return float(min((delay or 1.0) * 2 ** min(retry, 10), MAX_RETRY_DELAY))


async def vllmservice_reconcile(*, name: str, namespace: str | None, uid: str, meta: kopf.Meta, spec: kopf.Spec,
                                status: Mapping[str, Any], logger: kopf.Logger, reason: str, retry: int = 0,
                                **_: Any) -> None:
    """Every VLLMService gets an answer: a status, or — when anything goes wrong — a condition and one Event naming
    what is wrong and what to change. A permanent failure (the API server refused a child, an unexpected error, a
    reconcile past its time bound) is not retried until the spec changes; a transient one backs off."""
    assert namespace is not None  # VLLMService is namespaced
    generation = int(meta.get("generation") or 1)
    call = functools.partial(_reconcile_now, name, namespace, uid, generation, copy.deepcopy(dict(spec)),
                             copy.deepcopy(dict(status)), logger, reason)
    loop = asyncio.get_running_loop()
    timeout = config.CONFIG.reconcile_timeout_seconds
    try:
        desired = await asyncio.wait_for(loop.run_in_executor(RECONCILE_POOL, call), timeout=timeout)
    except Superseded as exc:  # the newer spec is kopf's next update, at once: no retry delay
        logger.info("%s; the newer spec is reconciled next", exc)
        return
    except kube.Rejected as exc:
        await _answer(namespace, name, uid, generation, cond.CHILD_REJECTED,
                      f"{exc}; change the spec so that what the operator renders from it is valid", logger)
        raise
    except TimeoutError:
        await _answer(namespace, name, uid, generation, cond.RECONCILE_ERROR,
                      f"reconciling took longer than {timeout:.0f} s (reading the model or planning it): the spec "
                      "asks for too much work (e.g. a huge spec.model.config); change it", logger)
        raise kopf.PermanentError(f"reconcile exceeded {timeout:.0f} s") from None
    except kopf.TemporaryError as exc:
        metrics.RECONCILES.labels(outcome="retry").inc()
        raise kopf.TemporaryError(str(exc), delay=backoff(exc.delay, retry)) from exc
    except kopf.PermanentError:
        raise
    except Exception as exc:
        logger.exception("reconcile of %s/%s failed", namespace, name)
        await _answer(namespace, name, uid, generation, cond.RECONCILE_ERROR,
                      f"the operator could not reconcile this spec ({type(exc).__name__}: {str(exc)[:500]}); "
                      "change the spec — it is retried when the spec changes — or report this error", logger)
        raise kopf.PermanentError(f"{type(exc).__name__}: {exc}") from exc
    metrics.RECONCILES.labels(outcome="ok" if desired.plan and desired.plan.fits else "not_deployed").inc()
    if desired.retry_after:
        raise kopf.TemporaryError("waiting: " + "; ".join(e.message for e in desired.events)[:200],
                                  delay=backoff(desired.retry_after, retry))


def _reconcile_now(name: str, namespace: str, uid: str, generation: int, spec: dict[str, Any],
                   status: dict[str, Any], logger: kopf.Logger, reason: str) -> reconcile.Desired:
    return reconcile_service(name, namespace, uid, generation, spec, status, logger,
                             new=reason == "create" and not status)


async def _answer(namespace: str, name: str, uid: str, generation: int, reason: str, message: str,
                  logger: kopf.Logger) -> None:
    """Say what went wrong: Degraded=True (and Ready/Progressing False) with `reason`, and one Event."""
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(RECONCILE_POOL, functools.partial(
            record_failure, namespace, name, uid, generation, reason, message))
    except Exception as exc:  # the answer could not be written: let kopf retry the whole reconcile
        metrics.RECONCILES.labels(outcome="retry").inc()
        raise kopf.TemporaryError(f"{reason}: {message[:200]} (and the status write failed: {exc})",
                                  delay=5) from exc
    metrics.RECONCILES.labels(outcome="error").inc()
    logger.error("%s: %s", reason, message)


def record_failure(namespace: str, name: str, uid: str, generation: int, reason: str, message: str) -> None:
    """Write the failure with the status's resourceVersion as a precondition, without the service's lock (a
    reconcile past its time bound may still hold it), then post its Event unless the status already said it."""
    updates = [cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, reason, message),
               cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, reason, "waiting for a spec change"),
               cond.ConditionUpdate(cond.READY, cond.FALSE, reason, "the current spec is not applied")]
    for _ in range(5):
        service = effects.read_service(namespace, name)
        if service is None:
            return
        stored = service.get("status") or {}
        said = any(c.get("type") == cond.DEGRADED and c.get("status") == cond.TRUE and c.get("reason") == reason
                   and c.get("message") == message and c.get("observedGeneration") == generation
                   for c in stored.get("conditions") or [])
        new = cond.fold_status(stored, conditions=updates, observed_generation=generation, now=_now())
        if effects.patch_status(namespace, name, service, new) is not None:
            break
    else:
        raise kopf.TemporaryError(f"the status of {namespace}/{name} could not be written", delay=1)
    if not said:
        effects.post_event(namespace, _involved(name, namespace, uid), "Warning", reason, message)


def answered_failure(status: Mapping[str, Any], generation: int | None) -> bool:
    """Whether the status holds a permanent failure (of this generation, unless None): no timer retries it."""
    return any(c.get("type") == cond.DEGRADED and c.get("status") == cond.TRUE
               and c.get("reason") in (cond.RECONCILE_ERROR, cond.CHILD_REJECTED)
               and generation in (None, c.get("observedGeneration")) for c in status.get("conditions") or [])


def pod_event(body: Mapping[str, Any], type: str | None, logger: kopf.Logger, **_: Any) -> None:
    """A pod of ours changed: if its vLLM container failed, walk the remediation ladder one step."""
    if type == "DELETED":
        return
    meta = body.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(LABEL_SERVICE)
    warmed = None if owner else prewarm.warmed_service(body)
    if warmed is not None:  # a prewarm pod done on its node: the service's reconcile looks now
        found = effects.read_service(meta["namespace"], warmed)
        if found is not None:
            RECONCILE_POOL.submit(_poke, warmed, meta["namespace"], int(found["metadata"].get("generation") or 1))
        return
    if owner and LWS_NAME_LABEL in (meta.get("labels") or {}):
        try:  # a pod of a LeaderWorkerSet group: its readiness is the group's; its failure is recorded (rank, stage)
            lws.refresh(meta["namespace"], owner)
        except kopf.TemporaryError as exc:
            logger.warning("group status deferred: %s", exc)
        if rollout.unschedulable_message(body):
            return  # the group's InsufficientNodes is said; there is no Deployment rollout to switch
    if owner:
        try:  # a measured download (init container's report, or vLLM's log line once Ready) → status.modelCache
            downloads.record_download(meta["namespace"], owner, body)
        except kopf.TemporaryError as exc:
            logger.warning("measured download not recorded: %s", exc)
        try:  # once its vLLM is Ready, one read of its log: the start, phase by phase → status.coldStart, vLLM's
            # own download, and vLLM's "GPU KV cache size: N tokens" → status.kvCache next to the prediction
            text = downloads.ready_log(meta["namespace"], body)
            if text is not None:
                downloads.record_ready(meta["namespace"], owner, body, text)
                measured.record_kv_cache(meta["namespace"], owner, body, text)
        except kopf.TemporaryError as exc:
            logger.warning("what the pod's start measured is not recorded: %s", exc)
    if owner and (rollout.unschedulable_message(body) or rollout.in_init(body)):  # scheduler / model download
        try:  # the scheduler's word goes into the status (and may switch the rollout to no surge)
            rollouts.refresh(meta["namespace"], owner)
        except kopf.TemporaryError as exc:
            logger.warning("rollout status deferred: %s", exc)
        return
    if not owner or not _looks_failed(body):
        return
    try:
        remediate_service(meta["namespace"], owner, logger)
    except kopf.TemporaryError as exc:  # event handlers are not retried: the watchdog (handlers/watchdog.py) looks again
        logger.warning("remediation deferred: %s", exc)


def _looks_failed(pod: Mapping[str, Any]) -> bool:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if (container.get("lastState") or {}).get("terminated") or (container.get("state") or {}).get("terminated"):
            return True
        if ((container.get("state") or {}).get("waiting") or {}).get("reason") in (
                "CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError"):
            return True
    return False


def deployment_event(body: Mapping[str, Any], type: str | None, **_: Any) -> None:
    """Fold the rollout of a Deployment or StatefulSet into the owner's status: Ready means the pods of the current
    profile serve (api.rollout)."""
    if type == "DELETED":
        return
    meta = body.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(LABEL_SERVICE)
    namespace = meta.get("namespace")
    if not owner or not namespace:
        return
    if not body.get("status"):
        return  # the Deployment controller has not looked at it yet: the reconcile's status stands
    changed = rollouts.refresh(namespace, owner, body)
    group = (meta.get("labels") or {}).get(GROUP_LABEL)
    if changed and group:  # a share-group member's pods changed: a neighbour may be waiting for it (issue 26)
        poke_share_group(namespace, group, besides=owner)


def lws_event(body: Mapping[str, Any], type: str | None, logger: kopf.Logger, **_: Any) -> None:
    """A LeaderWorkerSet of ours changed: fold its groups into the owner's status, and finish a switch to it (the
    LWS controller counts a group ready after its pods are: a pod event alone may come before the count does)."""
    if type == "DELETED":
        return
    meta = body.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(LABEL_SERVICE)
    namespace = meta.get("namespace")
    if not owner or not namespace or not body.get("status"):
        return  # the LWS controller has not looked at it yet: the reconcile's status stands
    if meta.get("name") != lws_name(owner):
        return  # not the one LeaderWorkerSet of this service (render/lws.py names it)
    try:  # idempotent: writes the service's status only when it changed, never the LeaderWorkerSet
        lws.refresh(namespace, owner)
    except kopf.TemporaryError as exc:  # event handlers are not retried: the next event, or the watchdog, looks again
        logger.warning("group status deferred: %s", exc)


def poke_share_group(namespace: str, group: str, besides: str) -> None:
    """Reconcile the other members of a share group soon (off this thread): their shares, or their wait, may have
    changed with this member."""
    for member, generation in group_members(namespace, group):
        if member != besides:
            RECONCILE_POOL.submit(_poke, member, namespace, generation)


def _poke(name: str, namespace: str, generation: int) -> None:
    try:
        reconcile_current(name, namespace, generation, log)
    except Exception as exc:  # noqa: BLE001 - a poke is a courtesy: the watchdog reconciles the member anyway
        log.info("share group: reconciling %s/%s after a neighbour changed failed: %s", namespace, name, exc)
