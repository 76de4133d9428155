"""The watchdog (handlers/watchdog.py): one sweep for the operator instead of a kopf timer per VLLMService.

It repairs drift no event announces (a deleted Deployment), never renders a spec older than the stored one, does
nothing while kopf's peering pauses the replica, and — having no per-object timer — leaves no finalizer on the
services. The operator runs in-process with a short interval; the peering rule is checked as a pure function.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.inprocess import Cluster
from vllm_operator.handlers import kube, watchdog
from vllm_operator.handlers.watchdog import Peering, peering_paused, replica_active

QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"
PEERING_CRDS = Path(__file__).resolve().parents[2] / "charts" / "vllm-operator" / "crds" / "kopf-peering.kopf.dev.yaml"
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _peer(priority: int = 0, seen_ago: float = 0.0, lifetime: int = 60) -> dict[str, Any]:
    return {"priority": priority, "lifetime": lifetime, "lastseen": (NOW - timedelta(seconds=seen_ago)).isoformat()}


# --- kopf's peering rule, as the watchdog reads it --------------------------------------------------------------

@pytest.mark.parametrize(("peers", "paused"), [
    ({}, False),  # nobody else
    ({"me": _peer(5)}, False),  # only itself
    ({"me": _peer(5), "other": _peer(3)}, False),  # a lower priority: this one acts
    ({"me": _peer(5), "other": _peer(5)}, True),  # the same priority: kopf pauses both
    ({"me": _peer(5), "other": _peer(9)}, True),  # a higher priority acts
    ({"me": _peer(5), "other": _peer(9, seen_ago=61)}, False),  # a dead peer counts for nothing
    ({"me": _peer(5), "other": {"priority": 9}}, True),  # no lastseen: alive, as kopf reads it
    ({"me": _peer(5), "other": "garbage"}, True),  # unreadable: assume it acts
])
def test_peering_paused_follows_kopfs_rule(peers: dict[str, Any], paused: bool) -> None:
    assert peering_paused({"status": peers}, "me", 5, NOW) is paused


def test_a_missing_peering_object_pauses() -> None:
    assert peering_paused(None, "me", 5, NOW) is True  # kopf waits for it too


def test_replica_active_reads_the_cluster_or_each_namespace_peering(monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime.now(UTC).isoformat()
    stored = {("", "op"): {"status": {"me": {"priority": 1, "lastseen": now}}},
              ("a", "op"): {"status": {"me": {"priority": 1, "lastseen": now}}},
              ("b", "op"): {"status": {"other": {"priority": 7, "lastseen": now}}}}
    monkeypatch.setattr(watchdog, "read_peering", lambda resource, namespace, name: stored.get((namespace or "", name)))
    assert replica_active(Peering(standalone=True, name="", priority=0, identity="me"))
    assert replica_active(Peering(standalone=False, name="op", priority=1, identity="me"))
    assert replica_active(Peering(standalone=False, name="op", priority=1, identity="me", namespaces=("a",)))
    assert not replica_active(Peering(standalone=False, name="op", priority=1, identity="me", namespaces=("a", "b")))
    assert not replica_active(Peering(standalone=False, name="gone", priority=1, identity="me"))

    def refuse(*_: Any) -> None:
        raise RuntimeError("403")

    monkeypatch.setattr(watchdog, "read_peering", refuse)
    assert not replica_active(Peering(standalone=False, name="op", priority=1, identity="me"))


def test_replica_active_on_real_peering_objects(tmp_path: Path) -> None:
    """The ClusterKopfPeering as kopf keeps it (the chart's CRD), read through a list by name."""
    h = Cluster(tmp_path)
    try:
        for crd in yaml.safe_load_all(PEERING_CRDS.read_text()):
            h.server.create_object("customresourcedefinitions", crd)
        now = datetime.now(UTC).isoformat()
        for name, peers in (("op", {"me": {"priority": 1, "lastseen": now}}),
                            ("busy", {"me": {"priority": 1, "lastseen": now}, "other": {"priority": 2,
                                                                                       "lastseen": now}})):
            h.server.create_object("clusterkopfpeerings", {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                                                           "metadata": {"name": name}, "status": peers})
        kube.configure(str(h.kubeconfig))
        assert watchdog.read_peering(watchdog.CLUSTER_PEERINGS, None, "op")["metadata"]["name"] == "op"
        assert replica_active(Peering(standalone=False, name="op", priority=1, identity="me"))
        assert not replica_active(Peering(standalone=False, name="busy", priority=1, identity="me"))
        assert not replica_active(Peering(standalone=False, name="missing", priority=1, identity="me"))
    finally:
        h.close()


# --- the sweep, in a running operator -----------------------------------------------------------------------------

@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Cluster]:
    """An operator whose watchdog starts at once and goes round every second."""
    monkeypatch.setattr(watchdog, "WATCHDOG_INITIAL_DELAY", 0.0)
    monkeypatch.setattr(watchdog, "WATCHDOG_MIN_AGE", 0.0)
    monkeypatch.setattr(watchdog, "WATCHDOG_INTERVAL", 1.0)
    monkeypatch.setattr(watchdog, "PEERING_RECHECK", 0.0)
    cluster = Cluster(tmp_path)
    cluster.add_node("gpu-1", "NVIDIA-L4")
    try:
        yield cluster
    finally:
        cluster.close()


