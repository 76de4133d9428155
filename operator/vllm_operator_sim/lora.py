"""The LoRA adapter slots a simulated vLLM allocates while the model loads (`--enable-lora`).

The simulator's own count, written from vLLM's source (0.33.0 `vllm/lora/`), not from the planner's functions, so
that a simulated start checks the planner instead of repeating it. vLLM's `LoRAModelManager._create_lora_modules`
replaces every linear layer of the model by a `*WithLoRA` wrapper whose `create_lora_weights` allocates, zeroed on
the GPU, `max_loras` slots at the maximum rank:

* A: `(slots, experts, rank, in_features)` once per output slice, B: `(slots, experts, out_slice, rank)` per slice
  (`experts` is 1 outside the fused MoE);
* column-parallel layers keep the whole input and a per-rank share of each output slice; row-parallel layers a
  per-rank input and the whole output; replicated layers (the MoE router, MLA's kv_a_proj_with_mqa, Qwen2-MoE's
  shared_expert_gate) and layers built with `disable_tp` (MLA's fused_qkv_a_proj) keep both whole;
* the input embedding (A `(slots, vocab, rank)`, B `(slots, 1, hidden, rank)`) and the LM head (A `(slots, 1, rank,
  hidden)`, B `(slots, 1, vocab, rank)`) only for model classes that list them in `embedding_modules`.

The list of which classes do that is a fact of vLLM's model files, shared with the planner
(`planner.lora.EMBEDDING_AND_HEAD`); the module list and the arithmetic below are this file's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_operator.planner.arch import ModelArch
from vllm_operator.planner.lora import (
    EMBEDDING_AND_HEAD,
    EMBEDDING_ONLY,
    allowed_ranks,
    lora_support,
    refusal_message,
)
from vllm_operator.planner.versions import parse_version

__all__ = ["Wrapped", "adapter_slot_bytes", "lora_refusal", "rank_error", "wrapped_layer_modules", "wraps_experts"]


@dataclass(frozen=True)
class Wrapped:
    """One module vLLM wraps with LoRA, as its stacked A/B tensors see it on one TP rank."""

    name: str
    in_features: int
    out_slices: tuple[int, ...]
    experts: int = 1

    def elements(self, rank: int) -> int:
        """One slot's A and B elements."""
        a = len(self.out_slices) * rank * self.in_features
        b = sum(self.out_slices) * rank
        return self.experts * (a + b)


