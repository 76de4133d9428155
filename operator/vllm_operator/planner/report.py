"""A plan for a person: one bar of the GPU's memory and the reasons, readable in ten seconds."""

from __future__ import annotations

import shlex

from .failures import FailureKind
from .plan import Plan

_WIDTH = 60
_SEGMENTS = (  # (label, glyph)
    ("weights", "█"),
    ("activation", "▓"),
    ("overhead", "▒"),
    ("KV cache", "░"),
    ("headroom", "·"),
)


_ESTIMATE_WORDS = {  # MemoryBreakdown.estimated → what the estimate is
    "activation_gib": "activation (sampler peak: Model Runner V2, or k + 1 speculative tokens per sequence)",
    "weights_gib": "weights (a speculative draft whose config.json was not read)",
    "cudagraph_gib": "CUDA graphs (Model Runner V2 estimate)",
    "persistent_gib": "allocator leftovers",
    "non_torch_gib": "non-torch memory (unified memory: vLLM counts the host's available memory, so the process's "
                     "host-side growth during startup comes out of the KV cache)",
    "kv_cache_gib": "KV cache",
}


def memory_segments(result: Plan) -> list[tuple[str, float]]:
    """The GPU's memory in the order vLLM fills it (GiB per GPU)."""
    mem = result.memory
    graphs_inside = mem.cudagraph_gib if mem.kv_cache_gib + mem.weights_gib + mem.activation_gib + mem.non_torch_gib \
        + mem.persistent_gib + mem.cudagraph_gib <= mem.requested_gib + 0.02 else 0.0
    overhead = mem.non_torch_gib + mem.persistent_gib + graphs_inside
    used = mem.weights_gib + mem.activation_gib + overhead + mem.kv_cache_gib
    headroom = max(mem.gpu_total_gib - used, 0.0)
    return [("weights", mem.weights_gib), ("activation", mem.activation_gib), ("overhead", overhead),
            ("KV cache", mem.kv_cache_gib), ("headroom", headroom)]


def memory_bar(result: Plan, width: int = _WIDTH) -> str:
    segments = memory_segments(result)
    total = max(sum(size for _, size in segments), 1e-9)
    glyphs = dict(_SEGMENTS)
    cells: list[str] = []
    for label, size in segments:
        cells.append(glyphs[label] * round(size / total * width))
    bar = "".join(cells)[:width].ljust(width, glyphs["headroom"])
    return f"[{bar}]"


def render_plan_text(result: Plan) -> str:
    pred = result.prediction
    verdict = ("FITS" if result.usable else "FITS, DEGENERATE (see Trade-off)") if result.fits else "DOES NOT FIT"
    allowed = f" (of {result.gpu_count_allowed} allowed)" if result.gpu_count_allowed > result.gpu_count else ""
    lines = [
        f"{verdict}: {result.model_id} on {result.gpu_count}× {result.gpu}{allowed} with vLLM {result.vllm_version}",
        "",
        f"GPU memory per GPU ({result.memory.gpu_total_gib:.2f} GiB as vLLM sees it):",
        "  " + memory_bar(result),
        "  " + "  ".join(f"{glyph} {label} {size:.2f}" for (label, size), (_, glyph) in
                         zip(memory_segments(result), _SEGMENTS, strict=True)),
        *([f"  estimates (not yet calibrated on a log of this release): "
           f"{', '.join(_ESTIMATE_WORDS.get(name, name) for name in result.memory.estimated)}"]
          if result.memory.estimated else []),
        "",
        f"KV cache: {pred.kv_cache_tokens:,} tokens, {pred.max_concurrency:.2f} concurrent requests of "
        f"{result.flags.get('max_model_len')} tokens (longest single request: {pred.estimated_max_model_len:,})"
        + (f"; {result.kv_fraction:.0%} of the KV memory this GPU can hold at its highest safe utilization."
           if result.kv_fraction is not None else "."),
        "",
        "vllm serve " + result.model_id + " " + " ".join(shlex.quote(arg) for arg in result.args()),
    ]
    if result.failure:
        lines += ["", f"vLLM would fail ({result.failure.kind}); what vLLM would print:", "  " + result.failure.message]
    lines += ["", "Why:"] + [f"  - {reason}" for reason in result.reasons]
    if result.options:
        sources = sorted({option.source for option in result.options})
        lines += ["", f"Options that would {'fit' if not result.fits else 'meet the workload'} "
                      f"(GPUs from the {' and '.join('cluster' if s == 'cluster' else 'GPU catalog' for s in sources)}):"]
        for option in result.options:
            changes = f"; also changes: {', '.join(option.changes)}" if option.changes else ""
            lines.append(f"  - {option.summary}: {option.gpu_count}× {option.gpu}, max-model-len "
                         f"{option.max_model_len}, {option.kv_cache_tokens:,} KV tokens "
                         f"({option.max_concurrency:.2f}× concurrency){changes}")
    elif not result.fits and result.failure is not None and result.failure.kind is FailureKind.INVALID_ARGUMENT:
        lines += ["", "No GPU or flag the planner chooses changes this: vLLM refuses the command as given."]
    elif not result.fits:
        lines += ["", "No option within the catalog fits: this model needs more or larger GPUs than we know of."]
    return "\n".join(lines)
