"""The `VLLMService` API, version v1alpha1: the single source of truth for the CRD.

`vllm_operator.api.crd` generates the CustomResourceDefinition from these models, so every field
description here is what `kubectl explain vllmservice.spec...` shows.

The conventions every model follows (camelCase aliases, strict spec and tolerant status models, defaults in code,
CEL rules mirrored in Python) are in `vllm_operator.api.schema`. The models are split by concept: the spec here,
the Pod API's types in `podtypes`, status in `status`, vLLM's flag vocabulary in `flags`, validation errors for
people in `errors`; this module re-exports the names code imports from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

# The api/ modules this one is built from: one compact block per module, since many names are only
# re-exported (see __all__) so that code importing them from v1alpha1 keeps working.
# isort: off
from .schema import (
    API_VERSION_PATTERN, CelRule, DATA_KEY_PATTERN, DNS1035_LABEL_PATTERN, DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN, ENV_NAME_PATTERN, EXTENDED_RESOURCE_PATTERN, FIELD_PATH_PATTERN, FreeForm,
    HF_MODEL_ID_PATTERN, IMAGE_PATTERN, inline_json_problem, INT32_MAX, _LABEL_KEY,
    LABEL_KEY_PATTERN, LABEL_VALUE_PATTERN, LORA_NAME_PATTERN, LORA_SOURCE_PATTERN, MAX_CONTEXT_TOKENS,
    MAX_INLINE_JSON_BYTES, MAX_INLINE_JSON_DEPTH, MAX_INLINE_JSON_KEYS, MAX_MODEL_LEN_AUTO, _Model,
    MODEL_SOURCE_PATTERN, MOUNT_PATH_PATTERN, PROMETHEUS_URL_PATTERN, Quantity, QUANTITY_PATTERN,
    _raise_violations, RESOURCE_NAME_PATTERN, REVISION_PATTERN, RuleViolation, SERVED_NAME_PATTERN,
    SERVER_SIDE_DEFAULT, _short, SPECULATIVE_METHOD_PATTERN, TOLERATION_KEY_PATTERN, VLLM_VERSION_PATTERN,
)
from .flags import (
    BlockSize, flag_key, flag_name, FlagMap, flags_from_api, FlagValue, KVCacheDType, managed_flag_of,
    MaxLoraRank, MaxModelLen, ModelDType, OPERATOR_OWNED_FLAGS, Quantization, QUANTIZATION_METHODS,
    vllm_cli_flag, VLLM_SHORT_FLAGS,
)
from .podtypes import (
    Affinity, EnvVar, EnvVarSource, KeySelector, LabelKey, LabelSelector, LabelSelectorRequirement,
    LabelValue, MAX_AFFINITY_ITEMS, NodeAffinity, NodeSelector, NodeSelectorFieldRequirement,
    NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector, PodAffinity, PodAffinityTerm,
    PreferredSchedulingTerm, ResourceFieldSelector, Toleration, WeightedPodAffinityTerm,
)
from .status import (
    ColdStartStatus, Condition, GPUStatus, GroupFailureStatus, KVCacheStatus, MemoryBreakdown,
    MetricsStatus, ModelCacheStatus, MultiNodeStatus, PlanFailure, PlanOption, PlanStatus, RemediationEvent,
    RemediationStatus, ShareMemberStatus, ShareStatus, StageStatus, VLLMServiceStatus,
)
from .errors import (
    MAX_SPEC_BYTES, MAX_SPEC_DEPTH, parse_spec_as, spec_problems, SpecError, SpecValidationError,
)
from .errors import _model_class as _model_class  # noqa: F401  (tests read it here)
from .schema import _PATTERN_WORDS as _PATTERN_WORDS  # noqa: F401  (tests read it here)
from .model_config import ModelConfigSubset, SafetensorsIndexSubset, typed_json
# isort: on

__all__ = [
    "API_VERSION", "CRD_NAME", "DEFAULT_GPU_MAX_COUNT", "DEFAULT_HF_TOKEN_KEY", "DEFAULT_IMAGE",
    "DEFAULT_MODEL_CACHE_MOUNT_PATH", "DEFAULT_SERVICE_PORT", "GROUP", "KIND", "PLURAL",
    "QUANTIZATION_METHODS", "SHORT_NAMES", "SINGULAR", "VERSION", "CelRule", "Affinity", "Condition",
    "ConfigMapModelRef", "EnvVar", "EnvVarSource", "FlagValue", "GPURequest", "GPUStatus",
    "HFTokenSecretRef", "MemoryBreakdown", "MetricsStatus", "ModelCacheSpec", "ModelCacheStatus",
    "ModelSpec", "PinnedFlags", "PlanFailure", "PlanOption", "PlanStatus", "PrometheusSpec",
    "RemediationEvent", "RemediationSpec", "RemediationStatus", "ResourcesSpec", "RuleViolation",
    "SecuritySpec", "ServiceSpec", "SpecError", "SpecValidationError", "Toleration", "VLLMService",
    "VLLMServiceSpec", "VLLMServiceStatus", "WorkloadSpec", "flag_key", "flag_name", "flags_from_api",
    "parse_spec", "validate_spec", "SpeculativeConfig", "vllm_cli_flag",
]

#: Names that live in api/schema.py, flags.py, podtypes.py, status.py and errors.py (split by concept) and are
#: still imported from here.
__all__ += [
    "SERVER_SIDE_DEFAULT", "QUANTITY_PATTERN", "HF_MODEL_ID_PATTERN", "SERVED_NAME_PATTERN",
    "VLLM_VERSION_PATTERN", "DNS1035_LABEL_PATTERN", "MODEL_SOURCE_PATTERN", "REVISION_PATTERN",
    "IMAGE_PATTERN", "DNS1123_SUBDOMAIN_PATTERN", "DATA_KEY_PATTERN", "MOUNT_PATH_PATTERN",
    "LABEL_VALUE_PATTERN", "LABEL_KEY_PATTERN", "TOLERATION_KEY_PATTERN", "ENV_NAME_PATTERN",
    "MAX_INLINE_JSON_BYTES", "MAX_INLINE_JSON_DEPTH", "MAX_INLINE_JSON_KEYS", "MAX_CONTEXT_TOKENS",
    "MAX_MODEL_LEN_AUTO", "INT32_MAX", "Quantity", "FreeForm", "inline_json_problem",
    "FlagMap", "Quantization", "KVCacheDType", "ModelDType", "BlockSize", "MaxLoraRank",
    "SPECULATIVE_METHOD_PATTERN", "MaxModelLen", "OPERATOR_OWNED_FLAGS", "VLLM_SHORT_FLAGS",
    "DNS1123_LABEL_PATTERN", "API_VERSION_PATTERN", "FIELD_PATH_PATTERN", "RESOURCE_NAME_PATTERN",
    "KeySelector", "ObjectFieldSelector", "ResourceFieldSelector", "MAX_AFFINITY_ITEMS", "LabelKey",
    "LabelValue", "NodeSelectorRequirement", "NodeSelectorFieldRequirement", "NodeSelectorTerm",
    "NodeSelector", "PreferredSchedulingTerm", "NodeAffinity", "LabelSelectorRequirement", "LabelSelector",
    "PodAffinityTerm", "WeightedPodAffinityTerm", "PodAffinity", "EXTENDED_RESOURCE_PATTERN",
    "LORA_NAME_PATTERN", "LORA_SOURCE_PATTERN", "PROMETHEUS_URL_PATTERN", "StageStatus",
    "GroupFailureStatus", "MultiNodeStatus", "ShareMemberStatus", "ShareStatus", "KVCacheStatus",
    "ColdStartStatus", "MAX_SPEC_DEPTH", "MAX_SPEC_BYTES",
]

# --------------------------------------------------------------------------------------------------
# Identity of the API
# --------------------------------------------------------------------------------------------------

GROUP = "vllm-operator.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "VLLMService"
PLURAL = "vllmservices"
SINGULAR = "vllmservice"
SHORT_NAMES: tuple[str, ...] = ("vllms", "vllm")
CRD_NAME = f"{PLURAL}.{GROUP}"

# --------------------------------------------------------------------------------------------------
# Defaults (in code, not in the CRD: see the conventions in api/schema.py)
# --------------------------------------------------------------------------------------------------

#: The vLLM image used when `spec.image` is unset: the newest release whose memory rules the planner knows.
DEFAULT_IMAGE = "vllm/vllm-openai:v0.33.0"  # its release is planner.versions.NEWEST_KNOWN_VERSION (one place)
DEFAULT_GPU_MAX_COUNT = 8
DEFAULT_HF_TOKEN_KEY = "HF_TOKEN"
DEFAULT_MODEL_CACHE_MOUNT_PATH = "/root/.cache/huggingface"
DEFAULT_SERVICE_PORT = 8000
DEFAULT_CONFIG_KEY = "config.json"
DEFAULT_SAFETENSORS_INDEX_KEY = "model.safetensors.index.json"

#: A model's config.json, inline: the keys the planner reads, typed to a fixed depth (`api/model_config.py`); the
#: API server prunes the rest. Bounded in size and depth first (see `inline_json_problem`). A plain dict in Python.
InlineConfig = Annotated[dict[str, Any], typed_json(ModelConfigSubset, inline_json_problem)]
#: A model's safetensors index, inline: only its total size (`metadata.total_size` or `totalSize`).
InlineIndex = Annotated[dict[str, Any], typed_json(SafetensorsIndexSubset, inline_json_problem)]


# --------------------------------------------------------------------------------------------------
# spec.model
# --------------------------------------------------------------------------------------------------


class ConfigMapModelRef(_Model):
    """A ConfigMap in the VLLMService's namespace holding the model's config.json and safetensors index."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="Name of the ConfigMap, in the VLLMService's namespace.",
    )
    config_key: str = Field(
        default=DEFAULT_CONFIG_KEY,
        min_length=1,
        max_length=253,
        pattern=DATA_KEY_PATTERN,
        description=f"Key holding the model's config.json. Defaults to `{DEFAULT_CONFIG_KEY}`.",
    )
    safetensors_index_key: str = Field(
        default=DEFAULT_SAFETENSORS_INDEX_KEY,
        min_length=1,
        max_length=253,
        pattern=DATA_KEY_PATTERN,
        description=(
            "Key holding the model's safetensors index (its `metadata.total_size` gives the weights' size). "
            f"Defaults to `{DEFAULT_SAFETENSORS_INDEX_KEY}`; a missing key is not an error."
        ),
    )


