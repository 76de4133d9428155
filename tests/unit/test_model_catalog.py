"""Every row of the built-in model catalog (operator/vllm_operator/catalog/models/*.json) is sane and accurate."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from vllm_operator.modelfiles import find_in_catalog, list_catalog
from vllm_operator.sources import load_model_files

REPO = Path(__file__).resolve().parents[2]
CATALOG_DIR = REPO / "operator" / "vllm_operator" / "catalog" / "models"
ROW_KEYS = {"model_id", "aliases", "total_size", "total_size_estimated", "source", "config"}

# Fields real config.json files leave to transformers' defaults (the planner must apply the same ones).
TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 262208,
        "tie_word_embeddings": True,
    },
    "gemma2": {"tie_word_embeddings": True},
    "gemma": {"tie_word_embeddings": True},
}
NON_GATED_MLP = {"phi", "gpt2", "gpt_bigcode", "starcoder2", "falcon"}


def _files() -> list[Path]:
    return sorted(CATALOG_DIR.glob("*.json"))


def _rows() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in _files()]


def _shared_models_dir() -> Path:
    """The calibration records' model files, copied into the repository (benchmarks/data/models)."""
    return REPO / "benchmarks" / "data" / "models"


def text_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields: top level, overlaid by text_config, with transformers' defaults filled in."""
    merged = dict(config)
    nested = config.get("text_config")
    if isinstance(nested, dict):
        merged.update(nested)
    for key, value in TEXT_DEFAULTS.get(str(merged.get("model_type")), {}).items():
        merged.setdefault(key, value)
    merged.setdefault("num_key_value_heads", merged.get("num_attention_heads"))
    return merged


def param_estimate(config: dict[str, Any]) -> tuple[int, int, int, int]:
    """(embedding+lm_head params, attention Linear params, MLP/expert Linear params, dense-MLP params in MoE models).

    An independent count from the architecture fields (norms, biases and vision towers left out).
    """
    t = text_fields(config)
    h, layers, heads = t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"]
    kv = t["num_key_value_heads"]
    head_dim = t.get("head_dim") or h // heads
    vocab = t["vocab_size"]
    tied = bool(t.get("tie_word_embeddings", False))
    embed = vocab * h * (1 if tied else 2)

    if t.get("kv_lora_rank"):  # multi-head latent attention (DeepSeek V2/V3)
        nope, rope, v = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
        q_lora = t.get("q_lora_rank")
        q = h * q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
        attn = q + h * (t["kv_lora_rank"] + rope) + t["kv_lora_rank"] * heads * (nope + v) + heads * v * h
    else:
        attn = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    state_layers, mixer = _state_mixer(t, layers)
    attn_total = (layers - state_layers) * attn + state_layers * mixer

    mats = 2 if t.get("model_type") in NON_GATED_MLP else 3
    experts = t.get("num_experts") or t.get("num_local_experts") or t.get("n_routed_experts")
    dense_in_moe = 0
    if experts:
        moe_inter = t.get("moe_intermediate_size") or t["intermediate_size"]
        per_layer = experts * mats * h * moe_inter + h * experts
        per_layer += t.get("n_shared_experts", 0) * mats * h * moe_inter
        per_layer += mats * h * t.get("shared_expert_intermediate_size", t.get("shared_intermediate_size", 0))
        dense_layers = t.get("first_k_dense_replace", 0)
        dense_size = t["intermediate_size"]
        step = t.get("interleave_moe_layer_step")
        if step:  # Llama-4: experts on every step-th layer, one shared expert, intermediate_size_mlp elsewhere
            per_layer += mats * h * moe_inter
            dense_layers = layers - layers // step
            dense_size = t["intermediate_size_mlp"]
        mlp = (layers - dense_layers) * per_layer
        dense_in_moe = dense_layers * mats * h * dense_size
    else:
        mlp = layers * mats * h * t["intermediate_size"]
    return embed, attn_total, mlp, dense_in_moe


def _state_mixer(t: dict[str, Any], layers: int) -> tuple[int, int]:
    """(layers holding a linear-attention/mamba state instead of attention, the Linear params of one such mixer):
    Gated DeltaNet in_proj_qkvz + out_proj; Mamba-2 in_proj (x, z, B, C, dt) + out_proj."""
    types = t.get("layer_types") or t.get("layers_block_type")
    if isinstance(types, list):
        count = sum(1 for kind in types if any(w in str(kind) for w in ("linear", "mamba")))
    elif isinstance(t.get("full_attention_interval"), int):
        count = layers - layers // t["full_attention_interval"]
    else:
        return 0, 0
    if not count:
        return 0, 0
    h = t["hidden_size"]
    if t.get("linear_num_value_heads"):
        key = t["linear_num_key_heads"] * t["linear_key_head_dim"]
        value = t["linear_num_value_heads"] * t["linear_value_head_dim"]
        return count, h * (2 * key + 2 * value) + value * h
    inner = t["mamba_n_heads"] * t["mamba_d_head"]
    return count, h * (2 * inner + 2 * t["mamba_n_groups"] * t["mamba_d_state"] + t["mamba_n_heads"]) + inner * h


