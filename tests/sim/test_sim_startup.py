"""The startup simulator: vLLM's startup, release by release, with a ground truth the planner cannot see."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from simkit import IMAGE_011, IMAGE_026, gpu, model, serve_args

from vllm_operator.planner.arch import arch_from_config
from vllm_operator.planner.failures import FailureKind
from vllm_operator.planner.memory import EngineFlags, GPUFacts, activation_bytes, predict_startup
from vllm_operator.planner.versions import NEWEST_KNOWN_VERSION, profile_for
from vllm_operator.remediation.classifier import Failure, classify_text
from vllm_operator_sim.startup import (
    HiddenFacts,
    Phase,
    StartupOutcome,
    parse_vllm_args,
    perturbations,
    serving_oom,
    simulate_startup,
    termination_message,
)

START = datetime(2026, 5, 19, 12, 0, tzinfo=UTC)
IMAGE_023 = "vllm/vllm-openai:v0.23.0"
IMAGE_033 = "vllm/vllm-openai:v0.33.0"
LLAMA3_8B = "meta-llama/Meta-Llama-3-8B-Instruct"
QWEN25_7B = "Qwen/Qwen2.5-7B-Instruct"
PLANNED_8B_L4 = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 13}


def run(model_id: str = LLAMA3_8B, image: str = IMAGE_026, gpu_name: str = "L4", hidden: HiddenFacts | None = None,
        **flags: object) -> StartupOutcome:
    return simulate_startup(serve_args(model_id, **flags), image, gpu(gpu_name), hidden or HiddenFacts(),
                            model(model_id))


def classified(outcome: StartupOutcome, *, whole_log: bool = False) -> Failure:
    """What the operator's classifier reads from the container's termination message (FallbackToLogsOnError: the
    last 2 KB of the log), or from the whole log."""
    text = outcome.log_text(START)
    message = text if whole_log else termination_message(text)
    return classify_text(message, terminated_reason=outcome.reason, exit_code=outcome.exit_code)


def test_a_planned_llama3_8b_on_l4_starts_and_logs_what_vllm_logs() -> None:
    outcome = run(**PLANNED_8B_L4)
    assert outcome.starts and outcome.phase is Phase.READY and outcome.exit_code == 0
    text = outcome.log_text(START)
    assert "Using V2 Model Runner" in text  # Llama-class models run MRV2 by default from 0.24
    assert re.search(r"Model loading took 14\.98\d* GiB and", text)  # MRV2's wording up to 0.27.1
    assert "Estimated CUDA graph memory" not in text  # MRV2 estimates 0 before 0.29
    assert f"Available KV cache memory: {outcome.available_kv_gib:.2f} GiB" in text
    assert f"GPU KV cache size: {outcome.kv_cache_tokens:,} tokens" in text
    assert f"Maximum concurrency for 8,192 tokens per request: {outcome.max_concurrency:.2f}x" in text
    assert "Application startup complete." in text
    assert outcome.kv_cache_tokens > 8192
    assert 30 < outcome.duration_s < 120  # simulated seconds: load, compile, profile, graphs, server


def test_ground_truth_differs_from_the_planners_model() -> None:
    files = model(LLAMA3_8B)
    arch = arch_from_config(files.config, model_id=LLAMA3_8B, total_size=files.total_size)
    flags = EngineFlags(gpu_memory_utilization=0.9, max_model_len=8192, max_num_seqs=13, max_num_batched_tokens=2048)
    profile = profile_for("0.26.0")
    predicted = predict_startup(arch, flags, GPUFacts(total_gib=gpu("L4").reported_gib), profile)
    outcome = run(**PLANNED_8B_L4)
    planner_activation = activation_bytes(arch, flags, profile, last_stage=True) / 2**30
    assert outcome.activation_gib > planner_activation  # 2-8 % more, per model
    assert outcome.kv_cache_tokens < predicted.kv_cache_tokens
    assert outcome.weights_gib == pytest.approx(predicted.memory.weights_gib, abs=0.01)  # weights are deterministic


def test_perturbations_are_per_model_and_within_a_few_percent() -> None:
    a, b = perturbations(LLAMA3_8B), perturbations("Qwen/Qwen2.5-7B-Instruct")
    assert a != b and a == perturbations(LLAMA3_8B)
    for p in (a, b):
        assert 0.02 <= p["activation"] <= 0.08
        assert -0.05 <= p["non_torch"] <= 0.15
        assert 0.0 <= p["cudagraph"] <= 0.10


def test_deterministic() -> None:
    hidden = HiddenFacts(extra_activation_gib=0.5)
    first, second = run(hidden=hidden, **PLANNED_8B_L4), run(hidden=hidden, **PLANNED_8B_L4)
    assert first == second
    assert first.log_text(START) == second.log_text(START)


@pytest.mark.parametrize(("image", "wording", "needle"), [
    (IMAGE_011, "v1-models's", "the models's max seq len (8192)"),
    (IMAGE_026, "v1", "which also controls CPU memory on the CPU backend"),
])
def test_kv_cache_too_small_with_each_releases_message(image: str, wording: str, needle: str) -> None:
    # a larger activation peak than anyone planned for leaves too little for one 8192-token request
    outcome = run(image=image, hidden=HiddenFacts(extra_activation_gib=3.4), **PLANNED_8B_L4)
    assert not outcome.starts and outcome.phase is Phase.KV_CACHE and outcome.exit_code == 1
    assert outcome.failure_kind is FailureKind.KV_CACHE_TOO_SMALL
    assert needle in outcome.message
    assert "the estimated maximum model length is" in outcome.message
    failure = classified(outcome)
    assert failure.kind is FailureKind.KV_CACHE_TOO_SMALL
    assert failure.wording == wording
    assert failure.max_model_len == 8192
    assert failure.estimated_max_model_len is not None and failure.estimated_max_model_len < 8192
    assert failure.available_kv_gib == pytest.approx(outcome.available_kv_gib, abs=0.01)


@pytest.mark.parametrize(("image", "device"), [(IMAGE_011, "device ("), (IMAGE_026, "device cuda:0 (")])
def test_free_memory_failure_with_a_hidden_other_process(image: str, device: str) -> None:
    outcome = run(image=image, hidden=HiddenFacts(other_process_gib=6.0), **PLANNED_8B_L4)
    assert not outcome.starts and outcome.phase is Phase.INIT
    assert outcome.failure_kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY
    free = 21.84 - 6.0 - 0.51  # total - the other process - this process's CUDA context
    assert f"Free memory on {device}{free:.2f}/21.84 GiB) on startup is less than desired GPU memory utilization " \
           "(0.9, 19.66 GiB)" in outcome.message
    failure = classified(outcome)
    assert failure.kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY
    assert failure.free_gib == pytest.approx(free, abs=0.01) and failure.requested_gib == pytest.approx(19.66)


def test_the_free_memory_check_passes_below_what_is_free() -> None:
    hidden = HiddenFacts(other_process_gib=2.0)
    util = round((21.84 - 2.0 - 0.51 - 0.3) / 21.84, 2)
    outcome = run(hidden=hidden, tensor_parallel_size=1, gpu_memory_utilization=util, max_model_len=4096,
                  max_num_seqs=8)
    assert outcome.phase is not Phase.INIT


@pytest.mark.parametrize(("image", "wrapped"), [(IMAGE_023, True), (IMAGE_026, False), (IMAGE_033, False)])
def test_weights_that_do_not_fit_the_gpu(image: str, wrapped: bool) -> None:
    # the "Failed to load model" wrapper is the V1 runner's; Llama runs Model Runner V2 from 0.24
    outcome = run("meta-llama/Meta-Llama-3-70B-Instruct", image=image, gpu_name="RTX-4090", tensor_parallel_size=1,
                  max_model_len=8192)
    assert not outcome.starts and outcome.phase is Phase.LOADING
    assert outcome.failure_kind is FailureKind.WEIGHTS_DO_NOT_FIT
    assert outcome.message.startswith("ValueError: Failed to load model - not enough GPU memory.") is wrapped
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in outcome.message
    assert classified(outcome).kind is FailureKind.WEIGHTS_DO_NOT_FIT
    assert classified(outcome, whole_log=True).kind is FailureKind.WEIGHTS_DO_NOT_FIT


def test_a_0_33_image_logs_as_0_33_does() -> None:
    outcome = run(image=IMAGE_033, **PLANNED_8B_L4)
    assert outcome.starts, outcome.message
    text = outcome.log_text(START)
    assert re.search(r"\[startup\.py:38\]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0\.33\.0\r$", text, re.M), text[:2000]
    assert "Using V2 Model Runner" in text and "vLLM API server version" not in text
    assert re.search(r"Model loading took 14\.98\d* GiB memory and", text)  # the V1 wording again from 0.28
    assert "Estimated CUDA graph memory" not in text and "Graph capturing finished" in text
    # 0.28+: one line for the token count and the concurrency
    assert (f"GPU KV cache size: {outcome.kv_cache_tokens:,} tokens, Maximum concurrency for 8,192 tokens per "
            f"request: {outcome.max_concurrency:.2f}x") in text


@pytest.mark.parametrize(("version", "banner", "listening"), [
    # up to 0.14: one line (entrypoints/openai/api_server.py); "Starting vLLM API server 0 on" up to 0.17
    ("0.14.1", ["[api_server.py:1839] vLLM API server version 0.14.1"],
     "[launcher.py:44] Starting vLLM API server 0 on http://0.0.0.0:8000"),
    # 0.15.0 introduced log_version_and_model: a six-line logo record, monochrome without a TTY
    ("0.15.0", ["[utils.py:325] \r", "[utils.py:325]        █     █     █▄   ▄█\r",
                "[utils.py:325]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.15.0\r",
                f"[utils.py:325]   █▄█▀ █     █     █     █  model   {LLAMA3_8B}\r",
                "[utils.py:325]    ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀\r", "[utils.py:325] "],
     "[launcher.py:44] Starting vLLM API server 0 on http://0.0.0.0:8000"),
    ("0.32.0", ["[api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0\r",
                f"[api_utils.py:347]   █▄█▀ █     █     █     █  model   {LLAMA3_8B}\r"],
     "[entry.py:140] Starting vLLM server on http://0.0.0.0:8000"),
])
def test_the_version_banner_and_the_listening_line_are_the_release_s_own(version: str, banner: list[str],
                                                                         listening: str) -> None:
    outcome = run(image=f"vllm/vllm-openai:v{version}", **PLANNED_8B_L4)
    assert outcome.starts, outcome.message
    text = outcome.log_text(START)
    found = [line[line.index("["):] for line in text.split("\n") if line.startswith("(APIServer pid=1) INFO ")]
    at = found.index(banner[0])
    assert found[at:at + len(banner)] == banner, found[:12]
    assert listening in found
    assert ("vLLM API server version" in text) is (version == "0.14.1")


def test_without_the_logo_0_32_says_its_version_and_model_on_one_line() -> None:
    outcome = simulate_startup(serve_args(LLAMA3_8B, **PLANNED_8B_L4), "vllm/vllm-openai:v0.32.0", gpu("L4"),
                               HiddenFacts(), model(LLAMA3_8B), env={"VLLM_DISABLE_LOG_LOGO": "1"})
    text = outcome.log_text(START)
    assert f"[api_utils.py:347] vLLM server version 0.32.0, serving model {LLAMA3_8B}\n" in text
    assert "▀▄▀" not in text


def test_the_simulator_and_the_planner_agree_on_0_33_bookkeeping() -> None:
    files = model(LLAMA3_8B)
    arch = arch_from_config(files.config, model_id=LLAMA3_8B, total_size=files.total_size)
    outcome = run(image=IMAGE_033, **PLANNED_8B_L4)
    flags = EngineFlags(max_model_len=8192, max_num_seqs=13, max_num_batched_tokens=2048, gpu_memory_utilization=0.9,
                        kv_cache_memory_bytes=int(outcome.available_kv_gib * 2**30))
    pred = predict_startup(arch, flags, GPUFacts(total_gib=gpu("L4").reported_gib), profile_for("0.33.0"))
    assert outcome.kv_cache_tokens == pytest.approx(pred.kv_cache_tokens, rel=0.002)


def test_yarn_length_follows_the_release() -> None:
    # Qwen2.5-7B-Instruct with YaRN x4 in its config: 131072 until 0.29, 32768 from 0.30
    files = model(QWEN25_7B)
    config = {**files.config, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 32768}}
    arch = arch_from_config(config, model_id=QWEN25_7B, total_size=files.total_size)
    args = serve_args(QWEN25_7B, max_model_len=65536, tensor_parallel_size=1)
    old = simulate_startup(args, "vllm/vllm-openai:v0.29.0", gpu("H100"), HiddenFacts(), arch)
    new = simulate_startup(args, IMAGE_033, gpu("H100"), HiddenFacts(), arch)
    assert old.failure_kind is not FailureKind.MAX_MODEL_LEN_TOO_LONG
    assert new.failure_kind is FailureKind.MAX_MODEL_LEN_TOO_LONG
    assert classified(new).kind is FailureKind.MAX_MODEL_LEN_TOO_LONG


def test_weights_oom_before_0_13_is_pytorchs_own_text_placed_by_its_frames() -> None:
    outcome = run("meta-llama/Meta-Llama-3-70B-Instruct", image=IMAGE_011, gpu_name="RTX-4090",
                  tensor_parallel_size=1, max_model_len=8192)
    assert outcome.message.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    # only the frames of the traceback say it was loading; they are in the log, beyond the message's 2 KB
    assert classified(outcome, whole_log=True).kind is FailureKind.WEIGHTS_DO_NOT_FIT


def test_host_memory_over_the_limit_is_an_oom_kill_while_loading() -> None:
    outcome = simulate_startup(serve_args(LLAMA3_8B, **PLANNED_8B_L4), IMAGE_026, gpu("L4"),
                               HiddenFacts(host_memory_limit_gib=6.0), model(LLAMA3_8B), memory_limit_gib=24.0)
    assert not outcome.starts and outcome.phase is Phase.LOADING
    assert (outcome.reason, outcome.exit_code) == ("OOMKilled", 137)
    assert outcome.failure_kind is FailureKind.HOST_OOM_KILLED
    assert "Loading safetensors checkpoint shards:" in outcome.log_text(START).splitlines()[-1]
    assert classified(outcome).kind is FailureKind.HOST_OOM_KILLED
    # the container's own limit counts too
    small = simulate_startup(serve_args(LLAMA3_8B, **PLANNED_8B_L4), IMAGE_026, gpu("L4"),
                             HiddenFacts(extra_host_memory_gib=20.0), model(LLAMA3_8B), memory_limit_gib=24.0)
    assert small.reason == "OOMKilled"


def test_cuda_graph_capture_out_of_memory() -> None:
    outcome = run(hidden=HiddenFacts(extra_cudagraph_gib=2.5), **PLANNED_8B_L4)
    assert not outcome.starts and outcome.phase is Phase.CUDA_GRAPHS
    assert outcome.failure_kind is FailureKind.CUDA_OOM_STARTUP
    failure = classified(outcome, whole_log=True)
    assert failure.kind is FailureKind.CUDA_OOM_STARTUP and failure.phase == "cudagraph"
    assert classified(outcome).kind is FailureKind.CUDA_OOM_STARTUP
    assert run(hidden=HiddenFacts(extra_cudagraph_gib=2.5), enforce_eager=True, **PLANNED_8B_L4).starts


def test_no_memory_left_for_the_kv_cache() -> None:
    outcome = run(hidden=HiddenFacts(extra_activation_gib=4.5), **PLANNED_8B_L4)
    assert outcome.failure_kind is FailureKind.NO_KV_CACHE_MEMORY
    assert classified(outcome).kind is FailureKind.NO_KV_CACHE_MEMORY


def test_max_model_len_above_the_models_context() -> None:
    outcome = run(tensor_parallel_size=1, max_model_len=16384)
    assert outcome.failure_kind is FailureKind.MAX_MODEL_LEN_TOO_LONG and outcome.phase is Phase.CONFIG
    assert classified(outcome).kind is FailureKind.MAX_MODEL_LEN_TOO_LONG


def test_parallelism_that_does_not_divide_the_model_or_exceeds_the_gpus() -> None:
    odd = simulate_startup(serve_args(LLAMA3_8B, tensor_parallel_size=3), IMAGE_026, gpu("L4"), None,
                           model(LLAMA3_8B), gpu_count=4)
    assert odd.failure_kind is FailureKind.INVALID_PARALLELISM
    assert classified(odd).kind is FailureKind.INVALID_PARALLELISM
    wide = simulate_startup(serve_args(LLAMA3_8B, tensor_parallel_size=2), IMAGE_026, gpu("L4"), None,
                            model(LLAMA3_8B), gpu_count=1)
    assert wide.failure_kind is FailureKind.INVALID_PARALLELISM
    assert "World size (2) is larger than the number of available GPUs (1)" in wide.message


def test_argument_errors_exit_2_as_argparse_does() -> None:
    outcome = run(no_such_flag=1)
    assert (outcome.exit_code, outcome.phase) == (2, Phase.ARGS)
    assert outcome.message == "vllm serve: error: unrecognized arguments: --no-such-flag 1"
    assert classified(outcome).kind is FailureKind.INVALID_ARGUMENT
    # a flag the image's release does not have yet
    old = run(image="vllm/vllm-openai:v0.10.0", kv_cache_memory_bytes=2**30)
    assert old.exit_code == 2 and "--kv-cache-memory-bytes" in old.message


def test_parse_vllm_args_reads_both_command_styles() -> None:
    serve = parse_vllm_args(serve_args(LLAMA3_8B, max_model_len="32k", enable_prefix_caching=True), "0.26.0")
    assert (serve.model, serve.max_model_len, serve.enable_prefix_caching) == (LLAMA3_8B, 32000, True)
    module = parse_vllm_args(["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", LLAMA3_8B,
                              "--no-enable-chunked-prefill", "-tp", "2"], "0.26.0")
    assert (module.model, module.enable_chunked_prefill, module.tensor_parallel_size) == (LLAMA3_8B, False, 2)


def test_an_unknown_model_fails_as_the_hub_says() -> None:
    outcome = simulate_startup(serve_args("acme/not-a-model"), IMAGE_026, gpu("L4"), None, None)
    assert outcome.failure_kind is FailureKind.MODEL_NOT_FOUND
    assert classified(outcome).kind is FailureKind.MODEL_NOT_FOUND


def test_every_failure_keeps_its_root_cause_in_the_termination_message() -> None:
    cases = [run(hidden=HiddenFacts(extra_activation_gib=3.4), **PLANNED_8B_L4),
             run(hidden=HiddenFacts(other_process_gib=6.0), **PLANNED_8B_L4),
             run("meta-llama/Meta-Llama-3-70B-Instruct", gpu_name="RTX-4090", tensor_parallel_size=1,
                 max_model_len=8192),
             run(hidden=HiddenFacts(extra_cudagraph_gib=2.5), **PLANNED_8B_L4)]
    for outcome in cases:
        message = termination_message(outcome.log_text(START))
        assert len(message.encode()) <= 2048 and len(message.splitlines()) <= 80
        assert outcome.message.splitlines()[0][:60] in message
        assert message.rstrip().endswith("Failed core proc(s): {}")


def test_serving_oom_when_the_batch_is_larger_than_the_hidden_limit() -> None:
    outcome = run(**PLANNED_8B_L4)
    hidden = HiddenFacts(serving_oom_above_seqs=8)
    assert serving_oom(outcome, HiddenFacts(), 64, 2048) is None
    assert serving_oom(outcome, hidden, 8, 2048) is None  # vLLM never runs more than the traffic offers
    lines, message = serving_oom(outcome, hidden, 64, 2048) or ([], "")
    assert message.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert any("Running: 13 reqs" in line.text for line in lines)  # max_num_seqs caps the batch
    smaller = run(tensor_parallel_size=1, gpu_memory_utilization=0.9, max_model_len=8192, max_num_seqs=6)
    assert serving_oom(smaller, hidden, 64, 2048) is None


def test_no_gpu_visible() -> None:
    outcome = simulate_startup(serve_args(LLAMA3_8B), IMAGE_026, None, None, model(LLAMA3_8B))
    assert not outcome.starts and "Failed to infer device type" in outcome.message


def test_a_speculative_config_takes_kv_and_is_refused_before_0_8_2() -> None:
    config = '{"method":"ngram","num_speculative_tokens":4}'
    plain = run(image=IMAGE_033, **PLANNED_8B_L4)
    eagle = run(image=IMAGE_033, **PLANNED_8B_L4,
                speculative_config='{"method":"eagle3","model":"org/eagle3-head","num_speculative_tokens":3}')
    assert plain.starts and eagle.starts, eagle.message
    assert eagle.available_kv_gib < plain.available_kv_gib  # the head's weights and its KV pages
    assert eagle.kv_cache_tokens < plain.kv_cache_tokens
    assert run(image=IMAGE_033, **PLANNED_8B_L4, speculative_config=config).starts
    old = run(image=IMAGE_011.replace("0.11.0", "0.8.1"), **PLANNED_8B_L4, speculative_config=config)
    assert not old.starts and "--speculative-config" in old.message
    bad = run(image=IMAGE_033, **PLANNED_8B_L4, speculative_config='{"method":"ngram"}')
    assert not bad.starts and "num_speculative_tokens" in bad.message


def test_the_declared_version_decides_for_a_digest_and_the_tag_wins_over_it() -> None:
    digest = "vllm/vllm-openai@sha256:" + "cd" * 32

    def version_of(image: str, declared: str | None) -> str:
        outcome = simulate_startup(serve_args(LLAMA3_8B, **PLANNED_8B_L4), image, gpu("L4"), HiddenFacts(),
                                   model(LLAMA3_8B), declared_version=declared)
        assert outcome.starts, outcome.message
        found = re.search(r"(?:vLLM API server version| ▀▄▀ █  version) (\S+)", outcome.log_text(START))
        assert found is not None
        return found.group(1)

    assert version_of(digest, "0.26.0") == "0.26.0"
    assert version_of("registry.local/vllm:prod", "0.23.0") == "0.23.0"
    assert version_of(digest, None) == NEWEST_KNOWN_VERSION  # undeclared: the newest release the simulator knows
    assert version_of(IMAGE_026, "0.33.0") == "0.26.0"  # a tag naming a release is what the image runs
    assert version_of(digest, "not-a-version") == NEWEST_KNOWN_VERSION


# --- LoRA (issue 14): adapter slots by the simulator's own count, and what a release refuses ---------------------

LORA_8B = {"enable_lora": True, "max_loras": 4, "max_lora_rank": 64}


def test_lora_slots_take_kv_cache_memory() -> None:
    plain = run(image=IMAGE_033, **PLANNED_8B_L4)
    served = run(image=IMAGE_033, **PLANNED_8B_L4, **LORA_8B)
    assert plain.starts and served.starts, served.message
    assert served.kv_cache_tokens is not None and plain.kv_cache_tokens is not None
    assert served.kv_cache_tokens < plain.kv_cache_tokens
    slots_gib = 4 * 64 / 16 * 92_356_608 / 2**30  # Llama-3-8B: 92,356,608 B per slot at rank 16 (test_lora.py)
    assert served.weights_gib == pytest.approx(plain.weights_gib + slots_gib, abs=0.01)
    assert served.available_kv_gib == pytest.approx(plain.available_kv_gib - slots_gib, abs=0.02)
    loaded = re.search(r"Model loading took (\d+\.\d+) GiB", served.log_text(START))
    assert loaded and float(loaded[1]) == pytest.approx(served.weights_gib, abs=0.01)  # the slots are in it


def test_the_simulators_slot_count_agrees_with_the_planners() -> None:
    # two counts written separately from vLLM's create_lora_weights: vllm_operator_sim/lora.py, planner/lora.py
    from vllm_operator.planner.lora import LoRASlots, adapter_bytes_per_stage
    from vllm_operator_sim.lora import adapter_slot_bytes
    cases = [(LLAMA3_8B, 1, 3, 16, [32]), (QWEN25_7B, 4, 2, 8, [28]), ("deepseek-ai/DeepSeek-V2-Lite", 2, 1, 16, [27]),
             ("deepseek-ai/DeepSeek-V3", 8, 2, 64, [31, 30]), ("Qwen/Qwen1.5-MoE-A2.7B", 2, 4, 32, [12, 12]),
             ("Qwen/Qwen3-30B-A3B", 4, 2, 128, [48])]
    for model_id, tp, slots, rank, stages in cases:
        files = model(model_id)
        arch = arch_from_config(files.config, model_id=model_id, total_size=files.total_size)
        for experts in (True, False):  # vLLM 0.11.1+ / before: the fused MoE experts get slots or not
            sim = adapter_slot_bytes(arch, slots=slots, rank=rank, dtype_bytes=2, tp=tp, stage_layers=stages,
                                     experts=experts)
            planned = adapter_bytes_per_stage(arch, LoRASlots(max_loras=slots, max_rank=rank, moe_experts=experts),
                                              tp, stages).per_stage
            assert tuple(sim) == planned, (model_id, experts)


def test_lora_on_a_tight_gpu_fails_as_vllm_would() -> None:
    tight = {**PLANNED_8B_L4, "enable_lora": True, "max_loras": 8, "max_lora_rank": 128}  # 5.5 GiB of slots
    outcome = run(image=IMAGE_033, **tight)
    assert not outcome.starts
    assert outcome.failure_kind in (FailureKind.KV_CACHE_TOO_SMALL, FailureKind.NO_KV_CACHE_MEMORY)
    assert classified(outcome).kind is outcome.failure_kind


def test_lora_refused_for_a_model_class_without_it() -> None:
    old = run("openai/gpt-oss-20b", image="vllm/vllm-openai:v0.10.2", gpu_name="H100", enable_lora=True)
    assert not old.starts and old.phase is Phase.LOADING and old.exit_code == 1
    assert "ValueError: GptOssForCausalLM does not support LoRA yet." in old.log_text(START)
    failure = classified(old)
    assert failure.kind is FailureKind.INVALID_ARGUMENT and failure.wording == "lora-unsupported"
    assert run("openai/gpt-oss-20b", image=IMAGE_033, gpu_name="H100", enable_lora=True).starts
    files = model(LLAMA3_8B)
    mamba = arch_from_config(files.config, model_id=LLAMA3_8B, total_size=files.total_size).model_copy(
        update={"architectures": ("MambaForCausalLM",)})
    new = simulate_startup(serve_args(LLAMA3_8B, enable_lora=True, **PLANNED_8B_L4), IMAGE_033, gpu("L4"),
                           HiddenFacts(), mamba)
    assert not new.starts and new.phase is Phase.CONFIG
    assert f"Value error, LoRA is not supported for MambaForCausalLM ({LLAMA3_8B})" in new.log_text(START)
    assert classified(new).wording == "lora-unsupported"


@pytest.mark.parametrize(("image", "rank", "needle"), [
    ("vllm/vllm-openai:v0.8.1", 1, "ValueError: max_lora_rank (1) must be one of (8, 16, 32, 64, 128, 256, 320, 512)."),
    (IMAGE_033, 12, "Input should be 1, 8, 16, 32, 64, 128, 256, 320 or 512"),
])
def test_a_rank_the_release_refuses(image: str, rank: int, needle: str) -> None:
    outcome = run(image=image, **PLANNED_8B_L4, enable_lora=True, max_lora_rank=rank)
    assert not outcome.starts and outcome.phase is Phase.CONFIG
    assert needle in outcome.log_text(START)
    assert classified(outcome).kind is FailureKind.INVALID_ARGUMENT


def test_moe_experts_take_adapter_slots_only_from_0_11_1() -> None:
    moe = "Qwen/Qwen3-30B-A3B"
    flags = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 32,
             "enable_lora": True, "max_loras": 2}
    old = run(moe, image="vllm/vllm-openai:v0.11.0", gpu_name="H100", **flags)
    new = run(moe, image="vllm/vllm-openai:v0.11.1", gpu_name="H100", **flags)
    assert old.starts and new.starts, (old.message, new.message)
    # 2 slots x 128 experts x 48 layers x 16 x (3 x 2048 + 3 x 768) elements x 2 bytes = 3.09 GiB
    assert new.weights_gib - old.weights_gib == pytest.approx(3.09, abs=0.01)


def test_lora_refused_before_the_weights_load_up_to_0_6_3() -> None:
    outcome = run("Qwen/Qwen1.5-MoE-A2.7B", image="vllm/vllm-openai:v0.6.3", gpu_name="H100", enable_lora=True)
    assert not outcome.starts and outcome.phase is Phase.LOADING
    text = outcome.log_text(START)
    assert "ValueError: Model Qwen2MoeForCausalLM does not support LoRA, but LoRA is enabled." in text
    assert "Loading weights took" not in text
    assert classified(outcome).wording == "lora-unsupported"


@pytest.mark.parametrize(("image", "where"), [(IMAGE_026, "available GPU memory ("), (IMAGE_033, "GiB GPU)")])
def test_max_model_len_auto_fits_the_context_to_the_kv_cache_vllm_measured(image: str, where: str) -> None:
    # the same too-small KV cache that stops an explicit 8192 (above): `auto` starts with the longest that fits
    # (vLLM's _auto_fit_max_model_len), and says so, instead of refusing
    flags = {**PLANNED_8B_L4, "max_model_len": "auto"}
    outcome = run(image=image, hidden=HiddenFacts(extra_activation_gib=3.4), **flags)
    assert outcome.starts, outcome.message
    text = outcome.log_text(START)
    found = re.search(r"Auto-fit max_model_len: reduced from (\d+) to (\d+) to fit in (.*)", text)
    assert found is not None, text
    derived, chosen = int(found.group(1)), int(found.group(2))
    assert derived == 8192 and 0 < chosen < 8192 and where in found.group(3)
    assert f"Maximum concurrency for {chosen:,} tokens" in text or outcome.flags.max_model_len == chosen


def test_max_model_len_auto_keeps_the_full_context_when_it_fits() -> None:
    outcome = run(image=IMAGE_033, **{**PLANNED_8B_L4, "max_model_len": "auto"})
    assert outcome.starts
    assert "Auto-fit max_model_len: full model context length 8192 fits in available KV cache memory (" \
        in outcome.log_text(START)


def test_max_model_len_auto_without_room_for_one_token_is_vllms_own_refusal() -> None:
    # less KV memory than one block: vLLM raises instead of fitting (kv_cache_utils._auto_fit_max_model_len), and
    # the operator's classifier reads that text as "no KV cache memory"
    from vllm_operator_sim.startup import _auto_fit, _Run
    assert _auto_fit(_Run("0.33.0", "seed"), (0, 33, 0), derived=8192, estimate=0, avail_gib=0.01) is None
    text = ("ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single "
            "token. Try increasing `gpu_memory_utilization`.")
    assert classify_text(text, terminated_reason="Error", exit_code=1).kind is FailureKind.NO_KV_CACHE_MEMORY
