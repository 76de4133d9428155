"""The `vllm-operator plan` command: outputs, exit codes, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_operator.cli import main
from vllm_operator.planner.versions import NEWEST_KNOWN_VERSION

MEMORY_KEYS = {"gpu_total_gib", "requested_gib", "weights_gib", "activation_gib", "non_torch_gib", "cudagraph_gib",
               "kv_cache_gib"}


@pytest.fixture(autouse=True)
def _offline(offline_hub: list[Any]) -> list[Any]:
    """Every CLI test runs offline with an empty hub cache; catalog models need no network."""
    return offline_hub


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse errors exit from inside main()
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run(capsys, "plan", *argv, "-o", "json")
    assert code in (0, 1), err
    return code, json.loads(out)


def assert_one_line_error(code: int, out: str, err: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("vllm-operator")
    assert "error" in lines[0]
    assert "Traceback" not in err
    assert out == ""


# --- outputs ------------------------------------------------------------------------------------------------


def test_json_output_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100")
    assert code == 0
    assert doc["fits"] is True
    assert doc["failure"] is None
    assert doc["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert set(doc["flags"]) >= {"tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "max_num_seqs"}
    assert all(name == name.lower() and "-" not in name for name in doc["flags"])
    assert set(doc["memory"]) >= MEMORY_KEYS
    assert all(isinstance(doc["memory"][k], (int, float)) for k in MEMORY_KEYS)
    assert isinstance(doc["kv_cache_tokens"], int) and doc["kv_cache_tokens"] > 0
    assert isinstance(doc["max_concurrency"], (int, float)) and doc["max_concurrency"] > 0
    assert isinstance(doc["reasons"], list) and doc["reasons"]
    assert doc["pinned"] == []
    assert doc["args"][:2] == ["--tensor-parallel-size", "1"]


def test_json_failure_object_when_it_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-70b", "--gpu", "4090")
    assert code == 1
    assert doc["fits"] is False
    assert set(doc["failure"]) == {"kind", "message"}
    assert doc["failure"]["kind"] == "WeightsDoNotFit"
    assert doc["options"] and all(o["kv_cache_tokens"] > 0 for o in doc["options"])


def test_yaml_output_parses_to_the_same_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--model", "qwen2.5-7b", "--gpu", "l4", "-o", "yaml")
    assert code == 0
    doc = yaml.safe_load(out)
    _, as_json = plan_json(capsys, "--model", "qwen2.5-7b", "--gpu", "l4")
    assert doc == as_json


def test_text_output_has_the_bar_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "--model", "llama-3.1-8b", "--gpu", "h100")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("FITS: meta-llama/Llama-3.1-8B-Instruct on 1× H100-SXM-80GB")
    bars = [line for line in lines if line.startswith("  [") and line.endswith("]")]
    assert len(bars) == 1 and len(bars[0].strip()) == 62
    assert "Why:" in lines
    assert any(line.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 1") for line in lines)


def test_exit_1_and_options_when_it_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "--model", "llama-3.1-70b", "--gpu", "4090")
    assert code == 1
    assert err == ""
    assert out.startswith("DOES NOT FIT")
    assert "Options that would fit (GPUs from the GPU catalog):" in out


def test_pinned_flags_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "8192",
                          "--gpu-memory-utilization", "0.85", "--enforce-eager", "--kv-cache-dtype", "fp8")
    assert code == 0
    assert set(doc["pinned"]) == {"max_model_len", "gpu_memory_utilization", "enforce_eager", "kv_cache_dtype"}
    assert doc["flags"]["max_model_len"] == 8192
    assert doc["flags"]["gpu_memory_utilization"] == 0.85
    assert doc["flags"]["enforce_eager"] is True
    assert doc["flags"]["kv_cache_dtype"] == "fp8"
    assert "--enforce-eager" in doc["args"]


def test_pinned_tp_widens_the_gpu_count(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-70b", "--gpu", "h100", "-tp", "4")
    assert code == 0
    assert doc["flags"]["tensor_parallel_size"] == 4
    assert doc["gpu_count"] == 4
    assert "tensor_parallel_size" in doc["pinned"]


def test_gpu_count_lets_the_planner_use_tensor_parallelism(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-70b", "--gpu", "h100", "--gpu-count", "8",
                          "--vllm-version", "0.26.0")
    assert code == 0
    assert doc["flags"]["tensor_parallel_size"] == 2  # 131 GiB of weights: 65.8 GiB per GPU at TP=2


def test_gpu_accepts_a_gfd_label(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "NVIDIA-H100-80GB-HBM3")
    assert code == 0
    assert doc["gpu"] == "H100-SXM-80GB"
    assert doc["memory"]["gpu_total_gib"] == 79.19


def test_gpu_accepts_a_bare_size(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "24GB")
    assert code == 0
    assert 23 < doc["memory"]["gpu_total_gib"] < 24
    assert doc["flags"]["max_model_len"] < 131072


@pytest.mark.parametrize(("text", "tokens"), [("32k", 32000), ("32K", 32768), ("8192", 8192), ("1k", 1000)])
def test_max_model_len_human_readable(capsys: pytest.CaptureFixture[str], text: str, tokens: int) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", text)
    assert code == 0
    assert doc["flags"]["max_model_len"] == tokens


def test_image_tag_gives_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    _, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--image", "vllm/vllm-openai:v0.11.0")
    assert doc["vllm_version"] == "0.11.0"


def test_vllm_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    _, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--vllm-version", "v0.8.5.post1")
    assert doc["vllm_version"] == "0.8.5"


def test_workload_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--context-length", "8k",
                          "--concurrency", "32")
    assert code == 0
    assert doc["kv_cache_tokens"] >= 32 * 8000
    assert doc["flags"]["max_model_len"] >= 8000


def test_local_model_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from vllm_operator.sources import load_model_files

    files = load_model_files("qwen2.5-7b", offline=True)
    model = tmp_path / "Qwen__Qwen2.5-7B-Instruct"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(files.config))
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": files.total_size}}))
    _, from_dir = plan_json(capsys, "--model", str(model), "--gpu", "l4")
    _, from_catalog = plan_json(capsys, "--model", "qwen2.5-7b", "--gpu", "l4")
    assert from_dir["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert from_dir["flags"] == from_catalog["flags"]
    assert from_dir["kv_cache_tokens"] == from_catalog["kv_cache_tokens"]


# --- bad input: one line on stderr, exit 2 ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpu", "no-such-gpu-9000"],
        ["--gpu", "h100", "--tensor-parallel-size", "two"],
        ["--gpu", "h100", "-tp", "0"],
        ["--gpu", "h100", "--gpu-memory-utilization", "0"],
        ["--gpu", "h100", "--gpu-memory-utilization", "1.5"],
        ["--gpu", "h100", "--gpu-memory-utilization", "lots"],
        ["--gpu", "h100", "--max-model-len", "long"],
        ["--gpu", "h100", "--max-model-len", "0"],
        ["--gpu", "h100", "--vllm-version", "banana"],
        ["--gpu", "h100", "--gpu-free-gib", "100"],
        ["--gpu", "h100", "--gpu-free-gib", "-1"],
        ["--gpu", "h100", "--kv-cache-dtype", "int3"],
        ["--gpu", "h100", "-o", "xml"],
    ],
    ids=lambda argv: " ".join(argv[2:]) or argv[1],
)
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert_one_line_error(*run(capsys, "plan", "--model", "llama-3.1-8b", *argv))


def test_unknown_gpu_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "--model", "llama-3.1-8b", "--gpu", "no-such-gpu-9000")
    assert_one_line_error(code, out, err)
    assert "no-such-gpu-9000" in err


@pytest.mark.parametrize("image", ["vllm/vllm-openai:latest", "vllm/vllm-openai", "registry.local/vllm:prod",
                                   "vllm/vllm-openai@sha256:" + "ab" * 32])
def test_image_without_version_plans_for_the_newest_and_says_so(capsys: pytest.CaptureFixture[str],
                                                                image: str) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--image", image)
    assert code == 0
    assert doc["vllm_version"] == NEWEST_KNOWN_VERSION
    assert any(r.startswith(f"vLLM {NEWEST_KNOWN_VERSION} assumed") and "--vllm-version" in r
               for r in doc["reasons"])


def test_vllm_version_names_the_release_of_a_digest_image(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--image",
                          "vllm/vllm-openai@sha256:" + "ab" * 32, "--vllm-version", "0.10.1")
    assert code == 0
    assert doc["vllm_version"] == "0.10.1"
    assert not any("assumed" in r for r in doc["reasons"])


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": -3,
          "vocab_size": 32000}, "num_attention_heads"),
        ({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
          "num_key_value_heads": 5, "vocab_size": 32000}, "num_attention_heads"),
        ({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32}, "num_hidden_layers"),
        ([1, 2, 3], "JSON object"),
        ("{not json", "not valid JSON"),
    ],
    ids=["negative-heads", "heads-not-divisible", "no-layers", "not-an-object", "not-json"],
)
def test_malformed_config_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path, content: Any,
                                    expected: str) -> None:
    model = tmp_path / "broken-model"
    model.mkdir()
    (model / "config.json").write_text(content if isinstance(content, str) else json.dumps(content))
    code, out, err = run(capsys, "plan", "--model", str(model), "--gpu", "h100")
    assert_one_line_error(code, out, err)
    assert expected in err


def test_local_config_gets_the_operators_architecture_bounds(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    """A local config.json is bounded as a spec's is: 100,000 layers is refused before any arithmetic on them."""
    from vllm_operator.planner.arch import ARCH_BOUNDS

    layers = 100_000
    assert layers > ARCH_BOUNDS["num_hidden_layers"]
    model = tmp_path / "huge-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": layers,
        "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000}))
    code, out, err = run(capsys, "plan", "--model", str(model), "--gpu", "h100")
    assert_one_line_error(code, out, err)
    assert "num_hidden_layers" in err and str(layers) in err and "outside" in err