def expected_bytes(config: dict[str, Any]) -> float:
    """Checkpoint bytes implied by the parameter estimate and the quantization layout."""
    embed, attn, mlp, dense = param_estimate(config)
    qc = config.get("quantization_config") or {}
    method = qc.get("quant_method")
    linear = attn + mlp + dense
    if method is None:
        return 2.0 * (embed + linear)
    if method in ("awq", "gptq"):
        bits, group = qc["bits"], qc["group_size"]
        return 2.0 * embed + linear * (bits / 8 + 2.5 / group)
    if method == "fp8":
        return 2.0 * embed + linear * 1.0
    if method == "fbgemm_fp8":  # Llama-4 Maverick FP8: routed experts FP8, everything else BF16
        return 2.0 * (embed + attn + dense) + mlp * 1.0
    if method == "compressed-tensors":
        groups = list(qc["config_groups"].values())
        bits = groups[0]["weights"]["num_bits"]
        return 2.0 * embed + linear * (bits / 8 + (2.5 / 128 if bits == 4 else 0.0))
    if (
        method == "mxfp4"
    ):  # experts in MXFP4 (4-bit + one E8M0 scale per 32), attention/router/embeddings bf16
        return 2.0 * (embed + attn + dense) + mlp * (4.25 / 8)
    raise AssertionError(f"unknown quant_method {method!r}: extend expected_bytes()")


ROWS = _rows()
IDS = [r["model_id"] for r in ROWS]


def test_catalog_is_not_empty_and_covers_the_required_models() -> None:
    required = [
        "meta-llama/Meta-Llama-3-8B-Instruct",
        "meta-llama/Meta-Llama-3-70B-Instruct",
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Llama-3.1-70B-Instruct",
        "meta-llama/Llama-3.3-70B-Instruct",
        "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
        "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
        "casperhansen/llama-3-70b-instruct-awq",
        "hugging-quants/Meta-Llama-3.1-8B-Instruct-GPTQ-INT4",
        "hugging-quants/Meta-Llama-3.1-70B-Instruct-GPTQ-INT4",
        "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8",
        "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8",
        "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic",
        "mistralai/Mistral-7B-Instruct-v0.2",
        "mistralai/Mistral-7B-Instruct-v0.3",
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "Qwen/Qwen2.5-7B-Instruct",
        "Qwen/Qwen2.5-14B-Instruct",
        "Qwen/Qwen2.5-32B-Instruct",
        "Qwen/Qwen2.5-72B-Instruct",
        "Qwen/Qwen2.5-7B-Instruct-AWQ",
        "Qwen/Qwen2.5-72B-Instruct-AWQ",
        "Qwen/Qwen3-8B",
        "Qwen/Qwen3-14B",
        "Qwen/Qwen3-32B",
        "Qwen/Qwen3-30B-A3B",
        "google/gemma-2-2b-it",
        "google/gemma-2-9b-it",
        "google/gemma-2-27b-it",
        "google/gemma-3-4b-it",
        "google/gemma-3-12b-it",
        "google/gemma-3-27b-it",
        "microsoft/Phi-3-mini-4k-instruct",
        "microsoft/Phi-3-medium-4k-instruct",
        "microsoft/phi-4",
        "deepseek-ai/DeepSeek-V2-Lite",
        "deepseek-ai/DeepSeek-V2-Lite-Chat",
        "openai/gpt-oss-20b",
        "openai/gpt-oss-120b",
    ]
    missing = [m for m in required if m not in IDS]
    assert not missing


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.name)
def test_row_is_valid_json_with_the_required_fields(path: Path) -> None:
    row = json.loads(path.read_text())
    assert set(row) == ROW_KEYS
    assert path.name == row["model_id"].replace("/", "__") + ".json"
    assert row["model_id"].count("/") == 1
    assert isinstance(row["total_size"], int) and row["total_size"] > 0
    assert isinstance(row["total_size_estimated"], bool)
    assert isinstance(row["source"], str) and len(row["source"]) > 20
    assert "shared/" not in row["source"], "cite the copy in the repository (benchmarks/data/models/)"
    for cited in re.findall(r"benchmarks/data/models/([\w.\-]+)", row["source"]):
        assert (_shared_models_dir() / cited / "config.json").is_file(), cited
    assert isinstance(row["aliases"], list) and row["aliases"]
    assert all(a == a.lower() and a.strip() == a and " " not in a for a in row["aliases"])
    config = row["config"]
    assert isinstance(config["architectures"], list) and config["architectures"]
    assert isinstance(config["model_type"], str)


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_architecture_fields(row: dict[str, Any]) -> None:
    t = text_fields(row["config"])
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"):
        assert isinstance(t.get(key), int) and t[key] > 0, key
    heads, kv = t["num_attention_heads"], t["num_key_value_heads"]
    assert isinstance(kv, int) and 0 < kv <= heads and heads % kv == 0
    head_dim = t.get("head_dim") or t["hidden_size"] // heads
    assert 32 <= head_dim <= 512
    if not t.get("kv_lora_rank") and "head_dim" not in t:
        assert t["hidden_size"] % heads == 0
    assert isinstance(t.get("max_position_embeddings", 131072), int)
    layer_types = t.get("layer_types")
    if layer_types is not None:
        assert len(layer_types) == t["num_hidden_layers"]
    experts = t.get("num_experts") or t.get("num_local_experts") or t.get("n_routed_experts")
    if experts:
        top_k = t.get("num_experts_per_tok") or t.get("experts_per_token")
        assert isinstance(top_k, int) and 0 < top_k <= experts