class ModelSpec(_Model):
    """The model to serve and the facts the planner needs about it."""

    name: str = Field(
        min_length=1,
        max_length=200,
        pattern=HF_MODEL_ID_PATTERN,
        description=(
            "Hugging Face model id, e.g. `Qwen/Qwen2.5-7B-Instruct`, or a built-in catalog id. Passed to vLLM as "
            "the model. Never read as a path by the operator."
        ),
    )
    revision: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        pattern=REVISION_PATTERN,
        description="Branch, tag or commit of the model repository. Defaults to the repository's main branch.",
    )
    config: InlineConfig | None = Field(
        default=None,
        description=(
            "The model's config.json, inline: only the keys the planner reads (architecture, layers, heads, hidden "
            "size, context length, rope scaling, dtype, quantization_config, text_config/vision_config, ...; typed, "
            "a few levels deep). The API server drops any other key (kubectl's default strict validation refuses it "
            "instead: keep only these keys, or apply with --validate=warn). To give the whole file, put it in a "
            "ConfigMap and use `configMapRef`. "
            "When neither this nor `configMapRef` is set the operator uses its built-in catalog or fetches "
            "config.json from the Hugging Face Hub. Inline values win over `configMapRef`."
        ),
    )
    safetensors_index: InlineIndex | None = Field(
        default=None,
        description=(
            "The model's model.safetensors.index.json, inline, or just `{totalSize: <bytes>}`. Only the weights' "
            "total size is kept (`metadata.total_size` or `totalSize`); `weight_map` is dropped. The full file "
            "can go in the ConfigMap of `configMapRef`."
        ),
    )
    config_map_ref: ConfigMapModelRef | None = Field(
        default=None,
        description="Read config.json and the safetensors index from a ConfigMap instead of the Hugging Face Hub.",
    )
    quantization: Quantization | None = Field(
        default=None,
        description=(
            "How the checkpoint is quantized, as vLLM names it (config.json `quantization_config.quant_method`). "
            "Used to size the weights when config.json does not say; `flags.quantization` pins vLLM's "
            "`--quantization` separately."
        ),
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=SERVED_NAME_PATTERN,
        description="Name clients use in the OpenAI API (`--served-model-name`). Defaults to `name`.",
    )

    def weights_bytes(self) -> int | None:
        """Total size of the weights from the inline safetensors index, or None when not given inline."""
        index = self.safetensors_index
        if not index:
            return None
        metadata = index.get("metadata")
        candidates = [index.get("totalSize")]
        if isinstance(metadata, dict):
            candidates.insert(0, metadata.get("total_size"))
        for value in candidates:
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    @model_validator(mode="after")
    def _check_rules(self) -> ModelSpec:
        violations: list[RuleViolation] = []
        if self.safetensors_index is not None and self.weights_bytes() is None:
            violations.append(
                RuleViolation(
                    "safetensors-index-total-size",
                    "safetensorsIndex",
                    "must contain the weights' size in bytes as `metadata.total_size` (as in "
                    "model.safetensors.index.json) or `totalSize`, a positive integer",
                )
            )
        _raise_violations(violations)
        return self


# --------------------------------------------------------------------------------------------------
# spec.gpu
# --------------------------------------------------------------------------------------------------


class ShareSpec(_Model):
    """`spec.gpu.share`: run this service on a GPU it shares with other services of its namespace (issue 26)."""

    group: str = Field(
        min_length=1,
        max_length=63,
        pattern=DNS1035_LABEL_PATTERN,
        description=(
            "Share group: the services of one namespace that name the same group are packed onto shared GPUs of one "
            "pool by memory arithmetic (each member's --gpu-memory-utilization is its share of the GPU's total). "
            "A service alone in its group runs as without `share`."
        ),
    )
    memory_gib: float | None = Field(
        default=None,
        alias="memoryGiB",
        gt=0,
        le=4096,
        description=(
            "This service's budget on the shared GPU in GiB (vLLM's --gpu-memory-utilization × the GPU's total). "
            "When unset the planner gives it the smallest budget that meets its workload, plus its part of what the "
            "GPU has left (in proportion to the KV cache each member's workload needs)."
        ),
    )


