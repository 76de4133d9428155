"""Contract: every argument list the operator renders is accepted by vLLM's own `vllm serve` parser.

Needs vLLM (the optional extra `vllm-operator[vllm]`; on a machine without a GPU: `pip install vllm`, then
`pip uninstall -y torchvision torchaudio torchcodec` and `VLLM_TARGET_DEVICE=cpu`; `make test-vllm` does this,
for vLLM 0.33.0).
Skipped where vLLM is not installed. The Deployments are rendered for the installed vLLM's own release, so the flag
table (catalog/vllm_flags.yaml) is exercised for that release too.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
pytestmark = pytest.mark.vllm  # the optional extra: the only reason a test here may skip
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (optional extra: vllm-operator[vllm])")

from vllm_operator import reconcile  # noqa: E402
from vllm_operator.sources import load_model_files  # noqa: E402

NOW = datetime(2026, 11, 22, tzinfo=UTC)
IMAGE = f"vllm/vllm-openai:v{vllm.__version__.split('+')[0]}"

SPECS: dict[str, dict[str, Any]] = {
    "minimal": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "gpu": {"product": "NVIDIA-L4"}},
    "tp2-workload": {"model": {"name": "Qwen/Qwen2.5-32B-Instruct"}, "gpu": {"product": "NVIDIA-L4", "maxCount": 4},
                     "workload": {"contextLength": 8192, "concurrency": 4, "prefixCaching": True}},
    "pinned": {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "gpu": {"product": "NVIDIA-A100-SXM4-40GB"},
               "flags": {"maxModelLen": 8192, "gpuMemoryUtilization": 0.85, "kvCacheDtype": "fp8",
                         "enforceEager": True, "maxNumBatchedTokens": 4096, "enablePrefixCaching": False,
                         "blockSize": 32}},
    "awq": {"model": {"name": "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"},
            "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "maxCount": 4}},
    "extra-args": {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "gpu": {"product": "NVIDIA-L4"},
                   "extraArgs": ["--uvicorn-log-level", "warning"]},
}


def _parser() -> Any:
    """`vllm serve`'s own parser (its module moved between releases)."""
    import importlib

    make = None
    for module in (
        "vllm.entrypoints.common.cli_args",  # 0.33
        "vllm.entrypoints.launchers.cli_args",
        "vllm.entrypoints.openai.cli_args",
    ):
        try:
            make = importlib.import_module(module).make_arg_parser
            break
        except (ImportError, AttributeError):
            continue
    flexible = None
    for module in ("vllm.utils.argparse_utils", "vllm.utils"):
        try:
            flexible = importlib.import_module(module).FlexibleArgumentParser
            break
        except (ImportError, AttributeError):
            continue
    assert make is not None and flexible is not None, "vllm's serve parser not found"
    return make(flexible())


def _rendered_args(name: str, spec: dict[str, Any]) -> list[str]:
    files = load_model_files(spec["model"]["name"])
    observed = reconcile.Observed(name=name, namespace="default", uid="uid-1", generation=1,
                                  spec={**spec, "image": IMAGE}, status={}, now=NOW, model_files=files)
    desired = reconcile.desired_state(observed)
    assert desired.children, desired.status.conditions
    deployment = next(c for c in desired.children if c["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["vllm", "serve"]
    args: list[str] = container["args"]
    return args


@pytest.mark.parametrize("name", sorted(SPECS))
def test_vllm_accepts_the_rendered_args(name: str) -> None:
    args = _rendered_args(name, SPECS[name])
    model, rest = args[0], args[1:]
    parsed = _parser().parse_args(args)  # exactly what follows `vllm serve` in the container
    assert model in (getattr(parsed, "model_tag", None), getattr(parsed, "model", None))
    flags = dict(zip(rest[::2], rest[1::2], strict=False))
    if "--max-model-len" in flags:
        assert parsed.max_model_len == int(flags["--max-model-len"])
    if "--tensor-parallel-size" in flags:
        assert parsed.tensor_parallel_size == int(flags["--tensor-parallel-size"])
    if "--gpu-memory-utilization" in flags:
        assert parsed.gpu_memory_utilization == pytest.approx(float(flags["--gpu-memory-utilization"]))


def test_the_contract_runs_against_the_newest_known_release() -> None:
    """`make test-vllm` installs the release the planner knows as newest (the default image's)."""
    from vllm_operator.planner.versions import NEWEST_KNOWN_VERSION, parse_version

    assert parse_version(vllm.__version__) == parse_version(NEWEST_KNOWN_VERSION), (
        f"vLLM {vllm.__version__} is installed; the default image is {NEWEST_KNOWN_VERSION} "
        "(make test-vllm VLLM_CONTRACT_VERSION=...)")
