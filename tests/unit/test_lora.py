"""LoRA adapters: the GPU memory vLLM reserves for adapter slots, the plan that accounts for it, and the args.

The expected bytes are rebuilt here from the tensor shapes vLLM 0.33.0 allocates in `create_lora_weights`
(`vllm/lora/layers/*.py`), one tensor at a time, independently of `planner/lora.py`'s grouping, plus one figure
worked out by hand for Llama-3.1-8B.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.api.v1alpha1 import LoRAAdapter, LoRASpec, SpecValidationError, parse_spec, validate_spec
from vllm_operator.planner import PinnedFlags, PlanRequest, plan
from vllm_operator.planner.arch import ModelArch
from vllm_operator.planner.failures import FailureKind
from vllm_operator.planner.gpus import GPUSpec
from vllm_operator.planner.lora import (
    EMBEDDING_AND_HEAD,
    LoRASlots,
    adapter_bytes_per_stage,
    allowed_ranks,
    lm_head_target,
    lora_support,
    refusal_message,
    support_table,
    vocab_check,
    vocab_limit,
)
from vllm_operator.planner.memory import EngineFlags, weights_bytes_per_gpu
from vllm_operator.planner.versions import NEWEST_KNOWN_VERSION
from vllm_operator.render.manifests import render_args
from vllm_operator.sources import load_model_files

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
QWEN3_8B = "Qwen/Qwen3-8B"
QWEN25_7B = "Qwen/Qwen2.5-7B-Instruct"
QWEN3_MOE = "Qwen/Qwen3-30B-A3B"


def vllm_shapes(arch: ModelArch, slots: int, rank: int, tp: int, embeddings: bool) -> list[tuple[int, ...]]:
    """The stacked A/B tensors vLLM 0.33.0 allocates, shape by shape (not fully sharded)."""
    h, hd = arch.hidden_size, arch.head_dim
    q = arch.num_heads * hd // tp
    kv = max(arch.num_kv_heads // tp, 1) * hd
    shapes: list[tuple[int, ...]] = []
    for _ in range(arch.num_layers):
        # MergedQKVParallelLinearWithLoRA: n_slices=3, A (S,1,r,input), B (S,1,slice_out,r)
        shapes += [(slots, 1, rank, h)] * 3 + [(slots, 1, q, rank), (slots, 1, kv, rank), (slots, 1, kv, rank)]
        # RowParallelLinearWithLoRA o_proj: input per partition, full output
        shapes += [(slots, 1, rank, q), (slots, 1, h, rank)]
        if arch.is_moe:
            e, inter = arch.num_experts, arch.moe_intermediate_size // tp
            shapes += [(slots, 1, rank, h), (slots, 1, e, rank)]                 # ReplicatedLinear router
            shapes += [(slots, e, rank, h)] * 2 + [(slots, e, rank, inter)]      # w13 A x2, w2 A
            shapes += [(slots, e, inter, rank)] * 2 + [(slots, e, h, rank)]      # w13 B x2, w2 B
        else:
            inter = arch.intermediate_size // tp
            shapes += [(slots, 1, rank, h)] * 2 + [(slots, 1, inter, rank)] * 2  # MergedColumnParallel gate_up
            shapes += [(slots, 1, rank, inter), (slots, 1, h, rank)]             # RowParallel down_proj
    if embeddings:
        shapes += [(slots, arch.vocab_size, rank), (slots, 1, h, rank)]          # VocabParallelEmbeddingWithLoRA
        shapes += [(slots, 1, rank, h), (slots, 1, arch.vocab_size, rank)]       # LogitsProcessorWithLoRA
    return shapes


def shapes_bytes(shapes: list[tuple[int, ...]], dtype_bytes: int = 2) -> int:
    return sum(math.prod(s) for s in shapes) * dtype_bytes


def test_llama_8b_one_slot_rank_16_by_hand(load_arch: Callable[[str], ModelArch]) -> None:
    # per layer: qkv 3*16*4096 + 16*(4096+2*1024) = 294912; o 16*4096 + 4096*16 = 131072;
    # gate_up 2*16*4096 + 2*14336*16 = 589824; down 16*14336 + 4096*16 = 294912  -> 1310720 x 32 layers
    # embedding 128256*16 + 4096*16 = 2117632; LM head the same; bf16 -> 2 bytes
    expected = (1310720 * 32 + 2 * 2117632) * 2
    assert expected == 92_356_608
    estimate = adapter_bytes_per_stage(load_arch(LLAMA_8B), LoRASlots(max_loras=1, max_rank=16), 1, [32])
    assert estimate.per_stage == (expected,)


@pytest.mark.parametrize(("model", "slots", "rank", "tp", "embeddings"), [
    (LLAMA_8B, 1, 16, 1, True),
    (LLAMA_8B, 4, 64, 2, True),
    (LLAMA_8B, 8, 8, 8, True),          # 8 KV heads over 8 ranks
    (QWEN3_8B, 2, 32, 1, True),         # Qwen3ForCausalLM declares embedding_modules
    (QWEN25_7B, 3, 16, 4, False),       # Qwen2ForCausalLM does not: no embedding/head slots
    (QWEN3_MOE, 2, 16, 2, True),        # fused MoE experts + router
])
def test_bytes_match_vllm_tensor_shapes(load_arch: Callable[[str], ModelArch], model: str, slots: int, rank: int,
                                        tp: int, embeddings: bool) -> None:
    arch = load_arch(model)
    estimate = adapter_bytes_per_stage(arch, LoRASlots(max_loras=slots, max_rank=rank), tp, [arch.num_layers])
    assert estimate.per_stage == (shapes_bytes(vllm_shapes(arch, slots, rank, tp, embeddings)),)
    assert estimate.note == ""


DEEPSEEK_V2_LITE = "deepseek-ai/DeepSeek-V2-Lite"
DEEPSEEK_V3 = "deepseek-ai/DeepSeek-V3"
QWEN15_MOE = "Qwen/Qwen1.5-MoE-A2.7B"


def deepseek_shapes(cfg: dict[str, Any], slots: int, rank: int, tp: int) -> list[tuple[int, ...]]:
    """The stacked A/B tensors vLLM 0.33.0 allocates for DeepseekV2ForCausalLM, module by module, read from the
    config.json values directly (deepseek_v2.py: DeepseekV2MLAAttention, DeepseekV2MLP, DeepseekV2MoE)."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"] // tp
    nope, rope, v, kv_lora = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    q_lora = cfg.get("q_lora_rank")
    e, moe_inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"] // tp
    shared_inter = cfg["n_shared_experts"] * cfg["moe_intermediate_size"] // tp
    shapes: list[tuple[int, ...]] = []
    for layer in range(cfg["num_hidden_layers"]):
        if q_lora:
            # fused_qkv_a_proj: MergedColumnParallelLinear(disable_tp) -> 2 slices [q_lora, kv_lora + rope]
            shapes += [(slots, 1, rank, h)] * 2 + [(slots, 1, q_lora, rank), (slots, 1, kv_lora + rope, rank)]
            shapes += [(slots, 1, rank, q_lora), (slots, 1, heads * (nope + rope), rank)]   # q_b_proj (column)
        else:
            shapes += [(slots, 1, rank, h), (slots, 1, heads * (nope + rope), rank)]        # q_proj (column)
            shapes += [(slots, 1, rank, h), (slots, 1, kv_lora + rope, rank)]               # kv_a_proj_with_mqa
        shapes += [(slots, 1, rank, kv_lora), (slots, 1, heads * (nope + v), rank)]         # kv_b_proj (column)
        shapes += [(slots, 1, rank, heads * v), (slots, 1, h, rank)]                        # o_proj (row)
        if layer < cfg["first_k_dense_replace"]:
            inter = cfg["intermediate_size"] // tp
            shapes += [(slots, 1, rank, h)] * 2 + [(slots, 1, inter, rank)] * 2             # gate_up_proj
            shapes += [(slots, 1, rank, inter), (slots, 1, h, rank)]                        # down_proj
            continue
        shapes += [(slots, 1, rank, h), (slots, 1, e, rank)]                                # gate (GateLinear)
        shapes += [(slots, e, rank, h)] * 2 + [(slots, e, rank, moe_inter)]                 # w13 A x2, w2 A
        shapes += [(slots, e, moe_inter, rank)] * 2 + [(slots, e, h, rank)]                 # w13 B x2, w2 B
        shapes += [(slots, 1, rank, h)] * 2 + [(slots, 1, shared_inter, rank)] * 2          # shared gate_up
        shapes += [(slots, 1, rank, shared_inter), (slots, 1, h, rank)]                     # shared down
    return shapes


