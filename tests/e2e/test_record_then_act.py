"""Record, then act — kill -9 of the real `vllm-operator run` process at chosen points of a ladder step.

The operator process talks to the emulated API through the fault proxy (`kit.faults`), which holds one chosen
request of the step (its status write, its rollout, its Event) while the test kills the process with SIGKILL; the
held request is then either dropped (it never lands) or let through (it lands after the process died). A new
process, with nothing but what is in the API, must finish the step exactly once: one history entry, the
Deployment on the recorded profile (never rolled back, never stepped again), the step's Event posted.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

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
)

NAME = "qwen"
STATUS = r"/vllmservices/qwen/status$"
TIMEOUT = 60.0  # a process start takes seconds, more under load


@dataclass(frozen=True)
class KillPoint:
    method: str
    path: str
    body: str      # picks the step's own request among the operator's others
    lands: bool    # the held request reaches the API after the kill (True) or never (False)


POINTS = {
    "status-write-lost": KillPoint("PATCH", STATUS, '"history"', lands=False),
    "status-write-lands-after-death": KillPoint("PATCH", STATUS, '"history"', lands=True),
    "rollout-lost": KillPoint("PATCH", r"/deployments/qwen$", "gpu-memory-utilization", lands=False),
    "event-lost": KillPoint("POST", r"/events$", "RemediatedNoKVCacheMemory", lands=False),
}


@pytest.mark.parametrize("point", POINTS.values(), ids=list(POINTS))
def test_kill_9_inside_a_step_finishes_it_exactly_once_after_restart(cluster: Cluster, point: KillPoint) -> None:
    deployment, service = deploy(cluster, NAME, process=True, timeout=TIMEOUT)
    before = flag(args_of(deployment), "--gpu-memory-utilization")
    faults = cluster.faults
    assert faults is not None
    held = faults.add(method=point.method, path=point.path, body=point.body, hold=TIMEOUT,
                      status=None if point.lands else 503, name="held")
    cluster.crashed_pod(deployment, "qwen-a", message=no_kv_crash(service))
    cluster.wait_for(lambda: held.fired == 1, TIMEOUT, "the operator is inside the step")
    cluster.kill()
    faults.clear()  # lets the held request go: it lands (forwarded) or fails (503) — the operator is gone
    if point.lands:
        cluster.wait_history(NAME, 1, timeout=TIMEOUT)

    cluster.start_operator(process=True)  # nothing survives but what is in the API
    obj = cluster.wait_history(NAME, 1, timeout=TIMEOUT)
    recorded = str(history(obj)[0]["flagsAfter"]["gpuMemoryUtilization"])
    assert recorded != before
    cluster.wait_deployment(NAME, lambda d: flag(args_of(d), "--gpu-memory-utilization") == recorded,
                            timeout=TIMEOUT, message="the recorded step rolled out")
    cluster.wait_events(NAME, "RemediatedNoKVCacheMemory", timeout=TIMEOUT)
    cluster.wait_quiet(1.0, timeout=TIMEOUT)
    steps = assert_ladder_invariants(cluster, NAME, max_steps=5)
    assert len(steps) == 1
    assert len(cluster.events(NAME, "RemediatedNoKVCacheMemory")) == 1


def test_a_ladder_killed_at_a_different_request_of_every_step_equals_the_ladder_never_killed(
        cluster: Cluster) -> None:
    """Three steps; in each, the operator process is killed at its k-th API request after the pod died (k = 2, 4,
    6: before, inside and after the step's record, depending on the step) and started again."""
    max_steps = 3
    deployment, service = deploy(cluster, NAME, {"remediation": {"maxSteps": max_steps}}, process=True,
                                 timeout=TIMEOUT)
    faults = cluster.faults
    assert faults is not None
    message = no_kv_crash(service)
    for n, k in enumerate((2, 4, 6), start=1):
        held = faults.add(watch=False, skip=k - 1, hold=TIMEOUT, status=503, name=f"kill-point-{n}")
        cluster.crashed_pod(deployment, f"qwen-s{n}", message=message)
        cluster.wait_for(lambda held=held: held.fired == 1, TIMEOUT, f"step {n}: the operator made {k} requests")
        cluster.kill()
        faults.clear()
        cluster.start_operator(process=True)
        cluster.wait_history(NAME, n, timeout=TIMEOUT)
        before = plan_annotation(deployment)
        deployment = cluster.wait_deployment(NAME, lambda d, before=before: plan_annotation(d) != before,
                                             timeout=TIMEOUT, message=f"step {n} rolled out")
    cluster.crashed_pod(deployment, "qwen-last", message=message)  # the ladder is at maxSteps: a verdict
    cluster.wait_remediation(NAME, lambda r: bool(r.get("exhausted")), TIMEOUT, "the verdict")
    cluster.wait_quiet(1.0, timeout=TIMEOUT)
    steps = assert_ladder_invariants(cluster, NAME, max_steps=max_steps)
    # the fault-free ladder of this failure (tests/handlers/test_ladder_under_faults.py runs it): utilization,
    # then enforce-eager, then smaller batches
    after = [h["flagsAfter"] for h in steps]
    assert [a["gpuMemoryUtilization"] for a in after] == [0.95, 0.95, 0.95]
    assert [a.get("enforceEager", False) for a in after] == [False, True, True]
    assert after[2].get("maxNumBatchedTokens") == 1024 and "maxNumBatchedTokens" not in after[1]
    assert len(cluster.events(NAME, "RemediatedNoKVCacheMemory")) == max_steps