class GPURequest(_Model):
    """Which GPUs each pod gets. Everything is optional: the operator discovers and plans what is unset.

    (`spec.gpu`, what the user asks for; the hardware itself, one catalog entry, is `planner.gpus.GPUSpec`.)
    """

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="gpu-share-one-gpu",
            rule="!has(self.share) || !has(self.count) || self.count == 1",
            message="gpu.share packs one-GPU services: leave gpu.count unset or 1",
            field_path=".share",
        ),
        CelRule(
            id="gpu-count-within-max-count",
            rule=(
                f"!has(self.count) || self.count <= (has(self.maxCount) ? self.maxCount : {DEFAULT_GPU_MAX_COUNT})"
            ),
            message=f"gpu.count must not exceed gpu.maxCount (default {DEFAULT_GPU_MAX_COUNT}); "
            "raise gpu.maxCount or lower gpu.count",
            field_path=".count",
        ),
    )

    product: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description=(
            "GPU product: a catalog name (e.g. `H100-80GB`) or a GPU Feature Discovery label value "
            "(`nvidia.com/gpu.product`, e.g. `NVIDIA-H100-80GB-HBM3`). When set, pods are scheduled on nodes "
            "with that product. When unset, the operator discovers it from the labels of the schedulable nodes."
        ),
    )
    count: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "GPUs per pod. When unset the planner picks the smallest count (tensor parallel size) that fits "
            "the model and the workload, up to `maxCount`."
        ),
    )
    max_count: int = Field(
        default=DEFAULT_GPU_MAX_COUNT,
        ge=1,
        le=64,
        description=(
            "Upper bound on GPUs per pod for the planner and for remediation that steps up. "
            f"Defaults to {DEFAULT_GPU_MAX_COUNT}."
        ),
    )
    max_nodes: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "How many nodes one replica may span (default 1: one pod, a Deployment). With more, and only when one "
            "node's GPUs cannot meet the objective, the plan spans nodes: vLLM's native multi-node mode on one "
            "LeaderWorkerSet (leaderworkerset.x-k8s.io) group per replica, one pod per node with `count` (all) "
            "GPUs, tensor parallel inside a node and pipeline parallel across nodes."
        ),
    )
    memory_gib: float | None = Field(
        default=None,
        alias="memoryGiB",
        gt=0,
        le=4096,
        description=(
            "Total memory of one GPU in GiB. Overrides the catalog and the `nvidia.com/gpu.memory` node label; "
            "use it for MIG slices or GPUs missing from the catalog."
        ),
    )

    share: ShareSpec | None = Field(
        default=None,
        description=(
            "Share a GPU with other services of this namespace (same `share.group`): needs NVIDIA's DRA driver or "
            "the device plugin's time-slicing; compute and memory bandwidth are shared, and with time-slicing memory "
            "is not isolated (docs/packing.md)."
        ),
    )

    def _violations(self) -> list[RuleViolation]:
        if self.share is not None and self.count is not None and self.count != 1:
            return [RuleViolation("gpu-share-one-gpu", "share",
                                  "gpu.share packs one-GPU services: leave gpu.count unset or 1")]
        if self.count is not None and self.count > self.max_count:
            return [
                RuleViolation(
                    "gpu-count-within-max-count",
                    "count",
                    f"gpu.count ({self.count}) exceeds gpu.maxCount ({self.max_count}); "
                    "raise gpu.maxCount or lower gpu.count",
                )
            ]
        return []

    @model_validator(mode="after")
    def _check_rules(self) -> GPURequest:
        _raise_violations(self._violations())
        return self


# --------------------------------------------------------------------------------------------------
# spec.flags
# --------------------------------------------------------------------------------------------------


_DRAFT_METHODS = ("eagle", "eagle3", "draft_model")


class SpeculativeConfig(_Model):
    """`--speculative-config` (vLLM 0.8.2+), rendered as vLLM's JSON with snake_case keys.

    The planner books the draft's weights, its KV pages and a sampler sized for k + 1 tokens per sequence
    (README, "Speculative decoding").
    """

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="speculative-draft-needs-model",
            rule="!(self.method in ['eagle', 'eagle3', 'draft_model']) || has(self.model)",
            message="flags.speculativeConfig.model (the draft's model id) is required for eagle, eagle3 and "
                    "draft_model",
            field_path=".model",
        ),
        CelRule(
            id="speculative-needs-tokens",
            rule="self.method.endsWith('mtp') || has(self.numSpeculativeTokens)",
            message="flags.speculativeConfig.numSpeculativeTokens is required unless the method is MTP "
                    "(vLLM refuses to start otherwise)",
            field_path=".numSpeculativeTokens",
        ),
    )

    method: Annotated[str, StringConstraints(pattern=SPECULATIVE_METHOD_PATTERN, max_length=64)] = Field(
        description="`method`: eagle, eagle3, mtp (or `<model>_mtp`), ngram, ngram_gpu, suffix or draft_model."
    )
    num_speculative_tokens: int | None = Field(
        default=None, ge=1, le=64, description="`num_speculative_tokens`: draft tokens proposed per step (k)."
    )
    model: Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=MODEL_SOURCE_PATTERN)] | None = Field(
        default=None, description="`model`: the draft model or EAGLE head (a Hugging Face id, or an absolute path in "
        "the container)."
    )
    draft_tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=64, description="`draft_tensor_parallel_size`: GPUs the draft is split across."
    )

    def to_vllm(self) -> str:
        """The flag's value: compact JSON with vLLM's key names."""
        return json.dumps({name: value for name, value in self if value is not None}, separators=(",", ":"),
                          sort_keys=True)

    def _violations(self) -> list[RuleViolation]:
        out: list[RuleViolation] = []
        if self.method in _DRAFT_METHODS and self.model is None:
            out.append(RuleViolation("speculative-draft-needs-model", "model", self.CEL_RULES[0].message))
        if not self.method.endswith("mtp") and self.num_speculative_tokens is None:
            out.append(RuleViolation("speculative-needs-tokens", "numSpeculativeTokens", self.CEL_RULES[1].message))
        return out

    @model_validator(mode="after")
    def _check_rules(self) -> SpeculativeConfig:
        _raise_violations(self._violations())
        return self


