"""`vllm-operator`: plan vLLM flags anywhere (`plan`), run the operator (`run`), show it working (`demo`).

Bad input never shows a traceback: one line naming the problem, exit code 2.
Exit codes of `plan`: 0 fits, 1 does not fit (the plan says why and what would), 2 bad input.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, get_args

import yaml
from pydantic.alias_generators import to_camel

from . import __version__
from .api.flags import canonical_cli_flag, flag_key, managed_flag_of, vllm_cli_flag
from .api.v1alpha1 import (
    API_VERSION,
    DEFAULT_GPU_MAX_COUNT,
    MAX_LORA_SLOTS,
    QUANTIZATION_METHODS,
    BlockSize,
    KVCacheDType,
    LoRAAdapter,
    LoRASpec,
    ModelDType,
    PinnedFlags,
    SpeculativeConfig,
)
from .modelfiles import find_in_catalog
from .planner import (
    ArchError,
    Plan,
    PlanRequest,
    VersionError,
    Workload,
    plan,
    with_vllm_defaults,
)
from .planner.arch import arch_from_config, check_arch_bounds
from .planner.failures import FailureKind
from .planner.gpus import UnknownGPUError, load_gpu_catalog
from .planner.lora import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, allowed_ranks
from .planner.report import render_plan_text
from .planner.speculative import (
    Speculation,
    SpeculativeConfigError,
    parse_speculative_config,
    with_draft_arch,
)
from .planner.versions import NEWEST_KNOWN_VERSION, ImageVersion, image_version, parse_version
from .render.cache import CacheSettings
from .render.flags import cli_flag_table

if TYPE_CHECKING:
    from .planner.multinode import MultiNodePlan


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    json_errors = False  # set by main() when the command line asks for -o json

    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage + message by default)
        if _Parser.json_errors:
            self.exit(2, _json_error(f"{self.prog}: error: {message}", 2) + "\n")
        self.exit(2, f"{self.prog}: error: {message}\n")


def _json_error(message: str, code: int) -> str:
    return json.dumps({"error": {"message": message, "exit_code": code}})


def _wants_json(argv: Sequence[str]) -> bool:
    """Whether the command line asks for `-o json` (looked at before parsing, so parse errors are JSON too)."""
    words = list(argv)
    if "--" in words:
        words = words[:words.index("--")]
    for i, word in enumerate(words):
        if word in ("-o", "--output") and i + 1 < len(words) and words[i + 1] == "json":
            return True
        if word in ("-ojson", "--output=json"):
            return True
    return False


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _utilization(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


#: `--max-model-len auto` (and -1): vLLM fits the longest context whose KV cache fits (0.14.0+, the flag table says)
AUTO = "auto"


def _model_len_or_auto(text: str) -> int | str:
    """`--max-model-len` as vLLM reads it: a length (32k, 32K) or `auto` / -1 (auto-fit)."""
    if text.strip().lower() in (AUTO, "-1"):
        return AUTO
    return _model_len(text)


def _model_len(text: str) -> int:
    """vLLM accepts human-readable lengths: 32k = 32000, 32K = 32768."""
    raw = text.strip()
    multiplier = 1
    if raw[-1:] in ("k", "m"):
        multiplier = 1000 if raw[-1] == "k" else 1_000_000
        raw = raw[:-1]
    elif raw[-1:] in ("K", "M"):
        multiplier = 1024 if raw[-1] == "K" else 1024 * 1024
        raw = raw[:-1]
    try:
        value = int(float(raw) * multiplier)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a token count like 8192 or 32k, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


# The values spec.flags admits (one vocabulary for the CLI and the CRD); "none" plans an unquantized checkpoint.
KV_DTYPES: tuple[str, ...] = get_args(KVCacheDType)
DTYPES: tuple[str, ...] = get_args(ModelDType)
QUANTIZATIONS: tuple[str, ...] = (*QUANTIZATION_METHODS, "none")
BLOCK_SIZES: tuple[int, ...] = get_args(BlockSize)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vllm-operator", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("plan", help="plan vLLM flags for a model on a GPU and say whether it fits",
                       description="Plan vLLM flags for a model on a GPU. Flags given here are pinned; the planner "
                                   "chooses the rest. Exit 0 fits, 1 does not fit, 2 bad input.")
    p.add_argument("--model", required=True, help="Hugging Face id, catalog alias, directory or config.json path")
    p.add_argument("--pack", action="store_true",
                   help="several models on shared GPUs: `plan --pack --gpu G --model A --model B[:context=N,"
                        "concurrency=N,memory=GiB,name=X] ...` (see `plan --pack --help`)")
    p.add_argument("--revision", help="model revision on the hub")
    p.add_argument("--gpu", required=True, help="catalog name, alias, GFD product label, or a size like 24GB")
    p.add_argument("--gpu-count", type=_positive_int, default=None,
                   help="GPUs per node one replica may use (default 1, or the pinned TP x PP)")
    p.add_argument("--nodes", type=_positive_int, default=1,
                   help="nodes one replica may span (default 1; more plans vLLM's multi-node mode on a "
                        "LeaderWorkerSet when one node's GPUs do not fit)")
    p.add_argument("--gpu-free-gib", type=_non_negative, help="free memory per GPU when others hold some")
    _add_vllm_flags(p)
    p.add_argument("--vllm-version", help="vLLM release the image runs, e.g. 0.11.0 (wins over --image's tag; "
                                          f"default: the tag, else the newest known, {NEWEST_KNOWN_VERSION})")
    p.add_argument("--image", help="vLLM image; its tag gives the version (e.g. vllm/vllm-openai:v0.11.0); a digest, "
                                   "mirror tag or latest plans for the newest known release unless --vllm-version "
                                   "says which")
    p.add_argument("--context-length", type=_model_len, help="typical p99 prompt+output tokens")
    p.add_argument("--concurrency", type=_positive_int, help="peak concurrent requests")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--as-is", action="store_true",
                   help="predict the command as it stands: every flag not given at vLLM's own default for that "
                        "release and GPU (nothing is chosen); answers whether vLLM starts and with how many KV tokens")
    p.add_argument("-o", "--output", choices=("text", "json", "yaml", "manifest"), default="text",
                   help="manifest: a VLLMService with the planned flags pinned, ready for kubectl apply")
    p.set_defaults(func=cmd_plan)

    c = sub.add_parser("check", help="predict what vLLM does with a pasted command line: "
                                     "check --gpu L4 -- vllm serve MODEL FLAGS...",
                       description="Predict a pasted `vllm serve MODEL FLAGS...` (or `python -m "
                                   "vllm.entrypoints.openai.api_server --model MODEL ...`) on a GPU, as it stands: "
                                   "flags not given take vLLM's defaults. Every flag the command's vLLM release "
                                   "accepts is accepted (read from its own parser; those whose memory effect is not "
                                   "modelled are listed); one it does not have is named with the release that added "
                                   "or removed it (exit 2). Exit 0 starts, 1 fails, 2 bad input.")
    c.add_argument("--gpu", required=True, help="catalog name, alias, GFD product label, or a size like 24GB")
    c.add_argument("--gpu-count", type=_positive_int, default=None, help="GPUs (default: TP x PP of the command)")
    c.add_argument("--gpu-free-gib", type=_non_negative, help="free memory per GPU when others hold some")
    c.add_argument("--vllm-version", help="vLLM release the command runs (default: --image's tag, else newest known)")
    c.add_argument("--image", help="vLLM image; its tag gives the version")
    c.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    c.add_argument("command_line", nargs=argparse.REMAINDER, help="-- vllm serve MODEL FLAGS...")
    c.set_defaults(func=cmd_check)

    r = sub.add_parser("run", help="run the operator (kopf) against the current kubeconfig")
    r.add_argument("--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)")
    r.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    r.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    r.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL (empty disables)")
    r.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0 disables)")
    r.add_argument("--peering", default=None,
                   help="kopf peering name, so that of several replicas only one acts (needs the peering CRDs and "
                        "object, which the Helm chart installs); default: standalone")
    r.add_argument("--standalone", action="store_true", help="no peering, even if --peering is given")
    r.add_argument("--priority", type=int, default=None,
                   help="peering priority; default: derived from $POD_ID so that replicas differ")
    r.add_argument("--default-image", default=os.environ.get("VLLM_OPERATOR_DEFAULT_IMAGE"),
                   help="vLLM image for VLLMServices that name none (env VLLM_OPERATOR_DEFAULT_IMAGE)")
    r.add_argument("--prometheus-url", default=os.environ.get("VLLM_OPERATOR_PROMETHEUS_URL"),
                   help="Prometheus to read vLLM's metrics from (env VLLM_OPERATOR_PROMETHEUS_URL)")
    r.add_argument("--prometheus-selector", default=os.environ.get("VLLM_OPERATOR_PROMETHEUS_SELECTOR"),
                   help="PromQL label matcher template for a service's vLLM series, with {namespace}, {service}, "
                        "{service_regex}, {model}, {pods_regex} (default: namespace and the serving pods' names)")
    r.add_argument("--metrics-interval", type=_positive_int, default=60,
                   help="seconds between reads of vLLM's metrics from Prometheus (default 60)")
    r.add_argument("--gpu-catalog", default=os.environ.get("VLLM_OPERATOR_GPU_CATALOG"),
                   help="YAML list of GPU catalog overrides: extra SKUs or per-GPU fields such as "
                        "default_utilization (env VLLM_OPERATOR_GPU_CATALOG)")
    r.add_argument("--model-cache-mode", choices=("auto", "persistent", "ephemeral"),
                   default=os.environ.get("VLLM_OPERATOR_MODEL_CACHE_MODE", "auto"),
                   help="model cache of services without spec.modelCache: a PersistentVolumeClaim when the cluster "
                        "has a default StorageClass (auto), always (persistent) or an emptyDir (ephemeral)")
    r.add_argument("--model-cache-storage-class", default=os.environ.get("VLLM_OPERATOR_MODEL_CACHE_STORAGE_CLASS"),
                   help="StorageClass of the default cache claims (default: the cluster's default class)")
    r.add_argument("--model-cache-access-mode", choices=("ReadWriteOnce", "ReadWriteMany"),
                   default=os.environ.get("VLLM_OPERATOR_MODEL_CACHE_ACCESS_MODE", "ReadWriteOnce"),
                   help="ReadWriteMany: one claim per model and namespace, shared by its services and their pods; "
                        "ReadWriteOnce: one claim per single-pod service")
    r.add_argument("--model-cache-size", default=os.environ.get("VLLM_OPERATOR_MODEL_CACHE_SIZE"),
                   help="size of the default cache claims (default: 1.5 x the checkpoint + 10Gi)")
    r.add_argument("--model-cache-download-init", action=argparse.BooleanOptionalAction,
                   default=os.environ.get("VLLM_OPERATOR_MODEL_CACHE_DOWNLOAD_INIT", "true").lower() in _TRUE,
                   help="fill a persistent model cache with a model-download init container before vLLM starts, so "
                        "vLLM's startup probe budgets no download (default: on)")
    r.add_argument("--verbose", "-v", action="store_true")
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("demo", help="run the operator in a simulated GPU cluster and show what happens")
    d.add_argument("--keep-running", action="store_true", help="leave the cluster up and print a kubeconfig")
    d.add_argument("--examples", default=None, help="directory of VLLMService manifests (default: examples/)")
    d.add_argument("--speed", type=float, default=None, help="simulated seconds per real second")
    d.set_defaults(func=cmd_demo)

    s = sub.add_parser("completion", help="print a shell completion script (bash: eval \"$(vllm-operator "
                       "completion bash)\"; zsh: vllm-operator completion zsh > ~/.zfunc/_vllm-operator)")
    s.add_argument("shell", choices=("bash", "zsh"))
    s.set_defaults(func=cmd_completion)
    return parser


def cmd_completion(args: argparse.Namespace) -> int:
    """The completion script for every subcommand, option and choice, generated from this parser (shtab)."""
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0


def _add_vllm_flags(p: argparse.ArgumentParser) -> None:
    """The vLLM flags that change memory, as vLLM spells them (shared by `plan` and `check`)."""
    p.add_argument("--tensor-parallel-size", "-tp", type=_positive_int)
    p.add_argument("--pipeline-parallel-size", "-pp", type=_positive_int)
    p.add_argument("--data-parallel-size", "-dp", type=_positive_int,
                   help="engines in one server, each TP x PP GPUs with its own KV cache (MoE layers span them all)")
    p.add_argument("--enable-expert-parallel", action="store_true", default=None,
                   help="MoE layers hold whole experts per TP x DP rank instead of a slice of every expert")
    p.add_argument("--gpu-memory-utilization", type=_utilization)
    p.add_argument("--max-model-len", type=_model_len_or_auto,
                   help="the longest prompt + output (8192, 32k); auto or -1: vLLM fits the longest whose KV cache "
                        "fits (0.14.0+), and the plan says which length that is")
    p.add_argument("--max-num-seqs", type=_positive_int)
    p.add_argument("--max-num-batched-tokens", type=_positive_int)
    p.add_argument("--kv-cache-dtype", choices=KV_DTYPES)
    p.add_argument("--quantization", "-q", choices=QUANTIZATIONS)
    p.add_argument("--dtype", choices=DTYPES)
    p.add_argument("--enforce-eager", action="store_true", default=None)
    p.add_argument("--block-size", type=int, choices=BLOCK_SIZES)
    p.add_argument("--cpu-offload-gb", type=_non_negative)
    p.add_argument("--kv-cache-memory-bytes", type=_memory_bytes,
                   help="KV cache size per GPU (bytes, or 8G / 8GiB style): vLLM then skips sizing it from "
                        "--gpu-memory-utilization")
    p.add_argument("--speculative-config", type=_speculative_config, metavar="JSON",
                   help='speculative decoding as vLLM takes it, e.g. \'{"method": "eagle3", "model": "…", '
                        '"num_speculative_tokens": 3}\'; a draft from the model catalog is sized from its config')
    p.add_argument("--enable-lora", action="store_true", default=None,
                   help="serve LoRA adapters: vLLM reserves --max-loras slots at --max-lora-rank on every linear "
                        "layer while the model loads (taken from the KV cache)")
    p.add_argument("--max-loras", type=_lora_slots, help="adapters in one batch: GPU slots (vLLM's default 1)")
    p.add_argument("--max-lora-rank", type=_positive_int,
                   help="the largest adapter rank (vLLM's default 16; the choices depend on the release)")
    p.add_argument("--lora-modules", nargs="+", type=_lora_module, metavar="NAME=PATH",
                   help="adapters loaded at startup, as vLLM takes them (name=path or JSON); their weights live on "
                        "the CPU until used, the GPU slots are --max-loras")


#: vLLM flags that do not change GPU memory at startup: accepted by `check` and listed as such.
NO_MEMORY_EFFECT = frozenset({
    "--host", "--port", "--uds", "--api-key", "--served-model-name", "--trust-remote-code", "--revision",
    "--code-revision", "--tokenizer", "--tokenizer-revision", "--tokenizer-mode", "--chat-template",
    "--response-role", "--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser", "--download-dir",
    "--load-format", "--seed", "--disable-log-requests", "--disable-log-stats", "--enable-log-requests",
    "--uvicorn-log-level", "--allowed-origins", "--allowed-methods", "--allowed-headers", "--root-path",
    "--ssl-keyfile", "--ssl-certfile", "--max-log-len", "--disable-fastapi-docs", "--enable-request-id-headers",
    "--hf-token", "--hf-overrides", "--generation-config", "--max-logprobs", "--disable-frontend-multiprocessing",
    "--enable-prompt-tokens-details", "--enable-server-load-tracking", "--distributed-executor-backend",
    "--worker-use-ray", "--swap-space", "--middleware", "--prompt-adapters", "--config-format",
    "--guided-decoding-backend", "--structured-outputs-config", "--otlp-traces-endpoint",
})
#: Of those, the ones that take no value.
_NO_VALUE = frozenset({
    "--trust-remote-code", "--enable-auto-tool-choice", "--disable-log-requests", "--disable-log-stats",
    "--enable-log-requests", "--disable-fastapi-docs", "--enable-request-id-headers",
    "--disable-frontend-multiprocessing", "--enable-prompt-tokens-details", "--enable-server-load-tracking",
    "--worker-use-ray",
})


def _memory_bytes(text: str) -> int:
    """`--kv-cache-memory-bytes` as vLLM's human_readable_int reads it: 1000-based k/m/g/t, 1024-based K/M/G/T."""
    raw = text.strip()
    decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    try:
        if raw[-1:] in decimal:
            value = int(float(raw[:-1]) * decimal[raw[-1]])
        elif raw[-1:] in binary:  # vLLM refuses decimals with a binary suffix
            value = int(raw[:-1]) * binary[raw[-1]]
        else:
            value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a byte count like 8000000000, 8g or 8G, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _speculative_config(text: str) -> Speculation:
    """`--speculative-config JSON`, read as vLLM reads it; a draft in the model catalog brings its config.json."""
    try:
        spec = parse_speculative_config(text)
    except SpeculativeConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    files = find_in_catalog(spec.model) if spec.model else None
    return with_draft_arch(spec, files.config if files else None, total_size=files.total_size if files else None)