def _config(model: str) -> dict[str, Any]:
    files = load_model_files(model, offline=True)
    return dict(files.config)


def test_deepseek_v2_lite_one_slot_rank_16_by_hand(load_arch: Callable[[str], ModelArch]) -> None:
    # MLA per layer (h 2048, 16 heads, nope 128, rope 64, v 128, kv_lora 512, no q_lora):
    #   q_proj 16*2048 + 16*192*16 = 81920; kv_a 16*2048 + 576*16 = 41984; kv_b 16*512 + 16*256*16 = 73728;
    #   o_proj 16*16*128 + 2048*16 = 65536 -> 263168
    # layer 0 dense MLP (10944): 2*16*2048 + 2*10944*16 + 16*10944 + 2048*16 = 623616
    # layers 1-26 MoE: gate 16*2048 + 64*16 = 33792; 64 experts 64*16*(2*2048 + 1408 + 2*1408 + 2048) = 10616832;
    #   2 shared experts (2816): 2*16*2048 + 2*2816*16 + 16*2816 + 2048*16 = 233472 -> 10884096
    # no embedding_modules on DeepseekV2ForCausalLM; bf16
    expected = ((263168 + 623616) + 26 * (263168 + 10884096)) * 2
    assert expected == 581_431_296
    arch = load_arch(DEEPSEEK_V2_LITE)
    estimate = adapter_bytes_per_stage(arch, LoRASlots(max_loras=1, max_rank=16), 1, [27])
    assert estimate.per_stage == (expected,)
    assert estimate.note == ""


@pytest.mark.parametrize(("model", "slots", "rank", "tp"), [
    (DEEPSEEK_V2_LITE, 1, 16, 1),
    (DEEPSEEK_V2_LITE, 4, 64, 2),
    (DEEPSEEK_V3, 2, 8, 8),        # q_lora_rank 1536: fused_qkv_a_proj + q_b_proj, 3 dense layers
])
def test_mla_bytes_match_vllm_tensor_shapes(load_arch: Callable[[str], ModelArch], model: str, slots: int,
                                            rank: int, tp: int) -> None:
    arch = load_arch(model)
    estimate = adapter_bytes_per_stage(arch, LoRASlots(max_loras=slots, max_rank=rank), tp, [arch.num_layers])
    assert estimate.per_stage == (shapes_bytes(deepseek_shapes(_config(model), slots, rank, tp)),)


def test_mla_dense_layers_sit_on_the_first_stage(load_arch: Callable[[str], ModelArch]) -> None:
    arch = load_arch(DEEPSEEK_V3)  # 61 layers, the first 3 dense
    slots = LoRASlots(max_loras=1, max_rank=16)
    whole = adapter_bytes_per_stage(arch, slots, 8, [61]).per_stage[0]
    first, second = adapter_bytes_per_stage(arch, slots, 8, [31, 30]).per_stage
    assert first + second == whole
    dense = adapter_bytes_per_stage(arch, slots, 8, [1, 60]).per_stage[0]  # layer 0 alone: dense
    moe = second // 30
    assert second == 30 * moe and first == 3 * dense + 28 * moe
    assert dense < moe


