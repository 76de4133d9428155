"""The opt-in step back (spec.remediation.allowStepUp): when, and to which profile (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from vllm_operator.api.v1alpha1 import parse_spec
from vllm_operator.remediation.ladder import STEP_UP, step_up_target

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _t(minutes_ago: float) -> str:
    return (NOW - timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec(allow: bool = True, window: int = 3600) -> Any:
    return parse_spec({"model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
                       "remediation": {"allowStepUp": allow, "stableWindowSeconds": window}})


def _status(*, ready: bool = True, ready_since: float = 120, history: list[dict[str, Any]] | None = None,
            profile: dict[str, Any] | None = None) -> dict[str, Any]:
    steps = history if history is not None else [
        {"step": 1, "time": _t(200), "failureClass": "KVCacheTooSmall", "profileBefore": {},
         "message": "max-model-len 32768 → 19456"},
        {"step": 2, "time": _t(150), "failureClass": "CUDAOOMServing", "profileBefore": {"max_model_len": 19456},
         "message": "max-num-seqs 37 → 18"},
    ]
    return {
        "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "Available",
                        "message": "", "lastTransitionTime": _t(ready_since)}],
        "remediation": {"step": len(steps), "profile": profile if profile is not None else
                        {"max_model_len": 19456, "max_num_seqs": 18}, "history": steps},
    }


def test_steps_back_one_step_after_the_stable_window() -> None:
    target = step_up_target(_spec(), _status(), NOW)
    assert target is not None
    profile, undone = target
    assert profile == {"max_model_len": 19456}  # what the last step's profile was before it
    assert undone.failure_class == "CUDAOOMServing"


def test_not_without_the_opt_in() -> None:
    assert step_up_target(_spec(allow=False), _status(), NOW) is None


def test_not_while_not_ready_or_inside_the_window() -> None:
    assert step_up_target(_spec(), _status(ready=False), NOW) is None
    assert step_up_target(_spec(), _status(ready_since=30), NOW) is None  # ready for 30 min < 60 min


def test_a_profile_already_restored_once_is_not_retried() -> None:
    history = _status()["remediation"]["history"] + [
        {"step": 1, "time": _t(140), "failureClass": STEP_UP, "profileBefore": {"max_model_len": 19456},
         "message": "stepped back"},
        {"step": 2, "time": _t(130), "failureClass": "CUDAOOMServing", "profileBefore": {"max_model_len": 19456},
         "message": "max-num-seqs 37 → 18 again"},
    ]
    assert step_up_target(_spec(), _status(history=history), NOW) is None


def test_nothing_to_step_back_from() -> None:
    assert step_up_target(_spec(), _status(history=[], profile={}), NOW) is None
