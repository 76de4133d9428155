"""`reconcile.desired_state` as a pure function: from what a handler observed to children, status and events.

No API server: the inputs are a spec, a status, node labels and model files from the built-in catalog.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.api.v1alpha1 import parse_spec
from vllm_operator.planner import Constraints
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator.sources import ModelFiles, load_model_files

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
L4 = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "23034"}
A100_X4 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "4"}
H100_X8 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
RTX4090 = {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090", "nvidia.com/gpu.count": "1"}


def _files(model: str) -> ModelFiles:
    return load_model_files(model, offline=True)


def observe(spec: Mapping[str, Any], *, status: Mapping[str, Any] | None = None,
            nodes: Sequence[Mapping[str, str]] = (L4,), generation: int = 1, now: datetime = NOW,
            files: ModelFiles | None | str = "catalog", model_error: str | None = None) -> reconcile.Observed:
    if files == "catalog":
        files = _files(spec["model"]["name"])
    assert not isinstance(files, str)
    return reconcile.Observed(name="svc", namespace="ns", uid="uid-1", generation=generation, spec=spec,
                              status=dict(status or {}), now=now, nodes=nodes, model_files=files,
                              model_error=model_error)


def run(spec: Mapping[str, Any], **kwargs: Any) -> reconcile.Desired:
    return reconcile.desired_state(observe(spec, **kwargs))


def conditions(desired: reconcile.Desired) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in desired.status.conditions}


def message_of(desired: reconcile.Desired, type_: str) -> str:
    found = cond.find_condition(desired.status.conditions, type_)
    assert found is not None
    return found.message


def status_dict(desired: reconcile.Desired) -> dict[str, Any]:
    """The status as the API would store it (what the next reconcile observes)."""
    return desired.status.to_dict()


# --- invalid specs -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("extra", "path", "fix"), [
    ({"flags": {"gpuMemoryUtilization": 1.5}}, "spec.flags.gpuMemoryUtilization", "less than or equal to 1"),
    ({"flags": {"maxModelLength": 8192}}, "spec.flags.maxModelLength", "did you mean 'maxModelLen'"),
    ({"gpu": {"product": "nonexistent-gpu"}}, "spec.gpu.product", "use a catalog name"),
    ({"gpu": {"count": 4, "maxCount": 2}}, "spec.gpu.count", "raise gpu.maxCount"),
    ({"image": "vllm/vllm-openai:v0.10.0", "flags": {"kvCacheMemoryBytes": 2**30}},
     "spec.flags.kvCacheMemoryBytes", "does not exist before vLLM 0.11.0"),
    # flags the image's release lacks, read from its own parser (catalog/vllm_flags_cli.yaml)
    ({"image": "vllm/vllm-openai:v0.32.0", "extraArgs": ["--seed", "1", "--disable-log-requests"]},
     "spec.extraArgs[2]", "--disable-log-requests was removed in vLLM 0.17.0 (the image runs vLLM 0.32.0)"),
    ({"image": "vllm/vllm-openai:v0.9.0", "extraArgs": ["--async-scheduling"]},
     "spec.extraArgs[0]", "--async-scheduling was added in vLLM 0.10.0"),
    ({"image": "vllm/vllm-openai:v0.13.0", "flags": {"maxModelLen": "auto"}},
     "spec.flags.maxModelLen", "--max-model-len auto was added in vLLM 0.14.0"),
])
def test_invalid_spec(extra: dict[str, Any], path: str, fix: str) -> None:
    desired = run({"model": {"name": LLAMA_8B}, **extra})
    assert desired.children is None and desired.plan is None
    found = conditions(desired)
    assert found[cond.DEGRADED] == (cond.TRUE, cond.INVALID_SPEC)
    assert found[cond.PLAN_FEASIBLE] == (cond.UNKNOWN, cond.INVALID_SPEC)
    assert found[cond.PROGRESSING] == (cond.FALSE, cond.INVALID_SPEC)
    assert path in message_of(desired, cond.DEGRADED) and fix in message_of(desired, cond.DEGRADED)
    assert [(e.type, e.reason) for e in desired.events] == [("Warning", cond.INVALID_SPEC)]
    assert path in desired.events[0].message and fix in desired.events[0].message
    assert desired.status.observed_generation == 1


def test_missing_model_is_invalid() -> None:
    desired = run({"gpu": {"product": "L4"}}, files=None)
    assert conditions(desired)[cond.DEGRADED] == (cond.TRUE, cond.INVALID_SPEC)
    assert "spec.model" in message_of(desired, cond.DEGRADED)


# --- unknown model -----------------------------------------------------------------------------------

def test_unknown_model_says_why_and_retries_later() -> None:
    desired = run({"model": {"name": "acme/no-such-model"}}, files=None,
                  model_error="acme/no-such-model: 404 Repository Not Found")
    assert desired.children is None and desired.retry_after == 60
    assert conditions(desired)[cond.DEGRADED] == (cond.TRUE, cond.MODEL_NOT_FOUND)
    assert conditions(desired)[cond.PLAN_FEASIBLE] == (cond.UNKNOWN, cond.MODEL_NOT_FOUND)
    assert "404 Repository Not Found" in message_of(desired, cond.DEGRADED)
    assert [(e.type, e.reason) for e in desired.events] == [("Warning", cond.MODEL_NOT_FOUND)]
    without_error = run({"model": {"name": "acme/no-such-model"}}, files=None)
    assert "could not be read" in message_of(without_error, cond.DEGRADED)


# --- GPU discovery -----------------------------------------------------------------------------------

def test_gpu_from_node_labels() -> None:
    desired = run({"model": {"name": LLAMA_8B}}, nodes=[A100_X4, A100_X4])
    gpu = desired.status.gpu
    assert gpu is not None and gpu.product == "NVIDIA-A100-SXM4-40GB" and gpu.count == 1
    assert gpu.source is not None and "from node label nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB" in gpu.source
    assert "all 2 GPU node(s) have 4x A100-SXM4-40GB" in gpu.source
    assert desired.children is not None
    deployment = next(c for c in desired.children if c["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}


def test_heterogeneous_pool_picks_the_smallest_pool_that_is_usable_and_says_so() -> None:
    desired = run({"model": {"name": LLAMA_8B}}, nodes=[L4, L4, L4, H100_X8])
    gpu = desired.status.gpu
    assert gpu is not None and gpu.product == "NVIDIA-L4"
    assert gpu.source is not None
    assert "chose 1× L4 (the usable plan that takes the least GPU memory)" in gpu.source
    assert "3 node(s) with 1× L4: usable" in gpu.source and "1 node(s) with 8× H100-SXM-80GB: usable" in gpu.source


def test_gpu_from_spec_skips_the_nodes() -> None:
    desired = run({"model": {"name": LLAMA_8B}, "gpu": {"product": "L4"}}, nodes=())
    gpu = desired.status.gpu
    assert gpu is not None and gpu.product == "NVIDIA-L4" and gpu.source == "from spec.gpu.product=L4"
    override = run({"model": {"name": LLAMA_8B}, "gpu": {"product": "L4", "memoryGiB": 16}}, nodes=())
    assert override.status.gpu is not None and override.status.gpu.memory_gib == 16
    assert "memory overridden to 16" in (override.status.gpu.source or "")
    assert override.status.plan is not None and override.status.plan.memory is not None
    assert override.status.plan.memory.gpu_total_gib == 16


def test_no_gpu_nodes_waits_for_them() -> None:
    desired = run({"model": {"name": LLAMA_8B}}, nodes=[{"kubernetes.io/hostname": "cpu-1"}])
    assert desired.children is None and desired.retry_after == 30
    assert conditions(desired)[cond.DEGRADED] == (cond.TRUE, cond.GPU_NOT_FOUND)
    assert conditions(desired)[cond.PROGRESSING] == (cond.TRUE, cond.GPU_NOT_FOUND)
    assert "nvidia.com/gpu.product" in message_of(desired, cond.DEGRADED)


def test_plan_uses_up_to_the_gpus_a_node_has() -> None:
    spec = parse_spec({"model": {"name": "Qwen/Qwen2.5-14B-Instruct"}})
    catalog = load_gpu_catalog()
    gpu, _, _, per_node = reconcile.resolve_gpu(spec, [{**L4, "nvidia.com/gpu.count": "2"}], catalog)
    assert per_node == 2
    desired = run({"model": {"name": "Qwen/Qwen2.5-14B-Instruct"}}, nodes=[{**L4, "nvidia.com/gpu.count": "2"}])
    assert desired.plan is not None and desired.plan.fits and desired.plan.gpu_count == 2
    single = run({"model": {"name": "Qwen/Qwen2.5-14B-Instruct"}}, nodes=[L4])
    assert single.plan is not None and not single.plan.fits and single.children is None


@pytest.mark.parametrize(("labels", "want"), [
    (L4, "NVIDIA-L4"),
    (H100_X8, "NVIDIA-H100-80GB-HBM3"),
    pytest.param({"nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.count": "1",
                  "nvidia.com/gpu.replicas": "4"}, "NVIDIA-L4-SHARED"),
    pytest.param({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "nvidia.com/gpu.count": "2",
                  "nvidia.com/gpu.memory": "20096"}, "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"),
], ids=["l4", "h100", "time-sliced", "mig-single"])
def test_node_selector_matches_the_pool_label(labels: dict[str, str], want: str) -> None:
    spec = parse_spec({"model": {"name": LLAMA_8B}})
    _, _, label, _ = reconcile.resolve_gpu(spec, [labels], load_gpu_catalog())
    assert label == want


# --- infeasible ----------------------------------------------------------------------------------------

def test_infeasible_plan_has_no_children_and_offers_options() -> None:
    spec = {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, "gpu": {"maxCount": 1}}
    desired = run(spec, nodes=[RTX4090])
    assert desired.children is None and desired.retry_after is None
    plan = desired.status.plan
    assert plan is not None and plan.fits is False and plan.failure is not None and plan.options
    assert plan.args and plan.spec_hash
    found = conditions(desired)
    assert found[cond.PLAN_FEASIBLE] == (cond.FALSE, cond.PLAN_INFEASIBLE)
    assert found[cond.DEGRADED] == (cond.TRUE, cond.PLAN_INFEASIBLE)
    assert found[cond.READY] == (cond.FALSE, cond.PLAN_INFEASIBLE)
    assert [(e.type, e.reason) for e in desired.events] == [("Warning", cond.PLAN_INFEASIBLE)]
    assert "does not fit 1× RTX-4090" in desired.events[0].message
    assert plan.options[0].summary in desired.events[0].message
    again = run(spec, nodes=[RTX4090], status=status_dict(desired), now=NOW + timedelta(minutes=5))
    assert again.events == []
    assert status_dict(again) == status_dict(desired)


# --- fits ------------------------------------------------------------------------------------------------

def test_fits_renders_children_status_and_one_event() -> None:
    desired = run({"model": {"name": LLAMA_8B}})
    assert desired.plan is not None and desired.plan.fits
    assert desired.children is not None
    assert [c["kind"] for c in desired.children] == ["Deployment", "Service"]
    plan = desired.status.plan
    assert plan is not None and plan.args and plan.flags == desired.plan.flags
    found = conditions(desired)
    assert found[cond.PLAN_FEASIBLE] == (cond.TRUE, cond.PLAN_FITS)
    assert found[cond.DEGRADED] == (cond.FALSE, cond.AS_EXPECTED)
    assert found[cond.PROGRESSING] == (cond.TRUE, cond.DEPLOYING)
    assert found[cond.READY] == (cond.FALSE, cond.PODS_NOT_READY)
    assert desired.status.endpoint == "http://svc.ns.svc:8000/v1"
    assert desired.status.replicas == 1
    assert desired.status.selector == (
        "app.kubernetes.io/instance=svc,vllm-operator.dev/service=svc,vllm-operator.dev/workload=deployment,"
        "!leaderworkerset.sigs.k8s.io/name")
    assert [(e.type, e.reason) for e in desired.events] == [("Normal", "Planned")]
    assert " ".join(desired.status.plan.args) in desired.events[0].message  # type: ignore[union-attr]


def test_events_only_when_the_plan_hash_changes() -> None:
    spec = {"model": {"name": LLAMA_8B}}
    first = run(spec)
    second = run(spec, status=status_dict(first), now=NOW + timedelta(minutes=1))
    assert second.events == []
    assert status_dict(second) == status_dict(first)  # nothing to write either
    assert second.children == first.children
    changed = run({**spec, "flags": {"maxModelLen": 4096}}, status=status_dict(second), generation=2)
    assert [e.reason for e in changed.events] == ["Planned"]
    assert changed.status.plan is not None and changed.status.plan.spec_hash != first.status.plan.spec_hash  # type: ignore[union-attr]
    assert changed.status.observed_generation == 2


def test_children_are_deterministic() -> None:
    spec = {"model": {"name": LLAMA_8B}}
    assert run(spec).children == run(spec, now=NOW + timedelta(hours=1)).children


def test_pinned_flags_win() -> None:
    desired = run({"model": {"name": LLAMA_8B}, "flags": {"maxModelLen": 8192, "gpuMemoryUtilization": 0.85}})
    assert desired.status.plan is not None
    args = desired.status.plan.args
    assert args[args.index("--max-model-len") + 1] == "8192"
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.85"


def test_max_model_len_auto_reaches_vllm_and_the_plan_says_what_it_picks() -> None:
    desired = run({"model": {"name": LLAMA_8B}, "image": "vllm/vllm-openai:v0.32.0", "flags": {"maxModelLen": "auto"},
                   "extraArgs": ["--async-scheduling", "-O3"]})
    assert desired.status.plan is not None and desired.children is not None
    args = desired.status.plan.args
    assert args[args.index("--max-model-len") + 1] == "auto"
    assert isinstance(desired.status.plan.flags["max_model_len"], int)  # the length auto is predicted to pick
    assert any(r.startswith("max-model-len auto: vLLM 0.32.0") for r in desired.status.plan.reasons)


def test_fixed_spec_clears_degraded() -> None:
    bad = run({"model": {"name": LLAMA_8B}, "flags": {"gpuMemoryUtilization": 1.5}})
    fixed = run({"model": {"name": LLAMA_8B}}, status=status_dict(bad), generation=2,
                now=NOW + timedelta(minutes=1))
    assert conditions(fixed)[cond.DEGRADED] == (cond.FALSE, cond.AS_EXPECTED)
    degraded = cond.find_condition(fixed.status.conditions, cond.DEGRADED)
    assert degraded is not None and degraded.last_transition_time == "2025-01-02T03:05:05Z"


def test_transition_time_moves_only_when_a_status_changes() -> None:
    first = run({"model": {"name": LLAMA_8B}})
    later = run({"model": {"name": LLAMA_8B}, "flags": {"maxModelLen": 4096}}, status=status_dict(first),
                generation=2, now=NOW + timedelta(hours=1))
    before = {c.type: c.last_transition_time for c in first.status.conditions}
    after = {c.type: c.last_transition_time for c in later.status.conditions}
    assert before == after


# --- remediation constraints --------------------------------------------------------------------------------

def test_constraints_from_status_remediation_profile_are_honoured() -> None:
    spec = {"model": {"name": LLAMA_8B}}
    free = run(spec)
    assert free.plan is not None
    profile = {"max_utilization": 0.8, "max_model_len": 4096, "max_num_seqs": 4, "not_a_constraint": 1}
    status = {"remediation": {"step": 2, "profile": profile}}
    constrained = run(spec, status=status)
    assert constrained.plan is not None and constrained.plan.fits
    flags = constrained.plan.flags
    assert flags["gpu_memory_utilization"] <= 0.8 < free.plan.flags["gpu_memory_utilization"]
    assert flags["max_model_len"] <= 4096 < free.plan.flags["max_model_len"]
    assert flags["max_num_seqs"] <= 4
    assert constrained.status.plan is not None and free.status.plan is not None
    assert constrained.status.plan.spec_hash != free.status.plan.spec_hash  # a new plan: a new event
    assert constrained.status.remediation is not None and constrained.status.remediation.step == 2
    assert reconcile.constraints_from_status(status) == Constraints(max_utilization=0.8, max_model_len=4096,
                                                                   max_num_seqs=4)
    assert reconcile.constraints_from_status({}) == Constraints()


# --- known bugs --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["invalid", "gpu-not-found", "model-not-found"])
def test_problem_events_are_not_repeated_when_nothing_changed(case: str) -> None:
    kwargs: dict[str, Any] = {
        "invalid": {"spec": {"model": {"name": LLAMA_8B}, "flags": {"gpuMemoryUtilization": 1.5}}},
        "gpu-not-found": {"spec": {"model": {"name": LLAMA_8B}}, "nodes": ()},
        "model-not-found": {"spec": {"model": {"name": "acme/none"}}, "files": None, "model_error": "404"},
    }[case]
    spec = kwargs.pop("spec")
    first = run(spec, **kwargs)
    assert first.events
    again = run(spec, status=status_dict(first), now=NOW + timedelta(seconds=30), **kwargs)
    assert status_dict(again) == status_dict(first)
    assert again.events == []


def test_workload_profile_fills_in_the_workload() -> None:
    plain = run({"model": {"name": LLAMA_8B}})
    agent = run({"model": {"name": LLAMA_8B}, "workload": {"profile": "agent"}})
    assert agent.plan is not None and plain.plan is not None
    assert agent.plan.flags.get("enable_prefix_caching") is True
    assert agent.plan.flags != plain.plan.flags


@pytest.mark.parametrize("reason", [cond.DOWNLOADING, cond.MODEL_DOWNLOAD_FAILED])
def test_a_reconcile_keeps_what_the_pods_said_of_the_download(reason: str) -> None:
    """The watchdog's reconcile reads only readyReplicas: it must not write Deploying over Downloading (a 130 GiB
    download takes longer than its period), nor over ModelDownloadFailed; a new generation starts afresh."""
    first = status_dict(run({"model": {"name": LLAMA_8B}}))
    said = [{**c, "reason": reason, "message": "downloading the model into the cache: pod svc-abc"}
            if c["type"] in (cond.PROGRESSING, cond.READY) else c for c in first["conditions"]]
    again = run({"model": {"name": LLAMA_8B}}, status={**first, "conditions": said})
    assert conditions(again)[cond.PROGRESSING] == (cond.TRUE, reason)
    assert conditions(again)[cond.READY] == (cond.FALSE, reason)
    if reason == cond.DOWNLOADING:
        assert again.status.state == "Downloading"
    newer = run({"model": {"name": LLAMA_8B}}, status={**first, "conditions": said}, generation=2)
    assert conditions(newer)[cond.PROGRESSING] == (cond.TRUE, cond.DEPLOYING)