def test_qwen2_moe_counts_the_shared_expert_and_its_gate(load_arch: Callable[[str], ModelArch]) -> None:
    arch = load_arch(QWEN15_MOE)
    cfg = _config(QWEN15_MOE)
    assert arch.shared_expert_size == cfg["shared_expert_intermediate_size"] and arch.shared_expert_gate
    rank, h, inter = 16, arch.hidden_size, cfg["shared_expert_intermediate_size"]
    plain = arch.model_copy(update={"shared_expert_size": 0, "shared_expert_gate": False})
    per_layer = (2 * rank * h + 2 * inter * rank + rank * inter + h * rank) + (rank * h + 1 * rank)
    extra = (adapter_bytes_per_stage(arch, LoRASlots(max_rank=rank), 1, [arch.num_layers]).per_stage[0]
             - adapter_bytes_per_stage(plain, LoRASlots(max_rank=rank), 1, [arch.num_layers]).per_stage[0])
    assert extra == per_layer * arch.num_layers * 2


def test_pipeline_stages_split_layers_and_put_embedding_first_head_last(
        load_arch: Callable[[str], ModelArch]) -> None:
    arch = load_arch(LLAMA_8B)
    slots = LoRASlots(max_loras=2, max_rank=16)
    whole = adapter_bytes_per_stage(arch, slots, 1, [32]).per_stage[0]
    first, last = adapter_bytes_per_stage(arch, slots, 1, [16, 16]).per_stage
    assert first + last == whole
    embed = (arch.vocab_size * 16 + arch.hidden_size * 16) * 2 * 2
    head = (16 * arch.hidden_size + arch.vocab_size * 16) * 2 * 2
    assert first - embed == last - head  # the same 16 decoder layers on each stage


def test_slots_scale_linearly_and_rank_too(load_arch: Callable[[str], ModelArch]) -> None:
    arch = load_arch(LLAMA_8B)
    one = adapter_bytes_per_stage(arch, LoRASlots(max_loras=1, max_rank=16), 1, [32]).per_stage[0]
    assert adapter_bytes_per_stage(arch, LoRASlots(max_loras=4, max_rank=16), 1, [32]).per_stage[0] == 4 * one
    assert adapter_bytes_per_stage(arch, LoRASlots(max_loras=1, max_rank=64), 1, [32]).per_stage[0] == 4 * one


def test_weights_include_the_slots(load_arch: Callable[[str], ModelArch]) -> None:
    arch = load_arch(LLAMA_8B)
    base = EngineFlags(max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=8192)
    lora = base.model_copy(update={"max_loras": 4, "max_lora_rank": 64})
    added = adapter_bytes_per_stage(arch, LoRASlots(max_loras=4, max_rank=64), 1, [32]).per_stage[0]
    assert weights_bytes_per_gpu(arch, lora)[0] - weights_bytes_per_gpu(arch, base)[0] == added


def test_plan_with_lora_reports_less_kv_than_without(load_arch: Callable[[str], ModelArch],
                                                     gpu: Callable[[str], GPUSpec]) -> None:
    arch = load_arch(LLAMA_8B)
    # max-num-seqs pinned: the planner sizes it from the KV capacity, and the activation peak and MRV2's sampler
    # state grow with it, so both plans keep the same one and differ by the adapter slots alone
    pinned = {"max_model_len": 8192, "gpu_memory_utilization": 0.9, "max_num_seqs": 128}
    without = plan(PlanRequest(arch=arch, gpu=gpu("h100"), pinned=PinnedFlags(**pinned)))
    with_lora = plan(PlanRequest(arch=arch, gpu=gpu("h100"), pinned=PinnedFlags(**pinned), lora=LoRASpec(
        adapters=[LoRAAdapter(name="sql", source="org/sql-lora")], max_loras=8, max_rank=64)))
    assert without.fits and with_lora.fits
    reserved_gib = adapter_bytes_per_stage(arch, LoRASlots(max_loras=8, max_rank=64), 1, [32]).per_stage[0] / 2**30
    assert reserved_gib == pytest.approx(2.75, abs=0.01)  # 8 slots x rank 64 = 32 x 88.08 MiB
    assert with_lora.memory.kv_cache_gib < without.memory.kv_cache_gib
    assert with_lora.memory.kv_cache_gib == pytest.approx(without.memory.kv_cache_gib - reserved_gib, abs=0.02)
    assert with_lora.prediction.kv_cache_tokens < without.prediction.kv_cache_tokens
    assert any("LoRA: 8 adapter slot(s) at rank 64" in r for r in with_lora.reasons)
    args, dropped = render_args(with_lora.flags, with_lora.vllm_version, tuple(with_lora.pinned))
    assert not dropped
    joined = " ".join(args)
    for part in ("--enable-lora", "--max-loras 8", "--max-lora-rank 64", "--lora-modules sql=org/sql-lora"):
        assert part in joined


# --- the LM head's vocabulary limit (LogitsProcessorWithLoRA.create_lora_weights, read from the wheels) -----------

