"""The startup simulator: what a vLLM container does with these arguments on this GPU — start, or fail how.

`simulate_startup(args, image, gpu, hidden, model)` parses the container's arguments as `vllm serve` does, picks the
release from the image tag, and walks vLLM's startup in its own order: argument parsing, config checks (context
length, parallelism), the free-memory check at device init, weight loading (GPU and host memory), the profiling run,
the KV-cache budget and its checks, CUDA-graph capture, then the API server. It returns the log vLLM would print,
line by line with simulated offsets, and — on failure — the exception text of that release as the last lines, the
exit code (1; 2 for argument errors) or an OOM kill (137) when host memory runs over the container's limit.

Ground truth is deliberately NOT the planner's model. vLLM's deterministic bookkeeping (weight bytes, KV layout,
blocks, tokens, the error texts) is shared with `vllm_operator.planner`, but every term vLLM *measures* at run time
comes from :class:`HiddenFacts`, which the planner cannot see, and differs from the planner's estimate even by
default:

* activation peak = planner estimate × (1 + a per-model perturbation of 2-8 %) + ``extra_activation_gib``;
* non-torch memory = planner estimate × (1 + a per-model perturbation of -5..+15 %) + ``extra_non_torch_gib``;
* CUDA-graph memory = planner estimate × (1 + 0..10 %) + ``extra_cudagraph_gib`` (actual capture ~3 % more);
* the GPU total vLLM reads = the catalog's reported total − ``total_delta_gib``;
* free memory at device init = total − the CUDA context − ``other_process_gib`` (another process on the GPU);
* host memory while loading = 35 % of the checkpoint + 3 GiB per worker + 1.5 GiB + swap/CPU-offload +
  ``extra_host_memory_gib``, against the container's memory limit, or ``host_memory_limit_gib`` if that is lower;
* a Ready server dies of a CUDA OOM when it runs more than ``serving_oom_above_seqs`` sequences at once
  (:func:`serving_oom`).

In native multi-node mode (``--nnodes``, one pod per node of a LeaderWorkerSet group) each pod runs ONE node's
share: its ranks' pipeline stages, with the layers split by the simulator's own copy of vLLM's ``get_pp_indices``
(honouring ``VLLM_PP_LAYER_PARTITION`` from the container's env) — not the planner's split. A node checks its own
stages' memory (a worker on the last stage can run out while the leader is fine; a node whose peer died waits,
then fails without a cause of its own); the KV budget stays the minimum over every stage, as vLLM unifies it.

Perturbations are seeded by the model id, timings by the model id and the arguments, so results are reproducible.
Pure: no I/O, no clock; the kubelet places the result on its simulated timeline.
"""

from __future__ import annotations

import argparse
import hashlib
import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict, Field

from vllm_operator.modelfiles import ModelFiles
from vllm_operator.planner import messages
from vllm_operator.planner.arch import ModelArch, arch_from_config, checkpoint_bytes
from vllm_operator.planner.failures import FailureKind
from vllm_operator.planner.gpus import GPUSpec
from vllm_operator.planner.memory import (
    EngineFlags,
    GPUFacts,
    activation_bytes,
    arch_for_release,
    cudagraph_bytes,
    init_nontorch_gib,
    non_torch_bytes,
    predict_startup,
    profile_for_model,
    v2_sampler_state_bytes,
    weights_bytes_per_gpu,
)
from vllm_operator.planner.speculative import SpeculativeConfigError, parse_speculative_config
from vllm_operator.planner.versions import (
    NEWEST_KNOWN_VERSION,
    VersionError,
    batch_defaults,
    parse_version,
    profile_for,
    version_from_image,
)
from vllm_operator.render.flags import flag_table

from .lora import adapter_slot_bytes, lora_refusal, rank_error, wraps_experts

__all__ = [
    "HiddenFacts",
    "LogLine",
    "Phase",
    "StartupOutcome",
    "VLLMArgs",
    "parse_vllm_args",
    "perturbations",
    "serving_line",
    "serving_oom",
    "simulate_startup",
    "termination_message",
    "version_banner",
    "worker_network_exit",
]

GiB = 2**30
_ENGINE_PID = 281
_PREFIX_API = "(APIServer pid=1) "
_PREFIX_ENGINE = f"(EngineCore_DP0 pid={_ENGINE_PID}) "
_PREFIX_MAIN = "(MainProcess pid=1) "  # a headless node's `vllm serve` (no API server)
#: From 0.18.0 the engine core process of an engine without data parallelism is "EngineCore", not "EngineCore_DP0"
#: (v1/engine/utils.py: ``name=f"EngineCore_DP{global_index}" if is_dp else "EngineCore"``).
_PREFIX_CORE = f"(EngineCore pid={_ENGINE_PID}) "
ENGINE_CORE_SINCE = (0, 18, 0)
BARE_OUTPUT_SINCE = (0, 31, 0)
_SITE = "/usr/local/lib/python3.12/dist-packages/vllm"


class HiddenFacts(BaseModel):
    """What the cluster knows and the planner cannot see; per scenario (see sim/scenarios.yaml)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    other_process_gib: float = Field(0.0, ge=0, description="GPU memory another process holds on each GPU")
    extra_activation_gib: float = Field(0.0, ge=0, description="activation peak above the perturbed estimate")
    activation_perturbation: float | None = Field(None, description="override the per-model perturbation")
    extra_non_torch_gib: float = Field(0.0, ge=0, description="NCCL/cuBLAS/attention workspaces above the estimate")
    extra_cudagraph_gib: float = Field(0.0, ge=0, description="CUDA-graph memory above the estimate")
    total_delta_gib: float = Field(0.0, ge=0, description="the driver reports this much less than the catalog")
    host_memory_limit_gib: float | None = Field(
        None, gt=0, description="host memory the container really gets, when lower than its limit (LimitRange, …)")
    extra_host_memory_gib: float = Field(0.0, ge=0, description="host memory used beyond the usual while loading")
    serving_oom_above_seqs: int | None = Field(
        None, ge=1, description="a serving batch of more than this many sequences runs out of GPU memory")
    load_gib_per_second: float = Field(2.0, gt=0, description="weight loading speed from the model cache")
    # multi-node groups (issue 13): what one rank of the engine meets that the others do not
    last_stage_unprofiled_gib: float = Field(
        0.0, ge=0, description="memory the LAST pipeline stage's ranks use beside vLLM's profiled budget once the "
                               "KV cache is allocated (lm_head logits and sampler buffers: vllm#14120 'the last PP "
                               "GPU always OOMs'); it runs out at CUDA-graph capture")
    worker_exit_after_s: float | None = Field(
        None, gt=0, description="a headless worker (node rank > 0) dies this long after it started serving, of an "
                                "NCCL watchdog timeout, while the leader's HTTP still answers (LLMKube#1782)")
    worker_exits: int = Field(1, ge=0, description="how many worker runs of the service end that way")


class Phase(StrEnum):
    """How far the container got."""

    ARGS = "args"
    CONFIG = "config"
    INIT = "init"
    LOADING = "loading"
    PROFILING = "profiling"
    KV_CACHE = "kv_cache"
    CUDA_GRAPHS = "cuda_graphs"
    READY = "ready"
    SERVING = "serving"


class LogLine(BaseModel):
    """One line of the container's output, ``offset_s`` simulated seconds after the container started."""

    model_config = ConfigDict(frozen=True)

    offset_s: float
    text: str
    level: str | None = Field(None, description="INFO/WARNING/ERROR: rendered as a vLLM log record with a header")
    source: str = "core.py:708"
    process: str = "api"  # api | engine (EngineCore_DP0) | core (EngineCore, 0.18+) | main | raw

    def render(self, start: datetime) -> str:
        prefix = {"api": _PREFIX_API, "engine": _PREFIX_ENGINE, "core": _PREFIX_CORE,
                  "main": _PREFIX_MAIN}.get(self.process, "")
        if self.level is None:
            return prefix + self.text
        stamp = (start + timedelta(seconds=self.offset_s)).strftime("%m-%d %H:%M:%S")
        return f"{prefix}{self.level} {stamp} [{self.source}] {self.text}"


