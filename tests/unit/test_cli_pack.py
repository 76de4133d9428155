"""`vllm-operator plan --pack`: per-model workloads, the memory picture per member, exit codes."""

from __future__ import annotations

import json

import pytest

from vllm_operator import cli
from vllm_operator.cli_pack import PackUsageError, split_model


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_split_model_reads_settings_after_the_last_colon() -> None:
    assert split_model("Qwen/Qwen2.5-1.5B-Instruct") == ("Qwen/Qwen2.5-1.5B-Instruct", {})
    assert split_model("a/b:context=8192,concurrency=4") == ("a/b", {"context": "8192", "concurrency": "4"})
    assert split_model("./dir:with:colons") == ("./dir:with:colons", {})
    with pytest.raises(PackUsageError, match="unknown setting"):
        split_model("a/b:size=3")
    with pytest.raises(PackUsageError, match="twice"):
        split_model("a/b:context=1,context=2")


def test_three_small_models_fit_one_gpu_with_flags_each(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "plan", "--pack", "--gpu", "L40S", "--model", "Qwen/Qwen2.5-0.5B-Instruct",
                        "--model", "Qwen/Qwen2.5-1.5B-Instruct:context=16384,concurrency=8,name=team-b",
                        "--model", "meta-llama/Llama-3.2-1B-Instruct:memory=6", "-o", "json")
    doc = json.loads(out)
    assert code == 0 and doc["fits"] and doc["gpus_used"] == 1 and doc["gpus_one_per_service"] == 3
    members = {m["name"]: m for m in doc["gpus"][0]["members"]}
    assert set(members) == {"qwen2-5-0-5b-instruct", "team-b", "llama-3-2-1b-instruct"}
    assert members["llama-3-2-1b-instruct"]["fixed"]
    for m in members.values():
        assert "--gpu-memory-utilization" in m["args"] and m["footprint_gib"] > m["budget_gib"]
    code, text, _ = _run(capsys, "plan", "--pack", "--gpu", "L40S", "--model", "Qwen/Qwen2.5-0.5B-Instruct",
                         "--model", "Qwen/Qwen2.5-1.5B-Instruct")
    assert code == 0 and text.startswith("FITS: 2 models on one L40S") and "outside =" in text


def test_a_capped_pool_says_who_is_left_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "plan", "--pack", "--gpu", "L40S", "--gpus", "1",
                        "--model", "meta-llama/Llama-3.1-8B-Instruct", "--model", "meta-llama/Llama-3.1-8B-Instruct",
                        "--model", "meta-llama/Llama-3.1-8B-Instruct")
    assert code == 1 and "DOES NOT FIT: llama-3-1-8b-instruct-3" in out


def test_bad_settings_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "plan", "--pack", "--gpu", "L40S", "--model", "Qwen/Qwen2.5-0.5B-Instruct:context=0")
    assert code == 2 and "must be above 0" in err
    code, _, err = _run(capsys, "plan", "--pack", "--gpu", "L40S", "--model", "Qwen/Qwen2.5-0.5B-Instruct:name=x",
                        "--model", "Qwen/Qwen2.5-1.5B-Instruct:name=x")
    assert code == 2 and "used twice" in err