@pytest.mark.parametrize(("version", "limit", "text"), [
    ("0.5.0", 128512, "ValueError: When using LoRA, vocab size must be 32000 >= vocab_size <= 128512"),
    ("0.5.4", 128512, "ValueError: When using LoRA, vocab size must be 32000 >= vocab_size <= 128512"),
    ("0.5.5", 257024, "ValueError: When using LoRA, vocab size must be 32000 >= vocab_size <= 257024"),
    ("0.16.0", 257024, "ValueError: When using LoRA, vocab size must be 32000 >= vocab_size <= 257024"),
    ("0.17.0", 258048, "ValueError: When using LoRA, vocab size must be <= 258048"),
    ("0.33.0", 258048, "ValueError: When using LoRA, vocab size must be <= 258048"),
])
def test_vocab_limit_per_release(version: str, limit: int, text: str) -> None:
    era = vocab_limit(version)
    assert era is not None and era.max == limit and era.text == text
    assert vocab_limit("0.4.3") is None  # before the oldest checked wheel: no prediction


def test_llama_3_with_the_extra_vocab_is_exactly_the_0_5_4_limit() -> None:
    """Before 0.12.0 Llama's logits processor has config.vocab_size + lora_extra_vocab_size (256) entries: Llama 3's
    128,256 + 256 = 128,512, the 0.5.x limit, so it is served; one more token is refused."""
    assert lm_head_target(["LlamaForCausalLM"], "0.5.4")[0] == "extra"
    assert vocab_check(["LlamaForCausalLM"], 128256, "0.5.4") is None
    check = vocab_check(["LlamaForCausalLM"], 128257, "0.5.4")
    assert check is not None and check.refused is True and check.vocab == 128513
    # 0.11.x still widens it, 0.12.0 does not (lora_extra_vocab_size gone)
    assert vocab_check(["LlamaForCausalLM"], 256896, "0.11.2") is not None
    assert vocab_check(["LlamaForCausalLM"], 256896, "0.12.0") is None
    assert lm_head_target(["LlamaForCausalLM"], "0.12.0")[0] == "yes"


def test_a_head_that_is_no_lora_target_has_no_limit() -> None:
    # MistralForCausalLM subclasses LlamaForCausalLM but sets embedding_modules = {} from 0.16.0 (mistral.py)
    assert lm_head_target(["MistralForCausalLM"], "0.33.0")[0] == "no"
    assert vocab_check(["MistralForCausalLM"], 262144, "0.33.0") is None
    assert vocab_check(["Gemma2ForCausalLM"], 300000, "0.33.0") is None  # no lm_head target (tied embeddings)
    unknown = vocab_check(["LlavaForConditionalGeneration"], 262144, "0.33.0")  # multimodal: not tabled
    assert unknown is not None and unknown.refused is None


def test_plan_refuses_lora_on_a_vocabulary_the_release_does_not_take(
        load_arch: Callable[[str], ModelArch], gpu: Callable[[str], GPUSpec]) -> None:
    big = load_arch(LLAMA_8B).model_copy(update={"vocab_size": 262144})
    pinned = PinnedFlags(enable_lora=True, max_model_len=8192)
    for version, text in (("0.33.0", "ValueError: When using LoRA, vocab size must be <= 258048"),
                          ("0.16.0", "ValueError: When using LoRA, vocab size must be 32000 >= vocab_size <= 257024")):
        result = plan(PlanRequest(arch=big, gpu=gpu("h100"), pinned=pinned, vllm_version=version))
        assert not result.fits and result.failure is not None
        assert result.failure.kind is FailureKind.INVALID_ARGUMENT and result.failure.message == text
        assert result.options == []
        assert any("makes the LM head of LlamaForCausalLM a LoRA target" in r and "262,144 tokens" in r
                   for r in result.reasons), result.reasons
        plain = plan(PlanRequest(arch=big, gpu=gpu("h100"), pinned=PinnedFlags(max_model_len=8192),
                                 vllm_version=version))
        assert plain.fits  # it is the LoRA head that vLLM refuses
    widened = load_arch(LLAMA_8B).model_copy(update={"vocab_size": 257000})
    old = plan(PlanRequest(arch=widened, gpu=gpu("h100"), pinned=pinned, vllm_version="0.11.0"))
    assert not old.fits and any("257,256 tokens (config.json's 257,000 + lora_extra_vocab_size)" in r
                                for r in old.reasons)
    assert plan(PlanRequest(arch=widened, gpu=gpu("h100"), pinned=pinned, vllm_version="0.12.0")).fits


def test_an_unknown_head_is_a_reason_not_a_refusal(load_arch: Callable[[str], ModelArch],
                                                   gpu: Callable[[str], GPUSpec]) -> None:
    arch = load_arch(LLAMA_8B).model_copy(update={"vocab_size": 262144,
                                                  "architectures": ("LlavaForConditionalGeneration",)})
    result = plan(PlanRequest(arch=arch, gpu=gpu("h100"), pinned=PinnedFlags(enable_lora=True, max_model_len=8192),
                              vllm_version="0.33.0"))
    assert result.fits  # a multimodal class builds its language model as a submodule: the table cannot tell
    assert any("is not known" in r and "258,048" in r for r in result.reasons), result.reasons


def test_slot_sizing_wraps_the_heads_the_table_finds_in_0_33() -> None:
    """The memory arithmetic counts the embedding and LM head slots for exactly the text-generation architectures
    whose 0.33.0 class has "lm_head" in its embedding_modules (declared or inherited): the generated table."""
    table = support_table()
    wrapped = {arch for arch in table.lm_head if lm_head_target([arch], "0.33.0")[0] in ("yes", "extra")}
    assert wrapped == EMBEDDING_AND_HEAD


# --- spec.lora -> args, per release --------------------------------------------------------------------

def _run(spec: dict[str, Any]) -> reconcile.Desired:
    files = load_model_files(spec["model"]["name"], offline=True)
    return reconcile.desired_state(reconcile.Observed(
        name="svc", namespace="ns", uid="u", generation=1, spec=spec, status={},
        now=datetime(2025, 1, 1, tzinfo=UTC),
        nodes=({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "1"},),
        model_files=files))


