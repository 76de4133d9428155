"""The planner renders `--max-model-len auto` itself where it is the same plan as its own length and the safer one
(issue 23): the model's full context fits, the release has `auto` (0.14.0+), no length was pinned, and any context
the requests need fits with the margin kept for the predicted figures; an explicit length otherwise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_operator.api.v1alpha1 import MAX_MODEL_LEN_AUTO, PinnedFlags
from vllm_operator.planner import PlanRequest, plan
from vllm_operator.planner.arch import ModelArch
from vllm_operator.planner.gpus import GPUSpec
from vllm_operator.planner.plan import Constraints, Workload
from vllm_operator.planner.versions import parse_version, profile_for
from vllm_operator.render.flags import cli_flag_table

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
Make = Callable[..., PlanRequest]


def _make(load_arch: Callable[[str], ModelArch], gpu: Callable[[str], GPUSpec]) -> Make:
    def build(model: str, gpu_name: str, **kwargs: Any) -> PlanRequest:
        return PlanRequest(arch=load_arch(model), gpu=gpu(gpu_name), **kwargs)
    return build


def _length_arg(args: list[str]) -> str:
    return args[args.index("--max-model-len") + 1]


def test_full_context_that_fits_is_rendered_as_auto_with_the_length_it_keeps(
        load_arch: Callable[[str], ModelArch], gpu: Callable[[str], GPUSpec]) -> None:
    result = plan(_make(load_arch, gpu)(LLAMA_8B, "h100", vllm_version="0.33.0"))
    assert result.fits and result.max_model_len_auto
    assert _length_arg(result.args()) == "auto"
    assert result.flags["max_model_len"] == 131072 == result.prediction.estimated_max_model_len
    assert "max_model_len" not in result.pinned
    reason = next(r for r in result.reasons if r.startswith("max-model-len auto:"))
    assert "131072" in reason and "re-fits to the memory vLLM measures" in reason
    # the rendered spec, planned again, keeps the same length: `auto` is the same plan
    again = plan(_make(load_arch, gpu)(LLAMA_8B, "h100", vllm_version="0.33.0",
                                       pinned=PinnedFlags(max_model_len=MAX_MODEL_LEN_AUTO)))
    assert again.flags["max_model_len"] == result.flags["max_model_len"]
    assert again.prediction.kv_cache_tokens == result.prediction.kv_cache_tokens


def test_a_fitted_shorter_context_stays_explicit_and_says_what_auto_would_pick(
        load_arch: Callable[[str], ModelArch], gpu: Callable[[str], GPUSpec]) -> None:
    result = plan(_make(load_arch, gpu)(LLAMA_8B, "l4", vllm_version="0.33.0"))
    assert result.fits and not result.max_model_len_auto
    length = result.flags["max_model_len"]
    assert _length_arg(result.args()) == str(length) and length < 131072
    same = {k: result.flags[k] for k in ("tensor_parallel_size", "gpu_memory_utilization", "max_num_seqs")}
    auto = plan(_make(load_arch, gpu)(LLAMA_8B, "l4", vllm_version="0.33.0",
                                      pinned=PinnedFlags(max_model_len=MAX_MODEL_LEN_AUTO, **same)))
    picked = auto.flags["max_model_len"]
    assert length < picked < 131072  # auto keeps no margin for the error of the predicted figures
    assert any(r.startswith(f"max-model-len {length}, not auto") and str(picked) in r for r in result.reasons)


def test_releases_without_auto_and_pinned_lengths_stay_explicit(
        load_arch: Callable[[str], ModelArch], gpu: Callable[[str], GPUSpec]) -> None:
    make = _make(load_arch, gpu)
    old = plan(make(LLAMA_8B, "h100", vllm_version="0.13.0"))
    assert old.fits and not old.max_model_len_auto and _length_arg(old.args()) == "131072"
    assert not any("auto" in r for r in old.reasons if r.startswith("max-model-len"))
    pinned = plan(make(LLAMA_8B, "h100", vllm_version="0.33.0", pinned=PinnedFlags(max_model_len=131072)))
    assert not pinned.max_model_len_auto and _length_arg(pinned.args()) == "131072"
    capped = plan(make(LLAMA_8B, "h100", vllm_version="0.33.0", constraints=Constraints(max_model_len=65536)))
    assert not capped.max_model_len_auto and _length_arg(capped.args()) == "65536"


def test_a_needed_context_keeps_the_explicit_length_unless_it_fits_with_the_margin(
        load_arch: Callable[[str], ModelArch], gpu: Callable[[str], GPUSpec]) -> None:
    make = _make(load_arch, gpu)
    # requests need the whole context: auto could only ever start shorter, silently, where 131072 stops vLLM
    whole = plan(make(LLAMA_8B, "l40s", vllm_version="0.33.0", workload=Workload(context_length=131072)))
    assert whole.fits and not whole.max_model_len_auto and _length_arg(whole.args()) == "131072"
    assert any(r.startswith("max-model-len 131072, not auto") for r in whole.reasons)
    # 8k of a 128k context: auto still gives it unless the KV cache comes out far smaller than predicted
    short = plan(make(LLAMA_8B, "l40s", vllm_version="0.33.0", workload=Workload(context_length=8192)))
    assert short.fits and short.max_model_len_auto and _length_arg(short.args()) == "auto"
    assert any("at least the 8192 tokens requests need" in r for r in short.reasons)


def test_the_release_table_and_the_flag_table_agree_on_when_auto_arrived() -> None:
    since = cli_flag_table().value_since("--max-model-len auto")
    before = f"{parse_version(since)[0]}.{parse_version(since)[1] - 1}.0"
    assert profile_for(since).max_model_len_auto
    assert not profile_for(before).max_model_len_auto
