"""status.kvCache through the real `vllm-operator run` process in the simulated cluster: once the pod serves, the
KV cache its vLLM logged ("GPU KV cache size: N tokens") is in the status next to the plan's prediction."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kit.specs import condition as _condition
from kit.specs import vllmservice as _service
from vllm_operator.remediation.kvcache import measured_tokens
from vllm_operator_sim.cluster import NodePool, SimulatedCluster

pytestmark = pytest.mark.e2e

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def test_the_measured_kv_cache_is_in_the_status_next_to_the_prediction(tmp_path: Path) -> None:
    with SimulatedCluster([NodePool("L4", 1, 1)], speed=100, workdir=tmp_path,
                          default_storage_class=None) as cluster:
        cluster.start_operator()
        api = cluster.api
        cluster.apply(_service({"model": {"name": MODEL}}))

        def service() -> dict[str, Any]:
            return api.get_object("vllmservices", "chat", "default") or {}

        cluster.wait_for(lambda: _condition(service(), "Ready").get("status") == "True", timeout=90,
                         message="never Ready:\n" + cluster.operator_log()[-3000:])
        obj = cluster.wait_for(lambda: service() if (service().get("status") or {}).get("kvCache") else None,
                               timeout=30, message="status.kvCache never written:\n" + cluster.operator_log()[-3000:])
        status = obj["status"]
        [pod] = api.list_objects("pods", "default")
        url = f"{cluster.server.url}/api/v1/namespaces/default/pods/{pod['metadata']['name']}/log?container=vllm"
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback only
            logged = measured_tokens(response.read().decode())
        kv = status["kvCache"]
        assert logged is not None and kv["measuredTokens"] == logged
        assert kv["predictedTokens"] == status["plan"]["kvCacheTokens"]
        assert kv["differenceTokens"] == logged - status["plan"]["kvCacheTokens"]
        assert kv["pod"] == pod["metadata"]["name"]
        assert kv["template"] == pod["metadata"]["annotations"]["vllm-operator.dev/plan"]


def test_a_context_vllms_auto_fit_shortened_is_in_the_status_and_an_event(tmp_path: Path) -> None:
    # the plan renders --max-model-len auto (the full context fits as predicted), but the pod's real activation peak
    # is 17.2 GiB larger than anyone could plan (hidden): vLLM starts anyway with a shorter context — the status
    # says which, beside the plan's, and a Warning says what it means
    from vllm_operator_sim.scenarios import Scenario, ScenarioSet
    from vllm_operator_sim.startup import HiddenFacts
    scenarios = ScenarioSet({"chat": Scenario(name="chat", hidden=HiddenFacts(extra_activation_gib=17.2))})
    with SimulatedCluster([NodePool("L4", 1, 1)], scenarios=scenarios, speed=100, workdir=tmp_path,
                          default_storage_class=None) as cluster:
        cluster.start_operator()
        api = cluster.api
        cluster.apply(_service({"model": {"name": MODEL}, "image": "vllm/vllm-openai:v0.33.0"}))

        def service() -> dict[str, Any]:
            return api.get_object("vllmservices", "chat", "default") or {}

        obj = cluster.wait_for(lambda: service() if (service().get("status") or {}).get("kvCache") else None,
                               timeout=90, message="status.kvCache never written:\n" + cluster.operator_log()[-3000:])
        status = obj["status"]
        assert status["plan"]["args"][status["plan"]["args"].index("--max-model-len") + 1] == "auto", status["plan"]
        kv = status["kvCache"]
        assert kv["plannedMaxModelLen"] == status["plan"]["flags"]["maxModelLen"]
        assert 0 < kv["maxModelLen"] < kv["plannedMaxModelLen"], kv
        events = cluster.wait_for(lambda: [e for e in api.list_objects("events", "default")
                                           if e.get("reason") == "ContextReducedByVLLM"] or None, timeout=30,
                                  message="no ContextReducedByVLLM Event")
        assert f"{kv['maxModelLen']:,} tokens where the plan expected" in events[0]["message"]