def _container_args(desired: reconcile.Desired) -> list[str]:
    assert desired.children is not None
    deployment = next(c for c in desired.children if c["kind"] == "Deployment")
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def test_spec_lora_renders_the_flags_and_lowers_kv() -> None:
    base = {"model": {"name": LLAMA_8B}, "workload": {"contextLength": 8192}}
    plain = _run(base)
    served = _run({**base, "lora": {"adapters": [{"name": "sql", "source": "org/sql-lora"},
                                                 {"name": "chat", "source": "/adapters/chat"}],
                                    "maxRank": 32}})
    args = _container_args(served)
    at = args.index("--lora-modules")
    assert args[at + 1: at + 3] == ["sql=org/sql-lora", "chat=/adapters/chat"]
    assert "--enable-lora" in args
    assert args[args.index("--max-loras") + 1] == "2"  # one slot per declared adapter by default
    assert args[args.index("--max-lora-rank") + 1] == "32"
    assert plain.plan is not None and served.plan is not None
    assert served.plan.prediction.kv_cache_tokens < plain.plan.prediction.kv_cache_tokens
    assert served.status.plan is not None and "--lora-modules" in served.status.plan.args


def test_pinned_enable_lora_and_rank_reach_the_args() -> None:
    args = _container_args(_run({"model": {"name": LLAMA_8B}, "flags": {"enableLora": True, "maxLoraRank": 64}}))
    assert "--enable-lora" in args and args[args.index("--max-lora-rank") + 1] == "64"


def test_lora_modules_on_a_release_without_it_is_an_invalid_spec() -> None:
    desired = _run({"model": {"name": LLAMA_8B}, "image": "vllm/vllm-openai:v0.3.1",
                    "lora": {"adapters": [{"name": "sql", "source": "org/sql-lora"}]}})
    assert desired.children is None
    found = {c.type: (c.status, c.reason, c.message) for c in desired.status.conditions}
    assert found[cond.DEGRADED][:2] == (cond.TRUE, cond.INVALID_SPEC)
    assert "spec.lora" in found[cond.DEGRADED][2] and "0.3.2" in found[cond.DEGRADED][2]


@pytest.mark.parametrize(("lora", "flags", "fragment"), [
    ({"adapters": [{"name": "a", "source": "x/y"}, {"name": "a", "source": "x/z"}]}, {}, "unique"),
    ({"adapters": [{"name": "a=b", "source": "x/y"}]}, {}, "lora.adapters[0].name"),
    ({"adapters": [{"name": "a", "source": "x y"}]}, {}, "lora.adapters[0].source"),
    ({"maxRank": 12}, {}, "lora.maxRank"),
    ({"maxLoras": 0}, {}, "lora.maxLoras"),
    ({"maxRank": 16}, {"enableLora": True, "maxLoraRank": 32}, "set the rank in one place"),
    ({}, {"enableLora": False}, "flags.enableLora"),
])
def test_bad_lora_specs_are_rejected(lora: dict[str, Any], flags: dict[str, Any], fragment: str) -> None:
    spec = {"model": {"name": LLAMA_8B}, "lora": lora, "flags": flags}
    errors = validate_spec(spec)
    assert errors and any(fragment in f"{e.field}: {e.message}" for e in errors), errors
    with pytest.raises(SpecValidationError):
        parse_spec(spec)


def test_extra_args_cannot_smuggle_lora_flags() -> None:
    errors = validate_spec({"model": {"name": LLAMA_8B}, "extraArgs": ["--max-loras", "4"]})
    assert any("spec.lora.maxLoras" in e.message for e in errors), errors


# --- which architectures a release serves with LoRA (catalog/lora_support.yaml) ---------------------------------

GPT_OSS = "openai/gpt-oss-20b"
GPT_OSS_TEXT_0_10 = "ValueError: GptOssForCausalLM does not support LoRA yet."  # lora_model_runner_mixin.py, 0.10.2
CONFIG_TEXT_0_33 = ("Value error, LoRA is not supported for MambaForCausalLM (state-spaces/mamba-like). Supported "
                    "models implement the `SupportsLoRA` interface. Run this model without `enable_lora`.")


def test_table_answers_for_every_catalog_architecture_in_the_newest_release() -> None:
    archs = {a for row in _catalog_rows() for a in row}
    assert NEWEST_KNOWN_VERSION in support_table().checked
    unknown = {a for a in archs if lora_support([a], NEWEST_KNOWN_VERSION).supported is None}
    assert not unknown


def _catalog_rows() -> list[tuple[str, ...]]:
    rows = []
    for path in resources.files("vllm_operator.catalog").joinpath("models").iterdir():
        if path.name.endswith(".json"):
            data = json.loads(path.read_text())
            rows.append(tuple((data.get("config") or data).get("architectures") or ()))
    return rows


@pytest.mark.parametrize(("arch", "version", "supported", "basis"), [
    ("GptOssForCausalLM", "0.10.2", False, "the vLLM 0.10.2 wheel"),
    ("GptOssForCausalLM", "0.11.1", True, "the vLLM 0.11.1 wheel"),
    ("GptOssForCausalLM", "0.10.1", None, "differ"),              # 0.9.2 had no such architecture
    ("DeepseekV2ForCausalLM", "0.9.0", False, "0.8.5 and 0.9.2 wheels, which agree"),
    ("LlamaForCausalLM", "0.5.1", True, "0.5.0 and 0.5.4 wheels, which agree"),
    ("NoSuchForCausalLM", "0.33.0", None, "not in the LoRA table"),
])
def test_support_per_release(arch: str, version: str, supported: bool | None, basis: str) -> None:
    answer = lora_support([arch], version)
    assert answer.supported is supported and basis in answer.basis


