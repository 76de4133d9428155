"""The startup probe's deadline, enforced for a real process: the simulated kubelet gives a vLLM container the budget
the operator rendered (``initialDelaySeconds + failureThreshold × periodSeconds`` of simulated time, at least 600 s)
and kills it when it is not Ready by then, as a kubelet does (an ``Unhealthy`` and a ``Killing`` Event, SIGTERM,
SIGKILL after the grace period), then restarts it after the back-off. The operator reads the killed container as it
reads any failed one and records it.

How the budget runs out: a real vLLM needs ~60 s (more on a busy machine) to answer /health; the test waits until
the process runs and then moves the simulated clock to the probe's deadline, which is how the real process looks to
the cluster when its start takes longer than the rendered budget (a slow download, a cold compile cache, a larger
model). Nothing else is changed: the rendered probe, the real process and the operator are as in the other tests.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from realkit import RealCluster, tiny_spec, until

from kit.specs import condition, vllmservice
from vllm_operator_sim.realvllm import container_probes

pytestmark = pytest.mark.timeout(900)


def _events(real: RealCluster, kind: str, name: str) -> dict[str, dict]:
    return {e["reason"]: e for e in real.api.list_objects("events", "default")
            if e["involvedObject"].get("kind") == kind and e["involvedObject"].get("name") == name}


def test_a_real_process_past_its_startup_probe_deadline_is_killed_restarted_and_recorded(real: RealCluster) -> None:
    real.cluster.apply(vllmservice(tiny_spec(), name="slow"))
    try:
        def running() -> tuple[dict, object] | None:
            for pod in real.pods("slow"):
                run = next((r for r in real.runner.runs.values() if r.uid == pod["metadata"]["uid"]), None)
                state = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("state") or {}
                if run is not None and "running" in state:
                    return pod, run
            return None
        pod, run = until(running, 120, "the real process running")
        container = pod["spec"]["containers"][0]
        budget, probed = container_probes(container)
        assert probed and budget is not None and budget >= 600, container["startupProbe"]
        started = datetime.fromisoformat(pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
                                         .replace("Z", "+00:00"))
        started_s = (started - real.cluster.clock.epoch).total_seconds()
        assert not run.ready, "the real process answered /health before the test moved the clock"
        # the real process is still starting when the simulated clock reaches the rendered deadline
        real.cluster.clock.advance_to(started_s + budget + 1)
        name = pod["metadata"]["name"]
        events = until(lambda: (e := _events(real, "Pod", name)) and {"Unhealthy", "Killing"} <= set(e) and e, 60,
                       "the kubelet's Unhealthy and Killing Events")
        assert events["Unhealthy"]["message"].startswith("Startup probe failed: "), events["Unhealthy"]
        assert events["Killing"]["message"] == "Container vllm failed startup probe, will be restarted"
        until(lambda: run.process.poll() is not None, 60, "the killed process gone")
        assert not run.ready
        # the container's death, as the API shows it, and a restart
        terminated = until(lambda: next((s.get("lastState", {}).get("terminated") or s.get("state", {}).get(
            "terminated") for p in real.pods("slow") if p["metadata"]["uid"] == pod["metadata"]["uid"]
            for s in (p.get("status") or {}).get("containerStatuses") or []), None), 60, "the container terminated")
        assert terminated["reason"] == "Error" and terminated["exitCode"] != 0, terminated
        # the operator recorded it: Degraded, not a memory failure, flags unchanged, a Warning Event on the service
        recorded = until(lambda: (o := real.service("slow")) and condition(o, "Degraded").get("status") == "True"
                         and o, 120, "the operator's record of the killed container")
        degraded = condition(recorded, "Degraded")
        assert "not a memory failure: flags unchanged" in degraded["message"], degraded
        assert not (recorded["status"].get("remediation") or {}).get("history"), recorded["status"]["remediation"]
        warnings = _events(real, "VLLMService", "slow")
        assert any(reason.startswith("PodFailed") for reason in warnings), sorted(warnings)
        until(lambda: len([r for r in real.runner.history if r.uid == pod["metadata"]["uid"]]) == 2, 120,
              "the restarted process")
        print(f"killed at the deadline: exit code {terminated['exitCode']}; the operator: {degraded['message']}")
    finally:
        real.delete("slow")
