"""Images as people pin them: a digest, a mirror tag or `latest` plans for the newest known release and says so;
`spec.vllmVersion` (CLI `--vllm-version`) names the release when the reference does not."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.api.v1alpha1 import validate_spec
from vllm_operator.planner.versions import NEWEST_KNOWN_VERSION, VersionError, image_version
from vllm_operator.sources import load_model_files

DIGEST = "vllm/vllm-openai@sha256:" + "0123456789abcdef" * 4
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
L4 = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "23034"}


def run(spec: Mapping[str, Any], nodes: tuple[Mapping[str, str], ...] = (L4,)) -> reconcile.Desired:
    return reconcile.desired_state(reconcile.Observed(
        name="svc", namespace="ns", uid="uid-1", generation=1, spec=spec, status={},
        now=datetime(2025, 1, 2, tzinfo=UTC), nodes=nodes, model_files=load_model_files(LLAMA_8B, offline=True)))


def conditions(desired: reconcile.Desired) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in desired.status.conditions}


def message_of(desired: reconcile.Desired, type_: str) -> str:
    found = cond.find_condition(desired.status.conditions, type_)
    assert found is not None
    return found.message


@pytest.mark.parametrize(("image", "declared", "version", "source"), [
    ("vllm/vllm-openai:v0.10.1", None, "0.10.1", "tag"),
    ("vllm/vllm-openai:v0.10.1@sha256:" + "ab" * 32, None, "0.10.1", "tag"),
    (DIGEST, None, NEWEST_KNOWN_VERSION, "assumed"),
    ("registry.local/vllm:prod", None, NEWEST_KNOWN_VERSION, "assumed"),
    ("localhost:5000/vllm@sha256:" + "ab" * 32, None, NEWEST_KNOWN_VERSION, "assumed"),
    ("vllm/vllm-openai:latest", None, NEWEST_KNOWN_VERSION, "assumed"),
    ("vllm/vllm-openai", None, NEWEST_KNOWN_VERSION, "assumed"),
    (DIGEST, "0.11.0", "0.11.0", "declared"),
    ("registry.local/vllm:prod", "v0.9.2", "0.9.2", "declared"),
    ("vllm/vllm-openai:v0.10.1", "0.11.0", "0.11.0", "declared"),  # the declared release wins over a tag
    ("vllm/vllm-openai:v0.10.1", "latest", NEWEST_KNOWN_VERSION, "assumed"),
])
def test_image_version(image: str, declared: str | None, version: str, source: str) -> None:
    found = image_version(image, declared)
    assert (found.version, found.source) == (version, source)
    assert bool(found.note) == (source == "assumed")
    if found.note:
        assert found.note.startswith(f"vLLM {NEWEST_KNOWN_VERSION} assumed") and "spec.vllmVersion" in found.note


def test_a_declared_version_must_be_a_version() -> None:
    with pytest.raises(VersionError):
        image_version(DIGEST, "banana")
    assert any(e.field == "spec.vllmVersion" for e in validate_spec({"model": {"name": LLAMA_8B},
                                                                     "vllmVersion": "banana"}))


@pytest.mark.parametrize("image", [DIGEST, "registry.local/vllm:prod", "vllm/vllm-openai:latest"])
def test_operator_plans_a_digest_image_for_the_newest_release_and_says_so(image: str) -> None:
    desired = run({"model": {"name": LLAMA_8B}, "image": image}, nodes=(L4,))
    assert desired.children is not None and desired.plan is not None
    assert desired.plan.vllm_version == NEWEST_KNOWN_VERSION
    assert conditions(desired)[cond.PLAN_FEASIBLE] == (cond.TRUE, cond.VERSION_ASSUMED)
    assert "spec.vllmVersion" in message_of(desired, cond.PLAN_FEASIBLE)
    assert any(r.startswith(f"vLLM {NEWEST_KNOWN_VERSION} assumed") for r in desired.plan.reasons)
    container: dict[str, Any] = next(c for c in desired.children if c["kind"] == "Deployment")[
        "spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == image  # pinned as the user pinned it


def test_operator_uses_spec_vllm_version_for_a_digest_image() -> None:
    desired = run({"model": {"name": LLAMA_8B}, "image": DIGEST, "vllmVersion": "0.10.1"}, nodes=(L4,))
    assert desired.plan is not None and desired.plan.vllm_version == "0.10.1"
    assert conditions(desired)[cond.PLAN_FEASIBLE] == (cond.TRUE, cond.PLAN_FITS)
    assert not any("assumed" in r for r in desired.plan.reasons)
    assert desired.status.plan is not None and desired.status.plan.vllm_version == "0.10.1"


def test_spec_vllm_version_decides_which_flags_exist() -> None:
    # kvCacheMemoryBytes exists from vLLM 0.11.0: the declared release, not the digest, decides
    desired = run({"model": {"name": LLAMA_8B}, "image": DIGEST, "vllmVersion": "0.10.0",
                   "flags": {"kvCacheMemoryBytes": 2**30}}, nodes=(L4,))
    assert conditions(desired)[cond.DEGRADED] == (cond.TRUE, cond.INVALID_SPEC)
    assert "does not exist before vLLM 0.11.0" in message_of(desired, cond.DEGRADED)
