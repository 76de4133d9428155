"""`vllm-operator`: plan vLLM flags anywhere (`plan`), run the operator (`run`), show it working (`demo`).

Bad input never shows a traceback: one line naming the problem, exit code 2.
Exit codes of `plan`: 0 fits, 1 does not fit (the plan says why and what would), 2 bad input.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import yaml

from .planner import ArchError, PinnedFlags, Plan, PlanRequest, VersionError, Workload, plan
from .planner.arch import arch_from_config
from .planner.gpus import UnknownGPUError, load_gpu_catalog
from .planner.report import render_plan_text
from .planner.versions import NEWEST_KNOWN_VERSION, parse_version, version_from_image
from .render.cache import CacheSettings


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage + message by default)
        self.exit(2, f"{self.prog}: error: {message}\n")


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


KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "bfloat16", "float16")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
QUANTIZATIONS = ("awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "compressed-tensors", "bitsandbytes", "mxfp4",
                 "marlin", "modelopt", "fbgemm_fp8", "gguf", "experts_int8", "ptpc_fp8", "none")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vllm-operator", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("plan", help="plan vLLM flags for a model on a GPU and say whether it fits",
                       description="Plan vLLM flags for a model on a GPU. Flags given here are pinned; the planner "
                                   "chooses the rest. Exit 0 fits, 1 does not fit, 2 bad input.")
    p.add_argument("--model", required=True, help="Hugging Face id, catalog alias, directory or config.json path")
    p.add_argument("--revision", help="model revision on the hub")
    p.add_argument("--gpu", required=True, help="catalog name, alias, GFD product label, or a size like 24GB")
    p.add_argument("--gpu-count", type=_positive_int, default=1, help="GPUs one replica may use (default 1)")
    p.add_argument("--gpu-free-gib", type=_non_negative, help="free memory per GPU when others hold some")
    p.add_argument("--tensor-parallel-size", "-tp", type=_positive_int)
    p.add_argument("--pipeline-parallel-size", "-pp", type=_positive_int)
    p.add_argument("--gpu-memory-utilization", type=_utilization)
    p.add_argument("--max-model-len", type=_model_len)
    p.add_argument("--max-num-seqs", type=_positive_int)
    p.add_argument("--max-num-batched-tokens", type=_positive_int)
    p.add_argument("--kv-cache-dtype", choices=KV_DTYPES)
    p.add_argument("--quantization", "-q", choices=QUANTIZATIONS)
    p.add_argument("--dtype", choices=DTYPES)
    p.add_argument("--enforce-eager", action="store_true", default=None)
    p.add_argument("--block-size", type=_positive_int)
    p.add_argument("--cpu-offload-gb", type=_non_negative)
    p.add_argument("--vllm-version", help=f"vLLM release (default: newest known, {NEWEST_KNOWN_VERSION})")
    p.add_argument("--image", help="vLLM image; its tag gives the version (e.g. vllm/vllm-openai:v0.11.0)")
    p.add_argument("--context-length", type=_model_len, help="typical p99 prompt+output tokens")
    p.add_argument("--concurrency", type=_positive_int, help="peak concurrent requests")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    p.set_defaults(func=cmd_plan)

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
                        "{service_regex}, {model} (default: namespace and pod name)")
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
    r.add_argument("--verbose", "-v", action="store_true")
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("demo", help="run the operator in a simulated GPU cluster and show what happens")
    d.add_argument("--keep-running", action="store_true", help="leave the cluster up and print a kubeconfig")
    d.add_argument("--examples", default=None, help="directory of VLLMService manifests (default: examples/)")
    d.add_argument("--speed", type=float, default=None, help="simulated seconds per real second")
    d.set_defaults(func=cmd_demo)
    return parser


def _pinned(args: argparse.Namespace) -> PinnedFlags:
    quant = None if args.quantization in (None, "none") else args.quantization
    return PinnedFlags(
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
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
        enable_prefix_caching=args.prefix_caching,
    )


def _version(args: argparse.Namespace) -> str | None:
    if args.vllm_version:
        parse_version(args.vllm_version)
        return str(args.vllm_version)
    if args.image:
        found = version_from_image(args.image)
        if found is None:
            raise UsageError(f"cannot read a vLLM version from image {args.image!r}; pass --vllm-version")
        return found
    return None


def build_request(args: argparse.Namespace) -> PlanRequest:
    from .sources import load_model_files

    files = load_model_files(args.model, revision=args.revision)
    arch = arch_from_config(files.config, model_id=files.model_id, total_size=files.total_size,
                            total_size_estimated=files.total_size_estimated)
    gpu = load_gpu_catalog().get(args.gpu)
    pinned = _pinned(args)
    tp, pp = pinned.tensor_parallel_size or 1, pinned.pipeline_parallel_size or 1
    count = max(args.gpu_count, tp * pp)
    if args.gpu_free_gib is not None and args.gpu_free_gib > gpu.reported_gib:
        raise UsageError(f"--gpu-free-gib {args.gpu_free_gib} is more than the {gpu.name}'s "
                         f"{gpu.reported_gib:.2f} GiB")
    workload = Workload(context_length=args.context_length, concurrency=args.concurrency,
                        prefix_caching=args.prefix_caching)
    return PlanRequest(arch=arch, gpu=gpu, gpu_count=count, pinned=pinned, workload=workload,
                       vllm_version=_version(args), gpu_free_gib=args.gpu_free_gib)


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
        "args": result.args(),
        "pinned": result.pinned,
        "memory": result.memory.model_dump(),
        "kv_cache_tokens": pred.kv_cache_tokens,
        "kv_bytes_per_token": pred.kv_bytes_per_token,
        "num_gpu_blocks": pred.num_blocks,
        "max_concurrency": pred.max_concurrency,
        "estimated_max_model_len": pred.estimated_max_model_len,
        "reasons": result.reasons,
        "options": [option.model_dump() for option in result.options],
    }


def cmd_plan(args: argparse.Namespace) -> int:
    result = plan(build_request(args))
    if args.output == "json":
        print(json.dumps(plan_document(result), indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(plan_document(result), sort_keys=False), end="")
    else:
        print(render_plan_text(result))
    return 0 if result.fits else 1


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


def _cache_settings(args: argparse.Namespace) -> CacheSettings:
    return CacheSettings(mode=args.model_cache_mode, storage_class=args.model_cache_storage_class or None,
                         access_mode=args.model_cache_access_mode, size=args.model_cache_size or None)


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
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except (UsageError, UnknownGPUError, ArchError, VersionError) as exc:
        print(f"vllm-operator: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # ModelSourceError and pydantic validation of inputs are ValueErrors
        print(f"vllm-operator: error: {_one_line(exc)}", file=sys.stderr)
        return 2
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