def test_aliases_are_unique_and_never_another_models_id() -> None:
    owner: dict[str, str] = {}
    for row in ROWS:
        owner[row["model_id"].lower()] = row["model_id"]
    for row in ROWS:
        for alias in row["aliases"]:
            assert alias not in owner or owner[alias] == row["model_id"], (
                alias,
                row["model_id"],
                owner.get(alias),
            )
            owner[alias] = row["model_id"]
    assert len({r["model_id"].lower() for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_total_size_is_plausible_for_the_architecture(row: dict[str, Any]) -> None:
    embed, attn, mlp, dense = param_estimate(row["config"])
    params = embed + attn + mlp + dense
    bytes_per_param = row["total_size"] / params
    assert 0.3 <= bytes_per_param <= 4.5, bytes_per_param
    # Tighter: within 2-3% of what the quantization layout implies (norms, biases and quantization scales are
    # not counted; +15% for multimodal, whose vision tower is not counted either). A wrong layer count, hidden or
    # intermediate size, expert count or vocab moves the ratio by more than that.
    ratio = row["total_size"] / expected_bytes(row["config"])
    high = 1.15 if "vision_config" in row["config"] else 1.03
    assert 0.98 <= ratio <= high, ratio


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_every_row_loads_by_id_and_alias(row: dict[str, Any]) -> None:
    for ref in (row["model_id"], row["model_id"].upper(), *row["aliases"]):
        files = load_model_files(ref, offline=True)
        assert files.model_id == row["model_id"]
        assert files.source == "built-in catalog"
        assert files.config == row["config"]
        assert files.total_size == row["total_size"]
        assert files.total_size_estimated is row["total_size_estimated"]
        assert files.provenance == row["source"]


def test_list_catalog_matches_the_files() -> None:
    listed = list_catalog()
    assert sorted(f.model_id for f in listed) == sorted(IDS)
    assert [f.model_id.lower() for f in listed] == sorted(f.model_id.lower() for f in listed)


def test_shared_data_set_models_are_in_the_catalog_with_identical_values() -> None:
    shared = _shared_models_dir()
    dirs = sorted(d for d in shared.iterdir() if (d / "config.json").is_file())
    assert dirs
    for d in dirs:
        model_id = d.name.replace("__", "/", 1)
        files = find_in_catalog(model_id)
        assert files is not None, f"{model_id} is missing from the catalog"
        assert files.model_id.lower() == model_id.lower()
        assert files.config == json.loads((d / "config.json").read_text()), model_id
        metadata = json.loads((d / "model.safetensors.index.json").read_text())["metadata"]
        assert files.total_size == metadata["total_size"], model_id
        assert files.total_size_estimated is bool(metadata.get("estimated", False)), model_id


def test_well_known_values() -> None:
    """Spot checks of published numbers the planner depends on."""

    def get(model_id: str) -> tuple[dict[str, Any], int]:
        files = find_in_catalog(model_id)
        assert files is not None and files.total_size is not None
        return text_fields(files.config), files.total_size

    t, size = get("meta-llama/Llama-3.1-8B-Instruct")
    assert (t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"], t["num_key_value_heads"]) == (
        4096,
        32,
        32,
        8,
    )
    assert (t["intermediate_size"], t["vocab_size"], t["max_position_embeddings"]) == (14336, 128256, 131072)
    assert t["rope_scaling"]["rope_type"] == "llama3" and t["rope_scaling"]["factor"] == 8.0
    assert size == 16060522496
    t, size = get("meta-llama/Llama-3.1-70B-Instruct")
    assert (t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"], t["num_key_value_heads"]) == (
        8192,
        80,
        64,
        8,
    )
    assert size == 141107412992
    t, size = get("mistralai/Mixtral-8x7B-Instruct-v0.1")
    assert (t["num_local_experts"], t["num_experts_per_tok"], t["vocab_size"], t["sliding_window"]) == (
        8,
        2,
        32000,
        None,
    )
    assert size == 93405585408
    t, _ = get("google/gemma-3-27b-it")
    assert (t["head_dim"], t["num_key_value_heads"], t["num_hidden_layers"]) == (128, 16, 62)
    t, _ = get("Qwen/Qwen2.5-72B-Instruct-AWQ")
    assert t["intermediate_size"] == 29696 and t["quantization_config"]["quant_method"] == "awq"
