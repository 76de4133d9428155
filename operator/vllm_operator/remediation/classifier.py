"""Read why a vLLM container died: a pure function from evidence (or raw text) to a typed `Failure`.

The remediation ladder acts on the `kind`; status and events show the `summary` and `excerpt`; the extracted numbers
(needed vs available KV cache, free vs requested GPU memory, the estimated max_model_len, ...) let it pick the next
profile without guessing. Every pattern was checked against vLLM's own format strings in the released wheels
(v0.6.3 … v0.33.0) and against real logs (docs/research/, benchmarks/data/vllm-startup-logs.jsonl); the corpus in
tests/unit/data/vllm_failure_texts.yaml holds one text per wording and the near-misses.

How a text is read (`classify_text`):

1. The kubelet's verdict comes first: an image that cannot be pulled is `ImagePull`; a container the kernel
   OOM-killed (`terminated.reason == "OOMKilled"`) is `HostOOMKilled`, whatever its log says. Text never makes a
   container "OOMKilled" (the word may be in an env var name).
2. Each line is stripped of its decorations (kubectl timestamps, ANSI colours, vLLM's `(EngineCore_DP0 pid=1)`
   process tags, `[rank0]:`, and the `ERROR 05-19 12:00:00 [core.py:708]` log-record header). Lines logged at
   DEBUG/INFO/WARNING are context only: they locate the startup phase but never *are* the failure, so a warning
   that happens to quote an error text does not match.
3. The patterns are anchored at the start of the error's message (after `ValueError: `, pydantic's
   `Value error, ` or the log header), so a sentence that merely mentions "No available memory" or a help text /
   docs URL about "CUDA out of memory" does not match. The only unanchored one is PyTorch's allocator text
   "CUDA out of memory. Tried to allocate", which nothing but the allocator writes.
4. The LAST matching line wins: logs repeat the error (worker, engine core, process exit) and contain earlier,
   recovered ones. If a different exception follows it (and is not one of the wrappers vLLM raises on the way
   out: "Engine core initialization failed. See root cause above", `EngineDeadError`, "Exception ignored in", …),
   the match is stale and the result is `Unknown` with that later exception as its summary.
5. A CUDA OOM is placed in startup by the frames of its own traceback (`load_model` → loading, `profile_run` →
   profiling, `capture_model`/KV-cache allocation/graph warm-up → cudagraph, `execute_model` → serving), else by
   vLLM's load wrapper "Failed to load model - not enough GPU memory", else by the nearest progress line before it
   ("Loading weights", "Model loading took", "GPU KV cache size", "Capturing CUDA graphs", "Application startup
   complete", …). Loading → `WeightsDoNotFit`; after Ready or while serving → `CUDAOOMServing`; otherwise
   (profiling, warm-up, graph capture, or no clue) → `CUDAOOMStartup`.

`classify(evidence)` applies this to a container: None while it is Ready, pending or stopped cleanly; otherwise the
termination message is read first and the log tail (if fetched) when that says nothing recognisable (a
FallbackToLogsOnError message holds only the last 2 KB, often just the final wrapper exception).

Wordings (`Failure.wording`) and the releases that print them, from the wheels' sources:

=====================  ============================================================================================
KVCacheTooSmall        `v0` V0 engine ≤0.10 ("The model's max seq len (X) is larger than the maximum number of
                       tokens that can be stored in KV cache (Y)"); `v1-gb` 0.7.0–0.8.2 ("models's", GB, no
                       estimate); `v1-no-estimate` 0.8.3 (GiB); `v1-broken-estimate` 0.8.4–0.9.0 ("Based on the
                       available memory," with no number); `v1-models's` 0.9.1–0.21 (estimate; docs link from
                       0.13); `v1` 0.22+ ("model's", "(which also controls CPU memory on the CPU backend)").
NoKVCacheMemory        `plain` ≤0.12; `docs-link` 0.13–0.21; `cpu-note` 0.22+; `auto-fit` 0.14+ ("Cannot auto-fit
                       max_model_len").
InsufficientFreeGPUMemory  `no-device` 0.9.1–0.13 ("Free memory on device (F/T GiB)"); `device` 0.14+ ("device
                       cuda:N"); `external-weights` 0.32+ ("… less than the engine's budget after excluding external
                       process's weights", --load-format ipc_cache).
WeightsDoNotFit        `load-wrapper` 0.13+, V1 model runner only (vLLM logs "Failed to load model - not enough GPU
                       memory" and re-raises PyTorch's error); Model Runner V2 (default for more models from 0.22, for
                       all from 0.29) raises the bare torch OOM from `load_model`, placed by its frames.
InvalidArgument        `lora-unsupported` --enable-lora on a model class without SupportsLoRA: 0.33+ "LoRA is not
                       supported for A (M). Supported models implement the `SupportsLoRA` interface…" (config),
                       0.6.4–0.32 "C does not support LoRA yet." (model runner), 0.5–0.6.3 "Model C does not support
                       LoRA, but LoRA is enabled…" (loader); `lora-vocab` "When using LoRA, vocab size must be
                       (32000 >= vocab_size) <= N" (an LM head above the release's limit); `external-weights-exceed` 0.32+ ("Externally held weights on device cuda:N (W/T GiB) exceed the
                       desired GPU memory utilization (U, R GiB)": a person raises utilization or frees the weight
                       daemon); `value` also for 0.33's `kv_cache_dtype="float16" is incompatible with
                       dtype="bfloat16"` and 0.31's `max_num_active_seqs (X) cannot be greater than max_num_seqs (Y)`.
=====================  ============================================================================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..planner.failures import FailureKind
from ..render.cache import DOWNLOAD_CONTAINER, download_failure
from .evidence import ContainerEvidence, evidence_from_pod
from .groups import network_failure
from .redact import redact

__all__ = [
    "MEMORY_FAILURES",
    "Failure",
    "Phase",
    "classify",
    "classify_text",
    "download_failure_summary",
]

Phase = Literal["loading", "profiling", "cudagraph", "serving"]

MEMORY_FAILURES: frozenset[FailureKind] = frozenset(
    {
        FailureKind.KV_CACHE_TOO_SMALL,
        FailureKind.INSUFFICIENT_FREE_GPU_MEMORY,
        FailureKind.NO_KV_CACHE_MEMORY,
        FailureKind.WEIGHTS_DO_NOT_FIT,
        FailureKind.CUDA_OOM_STARTUP,
        FailureKind.CUDA_OOM_SERVING,
        FailureKind.HOST_OOM_KILLED,
    }
)
"""The classes a memory remediation (smaller context, lower utilization, more GPUs, …) may answer."""

EXCERPT_MAX = 500
SUMMARY_MAX = 400


class Failure(BaseModel):
    """One classified failure: what happened, in one line, with the numbers vLLM printed."""

    model_config = ConfigDict(frozen=True)

    kind: FailureKind
    summary: str = Field(description="one human-readable line")
    excerpt: str = Field("", max_length=EXCERPT_MAX, description="the matched line(s) of the log, for status/events")
    wording: str | None = Field(None, description="which release's wording matched (see the module docstring)")
    phase: Phase | None = Field(None, description="where in startup (or serving) a CUDA OOM happened")
    exit_code: int | None = None

    # KV cache too small / no KV memory
    max_model_len: int | None = Field(None, description="the max_model_len vLLM tried (or the user asked for)")
    estimated_max_model_len: int | None = Field(None, description="vLLM's own estimate of the largest that fits")
    needed_kv_gib: float | None = Field(None, description="KV cache one max_model_len request needs, per GPU")
    available_kv_gib: float | None = Field(None, description="KV cache memory vLLM had, per GPU")
    kv_cache_tokens: int | None = Field(None, description="V0: tokens the KV cache can hold (blocks × block size)")

    # startup free-memory check
    device: str | None = Field(None, description="the GPU named in the message, e.g. cuda:1")
    free_gib: float | None = None
    total_gib: float | None = None
    requested_utilization: float | None = None
    requested_gib: float | None = None
    external_weights_gib: float | None = Field(None, description="weights another process holds on the GPU (0.32+)")

    # CUDA OOM
    tried_to_allocate_mib: float | None = None
    gpu_capacity_gib: float | None = None
    gpu_free_mib: float | None = None
    warmup_requests: int | None = Field(None, description="dummy requests of the sampler/pooler warm-up that OOMed")

    # max_model_len too long
    derived_max_model_len: int | None = Field(None, description="the model's context length from config.json")

    # parallelism
    tensor_parallel_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    dividend: int | None = Field(None, description="'A is not divisible by B': A (a head count, vocab size, ...)")
    divisor: int | None = Field(None, description="'A is not divisible by B': B (usually a parallel size)")
    world_size: int | None = None
    available_gpus: int | None = None

    # model not found
    model_id: str | None = None

    # LoRA on a model class without SupportsLoRA
    architecture: str | None = Field(None, description="the architecture (or model class) vLLM named")

    @property
    def memory_related(self) -> bool:
        """Whether a memory remediation may answer this failure."""
        return self.kind in MEMORY_FAILURES


# --------------------------------------------------------------------------------------------------------------
# Lines

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_K8S_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})\s")
# vLLM's and Ray's process tags: "(EngineCore_DP0 pid=123) ", "(VllmWorker TP1 pid=9)", "(RayWorkerWrapper pid=4, ip=…)"
# "(EngineCore_DP0 pid=281) " — one space after the tag belongs to it; further indentation is the line's own
# (a traceback's code lines start with spaces, and the frame reader depends on them)
_PROCESS_TAG = re.compile(r"^(?:\([^()]*\bpid=\d+[^()]*\) ?)+")
_RANK_TAG = re.compile(r"^\[rank\d+\]:\s?")
# vLLM's record header: "ERROR 05-19 12:00:00 [core.py:708] " (≥0.7) or "INFO 10-15 12:00:00 engine.py:160] " (older)
_VLLM_RECORD = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?\s+"
    r"(?:\[[^\]]*\]|[\w./-]+:\d+\])\s?"
)
# uvicorn ("INFO:     Application startup complete.") and logging.basicConfig ("WARNING:root:...")
_PY_RECORD = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?:\s+|[\w.]+:)")
# c10/glog: "[W519 12:00:00.123 ProcessGroupNCCL.cpp:1496] Warning: ..."
_GLOG_RECORD = re.compile(r"^\[(?P<level>[IWEF])\d{3,4} [^\]]*\]\s?")
_GLOG_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
_CONTEXT_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "WARN"})

_EXCEPTION = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception)|Exception|KeyboardInterrupt|SystemExit))"
    r"(?:\((?P<inner>[\w.]*)\))?(?::\s?(?P<msg>.*))?$"
)
_PYDANTIC_DETAIL = re.compile(r"^\s*(?:Value error|Assertion failed), (?P<msg>.*?)(?:\s*\[type=\w+.*)?$")
_FRAME = re.compile(r'^\s*File "[^"]*", line \d+, in (?P<fn>[\w<>.]+)')


@dataclass(frozen=True, slots=True)
class _Line:
    index: int
    body: str  # the line without its decorations
    level: str | None  # DEBUG/INFO/WARNING/ERROR/CRITICAL when it is a log record
    message: str  # what the anchored patterns see: the exception's message, or the body
    exc_type: str | None  # "ValueError", "torch.OutOfMemoryError", ... when the line is an exception line

    @property
    def context_only(self) -> bool:
        return self.level in _CONTEXT_LEVELS

    @property
    def is_frame(self) -> bool:
        return _FRAME.match(self.body) is not None


def _parse_line(index: int, raw: str) -> _Line:
    body = _ANSI.sub("", raw).rstrip()
    body = _K8S_TIMESTAMP.sub("", body, count=1)
    body = _PROCESS_TAG.sub("", body, count=1)
    body = _RANK_TAG.sub("", body, count=1)
    level: str | None = None
    for record in (_VLLM_RECORD, _PY_RECORD, _GLOG_RECORD):
        m = record.match(body)
        if m:
            level = _GLOG_LEVELS.get(m["level"], m["level"])
            body = body[m.end() :]
            break
    body = _PROCESS_TAG.sub("", body, count=1)
    exc_type: str | None = None
    message = body.strip()
    m = _EXCEPTION.match(message)
    if m:
        exc_type = m["type"]
        message = (m["msg"] or "").strip()
    else:
        d = _PYDANTIC_DETAIL.match(body)
        if d:
            message = d["msg"].strip()
    return _Line(index=index, body=body, level=level, message=message, exc_type=exc_type)


def _parse(text: str) -> list[_Line]:
    return [_parse_line(i, raw) for i, raw in enumerate(text.splitlines())]


# --------------------------------------------------------------------------------------------------------------
# Patterns (anchored with .match on _Line.message unless noted)

_NUM = r"\d+(?:\.\d+)?"
_KV_V1 = re.compile(
    r"To serve at least one request with the (?P<who>models?'s) max seq len \((?P<max_len>\d+)\),\s*"
    rf"\((?P<needed>{_NUM})\s*(?P<unit>GiB|GB) KV cache is needed, which is larger than the available KV cache "
    rf"memory \((?P<avail>{_NUM})\s*(?:GiB|GB)\)\.?\s*"
    r"(?P<based>Based on the available memory,\s*(?:the estimated maximum model length is (?P<est>\d+))?)?"
)
_KV_V0 = re.compile(
    r"The model's max seq len \((?P<max_len>\d+)\) is larger than the maximum number of tokens that can be "
    r"stored in KV cache \((?P<tokens>\d+)\)"
)
_AUTO_FIT = re.compile(r"Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token")
_NO_KV = re.compile(r"No available memory for the cache blocks\b")
_FREE = re.compile(
    rf"Free memory on device(?: (?P<dev>[\w:]+))? \((?P<free>{_NUM})/(?P<total>{_NUM}) GiB\) on startup is less "
    r"than (?P<what>desired GPU memory utilization|the engine's budget after excluding external process's weights) "
    rf"\((?P<util>{_NUM}), (?P<req>{_NUM}) GiB\)"
)
_EXTERNAL_EXCEED = re.compile(  # 0.32+ v1/worker/utils.py::request_memory
    rf"Externally held weights on device (?P<dev>[\w:]+) \((?P<ext>{_NUM})/(?P<total>{_NUM}) GiB\) exceed the "
    rf"desired GPU memory utilization \((?P<util>{_NUM}), (?P<req>{_NUM}) GiB\)"
)
_LOAD_OOM = re.compile(r"Failed to load model - not enough GPU memory")
_WARMUP_OOM = re.compile(
    r"CUDA out of memory occurred when warming up (?:sampler|pooler)(?: \([^)]*\))? with (?P<n>\d+) dummy requests"
)
_OOM_MESSAGE = re.compile(
    r"(?:(?:CUDA|HIP|XPU) out of memory\b|CUDA error: out of memory|CUDA error: CUBLAS_STATUS_ALLOC_FAILED)"
)
_OOM_ANYWHERE = re.compile(  # searched: only PyTorch's allocator and NCCL write these
    r"(?:CUDA|HIP) out of memory\. Tried to allocate|Cuda failure (?:\d+ )?'out of memory'"
)
_OOM_TRIED = re.compile(rf"Tried to allocate (?P<v>{_NUM}) ?(?P<u>[KMGT]i?B|bytes|B)\b")
_OOM_CAPACITY = re.compile(  # torch ≥2.1 ("capacty" in 2.1)
    rf"GPU (?P<gpu>\d+) has a total capac(?:i)?ty of (?P<cap>{_NUM}) ?(?P<cu>[KMGT]i?B) of which "
    rf"(?P<free>{_NUM}) ?(?P<fu>[KMGT]i?B|bytes|B) is free"
)
_OOM_CAPACITY_OLD = re.compile(  # torch ≤2.0: "(GPU 0; 15.78 GiB total capacity; …; 3.19 MiB free; …)"
    rf"\(GPU (?P<gpu>\d+); (?P<cap>{_NUM}) ?(?P<cu>[KMGT]i?B) total capacity;.*?(?P<free>{_NUM}) ?"
    r"(?P<fu>[KMGT]i?B|bytes|B) free"
)
_PP_UNSUPPORTED = re.compile(r"Pipeline parallelism is (?:not supported for this model|only supported for)")
# --enable-lora on a model class without SupportsLoRA (catalog/lora_support.yaml has the releases and files):
# 0.33+ config/lora.py (in VllmConfig's ValidationError), 0.6.4-0.32 the model runner ("yet"), 0.5-0.6.3 the loader.
# "V1 does not support LoRA yet." (0.7.0's V1 scheduler) is about the engine, not the model: not this.
_LORA_UNSUPPORTED = re.compile(
    r"LoRA is not supported for (?P<arch>\w+) \((?P<model>[^)]*)\)\. Supported models implement the `SupportsLoRA`|"
    r"Model (?P<old>\w+) does not support LoRA, but LoRA is enabled|"
    r"(?!V1 )(?P<cls>\w+) does not support LoRA yet\.?$"
)
#: LogitsProcessorWithLoRA.create_lora_weights (catalog/lora_support.yaml vocab_limits): the LM head's vocabulary is
#: above the release's LoRA limit (0.5.0-0.16: "32000 >= vocab_size <= N", 0.17.0+: "<= 258048").
_LORA_VOCAB = re.compile(r"When using LoRA, vocab size must be (?:32000 >= vocab_size )?<= (?P<limit>\d+)$")
_HEADS_TP = re.compile(
    r"Total number of attention heads \((?P<h>\d+)\) must be divisible by tensor parallel size \((?P<tp>\d+)\)"
)
_LAYERS_PP = re.compile(
    r"Total number of hidden layers \((?P<n>\d+)\) must be divisible by pipeline parallel size \((?P<pp>\d+)\)"
)
_NOT_DIVISIBLE = re.compile(r"(?P<a>\d+) is not divisible by (?P<b>\d+)\s*$")  # vllm.distributed.utils.divide
_KV_HEADS_TP = re.compile(
    r"(?:num_key_value_heads|total_num_kv_heads|num_kv_heads|number of (?:kv|key[- ]value) heads)\W{0,3}(?P<kv>\d+)"
    r"\W{0,3}must be divisible by\b[^\d]{0,40}?(?P<tp>\d+)",
    re.IGNORECASE,
)
_WORLD_SIZE = re.compile(
    r"World size \((?P<ws>\d+)\) is larger than the number of available GPUs \((?P<n>\d+)\)"
)
_PLACEMENT_REQUIRING = re.compile(r"Cannot provide a placement group requiring (?P<n>\d+)(?:\.\d+)? GPUs")
_PLACEMENT_EXCEEDS = re.compile(
    r"The number of required (?:GPU|gpu|device)s? exceeds the total number of available (?:GPU|gpu|device)s? in "
    r"the placement group\.(?:\s*Required number of devices: (?P<req>\d+)\. Total number of devices: (?P<tot>\d+))?"
)
_INVALID_ORDINAL = re.compile(r"CUDA error: invalid device ordinal")
_MAX_LEN = re.compile(
    r"User-specified max_model_len \((?P<req>\d+)\) is greater than the derived max_model_len "
    rf"\((?P<key>\w+)=(?P<derived>{_NUM}|None) or model_max_length=(?P<mml>[\w.]+) in model's config\.json\)"
)
_HF_EXCEPTIONS = re.compile(
    r"(?:RepositoryNotFoundError|GatedRepoError|RevisionNotFoundError|HFValidationError|LocalEntryNotFoundError)$"
)
_MODEL_NOT_FOUND = re.compile(
    r"(?:Repository Not Found for url|Revision Not Found for url|Cannot access gated repo|"
    r"You are trying to access a gated repo|Access to model \S+ is restricted|"
    r"Invalid repository ID or local directory specified|Incorrect path_or_model_id|Repo id must be in the form|"
    r"Cannot find an appropriate cached snapshot folder)"
)
_NOT_A_MODEL_ID = re.compile(r"(?P<id>\S+) is not a local folder and is not a valid model identifier")
_HF_HTTP = re.compile(r"(?:401|403|404) Client Error\b.*huggingface\.co")  # searched
_MODEL_ID = re.compile(
    r"huggingface\.co/(?:api/models/)?(?P<url>[\w.\-]+/[\w.\-]+)|"
    r"(?:specified|path_or_model_id|namespace/repo_name'):? '(?P<quoted>[^']+)'|"
    r"Access to model (?P<restricted>\S+) is restricted"
)
_ARGPARSE = re.compile(r"^(?P<prog>[\w.\-]+(?: [\w.\-]+)?): error: (?P<msg>.+)$")  # on the body
_PYDANTIC_HEADER = re.compile(r"(?P<n>\d+) validation errors? for (?P<model>\w+)")
_BAD_VALUE = re.compile(
    r"(?:Unknown quantization method|max_num_batched_tokens \(\d+\) is smaller than max_model_len|"
    r"Invalid (?:dtype|kv[_ ]cache[_ ]dtype|load[_ ]format)|Unknown (?:dtype|kv cache dtype)|"
    r"gpu_memory_utilization must be|"
    r"kv_cache_dtype=\"?\w+\"? is incompatible with dtype=|"  # 0.33 config/vllm.py::_reject_mismatched_float_kv_cache
    r"max_num_active_seqs \(\d+\) cannot be greater than max_num_seqs|"  # 0.31 config/scheduler.py
    r"max_lora_rank \(\d+\) must be one of)"  # 0.5.0-0.11.0 LoRAConfig.__post_init__ (catalog/lora_support.yaml)
)

# Exceptions that only wrap or follow the real one (they do not make an earlier match stale).
_WRAPPER = re.compile(
    r"root cause|actual cause|Engine core initialization failed|Engine process failed to start|"
    r"WorkerProc initialization failed|WorkerProc hit an exception|EngineDeadError|EngineGenerateError|"
    r"CancelledError|KeyboardInterrupt|SystemExit|BrokenPipeError|ConnectionResetError|ConnectionRefusedError|"
    r"EOFError|RayTaskError|ActorDiedError|NCCL communicator was aborted|DistBackendError|DistNetworkError|"
    r"Connection closed by peer|Worker failed with error|died unexpectedly|shutting down"
)

# Progress lines, newest first in each startup (any log level).
_SERVING_MARK = re.compile(
    r"Starting vLLM (?:API )?server|Application startup complete|Uvicorn running on|Avg prompt throughput|"
    r"\"(?:POST|GET) /v1/|Available routes are"
)
_CUDAGRAPH_MARK = re.compile(
    r"Graph capturing|Capturing (?:CUDA graph|cudagraph|a cudagraph|the model for CUDA graphs)|"
    r"CUDA graph memory profiling|Profiling CUDA graph memory|Estimated CUDA graph memory|"
    r"Available KV cache memory|GPU KV cache size|# (?:GPU|CUDA) blocks|Maximum concurrency for|"
    r"init engine \(profile, create kv cache|Compile and warming up model"
)
_PROFILING_MARK = re.compile(
    r"Model loading took|Loading model weights took|Memory profiling takes|torch\.compile takes|"
    r"Dynamo bytecode transform time|Compiling a graph for|Start compiling function|"
    r"Initial profiling/warmup run took|for vLLM's torch\.compile|Directly load the compiled graph"
)
_LOADING_MARK = re.compile(
    r"Starting to load model|Loading weights|Loading (?:safetensors|pt) checkpoint shards|"
    r"Time spent downloading weights|Loading model from scratch|Using model weights format"
)
_PHASE_MARKS: tuple[tuple[Phase, re.Pattern[str]], ...] = (
    ("serving", _SERVING_MARK),
    ("cudagraph", _CUDAGRAPH_MARK),
    ("profiling", _PROFILING_MARK),
    ("loading", _LOADING_MARK),
)
# Function names in the OOM's own traceback, checked in this order.
_PHASE_FRAMES: tuple[tuple[Phase, frozenset[str]], ...] = (
    (
        "cudagraph",
        frozenset(
            {
                "capture_model", "_capture_cudagraphs", "profile_cudagraph_memory", "compile_or_warm_up_model",
                "_compile_or_warm_up_model", "warmup_kernels", "_init_minimal_kv_cache_for_profiling",
                "_warm_up_model", "initialize_kv_cache", "_allocate_kv_cache_tensors", "initialize_kv_cache_tensors",
                "initialize_from_config", "initialize_cache", "_init_cache_engine",
            }
        ),
    ),
    (
        "profiling",
        frozenset(
            {
                "profile_run", "determine_available_memory", "determine_num_available_blocks",
                "_dummy_sampler_run", "_dummy_pooler_run",
            }
        ),
    ),
    (
        "loading",
        frozenset(
            {"load_model", "load_weights", "get_model", "process_weights_after_loading", "_initialize_model"}
        ),
    ),
    ("serving", frozenset({"execute_model", "run_busy_loop", "_process_engine_step", "step_with_batch_queue"})),
)

_ERRORISH = re.compile(r"Error|Exception|error:|FAILED|Failed|failed")
_IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
_FAILED_WAITING_REASONS = _IMAGE_PULL_REASONS | {
    "CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
}
_SIGNALS = {134: "SIGABRT", 135: "SIGBUS", 137: "SIGKILL", 139: "SIGSEGV", 143: "SIGTERM"}


# --------------------------------------------------------------------------------------------------------------
# Matching one line


@dataclass(slots=True)
class _Hit:
    kind: FailureKind | Literal["oom"]
    line: _Line
    fields: dict[str, Any] = field(default_factory=dict)
    wording: str | None = None
    hint: Phase | None = None  # phase implied by the text itself (load wrapper, sampler warm-up)
    extra_lines: int = 0  # following lines that belong in the excerpt


def _f(value: str | None) -> float | None:
    return None if value is None or value == "None" else float(value)


def _i(value: str | None) -> int | None:
    return None if value is None or value == "None" else int(float(value))


_UNIT_MIB = {"B": 1 / 2**20, "bytes": 1 / 2**20, "KB": 1 / 1024, "KiB": 1 / 1024, "MB": 1.0, "MiB": 1.0,
             "GB": 1024.0, "GiB": 1024.0, "TB": 1024.0**2, "TiB": 1024.0**2}


def _mib(value: str, unit: str) -> float:
    return round(float(value) * _UNIT_MIB[unit], 3)


def _oom_numbers(text: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    m = _OOM_TRIED.search(text)
    if m:
        found["tried_to_allocate_mib"] = _mib(m["v"], m["u"])
    m = _OOM_CAPACITY.search(text) or _OOM_CAPACITY_OLD.search(text)
    if m:
        found["device"] = f"cuda:{m['gpu']}"
        found["gpu_capacity_gib"] = round(_mib(m["cap"], m["cu"]) / 1024, 3)
        found["gpu_free_mib"] = _mib(m["free"], m["fu"])
    return found


def _model_id(text: str) -> str | None:
    m = _MODEL_ID.search(text)
    if not m:
        return None
    found = m["url"] or m["quoted"] or m["restricted"]
    return found.rstrip(".") if found else None


def _match_memory(line: _Line) -> _Hit | None:
    msg = line.message
    if m := _KV_V1.match(msg):
        if m["unit"] == "GB":
            wording = "v1-gb"
        elif m["based"] and not m["est"]:
            wording = "v1-broken-estimate"
        elif not m["based"]:
            wording = "v1-no-estimate"
        else:
            wording = "v1-models's" if m["who"] == "models's" else "v1"
        return _Hit(
            FailureKind.KV_CACHE_TOO_SMALL, line, wording=wording,
            fields={"max_model_len": int(m["max_len"]), "needed_kv_gib": float(m["needed"]),
                    "available_kv_gib": float(m["avail"]), "estimated_max_model_len": _i(m["est"])},
        )
    if m := _KV_V0.match(msg):
        return _Hit(FailureKind.KV_CACHE_TOO_SMALL, line, wording="v0",
                    fields={"max_model_len": int(m["max_len"]), "kv_cache_tokens": int(m["tokens"])})
    if _AUTO_FIT.match(msg):
        return _Hit(FailureKind.NO_KV_CACHE_MEMORY, line, wording="auto-fit")
    if _NO_KV.match(msg):
        wording = "cpu-note" if "CPU backend" in msg else "docs-link" if "conserving_memory" in msg else "plain"
        return _Hit(FailureKind.NO_KV_CACHE_MEMORY, line, wording=wording)
    if m := _FREE.match(msg):
        wording = "external-weights" if m["what"].startswith("the engine") else "device" if m["dev"] else "no-device"
        return _Hit(
            FailureKind.INSUFFICIENT_FREE_GPU_MEMORY, line, wording=wording,
            fields={"device": m["dev"], "free_gib": float(m["free"]), "total_gib": float(m["total"]),
                    "requested_utilization": float(m["util"]), "requested_gib": float(m["req"])},
        )
    if m := _EXTERNAL_EXCEED.match(msg):
        return _Hit(
            FailureKind.INVALID_ARGUMENT, line, wording="external-weights-exceed",
            fields={"device": m["dev"], "external_weights_gib": float(m["ext"]), "total_gib": float(m["total"]),
                    "requested_utilization": float(m["util"]), "requested_gib": float(m["req"])},
        )
    if _LOAD_OOM.match(msg):
        return _Hit("oom", line, wording="load-wrapper", hint="loading", fields=_oom_numbers(line.body))
    if m := _WARMUP_OOM.match(msg):
        return _Hit("oom", line, wording="warmup", hint="profiling", fields={"warmup_requests": int(m["n"])})
    oom_type = line.exc_type is not None and line.exc_type.endswith("OutOfMemoryError")
    if oom_type or _OOM_MESSAGE.match(msg) or _OOM_ANYWHERE.search(line.body):
        return _Hit("oom", line, wording="torch", fields=_oom_numbers(line.body))
    return None


def _match_other(line: _Line) -> _Hit | None:  # noqa: C901 - a case per message family
    msg = line.message
    if m := _LORA_UNSUPPORTED.match(msg):
        return _Hit(FailureKind.INVALID_ARGUMENT, line, wording="lora-unsupported",
                    fields={"architecture": m["arch"] or m["old"] or m["cls"]})
    if _LORA_VOCAB.match(msg):
        return _Hit(FailureKind.INVALID_ARGUMENT, line, wording="lora-vocab")
    if _PP_UNSUPPORTED.match(msg):
        return _Hit(FailureKind.PIPELINE_PARALLEL_UNSUPPORTED, line)
    if m := _HEADS_TP.match(msg):
        return _Hit(FailureKind.INVALID_PARALLELISM, line, wording="heads",
                    fields={"num_heads": int(m["h"]), "tensor_parallel_size": int(m["tp"]),
                            "dividend": int(m["h"]), "divisor": int(m["tp"])})
    if m := _LAYERS_PP.match(msg):
        return _Hit(FailureKind.INVALID_PARALLELISM, line, wording="layers",
                    fields={"dividend": int(m["n"]), "divisor": int(m["pp"])})
    if m := _KV_HEADS_TP.match(msg):
        return _Hit(FailureKind.INVALID_PARALLELISM, line, wording="kv-heads",
                    fields={"num_kv_heads": int(m["kv"]), "tensor_parallel_size": int(m["tp"]),
                            "dividend": int(m["kv"]), "divisor": int(m["tp"])})
    if m := _NOT_DIVISIBLE.match(msg):
        return _Hit(FailureKind.INVALID_PARALLELISM, line, wording="not-divisible",
                    fields={"dividend": int(m["a"]), "divisor": int(m["b"])})
    if m := _WORLD_SIZE.match(msg):
        return _Hit(FailureKind.INVALID_PARALLELISM, line, wording="world-size",
                    fields={"world_size": int(m["ws"]), "available_gpus": int(m["n"])})
    if m := _PLACEMENT_REQUIRING.match(msg):
        return _Hit(FailureKind.INVALID_PARALLELISM, line, wording="placement-group",
                    fields={"world_size": int(m["n"])})
    if m := _PLACEMENT_EXCEEDS.match(msg):
        return _Hit(FailureKind.INVALID_PARALLELISM, line, wording="placement-group",
                    fields={"world_size": _i(m["req"]), "available_gpus": _i(m["tot"])})
    if _INVALID_ORDINAL.match(msg):
        return _Hit(FailureKind.INVALID_PARALLELISM, line, wording="device-ordinal")
    if m := _MAX_LEN.match(msg):
        return _Hit(FailureKind.MAX_MODEL_LEN_TOO_LONG, line,
                    fields={"max_model_len": int(m["req"]), "derived_max_model_len": _i(m["derived"])})
    hf_type = line.exc_type is not None and _HF_EXCEPTIONS.search(line.exc_type) is not None
    if hf_type or _MODEL_NOT_FOUND.match(msg) or _HF_HTTP.search(msg):
        return _Hit(FailureKind.MODEL_NOT_FOUND, line, extra_lines=3)
    if m := _NOT_A_MODEL_ID.match(msg):
        return _Hit(FailureKind.MODEL_NOT_FOUND, line, fields={"model_id": m["id"].strip("'\"")})
    if line.exc_type is None and line.level is None and _ARGPARSE.match(line.body.strip()):
        return _Hit(FailureKind.INVALID_ARGUMENT, line, wording="argparse")
    if line.exc_type is not None and line.exc_type.endswith("ValidationError") and _PYDANTIC_HEADER.match(msg):
        return _Hit(FailureKind.INVALID_ARGUMENT, line, wording="validation", extra_lines=2)
    if _BAD_VALUE.match(msg):
        return _Hit(FailureKind.INVALID_ARGUMENT, line, wording="value")
    return None


def _match(line: _Line) -> _Hit | None:
    if line.context_only or line.is_frame or not line.message:
        return None
    return _match_memory(line) or _match_other(line)


# --------------------------------------------------------------------------------------------------------------
# Choosing the match, and the phase of an OOM


def _ignored_exception_lines(lines: Sequence[_Line]) -> set[int]:
    """Indexes of exception lines inside "Exception ignored in: …" blocks (interpreter-shutdown noise)."""
    ignored: set[int] = set()
    inside = False
    for line in lines:
        if line.body.startswith("Exception ignored"):
            inside = True
        elif inside and line.exc_type is not None:
            ignored.add(line.index)
            inside = False
    return ignored


def _is_root_exception(line: _Line, ignored: set[int]) -> bool:
    return (
        line.exc_type is not None
        and not line.context_only
        and line.index not in ignored
        and _WRAPPER.search(line.body) is None
    )


def _find(lines: Sequence[_Line]) -> tuple[_Hit | None, _Line | None]:
    """The last matching line, unless a different (non-wrapper) exception follows it: then (None, that line)."""
    hit: _Hit | None = None
    for line in reversed(lines):
        hit = _match(line)
        if hit is not None:
            break
    if hit is None:
        return None, None
    ignored = _ignored_exception_lines(lines)
    for later in lines[hit.line.index + 1 :]:
        if _is_root_exception(later, ignored):
            return None, later
    return hit, None


def _traceback_frames(lines: Sequence[_Line], index: int) -> list[str]:
    """Function names of the traceback(s) printed right before line `index` (its own stack)."""
    names: list[str] = []
    for line in reversed(lines[max(0, index - 400) : index]):
        body = line.body
        if m := _FRAME.match(body):
            names.append(m["fn"])
        elif not (
            not body.strip()
            or body[:1].isspace()
            or line.exc_type is not None
            or body.startswith(("Traceback (most recent call last)", "The above exception", "During handling", "^"))
        ):
            break
    return names


def _phase_of(lines: Sequence[_Line], hit: _Hit) -> Phase | None:
    frames = set(_traceback_frames(lines, hit.line.index))
    for phase, names in _PHASE_FRAMES:
        if frames & names:
            return phase
    if hit.hint is not None:
        return hit.hint
    for line in reversed(lines[: hit.line.index]):
        if _LOAD_OOM.match(line.message) and not line.context_only:
            return "loading"
        for phase, mark in _PHASE_MARKS:
            if mark.search(line.body):
                return phase
    return None


# --------------------------------------------------------------------------------------------------------------
# Building the Failure


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split()) if "\n" not in text else text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(text: str, limit: int = SUMMARY_MAX) -> str:
    return _clip(" ".join(text.split()), limit)


def _excerpt(lines: Sequence[_Line], hit: _Hit) -> str:
    chosen = [hit.line.body.strip()]
    for line in lines[hit.line.index + 1 : hit.line.index + 1 + hit.extra_lines]:
        if line.body.strip():
            chosen.append(line.body.strip())
    return _clip("\n".join(chosen), EXCERPT_MAX)


def _details(lines: Sequence[_Line], hit: _Hit) -> list[str]:
    """The lines after a pydantic ValidationError header: field name and message, without '[type=…]'."""
    found: list[str] = []
    for line in lines[hit.line.index + 1 : hit.line.index + 1 + hit.extra_lines]:
        text = re.sub(r"\s*\[type=.*$", "", line.body).strip()
        if text:
            found.append(text)
    return found


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _exit_text(exit_code: int | None, reason: str | None) -> str:
    parts: list[str] = []
    if exit_code is not None:
        sig = _SIGNALS.get(exit_code)
        parts.append(f"exit code {exit_code}" + (f" ({sig})" if sig else ""))
    if reason:
        parts.append(f"reason {reason}")
    return ", ".join(parts)


def _oom_detail(fields: dict[str, Any]) -> str:
    bits: list[str] = []
    if fields.get("tried_to_allocate_mib") is not None:
        bits.append(f"tried to allocate {fields['tried_to_allocate_mib']:g} MiB")
    if fields.get("gpu_capacity_gib") is not None:
        bits.append(
            f"{fields.get('device') or 'GPU'} has {fields['gpu_capacity_gib']:g} GiB, "
            f"{_gib(fields.get('gpu_free_mib'))} MiB free"
        )
    return f" ({'; '.join(bits)})" if bits else ""


_PHASE_WORDS: dict[Phase, str] = {
    "loading": "while loading the weights",
    "profiling": "while profiling memory (dummy forward pass / sampler warm-up)",
    "cudagraph": "after the KV cache was sized (KV allocation, warm-up or CUDA-graph capture)",
    "serving": "while serving",
}


def _summary(kind: FailureKind, hit: _Hit, phase: Phase | None, details: Sequence[str] = ()) -> str:  # noqa: C901 - a sentence per class
    f = hit.fields
    msg = hit.line.message or hit.line.body.strip()
    if kind is FailureKind.KV_CACHE_TOO_SMALL:
        if hit.wording == "v0":
            return (
                f"KV cache too small: max_model_len {f['max_model_len']} is longer than the "
                f"{f['kv_cache_tokens']} tokens the KV cache can hold"
            )
        text = (
            f"KV cache too small: one request of max_model_len {f['max_model_len']} needs "
            f"{_gib(f['needed_kv_gib'])} GiB of KV cache but only {_gib(f['available_kv_gib'])} GiB is available"
        )
        if f.get("estimated_max_model_len"):
            text += f"; vLLM estimates max_model_len {f['estimated_max_model_len']} would fit"
        return text
    if kind is FailureKind.NO_KV_CACHE_MEMORY:
        if hit.wording == "auto-fit":
            return "No GPU memory left for the KV cache: --max-model-len auto cannot fit even a single token"
        return "No GPU memory left for the KV cache after weights, activations and overheads"
    if kind is FailureKind.INSUFFICIENT_FREE_GPU_MEMORY:
        return (
            f"Not enough free GPU memory at startup on {f.get('device') or 'the GPU'}: "
            f"{_gib(f['free_gib'])}/{_gib(f['total_gib'])} GiB free, but gpu_memory_utilization "
            f"{f['requested_utilization']:g} asks for {_gib(f['requested_gib'])} GiB (another process holds GPU memory)"
        )
    if kind is FailureKind.INVALID_ARGUMENT and hit.wording == "external-weights-exceed":
        return (
            f"Weights held by another process on {f['device']} ({_gib(f['external_weights_gib'])} GiB) exceed what "
            f"gpu_memory_utilization {f['requested_utilization']:g} allows ({_gib(f['requested_gib'])} GiB): raise "
            "the utilization or free the weight-cache process"
        )
    if kind is FailureKind.WEIGHTS_DO_NOT_FIT:
        return "CUDA out of memory while loading the model weights" + _oom_detail(f)
    if kind is FailureKind.CUDA_OOM_STARTUP:
        where = _PHASE_WORDS[phase] if phase else "during startup"
        if hit.wording == "warmup":
            where = f"warming up the sampler with {f['warmup_requests']} dummy requests (max_num_seqs)"
        return f"CUDA out of memory {where}" + _oom_detail(f)
    if kind is FailureKind.CUDA_OOM_SERVING:
        return "CUDA out of memory while serving" + _oom_detail(f)
    if kind is FailureKind.INVALID_PARALLELISM:
        if hit.wording == "heads":
            return (
                f"Invalid tensor parallelism: {f['num_heads']} attention heads are not divisible by "
                f"tensor_parallel_size {f['tensor_parallel_size']}"
            )
        if hit.wording == "kv-heads":
            return (
                f"Invalid tensor parallelism: {f['num_kv_heads']} KV heads are not divisible by "
                f"tensor_parallel_size {f['tensor_parallel_size']}"
            )
        if hit.wording == "not-divisible":
            return (
                f"Invalid parallelism: a weight dimension ({f['dividend']}) is not divisible by {f['divisor']} "
                "(usually the tensor-parallel size)"
            )
        if hit.wording == "placement-group":
            needed = f"{f['world_size']} GPUs" if f.get("world_size") else "the GPUs"
            have = f" but only {f['available_gpus']} are available" if f.get("available_gpus") else ""
            return f"Invalid parallelism: Ray cannot place {needed}{have} (TP × PP larger than the cluster's GPUs)"
        if hit.wording == "world-size":
            return (
                f"Invalid parallelism: world size {f['world_size']} (TP × PP) is larger than the "
                f"{f['available_gpus']} GPUs available in the pod"
            )
        return "Invalid parallelism: " + _one_line(msg, 300)
    if kind is FailureKind.PIPELINE_PARALLEL_UNSUPPORTED:
        return "Pipeline parallelism is not supported for this model architecture"
    if kind is FailureKind.MAX_MODEL_LEN_TOO_LONG:
        return (
            f"max_model_len {f['max_model_len']} is longer than the model's context length "
            f"{f['derived_max_model_len']} (from its config.json)"
        )
    if kind is FailureKind.MODEL_NOT_FOUND:
        model = f" {f['model_id']}" if f.get("model_id") else ""
        return f"Model{model} not found or not accessible (wrong id/path, private or gated repo, or no token): " + (
            _one_line(msg, 200)
        )
    if kind is FailureKind.INVALID_ARGUMENT and hit.wording == "lora-unsupported":
        return (f"LoRA is not supported for {f['architecture']} by this vLLM release (the model class does not "
                "implement SupportsLoRA): remove spec.lora / --enable-lora or serve another model")
    if kind is FailureKind.INVALID_ARGUMENT and hit.wording == "lora-vocab":
        return (f"LoRA on this model's LM head is refused by this vLLM release ({_one_line(msg, 120)}): remove "
                "spec.lora / --enable-lora or use a release with a higher limit")
    if kind is FailureKind.INVALID_ARGUMENT:
        m = _ARGPARSE.match(hit.line.body.strip())
        if m:
            msg = m["msg"]
        elif hit.wording == "validation" and details:
            msg = f"{msg}: {' '.join(details)}"
        return "Invalid vLLM argument: " + _one_line(msg, 300)
    return _one_line(msg)


def _load_wrapper_before(lines: Sequence[_Line], index: int) -> bool:
    return any(_LOAD_OOM.match(line.message) and not line.context_only for line in lines[:index])


def _build(hit: _Hit, lines: Sequence[_Line], *, was_ready_before: bool | None, exit_code: int | None) -> Failure:
    phase: Phase | None = None
    kind: FailureKind
    if isinstance(hit.kind, FailureKind):
        kind = hit.kind
    else:  # a CUDA OOM: where it happened decides the class
        phase = _phase_of(lines, hit)
        if was_ready_before is True or phase == "serving":
            kind = FailureKind.CUDA_OOM_SERVING
            phase = phase or "serving"
        elif phase == "loading":
            kind = FailureKind.WEIGHTS_DO_NOT_FIT
        else:
            kind = FailureKind.CUDA_OOM_STARTUP
    if kind is FailureKind.MODEL_NOT_FOUND and "model_id" not in hit.fields:
        following = lines[hit.line.index : hit.line.index + 1 + hit.extra_lines]
        hit.fields["model_id"] = _model_id("\n".join(line.body for line in following))
    if hit.kind == "oom" and hit.wording == "torch" and _load_wrapper_before(lines, hit.line.index):
        hit.wording = "load-wrapper"
    fields = {k: v for k, v in hit.fields.items() if v is not None}
    return Failure(
        kind=kind,
        summary=_one_line(_summary(kind, hit, phase, _details(lines, hit))),
        excerpt=_excerpt(lines, hit),
        wording=hit.wording,
        phase=phase,
        exit_code=exit_code,
        **fields,
    )


def _best_error_line(lines: Sequence[_Line], ignored: set[int]) -> _Line | None:
    """The most informative error line: the last real exception, else a wrapper, else an ERROR record, …"""
    candidates = [
        line for line in lines if line.body.strip() and not line.is_frame and not line.body.startswith("Traceback")
    ]
    for rank in range(4):
        for line in reversed(candidates):
            if _error_rank(line, rank, ignored):
                return line
    return None


def _error_rank(line: _Line, rank: int, ignored: set[int]) -> bool:
    if rank == 0:
        return _is_root_exception(line, ignored)
    if rank == 1:
        return line.exc_type is not None and not line.context_only
    if rank == 2:
        return line.level in ("ERROR", "CRITICAL")
    return not line.context_only and _ERRORISH.search(line.body) is not None


#: An exception class name as Python prints it (`ValueError`, `torch.OutOfMemoryError`): the one word of an
#: unrecognised failure that is copied out of the pod.
_EXCEPTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,60}(?:\.[A-Za-z_][A-Za-z0-9_]{0,60}){0,4}")
#: Where the text of an unrecognised failure is: the pod, never an Event, a condition, status or the operator's log.
SEE_LOGS = "the text is in the pod: see `kubectl logs <pod> -c <container> --previous`"


def _unknown(lines: Sequence[_Line], *, exit_code: int | None, reason: str | None, later: _Line | None) -> Failure:
    """An unrecognised failure: its class, the exception's name and the exit code, never its free-form text (a line
    of an unknown error may carry anything, a credential included: issue 20)."""
    best = later or _best_error_line(lines, _ignored_exception_lines(lines))
    exit_text = _exit_text(exit_code, reason if reason is None or _EXCEPTION_NAME.fullmatch(reason) else "Error")
    exc_type = best.exc_type if best is not None else None
    named = f" ({exc_type})" if exc_type and _EXCEPTION_NAME.fullmatch(exc_type) else ""
    summary = ("Container failed" + (f" ({exit_text})" if exit_text else "")
               + (f" with an error the operator does not recognise{named}" if best is not None
                  else " without a recognizable error"))
    return Failure(kind=FailureKind.UNKNOWN, summary=f"{summary}; {SEE_LOGS}", excerpt="", exit_code=exit_code)


def _is_oom_killed(reason: str | None) -> bool:
    return reason is not None and reason.replace("-", "").replace("_", "").lower() in ("oomkilled", "oomkill")


def classify_text(
    text: str,
    *,
    terminated_reason: str | None = None,
    exit_code: int | None = None,
    was_ready_before: bool | None = None,
    waiting_reason: str | None = None,
) -> Failure:
    """Classify a failed container from its termination message or log tail (plus what the kubelet said).

    Always returns a Failure (`Unknown` when nothing is recognised); see the module docstring for the rules.
    """
    text = redact(text)  # its summary and excerpt become Events, conditions, status and log lines (issue 10)
    if waiting_reason in _IMAGE_PULL_REASONS:
        detail = _one_line(text) if text.strip() else ""
        return Failure(
            kind=FailureKind.IMAGE_PULL,
            summary=_one_line(f"Cannot pull the container image ({waiting_reason})" + (f": {detail}" if detail else "")),
            excerpt=_clip(text, EXCERPT_MAX),
            exit_code=exit_code,
        )
    if _is_oom_killed(terminated_reason):
        return Failure(
            kind=FailureKind.HOST_OOM_KILLED,
            summary=(
                "Killed by the kernel OOM killer: the container exceeded its memory limit or the node ran out of "
                f"host memory [{_exit_text(exit_code, terminated_reason)}]"
            ),
            excerpt=f"terminated: reason={terminated_reason}" + (f", exitCode={exit_code}" if exit_code is not None else ""),
            exit_code=exit_code,
        )
    lines = _parse(text)
    hit, later = _find(lines)
    if hit is not None:
        return _build(hit, lines, was_ready_before=was_ready_before, exit_code=exit_code)
    network = network_failure(text)
    if network is not None:
        line = next((ln for ln in text.splitlines() if network_failure(ln)), text)
        return Failure(kind=FailureKind.NETWORK, summary=_one_line(f"{network} failure between ranks: {line}"),
                       excerpt=_clip(line, EXCERPT_MAX), exit_code=exit_code)
    system = nccl_system_error(text)
    if system is not None:
        # the matched NCCL line, not the whole log: the rest is text nothing recognised (issue 20)
        return Failure(kind=FailureKind.UNKNOWN, summary=_one_line(system), excerpt=_clip(system, EXCERPT_MAX),
                       exit_code=exit_code)
    if exit_code == 137 and not terminated_reason and not any(line.exc_type for line in lines):
        return Failure(
            kind=FailureKind.HOST_OOM_KILLED,
            summary="Killed with SIGKILL (exit code 137) and no error in the log: most likely the kernel OOM killer",
            excerpt="exitCode=137",
            exit_code=exit_code,
        )
    return _unknown(lines, exit_code=exit_code, reason=terminated_reason, later=later)


_NCCL_SYSTEM = re.compile(r"NCCL error:? unhandled system error|\bncclSystemError\b")
_SHM = re.compile(r"/dev/shm|[Ss]hared memory|shm_open|posix_fallocate")


def nccl_system_error(text: str) -> str | None:
    """The summary for NCCL's ncclSystemError without sign of a network transport, else None.

    ncclSystemError is "a call to the system failed" (nccl.h): socket, shared-memory, /proc or ibverbs calls. On
    ONE node NCCL talks over shared memory and P2P, not the network, and in pods the usual culprit is a /dev/shm too
    small for its shared-memory segments (Docker's 64 MiB default; llm-d#352 even across nodes). So the bare text
    is not a Network failure (that class would send the user to the network); it stays Unknown — which, like
    Network, never changes a memory flag — with what to check. A text that also shows the network transport
    (`NCCL WARN NET/…`, sockets, timeouts) is a Network failure (groups.NETWORK_PATTERNS, matched before this)."""
    match = _NCCL_SYSTEM.search(text)
    if match is None:
        return None
    line = next((ln.strip() for ln in text.splitlines() if _NCCL_SYSTEM.search(ln)), match.group(0))
    shm = "NCCL could not allocate its shared memory: " if _SHM.search(text) else ""
    return (f"{shm}{line} — a system call in NCCL's transport failed (not the network unless NCCL_DEBUG=INFO shows "
            "NET/Socket or NET/IB): on one node usually /dev/shm too small for NCCL's shared-memory segments "
            "(raise spec.resources.shmSize)")


def _evicted_for_memory(evidence: ContainerEvidence) -> bool:
    return evidence.pod_reason == "Evicted" and "memory" in (evidence.pod_message or "").lower()


def classify(evidence: ContainerEvidence) -> Failure | None:
    """The failure a container shows, or None when it is healthy, still starting or stopped cleanly.

    An init container's failure is never one of vLLM's memory failures (`MEMORY_FAILURES`): the only one the
    operator renders is the `model-download` container, whose failures (a gated model without a token, no such
    model, a full disk, the hub unreachable — even an OOMKilled, which is the download's host memory) no memory step
    answers. It is described as `Unknown` naming the container; the rollout status reports it (api.rollout:
    `ModelDownloadFailed`, with the redacted reason) and the ladder reads only the vllm container."""
    if evidence.ready:
        return None
    found = _classify_container(evidence)
    if found is None or not evidence.init_container or found.kind not in MEMORY_FAILURES:
        return found
    return found.model_copy(update={
        "kind": FailureKind.UNKNOWN, "phase": None,
        "summary": _one_line(f"init container {evidence.container_name} (not vLLM): {found.summary}")})


def _classify_container(evidence: ContainerEvidence) -> Failure | None:
    waiting = evidence.waiting_reason
    if waiting in _IMAGE_PULL_REASONS:
        return classify_text(evidence.waiting_message or "", waiting_reason=waiting)
    if _evicted_for_memory(evidence):
        return Failure(
            kind=FailureKind.HOST_OOM_KILLED,
            summary=_one_line(f"Pod evicted for node memory pressure: {evidence.pod_message}"),
            excerpt=_clip(evidence.pod_message or "", EXCERPT_MAX),
            exit_code=evidence.exit_code,
        )
    terminated = evidence.exit_code is not None or evidence.terminated_reason is not None
    if not terminated:
        if waiting in _FAILED_WAITING_REASONS:
            detail = f": {evidence.waiting_message}" if evidence.waiting_message else ""
            return Failure(
                kind=FailureKind.UNKNOWN,
                summary=_one_line(f"{waiting}{detail}"),
                excerpt=_clip(evidence.waiting_message or waiting or "", EXCERPT_MAX),
            )
        return None
    if evidence.exit_code == 0 and waiting != "CrashLoopBackOff":
        return None  # stopped cleanly (deleted, scaled down)

    def read(text: str) -> Failure:
        return classify_text(
            text,
            terminated_reason=evidence.terminated_reason,
            exit_code=evidence.exit_code,
            was_ready_before=evidence.was_ready_before,
        )

    result = read(evidence.termination_message)
    if result.kind is FailureKind.UNKNOWN and evidence.log_tail:
        from_log = read(evidence.log_tail)
        if from_log.kind is not FailureKind.UNKNOWN or not evidence.termination_message.strip():
            result = from_log
    return result


def download_failure_summary(pod: Mapping[str, Any]) -> str | None:
    """What status, conditions, Events and the operator's log say about a failing `model-download` init container
    (None when it does not fail: never run, running its first try, or succeeded after earlier failures).

    A failure the classifier recognises (a gated or missing repository, the download's host memory, ...) is its
    classified one-line summary, redacted. Anything else carries no text of the container's at all (issue 20: free
    log text of an unrecognised failure can hold a credential the redactor does not know): only its class, the
    container, the exit code and the kubelet's reason, and where to read the log."""
    if download_failure(pod) is None:
        return None
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    name = str((meta or {}).get("name") or "<pod>")
    namespace = (meta or {}).get("namespace")
    for evidence in evidence_from_pod(pod, container=DOWNLOAD_CONTAINER):
        recognised = _classify_container(evidence)
        found = classify(evidence)
        if recognised is not None and found is not None and recognised.kind is not FailureKind.UNKNOWN:
            return redact(found.summary)
    exit_code, reason = _last_exit(pod)
    where = f" -n {namespace}" if isinstance(namespace, str) and namespace else ""
    return (f"{FailureKind.UNKNOWN.value}: init container {DOWNLOAD_CONTAINER} failed (exit code {exit_code}, reason "
            f"{reason}) with an error the operator does not recognise; its text is not copied here: see "
            f"`kubectl logs{where} {name} -c {DOWNLOAD_CONTAINER} --previous`")


def _last_exit(pod: Mapping[str, Any]) -> tuple[str, str]:
    """The exit code and the kubelet's reason of the download container's failed run (as `download_failure` reads
    it: the current state, else the last), as short tokens."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if not isinstance(status, Mapping) or status.get("name") != DOWNLOAD_CONTAINER:
            continue
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            terminated = state.get("terminated") if isinstance(state, Mapping) else None
            if isinstance(terminated, Mapping) and terminated.get("exitCode") not in (0, None):
                code = terminated.get("exitCode")
                reason = str(terminated.get("reason") or "Error")
                return (str(code) if isinstance(code, int) else "?",
                        reason if re.fullmatch(r"[A-Za-z]{1,40}", reason) else "Error")
    return "?", "Error"
