"""Flag maps in status are spelled in camelCase in the API and keyed by vLLM's snake_case names in Python."""

from __future__ import annotations

from importlib import resources

import yaml

from vllm_operator.api.conditions import status_patch
from vllm_operator.api.v1alpha1 import (
    PinnedFlags,
    PlanStatus,
    RemediationEvent,
    RemediationStatus,
    VLLMServiceStatus,
    flag_key,
    flag_name,
    flags_from_api,
)
from vllm_operator.planner import Constraints


def known_names() -> set[str]:
    catalog = yaml.safe_load(resources.files("vllm_operator.catalog").joinpath("vllm_flags.yaml").read_text())
    return {*catalog["flags"], *PinnedFlags.model_fields, *Constraints.model_fields, "replicas",
            "recommended_replicas"}


def test_every_known_flag_name_round_trips_and_matches_spec_flags() -> None:
    for name in known_names():
        key = flag_key(name)
        assert "_" not in key and key[0].islower(), key
        assert flag_name(key) == name and flag_name(name) == name and flag_key(key) == key
    for name, field in PinnedFlags.model_fields.items():
        assert flag_key(name) == field.alias, name  # status.plan.flags.X is spec.flags.X


def test_models_write_camel_case_keys_and_read_both_spellings() -> None:
    plan = PlanStatus.model_validate({"fits": True, "flags": {"maxModelLen": 4096, "tensor_parallel_size": 2}})
    assert plan.flags == {"max_model_len": 4096, "tensor_parallel_size": 2}  # Python: vLLM's names
    assert plan.to_dict()["flags"] == {"maxModelLen": 4096, "tensorParallelSize": 2}
    entry = RemediationEvent(step=1, time="2026-01-01T00:00:00Z", failure_class="KVCacheTooSmall",
                             flags_before={"max_model_len": 8192}, flags_after={"max_model_len": 4096},
                             profile_before={"gpu_free_gib": 20.5})
    dumped = RemediationStatus(profile={"max_model_len": 4096}, history=[entry]).to_dict()
    assert dumped["profile"] == {"maxModelLen": 4096}
    assert dumped["history"][0]["flagsBefore"] == {"maxModelLen": 8192}
    assert dumped["history"][0]["profileBefore"] == {"gpuFreeGib": 20.5}
    assert RemediationStatus.model_validate(dumped).history[0].profile_before == {"gpu_free_gib": 20.5}
    assert flags_from_api({"maxNumSeqs": 8, "enforce_eager": True}) == {"max_num_seqs": 8, "enforce_eager": True}
    assert flags_from_api(None) is None


def test_a_status_an_older_operator_wrote_in_snake_case_is_respelled() -> None:
    old = {"plan": {"fits": True, "flags": {"max_model_len": 4096}},
           "remediation": {"step": 1, "profile": {"max_model_len": 4096},
                           "history": [{"step": 1, "time": "2026-01-01T00:00:00Z", "failureClass": "X",
                                        "flagsAfter": {"max_model_len": 4096}}]}}
    new = VLLMServiceStatus.model_validate(old)
    patch = status_patch(old, new)
    assert patch["plan"]["flags"] == {"max_model_len": None, "maxModelLen": 4096}
    assert patch["remediation"]["profile"] == {"max_model_len": None, "maxModelLen": 4096}
    assert patch["remediation"]["history"][0]["flagsAfter"] == {"maxModelLen": 4096}
    # once stored camelCase, nothing is written again
    stored = new.to_dict()
    assert status_patch(stored, VLLMServiceStatus.model_validate(stored)) == {}
