"""vLLM releases and the memory arithmetic each one uses.

The eras live in `catalog/vllm_versions.yaml` (data, with sources); this module parses versions (from a plain
string or an image tag) and answers "which rules apply to this release".
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from ..api.v1alpha1 import DEFAULT_IMAGE

Version = tuple[int, int, int]

_VERSION_RE = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


class VersionError(ValueError):
    """A version string or image tag we cannot read."""


class VersionProfile(BaseModel):
    """The rules one vLLM era applies when sizing memory (see catalog/vllm_versions.yaml)."""

    model_config = ConfigDict(frozen=True)

    since: str
    engine: Literal["V0", "V1"]
    default_utilization: float
    others_memory_counted: bool
    free_memory_check: bool
    cudagraph_subtracted: bool
    tokens_definition: Literal["blocks", "blocks_per_group", "concurrency"]
    kv_error_style: Literal["v0", "v1_gb", "v1_gib", "v1_broken_estimate", "v1_typo", "v1_typo_docs", "v1_current"]
    free_check_style: Literal["none", "no_device", "device"]
    sampler_bytes: float = Field(description="torch bytes per sampled row per vocab entry in the profile run")
    nontorch_gib: tuple[float, float]
    cudagraph_scale: float
    batch_defaults: Literal["v0", "v1_early", "v1", "v1_160", "v1_160_gb10"]
    v2_runner_default: Literal["none", "qwen3_dense", "listed", "dense", "all"]
    v2_cudagraph_estimate: bool
    v2_cudagraph_scale: float
    v2_sampler_bytes: float
    v2_sampler_state_counted: bool
    profiler: Literal["increase", "consumed"]
    allocator_slack_gib: float
    swa_inflight_batches: int = Field(ge=1)
    kv_check_reserves_block: bool
    yarn_factor_applied: bool
    tokens_log: Literal["two_lines", "one_line"]
    hybrid_prefix_caching: bool
    mamba_prefill_checkpoint: Literal["none", "mamba2", "mamba2_gdn"] = Field(
        description="state layers that keep one more state page per request in 'align' mode (MambaSpec "
                            "num_prefill_checkpoint_blocks): Mamba2 from 0.32, Gated DeltaNet on FlashInfer's prefill "
                            "from 0.33")
    cudagraph_capture_max_cc10: int = Field(
        ge=1, description="the default largest CUDA-graph capture size on compute capability 10.x GPUs")
    external_weights_budget: bool = Field(
        description="weights held by another process (--load-format ipc_cache, zero-copy) leave the budget")
    max_model_len_auto: bool = Field(
        description="`--max-model-len auto` (and -1): vLLM fits the longest context whose KV cache fits at startup")
    estimates: tuple[str, ...] = Field(description="the fields of this era that are estimates, not source or fit")
    note: str = ""
    version: str = Field("", description="the release this profile was resolved for")
    runner: Literal["", "V1", "V2"] = Field(
        "", description="the model runner, once resolved for a model (planner.memory.profile_for_model)")

    @property
    def version_tuple(self) -> Version:
        return parse_version(self.version or self.since)


def parse_version(text: str) -> Version:
    """'0.11.0', 'v0.8.5.post1', '0.11.0+582e4e37.nv25.11' → (major, minor, patch)."""
    match = _VERSION_RE.search(text.strip())
    if not match:
        raise VersionError(f"cannot read a vLLM version from {text!r}; expected something like 0.11.0")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def version_from_image(image: str) -> str | None:
    """The vLLM version an image tag names ('vllm/vllm-openai:v0.11.0' → '0.11.0'); None for 'latest'/digests."""
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    tag = last.split(":", 1)[1]
    match = _VERSION_RE.search(tag)
    if not match or int(match.group(1)) >= 10:
        return None  # e.g. NGC's YY.MM tags (nvcr.io/nvidia/vllm:25.11-py3) name the container release
    return f"{match.group(1)}.{match.group(2)}.{match.group(3) or 0}"


# The newest vLLM release whose arithmetic this planner knows; used when no version or image tag is given. It is the
# default image's release (one place: api.v1alpha1.DEFAULT_IMAGE), checked against the version table in the tests.
NEWEST_KNOWN_VERSION: str = version_from_image(DEFAULT_IMAGE) or "0.0.0"


def era_rows(text: str) -> list[dict[str, object]]:
    """The eras of a version table, each with every field: an era inherits what it does not state from the one before.

    The rows must be in release order (a table edited by hand is read as written; an era out of order is an error).
    """
    rows = yaml.safe_load(text)["eras"]
    resolved: list[dict[str, object]] = []
    previous: dict[str, object] = {}
    for row in rows:
        if previous and parse_version(str(row["since"])) <= parse_version(str(previous["since"])):
            raise VersionError(f"era {row['since']} comes after {previous['since']}: keep the eras in release order")
        merged = {**{k: v for k, v in previous.items() if k != "note"}, **row}
        resolved.append(merged)
        previous = merged
    return resolved


class ImageVersion(BaseModel):
    """The vLLM release to plan for, and how it was found."""

    model_config = ConfigDict(frozen=True)

    version: str
    source: Literal["declared", "tag", "assumed"]
    note: str = Field("", description="a sentence for the reasons (and a condition) when the release is assumed")


def image_version(image: str | None, declared: str | None = None, *, field: str = "spec.vllmVersion") -> ImageVersion:
    """The release an image runs, as people pin images: a declared version (``spec.vllmVersion``,
    ``--vllm-version``) wins; else the tag names it (``:v0.11.0``, also with a digest after it); else - a digest
    alone, a mirror tag such as ``registry.local/vllm:prod``, ``latest`` or no tag - the newest known release is
    assumed and the note says so. Raises VersionError only for a declared version that is not a version."""
    if declared and declared.strip().lower() != "latest":
        major, minor, patch = parse_version(declared)
        return ImageVersion(version=f"{major}.{minor}.{patch}", source="declared")
    tagged = version_from_image(image) if image else None
    if tagged is not None and not declared:
        return ImageVersion(version=tagged, source="tag")
    if declared:
        why = f"{field} is 'latest'"
    elif not image:
        why = "no image is named"
    elif "@" in image and ":" not in image.split("@", 1)[0].rsplit("/", 1)[-1]:
        why = f"the image {image!r} is pinned by digest, which names no release"
    else:
        last = image.split("@", 1)[0].rsplit("/", 1)[-1]
        tag = last.split(":", 1)[1] if ":" in last else "latest"
        why = f"the tag {tag!r} of image {image!r} names no vLLM release"
    note = (f"vLLM {NEWEST_KNOWN_VERSION} assumed (the newest release this operator knows): {why}; set {field} to "
            "the release the image runs. If it runs another release, a startup failure is read from the pod and "
            "the remediation ladder re-plans.")
    return ImageVersion(version=NEWEST_KNOWN_VERSION, source="assumed", note=note)


@lru_cache(maxsize=1)
def _eras() -> tuple[VersionProfile, ...]:
    text = resources.files("vllm_operator.catalog").joinpath("vllm_versions.yaml").read_text()
    return tuple(VersionProfile.model_validate(row) for row in era_rows(text))


def eras() -> tuple[VersionProfile, ...]:
    """Every era of the version table, oldest first."""
    return _eras()


# config/vllm.py::use_v2_model_runner, 0.24-0.28: the architectures that run Model Runner V2 by default
_V2_LISTED = frozenset({
    "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM", "DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM",
    "GraniteMoeForCausalLM",
})
# 0.25-0.28: MoE architectures that run MRV2 although MoE (the listed ones, plus newer archs)
_V2_MOE = frozenset({
    "DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM", "KimiK3ForCausalLM",
    "DeepseekV4ForCausalLM", "LongcatFlashNgramForCausalLM",
})


def uses_v2_runner(
    profile: VersionProfile, *, architectures: tuple[str, ...], is_moe: bool, quantized: bool, state_layers: bool,
) -> bool:
    """Whether this release runs the model on Model Runner V2 by default (VllmConfig.use_v2_model_runner).

    `state_layers`: the model has mamba/linear-attention layers (hybrids never ran MRV2 by default before 0.29).
    """
    rule = profile.v2_runner_default
    archs = set(architectures)
    if rule == "none":
        return False
    if rule == "qwen3_dense":
        return "Qwen3ForCausalLM" in archs and not is_moe and not quantized
    if rule == "listed":
        return bool(archs & _V2_LISTED)
    if rule == "dense":
        return bool(archs & _V2_MOE) or (not is_moe and not state_layers)
    return True


def profile_for(version: str | None) -> VersionProfile:
    """The era rules for a release (None → the newest known release)."""
    wanted = parse_version(version or NEWEST_KNOWN_VERSION)
    eras = _eras()
    chosen = eras[0]
    for era in eras:
        if parse_version(era.since) <= wanted:
            chosen = era
    text = ".".join(str(p) for p in wanted)
    return chosen.model_copy(update={"version": text})


class BatchDefaults(BaseModel):
    model_config = ConfigDict(frozen=True)

    max_num_seqs: int
    max_num_batched_tokens: int
    reason: str


def batch_defaults(
    profile: VersionProfile,
    *,
    gpu_memory_gib: float,
    is_a100: bool,
    max_model_len: int,
    chunked_prefill: bool = True,
    compute_capability: str | None = None,
) -> BatchDefaults:
    """vLLM's own max_num_seqs / max_num_batched_tokens defaults for the OpenAI server (EngineArgs.get_batch_defaults)."""
    if profile.batch_defaults == "v0":
        if max_model_len > 32768 or chunked_prefill and max_model_len > 32768:
            return BatchDefaults(max_num_seqs=256, max_num_batched_tokens=512,
                                 reason="V0 default: chunked prefill (auto above 32k context) with 512 tokens")
        return BatchDefaults(max_num_seqs=256, max_num_batched_tokens=max(max_model_len, 2048),
                             reason="V0 default: 256 sequences, max(max_model_len, 2048) batched tokens")
    huge = gpu_memory_gib >= 160 and profile.batch_defaults in ("v1_160", "v1_160_gb10")
    gb10 = compute_capability == "12.1" and profile.batch_defaults == "v1_160_gb10"
    large = gpu_memory_gib >= 70 and not (is_a100 and profile.batch_defaults != "v1_early") and not gb10
    if huge:
        # engine/arg_utils.py::get_batch_defaults, 0.28+: B200/GB200/B300, MI300X-class
        seqs, tokens = 1024, 16384
        why = "vLLM default on GPUs with >= 160 GiB (0.28+): 1024 sequences, 16384 batched tokens"
    elif large:
        seqs, tokens = 1024, 8192
        why = "vLLM default on GPUs with >= 70 GiB (not A100): 1024 sequences, 8192 batched tokens"
    else:
        seqs, tokens = 256, 2048
        why = "vLLM default on GPUs under 70 GiB (and A100): 256 sequences, 2048 batched tokens"
        if gb10:
            why = "vLLM default on GB10 / DGX Spark (0.33+): 256 sequences, 2048 batched tokens"
    if not chunked_prefill:
        tokens = max(tokens, max_model_len)
    tokens = min(tokens, seqs * max_model_len)
    seqs = min(seqs, tokens)
    return BatchDefaults(max_num_seqs=seqs, max_num_batched_tokens=tokens, reason=why)