@pytest.mark.parametrize(("version", "cls", "text"), [
    ("0.5.4", "Qwen2MoeForCausalLM", "ValueError: Model Qwen2MoeForCausalLM does not support LoRA, but LoRA is "
                                     "enabled. Support for this model may be added in the future."),
    ("0.7.3", "Qwen2MoeForCausalLM", "AssertionError: Qwen2MoeForCausalLM does not support LoRA yet."),
    ("0.9.2", "Qwen2MoeForCausalLM", "ValueError: Qwen2MoeForCausalLM does not support LoRA yet."),
])
def test_refusal_text_per_release(version: str, cls: str, text: str) -> None:
    answer = lora_support([cls], version)
    assert answer.supported is False
    assert refusal_message(answer, "Qwen/Qwen1.5-MoE-A2.7B").startswith(text)


def test_plan_refuses_lora_where_vllm_does(load_arch: Callable[[str], ModelArch],
                                          gpu: Callable[[str], GPUSpec]) -> None:
    arch = load_arch(GPT_OSS)
    lora = LoRASpec(adapters=[LoRAAdapter(name="a", source="org/a")])
    refused = plan(PlanRequest(arch=arch, gpu=gpu("h100"), lora=lora, vllm_version="0.10.2"))
    assert not refused.fits and refused.failure is not None
    assert refused.failure.kind is FailureKind.INVALID_ARGUMENT
    assert refused.failure.message == GPT_OSS_TEXT_0_10
    assert refused.options == []  # no GPU or flag change helps
    assert any("does not implement SupportsLoRA for GptOssForCausalLM" in r for r in refused.reasons)
    served = plan(PlanRequest(arch=arch, gpu=gpu("h100"), lora=lora, vllm_version="0.33.0"))
    assert served.fits and any("implements SupportsLoRA for GptOssForCausalLM" in r for r in served.reasons)
    unknown = plan(PlanRequest(arch=arch, gpu=gpu("h100"), lora=lora, vllm_version="0.10.1"))
    assert unknown.fits and any("is not known" in r for r in unknown.reasons)
    plain = plan(PlanRequest(arch=arch, gpu=gpu("h100"), vllm_version="0.10.2"))
    assert plain.fits and not any("SupportsLoRA" in r for r in plain.reasons)  # no LoRA: nothing to say


