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
