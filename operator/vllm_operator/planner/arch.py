"""A model's architecture, read from the files a Hugging Face repository has.

`arch_from_config` turns a `config.json` (plus the checkpoint size from `model.safetensors.index.json`) into a
`ModelArch`: the handful of numbers vLLM's memory arithmetic needs. It follows vLLM's own readers
(`ModelConfig.get_head_size`, `get_total_num_kv_heads`, `_get_and_verify_max_len`) so that the figures match what
vLLM will compute on the real checkpoint. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ArchError(ValueError):
    """The config is not something we can plan for; the message names the missing or bad field."""


class LayerKind(StrEnum):
    FULL = "full"
    SLIDING = "sliding"
    CHUNKED = "chunked"
    LINEAR = "linear"  # linear attention (Gated DeltaNet) or mamba/SSM: a fixed state per sequence, no KV per token


# Fields transformers fills in from its config class when config.json omits them (the Gemma-3 multimodal
# configs ship a nearly empty text_config). Keyed by model_type; only what the arithmetic needs.
_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
        "max_position_embeddings": 131072, "sliding_window": 4096, "sliding_window_pattern": 6,
        "intermediate_size": 9216, "hidden_size": 2304, "num_hidden_layers": 26, "tie_word_embeddings": True,
    },
    "gemma2": {"sliding_window": 4096, "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
               "tie_word_embeddings": True},
    "gemma": {"tie_word_embeddings": True},
    "gemma3": {"tie_word_embeddings": True},
    "llama": {"vocab_size": 32000, "max_position_embeddings": 2048},
    "mistral": {"vocab_size": 32000, "max_position_embeddings": 131072},
    "qwen2": {"vocab_size": 151936, "max_position_embeddings": 32768},
}

# config keys that may bound the context length (vLLM's `_get_and_verify_max_len`)
_MAX_LEN_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)
_KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
_FP4_BITS = 4.5  # NVFP4 (ModelOpt, compressed-tensors nvfp4-pack-quantized): E2M1 values + one E4M3 scale per 16
_MXFP4_BITS = 4.25  # MXFP4 (OCP microscaling): E2M1 values + one E8M0 scale per 32
#: Module kinds a mixed-precision checkpoint's quantization groups target (Quantization.module_bits)
MODULE_KINDS = ("attention", "mlp", "experts", "shared_expert", "lm_head")
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float8": 1, "fp8": 1}


class Quantization(BaseModel):
    """What the checkpoint's `quantization_config` says, reduced to what sizes memory."""

    model_config = ConfigDict(frozen=True)

    method: str
    weight_bits: float = Field(description="bits per quantized weight element as stored, its scales included (the "
                                           "format's bit layout: NVFP4 4 + 8/16, MXFP4 4 + 8/32, INT4 with a 16-bit "
                                           "scale and a packed zero point per group g: 4 + 20/g)")
    group_size: int | None = None
    kv_cache_fp8: bool = Field(False, description="the checkpoint carries FP8 KV-cache scales (kv_cache_scheme)")
    module_bits: tuple[tuple[str, float], ...] = Field(
        (), description="mixed precision (quantization groups with explicit targets, e.g. ModelOpt MIXED_PRECISION: "
                        "FP8 attention + NVFP4 MLP): bits per weight of each module kind of MODULE_KINDS a group "
                        "targets; a kind not listed stays in the model dtype. Empty: every linear layer but the "
                        "LM head at weight_bits")

    def bits_for(self, kind: str) -> float | None:
        """Bits per weight of one module kind as stored; None where the module stays in the model dtype."""
        if not self.module_bits:
            return None if kind == "lm_head" else self.weight_bits
        return dict(self.module_bits).get(kind)