class PinnedFlags(_Model):
    """vLLM flags pinned by the user.

    The planner never changes a pinned flag, and neither does remediation: it plans around them, and
    reports the plan infeasible when a pin makes it so. Unset flags are planned.
    """

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="max-lora-rank-needs-lora",
            rule="!has(self.maxLoraRank) || (has(self.enableLora) && self.enableLora)",
            message="flags.maxLoraRank only applies with flags.enableLora: true; set enableLora or remove maxLoraRank",
            field_path=".maxLoraRank",
        ),
        CelRule(
            id="batched-tokens-at-least-seqs",
            rule=(
                "!has(self.maxNumBatchedTokens) || !has(self.maxNumSeqs) "
                "|| self.maxNumBatchedTokens >= self.maxNumSeqs"
            ),
            message="flags.maxNumBatchedTokens must be at least flags.maxNumSeqs (vLLM refuses to start otherwise)",
            field_path=".maxNumBatchedTokens",
        ),
    )

    tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=64, description="`--tensor-parallel-size`: GPUs each layer is split across."
    )
    pipeline_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="`--pipeline-parallel-size`: pipeline stages (GPUs per pod = TP x PP x DP).",
    )
    data_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "`--data-parallel-size`: engine replicas inside one pod, each TP x PP GPUs with its own KV cache; the "
            "MoE layers of a MoE model run across all of them (vLLM 0.8.3+). GPUs per pod = DP x TP x PP. Opt-in: "
            "the planner never chooses it."
        ),
    )
    enable_expert_parallel: bool | None = Field(
        default=None,
        description=(
            "`--enable-expert-parallel`: MoE layers place whole experts on the TP x DP ranks instead of splitting "
            "every expert (vLLM 0.8.0+). Opt-in: the planner never chooses it."
        ),
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="`--gpu-memory-utilization`: fraction of each GPU's total memory vLLM may use, in (0, 1].",
    )
    max_model_len: MaxModelLen | None = Field(
        default=None,
        description=(
            "`--max-model-len`: the longest prompt + output, in tokens; `auto`: vLLM (0.14.0+) fits the longest "
            "context whose KV cache fits the memory it measures at startup, and the plan says which length that is."
        ),
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, le=2**20, description="`--max-num-seqs`: the most sequences scheduled in one step."
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, le=MAX_CONTEXT_TOKENS,
        description="`--max-num-batched-tokens`: the most tokens scheduled in one step.",
    )
    kv_cache_dtype: KVCacheDType | None = Field(
        default=None, description="`--kv-cache-dtype`: data type of the KV cache; fp8 halves its size."
    )
    quantization: Quantization | None = Field(
        default=None, description="`--quantization`: the quantization kernel vLLM uses for the weights."
    )
    dtype: ModelDType | None = Field(
        default=None, description="`--dtype`: data type of weights and activations."
    )
    enforce_eager: bool | None = Field(
        default=None,
        description="`--enforce-eager`: disable CUDA graphs (saves their memory, costs latency).",
    )
    block_size: BlockSize | None = Field(
        default=None, description="`--block-size`: tokens per KV cache block."
    )
    enable_prefix_caching: bool | None = Field(
        default=None, description="`--enable-prefix-caching` / `--no-enable-prefix-caching`."
    )
    enable_chunked_prefill: bool | None = Field(
        default=None, description="`--enable-chunked-prefill` / `--no-enable-chunked-prefill`."
    )
    cpu_offload_gb: float | None = Field(
        default=None, ge=0, le=4096, description="`--cpu-offload-gb`: GiB of weights per GPU kept in host memory."
    )
    swap_space: float | None = Field(
        default=None, ge=0, le=4096,
        description="`--swap-space`: GiB of host memory per GPU for swapped KV blocks (vLLM < 0.18).",
    )
    enable_lora: bool | None = Field(default=None, description="`--enable-lora`: serve LoRA adapters.")
    max_lora_rank: MaxLoraRank | None = Field(
        default=None, description="`--max-lora-rank`: the largest LoRA rank served (needs `enableLora`)."
    )
    trust_remote_code: bool | None = Field(
        default=None, description="`--trust-remote-code`: run the model repository's own Python code."
    )
    kv_cache_memory_bytes: int | None = Field(
        default=None,
        ge=1,
        le=2**50,
        description=(
            "`--kv-cache-memory-bytes`: KV cache size per GPU in bytes. vLLM then skips sizing the cache from "
            "`gpuMemoryUtilization` (which still bounds the startup free-memory check)."
        ),
    )

    speculative_config: SpeculativeConfig | None = Field(
        default=None,
        description="`--speculative-config`: speculative decoding (EAGLE/EAGLE-3 head, MTP layers, n-gram or a "
                    "draft model); its weights, KV and the k + 1 tokens per sequence are planned.",
    )

    def to_vllm(self) -> dict[str, Any]:
        """The pinned flags by vLLM's snake_case name (`max_model_len`), set fields only."""
        return {name: value.to_vllm() if isinstance(value, SpeculativeConfig) else value
                for name, value in self if value is not None}

    @classmethod
    def field_path(cls, name: str) -> str:
        """`spec.flags.<camelCase>` for a flag given by its vLLM (snake_case) or camelCase name."""
        for field_name, info in cls.model_fields.items():
            alias = info.alias or field_name
            if name in (field_name, alias):
                return f"spec.flags.{alias}"
        raise KeyError(f"{name!r} is not a pinnable vLLM flag")

    def _violations(self) -> list[RuleViolation]:
        out: list[RuleViolation] = []
        if self.max_lora_rank is not None and not self.enable_lora:
            out.append(
                RuleViolation(
                    "max-lora-rank-needs-lora",
                    "maxLoraRank",
                    "flags.maxLoraRank only applies with flags.enableLora: true; "
                    "set enableLora or remove maxLoraRank",
                )
            )
        if (
            self.max_num_batched_tokens is not None
            and self.max_num_seqs is not None
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            out.append(
                RuleViolation(
                    "batched-tokens-at-least-seqs",
                    "maxNumBatchedTokens",
                    f"flags.maxNumBatchedTokens ({self.max_num_batched_tokens}) is below flags.maxNumSeqs "
                    f"({self.max_num_seqs}); vLLM refuses to start: raise maxNumBatchedTokens or lower maxNumSeqs",
                )
            )
        return out

    @model_validator(mode="after")
    def _check_rules(self) -> PinnedFlags:
        _raise_violations(self._violations())
        return self


# --------------------------------------------------------------------------------------------------
# spec.workload, spec.resources, scheduling, env, secrets, cache, remediation, service, prometheus
# --------------------------------------------------------------------------------------------------


class WorkloadSpec(_Model):
    """What the traffic looks like. The planner sizes max-model-len and max-num-seqs from it."""

    context_length: int | None = Field(
        default=None,
        ge=1,
        le=MAX_CONTEXT_TOKENS,
        description=(
            "Typical longest request: p99 of prompt + output tokens. The planner keeps max-model-len at least "
            "this long. When unset it plans for the model's full context, as far as memory allows."
        ),
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=2**20,
        description="Peak number of requests in flight per replica that should not queue.",
    )
    prefix_caching: bool | None = Field(
        default=None,
        description="Requests share long prefixes (system prompts, documents); the planner enables prefix caching.",
    )
    profile: Literal["chat", "agent", "batch", "rag"] | None = Field(
        default=None,
        description=(
            "Shape of the traffic: `chat` (short prompts, latency), `agent` (long growing contexts, prefix reuse), "
            "`batch` (throughput over latency), `rag` (long prompts, short outputs). Fills in what is unset above."
        ),
    )


class ResourcesSpec(_Model):
    """Host resources of the vLLM container. GPUs come from `spec.gpu`."""

    memory: Quantity | None = Field(
        default=None,
        description=(
            "Host memory request and limit, e.g. `64Gi`. When unset the operator sizes it from the weights, "
            "since vLLM stages them in host memory while loading."
        ),
    )
    cpu: Quantity | None = Field(default=None, description="CPU request, e.g. `8` or `7500m`.")
    shm_size: Quantity | None = Field(
        default=None,
        description="Size of the /dev/shm memory volume (NCCL uses it with tensor parallelism), e.g. `16Gi`.",
    )


class HFTokenSecretRef(_Model):
    """A Secret holding a Hugging Face token, for gated models."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="Name of the Secret, in the VLLMService's namespace.",
    )
    key: str = Field(
        default=DEFAULT_HF_TOKEN_KEY,
        min_length=1,
        max_length=253,
        pattern=DATA_KEY_PATTERN,
        description=f"Key of the token in the Secret. Defaults to `{DEFAULT_HF_TOKEN_KEY}`.",
    )


#: The vLLM pod's own mount paths (render/manifests.py), which the model cache cannot take.
RESERVED_MOUNT_PATHS = {"/dev/shm": "shared-memory volume", "/tmp": "temporary-files volume (restricted profile)",
                        "/home/vllm": "home volume (restricted profile)"}


class PrewarmSpec(_Model):
    """Pull the vLLM image and fill the model cache on the pool's nodes before the first pod is created."""

    enabled: bool = Field(default=True, description="Prewarm before the workload is created. Defaults to true.")
    keep: bool = Field(
        default=False,
        description="Keep the prewarm DaemonSet once it is done, so that nodes joining the pool are warmed too "
                    "(it holds no GPU: an init container pulls, a pause container stays). Defaults to false: it "
                    "is deleted once every node of the pool is warm.",
    )


class ModelCacheSpec(_Model):
    """Where downloaded weights are kept across pod restarts: a PersistentVolumeClaim (an existing one, or one the
    operator creates), else the operator's default cache; and whether the pool's nodes are warmed first."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="model-cache-claim-or-size",
            rule="!(has(self.claimName) && has(self.size))",
            message="set only one of modelCache.claimName (use an existing PVC) "
            "or modelCache.size (have the operator create one); neither: the operator's default cache",
        ),
        CelRule(
            id="model-cache-storage-class-needs-size",
            rule="!has(self.storageClassName) || has(self.size)",
            message="modelCache.storageClassName applies only to a PVC the operator creates; set modelCache.size",
            field_path=".storageClassName",
        ),
    )

    claim_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="Use this existing PVC.",
    )
    size: Quantity | None = Field(
        default=None, description="Have the operator create a PVC of this size, e.g. `200Gi`."
    )
    storage_class_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN, description="Storage class of the PVC the operator creates."
    )
    mount_path: str = Field(
        default=DEFAULT_MODEL_CACHE_MOUNT_PATH,
        max_length=1024,
        pattern=MOUNT_PATH_PATTERN,
        description=f"Where the cache is mounted (the Hugging Face cache). Defaults to `{DEFAULT_MODEL_CACHE_MOUNT_PATH}`. "
        "Not one of the pod's own volumes: " + ", ".join(RESERVED_MOUNT_PATHS) + ".",
    )

    prewarm: PrewarmSpec | None = Field(
        default=None,
        description="Pull the vLLM image and fill the cache on the nodes of the chosen pool before the first pod is "
                    "created (a DaemonSet on those nodes, no GPU requested), so the first start is warm; the "
                    "Deployment or LeaderWorkerSet is created (or updated, when the image, model or pool changes) "
                    "once every node reports done. Progress in status.modelCache.prewarm.",
    )

    @field_validator("mount_path")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        # The operator-only mirror of the pod's own mounts (a second volume on a mount path is a 422 from the API
        # server, so the Deployment would never be written); the CRD bounds the path's shape only.
        if value in RESERVED_MOUNT_PATHS:
            raise ValueError(f"{value} is where the pod mounts its own {RESERVED_MOUNT_PATHS[value]}; choose another "
                             f"path, such as the default {DEFAULT_MODEL_CACHE_MOUNT_PATH}")
        return value

    def _violations(self) -> list[RuleViolation]:
        out: list[RuleViolation] = []
        if self.claim_name is not None and self.size is not None:
            out.append(
                RuleViolation(
                    "model-cache-claim-or-size",
                    "claimName",
                    "set only one of modelCache.claimName (use an existing PVC) "
                    "or modelCache.size (have the operator create one); neither: the operator's default cache",
                )
            )
        if self.storage_class_name is not None and self.size is None:
            out.append(
                RuleViolation(
                    "model-cache-storage-class-needs-size",
                    "storageClassName",
                    "modelCache.storageClassName applies only to a PVC the operator creates; set modelCache.size",
                )
            )
        return out

    @model_validator(mode="after")
    def _check_rules(self) -> ModelCacheSpec:
        _raise_violations(self._violations())
        return self


class RemediationSpec(_Model):
    """The bounded ladder of safer flags the operator walks when vLLM pods fail to start or run out of memory."""

    enabled: bool = Field(
        default=True, description="Change unpinned flags after classified failures. Defaults to true."
    )
    max_steps: int = Field(
        default=5,
        ge=0,
        le=50,
        description="Give up (condition Degraded, reason RemediationExhausted) after this many steps. Defaults to 5.",
    )
    min_interval_seconds: int = Field(
        default=60, ge=0, le=7 * 86400, description="Least time between two steps, in seconds. Defaults to 60."
    )
    allow_step_up: bool = Field(
        default=False,
        description=(
            "After stableWindowSeconds without a failure, retry the richer profile the plan chose before the "
            "ladder's last step (one step back at a time). Defaults to false: stability first."
        ),
    )
    stable_window_seconds: int = Field(
        default=3600,
        ge=0,
        le=30 * 86400,
        description=(
            "With allowStepUp: how long the service must run without a failure before the operator tries one "
            "step back toward the plan. Defaults to 3600."
        ),
    )
    max_group_recreations: int = Field(
        default=5,
        ge=0,
        le=100,
        description=(
            "Multi-node services: how many times LeaderWorkerSet may recreate a group after a pod failure under one "
            "plan before the service is Degraded (reason GroupRecreationsExhausted). Defaults to 5."
        ),
    )


class ServiceSpec(_Model):
    """The Service in front of the vLLM pods."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="Service type. Defaults to ClusterIP."
    )
    port: int = Field(
        default=DEFAULT_SERVICE_PORT,
        ge=1,
        le=65535,
        description=f"Port of the OpenAI-compatible API (vLLM's `--port`). Defaults to {DEFAULT_SERVICE_PORT}.",
    )


