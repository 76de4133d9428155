"""The fault proxy (`kit.faults`) does what its rules say — the handler tests' counts of faults rest on it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from kit.faults import FaultProxy
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
