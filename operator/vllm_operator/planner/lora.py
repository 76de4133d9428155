"""GPU memory vLLM reserves for LoRA adapters (`--enable-lora --max-loras S --max-lora-rank r`).

Pure arithmetic over the model's architecture, read from vLLM's own source (0.33.0, `vllm/lora/`):

- `LoRAModelManager._create_lora_modules` wraps every linear layer the model has (`LinearBase`, the MoE runner)
  plus, for architectures that declare `embedding_modules`, the input embedding and the LM head. Each wrapper's
  `create_lora_weights` allocates *stacked* A/B tensors for `lora_slots = max_loras` adapters at the maximum rank,
  zero-filled on the GPU, while the model loads: they are part of "Model loading took X GiB" and come out of the
  KV-cache budget whatever adapters are later loaded.
- Dense linear layers (`layers/base_linear.py`, `column_parallel_linear.py`, `row_parallel_linear.py`), not fully
  sharded: A is `(S, 1, r, input_size)` per slice, B is `(S, 1, output_slice, r)` per slice. Column-parallel layers
  (qkv_proj with 3 slices q/k/v, gate_up_proj with 2 slices) keep the full input and a per-rank output slice;
  row-parallel layers (o_proj, down_proj) keep the per-rank input and the full output.
- `ReplicatedLinear` (the MoE router `mlp.gate`): A `(S, 1, r, hidden)`, B `(S, 1, num_experts, r)`.
- Fused MoE (`layers/fused_moe.py`, gated experts): w13 A `2 × (S, E, r, hidden)`, w2 A `(S, E, r, I/tp)`,
  w13 B `2 × (S, E, I/tp, r)`, w2 B `(S, E, hidden, r)`.
- `VocabParallelEmbeddingWithLoRA`: A `(S, vocab, r)`, B `(S, 1, hidden, r)`; `LogitsProcessorWithLoRA` (LM head):
  A `(S, 1, r, hidden)`, B `(S, 1, vocab, r)`; neither is split by tensor parallelism.
- `lora_dtype` "auto" is the model's dtype (`LoRAConfig.verify_with_model_config`).

The dummy adapters vLLM builds for profiling and warm-up live on the CPU (`create_dummy_lora(..., "cpu")`), and the
Punica kernels' index buffers are a few integers per batched token, so neither is counted.

Not modelled: MLA attention (DeepSeek-V2/V3 wraps q_a/q_b/kv_a/kv_b projections whose sizes the architecture record
does not carry) — `adapter_bytes_per_stage` says so through `LoRAEstimate.note`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from .arch import ModelArch

#: vLLM's `MaxLoRARanks` (config/lora.py): the only values `--max-lora-rank` accepts.
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: vLLM's default `--max-lora-rank` and `--max-loras` (LoRAConfig).
DEFAULT_MAX_LORA_RANK = 16
DEFAULT_MAX_LORAS = 1
#: `LogitsProcessorWithLoRA.create_lora_weights` refuses larger vocabularies.
MAX_LORA_VOCAB = 258048

#: Architectures whose vLLM model class declares `embedding_modules` with the LM head (vLLM 0.33.0, read from
#: `vllm/model_executor/models/*.py`): their input embedding and LM head get adapter slots too.
EMBEDDING_AND_HEAD = frozenset({
    "ApertusForCausalLM", "DeciLMForCausalLM", "Exaone4ForCausalLM", "ExaoneForCausalLM", "ExaoneMoeForCausalLM",
    "FalconH1ForCausalLM", "GraniteForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeHybridForCausalLM",
    "GraniteMoeSharedForCausalLM", "HyperCLOVAXForCausalLM", "JambaForCausalLM", "Lfm2ForCausalLM",
    "Lfm2MoeForCausalLM", "LlamaForCausalLM", "MiniCPMForCausalLM", "MixtralForCausalLM", "NemotronForCausalLM",
    "NemotronHForCausalLM", "PhiMoEForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "SolarForCausalLM",
})
#: Declares only the input embedding.
EMBEDDING_ONLY = frozenset({"CohereForCausalLM"})


class LoRASlots(BaseModel):
    """The LoRA settings that size vLLM's reservation."""

    model_config = ConfigDict(frozen=True)

    max_loras: int = Field(DEFAULT_MAX_LORAS, ge=1, description="adapters in one batch: GPU slots")
    max_rank: int = Field(DEFAULT_MAX_LORA_RANK, ge=1, description="the largest adapter rank served")
    dtype_bytes: int = Field(2, ge=1, description="bytes per element (lora_dtype auto = the model dtype)")