class ModelArch(BaseModel):
    """The numbers vLLM's memory arithmetic reads from a model's config."""

    model_config = ConfigDict(frozen=True)

    model_id: str
    model_type: str
    architectures: tuple[str, ...] = ()
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    derived_max_model_len: int = Field(description="the longest context vLLM accepts without an override")
    dtype: str = Field(description="the checkpoint's torch_dtype (what `--dtype auto` starts from)")
    tie_word_embeddings: bool = False
    layer_kinds: tuple[LayerKind, ...] = Field(description="the attention kind of every decoder layer")
    sliding_window: int | None = None
    # MoE
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    # MLA (DeepSeek-V2/V3, Kimi-K2): one latent of kv_lora_rank + qk_rope_head_dim per layer
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    # the MLA projections' other sizes (vLLM's LoRA wraps q_a/q_b or q, kv_a, kv_b and o; planner/lora.py)
    q_lora_rank: int | None = Field(None, description="MLA: the query's low rank (None: one full q_proj)")
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE layers besides the routed experts (LoRA wraps their linear layers too)
    shared_expert_size: int = Field(0, ge=0, description="intermediate width of a MoE layer's shared expert(s), split "
                                    "over TP like a dense MLP (DeepSeek: n_shared_experts x moe_intermediate_size; "
                                    "Qwen2-MoE: shared_expert_intermediate_size; Llama-4: the experts' size); 0 "
                                    "without them")
    shared_expert_gate: bool = Field(False, description="Qwen2-MoE: a hidden -> 1 gate on the shared expert")
    multimodal: bool = False
    # linear-attention / mamba layers: elements of one layer's per-sequence state (conv + recurrent), before TP
    state_elements: int = Field(0, description="per-sequence state elements of one linear/mamba layer (all ranks)")
    state_layer: StateLayer = Field(
        "", description="the kind of linear/mamba layer ('' without one, or one not recognised)")
    linear_key_head_dim: int = Field(0, ge=0, description="Gated DeltaNet: the key head dim (0 otherwise)")
    linear_value_heads: int = Field(0, ge=0, description="Gated DeltaNet: value heads, all ranks (0 otherwise)")
    linear_value_head_dim: int = Field(0, ge=0, description="Gated DeltaNet: the value head dim (0 otherwise)")
    yarn_unscaled_max_len: int | None = Field(
        None, description="the derived max_model_len without the YaRN factor (vLLM 0.30+); None without YaRN")
    quantization: Quantization | None = None
    total_size: int | None = Field(None, description="checkpoint bytes (model.safetensors.index.json)")
    total_size_estimated: bool = False
    param_count: int = Field(description="parameters estimated from the config")
    layer_param_counts: tuple[int, ...] = Field((), description="parameters of each decoder layer")
    mtp_layers: int = Field(0, ge=0, description="multi-token-prediction layers in the checkpoint "
                                                "(`num_nextn_predict_layers`, `mtp_num_hidden_layers`)")
    moe_layers: tuple[int, ...] = Field((), description="indices of the decoder layers with routed experts "
                                                        "(the others have a dense MLP)")
    routed_expert_params: int = Field(0, ge=0, description="parameters of ONE routed expert of one layer "
                                                           "(gate/up/down): what expert parallelism distributes")
    attention_chunk_size: int | None = Field(
        None, description="chunked local attention (Llama-4): tokens per chunk on the local layers")
    chunked_local_layers: tuple[int, ...] = Field(
        (), description="indices of the chunked-local attention layers; their KV is allocated as full attention "
                        "(vLLM disables the hybrid KV cache manager for chunked local attention by default)")
    vision_params: int = Field(0, ge=0, description="vision tower + projector parameters counted in param_count")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def dense_mlp_layer(self, index: int) -> bool:
        """Whether decoder layer `index` has a dense MLP: every layer of a dense model; of a MoE model those
        without routed experts (DeepSeek's first_k_dense_replace, Llama-4's layers between its MoE layers)."""
        return not self.is_moe or index not in self.moe_layers

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_hybrid(self) -> bool:
        return len(set(self.layer_kinds)) > 1

    @property
    def family(self) -> str:
        """A label for reports: attention family plus MoE/quantization."""
        parts = ["MLA" if self.is_mla else _attention_family(self.num_heads, self.num_kv_heads)]
        if LayerKind.LINEAR in self.layer_kinds:
            parts.append("hybrid-linear")
        elif self.is_hybrid:
            parts.append("hybrid-SWA")
        elif self.layer_kinds and self.layer_kinds[0] is LayerKind.SLIDING:
            parts.append("SWA")
        if self.chunked_local_layers:
            parts.append("chunked-local")
        if self.is_moe:
            parts.append("MoE")
        if self.multimodal:
            parts.append("VLM")
        if self.quantization:
            parts.append(self.quantization.method)
        return " ".join(parts)


def _attention_family(heads: int, kv_heads: int) -> str:
    if kv_heads == heads:
        return "MHA"
    return "MQA" if kv_heads == 1 else "GQA"


