"""The simulated kubelet's model downloads: the model-download init container and vLLM's own download, timed by the
kubelet's network rate, with `cache-hit` when the cache volume holds the weights (manual clock, no sleeps)."""

from __future__ import annotations

import json
from typing import Any

from simkit import SimHarness, deployment, model

from vllm_operator.render.cache import measured_download

LLAMA3_8B = "meta-llama/Meta-Llama-3-8B-Instruct"
FLAGS = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 13}


def _cached_deployment(name: str) -> dict[str, Any]:
    """The operator's Deployment with a claim for the cache and the model-download init container."""
    return deployment(name, LLAMA3_8B, FLAGS, cached=True)


def _pod(sim: SimHarness, service: str) -> dict[str, Any]:
    [pod] = sim.pods(service)
    return pod


def _condition(pod: dict[str, Any], kind: str) -> str:
    return next((c["status"] for c in pod["status"].get("conditions") or [] if c["type"] == kind), "")


def _fetches(sim: SimHarness, service: str) -> list[tuple[str, str, str]]:
    return [(e.kind, e.pod, str(e.details.get("container"))) for e in sim.events
            if e.service == service and e.kind in ("download", "cache-hit")]


def test_the_init_container_downloads_then_vllm_finds_the_weights(sim: SimHarness) -> None:
    size = model(LLAMA3_8B).total_size or 0
    sim.create_deployment(_cached_deployment("cached"))
    sim.run_until(lambda: _fetches(sim, "cached"))
    pod = _pod(sim, "cached")
    assert pod["status"]["phase"] == "Pending" and _condition(pod, "Initialized") == "False"
    [init] = pod["status"]["initContainerStatuses"]
    assert init["name"] == "model-download" and "running" in init["state"]
    assert pod["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    seconds = size / 2**20 / sim.kubelet.download_mib_per_s
    started = sim.clock.now()
    sim.run_until(lambda: _condition(_pod(sim, "cached"), "Initialized") == "True")
    assert sim.clock.now() - started >= seconds  # the download takes its time before vLLM starts
    pod = _pod(sim, "cached")
    terminated = pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and json.loads(terminated["message"])["downloadedBytes"] == size
    measure = measured_download(pod)
    assert measure is not None and measure.telling() and measure.downloaded_bytes == size
    sim.run_until(lambda: (_pod(sim, "cached")["status"]["containerStatuses"][0]).get("ready"))
    assert _fetches(sim, "cached") == [("download", pod["metadata"]["name"], "model-download"),
                                       ("cache-hit", pod["metadata"]["name"], "vllm")]
    assert "Time spent downloading weights" not in sim.log(pod["metadata"]["name"])  # vLLM downloaded nothing
    # a new pod on the same claim (a remediation step, a rollout): the init container finds the weights at once
    sim.api.delete_object("pods", pod["metadata"]["name"], "default")
    sim.run_until(lambda: len(_fetches(sim, "cached")) >= 4)
    [new] = sim.pods("cached")
    assert _fetches(sim, "cached")[2:] == [("cache-hit", new["metadata"]["name"], "model-download"),
                                           ("cache-hit", new["metadata"]["name"], "vllm")]
    assert json.loads(new["status"]["initContainerStatuses"][0]["state"]["terminated"]["message"]) == {
        "downloadedBytes": 0, "seconds": 1.5}
    warm = measured_download(new)
    assert warm is not None and not warm.telling()  # a warm cache is not a measurement


def test_without_an_init_container_vllm_downloads_and_logs_it(sim: SimHarness) -> None:
    sim.api.create_object("deployments", deployment("plain", LLAMA3_8B, FLAGS))
    sim.run_until(lambda: (_pod(sim, "plain")["status"].get("containerStatuses") or [{}])[0].get("ready"))
    pod = _pod(sim, "plain")
    assert "initContainerStatuses" not in pod["status"]
    assert _fetches(sim, "plain") == [("download", pod["metadata"]["name"], "vllm")]
    size = model(LLAMA3_8B).total_size or 0
    text = sim.log(pod["metadata"]["name"])
    line = next(x for x in text.splitlines() if "Time spent downloading weights" in x)
    seconds = float(line.split(": ")[-1].split()[0])
    assert abs(seconds - size / 2**20 / sim.kubelet.download_mib_per_s) < 0.01
    assert text.index("Starting to load model") < text.index("Time spent downloading") < text.index("Loading weights")
