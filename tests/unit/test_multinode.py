"""planner.multinode: the split over nodes, per-stage memory (hand-checked), and when a plan spans nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from vllm_operator.planner import PinnedFlags, PlanRequest
from vllm_operator.planner.arch import ModelArch
from vllm_operator.planner.gpus import GPUSpec
from vllm_operator.planner.multinode import (
    candidate_splits,
    multinode_document,
    nodes_for,
    plan_across_nodes,
    pp_partition,
    render_multinode_text,
)

LLAMA_405B = "meta-llama/Llama-3.1-405B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
DEEPSEEK_R1 = "deepseek-ai/DeepSeek-R1"
GiB = 2**30

Make = Callable[..., PlanRequest]


@pytest.fixture
def make(load_arch: Callable[[str], ModelArch], gpu: Callable[[str], GPUSpec]) -> Make:
    def build(model: str, gpu_name: str, **kwargs: Any) -> PlanRequest:
        return PlanRequest(arch=load_arch(model), gpu=gpu(gpu_name), **kwargs)

    return build


@pytest.mark.parametrize(("layers", "pp", "expected"), [
    (126, 2, [63, 63]),            # Llama-3.1-405B over two nodes
    (61, 2, [31, 30]),             # DeepSeek-V3/R1: the remainder goes to the stage before the last
    (80, 3, [27, 27, 26]),         # remainder 2: stages -2 and -3 (the last keeps the norm and lm_head)
    (62, 4, [15, 16, 16, 15]),     # remainder 2 <= pp-2: the middle stages, never the first or the last
    (80, 4, [20, 20, 20, 20]),
    (61, 16, [3, 3] + [4] * 13 + [3]),  # 61 = 16*3 + 13: stages 2..14 get one more
])
def test_pp_partition_is_vllms_get_pp_indices(layers: int, pp: int, expected: list[int]) -> None:
    assert pp_partition(layers, pp) == expected
    assert sum(expected) == layers


def test_pp_partition_override_is_validated_as_vllm_does() -> None:
    assert pp_partition(126, 2, "64,62") == [64, 62]
    for bad in ("64,61", "126", "a,b", "127,-1"):
        with pytest.raises(ValueError, match="VLLM_PP_LAYER_PARTITION"):
            pp_partition(126, 2, bad)


@pytest.mark.parametrize(("world", "gpus", "nodes"), [
    (16, 8, 2), (8, 8, 1), (12, 8, 2), (10, 4, 5), (4, 2, 2), (3, 2, 3),
])
def test_nodes_for_needs_world_divisible_by_nodes(world: int, gpus: int, nodes: int) -> None:
    assert nodes_for(world, gpus) == nodes
    assert world % nodes == 0 and world // nodes <= gpus


def test_405b_on_two_h100_nodes_per_stage_numbers_by_hand(make: Make) -> None:
    result = plan_across_nodes(make(LLAMA_405B, "h100"), gpus_per_node=8, max_nodes=2)
    assert result.fits and result.spans_nodes
    s = result.split
    assert (s.nodes, s.gpus_per_node, s.tensor_parallel_size, s.pipeline_parallel_size) == (2, 8, 8, 2)
    assert [st.layers for st in result.stages] == [63, 63]
    # By hand: one decoder layer = attention 2*16384^2 + 2*16384*1024 + MLP 3*16384*53248 + norms 2*16384
    # = 3,187,703,808 params; the embedding (stage 0) and lm_head (stage 1) are 128256*16384 = 2,101,346,304 each.
    # Stage weights per GPU at TP 8, BF16: (63*3,187,703,808 + 2,101,346,304) * 2 / 8 = 50,731,671,552 B = 47.25 GiB;
    # the model adds vLLM's loader overhead (0.15%) and the rope cache (131072*128*2 B = 32 MiB): 47.35 GiB.
    by_hand = (63 * 3_187_703_808 + 2_101_346_304) * 2 / 8 / GiB
    for stage in result.stages:
        assert stage.weights_gib == pytest.approx(by_hand, rel=0.004)
    # KV per token per GPU: 2 (K,V) * 63 layers * max(1, 8 KV heads / TP 8) * 128 head dim * 2 B = 32,256 B
    assert [st.kv_bytes_per_token for st in result.stages] == [32_256, 32_256]
    # the last stage runs the sampler over the vocabulary: more activation, fewer blocks, and it caps both stages
    assert result.stages[1].activation_gib > result.stages[0].activation_gib
    assert result.limiting_stage == 1
    assert result.plan.prediction.num_blocks == min(st.num_blocks for st in result.stages)
    # blocks = KV bytes / (16 tokens * 32,256 B)
    kv_bytes = result.stages[1].kv_cache_gib * GiB
    assert result.stages[1].num_blocks == pytest.approx(kv_bytes / (16 * 32_256), rel=0.001)
    assert result.plan.flags["tensor_parallel_size"] == 8
    assert result.plan.flags["pipeline_parallel_size"] == 2
    assert result.plan.pinned == []


def test_deepseek_r1_stage_with_lm_head_and_moe_layers_limits(make: Make) -> None:
    result = plan_across_nodes(make(DEEPSEEK_R1, "h100"), gpus_per_node=8, max_nodes=2)
    assert result.fits and result.split.nodes == 2
    assert [st.layers for st in result.stages] == [31, 30]
    # MLA: one latent of 512 + 64 rope dims per layer, not split by TP: 31 * 576 * 2 B and 30 * 576 * 2 B
    assert [st.kv_bytes_per_token for st in result.stages] == [35_712, 34_560]
    # stage 0 holds the 3 dense layers (first_k_dense_replace) and 28 MoE layers; stage 1 30 MoE layers + lm_head
    assert result.stages[1].weights_gib > result.stages[0].weights_gib
    assert result.limiting_stage == 1


def test_one_node_is_kept_when_it_fits(make: Make) -> None:
    result = plan_across_nodes(make(LLAMA_70B, "h100"), gpus_per_node=8, max_nodes=4)
    assert result.fits and not result.spans_nodes
    assert result.split.nodes == 1
    assert "pipeline_parallel_size" not in result.plan.flags
    assert "spans nodes" not in result.headline()


def test_max_nodes_one_never_spans_but_offers_the_nodes_it_would_take(make: Make) -> None:
    result = plan_across_nodes(make(LLAMA_405B, "h100"), gpus_per_node=8, max_nodes=1)
    assert not result.fits and result.split.nodes == 1
    spans = [i for i, o in enumerate(result.options) if o.summary.startswith("Span 2 nodes of 8× H100")]
    assert len(spans) == 1, [o.summary for o in result.options]
    span = result.options[spans[0]]
    assert span.gpu_count == 16 and span.flags["pipeline_parallel_size"] == 2
    # issue 23: after every single-node option of these GPUs (FP8 weights on the same node), before GPUs one lacks
    assert [o.kind for o in result.options[:spans[0]]] and all(o.kind != "larger-gpu" for o in
                                                                result.options[:spans[0]])
    assert all(o.kind == "larger-gpu" for o in result.options[spans[0] + 1:])


def test_pinned_tp8_pp2_on_8_gpu_nodes_is_not_one_pod_of_16(make: Make) -> None:
    request = make(LLAMA_405B, "h100", pinned=PinnedFlags(tensor_parallel_size=8, pipeline_parallel_size=2),
                   gpu_count=8)
    one = plan_across_nodes(request, gpus_per_node=8, max_nodes=1)
    assert not one.fits
    assert one.split.nodes == 2
    assert one.headline().startswith("DOES NOT FIT")
    assert one.plan.failure is not None and "needs 2 nodes" in one.plan.failure.message
    assert any(o.summary.startswith("Span 2 nodes") for o in one.options)
    two = plan_across_nodes(request, gpus_per_node=8, max_nodes=2)
    assert two.fits and two.spans_nodes
    assert "2 nodes × 8× H100" in two.headline()
    assert two.plan.pinned == ["tensor_parallel_size", "pipeline_parallel_size"]


def test_pcie_gpus_try_tp1_pp_after_tp_per_node(load_arch: Callable[[str], ModelArch],
                                               gpu: Callable[[str], GPUSpec]) -> None:
    l40s = gpu("l40s")
    assert not l40s.nvlink
    splits = candidate_splits(load_arch(LLAMA_70B), 2, 2, l40s.nvlink)
    assert [(s.tensor_parallel_size, s.pipeline_parallel_size) for s in splits] == [(2, 2), (1, 4)]
    assert [(s.tensor_parallel_size, s.pipeline_parallel_size)
            for s in candidate_splits(load_arch(LLAMA_70B), 2, 8, True)] == [(8, 2)]


def test_70b_on_two_l40s_nodes(make: Make) -> None:
    result = plan_across_nodes(make(LLAMA_70B, "l40s"), gpus_per_node=2, max_nodes=3)
    assert result.fits and result.split.nodes == 2
    assert [st.layers for st in result.stages] == [40, 40]
    assert "NVLink" not in " ".join(result.plan.reasons)


def test_nothing_within_max_nodes_says_what_was_tried(make: Make) -> None:
    result = plan_across_nodes(make(LLAMA_405B, "l40s"), gpus_per_node=2, max_nodes=2)
    assert not result.fits
    assert any("Tried spanning nodes" in r and "TP 2 × PP 2 on 2 nodes" in r for r in result.reasons)


def test_text_and_document_say_it_spans_nodes(make: Make) -> None:
    result = plan_across_nodes(make(LLAMA_405B, "h100"), gpus_per_node=8, max_nodes=2)
    text = render_multinode_text(result)
    assert text.splitlines()[0].startswith("FITS: meta-llama/Llama-3.1-405B-Instruct on 2 nodes × 8× H100")
    assert "FITS on 16×" not in text
    assert "stage 1: layers 63–125 (63)" in text and "← limits KV" in text
    doc = multinode_document(result)
    assert doc["nodes"] == 2 and doc["gpus_per_node"] == 8 and doc["limiting_stage"] == 1
    assert len(doc["stages"]) == 2  # type: ignore[arg-type]


def test_small_model_plan_is_unchanged(make: Make) -> None:
    from vllm_operator.planner import plan

    request = make(LLAMA_8B, "h100")
    assert plan_across_nodes(request, gpus_per_node=1, max_nodes=4).plan == plan(request)


def test_cli_gpu_count_is_per_node_and_nodes_lets_it_span(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from vllm_operator.cli import main

    code = main(["plan", "--model", "llama-3.1-405b", "--gpu", "h100", "-tp", "8", "-pp", "2", "--gpu-count", "8"])
    out = capsys.readouterr().out
    assert code == 1
    assert out.startswith("DOES NOT FIT: meta-llama/Llama-3.1-405B-Instruct on 2 nodes × 8× H100")
    assert "FITS on 16×" not in out and "--nodes 2" in out
    code = main(["plan", "--model", "llama-3.1-405b", "--gpu", "h100", "--gpu-count", "8", "--nodes", "2",
                 "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (doc["nodes"], doc["gpus_per_node"], doc["spans_nodes"]) == (2, 8, True)
    assert (doc["tensor_parallel_size"], doc["pipeline_parallel_size"]) == (8, 2)
    assert "--pipeline-parallel-size" in doc["args"]


# --- Llama-4: hand-checked plans ----------------------------------------------------------------------------------

SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
MAVERICK = "meta-llama/Llama-4-Maverick-17B-128E-Instruct"
MAVERICK_FP8 = "meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8"
L4_EMBED_BYTES = 202048 * 5120 * 2          # embedding = lm_head = 2,068,971,520 B in BF16
L4_KV_PER_TOKEN_TP8 = 48 * 2 * 1 * 128 * 2  # 48 layers × K,V × 8 KV heads / TP 8 × 128 × 2 B = 24,576 B


def test_llama4_scout_bf16_on_8_h100_tp8(make: Make) -> None:
    result = plan_across_nodes(make(SCOUT, "h100", gpu_count=8, pinned=PinnedFlags(tensor_parallel_size=8)),
                               gpus_per_node=8, max_nodes=1)
    assert result.fits and not result.spans_nodes
    # By hand: 217,283,587,072 B (108,641,793,536 params × 2) / 8 = 27,160,448,384 B; the rope cache of the 10M-token
    # context, 10,485,760 × 128 × 2 B = 2,684,354,560 B, on every GPU; × 1.0015 loader overhead → 27.84 GiB
    by_hand = (217_283_587_072 / 8 + 10_485_760 * 128 * 2) * 1.0015 / GiB
    assert result.plan.memory.weights_gib == pytest.approx(by_hand, abs=0.01)
    # chunked-local layers are allocated as full attention: every one of the 48 layers holds KV for every token
    assert result.stages[0].kv_bytes_per_token == L4_KV_PER_TOKEN_TP8 == 24_576
    kv = result.plan.memory.kv_cache_gib * GiB
    assert result.plan.prediction.num_blocks == pytest.approx(kv / (16 * 24_576), rel=0.001)


def test_llama4_scout_unpinned_on_8_h100_takes_the_fewest_gpus_that_serve(make: Make) -> None:
    result = plan_across_nodes(make(SCOUT, "h100", gpu_count=8), gpus_per_node=8)
    # 202.36 GiB of weights: TP 2 holds 101 GiB per GPU (> 80), TP 4 about 53 GiB and serves the default workload
    assert result.fits and result.plan.flags["tensor_parallel_size"] == 4


def test_llama4_maverick_fp8_on_8_h100(make: Make) -> None:
    result = plan_across_nodes(make(MAVERICK_FP8, "h100", gpu_count=8), gpus_per_node=8)
    assert result.fits and not result.spans_nodes and result.plan.flags["tensor_parallel_size"] == 8
    # By hand: 416,884,747,264 B (routed experts FP8 + float32 scales, the rest BF16) / 8 = 52,110,593,408 B, + the
    # rope cache 1,048,576 × 128 × 2 B = 268,435,456 B; × 1.0015 → 48.85 GiB per GPU
    by_hand = (416_884_747_264 / 8 + 1_048_576 * 128 * 2) * 1.0015 / GiB
    assert result.plan.memory.weights_gib == pytest.approx(by_hand, abs=0.01)
    assert result.stages[0].kv_bytes_per_token == L4_KV_PER_TOKEN_TP8


def test_llama4_maverick_bf16_spans_two_h100_nodes_when_allowed(make: Make) -> None:
    one = plan_across_nodes(make(MAVERICK, "h100", gpu_count=8), gpus_per_node=8, max_nodes=1)
    assert not one.fits                                   # 748 GiB of BF16 weights > 8 × 80 GB
    assert any(o.kind == "nodes" and o.gpu_count == 16 for o in one.options)
    result = plan_across_nodes(make(MAVERICK, "h100", gpu_count=8), gpus_per_node=8, max_nodes=2)
    assert result.fits and result.spans_nodes
    s = result.split
    assert (s.nodes, s.gpus_per_node, s.tensor_parallel_size, s.pipeline_parallel_size) == (2, 8, 8, 2)
    assert [st.layers for st in result.stages] == [24, 24]
    # By hand: each stage has 12 MoE + 12 dense layers, i.e. half the 799,029,619,712 B of decoder layers and vision
    # tower (803,167,562,752 − embedding − lm_head), plus the embedding (stage 0) or lm_head (stage 1): 401.58 GB / 8
    # = 50,197,972,672 B + rope 268,435,456 B, × 1.0015 → 47.07 GiB per GPU on both stages
    by_hand = ((803_167_562_752 - 2 * L4_EMBED_BYTES) / 2 / 8 + L4_EMBED_BYTES / 8 + 1_048_576 * 256) * 1.0015 / GiB
    for stage in result.stages:
        assert stage.weights_gib == pytest.approx(by_hand, rel=0.002)
    # KV per token per GPU: 24 layers × 2 × 1 KV head × 128 × 2 B
    assert [st.kv_bytes_per_token for st in result.stages] == [12_288, 12_288]
    assert result.limiting_stage == 1                     # the sampler's activation is on the last stage


def test_pp_communicators_are_booked_outside_the_budget_and_called_an_estimate() -> None:
    """Each PP stage's GPU holds the PP group's NCCL communicator (and on Model Runner V2 its broadcast sibling)
    outside vLLM's budget: the utilization leaves room for it and the reason says the figure is an estimate."""
    from kit.catalog import catalog_arch, catalog_gpu
    from vllm_operator.planner import plan

    arch, h100 = catalog_arch("meta-llama/Llama-3.1-70B-Instruct"), catalog_gpu("H100")
    one = plan(PlanRequest(arch=arch, gpu=h100, gpu_count=2, vllm_version="0.33.0",
                           pinned=PinnedFlags(tensor_parallel_size=2)))
    two = plan(PlanRequest(arch=arch, gpu=h100, gpu_count=4, vllm_version="0.33.0",
                           pinned=PinnedFlags(tensor_parallel_size=2, pipeline_parallel_size=2)))
    assert two.flags["gpu_memory_utilization"] < one.flags["gpu_memory_utilization"]
    why = next(r for r in two.reasons if r.startswith("gpu-memory-utilization"))
    assert "1.00 GiB of the 3.01 GiB are the pipeline-parallel NCCL communicators, an estimate" in why