def _lora_slots(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_LORA_SLOTS:
        raise argparse.ArgumentTypeError(f"at most {MAX_LORA_SLOTS} (spec.lora.maxLoras' bound), got {value}")
    return value


def _lora_module(text: str) -> tuple[str, str]:
    """One `--lora-modules` value as vLLM reads it: `name=path`, or JSON with "name" and "path"."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {text!r}") from None
        name, path = (data.get("name"), data.get("path")) if isinstance(data, dict) else (None, None)
        if not (isinstance(name, str) and name and isinstance(path, str) and path):
            raise argparse.ArgumentTypeError(f'JSON needs "name" and "path" strings: {text!r}')
        return name, path
    name, eq, path = text.partition("=")
    if not (eq and name and path):
        raise argparse.ArgumentTypeError(f"expected name=path (or JSON), got {text!r}")
    return name, path


#: The LoRA flags that only act with --enable-lora (vLLM ignores them without it).
_LORA_SIZING = ("max_loras", "max_lora_rank", "lora_modules")


def lora_request(args: argparse.Namespace, version: str, *, adapters_as_spec: bool) -> LoRASpec | None:
    """--enable-lora and its flags as spec.lora (None without --enable-lora). A rank the release does not accept is
    bad input. `adapters_as_spec`: the adapters become spec.lora.adapters (`plan`, whose manifest names them: a
    Hugging Face id or an absolute path); `check` only counts them (vLLM also resolves relative paths)."""
    if not getattr(args, "enable_lora", None):
        return None
    rank = args.max_lora_rank
    if rank is not None and rank not in allowed_ranks(version):
        raise UsageError(f"--max-lora-rank {rank}: vLLM {version} accepts "
                         f"{', '.join(map(str, allowed_ranks(version)))}")
    adapters: list[LoRAAdapter] = []
    for name, path in (args.lora_modules or []) if adapters_as_spec else []:
        try:
            adapters.append(LoRAAdapter(name=name, source=path))
        except ValueError:
            raise UsageError(f"--lora-modules {name}={path}: the name must be letters, digits, '.', '_' or '-' and "
                             "the path a Hugging Face repository id or an absolute path") from None
    return LoRASpec(adapters=adapters, max_rank=rank, max_loras=args.max_loras or DEFAULT_MAX_LORAS)


def ignored_lora_flags(args: argparse.Namespace) -> list[str]:
    """The LoRA flags given without --enable-lora (vLLM ignores them)."""
    if getattr(args, "enable_lora", None):
        return []
    return [vllm_cli_flag(name) for name in _LORA_SIZING if getattr(args, name, None)]


def _pinned(args: argparse.Namespace) -> PinnedFlags:
    quant = None if args.quantization in (None, "none") else args.quantization
    return PinnedFlags(
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        data_parallel_size=args.data_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_dtype=args.kv_cache_dtype,
        quantization=quant,
        dtype=args.dtype,
        enforce_eager=args.enforce_eager,
        block_size=args.block_size,
        cpu_offload_gb=args.cpu_offload_gb,
        kv_cache_memory_bytes=getattr(args, "kv_cache_memory_bytes", None),
        enable_prefix_caching=args.prefix_caching,
        speculative_config=_pinned_speculation(getattr(args, "speculative_config", None)),
    )


def _pinned_speculation(speculation: Speculation | None) -> SpeculativeConfig | None:
    """--speculative-config as spec.flags.speculativeConfig pins it (the planner reads the parsed `Speculation`,
    passed as `PlanRequest.speculation`; keys the API model lacks still reach vLLM through the plan's flags)."""
    if speculation is None:
        return None
    try:
        return SpeculativeConfig(method=speculation.method, num_speculative_tokens=speculation.num_speculative_tokens,
                                 model=speculation.model,
                                 draft_tensor_parallel_size=speculation.draft_tensor_parallel_size)
    except ValueError:
        return None  # e.g. a method the CRD does not list: planned and rendered from the parsed speculation


def _version(args: argparse.Namespace) -> ImageVersion | None:
    """--vllm-version wins (as spec.vllmVersion does); else --image's tag; a digest, mirror tag or 'latest' plans for
    the newest known release and says so in the reasons."""
    if not args.vllm_version and not args.image:
        return None
    return image_version(args.image, args.vllm_version, field="--vllm-version")


def build_request(args: argparse.Namespace) -> PlanRequest:
    from .sources import load_model_files

    files = load_model_files(args.model, revision=args.revision)
    # the operator's bounds hold for a local file or a hub config too: one plan stays bounded in time and memory
    check_arch_bounds(files.config, model_id=files.model_id)
    arch = arch_from_config(files.config, model_id=files.model_id, total_size=files.total_size,
                            total_size_estimated=files.total_size_estimated)
    gpu = load_gpu_catalog().get(args.gpu)
    pinned = _pinned(args)
    count = _gpus_per_node(args, pinned)
    if args.gpu_free_gib is not None and args.gpu_free_gib > gpu.reported_gib:
        raise UsageError(f"--gpu-free-gib {args.gpu_free_gib} is more than the {gpu.name}'s "
                         f"{gpu.reported_gib:.2f} GiB")
    workload = Workload(context_length=args.context_length, concurrency=args.concurrency,
                        prefix_caching=args.prefix_caching)
    version = _version(args)
    release = version.version if version else NEWEST_KNOWN_VERSION
    from_check = bool(getattr(args, "from_check", False))  # a pasted command: vLLM ignores them, so do we
    ignored = ignored_lora_flags(args)
    if ignored and not from_check:
        raise UsageError(f"{', '.join(ignored)}: no effect without --enable-lora (vLLM ignores "
                         f"{'it' if len(ignored) == 1 else 'them'}); add --enable-lora")
    lora = lora_request(args, release, adapters_as_spec=not from_check)
    request = PlanRequest(arch=arch, gpu=gpu, gpu_count=count, pinned=pinned, workload=workload,
                          vllm_version=version.version if version else None,
                          version_note=version.note if version else "", gpu_free_gib=args.gpu_free_gib,
                          speculation=getattr(args, "speculative_config", None), lora=lora)
    if getattr(args, "as_is", False):
        request = with_vllm_defaults(request)  # vLLM's own default for every flag not given: nothing is chosen
    return request


def _gpus_per_node(args: argparse.Namespace, pinned: PinnedFlags) -> int:
    """--gpu-count is GPUs per node; without it a pinned TP x PP (x DP) is taken as one node of that many GPUs."""
    if args.gpu_count is not None:
        return int(args.gpu_count)
    return (pinned.tensor_parallel_size or 1) * (pinned.pipeline_parallel_size or 1) * (pinned.data_parallel_size or 1)


def plan_document(result: Plan) -> dict[str, Any]:
    """The machine-readable plan (`-o json|yaml`)."""
    pred = result.prediction
    return {
        "model": result.model_id,
        "gpu": result.gpu,
        "gpu_count": result.gpu_count,
        "vllm_version": result.vllm_version,
        "fits": result.fits,
        "failure": {"kind": str(result.failure.kind), "message": result.failure.message} if result.failure else None,
        "flags": result.flags,
        "max_model_len_auto": result.max_model_len_auto,  # rendered as `auto`; flags.max_model_len: what vLLM picks
        "args": result.args(),
        "pinned": result.pinned,
        "memory": result.memory.model_dump(),
        "kv_cache_tokens": pred.kv_cache_tokens,
        "kv_bytes_per_token": pred.kv_bytes_per_token,
        "num_gpu_blocks": pred.num_blocks,
        "max_concurrency": pred.max_concurrency,
        "estimated_max_model_len": pred.estimated_max_model_len,
        "kv_fraction_of_physical_limit": result.kv_fraction,
        "reasons": result.reasons,
        "options": [option.model_dump() for option in result.options],
    }


def as_is_answer(result: Plan) -> str:
    """What vLLM would do with the command as it stands, in the words of its startup log."""
    pred = result.prediction
    auto = next((r for r in result.reasons if r.startswith("max-model-len auto:")), "") \
        if result.max_model_len_auto else ""
    if result.failure is None:
        return (f"vLLM {result.vllm_version} would start: GPU KV cache size: {pred.kv_cache_tokens:,} tokens; "
                f"Maximum concurrency for {result.flags.get('max_model_len'):,} tokens per request: "
                f"{pred.max_concurrency:.2f}x" + (f"\n{auto}" if auto else ""))
    return f"vLLM {result.vllm_version} would fail ({result.failure.kind}); it would print: {result.failure.message}"


def manifest_document(result: Plan, args: argparse.Namespace, spread: MultiNodePlan | None = None) -> dict[str, Any]:
    """A VLLMService with the planned flags pinned, for `kubectl apply -f -`; a plan spanning nodes asks
    gpu.count GPUs per node and gpu.maxNodes nodes."""
    request_gpu = load_gpu_catalog().get(args.gpu)
    name = "".join(ch if ch.isalnum() else "-" for ch in result.model_id.rsplit("/", 1)[-1].lower()).strip("-")
    flags: dict[str, Any] = {}
    lora = lora_request(args, result.vllm_version, adapters_as_spec=True)
    for snake, value in result.rendered_flags().items():  # `maxModelLen: auto` stays auto
        if lora is not None and snake in ("enable_lora", *_LORA_SIZING):
            continue  # spec.lora says them
        if snake == "speculative_config" and isinstance(value, str):
            value = {to_camel(k): v for k, v in json.loads(value).items()}  # spec.flags.speculativeConfig
        if snake in PinnedFlags.model_fields and value is not None:
            flags[flag_key(snake)] = value
    spec: dict[str, Any] = {
        "model": {"name": result.model_id},
        "gpu": {"product": request_gpu.gfd_products[0] if request_gpu.gfd_products else request_gpu.name,
                "count": result.gpu_count},
        "image": args.image or f"vllm/vllm-openai:v{result.vllm_version}",
        "flags": flags,
    }
    if lora is not None:
        spec["lora"] = lora.model_dump(by_alias=True, exclude_none=True)
    if spread is not None and spread.split.nodes > 1:
        spec["gpu"]["count"] = spread.split.gpus_per_node
        spec["gpu"]["maxNodes"] = spread.split.nodes
    if spec["gpu"]["count"] > DEFAULT_GPU_MAX_COUNT:
        spec["gpu"]["maxCount"] = spec["gpu"]["count"]
    if args.image and args.vllm_version:
        spec["vllmVersion"] = result.vllm_version
    if getattr(args, "extra_args", None):
        spec["extraArgs"] = list(args.extra_args)
    if args.context_length or args.concurrency:
        spec["workload"] = {k: v for k, v in (("contextLength", args.context_length),
                                               ("concurrency", args.concurrency)) if v}
    return {"apiVersion": API_VERSION, "kind": "VLLMService", "metadata": {"name": name[:63] or "vllm"},
            "spec": spec}


def plan_vllm_args(args: argparse.Namespace) -> CheckedFlags:
    """`plan`'s words that are none of its own options: vLLM flags of the release, passed through unplanned (the
    manifest carries them as spec.extraArgs); a flag the release lacks, or one `plan` plans under its own name, is
    bad input."""
    version = _version(args)
    release = version.version if version else NEWEST_KNOWN_VERSION
    read = read_flags(list(getattr(args, "vllm_args", None) or []), release)
    if read.modelled:
        read.refused.append(f"{' '.join(read.modelled)}: `plan` takes this as its own option (see vllm-operator "
                            "plan --help; --prefix-caching for --enable-prefix-caching)")
    if args.output == "manifest":
        managed = [w for w in read.passed if managed_flag_of(w, PinnedFlags.model_fields)]
        if managed:
            read.refused.append(f"{', '.join(managed)}: the operator sets this (spec.model, spec.service, "
                                "spec.lora); it cannot go into the manifest's extraArgs")
    if read.refused:
        raise UsageError("; ".join(dict.fromkeys(read.refused)))
    return read


def cmd_plan(args: argparse.Namespace) -> int:
    from .planner.multinode import plan_across_nodes

    passed = plan_vllm_args(args)
    args.extra_args = passed.passed
    if args.output == "text" and passed.passed:
        if passed.no_effect:
            print(f"Not modelled (no effect on GPU memory at startup): {', '.join(sorted(set(passed.no_effect)))}")
        if passed.not_modelled:
            print(f"Not modelled (any effect on GPU memory is left out of the plan): "
                  f"{', '.join(sorted(set(passed.not_modelled)))}")
    request = build_request(args)
    spread = plan_across_nodes(request, gpus_per_node=request.gpu_count, max_nodes=args.nodes)

    def without(req: PlanRequest) -> Plan:
        return plan_across_nodes(req, gpus_per_node=req.gpu_count, max_nodes=args.nodes).plan

    return _print_plan(spread.plan, args, spread, lora_effect(request, spread.plan, without))


#: The flags spec.lora / --enable-lora add to a plan.
_LORA_FLAGS = frozenset({"enable_lora", *_LORA_SIZING})


def without_lora(request: PlanRequest, result: Plan) -> PlanRequest:
    """The same question with LoRA off and every flag `result` chose pinned: what the adapter slots cost."""
    chosen = {name: value for name, value in result.flags.items()
              if name in PinnedFlags.model_fields and name not in _LORA_FLAGS and name != "speculative_config"}
    pinned = request.pinned.model_copy(update={**chosen, "enable_lora": None, "max_lora_rank": None})
    return request.model_copy(update={"lora": None, "pinned": pinned})


def lora_effect(request: PlanRequest, result: Plan, replan: Callable[[PlanRequest], Plan]) -> dict[str, Any] | None:
    """With --enable-lora: the slots, what they take per GPU and the KV cache with them and without (the same
    question with LoRA off and every flag the plan chose pinned); None without LoRA."""
    if request.lora is None:
        return None
    bare = replan(without_lora(request, result))
    refused = result.failure is not None and result.failure.kind is FailureKind.INVALID_ARGUMENT and (
        bare.failure is None or bare.failure.kind is not FailureKind.INVALID_ARGUMENT)
    return {
        "refused": result.failure.message if refused and result.failure else None,
        "max_loras": result.flags.get("max_loras", DEFAULT_MAX_LORAS),
        "max_lora_rank": result.flags.get("max_lora_rank", DEFAULT_MAX_LORA_RANK),
        "adapter_bytes_per_gpu": result.lora_bytes,
        "adapter_gib_per_gpu": round(result.lora_bytes / 2**30, 2),
        "kv_cache_tokens": result.prediction.kv_cache_tokens,
        "kv_cache_tokens_without_lora": bare.prediction.kv_cache_tokens,
    }


def lora_effect_text(effect: dict[str, Any]) -> str:
    if effect["refused"]:
        return (f"LoRA: vLLM refuses --enable-lora for this model (what it prints is above); without LoRA at the "
                f"same flags the KV cache would hold {effect['kv_cache_tokens_without_lora']:,} tokens.")
    return (f"LoRA: {effect['max_loras']} adapter slot(s) at rank {effect['max_lora_rank']} take "
            f"{effect['adapter_gib_per_gpu']:.2f} GiB per GPU (in the weights above); KV cache with them: "
            f"{effect['kv_cache_tokens']:,} tokens, without LoRA at the same flags: "
            f"{effect['kv_cache_tokens_without_lora']:,} tokens.")


def _print_plan(result: Plan, args: argparse.Namespace, spread: MultiNodePlan | None = None,
                lora: dict[str, Any] | None = None) -> int:
    """Print `result` as asked; `spread` (from `plan`, not `check`) adds the multi-node layout (issue 13), `lora`
    what the adapter slots cost (`lora_effect`)."""
    from .planner.multinode import multinode_document, render_multinode_text

    as_is = bool(getattr(args, "as_is", False))
    if args.output == "manifest":
        if not result.fits:
            raise PlanDoesNotFit(f"{result.model_id} does not fit {result.gpu_count}× {result.gpu}; no manifest "
                                 "(run without -o manifest for the arithmetic and the options)")
        print(yaml.safe_dump(manifest_document(result, args, spread), sort_keys=False), end="")
    elif args.output in ("json", "yaml"):
        document = plan_document(result)
        if spread is not None:
            document.update(multinode_document(spread))
        if as_is:
            document["as_is"] = as_is_answer(result)
        if lora is not None:
            document["lora"] = lora
        if getattr(args, "flags_accepted", None) is not None:
            document["flags_accepted"] = args.flags_accepted
        if args.output == "json":
            print(json.dumps(document, indent=2))
        else:
            print(yaml.safe_dump(document, sort_keys=False), end="")
    else:
        text = render_multinode_text(spread) if spread is not None else render_plan_text(result)
        text = as_is_answer(result) + "\n\n" + text if as_is else text
        print(text + ("\n\n" + lora_effect_text(lora) if lora is not None else ""))
    return 0 if result.fits else 1


class PlanDoesNotFit(Exception):
    """The plan does not fit and the output asked for cannot be made: one line on stderr, exit code 1."""


_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")


def parse_command_line(words: Sequence[str]) -> tuple[str, list[str]]:
    """(model, flags) of `vllm serve MODEL FLAGS...` or `python -m vllm.entrypoints.openai.api_server --model M ...`."""
    words = [w for w in words if w != "\\"]
    if words and words[0] == "--":
        words = words[1:]
    if len(words) >= 2 and words[0].rsplit("/", 1)[-1] == "vllm" and words[1] == "serve":
        rest = words[2:]
    elif len(words) >= 3 and words[0].rsplit("/", 1)[-1].startswith("python") and words[1] == "-m" \
            and words[2] in _SERVER_MODULES:
        rest = words[3:]
    else:
        raise UsageError("expected a vLLM command line after --: vllm serve MODEL FLAGS... "
                         "(or python -m vllm.entrypoints.openai.api_server --model MODEL ...)")
    model = None
    if rest and not rest[0].startswith("-"):
        model, rest = rest[0], rest[1:]
    flags: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        name, eq, value = word.partition("=")
        if name.startswith("--"):
            name = canonical_cli_flag(name)  # vLLM accepts --max_model_len too
        if name == "--model":
            if eq:
                model = value
            elif i + 1 < len(rest):
                model = rest[i + 1]
                i += 1
            i += 1
            continue
        flags.append(name + (eq + value if eq else ""))
        i += 1
    if not model:
        raise UsageError("the command line names no model: vllm serve MODEL FLAGS...")
    return model, flags


def _check_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vllm-operator check: the pasted command", add_help=False)
    _add_vllm_flags(parser)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--revision")
    return parser


def _flag_like(word: str) -> bool:
    """Whether a word is a flag rather than a value (-1 and -0.5 are values, as argparse reads them)."""
    if not word.startswith("-") or word == "-":
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False


@functools.lru_cache(maxsize=1)
def _modelled_flags() -> dict[str, str]:
    """The flags `check` plans (its own parser reads their values): option string → the long flag."""
    out: dict[str, str] = {}
    for action in _check_parser()._actions:
        longs = [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
        for option in action.option_strings:
            out[option] = option if option.startswith("--") else (longs[0] if longs else option)
    return out


class CheckedFlags(NamedTuple):
    """A pasted command's flags read against its release's parser (catalog/vllm_flags_cli.yaml)."""

    modelled: list[str]      # for `check`'s own parser: the flags whose memory effect is planned
    no_effect: list[str]     # accepted; no effect on GPU memory at startup
    not_modelled: list[str]  # accepted; an effect on memory this checker does not model (or may not)
    refused: list[str]       # sentences: flags (or values) the release does not have
    load_format: str
    passed: list[str]        # the accepted, unplanned flags with their values, as written (for spec.extraArgs)
    values: dict[str, list[str]]  # the accepted, unplanned flags (long names) → their values
    planned_as: list[str]    # sentences: a flag planned as the flag with the same memory effect


def read_flags(words: Sequence[str], release: str) -> CheckedFlags:
    """Sort a command line's flags by what `check` does with them, as `vllm serve` of `release` reads them: every
    flag the release has is accepted, a flag it lacks is refused with the release that added or removed it."""
    table = cli_flag_table()
    covered = table.covers(release)
    modelled_options = _modelled_flags()
    out = CheckedFlags([], [], [], [], "auto", [], {}, [])
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not _flag_like(word):
            out.refused.append(f"{word!r} is not a flag (vllm serve takes the model as its only positional "
                               "argument)")
            continue
        if covered:
            read = table.read_word(word, release)
            flag, inline, takes, refusal = read.flag, read.inline, read.takes, read.refusal
        else:  # older than the table: what this checker knows of the flag
            name, eq, value = word.partition("=")
            flag, inline = name, (value if eq else None)
            flag = modelled_options.get(flag, flag)
            takes = "none" if flag in _NO_VALUE or _takes_no_value(flag) else "one"
            refusal = "" if flag in modelled_options or flag in NO_MEMORY_EFFECT else (
                f"{flag}: unknown to this checker for vLLM {release}, which is older than the flag table "
                f"({table.releases[0]} on)")
        values: list[str] = []
        if inline is None and takes != "none":
            while i < len(words) and not _flag_like(words[i]):
                values.append(words[i])
                i += 1
                if takes != "many":
                    break
        if refusal:
            out.refused.append(refusal)
        elif flag in modelled_options:
            if inline is not None:
                out.modelled.append(f"{flag}={inline}")
            elif len(values) == 1 and takes != "many":
                out.modelled.append(f"{flag}={values[0]}")  # "-1" stays a value
            else:
                out.modelled.extend([flag, *values])
        else:
            out.passed.extend([word, *values])
            out.values[flag] = [inline] if inline is not None else values
        if refusal or flag in modelled_options:
            continue
        if flag == "--load-format" and (inline if inline is not None else values[:1] or [""])[0] == "ipc_cache":
            out = out._replace(load_format="ipc_cache")  # weights held by a weight-cache daemon: vLLM 0.32+ takes
            # them out of its budget
        elif flag in NO_MEMORY_EFFECT or flag.startswith("--no-") and "--" + flag[5:] in NO_MEMORY_EFFECT:
            out.no_effect.append(flag)
        else:
            out.not_modelled.append(flag)
    return _host_memory_flags(out, release)


#: The release from which `--kv-offloading-size`'s native backend (OffloadingConnector) supports the hybrid KV-cache
#: manager (`class OffloadingConnector(KVConnectorBase_V1, SupportsHMA)`, 0.22.0+): before it, the connector the flag
#: creates turned the hybrid manager off (config/vllm.py), which changes the KV cache of sliding-window/hybrid models.
_OFFLOAD_KEEPS_HMA = (0, 22, 0)


def _host_memory_flags(read: CheckedFlags, release: str) -> CheckedFlags:
    """Accepted flags whose memory the code puts in host RAM, never on the GPU at startup (issue 23), moved from "effect
    not modelled" to "no effect on GPU memory at startup", each with the code that says so:
    `--mm-processor-cache-gb` (config/multimodal.py: the processor-output cache of each API and engine-core process);
    `--kv-offloading-size` with the native backend from 0.22.0 (config/vllm.py::_post_init_kv_transfer_config: an
    OffloadingConnector given `cpu_bytes_to_use` = size GiB of host memory; it supports the hybrid KV-cache manager, so
    the GPU KV cache is sized as without it). With `--kv-offloading-backend lmcache` (an LMCache server's memory, and a
    connector that may turn the hybrid manager off) or before 0.22.0 it stays "effect not modelled"."""
    moved: list[str] = []
    if "--mm-processor-cache-gb" in read.not_modelled:
        moved.append("--mm-processor-cache-gb")
    backend = read.values.get("--kv-offloading-backend", ["native"])
    if ("--kv-offloading-size" in read.not_modelled and backend[:1] in (["native"], [])
            and parse_version(release) >= _OFFLOAD_KEEPS_HMA):
        moved.append("--kv-offloading-size")
    if not moved:
        return read
    return read._replace(not_modelled=[f for f in read.not_modelled if f not in moved],
                         no_effect=[*read.no_effect, *moved])


def _planned_as_eager(read: CheckedFlags) -> CheckedFlags:
    """`-O0` / `--optimization-level 0` (0.12.0+, where the flag exists): vLLM applies OPTIMIZATION_LEVEL_00
    (config/vllm.py, unchanged to 0.33): cudagraph_mode NONE and, unless set otherwise, compilation mode NONE - what
    --enforce-eager sets. Planned as --enforce-eager unless --compilation-config says otherwise."""
    if read.values.get("--optimization-level") != ["0"] or "--compilation-config" in read.values:
        return read
    not_modelled = [f for f in read.not_modelled if f != "--optimization-level"]
    modelled = read.modelled if "--enforce-eager" in read.modelled else [*read.modelled, "--enforce-eager"]
    why = ("--optimization-level 0 planned as --enforce-eager (vLLM's optimization level 0 captures no CUDA graphs "
           "and compiles nothing, as --enforce-eager)")
    return read._replace(modelled=modelled, not_modelled=not_modelled, planned_as=[*read.planned_as, why])


def _planned_as_default_level(read: CheckedFlags) -> CheckedFlags:
    """`-O2` / `-O3` (`--optimization-level`, 0.12.0+): level 2 is vLLM's default, and OPTIMIZATION_LEVEL_03 equals
    OPTIMIZATION_LEVEL_02 in config/vllm.py of every release from 0.12.0 to 0.33.0 (same CUDA-graph mode,
    FULL_AND_PIECEWISE, and fusion passes; nothing else reads the level but `> O0`): planned as vLLM's defaults. `-O1`
    (PIECEWISE graphs only) stays "effect not modelled"."""
    level = read.values.get("--optimization-level")
    if level not in (["2"], ["3"]) or "--compilation-config" in read.values:
        return read
    not_modelled = [f for f in read.not_modelled if f != "--optimization-level"]
    why = (f"--optimization-level {level[0]} planned as vLLM's default (level 2; level 3 applies the same "
           "configuration: FULL_AND_PIECEWISE CUDA graphs, the same compilation passes)")
    return read._replace(not_modelled=not_modelled, planned_as=[*read.planned_as, why])


def _takes_no_value(flag: str) -> bool:
    for action in _check_parser()._actions:
        if flag in action.option_strings:
            return action.nargs == 0
    return False


def check_request(command_line: Sequence[str], *, gpu: str, gpu_count: int | None = None,
                  gpu_free_gib: float | None = None, vllm_version: str | None = None,
                  image: str | None = None) -> tuple[PlanRequest, argparse.Namespace, list[str]]:
    """`vllm-operator check`'s question as a request: the pasted command's flags pinned, vLLM's own defaults for the
    rest (as `plan --as-is`). Returns the request, the parsed flags and the flags with no memory effect; the parsed
    flags carry `not_modelled`, the accepted flags whose effect on memory is not planned.

    Every flag the command's release accepts (catalog/vllm_flags_cli.yaml, read from its own parser) is accepted;
    one it does not have is bad input that names the release that added or removed it.
    The accuracy benchmark (benchmarks/planner_accuracy.py) asks each record's question through this function."""
    model, words = parse_command_line(command_line)
    declared = image_version(image, vllm_version, field="--vllm-version") if (vllm_version or image) else None
    release = declared.version if declared else NEWEST_KNOWN_VERSION
    read = _planned_as_default_level(_planned_as_eager(read_flags(words, release)))
    parsed = _check_parser().parse_args(read.modelled)
    if parsed.max_model_len == AUTO and not cli_flag_table().accepts_value("--max-model-len auto", release):
        since = cli_flag_table().value_since("--max-model-len auto")
        read.refused.append(f"--max-model-len auto (or -1) was added in vLLM {since} (the command runs vLLM "
                            f"{release})")
    if read.refused:
        raise UsageError("; ".join(dict.fromkeys(read.refused)))
    parsed.model = model
    parsed.gpu = gpu
    tp, pp = parsed.tensor_parallel_size or 1, parsed.pipeline_parallel_size or 1
    dp = parsed.data_parallel_size or 1
    parsed.gpu_count = max(gpu_count or 1, tp * pp * dp)  # one node: build_request takes --gpu-count as given
    parsed.gpu_free_gib = gpu_free_gib
    parsed.vllm_version = vllm_version
    parsed.image = image
    parsed.context_length = None
    parsed.concurrency = None
    parsed.prefix_caching = parsed.enable_prefix_caching
    parsed.as_is = True
    parsed.from_check = True
    parsed.not_modelled = sorted(set(read.not_modelled))
    parsed.planned_as = read.planned_as
    no_effect = read.no_effect + ignored_lora_flags(parsed)
    request = build_request(parsed).model_copy(update={"load_format": read.load_format})
    if parsed.enable_chunked_prefill is not None:
        request = request.model_copy(update={"pinned": request.pinned.model_copy(
            update={"enable_chunked_prefill": parsed.enable_chunked_prefill})})
    return request, parsed, no_effect


def request_release(request: PlanRequest) -> str:
    return request.vllm_version or NEWEST_KNOWN_VERSION


def cmd_check(args: argparse.Namespace) -> int:
    request, parsed, no_effect = check_request(args.command_line, gpu=args.gpu, gpu_count=args.gpu_count,
                                               gpu_free_gib=args.gpu_free_gib, vllm_version=args.vllm_version,
                                               image=args.image)
    parsed.output = args.output
    result = plan(request)
    not_modelled = list(parsed.not_modelled)
    if args.output == "text":
        if no_effect:
            print(f"Not modelled (no effect on GPU memory at startup): {', '.join(sorted(set(no_effect)))}")
        if not_modelled:
            print(f"Not modelled (accepted by vLLM {request_release(request)}; any effect on GPU memory is left out "
                  f"of the prediction): {', '.join(not_modelled)}")
        for sentence in parsed.planned_as:
            print(sentence[0].upper() + sentence[1:] + ".")
    parsed.flags_accepted = {"no_memory_effect": sorted(set(no_effect)), "effect_not_modelled": not_modelled,
                             "planned_as": list(parsed.planned_as)}
    return _print_plan(result, parsed, lora=lora_effect(request, result, plan))


def cmd_run(args: argparse.Namespace) -> int:
    from .handlers.main import run_operator

    if args.all_namespaces and args.namespace:
        raise UsageError("use either --namespace or --all-namespaces, not both")
    return int(run_operator(
        namespaces=args.namespace,
        all_namespaces=args.all_namespaces or not args.namespace,
        kubeconfig=args.kubeconfig,
        liveness=args.liveness,
        metrics_port=args.metrics_port,
        peering=None if args.standalone else args.peering,
        verbose=args.verbose,
        prometheus_url=args.prometheus_url,
        gpu_catalog=args.gpu_catalog,
        priority=args.priority,
        default_image=args.default_image,
        metrics_interval=args.metrics_interval,
        prometheus_selector=args.prometheus_selector,
        model_cache=_cache_settings(args),
    ))


#: Words an environment variable uses for "on".
_TRUE = ("1", "on", "true", "yes")


def _cache_settings(args: argparse.Namespace) -> CacheSettings:
    return CacheSettings(mode=args.model_cache_mode, storage_class=args.model_cache_storage_class or None,
                         access_mode=args.model_cache_access_mode, size=args.model_cache_size or None,
                         download_init=bool(args.model_cache_download_init))


#: The simulator and the modules of its extra's dependencies (kmock, aiohttp, jsonschema, cel-python,
#: kubernetes-validate): one missing means the extra is not installed.
_SIM_MODULES = frozenset({"vllm_operator_sim", "kmock", "aiohttp", "jsonschema", "celpy", "kubernetes_validate"})


def cmd_demo(args: argparse.Namespace) -> int:
    # The simulator is its own package (vllm_operator_sim) with its own extra; the operator never depends on it.
    try:
        demo = importlib.import_module("vllm_operator_sim.demo")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in _SIM_MODULES:
            raise UsageError(
                f"the demo needs the simulated cluster ({exc.name} is not installed): "
                "pip install 'vllm-operator[sim]'"
            ) from None
        raise
    run_demo = demo.run_demo
    return int(run_demo(keep_running=args.keep_running, examples=args.examples, speed=args.speed))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_errors = _wants_json(words)
    if words[:1] == ["plan"] and "--pack" in words:  # several models on shared GPUs: cli_pack.py
        from .cli_pack import cmd_plan_pack

        args = argparse.Namespace(func=lambda _: cmd_plan_pack(words[1:]))
    else:
        args, unknown = parser.parse_known_args(words)
        if unknown and args.command != "plan":
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.vllm_args = unknown  # `plan`: other vLLM flags, checked against the release's own parser

    def fail(message: str, code: int) -> int:
        if _Parser.json_errors:
            print(_json_error(message, code), file=sys.stderr)
        else:
            print(message, file=sys.stderr)
        return code

    try:
        code: int = args.func(args)
        return code
    except (UsageError, UnknownGPUError, ArchError, VersionError) as exc:
        return fail(f"vllm-operator: error: {exc}", 2)
    except PlanDoesNotFit as exc:
        return fail(f"vllm-operator: {exc}", 1)
    except ValueError as exc:  # ModelSourceError and pydantic validation of inputs are ValueErrors
        return fail(f"vllm-operator: error: {_one_line(exc)}", 2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `vllm-operator plan … | head`
        sys.stderr.close()
        return 0


def _one_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else exc.__class__.__name__


if __name__ == "__main__":
    sys.exit(main())