class SecuritySpec(_Model):
    """The vLLM pod's security context."""

    profile: Literal["baseline", "restricted"] = Field(
        default="baseline",
        description=(
            "`baseline` (default): no service-account token, no privilege escalation, all capabilities dropped, "
            "seccomp RuntimeDefault; the container runs as the image's user (root in vllm/vllm-openai). "
            "`restricted`: also runs as the numeric non-root `runAsUser` with HOME, the Hugging Face cache, "
            "Triton/torch/vLLM caches and /tmp on writable volumes, so the pod passes Pod Security `restricted`."
        ),
    )
    run_as_user: int = Field(
        default=1000,
        ge=1,
        le=INT32_MAX,
        description="With profile `restricted`: the user (and group, fsGroup) id vLLM runs as. Defaults to 1000.",
    )


class RDMAResource(_Model):
    """One extended resource of an RDMA device plugin that every pod of a group requests."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="rdma-resource-is-not-the-gpu",
            rule="!self.name.startsWith('nvidia.com/gpu') && !self.name.startsWith('kubernetes.io/')",
            message="GPUs come from spec.gpu, and kubernetes.io/ names are not device plugins' resources",
            field_path=".name",
        ),
    )

    name: str = Field(
        max_length=253,
        pattern=EXTENDED_RESOURCE_PATTERN,
        description=(
            "The resource name, e.g. `rdma/rdma_shared_device_a` (k8s-rdma-shared-dev-plugin), `rdma/ib` or "
            "`nvidia.com/hostdev` (SR-IOV network operator)."
        ),
    )
    count: int = Field(ge=1, le=64, description="How many each pod requests (request = limit).")

    @model_validator(mode="after")
    def _check_rules(self) -> RDMAResource:
        if self.name.startswith(("nvidia.com/gpu", "kubernetes.io/")):
            _raise_violations([RuleViolation(
                "rdma-resource-is-not-the-gpu", "name",
                f"{self.name}: GPUs come from spec.gpu, and kubernetes.io/ names are not device plugins' resources")])
        return self


class NetworkSpec(_Model):
    """The path between the nodes of a replica that spans nodes (a LeaderWorkerSet group): RDMA / InfiniBand
    passthrough. Applies only to the pods of a multi-node plan; NCCL_* / GLOO_SOCKET_IFNAME go in spec.env."""

    rdma_resources: list[RDMAResource] = Field(
        default_factory=list,
        max_length=4,
        description=(
            "Extended resources of an RDMA device plugin added to every pod of a group (requests and limits), so "
            "NCCL can use InfiniBand / RoCE (NET/IB) instead of TCP sockets."
        ),
    )
    ipc_lock: bool = Field(
        default=False,
        description=(
            "Add the IPC_LOCK capability to the vLLM container of every pod of a group: RDMA pins (locks) memory "
            "for its queues, and GPUDirect RDMA needs it. Not allowed with security.profile `restricted` (Pod "
            "Security `restricted` forbids added capabilities). Defaults to false."
        ),
    )


class PrometheusSpec(_Model):
    """Prometheus integration."""

    enabled: bool = Field(
        default=False,
        description=(
            "Make vLLM's /metrics discoverable by Prometheus, and read KV cache usage, preemptions and queue "
            "length back into status.metrics. Defaults to false."
        ),
    )


# --------------------------------------------------------------------------------------------------
# spec
# --------------------------------------------------------------------------------------------------


def _tp_times_pp(flags: str) -> str:
    tp = f"(has({flags}.tensorParallelSize) ? {flags}.tensorParallelSize : 1)"
    pp = f"(has({flags}.pipelineParallelSize) ? {flags}.pipelineParallelSize : 1)"
    return f"{tp} * {pp}"


# --------------------------------------------------------------------------------------------------
# spec.lora (issue 14)
# --------------------------------------------------------------------------------------------------


MAX_LORA_SLOTS = 256


class LoRAAdapter(_Model):
    """One LoRA adapter vLLM loads at startup (`--lora-modules name=source`)."""

    name: str = Field(min_length=1, max_length=128, pattern=LORA_NAME_PATTERN,
                      description="The name clients put in the request's `model` field.")
    source: str = Field(min_length=1, max_length=1024, pattern=LORA_SOURCE_PATTERN,
                        description="A Hugging Face repository id (downloaded into the model cache) or an absolute "
                        "path in the container.")


class LoRASpec(_Model):
    """Serve LoRA adapters on the base model. vLLM reserves GPU memory for `maxLoras` adapters of `maxRank`
    while the model loads; the planner takes it out of the KV cache."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="lora-adapter-names-unique",
            rule="!has(self.adapters) || self.adapters.all(a, self.adapters.exists_one(b, b.name == a.name))",
            message="lora.adapters names must be unique",
            field_path=".adapters",
        ),
    )

    adapters: list[LoRAAdapter] = Field(default_factory=list, max_length=64,
                                        description="Adapters loaded at startup. More can be loaded at run time "
                                        "through vLLM's API when VLLM_ALLOW_RUNTIME_LORA_UPDATING is set.")
    max_rank: MaxLoraRank | None = Field(default=None, description="`--max-lora-rank`: the largest adapter rank. "
                                         "Defaults to vLLM's 16 (or flags.maxLoraRank). Older releases accept "
                                         "fewer values (1 from 0.11.1, 320/512 from 0.8.0, 128/256 from 0.5.5): "
                                         "the operator checks it against the image's release.")
    max_loras: int | None = Field(default=None, ge=1, le=MAX_LORA_SLOTS,
                                  description="`--max-loras`: adapters in one batch (GPU slots). Defaults to the "
                                  "number of adapters (at least 1).")

    def to_vllm(self, pinned_rank: int | None = None) -> dict[str, Any]:
        """The vLLM flags this asks for, snake_case."""
        out: dict[str, Any] = {"enable_lora": True,
                               "max_loras": self.max_loras or max(len(self.adapters), 1)}
        rank = self.max_rank or pinned_rank
        if rank is not None:
            out["max_lora_rank"] = rank
        if self.adapters:
            out["lora_modules"] = tuple(f"{a.name}={a.source}" for a in self.adapters)
        return out

    def _violations(self) -> list[RuleViolation]:
        names = [a.name for a in self.adapters]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            return [RuleViolation("lora-adapter-names-unique", "adapters",
                                  f"lora.adapters names must be unique (repeated: {_short(duplicates[0])})")]
        return []

    @model_validator(mode="after")
    def _check_rules(self) -> LoRASpec:
        _raise_violations(self._violations())
        return self


