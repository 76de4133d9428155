"""The typed subsets of a model's config.json and safetensors index that `spec.model.config` and
`spec.model.safetensorsIndex` carry (issue 20).

A config.json is free-form, and a free-form field in a CRD (`x-kubernetes-preserve-unknown-fields`) lets the API
server store 10,000 levels of nesting, which no JSON decoder in Python survives. So the CRD types exactly the keys
the planner reads (planner/arch.py, modelfiles.py): every nested object is a fixed model, no level is free-form, and
the API server prunes every other key on admission. The rest of a real config.json is never needed; a user who
wants to keep the whole file gives it in a ConfigMap (`spec.model.configMapRef`).

The pydantic side does what the API server does: unknown keys are dropped, explicit nulls are dropped (the CRD
marks no field nullable), and a value of the wrong type is refused naming its path. Values are kept exactly as
given (strict types, no coercion: an integer stays an integer), so the planner reads the same data it read from
the free-form field. `tests/unit/test_model_config_subset.py` runs the planner over every config the repository
has through a recording mapping and fails when it reads a key this subset would prune.

Depth: top level (1), `text_config` (2), `quantization_config` (3), `config_groups.<name>` (4), `weights` (5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    PlainValidator,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
    WithJsonSchema,
)
from pydantic_core import core_schema

__all__ = [
    "MAX_CONFIG_LIST_ITEMS",
    "MAX_CONFIG_STRING",
    "ArchConfig",
    "ModelConfigSubset",
    "SafetensorsIndexSubset",
    "typed_json",
]

#: Lists in a config (layer_types, quantization ignore lists, ...): the planner refuses longer layer lists anyway.
MAX_CONFIG_LIST_ITEMS = 1024
#: Strings in a config (model_type, quant_method, module names in an ignore list).
MAX_CONFIG_STRING = 256
#: Named quantization groups (compressed-tensors `config_groups`; real ones have 1-3).
MAX_QUANT_GROUPS = 64



def _number(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    return value


#: A JSON number, kept as given (an int stays an int). The planner bounds the value itself (planner/arch.py).
Num = Annotated[int | float, PlainValidator(_number), WithJsonSchema({"type": "number"})]
Text = Annotated[StrictStr, StringConstraints(max_length=MAX_CONFIG_STRING)]
TextList = Annotated[list[Text], Field(max_length=MAX_CONFIG_LIST_ITEMS)]
NumList = Annotated[list[Num], Field(max_length=MAX_CONFIG_LIST_ITEMS)]


class _Part(BaseModel):
    """A fixed part of config.json: its own key spelling (snake_case), unknown keys dropped as the API server prunes
    them, values strict (no coercion)."""

    model_config = ConfigDict(extra="ignore", strict=True, protected_namespaces=(), frozen=True)


class RopeScaling(_Part):
    """`rope_scaling` / `rope_parameters`: which scaling, and the factor that stretches the derived context."""

    rope_type: Text | None = None
    type: Text | None = None
    factor: Num | None = None
    original_max_position_embeddings: Num | None = None


class QuantWeights(_Part):
    """compressed-tensors `config_groups.<name>.weights`."""

    num_bits: Num | None = None
    group_size: Num | None = None
    symmetric: StrictBool | None = None
    type: Text | None = None


class QuantGroup(_Part):
    """compressed-tensors `config_groups.<name>`: the modules it targets and their weight format."""

    targets: TextList | None = None
    weights: QuantWeights | None = None


class KVCacheScheme(_Part):
    """compressed-tensors `kv_cache_scheme`: the planner only asks whether it is there (an FP8 KV cache)."""

    num_bits: Num | None = None
    type: Text | None = None


class ModelOptQuantization(_Part):
    """ModelOpt's nested `quantization` (hf_quant_config.json style)."""

    quant_algo: Text | None = None
    kv_cache_quant_algo: Text | None = None


