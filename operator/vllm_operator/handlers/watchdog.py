"""The watchdog: one sweep over every VLLMService for the whole operator, not a kopf timer per object.

A safety net behind the event handlers: it catches pod failures whose events were missed (restarts, deferred
steps), takes a due step up, and re-applies the plan if anything drifted; it writes nothing when nothing changed.
Each round first asks the API afresh which optional CRDs it serves (KEDA, the Inference Extension, LeaderWorkerSet):
one installed after the operator started is picked up within one round.

Why not `@kopf.timer`: kopf puts a finalizer on every object that has a timer (one more PATCH, and one more event
cycle, per new service) and keeps one asyncio task per object; a kopf index instead would cost a handler call on
every event of every service. Here one task lists the services once per round and walks the list, spreading them
over `WATCHDOG_INTERVAL` so the API sees a steady trickle, not a burst. A service whose spec changed since the list
(its generation moved) is left to its update handler: the watchdog never renders an older spec. A service younger
than `WATCHDOG_MIN_AGE` is left to its creation handler (as the timer's initial delay did): a burst of creations is
not swept while it is being created.

Peering: kopf pauses a replica when its peering object names a live peer of the same or a higher priority; it
stops the timers of a paused replica, but it does not expose the pause. The sweep applies kopf's own rule to the
peering object it reads before each round and again every `PEERING_RECHECK` seconds during one (`peering_paused`,
pure); a peering object it cannot read counts as paused (so does kopf, until it has seen it). Standalone: always on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from ..api.times import parse_time
from . import config, effects, kube, lws
from .observe import served_kinds
from .remediation import remediate_service, step_up_service
from .service import RECONCILE_POOL, answered_failure, reconcile_current

log = logging.getLogger("vllm_operator.watchdog")


def finish_switch(namespace: str, name: str) -> None:
    """A workload switch whose new workload is Ready: reconcile the service now, at its stored generation (see
    `effects.finish_switch`); the sweep would do the same at its next round."""
    with kube.api_errors(f"read {name}"):
        fresh = kube.get(kube.VLLMSERVICES, namespace, name)
    if fresh is not None:
        reconcile_current(name, namespace, int((fresh.get("metadata") or {}).get("generation") or 1), log)


effects.SWITCH_FINISHER = finish_switch

#: The watchdog's period (seconds): every service is looked at once per round (benchmarks/operator_scale.py
#: --idle-seconds measures the cost at rest).
WATCHDOG_INTERVAL = 120.0
#: The first round starts this long after the operator (seconds): the creations and resumes go first.
WATCHDOG_INITIAL_DELAY = 60.0
#: A service younger than this (seconds) is left to its creation handler (a burst of creations is not swept).
WATCHDOG_MIN_AGE = 60.0
#: How old a list of the GPU nodes the watchdog's re-plan may use (seconds): one list serves many services.
WATCHDOG_NODE_MAX_AGE = 60.0
#: How long a reading of the peering object holds during a round (seconds).
PEERING_RECHECK = 10.0

CLUSTER_PEERINGS = kube.Resource("kopf.dev", "v1", "clusterkopfpeerings", namespaced=False)
NAMESPACED_PEERINGS = kube.Resource("kopf.dev", "v1", "kopfpeerings")


@dataclass(frozen=True)
class Watched:
    """What a round needs of one VLLMService, from the round's list."""

    uid: str
    generation: int
    spec: dict[str, Any]
    #: the status holds a permanent failure of this generation: it waits for a spec change, not for the watchdog
    failed: bool
    #: metadata.creationTimestamp (None: unreadable)
    created: datetime | None = None


