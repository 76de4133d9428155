"""Speculative decoding (`--speculative-config`, vLLM 0.8.2+) in the startup memory arithmetic.

What a speculative config adds on each GPU of the last pipeline stage, read from vLLM 0.33.0's sources:

- **Draft weights.** `v1/spec_decode/llm_base_proposer.py::load_model`: MTP drafts (`method: mtp` or a
  `<model>_mtp` name) are the checkpoint's own MTP layers (`n_predict` = `num_nextn_predict_layers` /
  `mtp_num_hidden_layers`, `config/speculative.py`), each a decoder layer plus `eh_proj` (a replicated
  2·hidden × hidden linear, `models/deepseek_mtp.py`); they share the target's embedding and LM head
  (`_maybe_share_lm_head`: "Detected MTP model"). EAGLE/EAGLE-3 heads and draft models are separate checkpoints
  whose own weights load in full (shared embedding/LM head are loaded first and only then replaced).
  n-gram and suffix proposers hold no weights.
- **The draft's KV cache.** The drafter's attention layers are registered like the target's and get KV pages from
  the same budget (`get_kv_cache_spec` lists every attention layer of the forward context), so each draft layer
  adds one target-sized page per block; a draft model with other head sizes adds its per-token bytes, counted
  here in target-layer units rounded up.
- **(k+1) tokens per sequence.** Decoding verifies k draft tokens plus one bonus token per sequence, so the sampler
  sees up to `max_num_seqs × (k+1)` logit rows (bounded by `max_num_batched_tokens`) where the plain profile run
  sees `max_num_seqs` (`gpu_model_runner.py::_dummy_sampler_run` adds only one draft token per request to the
  profiled rejection-sampler pass). The planner books the (k+1) rows: vLLM does not profile them, so they would
  otherwise come out of the headroom at the first busy decode step. ESTIMATE (no calibrated startup log).
- **Drafter buffers.** The proposer keeps `max_num_tokens × hidden` hidden states (× 3 auxiliary layers for
  EAGLE-3) for the whole run. ESTIMATE, counted with the draft weights.

What cannot be derived without the draft's config.json (an EAGLE head or draft model the planner could not read)
is booked conservatively as the target's largest decoder layer (plus EAGLE's fc and, for EAGLE-3, its own LM head
at the target's vocabulary), and the figures it touches are reported as estimates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .arch import LayerKind, ModelArch, ceil_div

#: `method` values with a memory model here (vllm/config/speculative.py::SpeculativeMethod, 0.33).
DRAFT_HEAD_METHODS = ("eagle", "eagle3")
NO_WEIGHT_METHODS = ("ngram", "ngram_gpu", "suffix")
KNOWN_METHODS = ("mtp", "draft_model", *DRAFT_HEAD_METHODS, *NO_WEIGHT_METHODS)
#: Keys of vLLM's speculative config that change no GPU memory at startup (kept and passed on as written).
_NO_MEMORY_KEYS = ("prompt_lookup_max", "prompt_lookup_min", "disable_padded_drafter_batch", "revision",
                   "draft_sample_method", "rejection_sample_method", "parallel_drafting")
# EAGLE-3 keeps three auxiliary hidden-state layers of the target per token (llama_eagle3.py: fc is 3·hidden → hidden)
_EAGLE3_AUX_LAYERS = 3


class SpeculativeConfigError(ValueError):
    """A `--speculative-config` the planner cannot read (not JSON, unknown method or key, missing k)."""


class Speculation(BaseModel):
    """A parsed `--speculative-config` (vLLM's snake_case keys), with the draft's config.json when it could be read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    num_speculative_tokens: int | None = Field(None, ge=1, le=64)
    model: str | None = Field(None, min_length=1, max_length=512)
    draft_tensor_parallel_size: int | None = Field(None, ge=1, le=64)
    quantization: str | None = None
    passed: dict[str, Any] = Field(default_factory=dict,
                                   description="keys with no memory effect, passed on to vLLM as written")
    draft_arch: ModelArch | None = Field(None, exclude=True,
                                         description="the draft model's architecture, when its config was read")

    @property
    def kind(self) -> str:
        """mtp, draft_model, eagle, eagle3 or one of the weightless proposers (ngram, suffix)."""
        return "mtp" if self.method.endswith("mtp") else self.method

    def tokens(self, arch: ModelArch) -> int:
        """k: the draft tokens per step (MTP defaults to the checkpoint's MTP layers, as vLLM does)."""
        return self.num_speculative_tokens or max(arch.mtp_layers, 1)

    def to_vllm(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method}
        for key in ("model", "num_speculative_tokens", "draft_tensor_parallel_size", "quantization"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out.update(self.passed)
        return out

    def to_json(self) -> str:
        """The flag's value as vLLM reads it (compact JSON, vLLM's key names)."""
        return json.dumps(self.to_vllm(), separators=(",", ":"), sort_keys=True)


def parse_speculative_config(value: str | Mapping[str, Any] | Speculation) -> Speculation:
    """Read `--speculative-config` as vLLM does (JSON object). Raises `SpeculativeConfigError` naming what is wrong."""
    if isinstance(value, Speculation):
        return value
    data: Any = value
    if isinstance(value, str):
        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SpeculativeConfigError(f"--speculative-config is not JSON: {exc.msg} at character {exc.pos}") from None
    if not isinstance(data, Mapping):
        raise SpeculativeConfigError("--speculative-config must be a JSON object, e.g. "
                                     '{"method": "eagle3", "model": "…", "num_speculative_tokens": 3}')
    data = dict(data)
    known = {"method", "num_speculative_tokens", "model", "draft_tensor_parallel_size", "quantization"}
    unknown = sorted(str(k) for k in data if k not in known and k not in _NO_MEMORY_KEYS)
    if unknown:
        raise SpeculativeConfigError(f"--speculative-config key(s) unknown to this planner: {', '.join(unknown)} "
                                     f"(known: {', '.join(sorted(known | set(_NO_MEMORY_KEYS)))})")
    passed = {k: data.pop(k) for k in list(data) if k in _NO_MEMORY_KEYS}
    method = data.get("method")
    model = data.get("model")
    if method is None and isinstance(model, str):
        # vLLM infers the method from the draft's name (config/speculative.py::__post_init__)
        lowered = model.lower()
        method = "eagle3" if "eagle3" in lowered else "eagle" if "eagle" in lowered else "draft_model"
    if not isinstance(method, str) or not (method in KNOWN_METHODS or method.endswith("_mtp")):
        raise SpeculativeConfigError(f"--speculative-config method {method!r} is not one the planner models "
                                     f"(one of {', '.join(KNOWN_METHODS)} or <model>_mtp)")
    data["method"] = method
    try:
        spec = Speculation(**data, passed=passed)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SpeculativeConfigError(f"--speculative-config {where}: {first['msg']}") from None
    if spec.kind != "mtp" and spec.num_speculative_tokens is None:
        raise SpeculativeConfigError("--speculative-config needs num_speculative_tokens for method "
                                     f"{spec.method!r} (vLLM raises otherwise)")
    if spec.kind in ("draft_model", *DRAFT_HEAD_METHODS) and not spec.model:
        raise SpeculativeConfigError(f"--speculative-config method {spec.method!r} needs the draft's model id")
    return spec


@dataclass(frozen=True)
class DraftMemory:
    """What speculative decoding adds on one GPU of the last pipeline stage."""

    weights_bytes: int        # draft weights plus the proposer's persistent buffers
    kv_layers: int            # extra attention layers, in target-layer page units
    sampler_rows_factor: int  # logit rows per sequence while verifying (k + 1)
    estimated: bool           # the draft's weights/KV rest on an estimate (its config was not read)
    note: str                 # one sentence for the plan's reasons


def _largest_layer_bytes(arch: ModelArch, body_bytes: float, tp: int) -> float:
    """Bytes of the target's largest decoder layer on one TP rank (MTP layers of MoE models are MoE layers)."""
    layers = arch.layer_param_counts or (1,) * arch.num_layers
    return body_bytes * max(layers) / max(sum(layers), 1) / tp


def draft_memory(spec: Speculation, arch: ModelArch, *, body_bytes: float, dtype_bytes: int, tp: int,
                 max_num_batched_tokens: int, draft_weights_bytes: int | None, draft_kv_per_token: int | None,
                 target_kv_per_token: int) -> DraftMemory:
    """The draft's memory on one GPU. `body_bytes`: the target's decoder-layer weights (all ranks, in memory);
    `draft_weights_bytes` / `draft_kv_per_token`: the draft model's own per-GPU figures when its config was read."""
    k = spec.tokens(arch)
    hidden = arch.hidden_size
    if spec.kind in NO_WEIGHT_METHODS:
        return DraftMemory(0, 0, k + 1, False,
                           f"speculative decoding ({spec.method}, k={k}): no draft weights or KV; the sampler is "
                           f"booked for {k + 1} tokens per sequence (estimate).")
    buffers = max_num_batched_tokens * hidden * dtype_bytes * (_EAGLE3_AUX_LAYERS if spec.kind == "eagle3" else 1)
    layer = _largest_layer_bytes(arch, body_bytes, tp)
    if spec.kind == "mtp":
        n = arch.mtp_layers or 1
        weights = n * (layer + 2 * hidden * hidden * dtype_bytes) + buffers
        missing = "" if arch.mtp_layers else (" config.json declares no MTP layers, so vLLM will refuse this "
                                              "method for this model; one layer is booked.")
        return DraftMemory(int(weights), n, k + 1, False,
                           f"speculative decoding (MTP, k={k}): {n} MTP layer(s) of the checkpoint add their weights "
                           f"and KV pages; the sampler is booked for {k + 1} tokens per sequence (estimate)."
                           + missing)
    if draft_weights_bytes is not None and draft_kv_per_token is not None:
        kv_layers = ceil_div(draft_kv_per_token, max(target_kv_per_token, 1)) if draft_kv_per_token else 0
        return DraftMemory(draft_weights_bytes + buffers, kv_layers, k + 1, False,
                           f"speculative decoding ({spec.method}, k={k}): the draft {spec.model} adds its weights and "
                           f"KV ({kv_layers} target-layer page(s) per block); the sampler is booked for {k + 1} tokens "
                           "per sequence (estimate).")
    # the draft's config.json was not read: one target-sized decoder layer, EAGLE's fc, EAGLE-3's own LM head
    fc = (_EAGLE3_AUX_LAYERS if spec.kind == "eagle3" else 2) * hidden * hidden * dtype_bytes
    head = arch.vocab_size * hidden * dtype_bytes / tp if spec.kind in ("eagle3", "draft_model") else 0
    weights = layer + fc + head + buffers
    return DraftMemory(int(weights), 1, k + 1, True,
                       f"speculative decoding ({spec.method}, k={k}): the draft {spec.model}'s config was not read; "
                       "its weights and KV are estimated as one decoder layer of this model"
                       + (" plus its own LM head" if head else "") + " (estimate).")


def attention_layer_kinds(kinds: tuple[LayerKind, ...], extra: int) -> tuple[LayerKind, ...]:
    """A stage's layer kinds with the draft's attention layers appended (full attention, as vLLM's drafters use)."""
    return (*kinds, *([LayerKind.FULL] * extra))


def with_draft_arch(spec: Speculation, config: Mapping[str, Any] | None, *, total_size: int | None = None) -> Speculation:
    """The speculation with the draft's architecture read from its config.json (None or unreadable: unchanged, and
    the draft is then booked by the conservative estimate)."""
    from .arch import ArchError, arch_from_config

    if config is None or spec.model is None or spec.kind == "mtp" or spec.kind in NO_WEIGHT_METHODS:
        return spec
    try:
        draft = arch_from_config(config, model_id=spec.model, total_size=total_size)
    except ArchError:
        return spec
    return spec.model_copy(update={"draft_arch": draft})
