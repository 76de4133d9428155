"""Contract: every argument list the operator renders is accepted by vLLM's own `vllm serve` parser.

Rendered here, for the installed vLLM's own release (so the flag table, catalog/vllm_flags.yaml, is exercised for
that release): a few hand-written specs, every VLLMService in examples/, and every scenario of the demo
(vllm_operator_sim/scenarios.yaml: its examples/ file, or its built-in manifest) — the leader's and the worker's
args too where the plan spans nodes (a LeaderWorkerSet).

Needs vLLM: `make test-real` (the CPU build of vLLM 0.32.0 in .venv-real, which runs this directory) or
`make test-vllm` (vLLM 0.33.0 in .venv-vllm). Skipped where vLLM is not installed.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
pytestmark = pytest.mark.vllm  # the optional extra: the only reason a test here may skip
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (optional extra: vllm-operator[vllm])")

from vllm_operator import reconcile  # noqa: E402
from vllm_operator.handlers import observe  # noqa: E402
from vllm_operator.planner.gpus import load_gpu_catalog  # noqa: E402
from vllm_operator.planner.versions import parse_version  # noqa: E402
from vllm_operator.sources import load_model_files  # noqa: E402
from vllm_operator_sim.cluster import DEFAULT_POOLS, gpu_node  # noqa: E402
from vllm_operator_sim.scenarios import load_scenarios  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
NOW = datetime(2026, 11, 22, tzinfo=UTC)
VERSION = vllm.__version__.split("+")[0]
IMAGE = f"vllm/vllm-openai:v{VERSION}"

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
    "lora": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "gpu": {"product": "NVIDIA-L4"},
             "lora": {"maxLoras": 2, "maxRank": 16, "adapters": [{"name": "sql", "source": "/adapters/sql"}]}},
}


def _documents() -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, VLLMService spec) for every example and every demo scenario."""
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "VLLMService":
                yield f"examples/{path.name}:{doc['metadata']['name']}", dict(doc["spec"])
    for scenario in load_scenarios():
        if scenario.example:
            doc = yaml.safe_load((EXAMPLES / scenario.example).read_text())
            yield f"scenario:{scenario.name}", dict(doc["spec"])
        elif scenario.manifest is not None:
            yield f"scenario:{scenario.name}", dict(scenario.manifest)


DOCUMENTS = dict(_documents())


def _nodes() -> list[Mapping[str, str]]:
    """The labels of the demo cluster's nodes (vllm_operator_sim.cluster.DEFAULT_POOLS), for specs without a GPU."""
    catalog = load_gpu_catalog()
    return [gpu_node(f"n{i}", catalog.get(pool.gpu), pool.gpus_per_node)["metadata"]["labels"]
            for i, pool in enumerate(DEFAULT_POOLS)]