def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Multimodal configs nest the language model under text_config/llm_config; merge it over the top level."""
    merged: dict[str, Any] = {}
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, Mapping):
            defaults = _TYPE_DEFAULTS.get(str(sub.get("model_type", "")), {})
            merged = {**defaults, **{k: v for k, v in config.items() if k != key}, **sub}
            return merged
    defaults = _TYPE_DEFAULTS.get(str(config.get("model_type", "")), {})
    return {**defaults, **config}


def _int(cfg: Mapping[str, Any], key: str, *, model_id: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ArchError(f"{model_id}: config.json has no '{key}' (needed to size memory)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ArchError(f"{model_id}: config.json field '{key}' must be a positive number, got {value!r}")
    return int(value)


def _first_int(cfg: Mapping[str, Any], keys: tuple[str, ...], *, model_id: str) -> int:
    """The first of several synonyms present (GPT-2 style configs say n_layer); errors name the usual one."""
    for key in keys:
        if key in cfg:
            return _int(cfg, key, model_id=model_id)
    return _int(cfg, keys[0], model_id=model_id)


def _kv_heads(cfg: Mapping[str, Any], heads: int, model_id: str) -> int:
    for key in _KV_HEAD_KEYS:
        if cfg.get(key) is not None:
            return _int(cfg, key, model_id=model_id)
    return heads


def _kind_of(layer_type: object) -> LayerKind:
    """One entry of `layer_types` / `layers_block_type`: 'full_attention', 'sliding_attention', 'linear_attention',
    'mamba', 'attention', …"""
    text = str(layer_type).lower()
    if "linear" in text or "mamba" in text or "ssm" in text or "deltanet" in text:
        return LayerKind.LINEAR
    if "sliding" in text:
        return LayerKind.SLIDING
    return LayerKind.CHUNKED if "chunk" in text else LayerKind.FULL


def _layer_kinds(cfg: Mapping[str, Any], layers: int, model_type: str) -> tuple[tuple[LayerKind, ...], int | None]:
    """Which layers use sliding-window attention or hold a linear-attention/mamba state, as vLLM builds them."""
    window = cfg.get("sliding_window")
    window = int(window) if isinstance(window, int) and window > 0 else None
    for key in ("layer_types", "layers_block_type"):  # Qwen3-Next/3.5, Gemma-3, gpt-oss; Bamba/Granite-4
        layer_types = cfg.get(key)
        if isinstance(layer_types, list) and len(layer_types) == layers:
            kinds = tuple(_kind_of(t) for t in layer_types)
            return kinds, window if LayerKind.SLIDING in kinds else None
    interval = cfg.get("full_attention_interval")  # Qwen3-Next: every interval-th layer is full attention
    if isinstance(interval, int) and not isinstance(interval, bool) and interval > 1:
        return tuple(LayerKind.FULL if (i + 1) % interval == 0 else LayerKind.LINEAR for i in range(layers)), None
    period, offset = cfg.get("attn_layer_period"), cfg.get("attn_layer_offset")  # Jamba
    if isinstance(period, int) and isinstance(offset, int) and period > 0 and not isinstance(period, bool):
        return tuple(LayerKind.FULL if i % period == offset else LayerKind.LINEAR for i in range(layers)), None
    if window is None:
        return (LayerKind.FULL,) * layers, None
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_5_vl") and not cfg.get(
        "use_sliding_window", False
    ):
        return (LayerKind.FULL,) * layers, None
    if model_type == "gemma2":  # even layers local, odd layers global
        return tuple(LayerKind.SLIDING if i % 2 == 0 else LayerKind.FULL for i in range(layers)), window
    pattern = cfg.get("sliding_window_pattern")
    if model_type.startswith("gemma3") and not isinstance(pattern, int):
        pattern = 6
    if isinstance(pattern, int) and pattern > 1:  # every pattern-th layer is global
        return tuple(LayerKind.FULL if (i + 1) % pattern == 0 else LayerKind.SLIDING for i in range(layers)), window
    return (LayerKind.SLIDING,) * layers, window  # e.g. Mistral-7B-v0.1: every layer windowed


StateLayer = Literal["", "gated_deltanet", "mamba2", "mamba1"]


def _state_layer(cfg: Mapping[str, Any]) -> tuple[StateLayer, int]:
    """Which kind of state layer the linear layers are ('gated_deltanet', 'mamba2', 'mamba1'; '' for none known) and,
    for Gated DeltaNet, its key head dim (vLLM 0.33 picks FlashInfer's GDN prefill on Blackwell only at 128)."""
    def num(*keys: str) -> int:
        for key in keys:
            value = cfg.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return 0

    if num("linear_num_value_heads"):
        return "gated_deltanet", num("linear_key_head_dim") or 128
    if num("mamba_n_heads", "mamba_num_heads"):
        return "mamba2", 0
    if num("mamba_d_state", "ssm_state_size", "state_size", "d_state"):
        return "mamba1", 0
    return "", 0


def _gdn_values(cfg: Mapping[str, Any]) -> tuple[int, int]:
    """Gated DeltaNet's value heads (all ranks) and value head dim; (0, 0) for other layers."""
    heads, dim = cfg.get("linear_num_value_heads"), cfg.get("linear_value_head_dim", 128)
    if not isinstance(heads, int) or isinstance(heads, bool) or heads <= 0:
        return 0, 0
    return heads, dim if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0 else 128


def _state_elements(cfg: Mapping[str, Any], hidden: int) -> int:
    """Elements of one linear-attention/mamba layer's per-sequence state (vLLM's MambaStateShapeCalculator), all TP
    ranks together: conv state (kernel − 1) × conv channels plus the recurrent state."""
    def num(*keys: str, default: int = 0) -> int:
        for key in keys:
            value = cfg.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return default

    if num("linear_num_value_heads"):  # Gated DeltaNet (gated_delta_net_state_shape)
        nk, nv = num("linear_num_key_heads", default=num("linear_num_value_heads")), num("linear_num_value_heads")
        dk, dv = num("linear_key_head_dim", default=128), num("linear_value_head_dim", default=128)
        kernel = num("linear_conv_kernel_dim", default=4)
        return (kernel - 1) * (2 * nk * dk + nv * dv) + nv * dk * dv
    d_state = num("mamba_d_state", "ssm_state_size", "state_size", "d_state")
    if not d_state:
        return 0
    kernel = num("mamba_d_conv", "conv_kernel", "d_conv", default=4)
    inner = num("mamba_expand", "expand", default=2) * hidden
    heads = num("mamba_n_heads", "mamba_num_heads")
    if heads:  # mamba2_state_shape: conv over inner + 2·groups·d_state, state heads × head_dim × d_state
        head_dim = num("mamba_d_head", "mamba_head_dim", default=inner // heads)
        inner = heads * head_dim
        groups = num("mamba_n_groups", "n_groups", default=1)
        return (kernel - 1) * (inner + 2 * groups * d_state) + heads * head_dim * d_state
    return (kernel - 1) * inner + inner * d_state  # mamba1_state_shape


def _yarn_unscaled(cfg: Mapping[str, Any]) -> int | None:
    """The derived length vLLM 0.30+ uses for YaRN models (config/model.py::_get_and_verify_max_len no longer applies
    the factor): the smallest length key; None when the config has no YaRN scaling."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, Mapping):
        return None
    if str(rope.get("rope_type", rope.get("type", ""))) not in ("yarn", "deepseek_yarn", "deepseek_llama_scaling"):
        return None
    lengths = [int(cfg[k]) for k in _MAX_LEN_KEYS if isinstance(cfg.get(k), (int, float)) and cfg[k] > 0]
    return min(lengths) if lengths else 2048


def _derived_max_len(cfg: Mapping[str, Any], model_type: str) -> int:
    """vLLM's derived max_model_len: the smallest length key, scaled by the rope factor where vLLM does (≤ 0.29)."""
    lengths = [int(cfg[k]) for k in _MAX_LEN_KEYS if isinstance(cfg.get(k), (int, float)) and cfg[k] > 0]
    length = min(lengths) if lengths else 2048
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rope, Mapping):
        rope_type = str(rope.get("rope_type", rope.get("type", "")))
        factor = rope.get("factor")
        if rope_type == "yarn" and isinstance(rope.get("original_max_position_embeddings"), int):
            length = int(rope["original_max_position_embeddings"] * (factor or 1))
        elif (
            isinstance(factor, (int, float))
            and rope_type not in ("llama3", "longrope", "su", "mrope", "default", "")
            and not model_type.startswith("gemma3")
            and "original_max_position_embeddings" not in rope
        ):
            length = int(length * factor)
    return length


def _int_bits(bits: float, group: Any, symmetric: bool = False) -> float:
    """Stored bits per weight of a group-quantized integer format: the values, a 16-bit scale per group and (unless
    symmetric) a zero point of the same width, packed (AWQ/GPTQ qzeros, compressed-tensors pack-quantized)."""
    if not isinstance(group, int) or isinstance(group, bool) or group <= 0:
        return bits  # per-channel: one scale per output row, negligible per weight
    return bits + (16 + (0 if symmetric else bits)) / group


def _group_bits(weights: Mapping[str, Any]) -> float:
    """Stored bits per weight of one compressed-tensors / ModelOpt quantization group, from its bit layout."""
    bits = float(weights.get("num_bits", 8))
    group = weights.get("group_size")
    if weights.get("type") == "float":
        if bits == 4:  # FP4 (E2M1) with a block scale: NVFP4 E4M3 per 16, MXFP4 E8M0 per 32
            return _MXFP4_BITS if group == 32 else _FP4_BITS
        return bits  # FP8: per-tensor / per-channel / 128x128-block fp32 scales, negligible per weight
    return _int_bits(bits, group, bool(weights.get("symmetric", True)))


def _target_kind(target: str) -> str:
    """The module kind a quantization target names ('model.layers.0.mlp.experts', 're:.*self_attn.*', 'Linear')."""
    text = target.lower()
    for kind, words in (("lm_head", ("lm_head",)), ("shared_expert", ("shared_expert",)), ("experts", ("experts",)),
                        ("attention", ("attn", "attention")), ("mlp", ("mlp", "feed_forward", "ffn"))):
        if any(word in text for word in words):
            return kind
    return "linear"  # a class name ('Linear') or a catch-all pattern: every linear layer


def _mixed_bits(groups: Mapping[str, Any], ignore: Any) -> tuple[tuple[str, float], ...]:
    """Bits per module kind from groups with explicit targets; the wider format wins where two groups name one kind
    (the estimate errs towards more weight memory)."""
    bits: dict[str, float] = {}
    for group in groups.values():
        if not isinstance(group, Mapping) or not isinstance(group.get("weights"), Mapping):
            continue
        value = _group_bits(group["weights"])
        for target in group.get("targets") or ():
            kind = _target_kind(str(target))
            kinds = [k for k in MODULE_KINDS if k != "lm_head"] if kind == "linear" else [kind]
            for k in kinds:
                bits[k] = max(bits.get(k, 0.0), value)
    ignored = " ".join(str(i) for i in ignore) if isinstance(ignore, list) else ""
    if "lm_head" in ignored:
        bits.pop("lm_head", None)
    return tuple(sorted(bits.items()))


def _quantization(config: Mapping[str, Any]) -> Quantization | None:
    q = config.get("quantization_config") or config.get("compression_config")
    if not isinstance(q, Mapping):
        return None
    method = str(q.get("quant_method", "unknown")).lower()
    kv_fp8 = isinstance(q.get("kv_cache_scheme"), Mapping) or q.get("kv_cache_quant_algo") in ("FP8", "fp8")
    groups = q.get("config_groups")
    mixed = _mixed_bits(groups, q.get("ignore")) if isinstance(groups, Mapping) else ()
    if len({bits for _, bits in mixed}) > 1 or (mixed and method in ("modelopt", "compressed-tensors")
                                                  and any(kind == "lm_head" for kind, _ in mixed)):
        bulk = max(bits for _, bits in mixed)
        return Quantization(method=method, weight_bits=bulk, module_bits=mixed, kv_cache_fp8=kv_fp8)
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "marlin"):
        bits = float(q.get("bits", q.get("w_bit", 4)))
        group = q.get("group_size", q.get("q_group_size"))
        symmetric = method.startswith("gptq") and bool(q.get("sym", False))
        return Quantization(method=method, weight_bits=_int_bits(bits, group, symmetric), group_size=group,
                            kv_cache_fp8=kv_fp8)
    if method in ("fp8", "fbgemm_fp8", "modelopt"):
        nested = q.get("quantization")
        algo = str(q.get("quant_algo") or (nested.get("quant_algo") if isinstance(nested, Mapping) else "") or "")
        if "FP4" in algo.upper():  # ModelOpt NVFP4: 4-bit values + an FP8 (E4M3) scale per 16 → 4.5 bits
            return Quantization(method="modelopt_fp4", weight_bits=_FP4_BITS, group_size=16, kv_cache_fp8=kv_fp8)
        return Quantization(method=method, weight_bits=8.0, kv_cache_fp8=kv_fp8)
    if method == "mxfp4":
        return Quantization(method=method, weight_bits=_MXFP4_BITS)
    if method == "bitsandbytes":
        bits = 4.0 if q.get("load_in_4bit") else 8.0
        return Quantization(method=method, weight_bits=bits, group_size=64 if bits == 4 else None)
    if method == "compressed-tensors":
        bits, group = 8.0, None
        for group_cfg in (groups or {}).values():
            weights = group_cfg.get("weights") or {}
            bits, group = _group_bits(weights), weights.get("group_size", group)
        if mixed:  # one format for every targeted kind
            bits = mixed[0][1]
        return Quantization(method=method, weight_bits=bits, group_size=group, kv_cache_fp8=kv_fp8)
    bits = q.get("bits") or q.get("weight_bits") or 8
    return Quantization(method=method, weight_bits=float(bits), group_size=q.get("group_size"), kv_cache_fp8=kv_fp8)