def test_missing_path_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert_one_line_error(*run(capsys, "plan", "--model", str(tmp_path / "nope"), "--gpu", "h100"))


def test_unknown_model_offline_fails_without_network(capsys: pytest.CaptureFixture[str],
                                                     offline_hub: list[Any]) -> None:
    code, out, err = run(capsys, "plan", "--model", "no-such-org/no-such-model-xyz", "--gpu", "h100")
    assert_one_line_error(code, out, err)
    assert "no-such-org/no-such-model-xyz" in err
    assert "HF_HUB_OFFLINE" in err
    assert offline_hub == [], f"tried the network: {offline_hub}"


def test_missing_required_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(*run(capsys, "plan", "--model", "llama-3.1-8b"))


# --- the installed console script ---------------------------------------------------------------------------


def test_console_script_prints_json(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("vllm-operator")
    exe = str(script) if script.exists() else shutil.which("vllm-operator")
    assert exe is not None, "the vllm-operator console script is not installed (pip install -e .)"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([exe, "plan", "--model", "llama-3.1-8b", "--gpu", "h100", "-o", "json"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["fits"] is True
    assert doc["flags"]["tensor_parallel_size"] == 1
    assert set(doc["memory"]) >= MEMORY_KEYS

    bad = subprocess.run([exe, "plan", "--model", "llama-3.1-8b", "--gpu", "h100", "-tp", "0"],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.stderr


# --- issue 16: --as-is, check, -o manifest, JSON errors --------------------------------------------------------

def test_as_is_predicts_vllm_defaults_instead_of_choosing(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "l4", "--as-is")
    assert code == 1  # vLLM's default max-model-len (131072) does not fit an L4's KV cache
    from vllm_operator.planner.versions import profile_for

    assert doc["flags"]["max_model_len"] == 131072
    assert doc["flags"]["gpu_memory_utilization"] == profile_for(None).default_utilization  # vLLM's, not ours
    assert doc["failure"]["kind"] == "KVCacheTooSmall"
    assert doc["as_is"].startswith(f"vLLM {NEWEST_KNOWN_VERSION} would fail (KVCacheTooSmall); it would print: "
                                   "ValueError:")
    code, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "l4", "--as-is", "--max-model-len", "8192")
    assert code == 0
    assert doc["flags"]["max_num_seqs"] == 256  # vLLM's default for the API server on this GPU, not a choice
    assert doc["as_is"] == (f"vLLM {NEWEST_KNOWN_VERSION} would start: GPU KV cache size: {doc['kv_cache_tokens']:,} tokens; "
                            f"Maximum concurrency for 8,192 tokens per request: {doc['max_concurrency']:.2f}x")


@pytest.mark.parametrize("command", [
    ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192", "--port", "8000"],
    ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--max_model_len=8192", "--trust-remote-code"],
    ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "meta-llama/Llama-3.1-8B-Instruct",
     "--max-model-len", "8192", "--host", "0.0.0.0"],
])
def test_check_a_pasted_command_line_is_plan_as_is(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    code, out, err = run(capsys, "check", "--gpu", "l4", "-o", "json", "--", *command)
    assert code == 0, err
    checked = json.loads(out)
    _, planned = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "l4", "--as-is", "--max-model-len", "8192")
    assert checked["kv_cache_tokens"] == planned["kv_cache_tokens"]
    assert checked["as_is"] == planned["as_is"]


def test_check_names_unknown_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "check", "--gpu", "l4", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
                         "--max-modle-len", "8192", "--max-cudagraph-capture-size", "64", "--enable-magic")
    assert_one_line_error(code, out, err)
    assert f"--max-modle-len is not a flag of vLLM {NEWEST_KNOWN_VERSION}" in err
    assert "--enable-magic is not a flag" in err
    assert "--max-cudagraph-capture-size" not in err  # a flag of the release (0.11.1+): accepted, not modelled


def test_check_says_which_flags_it_did_not_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "--gpu", "h100", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
                       "--port", "9000", "--served-model-name", "llama")
    assert code == 0
    assert out.startswith("Not modelled (no effect on GPU memory at startup): --port, --served-model-name")
    assert f"vLLM {NEWEST_KNOWN_VERSION} would start: GPU KV cache size:" in out


