"""`vllm-operator plan --pack`: which models share which GPUs of one kind, with which flags each (issue 26).

    vllm-operator plan --pack --gpu L40S \\
        --model Qwen/Qwen2.5-1.5B-Instruct \\
        --model meta-llama/Llama-3.1-8B-Instruct:context=16384,concurrency=8 \\
        --model qwen3-4b:memory=10,name=team-b

Each `--model` is a model reference (as `plan --model` takes it) with optional per-model settings after the last
`:`, comma-separated: `context=TOKENS` and `concurrency=N` (its workload), `memory=GiB` (spec.gpu.share.memoryGiB:
fixes its budget) and `name=NAME` (how it is called in the answer; default: the model's last path part).

Exit 0: every model has a place (one GPU, or the GPUs listed); 1: some do not (each says why) — in particular when
`--gpus` caps the pool; 2: bad input.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from .planner.packing import GroupPlan, PackMember, PackRequest, gpus_alone, pack
from .planner.plan import Workload

_OPTION = re.compile(r"^[a-z]+=[^,]*(,[a-z]+=[^,]*)*$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_KEYS = ("context", "concurrency", "memory", "name")


class PackUsageError(ValueError):
    """A malformed --model option: one line, exit 2."""


def split_model(text: str) -> tuple[str, dict[str, str]]:
    """`REF[:key=value,...]` -> (REF, {key: value}); a `:` not followed by key=value pairs stays in REF."""
    ref, sep, tail = text.rpartition(":")
    if not sep or not _OPTION.match(tail):
        return text, {}
    options: dict[str, str] = {}
    for pair in tail.split(","):
        key, _, value = pair.partition("=")
        if key not in _KEYS:
            raise PackUsageError(f"--model {text}: unknown setting {key!r} (known: {', '.join(_KEYS)})")
        if key in options:
            raise PackUsageError(f"--model {text}: {key} given twice")
        options[key] = value
    return ref, options


def _positive(text: str, what: str, *, integer: bool) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise PackUsageError(f"{what}={text!r}: not a {'whole ' if integer else ''}number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise PackUsageError(f"{what}={text!r}: must be above 0")
    return value


def _default_name(ref: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", ref.rstrip("/").rsplit("/", 1)[-1].lower()).strip("-")[:55] or "model"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


def build_members(models: Sequence[str], load: Any) -> list[PackMember]:
    """The members from the --model options; `load(ref)` returns the model's ModelArch."""
    members: list[PackMember] = []
    taken: set[str] = set()
    for text in models:
        ref, options = split_model(text)
        name = options.get("name") or _default_name(ref, taken)
        if not _NAME.match(name):
            raise PackUsageError(f"--model {text}: name {name!r} must be a DNS label (a-z, 0-9, '-')")
        if name in taken:
            raise PackUsageError(f"--model {text}: name {name!r} is used twice; give one with name=...")
        taken.add(name)
        context = options.get("context")
        concurrency = options.get("concurrency")
        memory = options.get("memory")
        workload = Workload(
            context_length=int(_positive(context, "context", integer=True)) if context else None,
            concurrency=int(_positive(concurrency, "concurrency", integer=True)) if concurrency else None)
        members.append(PackMember(name=name, arch=load(ref), workload=workload,
                                  memory_gib=_positive(memory, "memory", integer=False) if memory else None))
    return members


def build_parser() -> argparse.ArgumentParser:
    from .cli import _Parser

    p = _Parser(prog="vllm-operator plan --pack",
                description="Pack several models onto shared GPUs of one kind. Exit 0: every model has a place; "
                            "1: some do not (each says why); 2: bad input.")
    p.add_argument("--pack", action="store_true", required=True, help="plan a share group (this command)")
    p.add_argument("--gpu", required=True, help="catalog name, alias, GFD product label, or a size like 24GB")
    p.add_argument("--model", action="append", required=True, metavar="REF[:context=N,concurrency=N,memory=GiB,name=X]",
                   help="a model (repeat for each): Hugging Face id, catalog alias, directory or config.json path, "
                        "with optional per-model settings")
    p.add_argument("--gpus", type=int, default=None, help="GPUs the pool has for the group (default: as many as needed)")
    p.add_argument("--vllm-version", help="vLLM release the members run (default: the newest known)")
    p.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    return p


