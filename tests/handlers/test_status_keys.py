"""Status field names follow the Kubernetes API conventions: every key the operator writes under `status` is
camelCase, flag maps included (`status.plan.flags.maxModelLen`, like `spec.flags.maxModelLen`).

Checked on statuses the real operator writes (in-process, over the emulated API): a service after a remediation
step (plan, history, learned profile) and an infeasible one (failure, options). `status.kopf` is the framework's
own bookkeeping (keyed by handler ids) and is not part of the API.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kit.inprocess import Cluster, deploy, history, no_kv_crash, remediation

CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$")


def not_camel(value: Any, path: str = "status") -> list[str]:
    """Paths of keys below `value` that are not camelCase (lists walked too)."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if path == "status" and key == "kopf":
                continue
            where = f"{path}.{key}"
            if not CAMEL.match(str(key)):
                found.append(where)
            found.extend(not_camel(item, where))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found.extend(not_camel(item, f"{path}[{i}]"))
    return found


def test_the_checker_finds_snake_case_keys() -> None:
    assert not_camel({"plan": {"flags": {"maxModelLen": 1}}}) == []
    assert not_camel({"plan": {"flags": {"max_model_len": 1}}}) == ["status.plan.flags.max_model_len"]
    assert not_camel({"remediation": {"history": [{"flagsAfter": {"gpu_free_gib": 1}}]}}) == [
        "status.remediation.history[0].flagsAfter.gpu_free_gib"]
    assert not_camel({"kopf": {"progress": {"vllm_operator/create": {}}}}) == []


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    env = Cluster(tmp_path)
    try:
        yield env
    finally:
        env.close()


def test_every_status_key_the_operator_writes_is_camel_case(cluster: Cluster) -> None:
    deployment, service = deploy(cluster, "qwen")
    cluster.crashed_pod(deployment, "qwen-a", message=no_kv_crash(service))
    stepped = cluster.wait_history("qwen", 1)
    cluster.add_node("gpu-2", "NVIDIA-GeForce-RTX-4090")
    cluster.create("huge", {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, "gpu": {"maxCount": 1}})
    infeasible = cluster.wait_condition("huge", "PlanFeasible", "False", "PlanInfeasible")

    # what the walk covers: flag maps of every kind, written by the operator
    assert stepped["status"]["plan"]["flags"] and remediation(stepped)["profile"]
    assert history(stepped)[0]["flagsBefore"] and history(stepped)[0]["flagsAfter"]
    assert infeasible["status"]["plan"]["options"] and infeasible["status"]["plan"]["failure"]
    assert "maxModelLen" in stepped["status"]["plan"]["flags"]

    for obj in (stepped, infeasible, cluster.service("qwen")):
        assert not_camel(obj["status"]) == [], obj["status"]