def _parser() -> Any:
    """`vllm serve`'s own parser (its module moved between releases)."""
    make = None
    for module in (
        "vllm.entrypoints.common.cli_args",  # 0.33
        "vllm.entrypoints.launchers.cli_args",  # 0.32
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


def _expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion of a command or argument (`$$` escapes; an unknown name stays as written)."""
    return re.sub(r"\$\$|\$\((\w+)\)", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _lws_env(lws: Mapping[str, Any], index: int) -> dict[str, str]:
    """What LeaderWorkerSet injects into every container of a group's pod with worker index `index`."""
    name = lws["metadata"]["name"]
    size = lws["spec"]["leaderWorkerTemplate"].get("size", 1)
    return {"LWS_LEADER_ADDRESS": f"{name}-0.{name}.default", "LWS_GROUP_SIZE": str(size),
            "LWS_WORKER_INDEX": str(index), "LWS_NAME": name, "LWS_GROUP_INDEX": "0"}


def _containers(name: str, spec: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """(which, command + args) of every vLLM container the operator renders for the spec, planned for the installed
    release; [] when the operator renders none (an infeasible plan: the test says why)."""
    files = load_model_files(spec["model"]["name"])
    nodes = _nodes()
    base = reconcile.Observed(name=name, namespace="default", uid="uid-1", generation=1,
                              spec={**spec, "image": IMAGE}, status={}, now=NOW, model_files=files)
    observed = observe.complete(base, model=None, nodes=lambda selector: [n for n in nodes if all(
        n.get(k) == v for k, v in selector.items())], lws=lambda: True)
    desired = reconcile.desired_state(observed)
    found: list[tuple[str, list[str]]] = []
    for child in desired.children or []:
        if child["kind"] == "Deployment":
            templates = {"pod": (child["spec"]["template"], {})}
        elif child["kind"] == "LeaderWorkerSet":
            group = child["spec"]["leaderWorkerTemplate"]
            templates = {"leader": (group.get("leaderTemplate") or group["workerTemplate"], _lws_env(child, 0)),
                         "worker": (group["workerTemplate"], _lws_env(child, 1))}
        else:
            continue
        for which, (template, injected) in templates.items():
            for container in template["spec"]["containers"]:
                if container["name"] == "vllm":
                    env = {**injected, **{e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}}
                    command = [*container.get("command", []), *container.get("args", [])]
                    found.append((which, [_expand(part, env) for part in command]))
    if not found:
        reasons = {c.type: f"{c.status} {c.reason}: {c.message}" for c in desired.status.conditions}
        assert reasons.get("PlanFeasible", "").startswith("False"), (name, reasons)
    return found


def _check(command: list[str]) -> None:
    assert command[:2] == ["vllm", "serve"], command
    args = command[2:]
    model, rest = args[0], args[1:]
    parsed = _parser().parse_args(args)  # exactly what follows `vllm serve` in the container
    assert model in (getattr(parsed, "model_tag", None), getattr(parsed, "model", None))
    flags = dict(zip(rest[::2], rest[1::2], strict=False))
    if "--max-model-len" in flags:  # `auto` (the operator's choice for a full-context plan): vLLM's -1
        length = flags["--max-model-len"]
        assert parsed.max_model_len == (-1 if length == "auto" else int(length))
    if "--tensor-parallel-size" in flags:
        assert parsed.tensor_parallel_size == int(flags["--tensor-parallel-size"])
    if "--pipeline-parallel-size" in flags:
        assert parsed.pipeline_parallel_size == int(flags["--pipeline-parallel-size"])
    if "--gpu-memory-utilization" in flags:
        assert parsed.gpu_memory_utilization == pytest.approx(float(flags["--gpu-memory-utilization"]))
    if "--headless" in rest:
        assert parsed.headless is True


@pytest.mark.parametrize("name", sorted(SPECS))
def test_vllm_accepts_the_rendered_args(name: str) -> None:
    containers = _containers(name, SPECS[name])
    assert containers
    for _, command in containers:
        _check(command)


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_vllm_accepts_the_args_rendered_for_every_example_and_demo_scenario(name: str) -> None:
    for _, command in _containers(name.rsplit(":", 1)[-1][:40].strip(".-") or "svc", DOCUMENTS[name]):
        _check(command)


def test_every_example_and_scenario_is_checked() -> None:
    examples = {p.name for p in EXAMPLES.glob("*.yaml")}
    checked = {name.split(":")[0].removeprefix("examples/") for name in DOCUMENTS}
    assert examples <= checked
    assert {f"scenario:{s.name}" for s in load_scenarios()} <= set(DOCUMENTS)


def test_the_installed_release_is_one_the_planner_knows() -> None:
    """The flag table and the memory model cover the installed release (0.32.0 in .venv-real, 0.33.0 in
    .venv-vllm); `make test-vllm VLLM_CONTRACT_VERSION=...` / `make test-real VLLM_REAL_VERSION=...` pick it."""
    from vllm_operator.planner.versions import NEWEST_KNOWN_VERSION

    assert parse_version(VERSION) <= parse_version(NEWEST_KNOWN_VERSION), (VERSION, NEWEST_KNOWN_VERSION)
    expected = os.environ.get("VLLM_EXPECTED_VERSION")
    if expected:
        assert expected == VERSION, f"vLLM {VERSION} is installed; the Makefile asked for {expected}"
