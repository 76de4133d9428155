"""The test kit does what it says — the handler tests' counts and waits rest on it: the fault proxy (`kit.faults`)
fires a rule only where its fault happened, and `Cluster.wait_settled` waits for kopf to have handled the spec as it
is now, not the one before an edit."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from kit.faults import FaultProxy
from kit.inprocess import QWEN_7B, Cluster
from vllm_operator_sim.emulator import EmulatedAPIServer

PATH = "/api/v1/namespaces/default/configmaps/c"


def _patch(proxy: FaultProxy, body: dict[str, Any]) -> int:
    request = urllib.request.Request(f"{proxy.url}{PATH}", data=json.dumps(body).encode(), method="PATCH", headers={
        "Content-Type": "application/merge-patch+json", "Authorization": "Bearer emulator-token"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_landed_then_500_rule_fires_only_on_a_write_that_landed(emulator: EmulatedAPIServer) -> None:
    created = emulator.create_object("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                                    "metadata": {"name": "c", "namespace": "default"},
                                                    "data": {"a": "0"}})
    stale = created["metadata"]["resourceVersion"]
    emulator.patch_object("configmaps", "c", {"data": {"a": "1"}}, "default")  # another writer moved it on
    with FaultProxy(emulator.url) as proxy:
        rule = proxy.add(method="PATCH", path=r"/configmaps/c$", land_then=500, times=1)
        # refused for its stale resourceVersion: nothing landed, the API's 409 is what the client hears
        assert _patch(proxy, {"metadata": {"resourceVersion": stale}, "data": {"a": "2"}}) == 409
        assert rule.fired == 0 and not proxy.fired()
        assert emulator.get_object("configmaps", "c", "default")["data"] == {"a": "1"}
        # the next match lands, and is answered 500
        assert _patch(proxy, {"data": {"a": "3"}}) == 500
        assert rule.fired == 1 and [(e.status, e.rule) for e in proxy.fired()] == [(500, rule.name)]
        assert emulator.get_object("configmaps", "c", "default")["data"] == {"a": "3"}
        # exhausted: passed through
        assert _patch(proxy, {"data": {"a": "4"}}) == 200
        assert rule.fired == 1


def test_wait_settled_waits_for_the_edit_not_the_configuration_handled_before_it(cluster: Cluster) -> None:
    cluster.start_operator()
    cluster.create_service("qwen", {"model": {"name": QWEN_7B}})
    assert cluster.wait_settled("qwen")["status"]["observedGeneration"] == 1
    cluster.stop_operator()
    cluster.patch_spec("qwen", {"replicas": 2})  # nobody handles it: the stored configuration is the old spec's
    with pytest.raises(AssertionError, match="kopf finished handling qwen"):
        cluster.wait_settled("qwen", timeout=1.0)
    cluster.start_operator()
    settled = cluster.wait_settled("qwen")
    assert settled["metadata"]["generation"] == settled["status"]["observedGeneration"] == 2