class StartupOutcome(BaseModel):
    """The simulated container run, up to Ready or to its death."""

    starts: bool
    phase: Phase = Field(description="READY when it starts; otherwise the phase it died in")
    exit_code: int = 0
    reason: str | None = Field(None, description="Error or OOMKilled when it dies")
    failure_kind: FailureKind | None = None
    message: str = Field("", description="the exception text vLLM ends with (empty when it starts or is killed)")
    log: list[LogLine] = Field(default_factory=list)
    duration_s: float = Field(description="simulated seconds from container start to Ready or to death")
    vllm_version: str
    model_id: str = ""
    flags: EngineFlags | None = None
    gpu_total_gib: float = 0.0
    weights_gib: float = 0.0
    activation_gib: float = 0.0
    non_torch_gib: float = 0.0
    cudagraph_gib: float = 0.0
    available_kv_gib: float = 0.0
    kv_cache_tokens: int = 0
    max_concurrency: float = 0.0
    host_peak_gib: float = 0.0

    def log_text(self, start: datetime, until_s: float | None = None) -> str:
        """The log as `kubectl logs` shows it (lines up to ``until_s`` seconds after ``start``)."""
        lines = [line.render(start) for line in self.log if until_s is None or line.offset_s <= until_s]
        return "".join(line + "\n" for line in lines)


def termination_message(log_text: str, *, max_bytes: int = 2048, max_lines: int = 80) -> str:
    """What the kubelet stores as terminated.message with `terminationMessagePolicy: FallbackToLogsOnError`:
    the end of the log, at most 80 lines and 2048 bytes, whichever is smaller."""
    lines = log_text.splitlines()[-max_lines:]
    text = "\n".join(lines)
    data = text.encode()
    if len(data) > max_bytes:
        text = data[-max_bytes:].decode(errors="ignore")
    return text


# --------------------------------------------------------------------------------------------------------------
# Arguments


class ArgumentError(Exception):
    """argparse's complaint, as `vllm serve` prints it."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ArgumentError(message)


def _human_len(text: str) -> int:
    raw = text.strip()
    multiplier = 1
    if raw[-1:] in ("k", "m"):
        multiplier, raw = (1000 if raw[-1] == "k" else 1_000_000), raw[:-1]
    elif raw[-1:] in ("K", "M"):
        multiplier, raw = (1024 if raw[-1] == "K" else 1024 * 1024), raw[:-1]
    if raw in ("auto", "-1"):
        return -1
    return int(float(raw) * multiplier)


def _build_parser() -> _Parser:
    p = _Parser(prog="vllm serve", add_help=False, allow_abbrev=False)
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--model")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--revision")
    p.add_argument("--tokenizer")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--max-model-len", type=_human_len)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--block-size", type=int)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", "-q")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--cpu-offload-gb", type=float, default=0.0)
    p.add_argument("--swap-space", type=float)
    p.add_argument("--kv-cache-memory-bytes", "--kv-cache-memory", type=int, dest="kv_cache_memory_bytes")
    p.add_argument("--disable-hybrid-kv-cache-manager", action="store_true")
    p.add_argument("--speculative-config")
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-lora-rank", type=int)
    p.add_argument("--max-loras", type=int)
    p.add_argument("--seed", type=int)
    # native multi-node (mp) mode, vLLM >= 0.11.1: one engine over --nnodes pods (operator's LeaderWorkerSet)
    p.add_argument("--nnodes", "-n", type=int, default=1)
    p.add_argument("--node-rank", "-r", type=int, default=0)
    p.add_argument("--master-addr")
    p.add_argument("--master-port", type=int)
    p.add_argument("--headless", action="store_true")
    for name in ("--chat-template", "--tool-call-parser", "--reasoning-parser", "--api-key", "--uvicorn-log-level",
                 "--generation-config", "--load-format", "--download-dir", "--distributed-executor-backend",
                 "--limit-mm-per-prompt", "--max-logprobs", "--lora-modules"):
        p.add_argument(name)
    for name in ("--enable-auto-tool-choice", "--disable-log-requests", "--disable-log-stats",
                 "--enable-log-requests", "--disable-frontend-multiprocessing"):
        p.add_argument(name, action="store_true")
    return p


_PARSER = _build_parser()
# flags the release table tracks: dest → table name (the rest exist in every release we simulate)
_TRACKED = ("nnodes", "node_rank", "master_addr", "master_port", "headless",
            "swap_space", "cpu_offload_gb", "kv_cache_memory_bytes", "disable_hybrid_kv_cache_manager",
            "speculative_config", "enable_prefix_caching", "enable_chunked_prefill", "kv_cache_dtype", "quantization")


class VLLMArgs(BaseModel):
    """The parsed command line (None: not given, vLLM decides)."""

    model: str
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    cpu_offload_gb: float = 0.0
    swap_space: float | None = None
    kv_cache_memory_bytes: int | None = None
    nnodes: int = 1
    node_rank: int = 0
    headless: bool = False
    speculative_config: str | None = None
    enable_lora: bool = False
    max_loras: int = Field(1, description="--max-loras: adapter slots (vLLM's default 1)")
    max_lora_rank: int = Field(16, description="--max-lora-rank (vLLM's default 16)")
    given: dict[str, Any] = Field(default_factory=dict, description="what the command line set (dest → value)")


def _strip_command(args: Sequence[str]) -> list[str]:
    items = list(args)
    if items[:2] == ["vllm", "serve"]:
        return items[2:]
    for i, item in enumerate(items[:4]):
        if item == "vllm.entrypoints.openai.api_server":
            return items[i + 1 :]
    return items


def parse_vllm_args(args: Sequence[str], version: str) -> VLLMArgs:
    """Parse like `vllm serve` of that release; raises ArgumentError with argparse's message."""
    items = _strip_command(args)
    ns = _PARSER.parse_args(items)
    table = flag_table()
    unknown: list[str] = []
    given: dict[str, Any] = {}
    for dest in vars(ns):
        value = getattr(ns, dest)
        default = _PARSER.get_default(dest)
        if value is None or value == default:
            continue
        given[dest] = value
        if dest in _TRACKED and not table.supports(dest, version):
            unknown.append("--" + dest.replace("_", "-"))
        if value is False and dest in ("enable_prefix_caching", "enable_chunked_prefill") and not table.can_negate(
                dest, version):
            unknown.append("--no-" + dest.replace("_", "-"))
    if unknown:
        raise ArgumentError("unrecognized arguments: " + " ".join(unknown))
    model = ns.model or ns.model_tag
    if not model:
        raise ArgumentError("the following arguments are required: model_tag")
    if ns.max_model_len == -1 and not table.supports("max_model_len_auto", version):
        raise ArgumentError("argument --max-model-len: invalid _human_len value: 'auto'")
    return VLLMArgs(
        model=model, tensor_parallel_size=ns.tensor_parallel_size, pipeline_parallel_size=ns.pipeline_parallel_size,
        gpu_memory_utilization=ns.gpu_memory_utilization, max_model_len=ns.max_model_len,
        max_num_seqs=ns.max_num_seqs, max_num_batched_tokens=ns.max_num_batched_tokens, block_size=ns.block_size,
        dtype=ns.dtype, quantization=ns.quantization, kv_cache_dtype=ns.kv_cache_dtype,
        enforce_eager=ns.enforce_eager, enable_prefix_caching=ns.enable_prefix_caching,
        enable_chunked_prefill=ns.enable_chunked_prefill, cpu_offload_gb=ns.cpu_offload_gb or 0.0,
        swap_space=ns.swap_space, kv_cache_memory_bytes=ns.kv_cache_memory_bytes, nnodes=max(ns.nnodes, 1),
        node_rank=max(ns.node_rank, 0), headless=bool(ns.headless), speculative_config=ns.speculative_config,
        enable_lora=ns.enable_lora, max_loras=ns.max_loras or 1, max_lora_rank=ns.max_lora_rank or 16, given=given)


# --------------------------------------------------------------------------------------------------------------
# Determinism


