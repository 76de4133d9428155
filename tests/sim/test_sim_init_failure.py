"""The simulated kubelet's failing model download: a gated model without a token fails the model-download init
container as the real script does (huggingface_hub's GatedRepoError, exit code 1, Init:CrashLoopBackOff with the
kubelet's back-off), and the emulator's `kubectl get pods` table shows `Init:0/1`, `Init:Error`,
`Init:CrashLoopBackOff` as kubectl's printPod does (manual clock, no sleeps)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from simkit import SimHarness, deployment

from vllm_operator.api import rollout
from vllm_operator.render.cache import DOWNLOAD_CONTAINER, download_failure

GATED = "meta-llama/Meta-Llama-3-8B-Instruct"
FLAGS = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 13}
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def _deployment(name: str, *, token_secret: str | None = None) -> dict[str, Any]:
    return deployment(name, GATED, FLAGS, cached=True, hf_token_secret=token_secret)


def _pod(sim: SimHarness, service: str) -> dict[str, Any]:
    [pod] = sim.pods(service)
    return pod


def _init(pod: dict[str, Any]) -> dict[str, Any]:
    return dict((pod["status"].get("initContainerStatuses") or [{}])[0])


def _pod_rows(sim: SimHarness) -> dict[str, dict[str, Any]]:
    """`kubectl get pods`: the server-side table's rows by pod name, cells by column name."""
    request = urllib.request.Request(f"{sim.server.url}/api/v1/namespaces/default/pods", headers={"Accept": TABLE})
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback only
        table = json.loads(response.read())
    names = [c["name"] for c in table["columnDefinitions"]]
    return {row["cells"][0]: dict(zip(names, row["cells"], strict=False)) for row in table["rows"]}


def _status_column(sim: SimHarness, pod: str) -> str:
    return str(_pod_rows(sim)[pod]["Status"])


def test_a_gated_model_without_a_token_fails_the_init_container(sim: SimHarness) -> None:
    sim.kubelet.gated_models = frozenset({GATED})
    sim.create_deployment(_deployment("gated"))
    sim.run_until(lambda: "running" in (_init(_pod(sim, "gated")).get("state") or {}))
    name = _pod(sim, "gated")["metadata"]["name"]
    assert _status_column(sim, name) == "Init:0/1"
    assert rollout.download_running(_pod(sim, "gated")) is not None

    sim.run_until(lambda: "terminated" in (_init(_pod(sim, "gated")).get("state") or {}))
    pod = _pod(sim, "gated")
    terminated = _init(pod)["state"]["terminated"]
    assert terminated["exitCode"] == 1 and terminated["reason"] == "Error"
    assert f"Access to model {GATED} is restricted" in terminated["message"]
    assert "GatedRepoError: 401" in (download_failure(pod) or "")
    assert _status_column(sim, name) == "Init:Error"
    assert rollout.download_failure(pod) is not None and rollout.download_running(pod) is None

    sim.run_until(lambda: (_init(_pod(sim, "gated")).get("state") or {}).get("waiting", {}).get("reason")
                  == "CrashLoopBackOff")
    assert _status_column(sim, name) == "Init:CrashLoopBackOff"
    sim.run_until(lambda: int(_init(_pod(sim, "gated")).get("restartCount") or 0) >= 2, limit=600)
    pod = _pod(sim, "gated")
    assert _init(pod)["lastState"]["terminated"]["exitCode"] == 1
    assert str(_pod_rows(sim)[name]["Restarts"]).startswith("2")  # the init container's restarts, as kubectl
    # vLLM never started and nothing was downloaded: the pod stays Pending in Init
    assert pod["status"]["phase"] == "Pending"
    assert pod["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert not [e for e in sim.events if e.service == "gated" and e.kind in ("download", "started")]
    failed = [e for e in sim.events if e.service == "gated" and e.kind == "init-failed"]
    assert len(failed) >= 2 and "is restricted" in failed[0].message
    url = f"{sim.server.url}/api/v1/namespaces/default/pods/{name}/log?container={DOWNLOAD_CONTAINER}"
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback only: `kubectl logs -c`
        assert "GatedRepoError: 401" in response.read().decode()


def test_with_a_token_the_gated_model_downloads(sim: SimHarness) -> None:
    sim.kubelet.gated_models = frozenset({GATED})
    sim.api.create_object("secrets", {"apiVersion": "v1", "kind": "Secret",
                                      "metadata": {"name": "hf", "namespace": "default"},
                                      "stringData": {"HF_TOKEN": "hf_simulated_placeholder"}}, namespace="default")
    sim.create_deployment(_deployment("tokened", token_secret="hf"))
    sim.run_until(lambda: any(c.get("type") == "Initialized" and c.get("status") == "True"
                              for c in _pod(sim, "tokened")["status"].get("conditions") or []))
    pod = _pod(sim, "tokened")
    assert _init(pod)["state"]["terminated"]["exitCode"] == 0
    assert [e.kind for e in sim.events if e.service == "tokened" and e.kind == "download"] == ["download"]
    assert _status_column(sim, pod["metadata"]["name"]) != "Init:Error"