def _column(name: str, in_features: int, outs: Sequence[int], tp: int) -> Wrapped:
    return Wrapped(name, in_features, tuple(o // tp for o in outs))


def _row(name: str, in_features: int, out: int, tp: int) -> Wrapped:
    return Wrapped(name, in_features // tp, (out,))


def _attention(arch: ModelArch, tp: int) -> list[Wrapped]:
    h = arch.hidden_size
    if not arch.is_mla:
        kv = max(arch.num_kv_heads // tp, 1) * arch.head_dim * tp  # replicated KV heads: one head per rank at least
        return [_column("qkv_proj", h, (arch.num_heads * arch.head_dim, kv, kv), tp),
                _row("o_proj", arch.num_heads * arch.head_dim, h, tp)]
    rope = arch.qk_rope_head_dim or 0
    latent = (arch.kv_lora_rank or 0) + rope
    q_head = arch.qk_nope_head_dim + rope
    if arch.q_lora_rank:
        q = [Wrapped("fused_qkv_a_proj", h, (arch.q_lora_rank, latent)),
             _column("q_b_proj", arch.q_lora_rank, (arch.num_heads * q_head,), tp)]
    else:
        q = [_column("q_proj", h, (arch.num_heads * q_head,), tp), Wrapped("kv_a_proj_with_mqa", h, (latent,))]
    return q + [_column("kv_b_proj", arch.kv_lora_rank or 0,
                        (arch.num_heads * (arch.qk_nope_head_dim + arch.v_head_dim),), tp),
                _row("o_proj", arch.num_heads * arch.v_head_dim, h, tp)]


def _gated_mlp(prefix: str, hidden: int, intermediate: int, tp: int) -> list[Wrapped]:
    return [_column(f"{prefix}gate_up_proj", hidden, (intermediate, intermediate), tp),
            _row(f"{prefix}down_proj", intermediate, hidden, tp)]


def _mlp(arch: ModelArch, tp: int, dense: bool, experts: bool) -> list[Wrapped]:
    h = arch.hidden_size
    if not arch.is_moe or dense:
        return _gated_mlp("", h, arch.intermediate_size, tp)
    inter = arch.moe_intermediate_size // tp
    modules = [Wrapped("gate", h, (arch.num_experts,))]
    if experts:  # FusedMoEWithLoRA (lora/layers/fused_moe.py) exists from 0.11.1
        modules += [Wrapped("experts.w13", h, (inter, inter), experts=arch.num_experts),
                    Wrapped("experts.w2", inter, (h,), experts=arch.num_experts)]
    if arch.shared_expert_size:
        modules += _gated_mlp("shared.", h, arch.shared_expert_size, tp)
    if arch.shared_expert_gate:
        modules.append(Wrapped("shared_expert_gate", h, (1,)))
    return modules


def wrapped_layer_modules(arch: ModelArch, tp: int, layer: int, experts: bool = True) -> list[Wrapped]:
    """The modules of decoder layer `layer` that get adapter slots, on one TP rank (`experts`: the release wraps
    the fused MoE experts)."""
    return _attention(arch, tp) + _mlp(arch, tp, dense=arch.dense_mlp_layer(layer), experts=experts)


def wraps_experts(version: str) -> bool:
    """vLLM 0.11.1 added FusedMoEWithLoRA (absent from the 0.11.0 wheel): before, routed experts get no slots."""
    return parse_version(version) >= (0, 11, 1)


def _edges(arch: ModelArch) -> tuple[list[Wrapped], list[Wrapped]]:
    names = set(arch.architectures)
    embed = [Wrapped("embed_tokens", arch.vocab_size, (arch.hidden_size,))]
    head = [Wrapped("lm_head", arch.hidden_size, (arch.vocab_size,))]
    if names & EMBEDDING_AND_HEAD:
        return embed, head
    if names & EMBEDDING_ONLY:
        return embed, []
    return [], []


def adapter_slot_bytes(arch: ModelArch, *, slots: int, rank: int, dtype_bytes: int, tp: int,
                       stage_layers: Sequence[int], experts: bool = True) -> list[int]:
    """Bytes of adapter slots on one GPU of each pipeline stage (embedding on the first, LM head on the last)."""
    embed, head = _edges(arch)
    out: list[int] = []
    first = 0
    for stage, count in enumerate(stage_layers):
        modules = [m for layer in range(first, first + count)
                   for m in wrapped_layer_modules(arch, tp, layer, experts)]
        first += count
        if stage == 0:
            modules += embed
        if stage == len(stage_layers) - 1:
            modules += head
        out.append(sum(m.elements(rank) for m in modules) * slots * dtype_bytes)
    return out


# --------------------------------------------------------------------------------------------------------------
# What the release refuses (facts of vLLM's source, from catalog/lora_support.yaml)


def rank_error(version: str, rank: int) -> str | None:
    """The error a release prints for a --max-lora-rank it does not accept."""
    ranks = allowed_ranks(version)
    if rank in ranks:
        return None
    if parse_version(version) < (0, 11, 1):  # LoRAConfig.__post_init__'s possible_max_ranks
        return f"ValueError: max_lora_rank ({rank}) must be one of {ranks}."
    choices = ", ".join(map(str, ranks[:-1])) + f" or {ranks[-1]}"  # pydantic's Literal error (MaxLoRARanks)
    return ("pydantic_core._pydantic_core.ValidationError: 1 validation error for LoRAConfig\nmax_lora_rank\n"
            f"  Input should be {choices} [type=literal_error, input_value={rank}, input_type=int]")


def lora_refusal(arch: ModelArch, version: str, model_id: str) -> tuple[str, str] | None:
    """(phase, text) when the release refuses --enable-lora for this model class: 'config' (the API server, before
    an engine starts), 'model_init' (the worker, building the model, before its weights load) or 'loading' (the
    worker, once the weights loaded); None when it serves it or nobody knows."""
    support = lora_support(arch.architectures, version)
    if support.supported is not False or support.refusal is None:
        return None
    return support.refusal.phase, refusal_message(support, model_id)
