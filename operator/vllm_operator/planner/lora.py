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

- MLA attention (`DeepseekV2MLAAttention`, `models/deepseek_v2.py`; DeepSeek-V2/V3/R1, Kimi-K2): with a query low
  rank (`q_lora_rank`) the fused `fused_qkv_a_proj` (a `MergedColumnParallelLinear` built with `disable_tp`, so
  `MergedColumnParallelLinearWithLoRA` with 2 full-size slices: q_lora_rank and kv_lora_rank + qk_rope_head_dim) and
  `q_b_proj` (column-parallel, q_lora_rank → heads × (nope + rope)); without one, `q_proj` (column-parallel, hidden →
  heads × (nope + rope)) and `kv_a_proj_with_mqa` (`ReplicatedLinear`, hidden → kv_lora_rank + rope). Then
  `kv_b_proj` (column-parallel, kv_lora_rank → heads × (nope + v)) and `o_proj` (row-parallel, heads × v → hidden).
- MoE layers also carry their shared experts (DeepSeek `shared_experts`: a `DeepseekV2MLP` of n_shared_experts ×
  moe_intermediate_size; Qwen2-MoE `shared_expert` plus its `shared_expert_gate`, a `ReplicatedLinear` hidden → 1);
  DeepSeek's first `first_k_dense_replace` layers have a dense MLP of `intermediate_size` instead. The router is a
  `GateLinear`, a `ReplicatedLinear` subclass (`ReplicatedLinearWithLoRA` takes subclasses).
- The fused MoE wrapper exists from 0.11.1 (`MOE_EXPERTS_SINCE`); before, routed experts get no slots.