class QuantizationConfig(_Part):
    """`quantization_config` / `compression_config`: what sizes the weights and the KV cache."""

    quant_method: Text | None = None
    bits: Num | None = None
    w_bit: Num | None = None
    weight_bits: Num | None = None
    group_size: Num | None = None
    q_group_size: Num | None = None
    sym: StrictBool | None = None
    load_in_4bit: StrictBool | None = None
    quant_algo: Text | None = None
    kv_cache_quant_algo: Text | None = None
    kv_cache_scheme: KVCacheScheme | None = None
    quantization: ModelOptQuantization | None = None
    config_groups: Annotated[dict[str, QuantGroup], Field(max_length=MAX_QUANT_GROUPS)] | None = Field(
        default=None, description="compressed-tensors quantization groups by name (each: targets and weights).")
    ignore: TextList | None = None


class ArchConfig(_Part):
    """The architecture keys the planner reads, at the top level or in a nested text config (`text_config`,
    `llm_config`, `language_config`: merged over the top level, so both levels carry the same keys)."""

    model_type: Text | None = None
    torch_dtype: Text | None = None
    dtype: Text | None = None
    hidden_act: Text | None = None
    hidden_activation: Text | None = None
    activation_function: Text | None = None
    tie_word_embeddings: StrictBool | None = None
    # sizes (transformers' attribute_map synonyms included)
    num_hidden_layers: Num | None = None
    n_layer: Num | None = None
    num_layers: Num | None = None
    n_layers: Num | None = None
    hidden_size: Num | None = None
    n_embd: Num | None = None
    d_model: Num | None = None
    num_attention_heads: Num | None = None
    n_head: Num | None = None
    num_key_value_heads: Num | None = None
    n_head_kv: Num | None = None
    num_kv_heads: Num | None = None
    multi_query_group_num: Num | None = None
    num_attention_groups: Num | None = None
    head_dim: Num | None = None
    vocab_size: Num | None = None
    intermediate_size: Num | None = None
    ffn_dim: Num | None = None
    n_inner: Num | None = None
    intermediate_size_mlp: Num | None = None
    attn_output_gate: StrictBool | None = None
    # MLA (DeepSeek, Kimi)
    kv_lora_rank: Num | None = None
    q_lora_rank: Num | None = None
    qk_rope_head_dim: Num | None = None
    qk_nope_head_dim: Num | None = None
    v_head_dim: Num | None = None
    # mixture of experts
    num_local_experts: Num | None = None
    num_experts: Num | None = None
    n_routed_experts: Num | None = None
    num_experts_per_tok: Num | None = None
    experts_per_token: Num | None = None
    moe_topk: Num | None = None
    moe_intermediate_size: Num | None = None
    n_shared_experts: Num | None = None
    shared_expert_intermediate_size: Num | None = None
    shared_intermediate_size: Num | None = None
    interleave_moe_layer_step: Num | None = None
    first_k_dense_replace: Num | None = None
    # multi-token prediction
    num_nextn_predict_layers: Num | None = None
    mtp_num_hidden_layers: Num | None = None
    # context length
    max_position_embeddings: Num | None = None
    n_positions: Num | None = None
    max_seq_len: Num | None = None
    seq_length: Num | None = None
    model_max_length: Num | None = None
    max_target_positions: Num | None = None
    max_sequence_length: Num | None = None
    max_seq_length: Num | None = None
    seq_len: Num | None = None
    original_max_position_embeddings: Num | None = None
    rope_scaling: RopeScaling | None = None
    rope_parameters: RopeScaling | None = None
    # which layers attend how
    sliding_window: Num | None = None
    use_sliding_window: StrictBool | None = None
    sliding_window_pattern: Num | None = None
    layer_types: TextList | None = None
    layers_block_type: TextList | None = None
    full_attention_interval: Num | None = None
    attn_layer_period: Num | None = None
    attn_layer_offset: Num | None = None
    attention_chunk_size: Num | None = None
    no_rope_layers: NumList | None = None
    no_rope_layer_interval: Num | None = None
    # linear attention (Gated DeltaNet) and mamba state
    linear_num_value_heads: Num | None = None
    linear_num_key_heads: Num | None = None
    linear_key_head_dim: Num | None = None
    linear_value_head_dim: Num | None = None
    linear_conv_kernel_dim: Num | None = None
    mamba_n_heads: Num | None = None
    mamba_num_heads: Num | None = None
    mamba_d_state: Num | None = None
    ssm_state_size: Num | None = None
    state_size: Num | None = None
    d_state: Num | None = None
    mamba_d_conv: Num | None = None
    conv_kernel: Num | None = None
    d_conv: Num | None = None
    mamba_expand: Num | None = None
    expand: Num | None = None
    mamba_d_head: Num | None = None
    mamba_head_dim: Num | None = None
    mamba_n_groups: Num | None = None
    n_groups: Num | None = None
    # weights' format
    quantization_config: QuantizationConfig | None = None
    compression_config: QuantizationConfig | None = None


