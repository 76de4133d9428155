"""Record, then act — under API faults between the operator and the API server (`kit.faults` proxy).

The operator runs in-process behind the fault proxy; the test plays the user and the kubelet directly against the
emulated API. Whatever fails (a 503 or 409 on any write, a write that lands but answers 500, dropped watches):
every pod-template change appears exactly once in `status.remediation.history`, steps never exceed maxSteps, the
profile never moves back, every recorded step's Event is posted, and a step whose write failed is taken by the
ladder's own prompt retry: the watchdog's first round is put off for these tests (`no_watchdog`), so what they see
taken, the retry (or the deferral timer) took, however slow the machine; the fault counts show the path it came by.
"""

from __future__ import annotations

import collections
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from kit.faults import FaultProxy
from kit.inprocess import (  # noqa: F401 (`cluster`: faulty_cluster_fixture)
    Cluster,
    args_of,
    assert_ladder_invariants,
    deploy,
    faulty_cluster_fixture,
    flag,
    history,
    no_kv_crash,
    plan_annotation,
    remediation,
)
from vllm_operator.api.v1alpha1 import PLURAL
from vllm_operator.handlers import watchdog

NAME = "qwen"
#: How long a wait may take (seconds): a safety net for a busy machine, not a claim about speed (see `no_watchdog`).
TIMEOUT = 60.0
STATUS = r"/vllmservices/qwen/status$"
DEPLOYMENT = r"/deployments/qwen$"


@pytest.fixture(autouse=True)
def no_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog's first round an hour after the operator starts (it is 60 s): a step these tests wait for can only
    come by the ladder's prompt retry or deferral timer, so they need no wall-clock bound to tell it from the sweep."""
    monkeypatch.setattr(watchdog, "WATCHDOG_INITIAL_DELAY", 3600.0)


def proxy(cluster: Cluster) -> FaultProxy:
    assert cluster.faults is not None
    return cluster.faults


def climb(cluster: Cluster, deployment: dict[str, Any], service: dict[str, Any], *, max_steps: int,
          timeout: float = 45.0) -> dict[str, Any]:
    """The kubelet's part of a whole ladder: each new template's pod dies of NoKVCacheMemory, until the ladder
    stops (exhausted). Returns the VLLMService at the end."""
    message = no_kv_crash(service)
    for n in range(1, max_steps + 2):
        cluster.crashed_pod(deployment, f"qwen-s{n}", message=message, restart_count=1)
        if n > max_steps:
            break

        def moved(n: int = n) -> dict[str, Any] | None:
            obj = cluster.service(NAME)
            return obj if len(history(obj)) >= n else None
        cluster.wait_for(moved, timeout, f"step {n} recorded")
        before = plan_annotation(deployment)
        deployment = cluster.wait_deployment(NAME, lambda d, before=before: plan_annotation(d) != before,
                                             timeout=timeout, message=f"step {n} rolled out")
    return cluster.wait_remediation(NAME, lambda r: bool(r.get("exhausted")), timeout,
                                    "the ladder stopped with a verdict")


# (fault, how often it fires): a write that landed is not written again — the rebuild finds the step recorded
@pytest.mark.parametrize(("fault", "fires"), [({"status": 503}, 8), ({"land_then": 500}, 1), ({"status": 409}, 8)],
                         ids=["503", "landed-then-500", "409"])
def test_a_failed_status_write_of_a_step_is_retried_promptly_and_recorded_once(
        cluster: Cluster, fault: dict[str, int], fires: int) -> None:
    deployment, service = deploy(cluster, NAME)
    faults = proxy(cluster)
    # every immediate retry fails too: the step must come back through the prompt retry (the watchdog is off)
    # the step's own status write (it carries the history), more often than the writer retries at once (6)
    rule = faults.add(method="PATCH", path=STATUS, body='"history"', times=8, **fault)
    cluster.crashed_pod(deployment, "qwen-a", message=no_kv_crash(service))
    cluster.wait_history(NAME, 1, timeout=TIMEOUT)
    stepped = cluster.wait_deployment(NAME, lambda d: "--gpu-memory-utilization" in args_of(d) and flag(
        args_of(d), "--gpu-memory-utilization") != flag(args_of(deployment), "--gpu-memory-utilization"),
        timeout=TIMEOUT)
    assert rule.fired == fires, "the fault did not happen as planned"
    cluster.wait_events(NAME, "RemediatedNoKVCacheMemory", timeout=TIMEOUT)
    cluster.wait_quiet(0.5, timeout=30)
    steps = assert_ladder_invariants(cluster, NAME, max_steps=5)
    assert len(steps) == 1 and remediation(cluster.service(NAME))["step"] == 1
    assert stepped is not None