class LoRAEstimate(BaseModel):
    model_config = ConfigDict(frozen=True)

    per_stage: tuple[int, ...] = Field(description="bytes per GPU on each pipeline stage")
    note: str = ""


def attention_elements(arch: ModelArch, rank: int, tp: int) -> int:
    """Elements of one slot's A and B tensors for one layer's attention on one TP rank (0 for MLA: not modelled)."""
    if arch.is_mla:
        return 0
    h = arch.hidden_size
    q_out = arch.num_heads * arch.head_dim // tp
    kv_out = max(arch.num_kv_heads // tp, 1) * arch.head_dim  # KV heads are replicated when fewer than tp
    qkv = 3 * rank * h + rank * (q_out + 2 * kv_out)          # MergedQKVParallelLinearWithLoRA: 3 slices
    o_proj = rank * q_out + h * rank                          # RowParallelLinearWithLoRA
    return qkv + o_proj


def mlp_elements(arch: ModelArch, rank: int, tp: int) -> int:
    """Elements of one slot for one layer's MLP: gate_up (2 column slices) + down (row), or router + fused experts."""
    h = arch.hidden_size
    if not arch.is_moe:
        inter = arch.intermediate_size // tp
        return (2 * rank * h + 2 * inter * rank) + (rank * inter + h * rank)
    router = rank * h + arch.num_experts * rank               # ReplicatedLinear gate
    inter = arch.moe_intermediate_size // tp
    experts = arch.num_experts * rank * (2 * h + inter + 2 * inter + h)  # w13 A, w2 A, w13 B, w2 B
    return router + experts


def layer_elements(arch: ModelArch, rank: int, tp: int) -> int:
    """Elements of one slot for one decoder layer on one TP rank."""
    return attention_elements(arch, rank, tp) + mlp_elements(arch, rank, tp)


def embedding_elements(arch: ModelArch, rank: int) -> tuple[int, int]:
    """(input embedding, LM head) elements of one slot, when the architecture wraps them; (0, 0) otherwise."""
    names = set(arch.architectures)
    embed = arch.vocab_size * rank + arch.hidden_size * rank
    head = rank * arch.hidden_size + arch.vocab_size * rank
    if names & EMBEDDING_AND_HEAD:
        return embed, head
    if names & EMBEDDING_ONLY:
        return embed, 0
    return 0, 0


def adapter_bytes_per_stage(arch: ModelArch, slots: LoRASlots, tp: int,
                            stage_layers: Sequence[int]) -> LoRAEstimate:
    """Bytes vLLM reserves per GPU for `slots`, for each pipeline stage (`stage_layers`: decoder layers per stage).

    The first stage holds the input embedding, the last the LM head.
    """
    rank = slots.max_rank
    tp = max(tp, 1)
    per_layer = layer_elements(arch, rank, tp)
    note = ("the LoRA slots of MLA attention projections are not modelled (MLP, expert and embedding slots are)"
            if arch.is_mla else "")
    embed, head = embedding_elements(arch, rank)
    stages = list(stage_layers) or [arch.num_layers]
    out = []
    for i, layers in enumerate(stages):
        elements = per_layer * layers
        if i == 0:
            elements += embed
        if i == len(stages) - 1:
            elements += head
        out.append(elements * slots.max_loras * slots.dtype_bytes)
    return LoRAEstimate(per_stage=tuple(out), note=note)


def vocab_too_large(arch: ModelArch) -> bool:
    """vLLM refuses LoRA for LM heads above 258048 tokens (architectures that wrap the head)."""
    return bool(set(arch.architectures) & EMBEDDING_AND_HEAD) and arch.vocab_size > MAX_LORA_VOCAB


def slots_needed(adapters: int, max_loras: int | None) -> int:
    """GPU slots: the user's `maxLoras`, else one per declared adapter (vLLM's default is 1), at least 1."""
    if max_loras is not None:
        return max(max_loras, 1)
    return max(adapters, DEFAULT_MAX_LORAS)


__all__ = ["DEFAULT_MAX_LORAS", "DEFAULT_MAX_LORA_RANK", "EMBEDDING_AND_HEAD", "LoRAEstimate", "LoRASlots",
           "MAX_LORA_RANKS", "adapter_bytes_per_stage", "attention_elements", "embedding_elements", "layer_elements",
           "mlp_elements", "slots_needed", "vocab_too_large"]
