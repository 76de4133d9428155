"""One slow plan does not hold up other services (issue 20): the reconcile core (and the planning in it) runs in the
shell's reconcile pool, off kopf's event loop, so while one service's planning is stuck another service is planned
and deployed. The slow plan is a controllable fake (it waits for the test to release it): no timing bound."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kit.inprocess import Cluster, condition
from vllm_operator import reconcile

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"


def test_a_second_service_is_planned_while_a_slow_plan_runs(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = threading.Event(), threading.Event()
    plan_for_cluster = reconcile.plan_for_cluster

    def slow_for_one(spec: Any, *args: Any) -> Any:
        if spec.model.served_name == "slow":
            entered.set()
            release.wait(timeout=300)  # released by the test below (the bound only keeps a broken test from hanging)
        return plan_for_cluster(spec, *args)

    monkeypatch.setattr(reconcile, "plan_for_cluster", slow_for_one)
    cluster.start_operator()
    try:
        cluster.create_service("slow", {"model": {"name": QWEN, "servedName": "slow"}})
        cluster.wait_for(lambda: entered.is_set() or None, message="the slow service's planning never started")
        cluster.create_service("fast", {"model": {"name": QWEN}})
        cluster.wait_deployment("fast")

        def planned() -> bool:
            feasible = condition(cluster.service("fast"), "PlanFeasible")
            return feasible is not None and feasible["status"] == "True"

        cluster.wait_for(planned, message="the fast service got no status while the slow one planned")
        assert not release.is_set() and condition(cluster.service("slow"), "PlanFeasible") is None
    finally:
        release.set()
    cluster.wait_deployment("slow")