def test_a_step_write_refused_for_a_stale_read_is_written_again_and_recorded_once(cluster: Cluster) -> None:
    """The interleaving behind the landed-then-500 case's rare failure on a busy machine ("fault fired 2 != 1"):
    kopf's own patch after the creation (its last-handled annotation) landed between the ladder's read and its
    write. The API refuses that write (409, nothing landed), so it is not the planned "landed, then 500": the
    ladder reads again, builds the step again and writes it once more — that write lands and answers 500 — and the
    step is recorded once. The order is forced: the proxy holds the first write until the test has moved the
    resourceVersion."""
    deployment, service = deploy(cluster, NAME)
    cluster.wait_settled(NAME)
    faults = proxy(cluster)
    rule = faults.add(method="PATCH", path=STATUS, body='"history"', times=8, land_then=500, hold=TIMEOUT)
    start = len(faults.log)
    cluster.crashed_pod(deployment, "qwen-a", message=no_kv_crash(service))
    cluster.wait_for(lambda: rule.seen >= 1, TIMEOUT, "the step's write is held")
    # another writer (kopf's bookkeeping: its `dummy` touch) moves the resourceVersion past the ladder's read
    cluster.server.patch_object(PLURAL, NAME, {"status": {"kopf": {"dummy": "moved"}}}, cluster.namespace,
                                subresource="status")
    faults.release()
    cluster.wait_for(lambda: rule.seen >= 2, TIMEOUT, "the step written again from a new read")
    faults.release()
    cluster.wait_history(NAME, 1, timeout=TIMEOUT)
    cluster.wait_events(NAME, "RemediatedNoKVCacheMemory", timeout=TIMEOUT)
    cluster.wait_quiet(0.5, timeout=30)
    writes = [(entry.rule, entry.status) for entry in faults.log[start:]
              if entry.method == "PATCH" and re.search(STATUS, entry.path)]
    assert writes[:2] == [(None, 409), (rule.name, 500)], writes  # refused (passed on), then landed-then-500
    assert rule.seen == 2 and rule.fired == 1
    steps = assert_ladder_invariants(cluster, NAME, max_steps=5)
    assert len(steps) == 1 and remediation(cluster.service(NAME))["step"] == 1


def test_a_rollout_that_fails_after_the_record_is_completed_not_undone(cluster: Cluster) -> None:
    deployment, service = deploy(cluster, NAME)
    faults = proxy(cluster)
    # the step's rollout (its new args), more often than apply_children retries at once (4)
    rule = faults.add(method="PATCH", path=DEPLOYMENT, body="gpu-memory-utilization", status=503, times=6)
    cluster.crashed_pod(deployment, "qwen-a", message=no_kv_crash(service))
    obj = cluster.wait_history(NAME, 1, timeout=TIMEOUT)   # recorded first, while the Deployment cannot be written
    recorded = history(obj)[0]["flagsAfter"]
    rolled = cluster.wait_deployment(NAME, lambda d: flag(args_of(d), "--gpu-memory-utilization") == str(
        recorded["gpuMemoryUtilization"]), timeout=TIMEOUT, message="the recorded step rolled out")
    assert rule.fired == 6
    cluster.wait_quiet(0.5, timeout=30)
    assert_ladder_invariants(cluster, NAME, max_steps=5)
    assert rolled["metadata"]["resourceVersion"] == cluster.deployment(NAME)["metadata"]["resourceVersion"]  # type: ignore[index]


# 409: a Conflict on the Event's create posted nothing; it was taken for AlreadyExists and never posted again (issue 20)
@pytest.mark.parametrize(("status", "fires"), [(503, 4), (409, 1)], ids=["503", "409"])
def test_a_lost_event_of_a_recorded_step_is_posted(cluster: Cluster, status: int, fires: int) -> None:
    deployment, service = deploy(cluster, NAME)
    faults = proxy(cluster)
    # every immediate retry of the step's Event fails
    rule = faults.add(method="POST", path=r"/events$", body="RemediatedNoKVCacheMemory", status=status, times=fires)
    cluster.crashed_pod(deployment, "qwen-a", message=no_kv_crash(service))
    cluster.wait_history(NAME, 1, timeout=TIMEOUT)
    cluster.wait_for(lambda: rule.fired == fires, TIMEOUT, "the Event's posts failed")
    # the kubelet re-reports the dead container: the operator looks again, finds the step recorded, posts its Event
    cluster.touch_pod_status("qwen-a", 1)
    cluster.wait_events(NAME, "RemediatedNoKVCacheMemory", timeout=TIMEOUT)
    cluster.wait_quiet(0.5, timeout=30)
    assert_ladder_invariants(cluster, NAME, max_steps=5)
    assert len(cluster.events(NAME, "RemediatedNoKVCacheMemory")) == 1


