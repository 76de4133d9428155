"""The accuracy benchmark asks each record's question as `vllm-operator check` does (issue 16): the same request,
hence the same prediction, as the CLI printing it for the record's pasted command line."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from vllm_operator import cli
from vllm_operator.cli import main
from vllm_operator.planner import plan

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data"


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("planner_accuracy", ROOT / "benchmarks" / "planner_accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _benchmark()
RECORDS: list[dict[str, Any]] = [json.loads(line) for line in
                                 (DATA / "vllm-startup-logs.jsonl").read_text().splitlines() if line]
# a spread of records: plain GQA, a hidden neighbour (free memory), online quantization, pipeline parallelism
PICKED = [r for r in RECORDS if BENCH.logged_tokens(r)][:: 6]


@pytest.mark.parametrize("record", PICKED, ids=lambda r: str(r.get("model_id")))
def test_benchmark_prediction_is_what_check_prints(record: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    request = BENCH.request_for(record, DATA)
    name, count = BENCH.gpu_name(record)
    argv = ["check", "--gpu", BENCH._catalog_query(name), "--gpu-count", str(max(count, 1)),
            "--vllm-version", request.vllm_version or "", "-o", "json"]
    match = BENCH._FREE_RE.search(record.get("error") or "")
    if match:
        argv += ["--gpu-free-gib", match.group(1)]
    code = main([*argv, "--", *BENCH.command_for(record, DATA)])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    doc = json.loads(out)
    assert doc["kv_cache_tokens"] == plan(request).prediction.kv_cache_tokens


def test_the_command_carries_only_what_the_record_gave() -> None:
    record = next(r for r in RECORDS if r.get("gpu_memory_utilization") and not r.get("max_num_seqs"))
    words = BENCH.command_for(record, DATA)
    assert words[:2] == ["vllm", "serve"] and Path(words[2]).is_dir()
    assert "--gpu-memory-utilization" in words and "--max-num-seqs" not in words
    assert all(re.fullmatch(r"--[a-z-]+", w) for w in words if w.startswith("-"))


def test_every_flag_check_understands_is_carried_from_a_record() -> None:
    # the check parser's memory flags, less the ones command_for spells by hand (value-dependent: the KV dtype only
    # when not auto, the dtype only float32, online quantization only of a 16-bit checkpoint) and those no record
    # can show (a speculative config, a revision, LoRA adapters' paths)
    known = {option.lstrip("-").replace("-", "_") for action in cli._check_parser()._actions
             for option in action.option_strings if option.startswith("--") and not option.startswith("--no-")}
    by_hand = {"kv_cache_dtype", "dtype", "quantization", "speculative_config", "revision", "lora_modules"}
    assert known - by_hand == set(BENCH.VALUE_FLAGS) | set(BENCH.SWITCHES) | set(BENCH.ON_OFF)


def test_a_record_with_every_flag_pins_every_flag() -> None:
    record = {**next(r for r in RECORDS if r["model_id"] == "mistralai/Mixtral-8x7B-Instruct-v0.1"
                     or r["model_id"].startswith("Qwen/Qwen1.5-MoE")),
              "gpu": "8x NVIDIA H100 80GB", "tensor_parallel_size": 2, "pipeline_parallel_size": 1,
              "data_parallel_size": 4, "enable_expert_parallel": True, "max_num_seqs": 64, "block_size": 32,
              "cpu_offload_gb": 0, "enforce_eager": True, "enable_prefix_caching": False,
              "enable_chunked_prefill": True}
    words = BENCH.command_for(record, DATA)
    assert "--data-parallel-size" in words and "--enable-expert-parallel" in words
    assert "--no-enable-prefix-caching" in words and "--enable-chunked-prefill" in words
    pinned = BENCH.request_for(record, DATA).pinned
    assert (pinned.tensor_parallel_size, pinned.data_parallel_size, pinned.enable_expert_parallel) == (2, 4, True)
    assert (pinned.max_num_seqs, pinned.block_size, pinned.cpu_offload_gb) == (64, 32, 0)
    assert (pinned.enforce_eager, pinned.enable_prefix_caching, pinned.enable_chunked_prefill) == (True, False, True)


def test_the_logged_expert_parallel_start_is_asked_with_the_flag() -> None:
    record = next(r for r in RECORDS if r.get("enable_expert_parallel"))
    assert "--enable-expert-parallel" in BENCH.command_for(record, DATA)
    assert BENCH.request_for(record, DATA).pinned.enable_expert_parallel is True


def test_the_2026_set_is_checked_in_and_its_excluded_records_are_never_scored(tmp_path: Path) -> None:
    records = BENCH.load_records(DATA)
    sets = {r["_set"] for r in records}
    assert sets == {"public", "2026"}
    new = [r for r in records if r["_set"] == "2026"]
    assert any(r.get("exclude") for r in new) and any(not r.get("exclude") and BENCH.logged_tokens(r) for r in new)
    for record in new:  # every scored record's model files are in the checkout
        if not record.get("exclude"):
            assert (BENCH.model_folder(DATA, record) / "config.json").is_file(), record["model_id"]
    out = tmp_path / "rows.json"
    BENCH.main(["--json", str(out)])
    rows = json.loads(out.read_text())
    scored = {(row["set"], row["i"]) for row in rows}
    excluded = {("2026", r["_line"]) for r in new if r.get("exclude")}
    assert scored and not scored & excluded


def test_a_block_size_vllm_derived_is_not_pinned() -> None:
    record = next(r for r in BENCH.load_records(DATA) if r.get("block_size") not in (None, *BENCH.BLOCK_SIZES))
    assert "--block-size" not in BENCH.command_for(record, DATA)


def test_a_wsl2_gpu_is_asked_as_its_own_catalog_row() -> None:
    assert BENCH._catalog_query("NVIDIA GeForce RTX 4090 24GB (WSL2)") == "4090-wsl2"
    assert BENCH._catalog_query("NVIDIA GeForce RTX 4090 24GB") == "4090"


def _rows(set_name: str, errors: list[float]) -> list[dict[str, Any]]:
    return [{"set": set_name, "error": e} for e in errors]


def test_the_2026_targets_bound_the_median_the_share_within_10_percent_and_the_low_side() -> None:
    good = [0.01, -0.02, 0.0, 0.03, -0.01, 0.02, 0.09, -0.05, 0.01, 0.0]
    assert BENCH.targets_met(_rows("2026", good))
    assert not BENCH.targets_met(_rows("2026", [*good[:-1], -0.11]))            # one record 11% low
    assert not BENCH.targets_met(_rows("2026", [0.04] * 10))                     # median above 3%
    assert not BENCH.targets_met(_rows("2026", [*good[:8], 0.2, 0.3]))           # 80% within 10%
    assert BENCH.targets_met(_rows("public", [0.0005] * 9 + [-0.5]))             # no low-side bound on the old set
    assert not BENCH.targets_met(_rows("public", [0.002] * 10))                  # but its median stays <= 0.1%
