"""Cold start on the simulated cluster: the phases the operator reads from a pod (render/coldstart.py) come out of
the simulator's pod status and vLLM log, and a compile cache on the claim makes the next pod's start skip the
compilation (manual clock, no sleeps)."""

from __future__ import annotations

from typing import Any

from simkit import SimHarness, deployment

from vllm_operator.render import coldstart
from vllm_operator.render.cache import DOWNLOAD_CONTAINER

LLAMA3_8B = "meta-llama/Meta-Llama-3-8B-Instruct"
FLAGS = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 13}


def _ready_pod(sim: SimHarness, service: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pods = sim.pods(service)
        ok = [p for p in pods if any(c.get("ready") for c in p["status"].get("containerStatuses") or [])]
        return ok[0] if ok else None
    sim.run_until(ready)
    pod = ready()
    assert pod is not None
    return pod


def _measured(sim: SimHarness, pod: dict[str, Any]) -> dict[str, Any]:
    measured = coldstart.cold_start_from_pod(pod, sim.log(pod["metadata"]["name"]),
                                             download_container=DOWNLOAD_CONTAINER, events=_pulled_events(sim, pod))
    assert measured is not None
    return measured


def test_a_start_is_measured_phase_by_phase_and_a_restart_skips_compilation(sim: SimHarness) -> None:
    sim.create_deployment(deployment("warm", LLAMA3_8B, FLAGS, cached=True, compile_cache=True))
    first = _ready_pod(sim, "warm")
    cold = _measured(sim, first)
    assert set(coldstart.COLD_START_PHASES) <= set(cold)
    assert cold["downloadSeconds"] > 0 and cold["compileSeconds"] > 0 and cold["engineInitSeconds"] > 0
    assert cold["readySeconds"] >= cold["downloadSeconds"] + cold["loadSeconds"]
    assert coldstart.compile_cache_kind(first) == "persistent"
    # a new pod on the same claim (a remediation step, a rollout): weights and compiled graphs are there
    sim.api.delete_object("pods", first["metadata"]["name"], "default")
    sim.run_until(lambda: [p for p in sim.pods("warm") if p["metadata"]["name"] != first["metadata"]["name"]])
    second = _ready_pod(sim, "warm")
    assert second["metadata"]["name"] != first["metadata"]["name"]
    warm = _measured(sim, second)
    assert "Directly load the compiled graph(s)" in sim.log(second["metadata"]["name"])
    assert warm["compileSeconds"] < cold["compileSeconds"] / 5
    assert warm["engineInitSeconds"] < cold["engineInitSeconds"]
    assert warm.get("downloadSeconds", 0.0) < 5  # the init container found the weights
    assert warm["readySeconds"] < cold["readySeconds"]


def test_without_the_compile_cache_on_the_claim_every_start_compiles(sim: SimHarness) -> None:
    sim.create_deployment(deployment("cold", LLAMA3_8B, FLAGS, cached=True))
    first = _ready_pod(sim, "cold")
    cold = _measured(sim, first)
    assert coldstart.compile_cache_kind(first) == "ephemeral"
    sim.api.delete_object("pods", first["metadata"]["name"], "default")
    sim.run_until(lambda: [p for p in sim.pods("cold") if p["metadata"]["name"] != first["metadata"]["name"]])
    again = _measured(sim, _ready_pod(sim, "cold"))
    assert again["compileSeconds"] == cold["compileSeconds"]


def _pulled_events(sim: SimHarness, pod: dict[str, Any]) -> list[dict[str, Any]]:
    uid = pod["metadata"]["uid"]
    return sim.api.list_objects("events", "default", field_selector=f"involvedObject.uid={uid},reason=Pulled")


def test_the_image_pull_is_measured_apart_from_the_volume_from_the_kubelets_events(sim: SimHarness) -> None:
    """The simulated kubelet's Pulled Events read as the real one's: the first pod on a node pulls the image (30 s
    here), the init container's image is then vLLM's too ("already present"), the next pod on that node pulls
    nothing; the pull is a phase of status.coldStart apart from the pod start (pull + volume + containers)."""
    sim.create_deployment(deployment("pull", LLAMA3_8B, FLAGS, cached=True, compile_cache=True))
    first = _ready_pod(sim, "pull")
    events = _pulled_events(sim, first)
    messages = [e["message"] for e in events]
    assert any(m.startswith('Successfully pulled image "') and "(30s including waiting). Image size: " in m
               for m in messages), messages
    assert any(m.endswith("already present on machine") for m in messages), messages  # the vLLM container
    cold = coldstart.cold_start_from_pod(first, sim.log(first["metadata"]["name"]),
                                         download_container=DOWNLOAD_CONTAINER, events=events)
    assert cold is not None and cold["imagePullSeconds"] == 30.0 and cold["imageBytes"] > 0
    assert cold["podStartSeconds"] >= cold["imagePullSeconds"]
    sim.api.delete_object("pods", first["metadata"]["name"], "default")
    sim.run_until(lambda: [p for p in sim.pods("pull") if p["metadata"]["name"] != first["metadata"]["name"]])
    second = _ready_pod(sim, "pull")
    again = _pulled_events(sim, second)
    assert again and all(e["message"].endswith("already present on machine") for e in again)
    warm = coldstart.cold_start_from_pod(second, sim.log(second["metadata"]["name"]),
                                         download_container=DOWNLOAD_CONTAINER, events=again)
    assert warm is not None and warm["imagePullSeconds"] == 0.0 and "imageBytes" not in warm
    assert warm["podStartSeconds"] < cold["podStartSeconds"]