@pytest.mark.parametrize(("load_format", "starts"), [("auto", False), ("ipc_cache", True)])
def test_check_models_weights_held_by_a_weight_cache_daemon(capsys: pytest.CaptureFixture[str], load_format: str,
                                                            starts: bool) -> None:
    """0.32+ request_memory: `--load-format ipc_cache` takes the daemon's weights out of ceil(total × util), so a GPU
    on which the daemon holds them (63 GiB free) passes the free-memory check a plain load fails."""
    code, out, _ = run(capsys, "check", "--gpu", "h100", "--gpu-free-gib", "63", "--vllm-version", "0.32.0", "--",
                       "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--load-format", load_format,
                       "--gpu-memory-utilization", "0.9")
    assert ("vLLM 0.32.0 would start" in out) is starts
    assert ("Not modelled (no effect on GPU memory at startup): --load-format" in out) is not starts
    if not starts:
        assert "less than desired GPU memory utilization (0.9, 71.27 GiB)" in out


def test_check_needs_a_vllm_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(*run(capsys, "check", "--gpu", "l4", "--", "docker", "run", "vllm"))


def test_manifest_is_a_valid_vllmservice_with_the_plan_pinned(capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_operator.api.v1alpha1 import parse_spec, validate_spec

    code, out, err = run(capsys, "plan", "--model", "qwen2.5-72b-instruct-awq", "--gpu", "l40s", "--gpu-count", "2",
                         "-o", "manifest")
    assert code == 0, err
    manifest = yaml.safe_load(out)
    assert manifest["kind"] == "VLLMService" and manifest["apiVersion"] == "vllm-operator.dev/v1alpha1"
    assert validate_spec(manifest["spec"]) == []
    spec = parse_spec(manifest["spec"])
    _, planned = plan_json(capsys, "--model", "qwen2.5-72b-instruct-awq", "--gpu", "l40s", "--gpu-count", "2")
    # the planner renders `auto` where the model's full context fits (what vLLM's auto-fit keeps, re-fitted at start)
    rendered = {**planned["flags"], "max_model_len": "auto"} if planned["max_model_len_auto"] else planned["flags"]
    assert spec.flags.to_vllm() == rendered
    assert spec.gpu.count == planned["gpu_count"] == 2
    assert spec.image == f"vllm/vllm-openai:v{planned['vllm_version']}"


def test_manifest_of_a_plan_that_does_not_fit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "--model", "llama-3.1-70b", "--gpu", "4090", "-o", "manifest")
    assert code == 1 and out == ""
    assert "does not fit" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [
    ["plan", "--model", "llama-3.1-8b", "--gpu", "no-such-gpu-9000", "-o", "json"],
    ["plan", "--model", "llama-3.1-8b", "--gpu", "l4", "--max-model-len", "long", "-o", "json"],
    ["plan", "--model", "llama-3.1-8b", "--gpu", "MI300X", "--output=json"],
    ["check", "--gpu", "l4", "-o", "json", "--", "vllm", "serve", "x/y", "--bogus"],
])
def test_errors_are_json_on_stderr_with_the_exit_code_for_json_output(capsys: pytest.CaptureFixture[str],
                                                                      argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    error = json.loads(err)["error"]
    assert error["exit_code"] == 2 and error["message"]


# --- issue 14: LoRA from the command line ---------------------------------------------------------------------

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
#: Llama-3.1-8B's adapter slots by hand, from vLLM 0.33's tensor shapes (planner/lora.py's docstring): per slot and
#: layer qkv 3·r·4096 + r·(4096 + 2·1024), o_proj 2·r·4096, gate_up 2·r·4096 + 2·14336·r, down r·14336 + 4096·r;
#: embedding and LM head (128,256 + 4,096)·r each; bf16.
def _llama_8b_slot_bytes(rank: int, slots: int) -> int:
    layer = (3 * rank * 4096 + rank * (4096 + 2 * 1024)) + 2 * rank * 4096 \
        + (2 * rank * 4096 + 2 * 14336 * rank) + (rank * 14336 + 4096 * rank)
    return (32 * layer + 2 * (128256 + 4096) * rank) * slots * 2


def test_lora_flags_say_whether_it_fits_and_what_the_slots_take(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--enable-lora", "--max-loras", "4",
                          "--max-lora-rank", "64")
    assert code == 0
    assert {k: doc["flags"][k] for k in ("enable_lora", "max_loras", "max_lora_rank")} == \
        {"enable_lora": True, "max_loras": 4, "max_lora_rank": 64}
    assert doc["args"][-5:] == ["--enable-lora", "--max-loras", "4", "--max-lora-rank", "64"]
    lora = doc["lora"]
    assert lora["adapter_bytes_per_gpu"] == _llama_8b_slot_bytes(64, 4) == 1_477_705_728
    assert lora["adapter_gib_per_gpu"] == 1.38
    assert lora["kv_cache_tokens"] == doc["kv_cache_tokens"] < lora["kv_cache_tokens_without_lora"]
    assert lora["refused"] is None
    # "without" is the same question with LoRA off and the plan's flags pinned
    pinned = ["--max-model-len", str(doc["flags"]["max_model_len"]), "--max-num-seqs",
              str(doc["flags"]["max_num_seqs"]), "--gpu-memory-utilization",
              str(doc["flags"]["gpu_memory_utilization"]), "-tp", "1"]
    _, bare = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", *pinned)
    assert bare["kv_cache_tokens"] == lora["kv_cache_tokens_without_lora"]
    assert "lora" not in bare and "max_loras" not in bare["flags"]
    code, out, _ = run(capsys, "plan", "--model", "llama-3.1-8b", "--gpu", "h100", "--enable-lora", "--max-loras",
                       "4", "--max-lora-rank", "64")
    assert code == 0
    assert out.rstrip().splitlines()[-1] == (
        f"LoRA: 4 adapter slot(s) at rank 64 take 1.38 GiB per GPU (in the weights above); KV cache with them: "
        f"{lora['kv_cache_tokens']:,} tokens, without LoRA at the same flags: "
        f"{lora['kv_cache_tokens_without_lora']:,} tokens.")


def test_lora_defaults_are_vllms_one_slot_at_rank_16(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--enable-lora")
    assert code == 0
    assert doc["lora"]["max_loras"] == 1 and doc["lora"]["max_lora_rank"] == 16
    assert doc["lora"]["adapter_bytes_per_gpu"] == _llama_8b_slot_bytes(16, 1) == 92_356_608


def test_check_reads_a_pasted_lora_command(capsys: pytest.CaptureFixture[str]) -> None:
    command = ["vllm", "serve", LLAMA_8B, "--max-model-len", "8192", "--enable-lora", "--max-loras", "4",
               "--max-lora-rank", "64", "--lora-modules", "sql=./adapters/sql", '{"name": "b", "path": "/b"}',
               "--port", "8000"]
    code, out, err = run(capsys, "check", "--gpu", "l4", "-o", "json", "--", *command)
    assert code == 0, err
    checked = json.loads(out)
    assert checked["flags"]["max_loras"] == 4 and checked["flags"]["max_lora_rank"] == 64
    assert checked["lora"]["adapter_bytes_per_gpu"] == _llama_8b_slot_bytes(64, 4)
    _, planned = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "l4", "--as-is", "--max-model-len", "8192",
                           "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64")
    assert checked["kv_cache_tokens"] == planned["kv_cache_tokens"] == checked["lora"]["kv_cache_tokens"]
    _, bare = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "l4", "--as-is", "--max-model-len", "8192")
    assert checked["lora"]["kv_cache_tokens_without_lora"] == bare["kv_cache_tokens"] > checked["kv_cache_tokens"]