class VisionConfig(_Part):
    """`vision_config`: the vision towers the planner sizes (Llama-4, Qwen3-VL / Qwen3.5); for others only its
    presence is read (a multimodal model)."""

    model_type: Text | None = None
    hidden_size: Num | None = None
    intermediate_size: Num | None = None
    num_hidden_layers: Num | None = None
    depth: Num | None = None
    out_hidden_size: Num | None = None
    patch_size: Num | None = None
    temporal_patch_size: Num | None = None
    in_channels: Num | None = None
    num_channels: Num | None = None
    num_position_embeddings: Num | None = None
    spatial_merge_size: Num | None = None
    deepstack_visual_indexes: NumList | None = None
    image_size: Num | None = None
    projector_input_dim: Num | None = None
    projector_output_dim: Num | None = None
    vision_output_dim: Num | None = None


class AudioConfig(_Part):
    """`audio_config`: only its presence is read (a multimodal model)."""

    model_type: Text | None = None


class ModelConfigSubset(ArchConfig):
    """The part of a model's config.json the planner reads."""

    architectures: TextList | None = None
    text_config: ArchConfig | None = None
    llm_config: ArchConfig | None = None
    language_config: ArchConfig | None = None
    vision_config: VisionConfig | None = None
    audio_config: AudioConfig | None = None


class SafetensorsMetadata(_Part):
    """`metadata` of model.safetensors.index.json."""

    total_size: StrictInt | None = None
    estimated: StrictBool | None = None


class SafetensorsIndexSubset(_Part):
    """The part of model.safetensors.index.json the planner reads (the weights' total size), or `totalSize`."""

    metadata: SafetensorsMetadata | None = None
    total_size: StrictInt | None = Field(default=None, alias="totalSize")

    model_config = ConfigDict(populate_by_name=False)


def typed_json(model: type[BaseModel], check: Callable[[Any], str | None]) -> Any:
    """An `Annotated` marker for a `dict[str, Any]` field whose schema (the CRD's) is `model`'s: the value is
    bounded by `check` first (its message is the error; the deep input never reaches pydantic), validated by the
    model (unknown keys dropped, wrong types refused naming the path), and handed on as a plain dict of the known,
    non-null keys, in the document's own spelling."""

    def bounded(value: Any) -> Any:
        if isinstance(value, Mapping):
            problem = check(value)
            if problem:
                raise ValueError(problem)
        return value

    def plain(value: BaseModel) -> dict[str, Any]:
        return value.model_dump(mode="python", by_alias=True, exclude_none=True)

    class _TypedJSON:
        @classmethod
        def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
            inner = handler.generate_schema(model)
            return core_schema.no_info_before_validator_function(
                bounded,
                core_schema.no_info_after_validator_function(plain, inner),
                serialization=core_schema.plain_serializer_function_ser_schema(dict, when_used="always"),
            )

    return _TypedJSON