# --------------------------------------------------------------------------------------------------
# spec.autoscaling, spec.routing (issue 14)
# --------------------------------------------------------------------------------------------------


#: The smallest per-pod target: the HPA's quantity in thousandths (`1m`); below it the target would render as 0.
MIN_AUTOSCALING_TARGET = 0.001


class AutoscalingMetric(_Model):
    """One vLLM signal the autoscaler follows, per pod."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(id="kv-cache-usage-is-a-fraction", rule="self.type != 'KVCacheUsage' || double(self.target) <= 1.0",
                message="a KVCacheUsage target is a fraction of the KV cache, at most 1 (e.g. 0.8)",
                field_path=".target"),
    )

    type: Literal["WaitingRequests", "RunningRequests", "KVCacheUsage"] = Field(
        description="WaitingRequests / RunningRequests: `vllm:num_requests_waiting` / `vllm:num_requests_running` "
        "per pod; KVCacheUsage: `vllm:kv_cache_usage_perc` (a fraction) per pod.")
    target: float = Field(ge=MIN_AUTOSCALING_TARGET, le=1_000_000,
                          description="The per-pod value the autoscaler keeps the metric at; at least 0.001 (an HPA "
                          "target is a quantity in thousandths: a smaller one would be 0, which it refuses).")

    def _violations(self) -> list[RuleViolation]:
        if self.type == "KVCacheUsage" and self.target > 1:
            return [RuleViolation("kv-cache-usage-is-a-fraction", "target",
                                  f"a KVCacheUsage target is a fraction of the KV cache, at most 1 (got {self.target})")]
        return []

    @model_validator(mode="after")
    def _check_rules(self) -> AutoscalingMetric:
        _raise_violations(self._violations())
        return self


class AutoscalingSpec(_Model):
    """An autoscaler (HorizontalPodAutoscaler or KEDA ScaledObject) on the VLLMService's scale subresource. It writes
    spec.replicas; the operator follows spec.replicas and never scales the pods itself (its metrics watch only
    recommends, in status)."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(id="autoscaling-min-at-most-max", rule="!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
                message="autoscaling.minReplicas must not exceed autoscaling.maxReplicas", field_path=".minReplicas"),
        CelRule(id="scale-to-zero-needs-keda",
                rule="!has(self.minReplicas) || self.minReplicas > 0 || (has(self.engine) && self.engine == 'KEDA' "
                "&& has(self.activationQuery))",
                message="autoscaling.minReplicas 0 needs engine KEDA and an activationQuery (vLLM's own metrics "
                "vanish with its last pod: something outside the pods must wake the service)",
                field_path=".minReplicas"),
        CelRule(id="keda-needs-prometheus", rule="!has(self.engine) || self.engine != 'KEDA' || "
                "has(self.prometheusAddress)",
                message="engine KEDA reads vLLM's metrics from Prometheus: set autoscaling.prometheusAddress",
                field_path=".prometheusAddress"),
        CelRule(id="activation-query-is-keda", rule="!has(self.activationQuery) || "
                "(has(self.engine) && self.engine == 'KEDA')",
                message="autoscaling.activationQuery applies to engine KEDA only", field_path=".activationQuery"),
    )

    engine: Literal["HPA", "KEDA"] = Field(default="HPA", description="HPA: an autoscaling/v2 "
                                           "HorizontalPodAutoscaler (needs a custom-metrics adapter such as "
                                           "prometheus-adapter); KEDA: a keda.sh/v1alpha1 ScaledObject with "
                                           "Prometheus triggers. Defaults to HPA.")
    min_replicas: int = Field(default=1, ge=0, le=INT32_MAX, description="Fewest pods; 0 (KEDA only) scales to zero.")
    max_replicas: int = Field(ge=1, le=INT32_MAX, description="Most pods.")
    metrics: list[AutoscalingMetric] = Field(
        default_factory=list, max_length=3,
        description="The signals; empty: WaitingRequests with target 5 per pod.")
    prometheus_address: str | None = Field(default=None, max_length=1024, pattern=PROMETHEUS_URL_PATTERN,
                                           description="KEDA: Prometheus' base URL, e.g. "
                                           "http://prometheus.monitoring:9090.")
    activation_query: str | None = Field(default=None, min_length=1, max_length=4096,
                                         description="KEDA: a PromQL query whose value > 0 wakes a service scaled "
                                         "to zero (e.g. the gateway's request rate for it).")
    cooldown_seconds: int = Field(default=300, ge=0, le=86400,
                                  description="Wait this long after the last busy sample before removing pods "
                                  "(KEDA cooldownPeriod; the HPA's scale-down stabilization window).")

    def _violations(self) -> list[RuleViolation]:
        out: list[RuleViolation] = []
        if self.min_replicas > self.max_replicas:
            out.append(RuleViolation("autoscaling-min-at-most-max", "minReplicas",
                                     f"autoscaling.minReplicas ({self.min_replicas}) must not exceed "
                                     f"autoscaling.maxReplicas ({self.max_replicas})"))
        if self.min_replicas == 0 and not (self.engine == "KEDA" and self.activation_query):
            out.append(RuleViolation("scale-to-zero-needs-keda", "minReplicas",
                                     "autoscaling.minReplicas 0 needs engine KEDA and an activationQuery (vLLM's "
                                     "own metrics vanish with its last pod: something outside the pods must wake "
                                     "the service)"))
        if self.engine == "KEDA" and not self.prometheus_address:
            out.append(RuleViolation("keda-needs-prometheus", "prometheusAddress",
                                     "engine KEDA reads vLLM's metrics from Prometheus: set "
                                     "autoscaling.prometheusAddress"))
        if self.activation_query and self.engine != "KEDA":
            out.append(RuleViolation("activation-query-is-keda", "activationQuery",
                                     "autoscaling.activationQuery applies to engine KEDA only"))
        return out

    @model_validator(mode="after")
    def _check_rules(self) -> AutoscalingSpec:
        _raise_violations(self._violations())
        return self


