"""Several edits in a row: each lands while the operator applies the previous one (after its Deployment update,
before its status write), so that status write answers 409. The reconcile of an older generation is superseded —
no retry, no back-off — and kopf handles the newest spec at once; every edit reaches the Deployment."""

from __future__ import annotations

from typing import Any

from kit.inprocess import Cluster, harness_fixture  # noqa: F401 (`harness`)
from vllm_operator import metrics

QWEN = "Qwen/Qwen2.5-7B-Instruct"


def _retries() -> float:
    return float(metrics.RECONCILES.labels(outcome="retry")._value.get())


def _env(deployment: dict[str, Any] | None) -> list[dict[str, Any]]:
    containers = (((deployment or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("containers")
    return list((containers or [{}])[0].get("env") or [])


def test_edits_in_a_row_converge_without_a_conflict_retry(harness: Cluster) -> None:
    h = harness
    h.add_gpu_node("gpu-1", "NVIDIA-L4", count=1)
    h.create("qwen", {"model": {"name": QWEN}})
    h.wait_for(lambda: h.deployment("qwen"), message="the Deployment")
    h.wait_settled("qwen")
    retries = _retries()
    edits = 5
    for i in range(edits):
        # the next edit as soon as the operator's Deployment update of this one landed: inside its reconcile
        h.patch_spec("qwen", {"env": [{"name": "EDIT", "value": str(i)}]})
        h.wait_for(lambda i=i: any(e == {"name": "EDIT", "value": str(i)} for e in _env(h.deployment("qwen")))
                   or None, message=f"edit {i} applied")
    settled = h.wait_settled("qwen")
    assert settled["status"]["observedGeneration"] == settled["metadata"]["generation"]
    assert {"name": "EDIT", "value": str(edits - 1)} in _env(h.deployment("qwen"))
    assert _retries() == retries, h.operator_log(80)  # no reconcile waited out a 409 retry delay
    assert "changed while it was reconciled" not in h.operator_log(400)