def _unit(*parts: object) -> float:
    """A number in [0, 1) that depends only on ``parts``."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def perturbations(model_id: str) -> dict[str, float]:
    """The per-model relative differences between vLLM's measurements and the planner's estimates."""
    return {
        "activation": 0.02 + 0.06 * _unit(model_id, "activation"),
        "non_torch": -0.05 + 0.20 * _unit(model_id, "non_torch"),
        "cudagraph": 0.10 * _unit(model_id, "cudagraph"),
        "cudagraph_capture": 0.03,
    }


# --------------------------------------------------------------------------------------------------------------
# The run


#: The monochrome logo vLLM logs from 0.15.0 instead of "vLLM API server version X" (``log_version_and_model`` in
#: entrypoints/utils.py, later serve/utils/api_utils.py and common/startup.py): without a TTY the formatter is vLLM's
#: NewLineFormatter, which gives each line of the message the record's header and ends all but the last with "\r".
_LOGO = ("", "       █     █     █▄   ▄█", " ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}",
         "  █▄█▀ █     █     █     █  model   {model}", "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀", "")
#: Where each release range logs it: (first release, source of the record), newest first (read from the wheels).
_BANNER_SOURCES: tuple[tuple[tuple[int, ...], str], ...] = (
    ((0, 33, 0), "startup.py:38"), ((0, 29, 0), "api_utils.py:347"), ((0, 28, 0), "api_utils.py:333"),
    ((0, 26, 0), "api_utils.py:345"), ((0, 23, 0), "api_utils.py:339"), ((0, 22, 0), "utils.py:344"),
    ((0, 21, 0), "utils.py:306"), ((0, 19, 0), "utils.py:299"), ((0, 18, 0), "utils.py:297"),
    ((0, 17, 0), "utils.py:302"), ((0, 16, 0), "utils.py:287"), ((0, 15, 0), "utils.py:325"))


def version_banner(release: Sequence[int], version: str, model: str, *,
                   disable_logo: bool = False) -> list[tuple[str, str]]:
    """(text, source) of the record(s) in which the API server states its release, as ``release`` logs it without a
    TTY: "vLLM API server version X" up to 0.14; from 0.15.0 the logo above with "version X" and "model M"
    (one record over six lines), or with ``VLLM_DISABLE_LOG_LOGO=1`` "vLLM server version X, serving model M"."""
    source = next((where for first, where in _BANNER_SOURCES if tuple(release) >= first), None)
    if source is None:
        return [(f"vLLM API server version {version}", "api_server.py:1839")]
    if disable_logo:
        return [(f"vLLM server version {version}, serving model {model}", source)]
    lines = [line.format(version=version, model=model) for line in _LOGO]
    return [(line + ("\r" if i < len(lines) - 1 else ""), source) for i, line in enumerate(lines)]


def serving_line(release: Sequence[int], address: str) -> tuple[str, str]:
    """(text, source) of the API server's "listening" record: "Starting vLLM API server 0 on ADDRESS" up to 0.17,
    "Starting vLLM server on ADDRESS" from 0.18.0 (launchers/api_server/entry.py from 0.30.0)."""
    if tuple(release) >= (0, 30, 0):
        return f"Starting vLLM server on {address}", "entry.py:140"
    if tuple(release) >= (0, 18, 0):
        return f"Starting vLLM server on {address}", "api_server.py:625"
    return f"Starting vLLM API server 0 on {address}", "launcher.py:44"


class _Run:
    """Accumulates log lines on a simulated timeline."""

    def __init__(self, version: str, seed: str) -> None:
        self.version = version
        self.seed = seed
        self.t = 0.0
        self.lines: list[LogLine] = []
        try:
            release = parse_version(version)
        except VersionError:
            release = parse_version(NEWEST_KNOWN_VERSION)
        self.engine = "core" if release >= ENGINE_CORE_SINCE else "engine"
        #: up to 0.30 vLLM prefixed everything a process wrote to stdout/stderr (decorate_logs wrapped both); from
        #: 0.31.0 only its log records carry "(Process pid=N) ": tracebacks and uvicorn's lines come out bare
        self.bare_output = release >= BARE_OUTPUT_SINCE

    def at(self, dt: float) -> float:
        self.t += dt
        return self.t

    def info(self, text: str, source: str, process: str = "engine", level: str = "INFO") -> None:
        process = self.engine if process == "engine" else process
        self.lines.append(LogLine(offset_s=round(self.t, 3), text=text, level=level, source=source, process=process))

    def raw(self, text: str, process: str = "engine") -> None:
        process = "raw" if self.bare_output else self.engine if process == "engine" else process
        for part in text.splitlines():
            self.lines.append(LogLine(offset_s=round(self.t, 3), text=part, level=None, process=process))


def _frames_for(phase: Phase) -> list[tuple[str, int, str, str]]:
    """Traceback frames (file, line, function, code) vLLM's engine core shows for a failure in ``phase``."""
    head = [("v1/engine/core.py", 699, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
            ("v1/engine/core.py", 498, "__init__", "super().__init__(vllm_config, executor_class, log_stats,")]
    executor = [("v1/engine/core.py", 83, "__init__", "self.model_executor = executor_class(vllm_config)"),
                ("executor/executor_base.py", 54, "__init__", "self._init_executor()")]
    by_phase = {
        Phase.INIT: executor + [
            ("v1/worker/gpu_worker.py", 172, "init_device", "self.requested_memory = request_memory(init_snapshot,"),
            ("v1/worker/utils.py", 211, "request_memory", "raise ValueError(")],
        Phase.LOADING: executor + [
            ("v1/worker/gpu_worker.py", 230, "load_model", "self.model_runner.load_model(eep_scale_up=eep_scale_up)"),
            ("v1/worker/gpu_model_runner.py", 2580, "load_model", "self.model = model_loader.load_model("),
            ("model_executor/model_loader/base_loader.py", 49, "load_model",
             "model = initialize_model(vllm_config=vllm_config,")],
        Phase.PROFILING: [
            ("v1/engine/core.py", 92, "__init__", "self._initialize_kv_caches(vllm_config)"),
            ("v1/engine/core.py", 190, "_initialize_kv_caches", "self.model_executor.determine_available_memory())"),
            ("v1/worker/gpu_worker.py", 284, "determine_available_memory", "self.model_runner.profile_run()"),
            ("v1/worker/gpu_model_runner.py", 3310, "profile_run", "hidden_states, last_hidden_states \\")],
        Phase.KV_CACHE: [
            ("v1/engine/core.py", 92, "__init__", "self._initialize_kv_caches(vllm_config)"),
            ("v1/engine/core.py", 199, "_initialize_kv_caches", "kv_cache_configs = get_kv_cache_configs(vllm_config,"),
            ("v1/core/kv_cache_utils.py", 1243, "get_kv_cache_configs",
             "check_enough_kv_cache_memory(vllm_config, kv_cache_spec_one_worker,"),
            ("v1/core/kv_cache_utils.py", 716, "check_enough_kv_cache_memory", "raise ValueError(")],
        Phase.CUDA_GRAPHS: [
            ("v1/engine/core.py", 92, "__init__", "self._initialize_kv_caches(vllm_config)"),
            ("v1/engine/core.py", 226, "_initialize_kv_caches", "self.model_executor.initialize_from_config(kv_cache_configs)"),
            ("v1/worker/gpu_worker.py", 393, "compile_or_warm_up_model", "cuda_graph_memory_bytes = self.model_runner.capture_model()"),
            ("v1/worker/gpu_model_runner.py", 3640, "capture_model", "self._capture_cudagraphs(")],
        Phase.CONFIG: [],
    }
    return head + by_phase.get(phase, [])


def _engine_failure(run: _Run, phase: Phase, message: str) -> None:
    """The engine core dies with `message`: vLLM's ERROR record, the process traceback, the API server's wrapper."""
    src = "core.py:708"
    first, *rest = message.splitlines() or [""]
    run.info("EngineCore failed to start.", src, level="ERROR")
    run.info("Traceback (most recent call last):", src, level="ERROR")
    for file, line, fn, code in _frames_for(phase):
        run.info(f'  File "{_SITE}/{file}", line {line}, in {fn}', src, level="ERROR")
        run.info(f"    {code}", src, level="ERROR")
    run.info(first, src, level="ERROR")
    for extra in rest:
        run.info(extra, src, level="ERROR")
    run.raw("Process EngineCore_DP0:")
    run.raw("Traceback (most recent call last):")
    run.raw('  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap\n    self.run()')
    run.raw('  File "/usr/lib/python3.12/multiprocessing/process.py", line 108, in run\n'
            '    self._target(*self._args, **self._kwargs)')
    run.raw(f'  File "{_SITE}/v1/engine/core.py", line 712, in run_engine_core\n    raise e')
    for file, line, fn, code in _frames_for(phase):
        run.raw(f'  File "{_SITE}/{file}", line {line}, in {fn}\n    {code}')
    run.raw(message)
    _api_wrapper(run)


def _api_wrapper(run: _Run) -> None:
    run.at(0.5)
    frames = [
        ('/usr/local/bin/vllm', 10, '<module>', 'sys.exit(main())'),
        (f'{_SITE}/entrypoints/cli/serve.py', 59, 'cmd', 'uvloop.run(run_server(args))'),
        (f'{_SITE}/entrypoints/openai/api_server.py', 1847, 'run_server_worker',
         'async with build_async_engine_client('),
        (f'{_SITE}/v1/engine/core_client.py', 471, '__init__', 'with launch_core_engines(vllm_config, executor_class,'),
        (f'{_SITE}/v1/engine/utils.py', 862, 'wait_for_engine_startup', 'raise RuntimeError('),
    ]
    run.raw("Traceback (most recent call last):", process="api")
    for file, line, fn, code in frames:
        run.raw(f'  File "{file}", line {line}, in {fn}\n    {code}', process="api")
    run.raw("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
            process="api")


def _api_failure(run: _Run, message: str) -> None:
    """A failure in the API server process itself (config validation), before any engine core starts."""
    frames = [
        ('/usr/local/bin/vllm', 10, '<module>', 'sys.exit(main())'),
        (f'{_SITE}/entrypoints/cli/serve.py', 59, 'cmd', 'uvloop.run(run_server(args))'),
        (f'{_SITE}/engine/arg_utils.py', 1288, 'create_engine_config', 'model_config = self.create_model_config()'),
        (f'{_SITE}/config/model.py', 566, '__post_init__', 'self.max_model_len = self.get_and_verify_max_len(')]
    run.raw("Traceback (most recent call last):", process="api")
    for file, line, fn, code in frames:
        run.raw(f'  File "{file}", line {line}, in {fn}\n    {code}', process="api")
    run.raw(message, process="api")


def _outcome(run: _Run, **fields: Any) -> StartupOutcome:
    return StartupOutcome(log=run.lines, duration_s=round(run.t, 3), vllm_version=run.version, **fields)


#: How long a node waits for the engine's other nodes before its own start fails (their rank died first).
STALL_S = 300.0


def _stalled(run: _Run, phase: Phase, common: dict[str, Any]) -> StartupOutcome:
    """A node whose own ranks are fine while another node's rank died in the same phase: it waits for the group's
    collective, then fails without a cause of its own (LeaderWorkerSet normally recreates the group first)."""
    what = phase.value.replace("_", " ")
    run.info(f"Waiting for the engine's other nodes to finish {what}", "multiproc_executor.py:612")
    run.at(STALL_S)
    message = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
    return _fail(run, phase, FailureKind.UNKNOWN, message, common)


def _auto_fit(run: _Run, release: tuple[int, ...], *, derived: int, estimate: int, avail_gib: float) -> int | None:
    """vLLM's `_auto_fit_max_model_len` for `--max-model-len auto`: the model's full context when one request of it
    fits the measured KV memory, else the longest that does (the estimate its KV-too-small error prints), with the
    line it logs; None when not even one token fits (vLLM raises). Wording per release: "available GPU memory" up to
    0.31, "available KV cache memory (N GiB GPU)" from 0.32 (kv_cache_planning.py from 0.33)."""
    if estimate <= 0:
        return None
    source = "kv_cache_planning.py:1405" if release >= (0, 33, 0) else "kv_cache_utils.py:2478"
    gib = f"{round(avail_gib, 2)}"
    if estimate >= derived:
        where = (f"available KV cache memory ({gib} GiB GPU)" if release >= (0, 32, 0) else "available GPU memory")
        run.info(f"Auto-fit max_model_len: full model context length {derived} fits in {where}", source)
        return derived
    where = (f"available KV cache memory ({gib} GiB GPU)" if release >= (0, 32, 0)
             else f"available GPU memory ({gib} GiB available for KV cache)")
    run.info(f"Auto-fit max_model_len: reduced from {derived} to {estimate} to fit in {where}", source)
    return estimate


def _fail(run: _Run, phase: Phase, kind: FailureKind, message: str, common: dict[str, Any], *,
          in_engine: bool = True) -> StartupOutcome:
    if in_engine:
        _engine_failure(run, phase, message)
    else:
        _api_failure(run, message)
    return _outcome(run, starts=False, phase=phase, exit_code=1, reason="Error", failure_kind=kind,
                    message=message, **common)


def _model_arch(model: ModelArch | ModelFiles | None, model_id: str) -> ModelArch | None:
    if isinstance(model, ModelArch):
        return model
    if isinstance(model, ModelFiles):
        return arch_from_config(model.config, model_id=model_id, total_size=model.total_size,
                                total_size_estimated=model.total_size_estimated)
    return None


def _model_not_found(model_id: str) -> str:
    return (f"OSError: {model_id} is not a local folder and is not a valid model identifier listed on "
            "'https://huggingface.co/models'\nIf this is a private repository, make sure to pass a token having "
            "permission to this repo either by logging in with `hf auth login` or by passing `token=<your_token>`")


def _parallelism_message(arch: ModelArch, tp: int) -> str | None:
    if arch.num_heads % tp:
        return messages.heads_divisibility_message(arch.num_heads, tp)
    if not arch.is_mla:
        kv = arch.num_kv_heads
        if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            return messages.shard_divisibility_message(kv, tp)
    for size in (arch.vocab_size, arch.intermediate_size, arch.moe_intermediate_size):
        if size and size % tp:
            return messages.shard_divisibility_message(size, tp)
    return None


def _world_size_message(world: int, gpus: int) -> str:
    return (f"ValueError: World size ({world}) is larger than the number of available GPUs ({gpus}) in this node. "
            "If this is intentional and you are using:\n- ray, set '--distributed-executor-backend ray'.\n"
            "- multiprocessing, set '--nnodes' and '--node-rank'.")


def _fmt_gib(value: float) -> str:
    return f"{value:.2f}"


def _lora_config_error(parsed: VLLMArgs, version: str, refused: tuple[str, str] | None) -> str | None:
    """What the API server prints for --enable-lora before any engine starts: a rank the release does not accept,
    or (0.33+) a model class without SupportsLoRA."""
    if not parsed.enable_lora:
        return None
    bad_rank = rank_error(version, parsed.max_lora_rank)
    if bad_rank is not None:
        return bad_rank
    return refused[1] if refused is not None and refused[0] == "config" else None


def _lora_slot_bytes(parsed: VLLMArgs, arch: ModelArch, version: str, stage_layers: Sequence[int]) -> list[int]:
    """The adapter slots on each stage's GPUs (lora_dtype auto: the model's 16-bit dtype; float32 when pinned)."""
    dtype = 4 if parsed.dtype in ("float", "float32") else 2
    return adapter_slot_bytes(arch, slots=parsed.max_loras, rank=parsed.max_lora_rank, dtype_bytes=dtype,
                              tp=parsed.tensor_parallel_size,
                              stage_layers=list(stage_layers),
                              experts=wraps_experts(version))


def simulate_startup(  # noqa: C901 - vLLM's startup phases, in order, as one readable sequence
    args: Sequence[str],
    image: str,
    gpu: GPUSpec | None,
    hidden: HiddenFacts | None = None,
    model: ModelArch | ModelFiles | None = None,
    *,
    gpu_count: int | None = None,
    memory_limit_gib: float | None = None,
    declared_version: str | None = None,
    env: Mapping[str, str] | None = None,
) -> StartupOutcome:
    """Run vLLM's startup for the container ``args`` (with or without the ``vllm serve`` command) on ``gpu``.

    ``gpu`` is None when the container sees no GPU (no ``nvidia.com/gpu`` requested, or a node without one).
    ``model`` is the model's architecture or files (None: the model cannot be found, as for a wrong repo id);
    ``gpu_count`` is the GPUs the container was given (default: TP × PP); ``memory_limit_gib`` its memory limit.
    ``env`` is the container's environment (VLLM_PP_LAYER_PARTITION). In native multi-node mode (``--nnodes``)
    this is ONE node's run: its ranks hold only their pipeline stages' layers, so a worker on the last stage can
    run out of memory while the leader is fine (the KV budget is still the minimum over every stage).
    ``declared_version`` is the release the operator says the image runs (`spec.vllmVersion`, on the pod as the
    vllm-operator.dev/vllm-version annotation): a digest, mirror tag or `latest` runs as that release; a tag naming a
    release runs as the tag says, whatever is declared.
    """
    hidden = hidden or HiddenFacts()
    version = version_from_image(image) or declared_version or NEWEST_KNOWN_VERSION
    try:
        profile = profile_for(version)
    except VersionError:  # an unreadable declaration: the image's contents decide, as the newest release here
        profile = profile_for(NEWEST_KNOWN_VERSION)
    seed = "\x1f".join([image, *args])
    run = _Run(profile.version, seed)
    common: dict[str, Any] = {}

    # --- the API server parses its arguments --------------------------------------------------------------
    try:
        parsed = parse_vllm_args(args, profile.version)
    except ArgumentError as exc:
        run.at(1.5)
        run.raw("usage: vllm serve [model_tag] [options]", process="raw")
        run.raw(f"vllm serve: error: {exc}", process="raw")
        return _outcome(run, starts=False, phase=Phase.ARGS, exit_code=2, reason="Error",
                        failure_kind=FailureKind.INVALID_ARGUMENT, message=f"vllm serve: error: {exc}")
    model_id = parsed.model
    common["model_id"] = model_id
    if gpu is None or gpu_count == 0:
        run.at(3.0)
        message = ("RuntimeError: Failed to infer device type, please set the environment variable "
                   "`VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help debug the issue.")
        _api_failure(run, message)
        return _outcome(run, starts=False, phase=Phase.CONFIG, exit_code=1, reason="Error",
                        failure_kind=FailureKind.UNKNOWN, message=message, **common)
    run.at(2.0)
    if parsed.headless and profile.version_tuple >= (0, 13, 0):
        # `vllm serve --headless` (entrypoints/cli/serve.py run_headless): no API server, so no banner and no
        # non-default args; its main process says where the leader is (0.13+)
        head = f"{parsed.given.get('master_addr', '127.0.0.1')}:{parsed.given.get('master_port', 29501)}"
        run.info(f"Launching vLLM (v{profile.version}) headless multiproc executor, with head node address {head} "
                 "for torch.distributed process group.", "serve.py:224", process="main")
    else:
        no_logo = (env or {}).get("VLLM_DISABLE_LOG_LOGO", "0").strip()
        for text, source in version_banner(profile.version_tuple, profile.version, model_id,
                                           disable_logo=no_logo.isdigit() and int(no_logo) != 0):
            run.info(text, source, process="api")
        non_default = {k: v for k, v in parsed.given.items() if k not in ("model", "model_tag")}
        run.info(f"non-default args: {{'model_tag': '{model_id}', "
                 + ", ".join(f"'{k}': {v!r}" for k, v in sorted(non_default.items())) + "}",
                 "utils.py:233", process="api")
    arch = _model_arch(model, model_id)
    if arch is None:
        run.at(1.0)
        _api_failure(run, _model_not_found(model_id))
        return _outcome(run, starts=False, phase=Phase.CONFIG, exit_code=1, reason="Error",
                        failure_kind=FailureKind.MODEL_NOT_FOUND, message=_model_not_found(model_id), **common)
    # the release's rules for this model: its model runner, and how it reads the config (YaRN from 0.30)
    profile = profile_for_model(profile, arch)
    arch = arch_for_release(arch, profile)
    v2 = profile.runner == "V2"

    # --- config: context length, parallelism, batch defaults ------------------------------------------------
    run.at(2.0)
    max_len = parsed.max_model_len if parsed.max_model_len not in (None, -1) else arch.derived_max_model_len
    if max_len > arch.derived_max_model_len:
        message = messages.max_len_too_long_message(max_len, arch.derived_max_model_len)
        return _fail(run, Phase.CONFIG, FailureKind.MAX_MODEL_LEN_TOO_LONG, message, common, in_engine=False)
    util = parsed.gpu_memory_utilization if parsed.gpu_memory_utilization is not None else profile.default_utilization
    if not 0 < util <= 1:
        message = f"ValueError: GPU memory utilization must be within (0, 1]. Got {util}."
        return _fail(run, Phase.CONFIG, FailureKind.INVALID_ARGUMENT, message, common, in_engine=False)
    tp, pp = parsed.tensor_parallel_size, parsed.pipeline_parallel_size
    total_gib = round(gpu.reported_gib - hidden.total_delta_gib, 2)
    defaults = batch_defaults(profile, gpu_memory_gib=total_gib, is_a100=gpu.is_a100, max_model_len=max_len,
                              chunked_prefill=parsed.enable_chunked_prefill is not False,
                              compute_capability=gpu.compute_capability)
    seqs = parsed.max_num_seqs or defaults.max_num_seqs
    tokens = parsed.max_num_batched_tokens or defaults.max_num_batched_tokens
    if parsed.enable_chunked_prefill is False and tokens < max_len:
        message = (f"ValueError: max_num_batched_tokens ({tokens}) is smaller than max_model_len ({max_len}). This "
                   "effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
                   "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.")
        return _fail(run, Phase.CONFIG, FailureKind.INVALID_ARGUMENT, message, common, in_engine=False)
    if tokens < seqs:
        message = (f"ValueError: max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs "
                   f"({seqs}).")
        return _fail(run, Phase.CONFIG, FailureKind.INVALID_ARGUMENT, message, common, in_engine=False)
    flags = EngineFlags(
        tensor_parallel_size=tp, pipeline_parallel_size=pp, gpu_memory_utilization=util, max_model_len=max_len,
        max_num_seqs=seqs, max_num_batched_tokens=tokens, kv_cache_dtype=parsed.kv_cache_dtype, dtype=parsed.dtype,
        quantization=parsed.quantization, enforce_eager=parsed.enforce_eager, block_size=parsed.block_size or 16,
        cpu_offload_gb=parsed.cpu_offload_gb, kv_cache_memory_bytes=parsed.kv_cache_memory_bytes,
        enable_prefix_caching=parsed.enable_prefix_caching, enable_chunked_prefill=parsed.enable_chunked_prefill)
    if parsed.speculative_config is not None:
        try:
            speculation = parse_speculative_config(parsed.speculative_config)
        except SpeculativeConfigError as exc:
            return _fail(run, Phase.CONFIG, FailureKind.INVALID_ARGUMENT, f"ValueError: {exc}", common,
                         in_engine=False)
        flags = flags.model_copy(update={"speculative": speculation})
    common.update(flags=flags, gpu_total_gib=total_gib)
    run.info(f"Initializing a {profile.engine} LLM engine (v{profile.version}) with config: model='{model_id}', "
             f"dtype={arch.dtype}, max_seq_len={max_len}, tensor_parallel_size={tp}, pipeline_parallel_size={pp}, "
             f"quantization={parsed.quantization or (arch.quantization.method if arch.quantization else None)}, "
             f"enforce_eager={parsed.enforce_eager}, kv_cache_dtype={parsed.kv_cache_dtype}, seed=0, "
             f"served_model_name={model_id}", "core.py:77")
    if v2:
        run.info("Using V2 Model Runner", "gpu_worker.py:513")
    world = tp * pp
    visible = gpu_count * parsed.nnodes if gpu_count is not None else world  # every node's pod: its GPUs
    if world > visible:
        return _fail(run, Phase.CONFIG, FailureKind.INVALID_PARALLELISM, _world_size_message(world, visible), common)
    bad = _parallelism_message(arch, tp)
    if bad is not None:
        run.at(3.0)
        return _fail(run, Phase.CONFIG, FailureKind.INVALID_PARALLELISM, bad, common)
    stage_layers = sim_stage_layers(arch.num_layers, pp, (env or {}).get(PARTITION_ENV))
    if isinstance(stage_layers, str):
        return _fail(run, Phase.CONFIG, FailureKind.INVALID_ARGUMENT, stage_layers, common)
    mine = rank_stages(parsed, world)
    if pp > 1 and PARTITION_ENV in (env or {}):
        flags = flags.model_copy(update={"pp_layer_partition": tuple(stage_layers)})  # vLLM's bookkeeping follows
    lora_refused = lora_refusal(arch, profile.version, model_id) if parsed.enable_lora else None
    lora_bad = _lora_config_error(parsed, profile.version, lora_refused)
    if lora_bad is not None:  # LoRAConfig (rank) and, from 0.33, verify_with_model_config: the API server refuses
        return _fail(run, Phase.CONFIG, FailureKind.INVALID_ARGUMENT, lora_bad, common, in_engine=False)

    # --- device init: the free-memory check -----------------------------------------------------------------
    run.at(3.0)
    total = int(total_gib * GiB)
    ctx = int(init_nontorch_gib(tp, gpu.nvlink) * GiB)
    other = int(hidden.other_process_gib * GiB)
    free = total - other - ctx
    requested = math.ceil(total * util)
    if profile.free_memory_check and not gpu.uma and free < requested:
        message = messages.free_memory_message(profile, device=0, free_gib=free / GiB, total_gib=total_gib,
                                               util=util, requested_gib=requested / GiB)
        return _fail(run, Phase.INIT, FailureKind.INSUFFICIENT_FREE_GPU_MEMORY, message, common)

    # --- loading the weights (GPU memory, and host memory on the way) ---------------------------------------
    weights = sim_stage_weights(arch, flags, stage_layers)
    if parsed.enable_lora:  # adapter slots are allocated while the model loads: part of "Model loading took"
        weights = [w + extra for w, extra in zip(
            weights, _lora_slot_bytes(parsed, arch, profile.version, stage_layers), strict=True)]
    w_max = max(weights[i] for i in mine)
    first = mine[0]
    checkpoint_gib = checkpoint_bytes(arch) / GiB
    run.at(1.0)
    run.info(f"Starting to load model {model_id}...", "gpu_model_runner.py:2338")
    if lora_refused is not None and lora_refused[0] == "model_init":  # up to 0.6.3: the loader, before any weight
        return _fail(run, Phase.LOADING, FailureKind.INVALID_ARGUMENT, lora_refused[1], common)
    load_s = 3.0 + (w_max / GiB) / hidden.load_gib_per_second * (0.9 + 0.2 * _unit(seed, "load"))
    shards = max(1, math.ceil(checkpoint_gib / 4.6))
    host_peak = (0.35 * checkpoint_gib + 3.0 * world + 1.5 + flags.cpu_offload_gb * world
                 + (parsed.swap_space or 0.0) * world + hidden.extra_host_memory_gib)
    limits = [v for v in (memory_limit_gib, hidden.host_memory_limit_gib) if v is not None]
    host_limit = min(limits) if limits else None
    common.update(weights_gib=round(weights[first] / GiB, 2), host_peak_gib=round(host_peak, 2))
    if host_limit is not None and host_peak > host_limit:
        base = 3.0 * world + 1.5
        share = max(0.05, min(0.95, (host_limit - base) / max(host_peak - base, 1e-6)))
        done = max(0, int(shards * share))
        run.at(load_s * share)
        run.raw(f"Loading safetensors checkpoint shards: {int(100 * done / shards):3d}% Completed | {done}/{shards} "
                f"[00:{int(load_s * share):02d}<00:{int(load_s * (1 - share)):02d}, "
                f"{max(load_s / shards, 0.1):.2f}s/it]")
        return _outcome(run, starts=False, phase=Phase.LOADING, exit_code=137, reason="OOMKilled",
                        failure_kind=FailureKind.HOST_OOM_KILLED, message="", **common)
    if w_max > free:
        share = max(0.05, free / w_max)
        run.at(load_s * share)
        done = int(shards * share)
        run.raw(f"Loading safetensors checkpoint shards: {int(100 * done / shards):3d}% Completed | {done}/{shards} "
                f"[00:{int(load_s * share):02d}<00:{int(load_s * (1 - share)):02d}, "
                f"{max(load_s / shards, 0.1):.2f}s/it]")
        tried = min(1024.0, max(64.0, w_max / GiB * 1024 / max(arch.num_layers, 1) * 2))
        free_mib = tried * (0.2 + 0.6 * _unit(seed, "free"))
        allocated = free / GiB - free_mib / 1024
        oom = messages.cuda_oom_message(device=0, tried_mib=tried, total_gib=total_gib, free_mib=free_mib,
                                        in_use_gib=allocated + ctx / GiB, torch_gib=allocated)
        if profile.version_tuple >= (0, 13, 0) and not v2:  # the wrapper is the V1 runner's
            run.info("Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to free "
                     "memory for weights, increasing --tensor-parallel-size, or using --quantization. See "
                     f"{messages.DOCS} for more tips.", "gpu_model_runner.py:2362", level="ERROR")
        return _fail(run, Phase.LOADING, FailureKind.WEIGHTS_DO_NOT_FIT, messages.weights_oom_message(profile, oom),
                     common)
    run.at(load_s)
    run.raw(f"Loading safetensors checkpoint shards: 100% Completed | {shards}/{shards} [00:{int(load_s):02d}<00:00, "
            f"{load_s / shards:.2f}s/it]")
    run.info(f"Loading weights took {load_s - 0.4:.2f} seconds", "default_loader.py:267")
    if lora_refused is not None and lora_refused[0] == "loading":  # up to 0.32: the runner, once the model loaded
        return _fail(run, Phase.LOADING, FailureKind.INVALID_ARGUMENT, lora_refused[1], common)
    if profile.engine == "V0":
        run.info(f"Loading model weights took {weights[first] / GiB:.4f} GB", "model_runner.py:1072")
    elif v2 and profile.version_tuple < (0, 28, 0):  # MRV2's wording up to 0.27.1
        run.info(f"Model loading took {weights[first] / GiB:.4f} GiB and {load_s:.6f} seconds", "model_runner.py:318")
    else:
        run.info(f"Model loading took {weights[first] / GiB:.4f} GiB memory and {load_s:.6f} seconds",
                 "gpu_model_runner.py:2370")

    # --- profiling: what vLLM measures (the hidden truth) ---------------------------------------------------
    pert = perturbations(arch.model_id or model_id)
    act_pert = pert["activation"] if hidden.activation_perturbation is None else hidden.activation_perturbation
    acts = [int(activation_bytes(arch, flags, profile, last_stage=i == pp - 1) * (1 + act_pert)
                + hidden.extra_activation_gib * GiB) for i in range(pp)]
    non_torch = int(non_torch_bytes(flags, profile, nvlink=gpu.nvlink) * (1 + pert["non_torch"])
                    + hidden.extra_non_torch_gib * GiB)
    graph_est = [0 if flags.enforce_eager else int(cudagraph_bytes(arch, flags, profile, n) * (1 + pert["cudagraph"]))
                 for n in stage_layers]
    if not flags.enforce_eager:
        run.at(12.0 + 0.05 * arch.num_layers)
        run.info(f"torch.compile takes {11.0 + 0.05 * arch.num_layers:.2f} s in total", "monitor.py:34")
    run.at(2.5)
    stage = max(mine, key=lambda i: weights[i] + acts[i])  # this node's tightest stage
    if weights[stage] + acts[stage] + non_torch > free:
        oom = messages.cuda_oom_message(
            device=stage_device(parsed, stage, world), tried_mib=min(acts[stage] / 2**20, 2048.0), total_gib=total_gib,
            free_mib=min(max((free - weights[stage] - non_torch) / 2**20 * 0.3, 0.0), 900.0),
            in_use_gib=(free + ctx) / GiB - 0.05, torch_gib=(weights[stage] + acts[stage] * 0.6) / GiB)
        return _fail(run, Phase.PROFILING, FailureKind.CUDA_OOM_STARTUP, oom, common)
    if any(weights[i] + acts[i] + non_torch > free for i in range(pp) if i not in mine):
        return _stalled(run, Phase.PROFILING, common)  # another node's rank died: this one waits, then gives up
    # MRV2's sampler state (last stage) is real memory on every release; from 0.27 it and the allocator leftovers
    # are inside the measured drop in free memory, before that the state sits in the headroom
    sampler_state = v2_sampler_state_bytes(arch, flags, profile)
    slack = int(profile.allocator_slack_gib * GiB * (1 + pert["non_torch"])) if profile.profiler == "consumed" else 0
    counted = slack + (sampler_state if profile.v2_sampler_state_counted else 0)
    avails = []
    for i in range(pp):
        avail_i = requested - weights[i] - acts[i] - non_torch - (counted if i == pp - 1 else slack)
        if profile.cudagraph_subtracted:
            avail_i -= graph_est[i]
        if profile.others_memory_counted:
            avail_i -= other
        avails.append(avail_i)
    avail = min(avails)
    if flags.kv_cache_memory_bytes is not None:
        avail = flags.kv_cache_memory_bytes
    common.update(activation_gib=round(acts[first] / GiB, 2), non_torch_gib=round(non_torch / GiB, 2),
                  cudagraph_gib=round(graph_est[first] / GiB, 2), available_kv_gib=round(max(avail, 0) / GiB, 2))
    if profile.cudagraph_subtracted and not flags.enforce_eager:
        if v2:  # 0.29+: MRV2 captures into a throwaway pool while profiling (no "Estimated" line)
            run.info(f"Graph capturing finished in 2 secs, took {graph_est[first] / GiB:.2f} GiB",
                     "cudagraph_utils.py:240")
        else:
            run.info(f"Estimated CUDA graph memory: {graph_est[first] / GiB:.2f} GiB total", "gpu_model_runner.py:4102")
    if profile.engine == "V1":
        run.info(f"Available KV cache memory: {avail / GiB:.2f} GiB", "gpu_worker.py:299")
    if avail <= 0:
        return _fail(run, Phase.KV_CACHE, FailureKind.NO_KV_CACHE_MEMORY, messages.no_kv_memory_message(profile),
                     common)

    # --- vLLM's own bookkeeping on the measured KV budget ---------------------------------------------------
    bookkeeping = predict_startup(arch, flags.model_copy(update={"kv_cache_memory_bytes": int(avail)}),
                                  GPUFacts(total_gib=total_gib, uma=gpu.uma, nvlink=gpu.nvlink), profile)
    run.at(0.5)
    if parsed.max_model_len == -1:  # --max-model-len auto: vLLM fits the context to what it measured (0.14+)
        fitted = _auto_fit(run, profile.version_tuple, derived=max_len, estimate=bookkeeping.estimated_max_model_len,
                           avail_gib=avail / GiB)
        if fitted is None:
            message = ("ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a "
                       "single token. Try increasing `gpu_memory_utilization`.")
            return _fail(run, Phase.KV_CACHE, FailureKind.NO_KV_CACHE_MEMORY, message, common)
        if fitted < max_len:
            max_len = fitted
            flags = flags.model_copy(update={"max_model_len": fitted})
            common.update(flags=flags)
            bookkeeping = predict_startup(arch, flags.model_copy(update={"kv_cache_memory_bytes": int(avail)}),
                                          GPUFacts(total_gib=total_gib, uma=gpu.uma, nvlink=gpu.nvlink), profile)
    if bookkeeping.failure is not None and bookkeeping.failure.kind is FailureKind.KV_CACHE_TOO_SMALL:
        return _fail(run, Phase.KV_CACHE, FailureKind.KV_CACHE_TOO_SMALL, bookkeeping.failure.message, common)
    common.update(kv_cache_tokens=bookkeeping.kv_cache_tokens, max_concurrency=bookkeeping.max_concurrency)
    concurrency = f"Maximum concurrency for {max_len:,} tokens per request: {bookkeeping.max_concurrency:.2f}x"
    if profile.engine == "V0":
        run.info(f"# GPU blocks: {bookkeeping.num_blocks}, # CPU blocks: 2048", "executor_base.py:110")
    elif profile.tokens_log == "one_line":  # 0.28+: update_kv_cache_capacity in the engine core
        run.info(f"GPU KV cache size: {bookkeeping.kv_cache_tokens:,} tokens, {concurrency}", "kv_cache_utils.py:1290")
    else:
        run.info(f"GPU KV cache size: {bookkeeping.kv_cache_tokens:,} tokens", "kv_cache_utils.py:1087")
    if profile.tokens_log == "two_lines" or profile.engine == "V0":
        run.info(concurrency, "kv_cache_utils.py:1091")

    # --- KV allocation, then CUDA-graph capture in what is left of the GPU ---------------------------------
    if not flags.enforce_eager:
        run.at(6.0 + 0.04 * arch.num_layers)
        warmup = acts[0] if arch.quantization and arch.quantization.method == "mxfp4" and arch.is_moe else 0

        def at_capture(i: int) -> int:
            """Stage i's memory once its graphs are captured: the activation peak was released after profiling,
            the KV cache fills the rest of the budget; the last stage's unprofiled buffers sit beside it."""
            last = i == pp - 1
            return (other + ctx + weights[i] + non_torch + max(avail, 0) + slack + warmup
                    + (sampler_state if last and (pp == 1 or parsed.nnodes > 1) else 0)
                    + (int(hidden.last_stage_unprofiled_gib * GiB) if last else 0)
                    + int(graph_est[i] * (1 + pert["cudagraph_capture"]) + hidden.extra_cudagraph_gib * GiB))

        # one node of several checks its own tightest stage; one pod holding every stage keeps stage 0's figures
        stage = max(mine, key=at_capture) if parsed.nnodes > 1 else 0
        if at_capture(stage) > total:
            used = at_capture(stage) - int(graph_est[stage] * (1 + pert["cudagraph_capture"]))
            free_mib = max(total - used, 0) / 2**20 * 0.3
            oom = messages.cuda_oom_message(device=stage_device(parsed, stage, world), tried_mib=786.0,
                                            total_gib=total_gib, free_mib=free_mib, in_use_gib=(used - other) / GiB,
                                            torch_gib=(used - other - ctx) / GiB)
            return _fail(run, Phase.CUDA_GRAPHS, FailureKind.CUDA_OOM_STARTUP, oom, common)
        if parsed.nnodes > 1 and any(at_capture(i) > total for i in range(pp) if i not in mine):
            return _stalled(run, Phase.CUDA_GRAPHS, common)
        run.info(f"Graph capturing finished in {int(6 + 0.04 * arch.num_layers)} secs, took "
                 f"{(graph_est[stage] * (1 + pert['cudagraph_capture'])) / GiB:.2f} GiB", "gpu_model_runner.py:3725")
    run.info(f"init engine (profile, create kv cache, warmup model) took {run.t - 6.0:.2f} seconds", "core.py:218")
    run.at(2.0)
    if parsed.headless:  # a worker node: its engine processes serve the leader, no HTTP
        run.info(f"Headless node {parsed.node_rank} of {parsed.nnodes}: workers for pipeline stage"
                 f"{'s' if len(mine) > 1 else ''} {', '.join(map(str, mine))} are serving the leader at "
                 f"{parsed.given.get('master_addr', '?')}", "multiproc_executor.py:160")
        run.at(1.0)
        return _outcome(run, starts=True, phase=Phase.READY, **common)
    run.info(*serving_line(profile.version_tuple, "http://0.0.0.0:8000"), process="api")
    run.info("Available routes are: /health, /v1/models, /v1/chat/completions, /v1/completions, /metrics",
             "launcher.py:37", process="api")
    run.raw("INFO:     Started server process [1]", process="api")
    run.raw("INFO:     Waiting for application startup.", process="api")
    run.raw("INFO:     Application startup complete.", process="api")
    run.at(1.0)
    return _outcome(run, starts=True, phase=Phase.READY, **common)


# --------------------------------------------------------------------------------------------------------------
# Multi-node (native mp mode over a LeaderWorkerSet group): one node's share of the engine. The layer split is
# the simulator's own copy of vLLM's get_pp_indices — deliberately not the planner's function.

PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"


def sim_stage_layers(num_layers: int, pp: int, partition: str | None = None) -> list[int] | str:
    """Layers per pipeline stage as vllm/distributed/utils.py get_pp_indices makes them: VLLM_PP_LAYER_PARTITION
    when set (else ValueError's text, returned), otherwise L // pp each, the remainder added to the stages before the
    last."""
    if partition is not None:
        try:
            parts = [int(layer) for layer in partition.split(",")]
        except ValueError:
            return f"ValueError: Invalid partition string: {partition}"
        if len(parts) != pp:
            return f"ValueError: len(partitions)={len(parts)} does not match pp_size={pp}."
        if sum(parts) != num_layers:
            return f"ValueError: sum(partitions)={sum(parts)} does not match num_hidden_layers={num_layers}."
        return parts
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def rank_stages(parsed: VLLMArgs, world: int) -> list[int]:
    """The pipeline stages this node's GPUs hold: ranks node_rank·g … node_rank·g+g−1 (g = world / nnodes), rank r
    in stage r // TP (ranks are TP-fastest: vllm/v1/executor/multiproc_executor.py). One node: every stage."""
    tp, nnodes = parsed.tensor_parallel_size, max(parsed.nnodes, 1)
    per_node = max(world // nnodes, 1)
    ranks = range(parsed.node_rank * per_node, (parsed.node_rank + 1) * per_node)
    stages = sorted({r // tp for r in ranks if r < world})
    return stages or list(range(parsed.pipeline_parallel_size))


def stage_device(parsed: VLLMArgs, stage: int, world: int) -> int:
    """The node-local GPU (cuda:N in torch's out-of-memory message) of this node's first rank in `stage`: each
    worker runs on cuda:<local rank>, global rank = GPUs per node × node rank + local rank. 0 on one node."""
    if parsed.nnodes <= 1:
        return 0
    per_node = max(world // parsed.nnodes, 1)
    start = parsed.node_rank * per_node
    return min(max(stage * parsed.tensor_parallel_size - start, 0), per_node - 1)


def sim_stage_weights(arch: ModelArch, flags: EngineFlags, layers: Sequence[int]) -> list[int]:
    """Weight bytes per stage (one TP rank): the whole model's resident bytes per rank (vLLM's loader bookkeeping
    on one stage) shared out by the stage's layers, the embedding on the first stage, the lm_head on the last."""
    single = flags.model_copy(update={"pipeline_parallel_size": 1, "pp_layer_partition": None})
    whole = weights_bytes_per_gpu(arch, single)[0]
    if len(layers) == 1:
        return [whole]
    dtype = 4 if arch.dtype == "float32" else 2
    embed = arch.vocab_size * arch.hidden_size * dtype / flags.tensor_parallel_size
    head = 0.0 if arch.tie_word_embeddings else embed
    body = max(whole - embed - head, 0.0)
    total = max(sum(layers), 1)
    return [int(body * n / total + (embed if i == 0 else 0.0) + (head if i == len(layers) - 1 else 0.0))
            for i, n in enumerate(layers)]


def worker_network_exit(outcome: StartupOutcome, node_rank: int, world_rank: int) -> tuple[list[LogLine], str]:
    """The end of a headless worker whose collective timed out (the leader's HTTP still answers): NCCL's watchdog
    text (torch ProcessGroupNCCL), offsets relative to the moment it happens."""
    run = _Run(outcome.vllm_version, "worker-exit")
    message = (f"[Rank {world_rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=18, "
               "OpType=ALLREDUCE, NumelIn=16384, NumelOut=16384, Timeout(ms)=600000) ran for 600012 milliseconds "
               "before timing out.")
    run.at(1.0)
    run.raw(f"[rank{world_rank}]:[E ProcessGroupNCCL.cpp:632] {message}")
    run.raw(f"[rank{world_rank}]:[E ProcessGroupNCCL.cpp:1664] [PG 0 Rank {world_rank}] Exception (either an error "
            "or timeout) detected by watchdog at work: 18, last enqueued NCCL work: 18, last completed NCCL work: 17.")
    run.at(0.5)
    run.raw("terminate called after throwing an instance of 'c10::DistBackendError'")
    run.raw(f"  what():  {message}")
    run.info(f"Headless node {node_rank}: worker process died; the engine group must be restarted",
             "multiproc_executor.py:540", level="ERROR")
    return run.lines, message


def serving_oom(outcome: StartupOutcome, hidden: HiddenFacts, concurrency: int, context: int
                ) -> tuple[list[LogLine], str] | None:
    """Whether a Ready server given ``concurrency`` requests of ``context`` tokens dies of a CUDA OOM.

    Returns the log lines of the death (offsets relative to the moment traffic arrives) and the exception text, or
    None when it keeps serving. vLLM runs at most max_num_seqs sequences at once (the rest wait or are preempted),
    so the batch that matters is min(concurrency, max_num_seqs).
    """
    if not outcome.starts or outcome.flags is None or hidden.serving_oom_above_seqs is None:
        return None
    running = min(concurrency, outcome.flags.max_num_seqs)
    if running <= hidden.serving_oom_above_seqs:
        return None
    run = _Run(outcome.vllm_version, "serving")
    run.at(3.0)
    usage = min(99.9, 100.0 * running * context / max(outcome.kv_cache_tokens, 1))
    run.info(f"Engine 000: Avg prompt throughput: {running * context / 10:.1f} tokens/s, Avg generation throughput: "
             f"{running * 11.7:.1f} tokens/s, Running: {running} reqs, Waiting: {max(concurrency - running, 0)} reqs, "
             f"GPU KV cache usage: {usage:.1f}%, Prefix cache hit rate: 0.0%", "loggers.py:123", process="api")
    run.at(2.0)
    src = "core.py:790"
    total = outcome.gpu_total_gib
    oom = messages.cuda_oom_message(device=0, tried_mib=1002.0 + running, total_gib=total, free_mib=611.25,
                                    in_use_gib=total - 0.6, torch_gib=total - 1.9)
    run.info("EngineCore encountered a fatal error.", src, level="ERROR")
    run.info("Traceback (most recent call last):", src, level="ERROR")
    for file, line, fn, code in [
        ("v1/engine/core.py", 781, "run_busy_loop", "self._process_engine_step()"),
        ("v1/engine/core.py", 808, "_process_engine_step", "outputs, model_executed = self.step_fn()"),
        ("v1/worker/gpu_worker.py", 447, "execute_model", "output = self.model_runner.execute_model(scheduler_output,"),
        ("v1/worker/gpu_model_runner.py", 2215, "execute_model", "model_output = self.model("),
    ]:
        run.info(f'  File "{_SITE}/{file}", line {line}, in {fn}', src, level="ERROR")
        run.info(f"    {code}", src, level="ERROR")
    run.info(oom, src, level="ERROR")
    run.at(0.2)
    run.info("AsyncLLM output_handler failed.", "async_llm.py:480", process="api", level="ERROR")
    run.info("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
             "for the root cause.", "async_llm.py:480", process="api", level="ERROR")
    run.raw("INFO:     Shutting down", process="api")
    run.raw("INFO:     Application shutdown complete.", process="api")
    return run.lines, oom