def test_check_without_enable_lora_ignores_the_lora_flags_as_vllm_does(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "--gpu", "h100", "--", "vllm", "serve", LLAMA_8B, "--max-loras", "4",
                       "--max-lora-rank", "64")
    assert code == 0
    assert out.startswith("Not modelled (no effect on GPU memory at startup): --max-lora-rank, --max-loras\n")
    assert "--enable-lora" not in out and "LoRA:" not in out


def test_a_model_whose_release_refuses_lora_prints_vllms_text_and_does_not_fit(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "openai/gpt-oss-20b", "--gpu", "h100", "--vllm-version", "0.10.2", "--enable-lora"]
    code, out, _ = run(capsys, "plan", *argv)
    assert code == 1
    assert "DOES NOT FIT" in out
    assert "what vLLM would print:\n  ValueError: GptOssForCausalLM does not support LoRA yet.\n" in out
    assert "needs more or larger GPUs" not in out  # no GPU helps: vLLM refuses the command
    code, doc = plan_json(capsys, *argv)
    assert code == 1 and doc["fits"] is False
    assert doc["failure"] == {"kind": "InvalidArgument", "message": "ValueError: GptOssForCausalLM does not support "
                                                                    "LoRA yet."}
    assert doc["lora"]["refused"] == doc["failure"]["message"] and doc["options"] == []
    code, out, err = run(capsys, "check", "--gpu", "h100", "--vllm-version", "0.10.2", "--", "vllm", "serve",
                         "openai/gpt-oss-20b", "--enable-lora")
    assert code == 1 and "ValueError: GptOssForCausalLM does not support LoRA yet." in out
    code, out, err = run(capsys, "plan", *argv, "-o", "manifest")
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    code, doc = plan_json(capsys, "--model", "openai/gpt-oss-20b", "--gpu", "h100", "--vllm-version", "0.33.0",
                          "--enable-lora")
    assert code == 0 and doc["lora"]["refused"] is None  # the class implements SupportsLoRA from 0.11.1


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--enable-lora", "--max-lora-rank", "7"], "--max-lora-rank 7: vLLM 0.33.0 accepts 1, 8, 16"),
    (["--enable-lora", "--max-lora-rank", "512", "--vllm-version", "0.7.3"], "vLLM 0.7.3 accepts 8, 16, 32, 64, 128, 256"),
    (["--enable-lora", "--max-lora-rank", "sixteen"], "expected a whole number"),
    (["--enable-lora", "--max-loras", "0"], "must be at least 1"),
    (["--enable-lora", "--max-loras", "257"], "at most 256"),
    (["--enable-lora", "--lora-modules", "sql"], "expected name=path"),
    (["--enable-lora", "--lora-modules", "{bad json"], "not valid JSON"),
    (["--enable-lora", "--lora-modules", '{"name": "a"}'], 'needs "name" and "path"'),
    (["--enable-lora", "--lora-modules", "sql=./relative"], "an absolute path"),
    (["--max-loras", "4"], "--max-loras: no effect without --enable-lora"),
    (["--max-lora-rank", "64", "--lora-modules", "a=org/a"], "--max-lora-rank, --lora-modules: no effect"),
])
def test_bad_lora_values_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                 fragment: str) -> None:
    code, out, err = run(capsys, "plan", "--model", "llama-3.1-8b", "--gpu", "l4", *argv)
    assert_one_line_error(code, out, err)
    assert fragment in err


