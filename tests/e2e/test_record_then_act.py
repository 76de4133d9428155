"""Record, then act — kill -9 of the real `vllm-operator run` process at chosen points of a ladder step.

The operator process talks to the emulated API through the fault proxy (`kit.faults`), which holds one chosen
request of the step (its status write, its rollout, its Event) while the test kills the process with SIGKILL; the
held request is then either dropped (it never lands) or let through (it lands after the process died). A new
process, with nothing but what is in the API, must finish the step exactly once: one history entry, the
Deployment on the recorded profile (never rolled back, never stepped again), the step's Event posted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

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
    # kopf's own patch after the creation (its last-handled annotation) comes after the plan: let it land first,
    # or, landing while the step's write is held, it makes that write stale — refused (409), not "landed after death"
    cluster.wait_settled(NAME, timeout=TIMEOUT)
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


# --- a Deployment → LeaderWorkerSet switch, killed at each of its steps -----------------------------------------------

BIG = "big"
LWS_CRD = Path(__file__).resolve().parents[1] / "data" / "crds" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"    # one node of 8× H100: a Deployment
LLAMA_405B = "meta-llama/Llama-3.1-405B-Instruct"  # two nodes: a LeaderWorkerSet
LEADERS = {"leaderworkerset.sigs.k8s.io/name": BIG, "leaderworkerset.sigs.k8s.io/worker-index": "0"}


@dataclass(frozen=True)
class SwitchPoint:
    method: str
    path: str
    body: str | None
    lands: bool
    after_ready: bool  # the request comes once the new workload is Ready (the test plays the LWS controller first)
    recorded: str | None = None  # the step status.workloadSwitch says when the process is killed
    lws_at_kill: bool | None = None  # whether the LeaderWorkerSet exists then (record → create: not before)


STATUS_OF_BIG = rf"/vllmservices/{BIG}/status$"
SWITCH_POINTS = {
    # killed right after the record: the switch (target kind, plan) is in the status, the LWS not created yet
    "create-lost": SwitchPoint("PATCH", rf"/leaderworkersets/{BIG}$", "leaderWorkerTemplate", False, False,
                               recorded="CreateTarget", lws_at_kill=False),
    # killed while recording: nothing of the switch acted yet
    "record-lost": SwitchPoint("PATCH", STATUS_OF_BIG, '"CreateTarget"', False, False, lws_at_kill=False),
    "record-lands-after-death": SwitchPoint("PATCH", STATUS_OF_BIG, '"CreateTarget"', True, False,
                                            lws_at_kill=False),
    # killed right after the create: the LWS exists, its step (wait Ready) not recorded yet
    "after-create-lost": SwitchPoint("PATCH", STATUS_OF_BIG, '"WaitReady"', False, False,
                                     recorded="CreateTarget", lws_at_kill=True),
    "after-create-lands-after-death": SwitchPoint("PATCH", STATUS_OF_BIG, '"WaitReady"', True, False,
                                                  recorded="CreateTarget", lws_at_kill=True),
    "service-switch-lost": SwitchPoint("PATCH", rf"/services/{BIG}$", "worker-index", False, True,
                                       recorded="SwitchAddressing"),
    "service-switch-lands-after-death": SwitchPoint("PATCH", rf"/services/{BIG}$", "worker-index", True, True,
                                                    recorded="SwitchAddressing"),
    "old-delete-lost": SwitchPoint("DELETE", rf"/deployments/{BIG}$", None, False, True,
                                   recorded="DeletePrevious"),
}


def _lws(cluster: Cluster) -> dict[str, Any] | None:
    return cluster.server.get_object("leaderworkersets", BIG, cluster.namespace)


def _ready_lws(cluster: Cluster) -> None:
    """Play the LWS controller: the group ready, and its Ready leader pod (whose event the operator sees)."""
    lws = _lws(cluster)
    assert lws is not None
    n = lws["spec"].get("replicas", 1)
    cluster.server.patch_status("leaderworkersets", BIG, {"replicas": n, "readyReplicas": n, "updatedReplicas": n},
                                cluster.namespace)
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    labels = {**leader["metadata"]["labels"], **LEADERS, "leaderworkerset.sigs.k8s.io/group-index": "0"}
    cluster.server.create_object("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{BIG}-0", "namespace": cluster.namespace, "labels": labels}, "spec": leader["spec"]},
        cluster.namespace)
    cluster.server.patch_status("pods", f"{BIG}-0", {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}, cluster.namespace)


def _kill_at(cluster: Cluster, held: Any, point: SwitchPoint) -> None:
    cluster.wait_for(lambda: held.fired == 1, TIMEOUT, "the operator is at the switch's step")
    # each step is recorded before it acts (the held request has not reached the API yet)
    record = ((cluster.service(BIG) or {}).get("status") or {}).get("workloadSwitch")
    if point.recorded is not None:
        assert record is not None and record["step"] == point.recorded, record
        assert (record["previous"], record["target"]) == ("Deployment", "LeaderWorkerSet")
    if point.lws_at_kill is not None:
        assert (_lws(cluster) is not None) == point.lws_at_kill
    cluster.kill()
    faults = cluster.faults
    assert faults is not None
    faults.clear()  # the held request lands (forwarded) or fails (503): the operator is gone
    cluster.start_operator(process=True)  # nothing survives but what is in the API


@pytest.mark.parametrize("point", SWITCH_POINTS.values(), ids=list(SWITCH_POINTS))
def test_a_switch_killed_at_any_step_never_serves_from_two_workloads(cluster: Cluster, point: SwitchPoint) -> None:
    """record, create, wait Ready, switch the Service, delete the old workload: kill -9 inside any step, start
    again, and the switch finishes — the Service selects exactly one workload's pods at every write, the old
    workload serves until the new one is Ready and is deleted only after the Service left it."""
    crd = next(d for d in yaml.safe_load_all(LWS_CRD.read_text()) if d)
    cluster.server.create_object("customresourcedefinitions", crd)
    for i in (1, 2):
        cluster.add_node(f"h100-{i}", "NVIDIA-H100-80GB-HBM3", count=8)
    cluster.start_operator(process=True)
    cluster.create_service(BIG, {"model": {"name": LLAMA_70B}, "gpu": {"maxNodes": 2}})
    cluster.wait_deployment(BIG, timeout=TIMEOUT)
    pods = cluster.wait_for(lambda: cluster.k8s_service(BIG), TIMEOUT, "the Service")["spec"]["selector"]
    faults = cluster.faults
    assert faults is not None
    held = faults.add(method=point.method, path=point.path, body=point.body, hold=TIMEOUT,
                      status=None if point.lands else 503, name="held")

    cluster.patch_spec(BIG, {"model": {"name": LLAMA_405B}})
    if not point.after_ready:
        _kill_at(cluster, held, point)
    cluster.wait_for(_lws_and_recorded(cluster), TIMEOUT, "the LeaderWorkerSet applied and its plan recorded")
    cluster.wait_quiet(1.0, timeout=TIMEOUT)
    assert cluster.deployment(BIG) is not None, "the old workload serves until the new one is Ready"
    assert cluster.k8s_service(BIG)["spec"]["selector"] == pods  # type: ignore[index]

    _ready_lws(cluster)
    if point.after_ready:
        _kill_at(cluster, held, point)
    cluster.wait_for(lambda: cluster.deployment(BIG) is None or None, TIMEOUT, "the old Deployment deleted")
    assert cluster.k8s_service(BIG)["spec"]["selector"] == LEADERS  # type: ignore[index]
    assert held.fired == 1

    # every Service write selected exactly one workload's pods; the Deployment went after the Service left it
    writes = [(str(r.method).split(".")[-1], r.url.path, r.data) for r in cluster.recorded_requests()
              if str(r.method).split(".")[-1] in ("PATCH", "DELETE", "POST", "PUT")]
    selectors = [((data or {}).get("spec") or {}).get("selector") for method, path, data in writes
                 if path.endswith(f"/services/{BIG}") and method == "PATCH"]
    assert all(s in (pods, LEADERS) for s in selectors if s is not None), selectors
    deleted = [i for i, (method, path, _) in enumerate(writes) if method == "DELETE" and path.endswith(
        f"/deployments/{BIG}")]
    switched = [i for i, (method, path, data) in enumerate(writes) if method == "PATCH" and path.endswith(
        f"/services/{BIG}") and ((data or {}).get("spec") or {}).get("selector") == LEADERS]
    assert deleted and switched and switched[0] < deleted[0]
    # exactly one workload serves, and no switch is left recorded
    cluster.wait_for(lambda: "workloadSwitch" not in ((cluster.service(BIG) or {}).get("status") or {}) or None,
                     TIMEOUT, "the switch's record cleared")
    assert cluster.deployment(BIG) is None and _lws(cluster) is not None


def _lws_and_recorded(cluster: Cluster) -> Any:
    def check() -> bool | None:
        status = (cluster.service(BIG) or {}).get("status") or {}
        return (_lws(cluster) is not None and (status.get("gpu") or {}).get("nodes") == 2) or None
    return check