class EndpointPickerRef(_Model):
    """The Gateway API Inference Extension's endpoint picker (a Service) the InferencePool names."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS1035_LABEL_PATTERN,
                      description="The endpoint picker's Service, in the VLLMService's namespace.")
    port: int = Field(default=9002, ge=1, le=65535, description="Its gRPC port. Defaults to 9002.")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose", description="What the gateway does when the picker does not answer.")


class InferencePoolSpec(_Model):
    """An `inference.networking.k8s.io/v1` InferencePool over the service's pods (prefix-cache and load aware
    endpoint picking by a Gateway API Inference Extension gateway)."""

    enabled: bool = Field(default=False, description="Render the InferencePool.")
    endpoint_picker: EndpointPickerRef | None = Field(
        default=None, description="The endpoint picker the gateway asks; unset: the pool names none (set it "
        "when your gateway needs one per pool).")


class RoutingSpec(_Model):
    """Routing integrations."""

    inference_pool: InferencePoolSpec = Field(default_factory=InferencePoolSpec,
                                              description="Gateway API Inference Extension InferencePool.")


class VLLMServiceSpec(_Model):
    """Desired state of a VLLMService: a model served by vLLM on GPUs, with flags planned by the operator."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="parallelism-matches-gpu-count",
            rule=(
                "!has(self.flags) || !has(self.flags.tensorParallelSize) || !has(self.gpu) || !has(self.gpu.count) "
                f"|| {_tp_times_pp('self.flags')} == self.gpu.count "
                f"|| ({_tp_times_pp('self.flags')} % self.gpu.count == 0 "
                f"&& {_tp_times_pp('self.flags')} / self.gpu.count <= "
                "(has(self.gpu.maxNodes) ? self.gpu.maxNodes : 1))"
            ),
            message="flags.tensorParallelSize x flags.pipelineParallelSize must equal gpu.count (GPUs per pod), or "
            "gpu.count x a node count within gpu.maxNodes; change one of them, or unset gpu.count to follow the flags",
            field_path=".flags.tensorParallelSize",
        ),
        CelRule(
            id="pipeline-divides-gpu-count",
            rule=(
                "!has(self.flags) || has(self.flags.tensorParallelSize) || !has(self.flags.pipelineParallelSize) "
                "|| !has(self.gpu) || !has(self.gpu.count) || self.gpu.count % self.flags.pipelineParallelSize == 0"
            ),
            message="gpu.count must be a multiple of flags.pipelineParallelSize",
            field_path=".flags.pipelineParallelSize",
        ),
        CelRule(
            id="parallelism-within-max-count",
            rule=(
                "!has(self.flags) "
                "|| (!has(self.flags.tensorParallelSize) && !has(self.flags.pipelineParallelSize)) "
                "|| (has(self.gpu) && has(self.gpu.count)) "
                f"|| {_tp_times_pp('self.flags')} "
                f"<= (has(self.gpu) && has(self.gpu.maxCount) ? self.gpu.maxCount : {DEFAULT_GPU_MAX_COUNT}) "
                "* (has(self.gpu) && has(self.gpu.maxNodes) ? self.gpu.maxNodes : 1)"
            ),
            message=f"flags.tensorParallelSize x flags.pipelineParallelSize must not exceed gpu.maxCount "
            f"(default {DEFAULT_GPU_MAX_COUNT}) x gpu.maxNodes (default 1); raise one of them or lower the "
            "parallelism",
            field_path=".flags.tensorParallelSize",
        ),
        CelRule(
            id="node-selector-keys-are-label-keys",
            rule=(
                "!has(self.nodeSelector) || self.nodeSelector.all(k, size(k) <= 317 && k.matches('"
                + LABEL_KEY_PATTERN.replace("\\", "\\\\") + "'))"
            ),
            message="nodeSelector keys must be label keys such as example.com/pool",
            field_path=".nodeSelector",
        ),
        CelRule(
            id="max-replicas-at-least-replicas",
            rule="!has(self.maxReplicas) || self.maxReplicas >= (has(self.replicas) ? self.replicas : 1)",
            message="maxReplicas must be at least replicas",
            field_path=".maxReplicas",
        ),
        CelRule(
            id="context-length-within-max-model-len",
            rule=(
                "!has(self.workload) || !has(self.workload.contextLength) || !has(self.flags) "
                "|| !has(self.flags.maxModelLen) || type(self.flags.maxModelLen) != int "
                "|| self.workload.contextLength <= self.flags.maxModelLen"
            ),
            message="workload.contextLength must not exceed the pinned flags.maxModelLen; "
            "raise or unpin flags.maxModelLen",
            field_path=".workload.contextLength",
        ),
        CelRule(
            id="lora-agrees-with-flags",
            rule=(
                "!has(self.lora) || !has(self.flags) || ((!has(self.flags.enableLora) || self.flags.enableLora) && "
                "(!has(self.flags.maxLoraRank) || !has(self.lora.maxRank) || self.flags.maxLoraRank == self.lora.maxRank))"
            ),
            message="spec.lora needs flags.enableLora unset or true, and flags.maxLoraRank (if set) equal to "
            "lora.maxRank; set the rank in one place",
            field_path=".lora",
        ),
        CelRule(
            id="ipc-lock-needs-baseline",
            rule="!has(self.network) || !has(self.network.ipcLock) || !self.network.ipcLock || !has(self.security) "
            "|| !has(self.security.profile) || self.security.profile != 'restricted'",
            message="network.ipcLock adds a capability, which Pod Security restricted forbids; use "
            "security.profile baseline or drop ipcLock",
            field_path=".network.ipcLock",
        ),
        CelRule(
            id="autoscaling-or-max-replicas",
            rule="!has(self.autoscaling) || !has(self.maxReplicas)",
            message="spec.maxReplicas (the operator scales) and spec.autoscaling (an autoscaler scales) exclude "
            "each other; use autoscaling.maxReplicas",
            field_path=".maxReplicas",
        ),
    )

    model: ModelSpec = Field(description="The model to serve.")
    gpu: GPURequest = Field(
        default_factory=GPURequest, description="GPUs per pod; discovered and planned when unset."
    )
    image: str = Field(
        default=DEFAULT_IMAGE,
        min_length=1,
        max_length=1024,
        pattern=IMAGE_PATTERN,
        description=f"vLLM OpenAI server image. Defaults to `{DEFAULT_IMAGE}`.",
    )
    vllm_version: str | None = Field(
        default=None,
        pattern=VLLM_VERSION_PATTERN,
        max_length=64,
        description=(
            "The vLLM release `image` runs (e.g. `0.11.0`), for images whose reference does not say it: pinned by "
            "digest, a mirror tag such as `registry.local/vllm:prod`, or `latest`. Wins over the tag. Without it "
            "such images are planned for the newest release the operator knows, and the PlanFeasible condition "
            "says so."
        ),
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Image pull policy of the vLLM container. Defaults to Kubernetes' default."
    )
    flags: PinnedFlags = Field(
        default_factory=PinnedFlags,
        description="vLLM flags pinned by you. The planner and remediation never change these; unset flags are planned.",
    )
    extra_args: list[Annotated[str, StringConstraints(max_length=4096)]] = Field(
        default_factory=list,
        max_length=128,
        description=(
            "Arguments appended verbatim after the planned ones. Flags the operator plans or sets "
            "(see `flags`, `model`, `service.port`) are rejected here: pin them in `flags` instead."
        ),
    )
    workload: WorkloadSpec = Field(
        default_factory=WorkloadSpec,
        description="What the traffic looks like; the planner sizes the flags for it.",
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=INT32_MAX,
        json_schema_extra={SERVER_SIDE_DEFAULT: True},
        description=(
            "Number of vLLM pods. Defaults to 1. This is the only field with a server-side default: the scale "
            "subresource (kubectl scale, HorizontalPodAutoscaler) needs it present."
        ),
    )
    max_replicas: int | None = Field(
        default=None, ge=1, le=INT32_MAX, description="Upper bound for scaling (by you, an autoscaler or the operator)."
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, description="Host memory, CPU and /dev/shm."
    )
    node_selector: dict[str, Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE_PATTERN)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Node labels the pods must match, in addition to the GPU product's.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Pod tolerations (e.g. for GPU taints)."
    )
    affinity: Affinity | None = Field(default=None, description="Pod affinity, as in the Pod API.")
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=256,
        description="Extra environment variables for the vLLM container.",
    )
    hf_token_secret_ref: HFTokenSecretRef | None = Field(
        default=None, description="Secret with a Hugging Face token, for gated or private models."
    )
    model_cache: ModelCacheSpec | None = Field(
        default=None,
        description="Keep downloaded weights on a PersistentVolumeClaim. Unset: an emptyDir per pod.",
    )
    lora: LoRASpec | None = Field(default=None, description="Serve LoRA adapters (`--enable-lora`).")
    autoscaling: AutoscalingSpec | None = Field(default=None, description="Scale on vLLM's metrics with an HPA or "
                                                "KEDA (they write spec.replicas through the scale subresource).")
    routing: RoutingSpec | None = Field(default=None, description="Routing integrations (InferencePool).")
    remediation: RemediationSpec = Field(
        default_factory=RemediationSpec,
        description="How the operator reacts to out-of-memory and startup failures.",
    )
    service: ServiceSpec = Field(default_factory=ServiceSpec, description="The Service in front of the pods.")
    prometheus: PrometheusSpec = Field(default_factory=PrometheusSpec, description="Prometheus integration.")
    security: SecuritySpec = Field(
        default_factory=SecuritySpec, description="The vLLM pod's security context (least privilege by default)."
    )
    network: NetworkSpec = Field(
        default_factory=NetworkSpec,
        description="RDMA / InfiniBand passthrough for the pods of a replica that spans nodes (spec.gpu.maxNodes).",
    )

    def _violations(self) -> list[RuleViolation]:
        out: list[RuleViolation] = []
        tp, pp = self.flags.tensor_parallel_size, self.flags.pipeline_parallel_size
        count = self.gpu.count
        world = (tp or 1) * (pp or 1)
        spans = count is not None and world % count == 0 and world // count <= self.gpu.max_nodes
        if tp is not None and count is not None and world != count and not spans:
            out.append(
                RuleViolation(
                    "parallelism-matches-gpu-count",
                    "flags.tensorParallelSize",
                    f"flags.tensorParallelSize ({tp}) x flags.pipelineParallelSize ({pp or 1}) = {tp * (pp or 1)} "
                    f"must equal gpu.count ({count}), or gpu.count x a node count within gpu.maxNodes "
                    f"({self.gpu.max_nodes}); change one of them, or unset gpu.count to follow the flags",
                )
            )
        if tp is None and pp is not None and count is not None and count % pp != 0:
            out.append(
                RuleViolation(
                    "pipeline-divides-gpu-count",
                    "flags.pipelineParallelSize",
                    f"gpu.count ({count}) must be a multiple of flags.pipelineParallelSize ({pp})",
                )
            )
        if (
            count is None
            and (tp is not None or pp is not None)
            and (tp or 1) * (pp or 1) > self.gpu.max_count * self.gpu.max_nodes
        ):
            out.append(
                RuleViolation(
                    "parallelism-within-max-count",
                    "flags.tensorParallelSize" if tp is not None else "flags.pipelineParallelSize",
                    f"flags.tensorParallelSize x flags.pipelineParallelSize = {(tp or 1) * (pp or 1)} GPUs exceeds "
                    f"gpu.maxCount ({self.gpu.max_count})"
                    + (f" x gpu.maxNodes ({self.gpu.max_nodes})" if self.gpu.max_nodes > 1 else "")
                    + "; raise gpu.maxCount or lower the parallelism",
                )
            )
        bad_keys = [k for k in self.node_selector if len(k) > 317 or not _LABEL_KEY.fullmatch(k)]
        if bad_keys:
            out.append(
                RuleViolation(
                    "node-selector-keys-are-label-keys",
                    "nodeSelector",
                    f"nodeSelector keys must be label keys such as example.com/pool (got {_short(bad_keys[0])})",
                )
            )
        if self.network.ipc_lock and self.security.profile == "restricted":
            out.append(
                RuleViolation(
                    "ipc-lock-needs-baseline",
                    "network.ipcLock",
                    "network.ipcLock adds a capability, which Pod Security restricted forbids; use "
                    "security.profile baseline or drop ipcLock",
                )
            )
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            out.append(
                RuleViolation(
                    "max-replicas-at-least-replicas",
                    "maxReplicas",
                    f"maxReplicas ({self.max_replicas}) is below replicas ({self.replicas}); "
                    "raise maxReplicas or lower replicas",
                )
            )
        ctx, max_len = self.workload.context_length, self.flags.max_model_len
        if ctx is not None and isinstance(max_len, int) and ctx > max_len:  # `auto` fits what the GPU holds
            out.append(
                RuleViolation(
                    "context-length-within-max-model-len",
                    "workload.contextLength",
                    f"workload.contextLength ({ctx}) exceeds the pinned flags.maxModelLen ({max_len}): such requests "
                    "would be rejected; raise or unpin flags.maxModelLen",
                )
            )
        if self.lora is not None and (self.flags.enable_lora is False or (
                self.flags.max_lora_rank is not None and self.lora.max_rank is not None
                and self.flags.max_lora_rank != self.lora.max_rank)):
            out.append(RuleViolation("lora-agrees-with-flags", "lora",
                                     "spec.lora needs flags.enableLora unset or true, and flags.maxLoraRank (if set) "
                                     "equal to lora.maxRank; set the rank in one place"))
        if self.autoscaling is not None and self.max_replicas is not None:
            out.append(RuleViolation("autoscaling-or-max-replicas", "maxReplicas",
                                     "spec.maxReplicas (the operator scales) and spec.autoscaling (an autoscaler "
                                     "scales) exclude each other; use autoscaling.maxReplicas"))
        for index, arg in enumerate(self.extra_args):
            managed = managed_flag_of(arg, PinnedFlags.model_fields)
            if managed is None:
                continue
            if managed in PinnedFlags.model_fields:
                where = f"pin it as {PinnedFlags.field_path(managed)} instead"
            elif OPERATOR_OWNED_FLAGS[managed]:
                where = f"set {OPERATOR_OWNED_FLAGS[managed]} instead"
            else:
                where = "the operator sets it; remove it"
            out.append(
                RuleViolation(
                    "extra-args-not-managed",
                    f"extraArgs[{index}]",
                    f"{arg.split('=', 1)[0]!r} duplicates {vllm_cli_flag(managed)}, which the operator manages: {where}",
                )
            )
        return out

    @model_validator(mode="after")
    def _check_rules(self) -> VLLMServiceSpec:
        _raise_violations(self._violations())
        return self


class VLLMService(_Model):
    """A model served by vLLM, with its flags planned from the GPUs' memory and adjusted after failures."""

    api_version: Literal["vllm-operator.dev/v1alpha1"] = Field(default="vllm-operator.dev/v1alpha1")
    kind: Literal["VLLMService"] = "VLLMService"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: VLLMServiceSpec
    status: VLLMServiceStatus | None = None


# --------------------------------------------------------------------------------------------------
# Validation for people: field paths and fixes (api/errors.py), bound to this version's spec
# --------------------------------------------------------------------------------------------------


def parse_spec(obj: Mapping[str, Any]) -> VLLMServiceSpec:
    """Parse a spec, or a whole VLLMService object's spec. Raises SpecValidationError with field paths."""
    return parse_spec_as(VLLMServiceSpec, obj)


def validate_spec(obj: Mapping[str, Any]) -> list[SpecError]:
    """Problems with a spec (or a whole VLLMService object's spec); empty when it is valid.

    Each error names the field as a dotted camelCase path (`spec.flags.gpuMemoryUtilization`,
    `spec.env[2].valueFrom`) and says what to change, ready for a condition message or an event.
    """
    return spec_problems(VLLMServiceSpec, obj)