def test_check_refuses_a_rank_the_release_does_not_accept(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "check", "--gpu", "l4", "--vllm-version", "0.11.0", "--", "vllm", "serve", LLAMA_8B,
                         "--enable-lora", "--max-lora-rank", "1")
    assert_one_line_error(code, out, err)
    assert "--max-lora-rank 1: vLLM 0.11.0 accepts 8, 16, 32, 64, 128, 256, 320, 512" in err


def test_lora_manifest_is_spec_lora(capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_operator.api.v1alpha1 import parse_spec, validate_spec

    code, out, err = run(capsys, "plan", "--model", "llama-3.1-8b", "--gpu", "l4", "--enable-lora", "--max-loras",
                         "2", "--max-lora-rank", "64", "--lora-modules", "sql=my-org/sql-lora", "b=/adapters/b",
                         "-o", "manifest")
    assert code == 0, err
    spec = yaml.safe_load(out)["spec"]
    assert validate_spec(spec) == []
    assert spec["lora"] == {"adapters": [{"name": "sql", "source": "my-org/sql-lora"},
                                         {"name": "b", "source": "/adapters/b"}], "maxRank": 64, "maxLoras": 2}
    assert not {"enableLora", "maxLoraRank"} & set(spec["flags"])
    assert parse_spec(spec).lora is not None
    code, out, _ = run(capsys, "plan", "--model", "llama-3.1-8b", "--gpu", "l4", "--enable-lora", "--lora-modules",
                       "sql=my-org/sql-lora", "b=/adapters/b")
    assert code == 0
    assert "--enable-lora --max-loras 1 --lora-modules sql=my-org/sql-lora b=/adapters/b" in out


def test_an_lm_head_above_the_releases_lora_vocabulary_limit_does_not_fit(capsys: pytest.CaptureFixture[str],
                                                                          tmp_path: Path) -> None:
    from vllm_operator.sources import load_model_files

    files = load_model_files("llama-3.1-8b", offline=True)
    model = tmp_path / "llama-262k-vocab"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**files.config, "vocab_size": 262144}))
    argv = ["plan", "--model", str(model), "--gpu", "h100", "--max-model-len", "8192", "--enable-lora"]
    code, out, _ = run(capsys, *argv)
    assert code == 1
    assert "what vLLM would print:\n  ValueError: When using LoRA, vocab size must be <= 258048\n" in out
    code, out, _ = run(capsys, *argv, "--vllm-version", "0.16.0")
    assert code == 1 and "ValueError: When using LoRA, vocab size must be 32000 >= vocab_size <= 257024" in out
    code, _, _ = run(capsys, *argv[:-1])
    assert code == 0  # without LoRA it starts