def _param_count(a: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
    """Parameters implied by the config: the total (embeddings, attention, MLP/experts, lm_head) and per layer."""
    h, layers, vocab = a["hidden_size"], a["num_layers"], a["vocab_size"]
    if a["kv_lora_rank"] is not None:
        q_head = a["head_dim_qk"]
        q_lora = a["q_lora_rank"]  # DeepSeek-V3/R1: q_a_proj (h × q_lora) then q_b_proj (q_lora × heads·q_head)
        attn = (h * q_lora + q_lora * a["num_heads"] * q_head if q_lora else h * a["num_heads"] * q_head)
        attn += h * (a["kv_lora_rank"] + a["qk_rope_head_dim"])
        attn += a["kv_lora_rank"] * a["num_heads"] * (a["qk_nope_head_dim"] + a["v_head_dim"])
        attn += a["num_heads"] * a["v_head_dim"] * h
    else:
        attn = h * a["head_dim"] * (2 * a["num_heads"] + 2 * a["num_kv_heads"])
        if a["attn_output_gate"]:  # Qwen3-Next/3.5: q_proj also yields the output gate (2 x heads x head_dim)
            attn += h * a["head_dim"] * a["num_heads"]
    linear = a["linear_attn_params"] or attn
    kinds = a["layer_kinds"]
    layer_attn = [linear if i < len(kinds) and kinds[i] is LayerKind.LINEAR else attn for i in range(layers)]
    mlp_mult = 3 if a["gated"] else 2
    dense_mlp = mlp_mult * h * a["intermediate_size"]
    if a["num_experts"]:
        moe = a["num_experts"] * mlp_mult * h * a["moe_intermediate_size"] + a["num_experts"] * h
        moe += a["shared_experts"] * mlp_mult * h * a["moe_intermediate_size"] + a["shared_expert_size"] * mlp_mult * h
        moe_layers = set(a["moe_layers"])
        per_layer = tuple(int(layer_attn[i] + (moe if i in moe_layers else dense_mlp)) for i in range(layers))
    else:
        per_layer = tuple(int(layer_attn[i] + dense_mlp) for i in range(layers))
    embed = vocab * h * (1 if a["tie"] else 2)
    return int(sum(per_layer) + embed + a["vision_params"]), per_layer


def arch_from_config(
    config: Mapping[str, Any],
    *,
    model_id: str,
    total_size: int | None = None,
    total_size_estimated: bool = False,
) -> ModelArch:
    """Read a Hugging Face `config.json` (dict) into a `ModelArch`. Raises `ArchError` naming the bad field."""
    if not isinstance(config, Mapping):
        raise ArchError(f"{model_id}: config.json must be a JSON object")
    cfg = _text_config(config)
    model_type = str(cfg.get("model_type") or config.get("model_type") or "unknown")
    layers = _first_int(cfg, ("num_hidden_layers", "n_layer", "num_layers"), model_id=model_id)
    hidden = _first_int(cfg, ("hidden_size", "n_embd", "d_model"), model_id=model_id)
    heads = _first_int(cfg, ("num_attention_heads", "n_head"), model_id=model_id)
    vocab = _int(cfg, "vocab_size", model_id=model_id)
    raw_lora = cfg.get("kv_lora_rank")
    kv_lora = raw_lora if isinstance(raw_lora, int) and raw_lora > 0 else 0
    is_mla = kv_lora > 0
    if is_mla:
        rope_dim = _int(cfg, "qk_rope_head_dim", model_id=model_id)
        head_dim = kv_lora + rope_dim
        kv_heads = 1
    else:
        rope_dim = 0
        explicit = cfg.get("head_dim")
        head_dim = int(explicit) if isinstance(explicit, int) and explicit > 0 else hidden // heads
        kv_heads = _kv_heads(cfg, heads, model_id)
    if not is_mla and heads % kv_heads:
        raise ArchError(f"{model_id}: num_attention_heads ({heads}) is not a multiple of the KV heads ({kv_heads})")
    intermediate = int(cfg.get("intermediate_size") or cfg.get("ffn_dim") or cfg.get("n_inner") or 4 * hidden)
    num_experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or cfg.get("moe_topk") or 0)
    moe_inter = int(cfg.get("moe_intermediate_size") or (intermediate if num_experts else 0))
    mlp_size = cfg.get("intermediate_size_mlp")  # Llama-4: intermediate_size is the experts', this the dense MLP's
    if num_experts and isinstance(mlp_size, int) and not isinstance(mlp_size, bool) and mlp_size > 0:
        intermediate = mlp_size
    moe_layers = _moe_layers(cfg, layers, num_experts)
    chunk, chunked = _chunked_local(cfg, layers)
    kinds, window = _layer_kinds(cfg, layers, model_type)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or "bfloat16")
    dtype = dtype.replace("torch.", "")
    hidden_act = str(cfg.get("hidden_act") or cfg.get("hidden_activation") or cfg.get("activation_function") or "")
    gated = model_type not in ("phi", "gpt2", "gpt_neox", "starcoder2", "falcon", "opt", "bloom") or "glu" in hidden_act
    tie = bool(cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    shared_experts = _shared_experts(cfg, model_type)
    shared_size = _shared_expert_width(cfg)
    counts = {
        "hidden_size": hidden, "num_layers": layers, "vocab_size": vocab, "num_heads": heads,
        "num_kv_heads": kv_heads, "head_dim": head_dim, "intermediate_size": intermediate,
        "num_experts": num_experts, "moe_intermediate_size": moe_inter, "gated": gated, "tie": tie,
        "shared_experts": shared_experts, "shared_expert_size": shared_size,
        "moe_layers": moe_layers, "vision_params": _vision_params(config),
        "q_lora_rank": int(cfg.get("q_lora_rank") or 0),
        "kv_lora_rank": kv_lora if is_mla else None, "qk_rope_head_dim": rope_dim,
        "qk_nope_head_dim": int(cfg.get("qk_nope_head_dim") or 0), "v_head_dim": int(cfg.get("v_head_dim") or 0),
        "head_dim_qk": int(cfg.get("qk_nope_head_dim") or 0) + rope_dim,
        "layer_kinds": kinds, "attn_output_gate": bool(cfg.get("attn_output_gate")),
        "linear_attn_params": _linear_attn_params(cfg, hidden) if LayerKind.LINEAR in kinds else 0,
    }
    total_params, layer_params = _param_count(counts)
    return ModelArch(
        model_id=model_id,
        model_type=model_type,
        architectures=tuple(str(a) for a in config.get("architectures") or ()),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        intermediate_size=intermediate,
        derived_max_model_len=_derived_max_len(cfg, model_type),
        dtype=dtype,
        tie_word_embeddings=tie,
        layer_kinds=kinds,
        sliding_window=window,
        num_experts=num_experts,
        experts_per_token=top_k,
        moe_intermediate_size=moe_inter,
        kv_lora_rank=kv_lora if is_mla else None,
        qk_rope_head_dim=rope_dim if is_mla else None,
        q_lora_rank=_q_lora_rank(cfg) if is_mla else None,
        qk_nope_head_dim=counts["qk_nope_head_dim"] if is_mla else 0,
        v_head_dim=counts["v_head_dim"] if is_mla else 0,
        shared_expert_size=_shared_width(counts) if num_experts else 0,
        shared_expert_gate=bool(num_experts and model_type == "qwen2_moe" and shared_size),
        multimodal=any(isinstance(config.get(k), Mapping) for k in ("vision_config", "audio_config")),
        state_elements=_state_elements(cfg, hidden) if LayerKind.LINEAR in kinds else 0,
        state_layer=_state_layer(cfg)[0] if LayerKind.LINEAR in kinds else "",
        linear_key_head_dim=_state_layer(cfg)[1] if LayerKind.LINEAR in kinds else 0,
        linear_value_heads=_gdn_values(cfg)[0] if LayerKind.LINEAR in kinds else 0,
        linear_value_head_dim=_gdn_values(cfg)[1] if LayerKind.LINEAR in kinds else 0,
        yarn_unscaled_max_len=_yarn_unscaled(cfg),
        quantization=_quantization(config) or _quantization(cfg),
        total_size=total_size,
        total_size_estimated=total_size_estimated,
        param_count=total_params,
        layer_param_counts=layer_params,
        mtp_layers=_mtp_layers(cfg),
        moe_layers=moe_layers,
        routed_expert_params=(3 if gated else 2) * hidden * moe_inter if num_experts else 0,
        attention_chunk_size=chunk,
        chunked_local_layers=chunked,
        vision_params=counts["vision_params"],
    )


def _moe_layers(cfg: Mapping[str, Any], layers: int, num_experts: int) -> tuple[int, ...]:
    """Which decoder layers route to experts, as vLLM builds them: Llama-4 every `interleave_moe_layer_step`-th
    layer (`llama4.py`: `(layer_idx + 1) % step == 0`; Scout 1 = all, Maverick 2 = the odd ones); DeepSeek and Kimi
    all layers from `first_k_dense_replace` on; every layer otherwise."""
    if not num_experts:
        return ()
    step = cfg.get("interleave_moe_layer_step")
    if isinstance(step, int) and not isinstance(step, bool):
        return tuple(i for i in range(layers) if step > 0 and (i + 1) % step == 0)
    first = cfg.get("first_k_dense_replace")
    first = first if isinstance(first, int) and not isinstance(first, bool) and first > 0 else 0
    return tuple(range(first, layers))


def _shared_width(counts: Mapping[str, Any]) -> int:
    """The shared expert's intermediate width: n_shared × the experts' (DeepSeek, Llama-4) plus Qwen2-MoE's own."""
    return int(counts["shared_experts"]) * int(counts["moe_intermediate_size"]) + int(counts["shared_expert_size"])


def _shared_expert_width(cfg: Mapping[str, Any]) -> int:
    """The intermediate width of a shared-expert MLP beside the routed experts: Qwen2-MoE's
    `shared_expert_intermediate_size`; Granite MoE / granite-4.0-h's `shared_intermediate_size` (vLLM 0.33
    granitemoeshared.py `GraniteMoeSharedMLP`: input_linear hidden → 2 × width, output_linear width → hidden,
    built by granitemoehybrid.py when `shared_intermediate_size` is not 0)."""
    for key in ("shared_expert_intermediate_size", "shared_intermediate_size"):
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _shared_experts(cfg: Mapping[str, Any], model_type: str) -> int:
    """Shared experts of one MoE layer (of the routed experts' size): DeepSeek's `n_shared_experts`; Llama-4 has one
    (`llama4.py`: `shared_expert = LlamaMLP(intermediate_size)`, `n_shared_experts = 1`)."""
    if model_type == "llama4_text" or (model_type == "llama4" and cfg.get("num_local_experts")):
        return 1
    value = cfg.get("n_shared_experts")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _chunked_local(cfg: Mapping[str, Any], layers: int) -> tuple[int | None, tuple[int, ...]]:
    """Llama-4's chunked local attention: `attention_chunk_size` tokens per chunk on the layers that use RoPE.

    vLLM (`llama4.py`): a layer is global (NoPE, full attention) when `no_rope_layers[i] == 0`, else chunked-local.
    transformers' Llama4TextConfig fills an empty `no_rope_layers` with `int((i + 1) % no_rope_layer_interval != 0)`
    (interval 4): layers 3, 7, 11, … are global, the other three in four chunked-local.
    """
    chunk = cfg.get("attention_chunk_size")
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk <= 0:
        return None, ()
    flags = cfg.get("no_rope_layers")
    if not isinstance(flags, list) or len(flags) != layers:
        interval = cfg.get("no_rope_layer_interval", 4)
        interval = interval if isinstance(interval, int) and not isinstance(interval, bool) and interval > 0 else 4
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    return chunk, tuple(i for i, uses_rope in enumerate(flags) if uses_rope != 0)


def _linear_attn_params(cfg: Mapping[str, Any], hidden: int) -> int:
    """Parameters of one Gated DeltaNet layer (vLLM's Qwen3-Next / Qwen3.5 GatedDeltaNet): in_proj_qkvz (hidden ->
    q, k of nk x dk, v and z of nv x dv), in_proj_ba (hidden -> 2 x nv), the causal conv1d over q, k, v (kernel taps
    per channel), A_log and dt_bias (nv each), the gated RMSNorm (dv) and out_proj (nv x dv -> hidden). 0 for other
    linear/mamba layers (their attention-sized estimate stands)."""
    def num(key: str, default: int = 0) -> int:
        value = cfg.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default

    nv = num("linear_num_value_heads")
    if not nv:
        return 0
    nk, dk, dv = num("linear_num_key_heads", nv), num("linear_key_head_dim", 128), num("linear_value_head_dim", 128)
    kernel = num("linear_conv_kernel_dim", 4)
    conv_channels = 2 * nk * dk + nv * dv
    return (hidden * (conv_channels + nv * dv) + hidden * 2 * nv + conv_channels * kernel + 2 * nv + dv
            + nv * dv * hidden)


def _qwen3_vision_params(vision: Mapping[str, Any]) -> int:
    """Parameters of the Qwen3-VL / Qwen3.5 vision tower (vLLM's Qwen3_VisionTransformer): the 3-D patch embedding
    (channels x temporal x patch^2 -> hidden, with bias), the learned position embeddings, `depth` blocks (qkv and
    proj with biases, fc1/fc2 with biases, two LayerNorms), and the patch merger (LayerNorm, hidden x merge^2 ->
    itself -> out_hidden_size, with biases), once more per deepstack index."""
    try:
        h, inter, depth = int(vision["hidden_size"]), int(vision["intermediate_size"]), int(vision["depth"])
        out, patch = int(vision["out_hidden_size"]), int(vision["patch_size"])
        temporal, channels = int(vision.get("temporal_patch_size", 2)), int(vision.get("in_channels", 3))
        positions, merge = int(vision.get("num_position_embeddings", 0)), int(vision.get("spatial_merge_size", 2))
    except (KeyError, TypeError, ValueError):
        return 0
    if min(h, inter, depth, out, patch, temporal, channels, merge) <= 0 or max(
            h, inter, depth, out, patch, positions, merge * merge * h) > 2**17:
        return 0
    block = (3 * h * h + 3 * h) + (h * h + h) + (h * inter + inter) + (inter * h + h) + 4 * h
    merged = h * merge * merge
    merger = 2 * h + merged * merged + merged + merged * out + out
    deepstack = vision.get("deepstack_visual_indexes")
    mergers = 1 + (len(deepstack) if isinstance(deepstack, list) and len(deepstack) <= depth else 0)
    return channels * temporal * patch * patch * h + h + positions * h + depth * block + mergers * merger


def _vision_params(config: Mapping[str, Any]) -> int:
    """Parameters of the Llama-4 vision tower and projector (transformers' modeling_llama4): patch embedding (an
    unfold Linear, no bias), class and position embeddings, pre/post LayerNorms, `num_hidden_layers` encoder layers
    (q/k/v/o and fc1/fc2 with biases, two LayerNorms), the pixel-shuffle MLP (intermediate → projector_input_dim →
    projector_output_dim, no biases) and the projector to the text hidden size. 0 for other vision towers (their
    rows carry the tower in total_size only; the Qwen3-VL / Qwen3.5 tower: _qwen3_vision_params)."""
    vision, text = config.get("vision_config"), config.get("text_config")
    if not isinstance(vision, Mapping):
        return 0
    if str(vision.get("model_type", "")).startswith(("qwen3_vl", "qwen3_5")):
        return _qwen3_vision_params(vision)
    if vision.get("model_type") != "llama4_vision_model":
        return 0
    try:
        h, inter, layers = int(vision["hidden_size"]), int(vision["intermediate_size"]), int(vision["num_hidden_layers"])
        patch, image = int(vision["patch_size"]), int(vision["image_size"])
        channels = int(vision.get("num_channels", 3))
        proj_in, proj_out = int(vision["projector_input_dim"]), int(vision["projector_output_dim"])
        out_dim = int(vision.get("vision_output_dim", proj_out))
        text_hidden = int(text["hidden_size"]) if isinstance(text, Mapping) else 0
    except (KeyError, TypeError, ValueError):
        return 0
    if min(h, inter, layers, patch, image, channels, proj_in, proj_out, out_dim) <= 0 or max(
            h, inter, layers, patch, image, proj_in, proj_out, out_dim) > 2**17:
        return 0
    encoder_layer = 4 * (h * h + h) + (h * inter + inter) + (inter * h + h) + 4 * h
    positions = (image // patch) ** 2 + 1
    stem = channels * patch * patch * h + h + positions * h + 4 * h
    adapter = inter * proj_in + proj_out * proj_out
    return layers * encoder_layer + stem + adapter + out_dim * text_hidden


def _q_lora_rank(cfg: Mapping[str, Any]) -> int | None:
    value = cfg.get("q_lora_rank")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _mtp_layers(cfg: Mapping[str, Any]) -> int:
    """MTP layers the checkpoint carries (vllm/config/speculative.py reads the same two fields per model type)."""
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 64:
            return value
    return 0


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a torch dtype name ('bfloat16', 'float32', 'fp8', …)."""
    return _DTYPE_BYTES.get(dtype.replace("torch.", "").lower(), 2)


def module_params(arch: ModelArch) -> dict[str, int]:
    """The parameter count split by module kind (MODULE_KINDS, plus 'embed' and 'vision'): the routed experts, shared
    experts and dense MLPs from their widths (gated: gate + up + down), the LM head when untied, and the rest of the
    decoder layers (attention, norms, routers) as 'attention'."""
    h = arch.hidden_size
    embed = arch.vocab_size * h
    moe = len(arch.moe_layers) if arch.is_moe else 0
    experts = arch.routed_expert_params * arch.num_experts * moe
    shared = 3 * h * arch.shared_expert_size * moe
    mlp = 3 * h * arch.intermediate_size * (arch.num_layers - moe)
    head = 0 if arch.tie_word_embeddings else embed
    rest = max(arch.param_count - arch.vision_params - embed - head - experts - shared - mlp, 0)
    return {"embed": embed, "lm_head": head, "experts": experts, "shared_expert": shared, "mlp": mlp,
            "attention": rest, "vision": arch.vision_params}


def lm_head_bytes_per_param(arch: ModelArch) -> float:
    """Bytes one LM-head weight takes as stored (and as vLLM holds it): quantized where a mixed-precision checkpoint's
    groups target it (ModelOpt quantizes ParallelLMHead), else 16-bit."""
    bits = arch.quantization.bits_for("lm_head") if arch.quantization is not None else None
    return bits / 8 if bits is not None else 2.0


def checkpoint_bytes(arch: ModelArch) -> int:
    """The checkpoint's size: the index's total_size, else an estimate from the parameter count and the format's
    bit layout (Quantization.weight_bits includes the block scales), module by module for mixed precision."""
    if arch.total_size:
        return arch.total_size
    q = arch.quantization
    if q is not None:
        parts = module_params(arch)
        total = 0.0
        for kind, count in parts.items():
            bits = q.bits_for(kind) if kind in MODULE_KINDS else None
            total += count * (bits / 8 if bits is not None else 2.0)
        return int(total)
    return int(arch.param_count * dtype_bytes(arch.dtype))


def gib(n_bytes: float) -> float:
    return n_bytes / 2**30


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = [
    "ArchError", "LayerKind", "MODULE_KINDS", "ModelArch", "Quantization", "arch_from_config", "checkpoint_bytes",
    "dtype_bytes", "gib", "ceil_div", "lm_head_bytes_per_param", "module_params",
]


# Bounds on architecture values, checked before any arithmetic so that one plan is bounded in time and memory.
# Each is far above any released model (largest known: 160 layers, hidden 25600 for dense / 16384 MoE, vocabulary
# 262144, 512 routed experts, 10M context) and far below what makes the planner loop or overflow.
ARCH_BOUNDS: dict[str, int] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers", "first_k_dense_replace"), 1024),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model"), 131072),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_key_value_heads", "n_head_kv", "num_kv_heads",
                     "multi_query_group_num", "num_attention_groups"), 4096),
    **dict.fromkeys(("head_dim", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                     "v_head_dim"), 65536),
    "vocab_size": 2**23,
    **dict.fromkeys(("intermediate_size", "ffn_dim", "n_inner", "moe_intermediate_size",
                     "shared_expert_intermediate_size", "shared_intermediate_size"), 2**20),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                     "experts_per_token", "moe_topk", "n_shared_experts"), 4096),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "seq_length", "max_seq_len", "max_sequence_length",
                     "model_max_length", "sliding_window", "original_max_position_embeddings",
                     "max_target_positions", "max_seq_length", "seq_len"), 2**27),
    "sliding_window_pattern": 1024,
    "interleave_moe_layer_step": 1024,
    "attention_chunk_size": 2**27,
    "no_rope_layer_interval": 1024,
    **dict.fromkeys(("intermediate_size_mlp", "q_lora_rank"), 2**20),
}
#: The rope scaling factor (real ones: up to 64).
MAX_ROPE_FACTOR = 1024
#: Lists in a config (layer_types, ...): never longer than the most layers.
MAX_CONFIG_LIST = 1024


def check_arch_bounds(config: Any, *, model_id: str) -> None:
    """Refuse a config.json whose architecture values are out of range, before any arithmetic on them.

    Raises `ArchError` naming the field, the value and the bound. Looks at the top level and the nested text
    configs (text_config, llm_config, language_config), where `arch_from_config` reads them.
    """
    if not isinstance(config, Mapping):
        raise ArchError(f"{model_id}: config.json must be a JSON object")
    scopes: list[tuple[str, Mapping[str, Any]]] = [("", config)]
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, Mapping):
            scopes.append((f"{key}.", sub))
    for prefix, scope in scopes:
        for key, bound in ARCH_BOUNDS.items():
            value = scope.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ArchError(f"{model_id}: config.json field '{prefix}{key}' must be a number, got {value!r:.40}")
            if not -1 <= value <= bound:  # NaN and infinities fail the comparison too
                raise ArchError(f"{model_id}: config.json field '{prefix}{key}' is {value!r:.40}, outside 0..{bound}; "
                                "use the model's real config.json")
        for key, value in scope.items():
            if isinstance(value, list) and len(value) > MAX_CONFIG_LIST:
                raise ArchError(f"{model_id}: config.json field '{prefix}{key}' has {len(value)} entries (more "
                                f"than {MAX_CONFIG_LIST}); use the model's real config.json")
        for rope_key in ("rope_scaling", "rope_parameters"):
            rope = scope.get(rope_key)
            if isinstance(rope, Mapping):
                factor = rope.get("factor")
                if factor is not None and (isinstance(factor, bool) or not isinstance(factor, int | float)
                                           or not 0 < factor <= MAX_ROPE_FACTOR):
                    raise ArchError(f"{model_id}: config.json field '{prefix}{rope_key}.factor' is {factor!r:.40}; "
                                    f"it must be a number in (0, {MAX_ROPE_FACTOR}]")
                original = rope.get("original_max_position_embeddings")
                if original is not None and (isinstance(original, bool) or not isinstance(original, int | float)
                                             or not 0 < original <= 2**27):
                    raise ArchError(f"{model_id}: config.json field '{prefix}{rope_key}."
                                    f"original_max_position_embeddings' is {original!r:.40}; it must be in 1..{2**27}")