def test_a_whole_ladder_under_random_write_faults_and_cut_watches_is_the_fault_free_ladder(
        tmp_path: Path) -> None:
    max_steps = 3
    plain = Cluster(tmp_path / "plain")
    try:
        deployment, service = deploy(plain, NAME, {"remediation": {"maxSteps": max_steps}})
        climb(plain, deployment, service, max_steps=max_steps)
        plain.wait_quiet(0.5, timeout=30)
        expected = [h["flagsAfter"] for h in assert_ladder_invariants(plain, NAME, max_steps=max_steps)]
    finally:
        plain.close()
    assert len(expected) == max_steps

    faulty = Cluster(tmp_path / "faulty", faults=True)
    try:
        faults = proxy(faulty)  # from the start: the operator's first watches are cut too
        # for sure: step 2's record lands but answers 500; step 2's rollout lands but answers 500
        faults.add(method="PATCH", path=STATUS, body='"history"', skip=1, land_then=500, name="record-landed-500")
        faults.add(method="PATCH", path=DEPLOYMENT, body="enforce-eager", land_then=500, name="rollout-landed-500")
        faults.add(method="POST", path=r"/events$", body="step 1:", land_then=500, name="event-landed-500")
        # and at random
        faults.add(method="PATCH", probability=0.3, times=None, status=503, name="patch-503")
        faults.add(method="PATCH", probability=0.2, times=None, land_then=500, name="patch-landed-500")
        faults.add(method="PATCH", path=STATUS, probability=0.2, times=None, status=409, name="status-409")
        faults.add(method="POST", probability=0.2, times=None, status=503, name="post-503")
        faults.add(watch=True, times=None, cut_after=2.0, name="cut-watch")
        deployment, service = deploy(faulty, NAME, {"remediation": {"maxSteps": max_steps}}, timeout=60.0)
        obj = climb(faulty, deployment, service, max_steps=max_steps, timeout=60.0)
        faults.clear()
        faulty.wait_quiet(0.5, timeout=30)
        steps = assert_ladder_invariants(faulty, NAME, max_steps=max_steps)
        assert [h["flagsAfter"] for h in steps] == expected
        assert remediation(obj)["step"] == max_steps
        fired = collections.Counter(entry.rule for entry in faults.fired())
        assert {"record-landed-500", "rollout-landed-500", "event-landed-500", "patch-503", "cut-watch"} <= set(
            fired), fired
        # one Event per step, even where a post landed but answered 500 (fixed names: the retry finds it there)
        assert len(faulty.events(NAME, "RemediatedNoKVCacheMemory")) == max_steps
    finally:
        faulty.close()


def test_a_step_deferred_by_the_minimum_interval_is_taken_when_due_not_by_the_watchdog(cluster: Cluster) -> None:
    interval = 3
    deployment, service = deploy(cluster, NAME, {"remediation": {"minIntervalSeconds": interval}})
    message = no_kv_crash(service)
    cluster.crashed_pod(deployment, "qwen-a", message=message)
    first = history(cluster.wait_history(NAME, 1, timeout=TIMEOUT))[0]
    stepped = cluster.wait_deployment(NAME, lambda d: plan_annotation(d) != plan_annotation(deployment),
                                      timeout=TIMEOUT)
    cluster.crashed_pod(stepped, "qwen-b", message=message)  # at once: inside the minimum interval
    second = history(cluster.wait_history(NAME, 2, timeout=TIMEOUT))[1]
    gap = (datetime.fromisoformat(second["time"].replace("Z", "+00:00"))
           - datetime.fromisoformat(first["time"].replace("Z", "+00:00"))).total_seconds()
    assert gap >= interval, gap  # when due, not before; and by the deferral timer (the watchdog is off)
    cluster.wait_quiet(0.5, timeout=30)
    assert_ladder_invariants(cluster, NAME, max_steps=5)
