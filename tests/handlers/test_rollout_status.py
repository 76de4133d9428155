"""Status tells the truth about a rollout, and a rollout on a full GPU pool can finish — through the real
`vllm-operator run` process in the simulated cluster (scheduler, Deployment controller and kubelet simulated).

One L4 node with one GPU: the service serves; then the spec changes. The new pod cannot get a GPU while the old one
holds it (maxSurge 1): the operator reports the scheduler's message (never "complete", never Ready=True for the old
pod), switches the Deployment to maxSurge 0 with a Warning Event, and the new profile ends up serving.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kit.specs import condition as _condition
from kit.specs import vllmservice as _service
from vllm_operator_sim.cluster import NodePool, SimulatedCluster

pytestmark = pytest.mark.e2e

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"




def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_a_spec_change_on_a_full_pool_rolls_without_surge_and_never_claims_ready(tmp_path: Path) -> None:
    with SimulatedCluster([NodePool("L4", 1, 1)], speed=100, workdir=tmp_path) as cluster:
        # an emptyDir cache: with the default ReadWriteOnce cache claim (issue 14) the Deployment rolls without
        # surge from the start, and the full-pool case this test is about never arises
        cluster.start_operator("--model-cache-mode", "ephemeral")
        api = cluster.api
        cluster.apply(_service({"model": {"name": MODEL}, "flags": {"maxModelLen": 8192}}))

        def service() -> dict[str, Any] | None:
            return api.get_object("vllmservices", "chat", "default")

        cluster.wait_for(lambda: _condition(service(), "Ready").get("status") == "True", timeout=60,
                         message="the first profile never served")
        assert service()["status"]["state"] == "Ready"  # type: ignore[index]

        generation = cluster.apply(_service({"model": {"name": MODEL}, "flags": {"maxModelLen": 4096}}))[
            "metadata"]["generation"]
        seen: list[tuple[str | None, str | None, str | None]] = []

        def new_profile_serves() -> bool:
            obj = service()
            pods = api.list_objects("pods", "default")
            status = (obj or {}).get("status") or {}
            ready = _condition(obj, "Ready")
            seen.append((status.get("state"), ready.get("status"), ready.get("reason")))
            if status.get("observedGeneration") == generation and ready.get("status") == "True":
                # Ready=True only once a pod of the new profile serves
                args = [a for p in pods if any(c.get("type") == "Ready" and c.get("status") == "True"
                                               for c in (p.get("status") or {}).get("conditions") or [])
                        for a in p["spec"]["containers"][0]["args"]]
                assert _arg(args, "--max-model-len") == "4096", (seen[-5:], cluster.operator_log()[-3000:])
                return True
            return False

        cluster.wait_for(new_profile_serves, timeout=90,
                         message="the new profile never served:\n" + cluster.operator_log()[-3000:])
        deployment = api.get_object("deployments", "chat", "default")
        assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
        events = [e for e in api.list_objects("events", "default") if e.get("reason") == "RollingWithoutSurge"]
        assert len(events) == 1 and events[0]["type"] == "Warning"
        assert "Insufficient nvidia.com/gpu" in events[0]["message"] and "briefly unavailable" in events[0]["message"]
        # on the way: the old pod served the previous profile, the new pod's scheduling was reported
        assert ("Unschedulable", "False", "ServingPreviousProfile") in seen or \
            any(state == "RollingOut" and reason == "ServingPreviousProfile" for state, _, reason in seen), seen
        final = service()
        assert final["status"]["state"] == "Ready"  # type: ignore[index]
        assert _condition(final, "Progressing")["reason"] in ("RolloutComplete", "Deploying")
        assert _condition(final, "Degraded")["status"] == "False"