def _handled(h: Cluster, name: str) -> dict[str, Any]:
    """kopf has finished the creation (its last-handled annotation) and the status is written."""
    def done() -> dict[str, Any] | None:
        obj = h.service(name)
        annotations = (obj or {}).get("metadata", {}).get("annotations") or {}
        ok = obj and "vllm-operator.dev/last-handled-configuration" in annotations and obj.get("status", {}).get(
            "observedGeneration")
        return dict(obj) if ok else None
    return h.wait_for(done, message=f"kopf handled {name}")


def _sweeps(h: Cluster) -> int:
    return sum(1 for r in list(h.server.emulator.access_log) if r.verb == "list" and r.resource == "vllmservices")


def test_the_watchdog_restores_a_deleted_deployment_and_puts_no_finalizer(fast: Cluster) -> None:
    h = fast
    h.start_operator()
    h.create("llama", {"model": {"name": QWEN_7B}})
    h.wait_deployment("llama")
    assert not _handled(h, "llama")["metadata"].get("finalizers")  # no per-object timer: kopf needs none

    h.server.delete_object("deployments", "llama", "default")  # no event of a VLLMService says so
    assert h.deployment("llama") is None
    h.wait_deployment("llama")  # the watchdog put it back


def test_a_paused_replica_sweeps_nothing(fast: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    h = fast
    asked: list[Peering] = []

    def standing_by(peering: Peering) -> bool:
        asked.append(peering)
        return False

    monkeypatch.setattr(watchdog, "replica_active", standing_by)
    h.start_operator()
    h.create("llama", {"model": {"name": QWEN_7B}})
    h.wait_deployment("llama")
    _handled(h, "llama")
    h.server.delete_object("deployments", "llama", "default")
    lists = _sweeps(h)
    seen = len(asked)
    h.wait_for(lambda: len(asked) >= seen + 4, message="the watchdog asked peering several times")
    assert h.deployment("llama") is None  # nothing repaired
    assert _sweeps(h) == lists  # not even listed


def test_a_young_service_is_left_to_its_creation_handler(fast: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    h = fast
    monkeypatch.setattr(watchdog, "WATCHDOG_MIN_AGE", 3600.0)
    h.start_operator()
    h.create("llama", {"model": {"name": QWEN_7B}})
    h.wait_deployment("llama")
    _handled(h, "llama")
    h.server.delete_object("deployments", "llama", "default")
    lists = _sweeps(h)
    h.wait_for(lambda: _sweeps(h) >= lists + 3, message="three rounds")
    assert h.deployment("llama") is None  # listed, but too young to be looked at


def test_the_watchdog_never_renders_an_older_spec(fast: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round lists the services, then walks them over the interval: by the time it reaches one, the user may
    have changed its spec. The stale listing must not be applied (the update handler owns the new one)."""
    h = fast
    h.start_operator()
    h.create("llama", {"model": {"name": QWEN_7B}})
    h.wait_deployment("llama")
    listed = h.wait_for(lambda: watchdog.list_services(()) or None)
    stale = listed[0][1]
    h.patch_spec("llama", {"replicas": 2})
    h.wait_deployment("llama", lambda d: d["spec"]["replicas"] == 2)
    h.wait_for(lambda: h.service("llama")["status"].get("observedGeneration") == stale.generation + 1)
    h.stop_operator()

    assert not watchdog.reconcile_current("llama", "default", stale.generation, watchdog.log)
    assert h.deployment("llama")["spec"]["replicas"] == 2


def test_shared_reads_read_once_until_a_write(tmp_path: Path) -> None:
    """kube.shared_reads: the watchdog's ladder look and drift check share one read of the service and its
    Deployment; any write (and leaving the block) makes the next read go to the API again."""
    h = Cluster(tmp_path)
    try:
        h.create("llama", {"model": {"name": QWEN_7B}})
        kube.configure(str(h.kubeconfig))

        def reads() -> int:
            return sum(1 for r in list(h.server.emulator.access_log) if r.verb == "get" and r.resource == "vllmservices")

        before = reads()
        with kube.shared_reads():
            first = kube.get(kube.VLLMSERVICES, "default", "llama")
            assert first is not None
            first["spec"]["replicas"] = 7  # a caller's change stays the caller's
            again = kube.get(kube.VLLMSERVICES, "default", "llama")
            assert again is not None and again["spec"].get("replicas") != 7
            assert reads() == before + 1
            kube.patch(kube.VLLMSERVICES, "default", "llama", {"metadata": {"labels": {"a": "b"}}})
            fresh = kube.get(kube.VLLMSERVICES, "default", "llama")
            assert fresh is not None and fresh["metadata"]["labels"] == {"a": "b"}
            assert reads() == before + 2
        kube.get(kube.VLLMSERVICES, "default", "llama")
        assert reads() == before + 3
    finally:
        h.close()


def test_list_pages_follows_the_continue_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real API server pages a list (`limit`, `continue`); the watchdog's list holds one page at a time."""
    pages = {None: {"metadata": {"continue": "p2"}, "items": [{"n": 1}, {"n": 2}]},
             "p2": {"metadata": {"continue": ""}, "items": [{"n": 3}]}}
    asked: list[list[tuple[str, Any]]] = []

    def call(method: str, path: str, query: list[tuple[str, Any]], **_: Any) -> dict[str, Any]:
        asked.append(query)
        return pages[dict(query).get("continue")]

    monkeypatch.setattr(kube, "_call", call)
    assert [item["n"] for item in kube.list_pages(kube.VLLMSERVICES, "default", limit=2)] == [1, 2, 3]
    assert asked == [[("limit", 2)], [("limit", 2), ("continue", "p2")]]
