"""planner.arch: config.json → the numbers vLLM's memory arithmetic reads (heads, head_dim, layers, windows, …)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vllm_operator.planner.arch import (
    ArchError,
    LayerKind,
    ModelArch,
    arch_from_config,
    checkpoint_bytes,
    lm_head_bytes_per_param,
    module_params,
)

LoadArch = Callable[[str], ModelArch]
FULL, SLIDING = LayerKind.FULL, LayerKind.SLIDING

# A Llama-2-7B-shaped config; tests override single fields.
LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "float16",
}


def llama(**changes: Any) -> dict[str, Any]:
    config = dict(LLAMA)
    for key, value in changes.items():
        if value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    return config


def config_arch(config: Any, model_id: str = "test/model") -> ModelArch:
    return arch_from_config(config, model_id=model_id)


def kinds(arch: ModelArch) -> Counter[LayerKind]:
    return Counter(arch.layer_kinds)


# --- attention families -----------------------------------------------------------------------------------


def test_mha_codellama_7b_has_one_kv_head_per_attention_head(load_arch: LoadArch) -> None:
    arch = load_arch("codellama/CodeLlama-7b-hf")
    assert (arch.num_layers, arch.num_heads, arch.num_kv_heads, arch.head_dim) == (32, 32, 32, 128)
    assert arch.family.startswith("MHA")


def test_gqa_llama_3_1_8b(load_arch: LoadArch) -> None:
    arch = load_arch("meta-llama/Llama-3.1-8B-Instruct")
    assert (arch.num_layers, arch.num_heads, arch.num_kv_heads, arch.head_dim) == (32, 32, 8, 128)
    assert arch.family.startswith("GQA")
    assert not arch.is_mla and not arch.is_moe and not arch.is_hybrid and not arch.multimodal


def test_mqa_synthetic_single_kv_head() -> None:
    arch = config_arch(llama(num_key_value_heads=1))
    assert arch.num_kv_heads == 1
    assert arch.family.startswith("MQA")


def test_kv_heads_default_to_attention_heads_when_absent() -> None:
    assert config_arch(llama(num_key_value_heads=...)).num_kv_heads == 32


@pytest.mark.parametrize("key", ["n_head_kv", "num_kv_heads", "multi_query_group_num", "num_attention_groups"])
def test_kv_heads_read_from_vllm_synonyms(key: str) -> None:
    assert config_arch({**llama(num_key_value_heads=...), key: 4}).num_kv_heads == 4


def test_head_dim_is_hidden_over_heads_without_explicit_head_dim() -> None:
    assert config_arch(llama(hidden_size=5120, num_attention_heads=40, num_key_value_heads=8)).head_dim == 128


def test_explicit_head_dim_wins_gemma_2_27b(load_arch: LoadArch) -> None:
    arch = load_arch("google/gemma-2-27b-it")
    assert arch.hidden_size // arch.num_heads == 144
    assert arch.head_dim == 128


def test_head_dim_null_falls_back_to_hidden_over_heads() -> None:
    assert config_arch(llama(head_dim=None)).head_dim == 128


# --- MoE ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_id", "experts", "top_k", "moe_inter"),
    [
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 8, 2, 14336),
        ("Qwen/Qwen3-30B-A3B", 128, 8, 768),
        ("openai/gpt-oss-20b", 32, 4, 2880),
        ("openai/gpt-oss-120b", 128, 4, 2880),
        ("deepseek-ai/DeepSeek-V2-Lite", 64, 6, 1408),
    ],
)
def test_moe_fields(model_id: str, experts: int, top_k: int, moe_inter: int, load_arch: LoadArch) -> None:
    arch = load_arch(model_id)
    assert arch.is_moe
    assert (arch.num_experts, arch.experts_per_token, arch.moe_intermediate_size) == (experts, top_k, moe_inter)
    assert "MoE" in arch.family


def test_moe_parameters_count_every_expert(load_arch: LoadArch) -> None:
    mixtral = load_arch("mistralai/Mixtral-8x7B-Instruct-v0.1")
    assert 44e9 < mixtral.param_count < 49e9  # 46.7B total, not the 12.9B active


def test_dense_model_is_not_moe(load_arch: LoadArch) -> None:
    arch = load_arch("Qwen/Qwen2.5-7B-Instruct")
    assert not arch.is_moe
    assert arch.num_experts == 0


# --- MLA ----------------------------------------------------------------------------------------------------


def test_mla_deepseek_v2_lite_one_latent_head_of_576(load_arch: LoadArch) -> None:
    arch = load_arch("deepseek-ai/DeepSeek-V2-Lite")
    assert arch.is_mla
    assert (arch.kv_lora_rank, arch.qk_rope_head_dim) == (512, 64)
    assert arch.head_dim == 576
    assert arch.num_kv_heads == 1  # config says 16; MLA caches one latent vector
    assert arch.num_layers == 27
    assert arch.family.startswith("MLA")


def test_mla_requires_rope_dim() -> None:
    config = llama(kv_lora_rank=512, model_type="deepseek_v2")
    with pytest.raises(ArchError, match="qk_rope_head_dim"):
        config_arch(config)


# --- sliding window / hybrid --------------------------------------------------------------------------------


def test_gemma_2_alternates_sliding_and_full_starting_with_sliding(load_arch: LoadArch) -> None:
    arch = load_arch("google/gemma-2-27b-it")
    assert arch.num_layers == 46
    assert arch.layer_kinds[:4] == (SLIDING, FULL, SLIDING, FULL)
    assert kinds(load_arch("google/gemma-2-27b-it")) == {SLIDING: 23, FULL: 23}
    assert arch.sliding_window == 4096
    assert arch.is_hybrid


def test_gemma_3_27b_has_10_full_and_52_sliding_layers(load_arch: LoadArch) -> None:
    arch = load_arch("google/gemma-3-27b-it")
    assert kinds(load_arch("google/gemma-3-27b-it")) == {FULL: 10, SLIDING: 52}
    assert arch.sliding_window == 1024
    # every 6th layer is global
    assert [i for i, kind in enumerate(arch.layer_kinds) if kind is FULL] == list(range(5, 62, 6))


def test_gpt_oss_layer_kinds_come_from_layer_types(load_arch: LoadArch) -> None:
    arch = load_arch("openai/gpt-oss-20b")
    assert arch.layer_kinds[:2] == (SLIDING, FULL)
    assert kinds(load_arch("openai/gpt-oss-20b")) == {SLIDING: 12, FULL: 12}
    assert arch.sliding_window == 128


def test_layer_types_override_the_window_pattern() -> None:
    config = llama(model_type="gemma3_text", sliding_window=512, num_hidden_layers=4,
                   layer_types=["full_attention", "sliding_attention", "full_attention", "full_attention"])
    arch = config_arch(config)
    assert arch.layer_kinds == (FULL, SLIDING, FULL, FULL)
    assert arch.sliding_window == 512


def test_layer_types_without_sliding_layers_have_no_window() -> None:
    config = llama(sliding_window=512, num_hidden_layers=2, layer_types=["full_attention", "full_attention"])
    arch = config_arch(config)
    assert arch.layer_kinds == (FULL, FULL)
    assert arch.sliding_window is None


def test_qwen2_with_sliding_window_but_use_sliding_window_false_is_all_full(load_arch: LoadArch) -> None:
    arch = load_arch("Qwen/Qwen2.5-7B-Instruct")
    assert set(arch.layer_kinds) == {FULL}
    assert arch.sliding_window is None
    assert not arch.is_hybrid


def test_qwen2_with_use_sliding_window_true_uses_the_window() -> None:
    config = llama(model_type="qwen2", sliding_window=4096, use_sliding_window=True)
    assert set(config_arch(config).layer_kinds) == {SLIDING}


def test_mistral_7b_v0_1_every_layer_is_windowed() -> None:
    config = llama(architectures=["MistralForCausalLM"], model_type="mistral", num_key_value_heads=8,
                   intermediate_size=14336, max_position_embeddings=32768, sliding_window=4096)
    arch = config_arch(config, model_id="mistralai/Mistral-7B-v0.1")
    assert set(arch.layer_kinds) == {SLIDING}
    assert len(arch.layer_kinds) == 32
    assert arch.sliding_window == 4096
    assert not arch.is_hybrid
    assert "SWA" in arch.family


def test_no_sliding_window_means_all_full(load_arch: LoadArch) -> None:
    arch = load_arch("mistralai/Mistral-7B-Instruct-v0.2")
    assert set(arch.layer_kinds) == {FULL}
    assert arch.sliding_window is None


def test_layer_kinds_cover_every_layer(load_arch: LoadArch) -> None:
    for model_id in ("google/gemma-3-4b-it", "google/gemma-2-2b-it", "openai/gpt-oss-120b",
                     "meta-llama/Llama-3.1-8B-Instruct"):
        arch = load_arch(model_id)
        assert len(arch.layer_kinds) == arch.num_layers


# --- multimodal (text_config) -------------------------------------------------------------------------------


def test_gemma_3_4b_sparse_text_config_gets_transformers_defaults(load_arch: LoadArch) -> None:
    arch = load_arch("google/gemma-3-4b-it")
    assert arch.multimodal
    assert arch.model_type == "gemma3_text"
    assert (arch.num_layers, arch.hidden_size) == (34, 2560)  # from text_config
    assert (arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.vocab_size) == (8, 4, 256, 262208)  # defaults
    assert kinds(load_arch("google/gemma-3-4b-it")) == {FULL: 5, SLIDING: 29}
    assert arch.derived_max_model_len == 131072  # gemma-3's linear rope factor 8 is not applied again


def test_mistral_small_3_1_reads_the_language_model_from_text_config(load_arch: LoadArch) -> None:
    arch = load_arch("mistralai/Mistral-Small-3.1-24B-Instruct-2503")
    assert arch.multimodal
    assert (arch.num_layers, arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim) == (40, 5120, 32, 8, 128)
    assert arch.vocab_size == 131072
    assert arch.derived_max_model_len == 131072
    assert arch.architectures == ("Mistral3ForConditionalGeneration",)


def test_text_only_model_is_not_multimodal(load_arch: LoadArch) -> None:
    assert not load_arch("meta-llama/Llama-3.1-8B-Instruct").multimodal


def test_text_config_fields_win_over_top_level() -> None:
    config = {"model_type": "wrapper", "num_hidden_layers": 99, "vision_config": {"hidden_size": 1},
              "text_config": {**llama(), "num_hidden_layers": 12}}
    arch = config_arch(config)
    assert arch.num_layers == 12
    assert arch.multimodal


# --- quantization -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_id", "method", "bits", "group"),
    [
        # stored bits: 4-bit values + a 16-bit scale per group of 128 (+ a packed 4-bit zero point unless symmetric)
        ("Qwen/Qwen2.5-7B-Instruct-AWQ", "awq", 4 + 20 / 128, 128),
        ("TheBloke/Mistral-7B-Instruct-v0.2-GPTQ", "gptq", 4 + 16 / 128, 128),
        ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16", "gptq", 4 + 16 / 128, 128),
        ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", "compressed-tensors", 8.0, None),  # fp8 weights
        ("RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8", "compressed-tensors", 8.0, None),  # int8 weights
        ("openai/gpt-oss-20b", "mxfp4", 4.25, None),
        ("Qwen/Qwen3-235B-A22B-FP8", "fp8", 8.0, None),  # fp8 with 128x128 weight blocks
    ],
)
def test_quantization_detected(model_id: str, method: str, bits: float, group: int | None, load_arch: LoadArch) -> None:
    q = load_arch(model_id).quantization
    assert q is not None
    assert (q.method, q.weight_bits, q.group_size) == (method, bits, group)
    assert not q.kv_cache_fp8
    assert method in load_arch(model_id).family


def test_compressed_tensors_w4a16_group_quantization() -> None:
    quant = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                      "weights": {"num_bits": 4, "group_size": 128, "strategy": "group",
                                                  "type": "int", "symmetric": True}}},
        "ignore": ["lm_head"],
    }
    q = config_arch(llama(quantization_config=quant)).quantization
    assert q is not None
    assert (q.method, q.weight_bits, q.group_size) == ("compressed-tensors", 4 + 16 / 128, 128)  # symmetric


def test_kv_cache_scheme_marks_an_fp8_kv_checkpoint() -> None:
    quant = {"quant_method": "compressed-tensors",
             "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}},
             "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}
    q = config_arch(llama(quantization_config=quant)).quantization
    assert q is not None and q.kv_cache_fp8


def test_unquantized_model_has_no_quantization(load_arch: LoadArch) -> None:
    assert load_arch("meta-llama/Llama-3.1-8B-Instruct").quantization is None


def test_checkpoint_bytes_come_from_the_index_when_known(load_arch: LoadArch) -> None:
    arch = load_arch("Qwen/Qwen2.5-7B-Instruct")
    assert arch.total_size == 15231233024
    assert checkpoint_bytes(arch) == arch.total_size


def test_checkpoint_bytes_estimated_from_params_without_an_index() -> None:
    arch = config_arch(llama())  # Llama-2-7B shape, fp16
    assert arch.total_size is None
    assert 6.5e9 < arch.param_count < 7.0e9
    assert checkpoint_bytes(arch) == arch.param_count * 2


# --- derived max_model_len ----------------------------------------------------------------------------------


def test_llama3_rope_is_not_multiplied(load_arch: LoadArch) -> None:
    arch = load_arch("meta-llama/Llama-3.1-8B-Instruct")
    assert arch.derived_max_model_len == 131072  # max_position_embeddings, not × rope factor 8


def test_yarn_uses_original_times_factor() -> None:
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    arch = config_arch(llama(model_type="qwen2", max_position_embeddings=32768, rope_scaling=yarn))
    assert arch.derived_max_model_len == 131072


def test_yarn_legacy_type_key(load_arch: LoadArch) -> None:
    arch = load_arch("deepseek-ai/DeepSeek-V2-Lite")  # {"type": "yarn", factor 40, original 4096}
    assert arch.derived_max_model_len == 4096 * 40


def test_linear_rope_factor_is_applied() -> None:
    arch = config_arch(llama(rope_scaling={"rope_type": "linear", "factor": 2.0}))
    assert arch.derived_max_model_len == 8192


def test_phi_2_is_2048(load_arch: LoadArch) -> None:
    assert load_arch("microsoft/phi-2").derived_max_model_len == 2048


def test_smallest_length_key_wins() -> None:
    assert config_arch(llama(model_max_length=2048)).derived_max_model_len == 2048


def test_no_length_key_defaults_to_2048() -> None:
    config = llama(max_position_embeddings=..., model_type="custom")
    assert config_arch(config).derived_max_model_len == 2048


# --- malformed configs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [[], "config", None, 3])
def test_config_not_an_object(bad: Any) -> None:
    with pytest.raises(ArchError, match="JSON object"):
        config_arch(bad)


def test_missing_num_hidden_layers_is_named() -> None:
    with pytest.raises(ArchError, match="num_hidden_layers"):
        config_arch(llama(num_hidden_layers=...))


def test_missing_layers_raises_arch_error() -> None:
    with pytest.raises(ArchError):
        config_arch(llama(num_hidden_layers=...))


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_attention_heads", -32), ("num_attention_heads", 0), ("num_hidden_layers", 0),
     ("num_hidden_layers", "32"), ("hidden_size", -1), ("num_hidden_layers", True)],
)
def test_bad_numbers_raise_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ArchError, match=field):
        config_arch(llama(**{field: value}))


@pytest.mark.parametrize("value", [-8, 0])
def test_bad_kv_heads_raise_naming_the_field(value: int) -> None:
    with pytest.raises(ArchError, match="num_key_value_heads"):
        config_arch(llama(num_key_value_heads=value))


def test_heads_not_divisible_by_kv_heads() -> None:
    with pytest.raises(ArchError, match=r"num_attention_heads \(32\).*\(5\)"):
        config_arch(llama(num_key_value_heads=5))


def test_arch_error_names_the_model() -> None:
    with pytest.raises(ArchError, match="my-org/broken"):
        config_arch(llama(num_attention_heads=-1), model_id="my-org/broken")


def test_arch_error_is_a_value_error() -> None:
    assert issubclass(ArchError, ValueError)


# --- linear-attention / mamba layers (hybrids of 2025-2026) ------------------------------------------------------



def test_layer_types_with_linear_attention() -> None:
    types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 16
    arch = config_arch({**llama(num_hidden_layers=64), "layer_types": types, "linear_num_value_heads": 48,
                        "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                        "linear_conv_kernel_dim": 4})
    assert arch.layer_kinds.count(LayerKind.FULL) == 16
    assert arch.layer_kinds.count(LayerKind.LINEAR) == 48
    assert arch.state_elements == 3 * (2 * 16 * 128 + 48 * 128) + 48 * 128 * 128
    assert "hybrid-linear" in arch.family


def test_full_attention_interval() -> None:
    arch = config_arch({**llama(num_hidden_layers=8), "full_attention_interval": 4, "linear_num_value_heads": 32})
    assert arch.layer_kinds == (LayerKind.LINEAR,) * 3 + (LayerKind.FULL,) + (LayerKind.LINEAR,) * 3 + (LayerKind.FULL,)


def test_mamba2_layers_block_type_and_state() -> None:
    arch = config_arch({**llama(num_hidden_layers=4, hidden_size=4096), "layers_block_type":
                        ["mamba", "mamba", "mamba", "attention"], "mamba_d_state": 128, "mamba_d_conv": 4,
                        "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_n_groups": 8})
    assert arch.layer_kinds == (LayerKind.LINEAR,) * 3 + (LayerKind.FULL,)
    # mamba2_state_shape: conv (4 − 1) × (128·64 + 2·8·128), ssm 128 heads × 64 × 128
    assert arch.state_elements == 3 * (8192 + 2048) + 128 * 64 * 128


def test_jamba_attention_period() -> None:
    arch = config_arch({**llama(num_hidden_layers=8), "attn_layer_period": 8, "attn_layer_offset": 4,
                        "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2})
    assert [k is LayerKind.FULL for k in arch.layer_kinds] == [i == 4 for i in range(8)]
    inner = 2 * 4096
    assert arch.state_elements == 3 * inner + inner * 16  # mamba1_state_shape


def test_models_without_state_layers_have_no_state() -> None:
    assert config_arch(llama()).state_elements == 0
    assert config_arch(llama()).yarn_unscaled_max_len is None


def test_yarn_keeps_the_unscaled_length_for_0_30() -> None:
    arch = config_arch({**llama(max_position_embeddings=32768),
                        "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 32768}})
    assert arch.derived_max_model_len == 131072
    assert arch.yarn_unscaled_max_len == 32768


@pytest.mark.parametrize("quantization", [
    {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16},
    {"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4"}},
    {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
     "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}}},
])
def test_nvfp4_checkpoints_are_4_5_bits(quantization: dict[str, Any]) -> None:
    arch = config_arch({**llama(), "quantization_config": quantization})
    assert arch.quantization is not None and arch.quantization.weight_bits == 4.5
    body = arch.param_count - 2 * arch.vocab_size * arch.hidden_size  # embeddings and LM head stay 16-bit
    assert checkpoint_bytes(arch) == pytest.approx(body * 4.5 / 8 + 2 * 2 * arch.vocab_size * arch.hidden_size,
                                                   rel=0.001)


def _mixed(groups: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "config_groups": groups, **extra}


def test_mixed_precision_sizes_each_module_by_its_group() -> None:
    """ModelOpt MIXED_PRECISION (as NVIDIA's Qwen3.6 NVFP4 exports write it): FP8 attention, NVFP4 MLP and LM head,
    embeddings in the model dtype; NVFP4 = E2M1 values + an E4M3 scale per 16 = 4.5 bits."""
    quant = _mixed({
        "group_0": {"weights": {"num_bits": 8, "type": "float"},
                    "targets": ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj"]},
        "group_1": {"weights": {"num_bits": 4, "type": "float", "group_size": 16},
                    "targets": ["lm_head", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj"]},
    })
    arch = config_arch({**llama(), "quantization_config": quant})
    q = arch.quantization
    assert q is not None and dict(q.module_bits) == {"attention": 8.0, "mlp": 4.5, "lm_head": 4.5}
    parts = module_params(arch)
    assert parts["mlp"] == 3 * arch.hidden_size * arch.intermediate_size * arch.num_layers
    expected = (parts["attention"] * 1 + parts["mlp"] * 4.5 / 8 + parts["lm_head"] * 4.5 / 8 + parts["embed"] * 2)
    assert checkpoint_bytes(arch) == pytest.approx(expected, rel=1e-6)
    assert lm_head_bytes_per_param(arch) == 4.5 / 8


@pytest.mark.parametrize(("weights", "bits"), [
    ({"num_bits": 4, "type": "float", "group_size": 16}, 4.5),        # NVFP4: E4M3 scale per 16
    ({"num_bits": 4, "type": "float", "group_size": 32}, 4.25),       # MXFP4: E8M0 scale per 32
    ({"num_bits": 8, "type": "float"}, 8.0),                          # FP8: per-tensor/channel scales
    ({"num_bits": 4, "type": "int", "group_size": 128, "symmetric": True}, 4 + 16 / 128),
    ({"num_bits": 4, "type": "int", "group_size": 32, "symmetric": False}, 4 + 20 / 32),
    ({"num_bits": 8, "type": "int", "strategy": "channel"}, 8.0),
])
def test_bit_layouts_include_the_block_scales(weights: dict[str, Any], bits: float) -> None:
    quant = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": weights, "targets": ["Linear"]}},
             "ignore": ["lm_head"]}
    q = config_arch({**llama(), "quantization_config": quant}).quantization
    assert q is not None and q.weight_bits == pytest.approx(bits) and q.bits_for("lm_head") is None


def test_a_catch_all_target_quantizes_every_linear_layer_but_an_ignored_lm_head() -> None:
    quant = {"quant_method": "compressed-tensors", "ignore": ["lm_head"], "config_groups": {
        "experts": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}, "targets": ["re:.*mlp.experts.*"]},
        "rest": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}}}
    q = config_arch({**llama(), "quantization_config": quant}).quantization
    # the catch-all also names the experts: the wider format wins, so every linear layer is 8-bit (uniform)
    assert q is not None and q.weight_bits == 8.0 and q.module_bits == () and q.bits_for("lm_head") is None
    quant["config_groups"]["rest"]["targets"] = ["re:.*self_attn.*"]
    q = config_arch({**llama(), "quantization_config": quant}).quantization
    assert q is not None and dict(q.module_bits) == {"attention": 8.0, "experts": 4.5}
    assert q.bits_for("mlp") is None  # not targeted: the model dtype


def test_the_qwen3_6_hybrids_count_their_gated_deltanet_layers_and_vision_tower() -> None:
    """Qwen3.6-27B (NVIDIA's NVFP4 export): 48 Gated DeltaNet + 16 gated full-attention layers and a 27-block vision
    tower; the checkpoint estimate from the layout lands on the 19.78 GiB vLLM logged loading it (2026 records)."""
    folder = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "models-2026" / "nvidia__Qwen3.6-27B-NVFP4"
    arch = arch_from_config(json.loads((folder / "config.json").read_text()), model_id="nvidia/Qwen3.6-27B-NVFP4")
    assert arch.vision_params == pytest.approx(0.461e9, rel=0.01)
    h = 5120
    gdn = h * (2 * 16 * 128 + 2 * 48 * 128) + h * 2 * 48 + (2 * 16 * 128 + 48 * 128) * 4 + 2 * 48 + 128 + 48 * 128 * h
    full = h * 256 * (2 * 24 + 2 * 4) + h * 256 * 24
    mlp = 3 * h * 17408
    assert sorted(set(arch.layer_param_counts)) == [full + mlp, gdn + mlp]
    assert checkpoint_bytes(arch) / 2**30 == pytest.approx(19.78, rel=0.02)


def test_modelopt_fp8_stays_8_bits() -> None:
    arch = config_arch({**llama(), "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}})
    assert arch.quantization is not None and arch.quantization.weight_bits == 8.0


# --- Llama-4 (interleaved MoE, shared expert, chunked local attention, vision tower) and DeepSeek-V3 -------------

SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
MAVERICK = "meta-llama/Llama-4-Maverick-17B-128E-Instruct"
H_L4 = 5120
ATTN_L4 = H_L4 * 40 * 128 + 2 * H_L4 * 8 * 128 + 40 * 128 * H_L4   # q, k, v, o (no biases; qk-norm has no weights)
EXPERT_L4 = 3 * H_L4 * 8192                                         # gate, up, down of one expert (or the shared one)
DENSE_L4 = 3 * H_L4 * 16384                                         # intermediate_size_mlp on the non-MoE layers
EMBED_L4 = 202048 * H_L4


def test_llama4_scout_every_layer_is_moe_with_one_shared_expert(load_arch: LoadArch) -> None:
    arch = load_arch(SCOUT)
    assert (arch.num_layers, arch.num_heads, arch.num_kv_heads, arch.head_dim) == (48, 40, 8, 128)
    assert (arch.num_experts, arch.experts_per_token, arch.moe_intermediate_size) == (16, 1, 8192)
    assert arch.intermediate_size == 16384 and arch.moe_layers == tuple(range(48))
    assert arch.routed_expert_params == EXPERT_L4
    # per layer by hand: attention + 16 routed experts + 1 shared expert + router (16 × hidden)
    moe_layer = ATTN_L4 + 16 * EXPERT_L4 + EXPERT_L4 + 16 * H_L4
    assert set(arch.layer_param_counts) == {moe_layer} and moe_layer == 2_202_091_520
    # vision tower by hand: 34 encoder layers of 1408 (q/k/v/o and fc1/fc2 with biases, 2 LayerNorms), the unfold
    # patch embedding 3·14·14·1408, class + 577 position embeddings, 2 LayerNorms, pixel-shuffle MLP 5632→4096→4096,
    # projector 4096→5120
    layer = 4 * (1408 * 1408 + 1408) + (1408 * 5632 + 5632) + (5632 * 1408 + 1408) + 4 * 1408
    vision = 34 * layer + 3 * 14 * 14 * 1408 + 1408 + 577 * 1408 + 4 * 1408 + 5632 * 4096 + 4096 * 4096 + 4096 * 5120
    assert arch.vision_params == vision == 871_932_416
    # + the 496,640 RMSNorm weights the arch count leaves out = 108,641,793,536: the model card's "109B"
    assert arch.param_count == 48 * moe_layer + 2 * EMBED_L4 + vision == 108_641_296_896
    assert arch.multimodal and arch.dtype == "bfloat16" and arch.derived_max_model_len == 10_485_760


def test_llama4_maverick_moe_on_every_second_layer(load_arch: LoadArch) -> None:
    arch = load_arch(MAVERICK)
    assert arch.num_experts == 128 and arch.moe_layers == tuple(range(1, 48, 2))
    moe_layer = ATTN_L4 + 128 * EXPERT_L4 + EXPERT_L4 + 128 * H_L4
    dense_layer = ATTN_L4 + DENSE_L4
    assert arch.layer_param_counts[:2] == (dense_layer, moe_layer)   # (layer_idx + 1) % 2 == 0 is MoE
    assert arch.param_count == 24 * dense_layer + 24 * moe_layer + 2 * EMBED_L4 + arch.vision_params
    assert arch.param_count == 401_583_284_736        # + 496,640 norm weights = 401.58 B: the card's "400B"


def test_llama4_chunked_local_layers_follow_no_rope_layers(load_arch: LoadArch) -> None:
    arch = load_arch(SCOUT)
    # no_rope_layers is empty in the config: transformers fills it with interval 4, so layers 3, 7, …, 47 are global
    # (NoPE) and the other 36 use chunked local attention of 8192 tokens (vLLM llama4.py: nope ⇔ no_rope_layers[i]==0)
    assert arch.attention_chunk_size == 8192
    assert arch.chunked_local_layers == tuple(i for i in range(48) if (i + 1) % 4)
    assert len(arch.chunked_local_layers) == 36
    # their KV is allocated as full attention: vLLM disables the hybrid KV cache manager for chunked local attention
    # by default and promotes ChunkedLocalAttentionSpec to FullAttentionSpec (kv_cache_planning.py)
    assert set(arch.layer_kinds) == {FULL} and not arch.is_hybrid
    assert "chunked-local" in arch.family and "MoE" in arch.family and "VLM" in arch.family


def test_llama4_explicit_no_rope_layers_and_interleave_step_zero() -> None:
    text = {"model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "intermediate_size": 32,
            "intermediate_size_mlp": 96, "num_local_experts": 4, "num_experts_per_tok": 1,
            "attention_chunk_size": 16, "no_rope_layers": [1, 0, 1, 0], "interleave_moe_layer_step": 0}
    arch = config_arch({"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                        "text_config": text})
    assert arch.chunked_local_layers == (0, 2)
    assert arch.moe_layers == ()          # vLLM: interleave_moe_layer_step > 0 and … — 0 means no MoE layer
    assert set(arch.layer_param_counts) == {64 * 16 * 4 * 2 + 2 * 64 * 2 * 16 + 3 * 64 * 96}
    no_chunks = config_arch({"model_type": "llama4", "text_config": {**text, "attention_chunk_size": None}})
    assert no_chunks.attention_chunk_size is None and no_chunks.chunked_local_layers == ()


def test_deepseek_v3_parameter_count_is_the_published_671b(load_arch: LoadArch) -> None:
    """DeepSeek-V3/R1: 671,026,419,200 parameters in the main model (the MTP layer's 14B are on top)."""
    for model in ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1"):
        arch = load_arch(model)
        assert (arch.num_layers, arch.hidden_size, arch.num_heads, arch.vocab_size) == (61, 7168, 128, 129280)
        assert (arch.num_experts, arch.experts_per_token, arch.moe_intermediate_size) == (256, 8, 2048)
        assert (arch.kv_lora_rank, arch.qk_rope_head_dim, arch.head_dim) == (512, 64, 576)
        assert arch.moe_layers == tuple(range(3, 61)) and arch.mtp_layers == 1
        assert arch.quantization is not None and arch.quantization.method == "fp8"
        # attention with q_lora_rank 1536: q_a 7168·1536 + q_b 1536·128·192 + kv_a 7168·576 + kv_b 512·128·256
        # + o 128·128·7168 (the q_a/kv_a norms are among the norms below)
        attn = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
        assert attn == 187_105_280
        expert = 3 * 7168 * 2048
        assert arch.layer_param_counts[0] == attn + 3 * 7168 * 18432
        assert arch.layer_param_counts[3] == attn + 256 * expert + expert + 256 * 7168
        # norms (2 × 7168 + 1536 + 512 per layer, + the final 7168) and the 58 × 256 router biases are not counted
        norms = 61 * (2 * 7168 + 1536 + 512) + 7168 + 58 * 256
        assert arch.param_count + norms == 671_026_419_200


def test_llama_405b_parameter_count(load_arch: LoadArch) -> None:
    arch = load_arch("meta-llama/Llama-3.1-405B-Instruct")
    assert (arch.num_layers, arch.hidden_size, arch.num_heads, arch.num_kv_heads) == (126, 16384, 128, 8)
    assert (arch.intermediate_size, arch.vocab_size) == (53248, 128256)
    norms = 126 * 2 * 16384 + 16384
    assert arch.param_count + norms == 405_853_388_800
    assert arch.total_size == 2 * 405_853_388_800


def test_granite_4_h_shared_expert_is_read_from_shared_intermediate_size(load_arch: LoadArch) -> None:
    """GraniteMoeHybridConfig names the shared expert's width `shared_intermediate_size` (vLLM 0.33
    granitemoeshared.py GraniteMoeSharedMLP: input_linear 4096 → 2 × 768, output_linear 768 → 4096)."""
    arch = load_arch("ibm-granite/granite-4.0-h-small")
    h = 4096
    assert arch.shared_expert_size == 768
    assert not arch.shared_expert_gate  # Qwen2-MoE's sigmoid gate only
    # the shared expert's gate/up + down in every one of the 40 MoE layers: 40 × 3 × 4096 × 768 parameters
    config = {k: v for k, v in _catalog_config("ibm-granite/granite-4.0-h-small").items()
              if k != "shared_intermediate_size"}
    plain = arch_from_config(config, model_id="granite-4.0-h-small without a shared expert")
    assert plain.shared_expert_size == 0
    assert [a - b for a, b in zip(arch.layer_param_counts, plain.layer_param_counts, strict=True)] == [3 * h * 768] * 40
    assert arch.param_count - plain.param_count == 40 * 3 * h * 768 == 377_487_360


def _catalog_config(model_id: str) -> dict[str, Any]:
    from vllm_operator.sources import load_model_files

    return dict(load_model_files(model_id, offline=True).config)
