"""Every selector and query the operator renders selects exactly the serving pods of a simulated cluster: the real
`vllm-operator run` process, the simulated Deployment and LeaderWorkerSet controllers making the pods, and two
services side by side — `chat` (a Deployment of two pods) and `chat-2` (Llama-3.1-405B: a LeaderWorkerSet group of
a leader and a headless worker over two 8×H100 nodes), whose names a loose matcher confuses."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.specs import condition as _condition
from kit.specs import vllmservice as _service
from vllm_operator_sim.cluster import NodePool, SimulatedCluster
from vllm_operator_sim.emulator_selectors import parse_label_selector
from vllm_operator_sim.lws import NAME as LWS_NAME
from vllm_operator_sim.lws import WORKER_INDEX

pytestmark = pytest.mark.e2e

CRDS = Path(__file__).resolve().parents[1] / "data" / "crds"
KEDA = {"engine": "KEDA", "minReplicas": 1, "maxReplicas": 4, "prometheusAddress": "http://prometheus:9090"}
POOL = {"inferencePool": {"enabled": True}}
SPECS = {
    "chat": {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "replicas": 2, "autoscaling": KEDA, "routing": POOL},
    "chat-2": {"model": {"name": "meta-llama/Llama-3.1-405B-Instruct"}, "gpu": {"maxNodes": 2},
               "autoscaling": KEDA, "routing": POOL},
}


def _expected(name: str, pods: list[dict[str, Any]]) -> set[str]:
    """The serving pods, from what the controllers made: the pods of the Deployment's ReplicaSets, or the leaders."""
    found = set()
    for pod in pods:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        owners = meta.get("ownerReferences") or []
        if name == "chat" and any(o["kind"] == "ReplicaSet" and o["name"].startswith("chat-") and
                                  o["name"].count("-") == 1 for o in owners):
            found.add(meta["name"])
        if name == "chat-2" and labels.get(LWS_NAME) == "chat-2" and labels.get(WORKER_INDEX) == "0":
            found.add(meta["name"])
    return found


def _selected(selector: dict[str, str], pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["name"] for p in pods
            if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())}


def test_every_selector_and_query_selects_exactly_the_serving_pods(tmp_path: Path) -> None:
    with SimulatedCluster([NodePool("L4", 1, 2), NodePool("H100-SXM-80GB", 8, 2)], speed=200,
                          workdir=tmp_path, default_storage_class=None) as cluster:
        api = cluster.api
        for file in ("keda.sh_scaledobjects.yaml", "inference.networking.k8s.io_inferencepools.yaml"):
            api.create_object("customresourcedefinitions", yaml.safe_load((CRDS / file).read_text()))
        cluster.start_operator()
        for name, spec in SPECS.items():
            cluster.apply(_service(spec, name=name))

        def ready(name: str) -> bool:
            return _condition(api.get_object("vllmservices", name, "default"), "Ready").get("status") == "True"
        cluster.wait_for(lambda: all(ready(n) for n in SPECS), timeout=120,
                         message="not Ready:\n" + cluster.operator_log()[-3000:])

        pods = [p for p in api.list_objects("pods", "default") if not p["metadata"].get("deletionTimestamp")]
        names = {p["metadata"]["name"] for p in pods}
        assert {"chat-2-0", "chat-2-0-1"} <= names and len(names) == 4, names  # leader, worker, two chat pods
        for name in SPECS:
            expected = _expected(name, pods)
            assert len(expected) == (2 if name == "chat" else 1), (name, names)
            service = api.get_object("services", name, "default")
            pool = api.get_object("inferencepools", name, "default")
            scaled = api.get_object("scaledobjects", name, "default")
            status = api.get_object("vllmservices", name, "default")["status"]  # type: ignore[index]
            assert service is not None and pool is not None and scaled is not None
            assert _selected(service["spec"]["selector"], pods) == expected, name
            assert _selected(pool["spec"]["selector"]["matchLabels"], pods) == expected, name
            matches = parse_label_selector(status["selector"])  # the /scale subresource's, which the HPA reads
            assert {p["metadata"]["name"] for p in pods if matches(p["metadata"].get("labels") or {})} == expected
            for trigger in scaled["spec"]["triggers"]:
                query = trigger["metadata"]["query"]
                regexes = set(re.findall(r'pod=~"((?:[^"\\]|\\.)*)"', query))
                assert len(regexes) == 1 and 'namespace="default"' in query, query
                pattern = regexes.pop().replace("\\\\", "\\")
                assert {n for n in names if re.fullmatch(pattern, n)} == expected, (name, query)
        # what vLLM measured of its KV cache comes from a serving pod (the leader, never the headless worker)
        for name in SPECS:
            def measured(name: str = name) -> dict[str, Any] | None:
                status = (api.get_object("vllmservices", name, "default") or {}).get("status") or {}
                return status.get("kvCache")
            kv = cluster.wait_for(measured, timeout=30, message=f"status.kvCache of {name}")
            assert kv["pod"] in _expected(name, pods) and kv["measuredTokens"] > 0, kv