def list_services(namespaces: tuple[str, ...]) -> list[tuple[tuple[str, str], Watched]]:
    """The VLLMServices of the watched namespaces (all when empty), in a stable order: one list per round, read in
    pages, of which only what a round needs is kept (not the statuses)."""
    found = []
    with kube.api_errors("list VLLMServices"):
        for namespace in namespaces or (None,):
            for item in kube.list_pages(kube.VLLMSERVICES, namespace):
                meta = item.get("metadata") or {}
                if meta.get("deletionTimestamp") or not meta.get("name"):
                    continue
                generation = int(meta.get("generation") or 1)
                found.append(((str(meta.get("namespace") or ""), str(meta["name"])), Watched(
                    uid=str(meta.get("uid") or ""), generation=generation, spec=dict(item.get("spec") or {}),
                    failed=answered_failure(item.get("status") or {}, generation),
                    created=parse_time(meta.get("creationTimestamp")))))
    return sorted(found, key=lambda entry: entry[0])


# --------------------------------------------------------------------------------------------------
# Peering: is this replica the one that acts?
# --------------------------------------------------------------------------------------------------


def peering_paused(peering: Mapping[str, Any] | None, identity: str, priority: int, now: datetime) -> bool:
    """kopf's rule (kopf._core.engines.peering.process_peering_event) on one peering object: paused when it is
    missing or names a live peer other than `identity` with a priority at least `priority` (equal priorities
    pause every replica). A peer is dead once `lastseen + lifetime` has passed; an entry that cannot be read
    counts as alive."""
    if peering is None:
        return True
    peers = peering.get("status") or {}
    if not isinstance(peers, Mapping):
        return True
    for peer, info in peers.items():
        if peer == identity:
            continue
        if not isinstance(info, Mapping):
            return True
        if _peer_alive(info, now) and _priority(info) >= priority:
            return True
    return False


def _priority(info: Mapping[str, Any]) -> int:
    try:
        return int(info.get("priority", 0))
    except (TypeError, ValueError):
        return 2**31  # unreadable: assume it outranks us


def _peer_alive(info: Mapping[str, Any], now: datetime) -> bool:
    lastseen = info.get("lastseen")
    seen = parse_time(lastseen) if lastseen is not None else now
    if seen is None:
        return True
    try:
        return seen + timedelta(seconds=int(info.get("lifetime", 60))) > now
    except (TypeError, ValueError, OverflowError):
        return True


@dataclass(frozen=True)
class Peering:
    """How this replica takes part in kopf's peering (from kopf's settings and `vllm-operator run`)."""

    standalone: bool
    name: str
    priority: int
    identity: str
    #: the namespaces whose KopfPeering counts; empty: the ClusterKopfPeering
    namespaces: tuple[str, ...] = ()