The dummy adapters vLLM builds for profiling and warm-up live on the CPU (`create_dummy_lora(..., "cpu")`), and the
Punica kernels' index buffers are a few integers per batched token, so neither is counted. Not modelled: releases
before 0.8.0 wrapped only the model's own `supported_lora_modules` list (`lora/utils.py`'s all-linear-layers rule
arrives in the 0.8.0 wheel), and releases before 0.12.0 widened the embedding and LM-head slots by
`lora_extra_vocab_size` (256 by default; gone from the 0.12.0 wheel's config/lora.py): they are sized as 0.33 does.

Which releases serve which architectures with LoRA, their refusal texts and the `--max-lora-rank` choices per release
come from `catalog/lora_support.yaml` (`lora_support`, `refusal_message`, `allowed_ranks`), and so does the LM head's
vocabulary limit (`vocab_check`): `LogitsProcessorWithLoRA` refuses a vocabulary above 128,512 (up to 0.5.4),
257,024 (0.5.5-0.16) or 258,048 (0.17.0 on) when the release makes the model's LM head a LoRA target, comparing
config.json's vocabulary plus `lora_extra_vocab_size` (256) for the models that add it before 0.12.0. The adapter
slots above size the LM head as 0.33 does (`EMBEDDING_AND_HEAD`); the per-release table only decides the refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from importlib import resources
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field

from .arch import ModelArch
from .versions import Version, parse_version

#: vLLM's `MaxLoRARanks` (config/lora.py, 0.11.1+): the values `--max-lora-rank` accepts in the newest releases;
#: `allowed_ranks(version)` gives those of any release (catalog/lora_support.yaml).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: vLLM's default `--max-lora-rank` and `--max-loras` (LoRAConfig).
DEFAULT_MAX_LORA_RANK = 16
DEFAULT_MAX_LORAS = 1
#: Text-generation architectures whose vLLM 0.33.0 model class has `embedding_modules` with the LM head, declared or
#: inherited (Phi3ForCausalLM and the LLaMAForCausalLM alias take LlamaForCausalLM's): their input embedding and LM
#: head get adapter slots too. The `lm_head` table of catalog/lora_support.yaml at 0.33.0, which a test holds this to.
EMBEDDING_AND_HEAD = frozenset({
    "ApertusForCausalLM", "DeciLMForCausalLM", "Ernie4_5ForCausalLM", "Exaone4ForCausalLM", "ExaoneForCausalLM",
    "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM", "FalconH1ForCausalLM", "GraniteForCausalLM",
    "GraniteMoeForCausalLM", "GraniteMoeHybridForCausalLM", "GraniteMoeSWAForCausalLM", "GraniteMoeSharedForCausalLM",
    "GraniteSWAForCausalLM", "HyperCLOVAXForCausalLM", "IQuestCoderForCausalLM", "InternLM3ForCausalLM",
    "JambaForCausalLM", "K2HorizonForCausalLM", "LLaMAForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM",
    "Llama4ForCausalLM", "LlamaForCausalLM", "MiniCPM3ForCausalLM", "MiniCPMForCausalLM", "MixtralForCausalLM",
    "NemotronForCausalLM", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "Param2MoEForCausalLM",
    "Phi3ForCausalLM", "PhiMoEForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM", "SolarForCausalLM", "TeleChat2ForCausalLM", "TeleChat3ForCausalLM",
    "TeleFLMForCausalLM",
})
#: Declares only the input embedding.
EMBEDDING_ONLY = frozenset({"CohereForCausalLM"})


#: The first release whose LoRA wraps the fused MoE experts (`vllm/lora/layers/fused_moe.py`, FusedMoEWithLoRA: absent
#: from the 0.11.0 wheel, present in 0.11.1's); before it a MoE model's routed experts get no adapter slots.
MOE_EXPERTS_SINCE = "0.11.1"


def lora_wraps_experts(version: str) -> bool:
    """Whether vLLM `version` gives the fused MoE experts adapter slots."""
    return parse_version(version) >= parse_version(MOE_EXPERTS_SINCE)


class LoRASlots(BaseModel):
    """The LoRA settings that size vLLM's reservation."""

    model_config = ConfigDict(frozen=True)

    max_loras: int = Field(DEFAULT_MAX_LORAS, ge=1, description="adapters in one batch: GPU slots")
    max_rank: int = Field(DEFAULT_MAX_LORA_RANK, ge=1, description="the largest adapter rank served")
    dtype_bytes: int = Field(2, ge=1, description="bytes per element (lora_dtype auto = the model dtype)")
    moe_experts: bool = Field(True, description="the fused MoE experts get slots (vLLM 0.11.1+)")


class LoRAEstimate(BaseModel):
    model_config = ConfigDict(frozen=True)

    per_stage: tuple[int, ...] = Field(description="bytes per GPU on each pipeline stage")
    note: str = ""


def attention_elements(arch: ModelArch, rank: int, tp: int) -> int:
    """Elements of one slot's A and B tensors for one layer's attention on one TP rank."""
    if arch.is_mla:
        return mla_attention_elements(arch, rank, tp)
    h = arch.hidden_size
    q_out = arch.num_heads * arch.head_dim // tp
    kv_out = max(arch.num_kv_heads // tp, 1) * arch.head_dim  # KV heads are replicated when fewer than tp
    qkv = 3 * rank * h + rank * (q_out + 2 * kv_out)          # MergedQKVParallelLinearWithLoRA: 3 slices
    o_proj = rank * q_out + h * rank                          # RowParallelLinearWithLoRA
    return qkv + o_proj


def mla_attention_elements(arch: ModelArch, rank: int, tp: int) -> int:
    """One slot of an MLA layer's projections on one TP rank (see the module docstring for the layers)."""
    h = arch.hidden_size
    heads = arch.num_heads // tp                               # column-parallel outputs are split by heads
    kv_a_out = (arch.kv_lora_rank or 0) + (arch.qk_rope_head_dim or 0)
    qk_head = arch.qk_nope_head_dim + (arch.qk_rope_head_dim or 0)
    if arch.q_lora_rank:
        q = 2 * rank * h + (arch.q_lora_rank + kv_a_out) * rank   # fused_qkv_a_proj: 2 slices, not split by TP
        q += rank * arch.q_lora_rank + heads * qk_head * rank     # q_b_proj
    else:
        q = rank * h + heads * qk_head * rank                     # q_proj
        q += rank * h + kv_a_out * rank                           # kv_a_proj_with_mqa (replicated)
    kv_b = rank * (arch.kv_lora_rank or 0) + heads * (arch.qk_nope_head_dim + arch.v_head_dim) * rank
    o_proj = rank * heads * arch.v_head_dim + h * rank             # row-parallel: input split, full output
    return q + kv_b + o_proj


def dense_mlp_elements(hidden: int, intermediate: int, rank: int, tp: int) -> int:
    """One slot of a gated MLP: gate_up (MergedColumnParallelLinearWithLoRA, 2 slices) + down (row-parallel)."""
    inter = intermediate // tp
    return (2 * rank * hidden + 2 * inter * rank) + (rank * inter + hidden * rank)


def mlp_elements(arch: ModelArch, rank: int, tp: int, dense: bool = False, experts_wrapped: bool = True) -> int:
    """Elements of one slot for one layer's MLP: dense, or router + fused experts + shared experts (MoE)."""
    h = arch.hidden_size
    if not arch.is_moe or dense:
        return dense_mlp_elements(h, arch.intermediate_size, rank, tp)
    router = rank * h + arch.num_experts * rank               # ReplicatedLinear gate (GateLinear)
    inter = arch.moe_intermediate_size // tp
    experts = arch.num_experts * rank * (2 * h + inter + 2 * inter + h)  # w13 A, w2 A, w13 B, w2 B
    experts = experts if experts_wrapped else 0
    shared = dense_mlp_elements(h, arch.shared_expert_size, rank, tp) if arch.shared_expert_size else 0
    shared += (rank * h + 1 * rank) if arch.shared_expert_gate else 0   # shared_expert_gate: hidden -> 1
    return router + experts + shared


def layer_elements(arch: ModelArch, rank: int, tp: int, index: int = -1, experts_wrapped: bool = True) -> int:
    """Elements of one slot for decoder layer `index` on one TP rank (-1: a layer with routed experts, if any)."""
    dense = index >= 0 and arch.dense_mlp_layer(index)
    return attention_elements(arch, rank, tp) + mlp_elements(arch, rank, tp, dense=dense,
                                                             experts_wrapped=experts_wrapped)


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
    embed, head = embedding_elements(arch, rank)
    stages = list(stage_layers) or [arch.num_layers]
    out = []
    first = 0
    for i, layers in enumerate(stages):
        dense = sum(1 for index in range(first, first + layers) if arch.dense_mlp_layer(index))  # on this stage
        wrapped = slots.moe_experts
        dense_layer = attention_elements(arch, rank, tp) + mlp_elements(arch, rank, tp, dense=True,
                                                                        experts_wrapped=wrapped)
        elements = dense_layer * dense + layer_elements(arch, rank, tp, -1, wrapped) * (layers - dense)
        first += layers
        if i == 0:
            elements += embed
        if i == len(stages) - 1:
            elements += head
        out.append(elements * slots.max_loras * slots.dtype_bytes)
    return LoRAEstimate(per_stage=tuple(out))


def slots_needed(adapters: int, max_loras: int | None) -> int:
    """GPU slots: the user's `maxLoras`, else one per declared adapter (vLLM's default is 1), at least 1."""
    if max_loras is not None:
        return max(max_loras, 1)
    return max(adapters, DEFAULT_MAX_LORAS)


# --------------------------------------------------------------------------------------------------------------
# Which architectures and ranks a release accepts (catalog/lora_support.yaml, read from the wheels)


class Refusal(BaseModel):
    """What vLLM prints when the model class does not implement LoRA, from `since` on."""

    model_config = ConfigDict(frozen=True)

    since: str
    phase: Literal["config", "model_init", "loading"] = Field(
        description="config: the API server refuses before any engine starts; model_init: the worker, building the "
                    "model before its weights load; loading: the worker, once the weights loaded")
    where: str
    text: str

    def render(self, architecture: str, model_class: str, model_id: str) -> str:
        return self.text.replace("{arch}", architecture).replace("{cls}", model_class).replace("{model}", model_id)


class RankEra(BaseModel):
    model_config = ConfigDict(frozen=True)

    since: str
    ranks: tuple[int, ...]
    where: str = ""


class VocabLimit(BaseModel):
    """The largest LM-head vocabulary `LogitsProcessorWithLoRA` accepts, from `since` on, and its refusal."""

    model_config = ConfigDict(frozen=True)

    since: str
    max: int
    where: str
    text: str


class ExtraVocab(BaseModel):
    """`lora_extra_vocab_size`: added to the head's vocabulary by the models marked `extra`, before `until`."""

    model_config = ConfigDict(frozen=True)

    size: int
    until: str
    where: str = ""


class LoRASupportTable(BaseModel):
    model_config = ConfigDict(frozen=True)

    checked: tuple[str, ...]
    refusals: tuple[Refusal, ...]
    max_lora_ranks: tuple[RankEra, ...]
    architectures: dict[str, tuple[tuple[str, ...], ...]]
    vocab_limits: tuple[VocabLimit, ...] = ()
    lora_extra_vocab: ExtraVocab | None = None
    lm_head: dict[str, tuple[tuple[str, ...], ...]] = Field(
        default_factory=dict, description="text-generation architecture -> runs of [no|yes|extra, first, last]")


@lru_cache(maxsize=1)
def support_table() -> LoRASupportTable:
    text = resources.files("vllm_operator.catalog").joinpath("lora_support.yaml").read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return LoRASupportTable.model_validate(data)


class LoRASupport(BaseModel):
    """Whether vLLM `version` serves `architecture` with `--enable-lora`; None: the table cannot say."""

    model_config = ConfigDict(frozen=True)

    supported: bool | None
    architecture: str = ""
    model_class: str = ""
    basis: str = Field("", description="which checked wheels the answer rests on")
    refusal: Refusal | None = Field(None, description="what that release prints, when it refuses")


Runs = tuple[tuple[str, ...], ...]
_T = TypeVar("_T")
_E = TypeVar("_E", Refusal, VocabLimit)


def _run_at(runs: Runs, checked: Version) -> tuple[str, ...] | None:
    """The run [answer, first, last, …] covering a checked release; None when the architecture was not there."""
    return next((run for run in runs if parse_version(run[1]) <= checked <= parse_version(run[2])), None)


def _answer_at(runs: Runs, checked: Version) -> tuple[bool, str] | None:
    """(supported, class) of the run covering a checked release; None when the architecture was not registered."""
    run = _run_at(runs, checked)
    return None if run is None else (run[0] == "yes", run[3] if len(run) > 3 else "")


def _head_at(runs: Runs, checked: Version) -> str | None:
    run = _run_at(runs, checked)
    return None if run is None else run[0]


def _neighbours(version: Version, checked: Sequence[str]) -> tuple[str | None, str | None]:
    below = [c for c in checked if parse_version(c) <= version]
    above = [c for c in checked if parse_version(c) >= version]
    return (below[-1] if below else None), (above[0] if above else None)


def _across_wheels(by_arch: Mapping[str, Runs], architectures: Sequence[str], version: str,
                   answer_at: Callable[[Runs, Version], _T | None],
                   same: Callable[[_T, _T], bool]) -> tuple[str, _T | None, str] | None:
    """(architecture, answer, basis) for the first of `architectures` the table knows near `version`: the answer of
    the checked wheels at or around it when they agree (None when they differ); None when none is in the table."""
    below, above = _neighbours(parse_version(version), support_table().checked)
    for arch in architectures:
        runs = by_arch.get(arch)
        if runs is None:
            continue
        lo = answer_at(runs, parse_version(below)) if below else None
        hi = answer_at(runs, parse_version(above)) if above else None
        if lo is None and hi is None:
            continue
        if below == above or (lo is not None and hi is not None and same(lo, hi)):
            basis = (f"the vLLM {below} wheel" if below == above
                     else f"the vLLM {below} and {above} wheels, which agree")
            return arch, lo if lo is not None else hi, basis
        return arch, None, f"vLLM {version} lies between checked wheels that differ ({below}, {above})"
    return None


def _era(eras: Sequence[_E], version: str) -> _E | None:
    """The last of `eras` (ordered by `since`) that has begun by `version`; None before the first."""
    v = parse_version(version)
    begun = [e for e in eras if parse_version(e.since) <= v]
    return begun[-1] if begun else None


def refusal_for(version: str) -> Refusal | None:
    """The refusal text era of that release (None before the oldest era)."""
    return _era(support_table().refusals, version)


def lora_support(architectures: Sequence[str], version: str) -> LoRASupport:
    """Read the table for the model's architectures (vLLM uses the first one its registry knows)."""
    found = _across_wheels(support_table().architectures, architectures, version, _answer_at,
                           lambda lo, hi: lo[0] == hi[0])
    if found is None:
        names = ", ".join(architectures) or "no architectures in config.json"
        return LoRASupport(supported=None, basis=f"{names}: not in the LoRA table near vLLM {version}")
    arch, answer, basis = found
    if answer is None:
        return LoRASupport(supported=None, architecture=arch, basis=basis)
    ok, cls = answer
    return LoRASupport(supported=ok, architecture=arch, model_class=cls or arch, basis=basis,
                       refusal=None if ok else refusal_for(version))


def refusal_message(support: LoRASupport, model_id: str) -> str:
    """vLLM's own text for a refused `--enable-lora` ('' when it does not refuse)."""
    if support.supported is not False or support.refusal is None:
        return ""
    return support.refusal.render(support.architecture, support.model_class, model_id)


# --------------------------------------------------------------------------------------------------------------
# The LM head's vocabulary limit (catalog/lora_support.yaml: vocab_limits, lora_extra_vocab, lm_head)


class VocabCheck(BaseModel):
    """Whether vLLM `version` refuses LoRA for the size of this model's LM-head vocabulary.

    `refused`: True when the head is a LoRA target in that release and the vocabulary it compares exceeds the
    limit; None when the vocabulary exceeds it but the table cannot say whether the head is a target."""

    model_config = ConfigDict(frozen=True)

    refused: bool | None
    architecture: str = ""
    vocab: int = Field(description="the vocabulary vLLM compares (config.json's, plus lora_extra_vocab_size where "
                                   "the model adds it)")
    limit: VocabLimit
    basis: str = ""


def vocab_limit(version: str) -> VocabLimit | None:
    """The limit of that release (None before the oldest checked one)."""
    return _era(support_table().vocab_limits, version)


def lm_head_target(architectures: Sequence[str], version: str) -> tuple[str | None, str, str]:
    """("no" | "yes" | "extra" | None, architecture, basis): whether vLLM `version` makes the LM head a LoRA target
    (extra: and widens its vocabulary by lora_extra_vocab_size); None when the table cannot say."""
    found = _across_wheels(support_table().lm_head, architectures, version, _head_at, lambda lo, hi: lo == hi)
    if found is None:
        names = ", ".join(architectures) or "no architectures in config.json"
        return None, "", f"{names}: not a text-generation architecture of the LoRA table near vLLM {version}"
    arch, head, basis = found
    return head, arch, basis


def vocab_check(architectures: Sequence[str], vocab_size: int, version: str) -> VocabCheck | None:
    """None when vLLM `version` accepts the vocabulary with LoRA (or the head is no LoRA target, or the release
    predates the table); else the check, refused or unknown."""
    limit = vocab_limit(version)
    if limit is None:
        return None
    extra_vocab = support_table().lora_extra_vocab
    widened = extra_vocab.size if extra_vocab and parse_version(version) < parse_version(extra_vocab.until) else 0
    head, arch, basis = lm_head_target(architectures, version)
    vocab = vocab_size + (widened if head == "extra" else 0)
    if head == "no" or vocab_size + widened <= limit.max or (head is not None and vocab <= limit.max):
        return None
    return VocabCheck(refused=True if head in ("yes", "extra") else None, architecture=arch,
                      vocab=vocab, limit=limit, basis=basis)


def allowed_ranks(version: str) -> tuple[int, ...]:
    """The `--max-lora-rank` values vLLM `version` accepts."""
    v = parse_version(version)
    eras = [e for e in support_table().max_lora_ranks if parse_version(e.since) <= v]
    return (eras[-1] if eras else support_table().max_lora_ranks[0]).ranks


__all__ = ["DEFAULT_MAX_LORAS", "DEFAULT_MAX_LORA_RANK", "EMBEDDING_AND_HEAD", "LoRAEstimate", "LoRASlots",
           "LoRASupport", "MAX_LORA_RANKS", "MOE_EXPERTS_SINCE", "Refusal", "allowed_ranks", "lora_support",
           "lora_wraps_experts", "refusal_for", "ExtraVocab", "VocabCheck", "VocabLimit", "lm_head_target",
           "refusal_message", "support_table", "adapter_bytes_per_stage", "attention_elements", "dense_mlp_elements",
           "embedding_elements", "layer_elements", "mla_attention_elements", "mlp_elements", "slots_needed",
           "vocab_check", "vocab_limit"]
