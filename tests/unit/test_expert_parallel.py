"""--enable-expert-parallel and --data-parallel-size: per-GPU weights with the experts laid out as vLLM lays them out
(hand-checked), validation, the explanation lines, the API/CLI/renderer wiring and the flag table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_operator.api.v1alpha1 import PinnedFlags
from vllm_operator.cli import main
from vllm_operator.planner import PlanRequest
from vllm_operator.planner.arch import ModelArch, arch_from_config
from vllm_operator.planner.failures import FailureKind
from vllm_operator.planner.gpus import GPUSpec
from vllm_operator.planner.memory import (
    EngineFlags,
    activation_bytes,
    dense_mlp_sizes,
    experts_per_rank,
    moe_rows,
    moe_workspace_bytes,
    shard_failure,
    weights_bytes_per_gpu,
)
from vllm_operator.planner.moe_parallel import moe_parallel_reasons
from vllm_operator.planner.multinode import plan_across_nodes
from vllm_operator.planner.plan import Constraints, _valid_tp, plan
from vllm_operator.planner.versions import profile_for
from vllm_operator.render.flags import flag_table
from vllm_operator.render.manifests import render_args, unsupported_pinned

CATALOG = Path(__file__).resolve().parents[2] / "operator" / "vllm_operator" / "catalog" / "models"
MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
DEEPSEEK_R1 = "deepseek-ai/DeepSeek-R1"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
MAVERICK_FP8 = "meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8"
LOADER = 1.0015  # vLLM's loader overhead on the weights (memory.weights_bytes_per_gpu)
MIXTRAL_EXPERT = 3 * 4096 * 14336  # gate, up, down of one expert: 176,160,768 parameters

LoadArch = Callable[[str], ModelArch]


def engine(**kwargs: Any) -> EngineFlags:
    return EngineFlags(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=8192, **kwargs)


def weights(arch: ModelArch, **kwargs: Any) -> int:
    return max(weights_bytes_per_gpu(arch, engine(**kwargs)))


def test_expert_parallel_with_experts_dividing_the_ranks_holds_the_same_bytes(load_arch: LoadArch) -> None:
    arch = load_arch(MIXTRAL)
    # 8 experts over EP 8 = 1 whole expert per rank; TP 8 holds 1/8 of each of the 8: the same bytes
    assert experts_per_rank(arch, engine(tensor_parallel_size=8, enable_expert_parallel=True)) == 1
    assert weights(arch, tensor_parallel_size=8, enable_expert_parallel=True) == pytest.approx(
        weights(arch, tensor_parallel_size=8), abs=64)


def test_uneven_expert_parallel_sizes_the_busiest_rank(load_arch: LoadArch) -> None:
    arch = load_arch(MIXTRAL)
    flags = engine(tensor_parallel_size=2, data_parallel_size=3, enable_expert_parallel=True)
    # EP = TP 2 × DP 3 = 6; determine_expert_map: 8 // 6 = 1 each, one more on ranks 0-1 → the busiest holds 2
    assert experts_per_rank(arch, flags) == 2
    # By hand, against TP 2 alone (4 experts' worth per GPU: a half of each of 8): 32 MoE layers × (2 − 4) experts
    # × 176,160,768 params × 2 B (BF16) = −22,548,578,304 B, × the loader overhead; BF16 is booked at the checkpoint's
    # bytes per counted parameter (93,405,585,408 B / 46,702,526,464 params: norms are in the file, not the count)
    assert arch.total_size is not None
    per_param = arch.total_size / arch.param_count
    assert per_param == pytest.approx(2.0, rel=1e-5)
    delta = max(weights_bytes_per_gpu(arch, flags)) - weights(arch, tensor_parallel_size=2)
    assert delta == pytest.approx(32 * (2 - 4) * MIXTRAL_EXPERT * per_param * LOADER, rel=1e-7)
    text = " ".join(moe_parallel_reasons(arch, flags, (0, 33, 0)))
    assert "EP size = TP × DP = 6" in text and "ranks 0–1 hold 2, the others 1" in text


def test_data_parallel_without_ep_splits_experts_over_tp_times_dp_and_replicates_the_rest(
        load_arch: LoadArch) -> None:
    arch = load_arch(DEEPSEEK_R1)
    tp4_dp2, tp8 = weights(arch, tensor_parallel_size=4, data_parallel_size=2), weights(arch, tensor_parallel_size=8)
    # Both split every routed expert 8 ways (vLLM flattens DP into the MoE layers' TP group); TP 4 × DP 2 holds
    # a quarter instead of an eighth of everything else. By hand from the checkpoint: the body (688.6 GB − BF16
    # embedding and lm_head) spread over the decoder layers' parameters, of which 58 × 256 × 44,040,192 are routed
    embed_head = 2 * 129280 * 7168 * 2
    assert arch.total_size is not None
    rate = (arch.total_size - embed_head) / sum(arch.layer_param_counts)
    routed = 58 * 256 * 44_040_192 * rate
    rest = arch.total_size - routed
    assert tp4_dp2 - tp8 == pytest.approx(rest * (1 / 4 - 1 / 8) * LOADER, rel=2e-3)
    # with EP as well: 256 experts over 8 ranks divide evenly, so the same bytes as without EP
    assert weights(arch, tensor_parallel_size=4, data_parallel_size=2, enable_expert_parallel=True) == \
        pytest.approx(tp4_dp2, abs=64)


def test_experts_intermediate_must_divide_by_tp_times_dp_unless_expert_parallel(
        load_arch: LoadArch, gpu: Callable[[str], GPUSpec]) -> None:
    arch = load_arch(MIXTRAL)
    split = plan(PlanRequest(arch=arch, gpu=gpu("h200"), gpu_count=3,
                             pinned=PinnedFlags(tensor_parallel_size=1, data_parallel_size=3)))
    # 14336 % 3 != 0: vLLM cannot split each expert's intermediate size over 3 ranks
    assert not split.fits and split.failure is not None
    assert split.failure.kind is FailureKind.INVALID_PARALLELISM and "14336" in split.failure.message
    whole = plan(PlanRequest(arch=arch, gpu=gpu("h200"), gpu_count=3,
                             pinned=PinnedFlags(tensor_parallel_size=1, data_parallel_size=3,
                                                enable_expert_parallel=True)))
    assert whole.fits and whole.gpu_count == 3


def test_with_expert_parallel_the_experts_take_no_shard_check_but_attention_and_dense_mlps_do(
        load_arch: LoadArch, gpu: Callable[[str], GPUSpec]) -> None:
    # vLLM 0.33 FusedMoEParallelConfig.make: with EP the MoE layer's tp_size is 1, so FusedMoEConfig's
    # `intermediate_size % tp_size` assert never fails; attention (heads), the embedding and the column-parallel
    # dense / shared-expert MLPs are still split over TP.
    mixtral = load_arch(MIXTRAL)

    def run(arch: ModelArch, count: int, **pins: Any) -> Any:
        return plan(PlanRequest(arch=arch, gpu=gpu("h200"), gpu_count=count, pinned=PinnedFlags(**pins)))

    # TP 3 with EP: the experts are whole, but 32 attention heads do not split 3 ways
    tp3 = run(mixtral, 3, tensor_parallel_size=3, enable_expert_parallel=True)
    assert not tp3.fits and tp3.failure is not None
    assert tp3.failure.kind is FailureKind.INVALID_PARALLELISM
    assert "32" in tp3.failure.message and "14336" not in tp3.failure.message
    # TP 2 × DP 3: without EP each expert is split 6 ways (14336 % 6 = 2); with EP each of the 6 ranks holds whole
    # experts (8 over 6: 2 on ranks 0-1, 1 on the others)
    split = run(mixtral, 6, tensor_parallel_size=2, data_parallel_size=3)
    assert not split.fits and split.failure is not None and "14336 is not divisible by 6" in split.failure.message
    whole = run(mixtral, 6, tensor_parallel_size=2, data_parallel_size=3, enable_expert_parallel=True)
    assert whole.fits and whole.gpu_count == 6
    # a Qwen3-MoE config whose experts are 1000 wide (1000 % 16 = 8) at TP 16 (32 heads, 4 KV heads, vocab 151,936
    # all divide): refused without EP, planned with it — and an unpinned TP may then be 16
    config = json.loads((CATALOG / "Qwen__Qwen3-30B-A3B.json").read_text())["config"]
    odd = arch_from_config({**config, "moe_intermediate_size": 1000}, model_id="example/odd-experts")
    refused = run(odd, 16, tensor_parallel_size=16)
    assert refused.failure is not None and "1000 is not divisible by 16" in refused.failure.message
    assert run(odd, 16, tensor_parallel_size=16, enable_expert_parallel=True).fits
    assert _valid_tp(odd, 16, expert_parallel=True) and not _valid_tp(odd, 16)


def test_dense_and_shared_expert_widths_stay_split_over_tp(load_arch: LoadArch) -> None:
    # Mixtral and Qwen3-MoE build no dense MLP (every layer routes; their `intermediate_size` is never built), so
    # nothing but the experts would check it; DeepSeek's first 3 layers are dense (18432) and its shared expert is
    # 1 × 2048; Maverick's odd layers are dense (intermediate_size_mlp 16384) and its shared expert is 8192 wide;
    # Qwen1.5-MoE's shared expert is 5632 wide
    assert dense_mlp_sizes(load_arch(MIXTRAL)) == ()
    assert dense_mlp_sizes(load_arch("Qwen/Qwen3-30B-A3B")) == ()
    assert dense_mlp_sizes(load_arch(DEEPSEEK_R1)) == (18432, 2048)
    assert dense_mlp_sizes(load_arch("meta-llama/Llama-4-Maverick-17B-128E-Instruct")) == (16384, 8192)
    assert dense_mlp_sizes(load_arch("Qwen/Qwen1.5-MoE-A2.7B")) == (5632,)
    assert dense_mlp_sizes(load_arch(LLAMA_8B)) == (14336,)
    maverick = load_arch("meta-llama/Llama-4-Maverick-17B-128E-Instruct")
    bad = shard_failure(maverick.model_copy(update={"shared_expert_size": 8196}), 8)
    assert bad is not None and "8196 is not divisible by 8" in bad.message
    assert shard_failure(maverick, 8) is None


def test_dp_times_tp_times_pp_stays_within_the_gpus(load_arch: LoadArch, gpu: Callable[[str], GPUSpec]) -> None:
    request = PlanRequest(arch=load_arch(MIXTRAL), gpu=gpu("h100"), gpu_count=8,
                          pinned=PinnedFlags(data_parallel_size=4, enable_expert_parallel=True))
    result = plan(request)
    tp = result.flags["tensor_parallel_size"]
    assert result.fits and tp * 4 <= 8 and result.gpu_count == tp * 4
    assert result.flags["data_parallel_size"] == 4 and result.flags["enable_expert_parallel"] is True
    too_many = plan_across_nodes(request.model_copy(update={"pinned": PinnedFlags(
        tensor_parallel_size=4, data_parallel_size=4)}), gpus_per_node=8, max_nodes=2)
    assert not too_many.fits and too_many.split.nodes == 1
    assert too_many.plan.failure is not None and "one node has 8" in too_many.plan.failure.message


def test_kv_figures_are_per_engine(load_arch: LoadArch, gpu: Callable[[str], GPUSpec]) -> None:
    arch = load_arch(MAVERICK_FP8)
    base = PlanRequest(arch=arch, gpu=gpu("h100"), gpu_count=8,
                       pinned=PinnedFlags(tensor_parallel_size=8, max_num_batched_tokens=8192, max_num_seqs=64))
    ep = base.model_copy(update={"pinned": PinnedFlags(tensor_parallel_size=8, max_num_batched_tokens=8192, max_num_seqs=64,
                                                       enable_expert_parallel=True)})
    one, other = plan(base), plan(ep)
    # 128 experts over EP 8 = 16 whole experts per GPU: the same bytes; the workspace of whole experts is larger:
    # M × top-1 × (max(8192, 5120) + max(16384, 5120)) × 2 B against the TP estimate's M × (2 × 8192 / 8 + 5120) × 2
    assert one.memory.weights_gib == other.memory.weights_gib
    assert other.memory.activation_gib - one.memory.activation_gib == pytest.approx(
        8192 * (24576 - 7168) * 2 / 2**30, abs=0.011)
    assert other.prediction.kv_cache_tokens < one.prediction.kv_cache_tokens
    assert other.args()[-1] == "--enable-expert-parallel"
    reasons = " ".join(other.reasons)
    assert "each rank holds 16 of the 128 routed experts of every MoE layer (24 layers)" in reasons


def test_dense_models_get_no_expert_effect_and_a_replicas_hint(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    assert weights(arch, tensor_parallel_size=1, data_parallel_size=2, enable_expert_parallel=True) == \
        weights(arch, tensor_parallel_size=1)
    text = moe_parallel_reasons(arch, engine(data_parallel_size=2, enable_expert_parallel=True), (0, 33, 0))
    assert "spec.replicas gives the same" in text[0]
    assert "no effect: the model has no MoE layers" in text[1]
    assert moe_parallel_reasons(arch, engine(), (0, 33, 0)) == []


def test_pinned_flags_are_camel_case_in_the_api_and_the_crd() -> None:
    pinned = PinnedFlags.model_validate({"enableExpertParallel": True, "dataParallelSize": 2})
    assert pinned.to_vllm() == {"enable_expert_parallel": True, "data_parallel_size": 2}
    with pytest.raises(ValueError):
        PinnedFlags.model_validate({"dataParallelSize": 0})
    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "vllmservices.vllm-operator.dev.yaml")
                         .read_text())
    flags = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["flags"]
    assert flags["properties"]["dataParallelSize"]["minimum"] == 1
    assert flags["properties"]["enableExpertParallel"]["type"] == "boolean"


def test_flag_table_and_rendered_args_follow_the_releases_that_have_them() -> None:
    table = flag_table()
    # read from the wheels: --enable-expert-parallel absent in 0.7.3, present in 0.8.0; -dp absent in 0.8.2, in 0.8.3
    assert not table.supports("enable_expert_parallel", "0.7.3") and table.supports("enable_expert_parallel", "0.8.0")
    assert not table.supports("data_parallel_size", "0.8.2") and table.supports("data_parallel_size", "0.8.3")
    flags = {"tensor_parallel_size": 4, "data_parallel_size": 2, "enable_expert_parallel": True}
    args, dropped = render_args(flags, "0.33.0")
    assert args == ["--tensor-parallel-size", "4", "--data-parallel-size", "2", "--enable-expert-parallel"]
    assert dropped == []
    assert [name for name, _ in unsupported_pinned(flags, "0.8.0")] == ["data_parallel_size"]
    assert [name for name, _ in unsupported_pinned(flags, "0.7.3")] == ["data_parallel_size", "enable_expert_parallel"]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out


def test_cli_plan_check_and_manifest(capsys: pytest.CaptureFixture[str], offline_hub: list[Any]) -> None:
    code, out = _cli(capsys, "plan", "--model", MIXTRAL, "--gpu", "h100", "--gpu-count", "8", "-tp", "4", "-dp", "2",
                     "--enable-expert-parallel", "-o", "json")
    doc = json.loads(out)
    assert code == 0 and doc["gpu_count"] == 8
    assert doc["flags"]["data_parallel_size"] == 2 and doc["flags"]["enable_expert_parallel"] is True
    assert {"data_parallel_size", "enable_expert_parallel"} <= set(doc["pinned"])
    code, out = _cli(capsys, "plan", "--model", MIXTRAL, "--gpu", "h100", "-tp", "4", "-dp", "2",
                     "--enable-expert-parallel")
    assert code == 0 and out.splitlines()[0].startswith(f"FITS: {MIXTRAL} on 8× H100")
    assert "(TP 4 × PP 1 × DP 2)" in out.splitlines()[0]
    assert any(line.startswith("KV cache per engine (2 engines: ") for line in out.splitlines())
    code, out = _cli(capsys, "plan", "--model", MIXTRAL, "--gpu", "h100", "-tp", "4", "-dp", "2",
                     "--enable-expert-parallel", "-o", "manifest")
    spec = yaml.safe_load(out)["spec"]
    assert code == 0 and spec["gpu"]["count"] == 8
    assert spec["flags"]["dataParallelSize"] == 2 and spec["flags"]["enableExpertParallel"] is True
    code, out = _cli(capsys, "check", "--gpu", "h100", "-o", "json", "--", "vllm", "serve", MIXTRAL, "-tp", "2",
                     "-dp", "2", "--enable-expert-parallel")
    assert code in (0, 1) and json.loads(out)["gpu_count"] == 4


def test_a_floor_for_all_the_pods_gpus_becomes_one_engines_share(load_arch: LoadArch,
                                                                  gpu: Callable[[str], GPUSpec]) -> None:
    # spec.gpu.count 8 makes the operator ask TP to use all 8 GPUs (min_tensor_parallel_size 8); with DP 2 pinned,
    # one engine can have at most 4: TP 4 × DP 2 uses the 8 GPUs the pod asked for (not TP 1 × DP 2 on 2)
    request = PlanRequest(arch=load_arch(MIXTRAL), gpu=gpu("h100"), gpu_count=8,
                          pinned=PinnedFlags(data_parallel_size=2, enable_expert_parallel=True),
                          constraints=Constraints(min_tensor_parallel_size=8))
    result = plan(request)
    assert result.fits and result.flags["tensor_parallel_size"] == 4 and result.gpu_count == 8


def test_a_stated_concurrency_is_shared_by_the_engines(load_arch: LoadArch, gpu: Callable[[str], GPUSpec]) -> None:
    from vllm_operator.planner.plan import Workload

    arch = load_arch(DEEPSEEK_R1)
    pinned = PinnedFlags(tensor_parallel_size=1, data_parallel_size=8, enable_expert_parallel=True,
                         max_model_len=32768, kv_cache_dtype="auto", enforce_eager=False)  # no KV-saving trade-offs
    one = plan(PlanRequest(arch=arch, gpu=gpu("h200"), gpu_count=8, pinned=pinned))
    engine_capacity = one.prediction.kv_cache_tokens // 32768           # requests of 32768 tokens one engine holds
    # 8 engines hold 8 × that: a workload just above one engine's capacity fits, one above eight engines' does not
    fits = Workload(context_length=32768, concurrency=engine_capacity * 8)
    assert plan(PlanRequest(arch=arch, gpu=gpu("h200"), gpu_count=8, pinned=pinned, workload=fits)).fits
    too_many = Workload(context_length=32768, concurrency=engine_capacity * 8 + 8)
    assert not plan(PlanRequest(arch=arch, gpu=gpu("h200"), gpu_count=8, pinned=pinned, workload=too_many)).fits


def test_the_logged_expert_parallel_start_is_predicted(capsys: pytest.CaptureFixture[str],
                                                       offline_hub: list[Any]) -> None:
    """benchmarks/data/vllm-startup-logs.jsonl has one start with --enable-expert-parallel: Qwen3-235B-A22B-Instruct-
    2507-FP8 on 8× L40S, TP 8, vLLM 0.10.2: 'Model loading took 27.7183 GiB', engine KV 237,344 tokens (min over the
    workers). 128 experts over EP 8 = 16 whole experts per GPU: the same bytes as splitting them."""
    model = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "models" / \
        "Qwen__Qwen3-235B-A22B-Instruct-2507-FP8"
    record = [line for line in (model.parents[1] / "vllm-startup-logs.jsonl").read_text().splitlines()
              if '"enable_expert_parallel": true' in line]
    assert len(record) == 1 and "Qwen3-235B-A22B-Instruct-2507-FP8" in record[0]
    flags = ["--tensor-parallel-size", "8", "--gpu-memory-utilization", "0.9", "--max-model-len", "32768",
             "--max-num-batched-tokens", "2048"]
    docs = []
    for extra in ([], ["--enable-expert-parallel"]):
        code, out = _cli(capsys, "check", "--gpu", "L40S", "--vllm-version", "0.10.2", "-o", "json", "--",
                         "vllm", "serve", str(model), *flags, *extra)
        assert code == 0
        docs.append(json.loads(out))
    plain, ep = docs
    assert ep["flags"]["enable_expert_parallel"] is True
    assert ep["memory"]["weights_gib"] == plain["memory"]["weights_gib"] == pytest.approx(27.7183, rel=0.01)
    assert plain["kv_cache_tokens"] == pytest.approx(237_344, rel=0.02)  # 234,928 (−1.02%)
    # whole experts make the fused-experts workspace larger: M 2048 × topk 8 × (max(1536, 4096) + max(3072, 4096))
    # × 2 B = 268,435,456 B, against the TP estimate's 2048 × 8 × (2 × 1536 / 8 + 4096) × 2 = 146,800,640 B: 0.11 GiB
    # less KV on every GPU, 2,528 tokens at 48,128 B per token (232,400: −2.08%, the conservative side)
    assert ep["memory"]["activation_gib"] - plain["memory"]["activation_gib"] == pytest.approx(
        (268_435_456 - 146_800_640) / 2**30, abs=0.011)
    assert plain["kv_cache_tokens"] - ep["kv_cache_tokens"] == pytest.approx(121_634_816 / 48_128, abs=16)
    assert ep["kv_cache_tokens"] == pytest.approx(237_344, rel=0.03)


def test_the_moe_workspace_follows_the_expert_layout_and_the_release(load_arch: LoadArch) -> None:
    # vLLM 0.33 TritonExperts.workspace_shapes: M × topk × (max(I_p, K) + max(2 I_p, K)) × 2 B (BF16), K = 4096,
    # Mixtral top-2, I = 14336; M = max-num-batched-tokens (8192 here) × DP
    arch = load_arch(MIXTRAL)
    new, v014, v011 = (0, 33, 0), (0, 14, 0), (0, 11, 0)
    # EP 8 (TP 8): whole experts, I_p = 14336 → 8192 × 2 × (14336 + 28672) × 2
    assert moe_workspace_bytes(arch, engine(tensor_parallel_size=8, enable_expert_parallel=True), new) == \
        8192 * 2 * (14336 + 28672) * 2 == 1_409_286_144
    # TP 2 × DP 4 without EP: each expert split 8 ways (I_p 1792), the 4 engines' tokens gathered: M = 32768
    split = engine(tensor_parallel_size=2, data_parallel_size=4)
    assert moe_rows(split, new) == 32768
    assert moe_workspace_bytes(arch, split, new) == 32768 * 2 * (4096 + 4096) * 2 == 2**30
    # before 0.18 VLLM_FUSED_MOE_CHUNK_SIZE cut M: 32768 up to 0.11, 16384 from 0.12; DP 8 gathers 65536 rows
    assert moe_rows(engine(tensor_parallel_size=1, data_parallel_size=8), v011) == 32768
    assert moe_rows(engine(tensor_parallel_size=1, data_parallel_size=8), v014) == 16384
    # 0.12-0.17 sized a DP + EP profile run's workspace at a whole chunk, even for a small batch
    small = EngineFlags(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=512, tensor_parallel_size=2,
                        data_parallel_size=2, enable_expert_parallel=True)
    assert (moe_rows(small, v011), moe_rows(small, v014), moe_rows(small, new)) == (1024, 16384, 1024)
    text = " ".join(moe_parallel_reasons(arch, split, new))
    assert "MoE workspace 1.00 GiB" in text and "32768 rows (the 4 engines' 8192 batched tokens gathered" in text
    assert "per-rank slice (1792 wide)" in text and "ESTIMATE" in text
    # a dense model has none; plain TP keeps the calibrated estimate in activation_bytes (unchanged by this)
    assert moe_workspace_bytes(load_arch(LLAMA_8B), engine(enable_expert_parallel=True), new) == 0
    profile = profile_for("0.33.0")
    plain = engine(tensor_parallel_size=8)
    ep = engine(tensor_parallel_size=8, enable_expert_parallel=True)
    tp_term = 8192 * 2 * (2 * 14336 / 8 + 4096) * 2
    assert activation_bytes(arch, ep, profile, last_stage=True) - activation_bytes(arch, plain, profile,
                                                                                    last_stage=True) == \
        pytest.approx(1_409_286_144 - tp_term, abs=2)