def read_peering(resource: kube.Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
    """The peering object, through the list kopf's own RBAC allows (list/watch; patch only for its keep-alive)."""
    found = kube.list_objects(resource, namespace, field_selector=f"metadata.name={name}")
    return found[0] if found else None


def replica_active(peering: Peering) -> bool:
    """Whether kopf's peering lets this replica act now (one read per peering object)."""
    if peering.standalone:
        return True
    now = datetime.now(UTC)
    try:
        if not peering.namespaces:
            return not peering_paused(read_peering(CLUSTER_PEERINGS, None, peering.name), peering.identity,
                                      peering.priority, now)
        return not any(peering_paused(read_peering(NAMESPACED_PEERINGS, namespace, peering.name),
                                      peering.identity, peering.priority, now) for namespace in peering.namespaces)
    except Exception as exc:  # unreadable: act as kopf does until it has seen the object, i.e. not at all
        log.warning("watchdog: the peering object %s cannot be read (%s); not acting this time", peering.name, exc)
        return False


# --------------------------------------------------------------------------------------------------
# One service, one round
# --------------------------------------------------------------------------------------------------


def watch_service(namespace: str, name: str, watched: Watched, logger: logging.Logger | kopf.Logger = log) -> None:
    """Look at one service: a missed pod failure (a ladder step), a due step up, or drift (a reconcile that
    writes only what changed). A permanent failure waits for a spec change, not for the watchdog."""
    if watched.failed:
        return
    remediation = watched.spec.get("remediation")  # as stored: any JSON, valid or not
    allow_step_up = isinstance(remediation, Mapping) and remediation.get("allowStepUp") is True
    with kube.shared_reads():  # the service and its Deployment are read once for the three looks (until a write)
        if remediate_service(namespace, name, logger) is None and not (
                allow_step_up and step_up_service(namespace, name, logger)):
            reconcile_current(name, namespace, watched.generation, logger, node_max_age=WATCHDOG_NODE_MAX_AGE)


def rediscover() -> None:
    """Ask the API afresh which optional kinds it serves; the round's reconciles then use that answer."""
    served_kinds(max_age=0.0)
    lws.api_served(max_age=0.0)


class Sweeper:
    """The watchdog's task: a round every `interval` seconds, services spread evenly over it."""

    def __init__(self, peering: Peering, namespaces: tuple[str, ...] = ()) -> None:
        self.peering, self.namespaces = peering, namespaces
        self._checked = (-float("inf"), False)

    async def run(self, initial_delay: float, interval: float) -> None:
        await asyncio.sleep(initial_delay)
        while True:
            started = time.monotonic()
            await self.sweep(interval)
            await asyncio.sleep(max(0.0, started + interval - time.monotonic()))

    async def may_act(self) -> bool:
        checked_at, verdict = self._checked
        if time.monotonic() - checked_at >= PEERING_RECHECK:
            loop = asyncio.get_running_loop()
            verdict = await loop.run_in_executor(RECONCILE_POOL, replica_active, self.peering)
            self._checked = (time.monotonic(), verdict)
        return verdict

    async def sweep(self, interval: float) -> None:
        """One round: each service in turn (in the reconcile pool, bounded in time), paced over `interval`."""
        if not await self.may_act():
            return  # paused by peering: the replica that acts sweeps
        loop = asyncio.get_running_loop()
        try:
            services = await loop.run_in_executor(RECONCILE_POOL, list_services, self.namespaces)
        except Exception as exc:  # the API is down or refuses: nothing to walk this round
            log.warning("watchdog: cannot list the VLLMServices (%s); next round", exc)
            return
        try:  # optional CRDs (KEDA, the Inference Extension, LeaderWorkerSet) installed since: this round sees them
            await loop.run_in_executor(RECONCILE_POOL, rediscover)
        except Exception as exc:
            log.info("watchdog: API discovery failed (%s); the last answer holds this round", exc)
        now = datetime.now(UTC)
        services = [(key, watched) for key, watched in services
                    if watched.created is None or (now - watched.created).total_seconds() >= WATCHDOG_MIN_AGE]
        step = interval * 0.9 / max(len(services), 1)
        for (namespace, name), watched in services:
            turn = time.monotonic() + step
            if not await self.may_act():
                return  # paused by peering: the replica that acts sweeps
            call = functools.partial(watch_service, namespace, name, watched)
            try:
                await asyncio.wait_for(loop.run_in_executor(RECONCILE_POOL, call),
                                       timeout=config.CONFIG.reconcile_timeout_seconds)
            except (kopf.TemporaryError, kopf.PermanentError) as exc:
                log.info("watchdog: %s/%s: %s (next round)", namespace, name, exc)
            except Exception:
                log.exception("watchdog: %s/%s failed (next round)", namespace, name)
            await asyncio.sleep(max(0.0, turn - time.monotonic()))


_tasks: set[asyncio.Task[None]] = set()


async def watchdog_startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Start the sweep (one task for the operator)."""
    peering = Peering(standalone=bool(settings.peering.standalone), name=str(settings.peering.name),
                      priority=int(settings.peering.priority), identity=config.CONFIG.peering_identity,
                      namespaces=() if settings.peering.clusterwide else config.CONFIG.namespaces)
    sweeper = Sweeper(peering, config.CONFIG.namespaces)
    task = asyncio.create_task(sweeper.run(WATCHDOG_INITIAL_DELAY, WATCHDOG_INTERVAL), name="vllm-operator watchdog")
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def watchdog_cleanup(**_: Any) -> None:
    for task in list(_tasks):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