def test_readmes_lora_commands_print_what_it_says(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/ecosystem.md's LoRA example, run as written: the plan's last line is the one quoted, the check exits 1."""
    import shlex

    readme = (Path(__file__).resolve().parents[2] / "docs" / "ecosystem.md").read_text()
    block = readme.split('"Will it fit with 4 adapters of rank 64?"', 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    plan_line, quoted, check_line = lines[0], lines[1], lines[2]
    code, out, err = run(capsys, *shlex.split(plan_line)[1:])
    assert code == 0, err
    assert quoted == "# … " + out.rstrip().splitlines()[-1]
    code, out, err = run(capsys, *shlex.split(check_line.split("#", 1)[0])[1:])
    assert code == 1 and "does not support LoRA yet." in out, err


def test_more_pipeline_stages_than_layers_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Was: a ZeroDivisionError traceback from planner/memory.py."""
    code, out, err = run(capsys, "plan", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--gpu", "H100-80GB", "-pp", "32",
                         "--gpu-count", "32")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("vllm-operator: error: --pipeline-parallel-size 32 for the 24 "), err


# --- real command lines, read with their release's own flags (catalog/vllm_flags_cli.yaml) ---------------------------

# (release, GPU, the flags after `vllm serve Qwen/Qwen3-8B`, exit code, a text of stdout (0, 1) or stderr (2)): the
# flag sets of issue 23 (accepted by vLLM 0.32.0's own parser, or removed from it) and more
_COMMAND_LINES = [
    ("0.32.0", "h100", "--max-model-len auto", 0, "max-model-len auto: vLLM 0.32.0 keeps the model's full context, 40960 tokens"),
    ("0.32.0", "h100", "--max-model-len -1", 0, "max-model-len auto: vLLM 0.32.0 keeps the model's full context, 40960 tokens"),
    ("0.32.0", "l4", "--max-model-len auto", 0, "max-model-len auto: vLLM 0.32.0 reduces the model's 40960 to "),
    ("0.32.0", "l4", "--max_model_len=auto --gpu_memory_utilization=0.95", 0, "max-model-len auto: vLLM 0.32.0 reduces"),
    ("0.13.0", "h100", "--max-model-len auto", 2, "--max-model-len auto (or -1) was added in vLLM 0.14.0"),
    ("0.32.0", "h100", "--async-scheduling", 0, "--async-scheduling"),
    ("0.9.0", "h100", "--async-scheduling", 2, "--async-scheduling was added in vLLM 0.10.0"),
    ("0.32.0", "h100", "--limit-mm-per-prompt '{\"image\":2}'", 0, "--limit-mm-per-prompt"),
    ("0.32.0", "h100", "-O3", 0, "--optimization-level 3 planned as vLLM's default (level 2"),
    ("0.32.0", "h100", "-O 3", 0, "--optimization-level 3 planned as vLLM's default (level 2"),
    ("0.12.0", "h100", "-O2", 0, "--optimization-level 2 planned as vLLM's default"),
    ("0.32.0", "h100", "-O1", 0, "left out of the prediction): --optimization-level"),
    ("0.8.0", "h100", "-O3", 0, "--compilation-config"),
    ("0.32.0", "h100", "--enable-sleep-mode", 0, "--enable-sleep-mode"),
    ("0.32.0", "h100", "--kv-offloading-size 16", 0, "Not modelled (no effect on GPU memory at startup): --kv-offloading-size"),
    ("0.20.0", "h100", "--kv-offloading-size 16", 0, "any effect on GPU memory is left out of the prediction): --kv-offloading-size"),
    ("0.32.0", "h100", "--kv-offloading-size 16 --kv-offloading-backend lmcache", 0, "left out of the prediction): --kv-offloading-backend, --kv-offloading-size"),
    ("0.32.0", "h100", "--kv-transfer-config '{\"kv_connector\":\"LMCacheConnectorV1\",\"kv_role\":\"kv_both\"}'", 0, "--kv-transfer-config"),
    ("0.32.0", "h100", "--long-prefill-token-threshold 2048", 0, "--long-prefill-token-threshold"),
    ("0.32.0", "h100", "--mm-processor-cache-gb 4", 0, "Not modelled (no effect on GPU memory at startup): --mm-processor-cache-gb"),
    ("0.32.0", "h100", "--disable-custom-all-reduce", 0, "--disable-custom-all-reduce"),
    ("0.32.0", "h100", "--kv-cache-memory-bytes 8G", 0, "GPU KV cache size: 58,"),
    ("0.32.0", "h100", "--override-generation-config '{\"temperature\":0.6}'", 0, "--override-generation-config"),
    ("0.32.0", "h100", "--mm-encoder-tp-mode data", 0, "--mm-encoder-tp-mode"),
    ("0.32.0", "h100", "--compilation-config '{\"cudagraph_capture_sizes\":[1,2,4]}'", 0, "--compilation-config"),
    ("0.32.0", "h100", "--compilation-config.cudagraph_mode FULL_DECODE_ONLY", 0, "--compilation-config"),
    ("0.32.0", "h100", "--swap-space 4", 2, "--swap-space was removed in vLLM 0.18.0 (the command runs vLLM 0.32.0)"),
    ("0.11.0", "h100", "--swap-space 4", 0, "vLLM 0.11.0 would start"),
    ("0.32.0", "h100", "--disable-log-requests", 2, "--disable-log-requests was removed in vLLM 0.17.0"),
    ("0.11.0", "h100", "--disable-log-requests", 0, "vLLM 0.11.0 would start"),
    ("0.32.0", "h100", "--max-modle-len 8192", 2, "--max-modle-len is not a flag of vLLM 0.32.0"),
    ("0.32.0", "h100", "", 0, "max-model-len 40960 is vLLM's default."),
    ("0.32.0", "h100", "-tp 2 --max-model-len 32k", 0, "vLLM 0.32.0 would start"),
    ("0.32.0", "h100", "--tensor_parallel_size=2", 0, "vLLM 0.32.0 would start"),
    ("0.32.0", "h100", "--no-enable-prefix-caching", 0, "vLLM 0.32.0 would start"),
    ("0.8.0", "h100", "--no-enable-chunked-prefill", 2, "--no-enable-chunked-prefill was added in vLLM 0.8.5"),
    ("0.32.0", "h100", "--enable-prefix-caching --enable-chunked-prefill", 0, "vLLM 0.32.0 would start"),
    ("0.32.0", "h100", "--gpu-memory-utilization 0.95 --max-num-seqs 512", 0, "gpu-memory-utilization 0.95 is pinned."),
    ("0.32.0", "h100", "--quantization fp8 --kv-cache-dtype fp8", 0, "vLLM 0.32.0 would start"),
    ("0.32.0", "h100", "--host 0.0.0.0 --port 8000 --api-key k", 0, "Not modelled (no effect on GPU memory at startup): --api-key, --host, --port"),
    ("0.32.0", "h100", "--served-model-name a b --seed 0", 0, "--seed, --served-model-name"),
    ("0.32.0", "h100", "--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3", 0, "--enable-auto-tool-choice"),
    ("0.32.0", "h100", "--trust-remote-code --generation-config vllm", 0, "--generation-config, --trust-remote-code"),
    ("0.32.0", "h100", "--max-num-batched-tokens 16384 --enforce-eager", 0, "max-num-batched-tokens 16384 is pinned."),
    ("0.32.0", "l4", "--max-model-len 40960", 1, "vLLM 0.32.0 would fail (KVCacheTooSmall)"),
    ("0.32.0", "h100", "--speculative-config '{\"method\":\"ngram\",\"num_speculative_tokens\":3,\"prompt_lookup_max\":4}'", 0, "vLLM 0.32.0 would start"),
    ("0.32.0", "h100", "--data-parallel-size 2 -dpl 2", 0, "--data-parallel-size-local"),
    ("0.5.0", "h100", "--async-scheduling", 2, "unknown to this checker for vLLM 0.5.0"),
]


@pytest.mark.parametrize(("release", "gpu", "flags", "code", "text"), _COMMAND_LINES,
                         ids=[f"{r}-{g}-{f[:40]}" for r, g, f, _, _ in _COMMAND_LINES])
def test_real_command_lines(capsys: pytest.CaptureFixture[str], release: str, gpu: str, flags: str, code: int,
                            text: str) -> None:
    got, out, err = run(capsys, "check", "--gpu", gpu, "--vllm-version", release, "--", "vllm", "serve",
                        "Qwen/Qwen3-8B", *shlex.split(flags))
    assert got == code, out + err
    assert text in (err if code == 2 else out), out + err
    if code == 2:
        assert_one_line_error(got, out, err)
    if not flags:
        assert "is pinned" not in out  # vLLM's own defaults are called that, never pinned


def test_plan_with_max_model_len_auto_renders_auto(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--model", "Qwen/Qwen3-8B", "--gpu", "l4", "--vllm-version", "0.32.0",
                       "--max-model-len", "auto", "-o", "json")
    doc = json.loads(out)
    assert code == 0
    args = doc["args"]
    assert args[args.index("--max-model-len") + 1] == "auto"
    assert 1024 < doc["flags"]["max_model_len"] < 40960  # what auto picks on an L4, below the model's 40960
    assert any(r.startswith("max-model-len auto: vLLM 0.32.0 reduces the model's 40960 to "
                            f"{doc['flags']['max_model_len']} tokens") for r in doc["reasons"])
    code, out, _ = run(capsys, "plan", "--model", "Qwen/Qwen3-8B", "--gpu", "l4", "--vllm-version", "0.32.0",
                       "--max-model-len", "-1", "-o", "manifest")
    assert code == 0 and yaml.safe_load(out)["spec"]["flags"]["maxModelLen"] == "auto"


def test_check_lists_accepted_flags_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "--gpu", "h100", "--vllm-version", "0.32.0", "-o", "json", "--", "vllm",
                       "serve", "Qwen/Qwen3-8B", "--port", "8000", "--async-scheduling", "-O3")
    assert code == 0
    accepted = json.loads(out)["flags_accepted"]
    assert accepted["no_memory_effect"] == ["--port"]
    assert accepted["effect_not_modelled"] == ["--async-scheduling"]
    assert [s.split(" (")[0] for s in accepted["planned_as"]] == [
        "--optimization-level 3 planned as vLLM's default"]  # O3 is O2's configuration in 0.12-0.33