def test_plan_prints_the_config_check_of_0_33(load_arch: Callable[[str], ModelArch],
                                              gpu: Callable[[str], GPUSpec]) -> None:
    arch = load_arch(LLAMA_8B).model_copy(update={"architectures": ("MambaForCausalLM",),
                                                  "model_id": "state-spaces/mamba-like"})
    result = plan(PlanRequest(arch=arch, gpu=gpu("h100"), pinned=PinnedFlags(enable_lora=True),
                              vllm_version="0.33.0"))
    assert not result.fits and result.failure is not None
    assert result.failure.message.startswith("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                                             "VllmConfig\n  " + CONFIG_TEXT_0_33)
    assert any("before the engine starts" in r for r in result.reasons)


def test_operator_reports_an_invalid_spec_instead_of_rolling_out() -> None:
    desired = _run({"model": {"name": GPT_OSS}, "image": "vllm/vllm-openai:v0.10.2",
                    "lora": {"adapters": [{"name": "a", "source": "org/a"}]}})
    assert desired.children is None
    found = {c.type: (c.status, c.reason, c.message) for c in desired.status.conditions}
    assert found[cond.DEGRADED][:2] == (cond.TRUE, cond.INVALID_SPEC)
    message = found[cond.DEGRADED][2]
    assert message.startswith("spec.lora: vLLM 0.10.2 does not serve GptOssForCausalLM with LoRA")
    assert GPT_OSS_TEXT_0_10 in message
    pinned = _run({"model": {"name": GPT_OSS}, "image": "vllm/vllm-openai:v0.10.2", "flags": {"enableLora": True}})
    assert pinned.children is None
    assert any(c.message.startswith("spec.flags.enableLora: vLLM 0.10.2") for c in pinned.status.conditions)
    assert _run({"model": {"name": GPT_OSS}, "image": "vllm/vllm-openai:v0.33.0",
                 "lora": {"adapters": [{"name": "a", "source": "org/a"}]}}).children is not None


# --- --max-lora-rank choices per release -------------------------------------------------------------------------

@pytest.mark.parametrize(("version", "ranks"), [
    ("0.5.4", (8, 16, 32, 64)),
    ("0.5.5", (8, 16, 32, 64, 128, 256)),
    ("0.7.3", (8, 16, 32, 64, 128, 256)),
    ("0.8.0", (8, 16, 32, 64, 128, 256, 320, 512)),
    ("0.11.0", (8, 16, 32, 64, 128, 256, 320, 512)),
    ("0.11.1", (1, 8, 16, 32, 64, 128, 256, 320, 512)),
    ("0.33.0", (1, 8, 16, 32, 64, 128, 256, 320, 512)),
])
def test_rank_choices_per_release(version: str, ranks: tuple[int, ...]) -> None:
    assert allowed_ranks(version) == ranks


@pytest.mark.parametrize(("image", "lora", "flags", "fragment"), [
    ("v0.5.4", {"maxRank": 128}, {}, "spec.lora.maxRank: vLLM 0.5.4 accepts --max-lora-rank 8, 16, 32, 64, not 128"),
    ("v0.11.0", {"maxRank": 1}, {}, "spec.lora.maxRank: vLLM 0.11.0 accepts --max-lora-rank 8, 16, 32, 64, 128, "
                                    "256, 320, 512, not 1"),
    ("v0.7.3", None, {"enableLora": True, "maxLoraRank": 512},
     "spec.flags.maxLoraRank: vLLM 0.7.3 accepts --max-lora-rank 8, 16, 32, 64, 128, 256, not 512"),
])
def test_a_rank_the_release_refuses_is_an_invalid_spec(image: str, lora: dict[str, Any] | None,
                                                        flags: dict[str, Any], fragment: str) -> None:
    spec: dict[str, Any] = {"model": {"name": LLAMA_8B}, "image": f"vllm/vllm-openai:{image}", "flags": flags}
    if lora is not None:
        spec["lora"] = lora
    desired = _run(spec)
    assert desired.children is None
    messages = [c.message for c in desired.status.conditions if c.reason == cond.INVALID_SPEC]
    assert any(fragment in m for m in messages), messages


def test_a_rank_the_release_accepts_deploys() -> None:
    assert _run({"model": {"name": LLAMA_8B}, "image": "vllm/vllm-openai:v0.11.1",
                 "lora": {"maxRank": 1}}).children is not None


# --- the wheel reader behind the table ---------------------------------------------------------------------------

def _wheel_reader() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "scripts" / "lora_support.py"
    spec = importlib.util.spec_from_file_location("lora_support_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_release(root: Path, interface: bool) -> Path:
    models = root / "vllm" / "model_executor" / "models"
    models.mkdir(parents=True)
    if interface:
        (models / "interfaces.py").write_text("class SupportsLoRA(Protocol):\n    supports_lora = True\n")
    (models / "registry.py").write_text(
        '_TEXT = {"LlamaForCausalLM": ("llama", "LlamaForCausalLM"),\n'
        '         "MistralForCausalLM": ("llama", "LlamaForCausalLM"),\n'
        '         "ChildForCausalLM": ("child", "ChildForCausalLM"),\n'
        '         "FlaggedForCausalLM": ("child", "FlaggedForCausalLM"),\n'
        '         "OldForCausalLM": ("old", "OldForCausalLM"),\n'
        '         "EmptyForCausalLM": ("old", "EmptyForCausalLM"),\n'
        '         "PlainForCausalLM": ("plain", "PlainForCausalLM")}\n')
    (models / "llama.py").write_text("class LlamaForCausalLM(nn.Module, SupportsLoRA, SupportsPP):\n    pass\n")
    (models / "child.py").write_text("from .llama import LlamaForCausalLM\n"
                                     "class ChildForCausalLM(LlamaForCausalLM):\n    pass\n"
                                     "class FlaggedForCausalLM(nn.Module):\n    supports_lora = True\n")
    (models / "old.py").write_text("class OldForCausalLM(nn.Module):\n    supported_lora_modules = ['qkv_proj']\n"
                                   "class EmptyForCausalLM(nn.Module):\n    supported_lora_modules = []\n")
    (models / "plain.py").write_text("class PlainForCausalLM(nn.Module, SupportsPP):\n    pass\n")
    return root


def test_wheel_reader_follows_the_registry_and_base_classes(tmp_path: Path) -> None:
    release_support = _wheel_reader().release_support
    with_interface = release_support(_fake_release(tmp_path / "0.9.9", interface=True))
    assert with_interface == {
        "ChildForCausalLM": (True, "ChildForCausalLM"), "EmptyForCausalLM": (False, "EmptyForCausalLM"),
        "FlaggedForCausalLM": (True, "FlaggedForCausalLM"), "LlamaForCausalLM": (True, "LlamaForCausalLM"),
        "MistralForCausalLM": (True, "LlamaForCausalLM"),
        "OldForCausalLM": (False, "OldForCausalLM"),  # the protocol needs the flag: modules alone are not enough
        "PlainForCausalLM": (False, "PlainForCausalLM"),
    }
    before = release_support(_fake_release(tmp_path / "0.5.0", interface=False))  # loader: supported_lora_modules
    assert before["OldForCausalLM"] == (True, "OldForCausalLM")
    assert before["EmptyForCausalLM"] == (False, "EmptyForCausalLM")
    assert before["LlamaForCausalLM"] == (False, "LlamaForCausalLM")


# --- the fused MoE experts get slots only from 0.11.1 (lora/layers/fused_moe.py) ---------------------------------

def test_experts_get_slots_from_0_11_1(load_arch: Callable[[str], ModelArch], gpu: Callable[[str], GPUSpec]) -> None:
    arch = load_arch(QWEN3_MOE)
    rank, tp = 16, 1
    inter, h, e = arch.moe_intermediate_size, arch.hidden_size, arch.num_experts
    experts_bytes = e * rank * (2 * h + inter + 2 * inter + h) * arch.num_layers * 2  # w13/w2 A and B, bf16
    with_experts = adapter_bytes_per_stage(arch, LoRASlots(max_rank=rank), tp, [arch.num_layers]).per_stage[0]
    without = adapter_bytes_per_stage(arch, LoRASlots(max_rank=rank, moe_experts=False), tp,
                                      [arch.num_layers]).per_stage[0]
    assert with_experts - without == experts_bytes
    lora = LoRASpec(adapters=[LoRAAdapter(name="a", source="org/a")])
    pinned = PinnedFlags(max_model_len=8192, max_num_seqs=64, gpu_memory_utilization=0.9)
    old = plan(PlanRequest(arch=arch, gpu=gpu("h100"), pinned=pinned, lora=lora, vllm_version="0.11.0"))
    new = plan(PlanRequest(arch=arch, gpu=gpu("h100"), pinned=pinned, lora=lora, vllm_version="0.11.1"))
    assert any("routed experts get no slots before vLLM 0.11.1" in r for r in old.reasons)
    assert not any("routed experts get no slots" in r for r in new.reasons)
    assert new.memory.weights_gib - old.memory.weights_gib == pytest.approx(experts_bytes / 2**30, abs=0.02)


def _fake_head_release(root: Path, *, all_linear: bool, extra_vocab: bool) -> Path:
    models = root / "vllm" / "model_executor" / "models"
    models.mkdir(parents=True)
    (root / "vllm" / "lora").mkdir()
    (root / "vllm" / "lora" / "utils.py").write_text("def get_supported_lora_modules(model):\n    pass\n"
                                                     if all_linear else "")
    (root / "vllm" / "config.py").write_text("class LoRAConfig:\n    lora_extra_vocab_size: int = 256\n"
                                             if extra_vocab else "class LoRAConfig:\n    pass\n")
    (models / "registry.py").write_text(
        '_TEXT_GENERATION_MODELS = {"LlamaForCausalLM": ("llama", "LlamaForCausalLM"),\n'
        '    "PhiForCausalLM": ("phi", "PhiForCausalLM"), "MistralForCausalLM": ("phi", "MistralForCausalLM"),\n'
        '    "AliasForCausalLM": ("phi", "AliasForCausalLM"), "OldForCausalLM": ("phi", "OldForCausalLM")}\n'
        '_MULTIMODAL_MODELS = {"LlavaForConditionalGeneration": ("llava", "LlavaForConditionalGeneration")}\n')
    (models / "llama.py").write_text(
        "class LlamaForCausalLM(nn.Module):\n"
        "    embedding_modules = {'embed_tokens': 'input_embeddings', 'lm_head': 'output_embeddings'}\n"
        "    supported_lora_modules = ['qkv_proj', 'lm_head']\n"
        "    def __init__(self, lora_config):\n"
        "        self.unpadded_vocab_size += lora_config.lora_extra_vocab_size\n")
    (models / "phi.py").write_text(
        "from .llama import LlamaForCausalLM\n"
        "class PhiForCausalLM(LlamaForCausalLM):\n    packed_modules_mapping = {}\n"      # inherits both
        "class MistralForCausalLM(LlamaForCausalLM):\n    embedding_modules = {}\n"         # overrides: no head
        "    def __init__(self):\n        pass\n"                                           # and no extra vocab
        "class AliasForCausalLM(nn.Module):\n    embedding_modules = LlamaForCausalLM.embedding_modules\n"
        "class OldForCausalLM(nn.Module):\n    supported_lora_modules = ['qkv_proj']\n")
    (models / "llava.py").write_text("class LlavaForConditionalGeneration(nn.Module):\n    pass\n")
    return root


def test_wheel_reader_finds_the_lm_head_targets(tmp_path: Path) -> None:
    release_heads = _wheel_reader().release_heads
    new = release_heads(_fake_head_release(tmp_path / "0.12.0", all_linear=True, extra_vocab=False))
    assert new == {"AliasForCausalLM": ("yes", "AliasForCausalLM"), "LlamaForCausalLM": ("yes", "LlamaForCausalLM"),
                   "MistralForCausalLM": ("no", "MistralForCausalLM"), "OldForCausalLM": ("no", "OldForCausalLM"),
                   "PhiForCausalLM": ("yes", "PhiForCausalLM")}  # multimodal classes are not tabled
    widened = release_heads(_fake_head_release(tmp_path / "0.11.0", all_linear=True, extra_vocab=True))
    assert {a: v for a, (v, _) in widened.items()} == {
        "AliasForCausalLM": "yes",  # no __init__ in its MRO that adds the extra vocabulary
        "LlamaForCausalLM": "extra", "PhiForCausalLM": "extra", "MistralForCausalLM": "no", "OldForCausalLM": "no"}
    old = release_heads(_fake_head_release(tmp_path / "0.7.3", all_linear=False, extra_vocab=True))
    assert {a: v for a, (v, _) in old.items()} == {  # before 0.8.0: the supported_lora_modules list decides
        "AliasForCausalLM": "no", "LlamaForCausalLM": "extra", "PhiForCausalLM": "extra",
        "MistralForCausalLM": "yes",  # inherits the list with lm_head; its own __init__ adds no extra vocabulary
        "OldForCausalLM": "no"}


def test_interleaved_moe_layers_get_dense_slots_between_the_moe_ones() -> None:
    """Llama-4 Maverick: routed experts on every second layer (interleave_moe_layer_step 2), a dense MLP of
    intermediate_size_mlp on the others; the dense layers' slots are those of the dense MLP, not of a MoE layer's
    router, experts and shared expert (was: every layer past first_k_dense_replace = 0 counted as MoE)."""
    from kit.catalog import catalog_arch
    from vllm_operator.planner.lora import (
        LoRASlots,
        adapter_bytes_per_stage,
        embedding_elements,
        layer_elements,
    )

    arch = catalog_arch("meta-llama/Llama-4-Maverick-17B-128E-Instruct")
    assert [arch.dense_mlp_layer(i) for i in range(4)] == [True, False, True, False]
    rank, tp = 16, 8
    dense, moe = layer_elements(arch, rank, tp, 0), layer_elements(arch, rank, tp, 1)
    assert dense < moe
    embed, head = embedding_elements(arch, rank)
    slots = LoRASlots(max_loras=2, max_rank=rank)
    by_layer = sum(layer_elements(arch, rank, tp, i) for i in range(arch.num_layers))
    assert by_layer == 24 * dense + 24 * moe
    [one] = adapter_bytes_per_stage(arch, slots, tp, [arch.num_layers]).per_stage
    assert one == (by_layer + embed + head) * 2 * 2
    two = adapter_bytes_per_stage(arch, slots, tp, [24, 24]).per_stage
    assert two == ((12 * dense + 12 * moe + embed) * 4, (12 * dense + 12 * moe + head) * 4)
