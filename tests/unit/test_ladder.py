"""The ladder's one pure decision (`remediation.ladder.next_step`): what it records, what it rolls out, and that it
is idempotent over the status it recorded — the property record-then-act rests on (a rebuilt write after a 409/5xx
or a restart finds the step recorded and takes none)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from vllm_operator import reconcile
from vllm_operator.api.v1alpha1 import RemediationEvent, parse_spec
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator.planner.versions import profile_for
from vllm_operator.remediation import ladder
from vllm_operator.remediation.classifier import classify_text
from vllm_operator.remediation.evidence import ContainerEvidence
from vllm_operator.remediation.policy import failure_key
from vllm_operator.sources import load_model_files

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
NODES = [{"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1"}]
SPEC: dict[str, Any] = {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "remediation": {"minIntervalSeconds": 0}}


def _observed(status: Mapping[str, Any], spec: Mapping[str, Any] = SPEC, now: datetime = NOW) -> ladder.Observed:
    base = reconcile.Observed(name="svc", namespace="ns", uid="uid-1", generation=1, spec=dict(spec),
                              status=dict(status), now=now, nodes=NODES,
                              model_files=load_model_files(spec["model"]["name"], offline=True),
                              catalog=load_gpu_catalog())

    def render(st: Mapping[str, Any]) -> reconcile.Desired:
        return reconcile.desired_state(replace(base, status=dict(st)))
    return ladder.Observed(status=dict(status), generation=1, now=now, render=render)


def _planned(spec: Mapping[str, Any] = SPEC) -> dict[str, Any]:
    """The status the reconcile writes for the plain plan."""
    first = _observed({}, spec)
    return first.render({}).status.to_dict()


def _no_kv(status: Mapping[str, Any], pod: str = "pod-a", restarts: int = 1) -> ladder.PodFailure:
    from vllm_operator.planner import messages

    text = messages.no_kv_memory_message(profile_for(status["plan"]["vllmVersion"]))
    failure = classify_text(text, terminated_reason="Error", exit_code=1)
    evidence = ContainerEvidence(namespace="ns", pod_name=pod, pod_uid=f"uid-{pod}", container_name="vllm",
                                 restart_count=restarts, terminated_reason="Error", exit_code=1,
                                 termination_message=text)
    return ladder.PodFailure(evidence, failure, failure_key(evidence.pod_uid, restarts))


def _spec(spec: Mapping[str, Any] = SPEC) -> Any:
    return parse_spec(dict(spec))


def test_a_step_records_profile_entry_and_key_and_renders_new_pods() -> None:
    status = _planned()
    found = _no_kv(status)
    outcome = ladder.next_step(_observed(status), _spec(), failures=[found])
    assert isinstance(outcome, ladder.Outcome) and outcome.action == "step"
    recorded = outcome.status.to_dict()["remediation"]
    assert recorded["step"] == 1 and recorded["lastFailureKey"] == found.key
    assert recorded["profile"] == {"minUtilization": 0.95}
    (entry,) = recorded["history"]
    assert entry["podUID"] == "uid-pod-a" and entry["flagsBefore"] == status["plan"]["flags"]
    assert entry["flagsAfter"]["gpuMemoryUtilization"] == 0.95
    assert ladder.template_hash(outcome.children) != ladder.template_hash(_observed(status).render(status).children)
    # the Event is a function of the recorded entry alone (a restarted operator posts the very same one)
    assert outcome.events == [ladder.step_event(RemediationEvent.model_validate(entry))]
    assert outcome.events[0].reason == "RemediatedNoKVCacheMemory"


def test_the_recorded_step_is_not_taken_again_and_renders_the_same_pods() -> None:
    status = _planned()
    found = _no_kv(status)
    outcome = ladder.next_step(_observed(status), _spec(), failures=[found])
    assert isinstance(outcome, ladder.Outcome)
    recorded = outcome.status.to_dict()
    assert ladder.next_step(_observed(recorded), _spec(), failures=[found]) is None  # a rebuild writes nothing
    # what a reconcile renders from the recorded status is what the step rolls out: completed, never undone
    rendered = _observed(recorded).render(recorded)
    assert ladder.template_hash(rendered.children) == ladder.template_hash(outcome.children)


def test_steps_never_exceed_max_steps_and_end_in_a_verdict() -> None:
    spec = {**SPEC, "remediation": {"minIntervalSeconds": 0, "maxSteps": 2}}
    status = _planned(spec)
    hashes = [ladder.template_hash(_observed(status, spec).render(status).children)]
    for n in range(1, 4):
        outcome = ladder.next_step(_observed(status, spec), _spec(spec), failures=[_no_kv(status, f"pod-{n}")])
        assert isinstance(outcome, ladder.Outcome)
        status = outcome.status.to_dict()
        if n <= 2:
            assert outcome.action == "step"
            hashes.append(ladder.template_hash(outcome.children))
        else:
            assert outcome.action == "verdict" and outcome.children is None
            assert status["remediation"]["exhausted"] is True
    assert status["remediation"]["step"] == 2 and len(status["remediation"]["history"]) == 2
    assert len(set(hashes)) == 3  # each step a new template, none repeated: the profile never moved back


def test_a_step_inside_the_minimum_interval_is_deferred_to_its_due_time() -> None:
    spec = {**SPEC, "remediation": {"minIntervalSeconds": 300}}
    status = _planned(spec)
    first = ladder.next_step(_observed(status, spec), _spec(spec), failures=[_no_kv(status, "pod-1")])
    assert isinstance(first, ladder.Outcome)
    later = NOW + timedelta(seconds=60)
    recorded = first.status.to_dict()
    deferred = ladder.next_step(_observed(recorded, spec, later), _spec(spec), failures=[_no_kv(recorded, "pod-2")])
    assert isinstance(deferred, ladder.Deferred) and deferred.retry_at == NOW + timedelta(seconds=300)


@pytest.mark.parametrize("lowers", [True, False])
def test_a_metric_driven_change_is_a_ladder_step(lowers: bool) -> None:
    status = _planned()
    seqs = status["plan"]["flags"]["maxNumSeqs"]
    change = ladder.ProfileChange(failure_class="SustainedPreemption",
                                  changes={"max_num_seqs": seqs // 2 if lowers else seqs * 2},
                                  message="preempting", lowers="max_num_seqs")
    outcome = ladder.next_step(_observed(status), _spec(), change=change)
    if not lowers:
        assert outcome is None  # a change that would not lower max-num-seqs is not taken
        return
    assert isinstance(outcome, ladder.Outcome) and outcome.action == "step"
    recorded = outcome.status.to_dict()["remediation"]
    assert recorded["step"] == 1 and recorded["profile"] == {"maxNumSeqs": seqs // 2}
    assert outcome.events[0].reason == "MaxNumSeqsLowered"


def test_pod_failures_come_before_a_step_up() -> None:
    spec = {**SPEC, "remediation": {"minIntervalSeconds": 0, "allowStepUp": True, "stableWindowSeconds": 60}}
    status = _planned(spec)
    stepped = ladder.next_step(_observed(status, spec), _spec(spec), failures=[_no_kv(status)])
    assert isinstance(stepped, ladder.Outcome)
    recorded = stepped.status.to_dict()
    recorded["conditions"] = [c for c in recorded.get("conditions", []) if c["type"] != "Ready"] + [
        {"type": "Ready", "status": "True", "reason": "Available", "message": "",
         "lastTransitionTime": NOW.strftime("%Y-%m-%dT%H:%M:%SZ")}]
    later = NOW + timedelta(minutes=5)
    up = ladder.next_step(_observed(recorded, spec, later), _spec(spec), step_up=True)
    assert isinstance(up, ladder.Outcome) and up.action == "step_up"
    assert up.status.to_dict()["remediation"]["profile"] == {} and up.entry is not None
    again = ladder.next_step(_observed(recorded, spec, later), _spec(spec), step_up=True,
                             failures=[_no_kv(recorded, "pod-b")])
    assert isinstance(again, ladder.Outcome) and again.action == "step"


def test_a_pod_of_a_template_a_recorded_step_replaced_is_not_answered_again() -> None:
    status = _planned()
    old_template = ladder.template_hash(_observed(status).render(status).children)
    first = ladder.next_step(_observed(status), _spec(), failures=[_no_kv(status, "pod-a")])
    assert isinstance(first, ladder.Outcome)
    recorded = first.status.to_dict()  # recorded, maybe not rolled out yet: another pod of the old template dies
    late = replace(_no_kv(recorded, "pod-b"), template=old_template)
    assert ladder.next_step(_observed(recorded), _spec(), failures=[late]) is None
    current = replace(_no_kv(recorded, "pod-c"), template=ladder.template_hash(first.children))
    second = ladder.next_step(_observed(recorded), _spec(), failures=[current])
    assert isinstance(second, ladder.Outcome) and second.action == "step"


# --- what a profile was learned on (issue 21) -------------------------------------------------------------------

BASE_SPEC: dict[str, Any] = {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "image": "vllm/vllm-openai:v0.26.0"}


def _inputs(**changes: Any) -> str | None:
    return ladder.spec_inputs_hash({**BASE_SPEC, **changes}, "vllm/vllm-openai:v0.26.0")


@pytest.mark.parametrize("neutral", [
    {"replicas": 7}, {"maxReplicas": 9}, {"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]},
    {"autoscaling": {"maxReplicas": 4}}, {"routing": {"inferencePool": {"enabled": True}}},
    {"service": {"port": 9000}}, {"prometheus": {"enabled": True}}, {"remediation": {"maxSteps": 2}},
    {"resources": {"cpu": "8"}}, {"nodeSelector": {"pool": "a"}}, {"imagePullPolicy": "Always"},
    # a field written out at its default — what a newer CRD's defaulting (an operator upgrade) does
    {"gpu": {"maxNodes": 1}}, {"flags": {}}, {"workload": {}}, {"extraArgs": []},
], ids=lambda d: next(iter(d)))
def test_plan_neutral_fields_keep_the_inputs_hash(neutral: dict[str, Any]) -> None:
    assert _inputs(**neutral) == _inputs()


@pytest.mark.parametrize("change", [
    {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}}, {"gpu": {"count": 2}}, {"gpu": {"maxNodes": 2}},
    {"image": "vllm/vllm-openai:v0.27.0"}, {"vllmVersion": "0.25.0"}, {"flags": {"maxModelLen": 8192}},
    {"extraArgs": ["--seed", "1"]}, {"workload": {"concurrency": 4}}, {"lora": {"maxLoras": 2}},
    {"env": [{"name": "VLLM_PP_LAYER_PARTITION", "value": "40,40"}]},
], ids=lambda d: next(iter(d)))
def test_plan_inputs_change_the_hash(change: dict[str, Any]) -> None:
    assert _inputs(**change) != _inputs()


def test_the_default_image_counts_when_the_spec_names_none() -> None:
    spec = {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}}
    parsed = parse_spec(spec)
    assert ladder.spec_inputs_hash(spec, "unused") == ladder.plan_inputs_hash(parsed, parsed.image)
    assert ladder.spec_inputs_hash({"model": {}}, "x") is None  # invalid: nothing to learn or reset


def test_the_ladder_is_reset_only_when_the_inputs_change_and_only_once() -> None:
    learned = ladder.RemediationStatus.model_validate({
        "step": 2, "profile": {"maxModelLen": 16384}, "exhausted": True, "inputsHash": "a",
        "history": [{"step": 1, "time": "2025-01-01T00:00:00Z", "failureClass": "KVCacheTooSmall"}],
        "lastFailureKey": "uid/1", "handledKeys": ["uid/2"]})
    assert ladder.for_inputs(learned, "a") is None            # the same inputs: nothing changes
    assert ladder.for_inputs(learned, None) is None           # an invalid spec: nothing changes
    change = ladder.for_inputs(learned, "b")
    assert change is not None and change.reset and "max_model_len=16384" in change.message
    after = change.remediation
    assert (after.step, after.profile, after.exhausted, after.inputs_hash) == (0, {}, False, "b")
    assert (after.history, after.last_failure_key, after.handled_keys) == (learned.history, "uid/1", ["uid/2"])
    assert ladder.for_inputs(after, "b") is None              # a retry of the same change: nothing left to reset
    # written before hashes were kept (an operator upgrade): adopted, the profile kept
    old = learned.model_copy(update={"inputs_hash": None})
    adopted = ladder.for_inputs(old, "b")
    assert adopted is not None and not adopted.reset
    assert adopted.remediation == old.model_copy(update={"inputs_hash": "b"})
    # nothing learned: the new hash is recorded, nothing is reset
    fresh = ladder.for_inputs(ladder.RemediationStatus(inputs_hash="a"), "b")
    assert fresh is not None and not fresh.reset and fresh.remediation.inputs_hash == "b"