@pytest.mark.parametrize("flags", [["-O0"], ["-O", "0"], ["--optimization-level=0"]])
def test_optimization_level_0_is_planned_as_eager(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    """vLLM 0.12+'s OPTIMIZATION_LEVEL_00 sets cudagraph_mode NONE and compilation mode NONE, as --enforce-eager."""
    code, out, _ = run(capsys, "check", "--gpu", "h100", "--vllm-version", "0.32.0", "-o", "json", "--", "vllm",
                       "serve", "Qwen/Qwen3-8B", *flags)
    doc = json.loads(out)
    assert code == 0 and doc["flags"]["enforce_eager"] is True and doc["memory"]["cudagraph_gib"] == 0
    assert doc["flags_accepted"]["planned_as"] and not doc["flags_accepted"]["effect_not_modelled"]
    code, out, _ = run(capsys, "check", "--gpu", "h100", "--vllm-version", "0.32.0", "-o", "json", "--", "vllm",
                       "serve", "Qwen/Qwen3-8B", *flags, "--compilation-config", '{"cudagraph_mode": "FULL"}')
    doc = json.loads(out)  # the user's own compilation config wins over the level's defaults: not modelled
    assert doc["flags"].get("enforce_eager") is not True and "--optimization-level" in \
        doc["flags_accepted"]["effect_not_modelled"]


def test_plan_passes_other_flags_of_the_release_into_the_manifest(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--model", "Qwen/Qwen3-8B", "--gpu", "h100", "--vllm-version", "0.32.0",
                       "-o", "manifest", "--async-scheduling", "-O3", "--limit-mm-per-prompt", '{"image": 2}')
    assert code == 0
    assert yaml.safe_load(out)["spec"]["extraArgs"] == ["--async-scheduling", "-O3", "--limit-mm-per-prompt",
                                                        '{"image": 2}']
    code, out, err = run(capsys, "plan", "--model", "Qwen/Qwen3-8B", "--gpu", "h100", "--vllm-version", "0.32.0",
                         "--swap-space", "4", "--max-modle-len", "8192")
    assert_one_line_error(code, out, err)
    assert "--swap-space was removed in vLLM 0.18.0" in err and "--max-modle-len is not a flag of vLLM 0.32.0" in err