def group_document(result: GroupPlan, alone: int | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "group": result.group, "gpu": result.gpu, "gpu_total_gib": result.gpu_total_gib,
        "margin_gib": result.margin_gib, "fits": result.fits, "gpus_used": sum(1 for g in result.gpus if g.members),
        "gpus": [{"index": g.index, "used_gib": g.used_gib, "free_gib": g.free_gib,
                  "members": [m.model_dump() for m in g.members]} for g in result.gpus if g.members],
        "unplaced": [u.model_dump() for u in result.unplaced],
        "start_order": result.start_order,
        "reasons": result.reasons,
    }
    if alone is not None:
        doc["gpus_one_per_service"] = alone
    return doc


def render_text(result: GroupPlan, alone: int | None = None) -> str:
    used = [g for g in result.gpus if g.members]
    placed = sum(len(g.members) for g in used)
    if not used:
        head = f"CANNOT SHARE: no model fits a shared {result.gpu}"
    elif len(used) == 1 and result.fits:
        head = f"FITS: {placed} models on one {result.gpu}"
    else:
        head = f"{'FITS' if result.fits else 'PARTLY'}: {placed} models on {len(used)}× {result.gpu}"
    if alone is not None:
        head += f" (one service per GPU set: {alone} GPU{'s' if alone != 1 else ''})"
    lines = [head]
    for g in used:
        lines.append(f"GPU {g.index}: {g.used_gib:.2f} of {g.total_gib:.2f} GiB held, {g.free_gib:.2f} GiB free "
                     f"(keeps {g.margin_gib:.2f})")
        for m in g.members:
            lines.append(f"  {m.name} ({m.model_id}): budget {m.budget_gib:.2f} GiB"
                         f"{' (memoryGiB)' if m.fixed else f' (its workload needs {m.workload_budget_gib:.2f})'}"
                         f" + {m.outside_gib:.2f} outside = {m.footprint_gib:.2f} GiB; weights {m.weights_gib:.2f}, "
                         f"KV cache {m.kv_cache_gib:.2f} GiB = {m.kv_cache_tokens:,} tokens, "
                         f"max-model-len {m.max_model_len:,}")
            lines.append("    " + " ".join(m.args))
    for u in result.unplaced:
        lines.append(f"DOES NOT FIT: {u.name} ({u.model_id}): {u.reason}")
    lines.append("")
    lines.extend(result.reasons)
    return "\n".join(lines)


def cmd_plan_pack(words: Sequence[str]) -> int:
    from .cli import UsageError
    from .planner.arch import arch_from_config, check_arch_bounds
    from .sources import load_model_files

    args = build_parser().parse_args(list(words))
    if args.gpus is not None and args.gpus < 1:
        raise UsageError("--gpus must be at least 1")
    from .planner.gpus import load_gpu_catalog

    gpu = load_gpu_catalog().get(args.gpu)

    def load(ref: str) -> Any:  # as `plan --model` loads one (cli.build_request)
        files = load_model_files(ref)
        check_arch_bounds(files.config, model_id=files.model_id)
        return arch_from_config(files.config, model_id=files.model_id, total_size=files.total_size,
                                total_size_estimated=files.total_size_estimated)

    try:
        members = build_members(args.model, load)
    except PackUsageError as exc:
        raise UsageError(str(exc)) from None
    request = PackRequest(group="cli", gpu=gpu, members=tuple(members), gpus=args.gpus,
                          vllm_version=args.vllm_version)
    result = pack(request)
    alone = gpus_alone(members, gpu, args.vllm_version)
    if args.output == "json":
        print(json.dumps(group_document(result, alone), indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(group_document(result, alone), sort_keys=False), end="")
    else:
        print(render_text(result, alone))
    sys.stdout.flush()
    return 0 if result.fits else 1

