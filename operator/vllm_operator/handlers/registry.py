"""Every kopf handler of the operator, on one registry: what kopf calls, and the function that does the work.

Each handler here is a thin delegate (no logic, the same name as before, so kopf's handler ids — stored in
`status.kopf.progress` — do not change); kopf's settings are made in `service.operator_startup`. The order below
is the order kopf registers, and so runs, the startup handlers: kopf's own settings first, then the watchdog.
No other module uses a kopf decorator (tests/unit/test_house_rules.py).
"""

from __future__ import annotations

from typing import Any

import kopf

from ..api.v1alpha1 import GROUP, PLURAL, VERSION
from . import metrics_watch, service, watchdog

registry = kopf.OperatorRegistry()


@kopf.on.startup(registry=registry)
def operator_startup(**kwargs: Any) -> None:
    """kopf's settings: persistence, posting, watching, workers, error delays."""
    service.operator_startup(**kwargs)


@kopf.on.login(registry=registry)
def operator_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else the kubeconfig."""
    return service.operator_login(**kwargs)


@kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
@kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
@kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
async def vllmservice_reconcile(**kwargs: Any) -> None:
    """A VLLMService created, changed or found at start: observe, plan, apply."""
    await service.vllmservice_reconcile(**kwargs)


@kopf.on.event("", "v1", "pods", labels=service.MANAGED, registry=registry)
def pod_event(**kwargs: Any) -> None:
    """A pod of ours changed: its group, download, start measurements, rollout; a failure walks the ladder."""
    service.pod_event(**kwargs)


# `field`/`value`: kopf skips a Deployment the controller has not looked at yet (no status: the reconcile's status
# stands) without building the handler's arguments — every new service's Deployment, in a burst of creations.
@kopf.on.event("apps", "v1", "deployments", labels=service.MANAGED, field="status", value=kopf.PRESENT,
               registry=registry)
def deployment_event(**kwargs: Any) -> None:
    """A Deployment of ours changed: fold the rollout into the owner's status."""
    service.deployment_event(**kwargs)


@kopf.on.event("apps", "v1", "statefulsets", labels=service.MANAGED, field="status", value=kopf.PRESENT,
               registry=registry)
def statefulset_event(**kwargs: Any) -> None:
    """A StatefulSet of ours changed (a claim per pod without LeaderWorkerSet): fold its rollout into the owner's
    status, as a Deployment's."""
    service.deployment_event(**kwargs)


# The LeaderWorkerSet's own status: its controller counts a group ready after the group's pods are, so a switch to
# it (and the groups' Ready) must not wait for a pod event that came first. Without the LWS CRD kopf logs once that
# the resource is unresolved and starts watching when the CRD appears (it watches CRDs).
@kopf.on.event("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", labels=service.MANAGED, field="status",
               value=kopf.PRESENT, registry=registry)
def lws_event(**kwargs: Any) -> None:
    """A LeaderWorkerSet of ours changed: fold its groups into the owner's status; finish a switch to it."""
    service.lws_event(**kwargs)


@kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, when=metrics_watch.prometheus_enabled,
             cancellation_backoff=5.0, cancellation_timeout=10.0)
async def vllmservice_metrics_watch(**kwargs: Any) -> None:
    """spec.prometheus.enabled: read vLLM's metrics every interval, write status.metrics, act."""
    await metrics_watch.vllmservice_metrics_watch(**kwargs)


@kopf.on.startup(registry=registry)
async def watchdog_startup(**kwargs: Any) -> None:
    """Start the watchdog's sweep (one task for the operator)."""
    await watchdog.watchdog_startup(**kwargs)


@kopf.on.cleanup(registry=registry)
async def watchdog_cleanup(**kwargs: Any) -> None:
    """Stop the sweep."""
    await watchdog.watchdog_cleanup(**kwargs)
