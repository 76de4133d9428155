"""The `VLLMService` API, version v1alpha1: the single source of truth for the CRD.

`vllm_operator.api.crd` generates the CustomResourceDefinition from these models, so every field
description here is what `kubectl explain vllmservice.spec...` shows.

Conventions:

* Python attributes are snake_case; YAML/JSON names are camelCase (`alias_generator=to_camel`), and both
  are accepted on input (`populate_by_name=True`). Spec models reject unknown fields (`extra="forbid"`)
  so a typo such as `maxModelLength` is reported instead of silently ignored. They are strict about
  JSON types (`enforceEager: "yes"` is an error, not True), as the API server is.
* Defaults live here, in code, and are *not* emitted as server-side `default:` in the CRD. A server-side
  default rewrites every stored object, so a GitOps tool sees a diff between git and the cluster for a
  field nobody wrote. The one exception is `spec.replicas` (see its description): the scale subresource
  fails a GET when the replicas path is absent, so it must always be present.
* Cross-field rules are written twice on purpose: as CEL (`x-kubernetes-validations`, enforced by the
  API server at admission) and as Python checks here (the operator, the CLI preview and the emulated API
  server in tests do not run CEL). Each CEL rule has an `id`; the Python check reporting the same
  violation uses the same id, and the tests check that every CEL rule has its mirror.
* Status models ignore unknown fields: status is written by the operator only, and an older or newer
  operator must still be able to read what another version wrote.
"""

from __future__ import annotations

import difflib
import json
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    WrapSerializer,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from ..quantity import quantity_problem
from .switch import WorkloadSwitch

__all__ = [
    "API_VERSION",
    "CRD_NAME",
    "DEFAULT_GPU_MAX_COUNT",
    "DEFAULT_HF_TOKEN_KEY",
    "DEFAULT_IMAGE",
    "DEFAULT_MODEL_CACHE_MOUNT_PATH",
    "DEFAULT_SERVICE_PORT",
    "GROUP",
    "KIND",
    "PLURAL",
    "QUANTIZATION_METHODS",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "CelRule",
    "Affinity",
    "Condition",
    "ConfigMapModelRef",
    "EnvVar",
    "EnvVarSource",
    "FlagValue",
    "GPURequest",
    "GPUStatus",
    "HFTokenSecretRef",
    "MemoryBreakdown",
    "MetricsStatus",
    "ModelCacheSpec",
    "ModelCacheStatus",
    "ModelSpec",
    "PinnedFlags",
    "PlanFailure",
    "PlanOption",
    "PlanStatus",
    "PrometheusSpec",
    "RemediationEvent",
    "RemediationSpec",
    "RemediationStatus",
    "ResourcesSpec",
    "RuleViolation",
    "SecuritySpec",
    "ServiceSpec",
    "SpecError",
    "SpecValidationError",
    "Toleration",
    "VLLMService",
    "VLLMServiceSpec",
    "VLLMServiceStatus",
    "WorkloadSpec",
    "flag_key",
    "flag_name",
    "flags_from_api",
    "parse_spec",
    "validate_spec",
    "SpeculativeConfig",
    "vllm_cli_flag",
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
# Defaults (in code, not in the CRD: see the module docstring)
# --------------------------------------------------------------------------------------------------

#: The vLLM image used when `spec.image` is unset: the newest release whose memory rules the planner knows.
DEFAULT_IMAGE = "vllm/vllm-openai:v0.33.0"  # its release is planner.versions.NEWEST_KNOWN_VERSION (one place)
DEFAULT_GPU_MAX_COUNT = 8
DEFAULT_HF_TOKEN_KEY = "HF_TOKEN"
DEFAULT_MODEL_CACHE_MOUNT_PATH = "/root/.cache/huggingface"
DEFAULT_SERVICE_PORT = 8000
DEFAULT_CONFIG_KEY = "config.json"
DEFAULT_SAFETENSORS_INDEX_KEY = "model.safetensors.index.json"

#: Marks the one field whose pydantic default is also emitted as a server-side CRD default.
SERVER_SIDE_DEFAULT = "x-vllm-operator-server-side-default"

# --------------------------------------------------------------------------------------------------
# Reusable field types
# --------------------------------------------------------------------------------------------------

#: Kubernetes' resource.Quantity syntax, without a sign (requests are never negative).
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

#: A Hugging Face repository id: `name` or `org/name`; no leading, trailing or doubled `.`, `_`, `-` (the hub
#: refuses `..` and `--`), so it can never be read as a path.
HF_MODEL_ID_PATTERN = r"^[A-Za-z0-9]+([._-][A-Za-z0-9]+)*(/[A-Za-z0-9]+([._-][A-Za-z0-9]+)*)?$"

#: A name clients send in the OpenAI API's `model` field (`--served-model-name`).
SERVED_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$"

#: A vLLM release as `spec.vllmVersion` takes it: `0.11.0`, `v0.26.0`, `0.11.1+cu128` or `latest`. ASCII digits:
#: pydantic's `\d` (Rust regex) also takes other scripts' digits, the API server's (RE2) does not.
VLLM_VERSION_PATTERN = r"^(latest|v?[0-9]+\.[0-9]+(\.[0-9]+)?([.+-][0-9A-Za-z.+-]*)?)$"

#: A DNS-1035 label: the name of a Service.
DNS1035_LABEL_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

#: A model, draft or adapter vLLM loads: a Hugging Face repository id, or an absolute path in the container whose
#: segments are never `.` or `..` (MOUNT_PATH_PATTERN, defined below).
MODEL_SOURCE_PATTERN = r"^(" + HF_MODEL_ID_PATTERN[1:-1] + r"|(/\.?[A-Za-z0-9_-][A-Za-z0-9._-]*)+)$"

#: A git revision of a hub repository (branch, tag or commit): no whitespace, no `..`.
REVISION_PATTERN = r"^[A-Za-z0-9]+([._/-][A-Za-z0-9]+)*$"

#: An OCI image reference: [registry[:port]/]repository[:tag][@sha256:digest] (the distribution grammar).
IMAGE_PATTERN = (
    r"^([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:[0-9]{1,5})?/)?"
    r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)

#: A DNS-1123 subdomain: the names of ConfigMaps, Secrets, PVCs and StorageClasses.
DNS1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

#: A key of a ConfigMap or Secret.
DATA_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"

#: An absolute mount path: segments of letters, digits, `.`, `_`, `-`; a segment never is `.` or `..`.
MOUNT_PATH_PATTERN = r"^(/\.?[A-Za-z0-9_-][A-Za-z0-9._-]*)+$"

#: A label value (nodeSelector values, the GPU product a node carries).
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

#: A label key: optional DNS-subdomain prefix, then a name of at most 63 characters.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)

#: A toleration key: a label key, or empty (with operator Exists: every taint).
TOLERATION_KEY_PATTERN = r"^(" + LABEL_KEY_PATTERN[1:-1] + ")?$"

_LABEL_KEY = re.compile(LABEL_KEY_PATTERN.removesuffix("$") + r"\Z")

#: An environment variable name, as the Pod API accepts it.
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

#: The largest inline `spec.model.config` / `safetensorsIndex`, as compact JSON (a real config.json is < 20 KiB).
MAX_INLINE_JSON_BYTES = 256 * 1024
#: The deepest nesting of an inline config (real ones nest 3 levels: text_config.rope_scaling.{...}).
MAX_INLINE_JSON_DEPTH = 16
#: The most top-level keys of an inline config (CRD `maxProperties`; real ones have < 100).
MAX_INLINE_JSON_KEYS = 1024

#: The largest context the planner accepts (2^24 tokens; the longest released models have 10M).
MAX_CONTEXT_TOKENS = 2**24
#: `maxModelLen: auto` / `--max-model-len auto` (also -1): vLLM auto-fits the context length at startup
MAX_MODEL_LEN_AUTO = "auto"
INT32_MAX = 2**31 - 1


def _quantity_from_int(value: Any) -> Any:
    # YAML `cpu: 4` arrives as an int; Kubernetes accepts it, so do we. bool is an int subclass: refuse it.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


#: A Kubernetes quantity such as `64Gi`, `500m` or `4`, stored as a string.
def _quantity_in_range(value: str) -> str:
    # the pattern admits `1e400` and `99999999999999999999Ei`; Kubernetes holds a quantity in an int64
    problem = quantity_problem(value)
    if problem:
        raise ValueError(problem)
    return value


Quantity = Annotated[
    str,
    BeforeValidator(_quantity_from_int),
    StringConstraints(pattern=QUANTITY_PATTERN),
    AfterValidator(_quantity_in_range),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]

#: An arbitrary JSON object kept as-is by the API server (no pruning, no schema).
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]

#: A model's config.json or safetensors index, inline: free-form, but bounded (see `inline_json_problem`).
InlineJSON = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                    "maxProperties": MAX_INLINE_JSON_KEYS}),
]


def inline_json_problem(value: Any) -> str | None:
    """Why an inline JSON document is too big or too deep for the operator, or None. Walks iteratively, so a
    deeply nested document cannot exhaust the stack, and stops as soon as a bound is passed."""
    budget = MAX_INLINE_JSON_BYTES
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_INLINE_JSON_DEPTH:
            return f"nests deeper than {MAX_INLINE_JSON_DEPTH} levels; give the model's own config.json"
        if isinstance(item, Mapping):
            if len(item) > MAX_INLINE_JSON_KEYS:
                return f"has more than {MAX_INLINE_JSON_KEYS} keys in one object; give the model's own config.json"
            budget -= 2 + sum(len(str(k)) + 4 for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            budget -= 2 + len(item)
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str):
            budget -= len(item) + 2
        else:
            budget -= 8
        if budget < 0:
            return (f"is larger than {MAX_INLINE_JSON_BYTES // 1024} KiB; give the model's own config.json "
                    "(a real one is a few KiB), or use configMapRef")
    return None

#: The value of one vLLM flag: a bool, a number or a string.
FlagValue = bool | int | float | str | list[str]  # lists: nargs options (--lora-modules)

_SNAKE_PART = re.compile(r"_([a-z0-9])")
_CAMEL_HUMP = re.compile(r"([A-Z])")


def flag_key(name: str) -> str:
    """The API (camelCase) key of a vLLM flag given by its snake_case name: `max_model_len` -> `maxModelLen`.

    The same spelling as `spec.flags` uses (pydantic's `to_camel`), so `status.plan.flags.maxModelLen` and
    `spec.flags.maxModelLen` name one flag. Already camelCase names are returned unchanged."""
    return _SNAKE_PART.sub(lambda m: m.group(1).upper(), name)


def flag_name(key: str) -> str:
    """vLLM's snake_case name of a flag given by its API key: `maxModelLen` -> `max_model_len`.

    The inverse of `flag_key` for snake_case names made of lowercase words; snake_case input is returned
    unchanged, so a status written by an older operator (snake_case keys) reads the same."""
    return _CAMEL_HUMP.sub(lambda m: "_" + m.group(1).lower(), key)


def flags_from_api(flags: Any) -> Any:
    """A flag map as stored in status (camelCase keys) keyed by vLLM's snake_case names; anything else as is.

    The one reader of raw status flag maps (`status.plan.flags`, `status.remediation.profile`, a history
    entry's `flagsBefore`/`flagsAfter`/`profileBefore`): code that reads a status dict without parsing it
    into the models below goes through this."""
    if not isinstance(flags, Mapping):
        return flags
    return {flag_name(str(key)): value for key, value in flags.items()}


def _flags_to_api(flags: dict[str, FlagValue], handler: Any, info: Any) -> Any:
    if info.by_alias:
        flags = {flag_key(key): value for key, value in flags.items()}
    return handler(flags)


#: vLLM flags keyed by vLLM's snake_case name (`max_model_len`) in Python, e.g. a plan or a remediation
#: profile; the API (status) spells the keys in camelCase (`maxModelLen`), as `spec.flags` does. Both
#: spellings are read.
FlagMap = Annotated[
    dict[str, FlagValue],
    BeforeValidator(flags_from_api),
    WrapSerializer(_flags_to_api),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]

#: vLLM's `--quantization` methods (vLLM 0.11). Also the values of `quant_method` in a config.json.
Quantization = Literal[
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "gptq_marlin_24",
    "gptq_bitblas",
    "bitblas",
    "fp8",
    "ptpc_fp8",
    "fbgemm_fp8",
    "modelopt",
    "modelopt_fp4",
    "compressed-tensors",
    "bitsandbytes",
    "gguf",
    "hqq",
    "experts_int8",
    "moe_wna16",
    "torchao",
    "quark",
    "auto-round",
    "inc",
    "rtn",
    "mxfp4",
    "petit_nvfp4",
    "tpu_int8",
    "ipex",
]
QUANTIZATION_METHODS: tuple[str, ...] = get_args(Quantization)

KVCacheDType = Literal["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"]
ModelDType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
BlockSize = Literal[1, 8, 16, 32, 64, 128]
MaxLoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]


# --------------------------------------------------------------------------------------------------
# Cross-field rules: CEL for the API server, mirrored by Python checks
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CelRule:
    """One `x-kubernetes-validations` entry. `self` in `rule` is the object of the model that owns it."""

    id: str
    rule: str
    message: str
    field_path: str | None = None  # Kubernetes fieldPath, relative to the rule's object: ".count"

    def to_k8s(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


@dataclass(frozen=True)
class RuleViolation:
    """A cross-field rule that a model breaks. `field` is camelCase, relative to the model."""

    rule: str
    field: str
    message: str


def _json_schema_extra(schema: dict[str, Any], cls: type[Any]) -> None:
    rules: tuple[CelRule, ...] = getattr(cls, "CEL_RULES", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.to_k8s() for rule in rules]


def _raise_violations(violations: list[RuleViolation]) -> None:
    if violations:
        raise PydanticCustomError(
            "spec_rule",
            "; ".join(f"{v.field}: {v.message}" for v in violations),
            {"violations": [{"rule": v.rule, "field": v.field, "message": v.message} for v in violations]},
        )


class _Model(BaseModel):
    """Base of every spec model: camelCase aliases, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,
        protected_namespaces=(),
        json_schema_extra=_json_schema_extra,
    )

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """The object as Kubernetes stores it: camelCase keys, JSON types, unset (None) fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class _StatusModel(_Model):
    """Base of status models: tolerant of fields written by another operator version."""

    model_config = ConfigDict(extra="ignore", strict=False)


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
    config: InlineJSON | None = Field(
        default=None,
        description=(
            "The model's config.json, inline (at most 256 KiB, 16 levels deep). The planner reads the architecture "
            "(layers, heads, hidden size, max_position_embeddings, dtype) from it, bounded before any arithmetic. "
            "When neither this nor `configMapRef` is set the operator uses its built-in catalog or fetches "
            "config.json from the Hugging Face Hub. Inline values win over `configMapRef`."
        ),
    )
    safetensors_index: InlineJSON | None = Field(
        default=None,
        description=(
            "The model's model.safetensors.index.json, inline, or just `{totalSize: <bytes>}`. Only the weights' "
            "total size is used (`metadata.total_size` or `totalSize`)."
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
        for field, value in (("config", self.config), ("safetensorsIndex", self.safetensors_index)):
            problem = inline_json_problem(value) if value is not None else None
            if problem:
                violations.append(RuleViolation("inline-json-bounded", field, problem))
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


def vllm_cli_flag(name: str) -> str:
    """vLLM's command-line spelling of a snake_case option: `max_model_len` -> `--max-model-len`."""
    return "--" + name.replace("_", "-")


#: `--speculative-config` methods the planner models (vllm/config/speculative.py, 0.33), or `<model>_mtp`.
SPECULATIVE_METHOD_PATTERN = r"^(eagle|eagle3|mtp|ngram|ngram_gpu|suffix|draft_model|[a-z0-9_]+_mtp)$"
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


def _length_or_auto(value: Any) -> int | Literal["auto"]:
    """`maxModelLen`: a whole number in [16, MAX_CONTEXT_TOKENS] or `auto`, one error for anything else (a union
    would report one per branch)."""
    if value == MAX_MODEL_LEN_AUTO:
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError("int_or_auto", "must be a whole number or auto")
    if value < 16:
        raise PydanticCustomError("greater_than_equal", "must be greater than or equal to 16")
    if value > MAX_CONTEXT_TOKENS:
        raise PydanticCustomError("less_than_equal", f"must be less than or equal to {MAX_CONTEXT_TOKENS}")
    return value


#: `spec.flags.maxModelLen`: tokens, or `auto`. In the CRD an int-or-string whose bounds apply to the number and
#: whose pattern to the string (JSON Schema applies each only to its own type).
MaxModelLen = Annotated[
    int | Literal["auto"],
    PlainValidator(_length_or_auto),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True,
                    "minimum": 16, "maximum": MAX_CONTEXT_TOKENS, "pattern": "^auto$"}),
]


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


#: vLLM options the operator sets itself from other spec fields (not pinnable through `flags`).
OPERATOR_OWNED_FLAGS: dict[str, str] = {
    "model": "spec.model.name",
    "revision": "spec.model.revision",
    "served_model_name": "spec.model.servedName",
    "port": "spec.service.port",
    "max_loras": "spec.lora.maxLoras",
    "lora_modules": "spec.lora.adapters",
    "host": "",  # the operator binds all interfaces so probes and the Service reach vLLM
}

#: vLLM's short aliases for long options.
VLLM_SHORT_FLAGS: dict[str, str] = {
    "tp": "tensor_parallel_size",
    "pp": "pipeline_parallel_size",
    "dp": "data_parallel_size",
    "q": "quantization",
}


def _managed_flag_of(arg: str) -> str | None:
    """The snake_case vLLM option an extra argument sets, when the operator manages it; else None."""
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit() or arg[1:2] == ".":
        return None  # a value (including a negative number), not an option
    long_form = arg.startswith("--")
    name = arg.lstrip("-").split("=", 1)[0].replace("-", "_")
    if not long_form:
        return VLLM_SHORT_FLAGS.get(name)
    pinnable = PinnedFlags.model_fields
    if name in pinnable or name in OPERATOR_OWNED_FLAGS:
        return name
    negated = name.removeprefix("no_")
    if negated != name and negated in pinnable:
        return negated
    return None


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


class Toleration(_Model):
    """A pod toleration, as in the Pod API."""

    key: str | None = Field(
        default=None, max_length=317, pattern=TOLERATION_KEY_PATTERN,
        description="Taint key; empty with operator Exists matches all taints.",
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="`Exists` or `Equal` (default)."
    )
    value: str | None = Field(
        default=None, max_length=63, pattern=LABEL_VALUE_PATTERN, description="Taint value to match with operator Equal."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=-(2**63), le=2**63 - 1, description="How long a NoExecute taint is tolerated before eviction."
    )


#: A namespace name (a DNS-1123 label), as in PodAffinityTerm.namespaces.
DNS1123_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


#: The Pod API's downward-API selectors: an API version, a field path, a resource name.
API_VERSION_PATTERN = r"^[a-z0-9./]+$"
FIELD_PATH_PATTERN = r"^[A-Za-z0-9_.\[\]'/-]+$"
RESOURCE_NAME_PATTERN = r"^[A-Za-z0-9_./-]+$"


class KeySelector(_Model):
    """A key of a Secret or ConfigMap in the service's namespace, as in the Pod API."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN, description="Object name.")
    key: str = Field(min_length=1, max_length=253, pattern=DATA_KEY_PATTERN, description="The key.")
    optional: bool | None = Field(default=None, description="Start the pod even when the object or key is missing.")


class ObjectFieldSelector(_Model):
    """A field of the pod, as in the Pod API (`metadata.name`, `status.podIP`, ...)."""

    api_version: str | None = Field(default=None, min_length=1, max_length=64, pattern=API_VERSION_PATTERN,
                                    description="Schema version of fieldPath (v1).")
    field_path: str = Field(min_length=1, max_length=256, pattern=FIELD_PATH_PATTERN,
                            description="Path of the field, e.g. metadata.name.")


class ResourceFieldSelector(_Model):
    """A resource of a container, as in the Pod API (`limits.memory`, ...)."""

    container_name: str | None = Field(default=None, min_length=1, max_length=63, pattern=DNS1123_LABEL_PATTERN,
                                       description="The container (default: this one).")
    resource: str = Field(min_length=1, max_length=253, pattern=RESOURCE_NAME_PATTERN,
                          description="The resource, e.g. limits.memory.")
    divisor: Quantity | None = Field(default=None, description="Output unit, e.g. 1Mi (default 1).")


class EnvVarSource(_Model):
    """Where an environment variable's value comes from, as in the Pod API: typed, so the CRD bounds every field."""

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret in the namespace.")
    config_map_key_ref: KeySelector | None = Field(default=None,
                                                   description="A key of a ConfigMap in the namespace.")
    field_ref: ObjectFieldSelector | None = Field(default=None,
                                                  description="A field of the pod, e.g. metadata.name.")
    resource_field_ref: ResourceFieldSelector | None = Field(default=None,
                                                             description="A resource of the container.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        # the Pod API refuses none and more than one (validateEnvVarValueFrom): the Deployment would be a 422
        sources = [name for name, value in self if value is not None]
        if len(sources) != 1:
            raise ValueError("set exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef")
        return self



#: The most items of one list inside `spec.affinity` (the Pod API sets no bound; real rules have a handful).
MAX_AFFINITY_ITEMS = 32

LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317, pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE_PATTERN)]


def _operator_values_problem(operator: str, values: list[str] | None) -> str | None:
    """What the Pod API refuses in a requirement's `values` for its `operator` (validateNodeSelectorRequirement,
    ValidateLabelSelectorRequirement), or None."""
    count = len(values or [])
    if operator in ("In", "NotIn") and count == 0:
        return f"operator {operator} needs at least one value; add values or use Exists"
    if operator in ("Exists", "DoesNotExist") and count:
        return f"operator {operator} takes no values; remove values or use In"
    if operator in ("Gt", "Lt") and (count != 1 or not re.fullmatch(r"-?[0-9]{1,18}", (values or [""])[0])):
        return f"operator {operator} takes exactly one value, an integer such as \"4\""
    return None


#: The CEL mirrors of `_operator_values_problem`: a label selector's operators, then a node selector's (Gt, Lt).
_LABEL_VALUES_CEL = ("self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : "
                     "!has(self.values) || size(self.values) == 0")
_NODE_VALUES_CEL = (
    "self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : "
    "self.operator in ['Exists', 'DoesNotExist'] ? !has(self.values) || size(self.values) == 0 : "
    "has(self.values) && size(self.values) == 1 && self.values[0].matches('^-?[0-9]{1,18}$')"
)
_OPERATOR_VALUES_MESSAGE = "values must fit the operator: In and NotIn take one or more, Exists and DoesNotExist none"


def _check_operator_values(rule: str, operator: str, values: list[str] | None) -> None:
    problem = _operator_values_problem(operator, values)
    if problem:
        _raise_violations([RuleViolation(rule, "values", problem)])


class NodeSelectorRequirement(_Model):
    """A node label requirement, as in the Pod API."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(id="node-selector-values-fit-operator", rule=_NODE_VALUES_CEL,
                message=_OPERATOR_VALUES_MESSAGE + ", Gt and Lt exactly one integer", field_path=".values"),
    )

    key: LabelKey = Field(description="Node label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="`In`/`NotIn` (one or more values), `Exists`/`DoesNotExist` (no values), `Gt`/`Lt` (one "
        "integer value).")
    values: list[LabelValue] | None = Field(default=None, max_length=MAX_AFFINITY_ITEMS, description="Label values.")

    @model_validator(mode="after")
    def _check_values(self) -> NodeSelectorRequirement:
        _check_operator_values("node-selector-values-fit-operator", self.operator, self.values)
        return self


class NodeSelectorFieldRequirement(_Model):
    """A node field requirement, as in the Pod API: the only field is `metadata.name`."""

    key: Literal["metadata.name"] = Field(description="The node field: `metadata.name`.")
    operator: Literal["In", "NotIn"] = Field(description="`In` or `NotIn`.")
    values: list[Annotated[str, StringConstraints(max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN)]] = Field(
        min_length=1, max_length=1, description="One node name.")


class NodeSelectorTerm(_Model):
    """Node requirements that must all hold, as in the Pod API."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Requirements on node labels.")
    match_fields: list[NodeSelectorFieldRequirement] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Requirements on node fields.")


class NodeSelector(_Model):
    """Node selector terms, any of which may hold, as in the Pod API."""

    node_selector_terms: list[NodeSelectorTerm] = Field(
        min_length=1, max_length=MAX_AFFINITY_ITEMS, description="The terms; a node matching one of them fits.")


class PreferredSchedulingTerm(_Model):
    """A weighted node preference, as in the Pod API."""

    weight: int = Field(ge=1, le=100, description="Weight, 1 to 100.")
    preference: NodeSelectorTerm = Field(description="The node requirements preferred.")


class NodeAffinity(_Model):
    """Node affinity, as in the Pod API."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Nodes the pods must run on.")
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Nodes the pods prefer, by weight.")


class LabelSelectorRequirement(_Model):
    """A label requirement of a label selector, as in the Kubernetes API."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(id="label-selector-values-fit-operator", rule=_LABEL_VALUES_CEL, message=_OPERATOR_VALUES_MESSAGE,
                field_path=".values"),
    )

    key: LabelKey = Field(description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="`In`/`NotIn` (one or more values) or `Exists`/`DoesNotExist` (no values).")
    values: list[LabelValue] | None = Field(default=None, max_length=MAX_AFFINITY_ITEMS, description="Label values.")

    @model_validator(mode="after")
    def _check_values(self) -> LabelSelectorRequirement:
        _check_operator_values("label-selector-values-fit-operator", self.operator, self.values)
        return self


class LabelSelector(_Model):
    """A label selector, as in the Kubernetes API."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="match-labels-are-label-keys",
            rule=(
                "!has(self.matchLabels) || self.matchLabels.all(k, size(k) <= 317 && k.matches('"
                + LABEL_KEY_PATTERN.replace("\\", "\\\\") + "'))"
            ),
            message="matchLabels keys must be label keys such as app.kubernetes.io/name",
            field_path=".matchLabels",
        ),
    )

    match_labels: dict[str, LabelValue] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Labels that must be equal; keys are label keys.")
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Label requirements.")

    @model_validator(mode="after")
    def _check_keys(self) -> LabelSelector:
        bad = [k for k in self.match_labels or {} if len(k) > 317 or not _LABEL_KEY.fullmatch(k)]
        if bad:
            _raise_violations([RuleViolation("match-labels-are-label-keys", "matchLabels",
                                             f"keys must be label keys such as app.kubernetes.io/name "
                                             f"(got {_short(bad[0])})")])
        return self

    def label_keys(self) -> set[str]:
        """The label keys this selector names."""
        return set(self.match_labels or {}) | {r.key for r in self.match_expressions or []}


class PodAffinityTerm(_Model):
    """Pods to run near (or away from), as in the Pod API."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="label-keys-need-selector",
            rule="has(self.labelSelector) || ((!has(self.matchLabelKeys) || size(self.matchLabelKeys) == 0) "
            "&& (!has(self.mismatchLabelKeys) || size(self.mismatchLabelKeys) == 0))",
            message="matchLabelKeys and mismatchLabelKeys need a labelSelector; add one or remove them",
            field_path=".labelSelector",
        ),
        CelRule(
            id="label-keys-disjoint",
            rule="!has(self.matchLabelKeys) || !has(self.mismatchLabelKeys) "
            "|| !self.matchLabelKeys.exists(k, k in self.mismatchLabelKeys)",
            message="a key cannot be in both matchLabelKeys and mismatchLabelKeys; keep it in one",
            field_path=".mismatchLabelKeys",
        ),
        CelRule(
            id="label-keys-not-in-selector",
            rule="!has(self.labelSelector) || ((has(self.matchLabelKeys) ? self.matchLabelKeys : []) "
            "+ (has(self.mismatchLabelKeys) ? self.mismatchLabelKeys : [])).all(k, "
            "!(has(self.labelSelector.matchLabels) && k in self.labelSelector.matchLabels) "
            "&& !(has(self.labelSelector.matchExpressions) && self.labelSelector.matchExpressions.exists(r, "
            "r.key == k)))",
            message="a key of matchLabelKeys or mismatchLabelKeys cannot also be in labelSelector; keep it in one",
            field_path=".matchLabelKeys",
        ),
    )

    label_selector: LabelSelector | None = Field(default=None, description="The pods, by label.")
    namespace_selector: LabelSelector | None = Field(default=None, description="Their namespaces, by label.")
    namespaces: list[Annotated[str, StringConstraints(max_length=63, pattern=DNS1123_LABEL_PATTERN)]] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Their namespaces, by name.")
    topology_key: LabelKey = Field(description="Node label that defines 'near', e.g. kubernetes.io/hostname.")
    match_label_keys: list[LabelKey] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Pod label keys whose values must match the pod's.")
    mismatch_label_keys: list[LabelKey] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Pod label keys whose values must differ.")

    @model_validator(mode="after")
    def _check_label_keys(self) -> PodAffinityTerm:
        _raise_violations(self._violations())
        return self

    def _violations(self) -> list[RuleViolation]:
        match, mismatch = set(self.match_label_keys or []), set(self.mismatch_label_keys or [])
        out: list[RuleViolation] = []
        if (match or mismatch) and self.label_selector is None:
            field = "matchLabelKeys" if match else "mismatchLabelKeys"
            out.append(RuleViolation("label-keys-need-selector", "labelSelector",
                                     f"{field} needs a labelSelector; add one or remove {field}"))
        if match & mismatch:
            out.append(RuleViolation("label-keys-disjoint", "mismatchLabelKeys",
                                     f"key {_short(sorted(match & mismatch)[0])} is in both matchLabelKeys and "
                                     "mismatchLabelKeys; keep it in one"))
        both = (match | mismatch) & (self.label_selector.label_keys() if self.label_selector else set())
        if both:
            out.append(RuleViolation("label-keys-not-in-selector", "matchLabelKeys",
                                     f"key {_short(sorted(both)[0])} is in labelSelector and in "
                                     "matchLabelKeys/mismatchLabelKeys; keep it in one"))
        return out


class WeightedPodAffinityTerm(_Model):
    """A weighted pod preference, as in the Pod API."""

    weight: int = Field(ge=1, le=100, description="Weight, 1 to 100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The pods preferred.")


class PodAffinity(_Model):
    """Pod affinity or anti-affinity, as in the Pod API."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Terms that must hold.")
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Terms preferred, by weight.")


class Affinity(_Model):
    """Pod affinity, as in the Pod API, typed: an unknown key or an invalid rule is refused here, with its field,
    rather than by the API server when the Deployment is written."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity rules.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Pod affinity rules.")
    pod_anti_affinity: PodAffinity | None = Field(default=None, description="Pod anti-affinity rules.")


class EnvVar(_Model):
    """An environment variable for the vLLM container, as in the Pod API."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="env-value-or-value-from",
            rule="!(has(self.value) && has(self.valueFrom))",
            message="set either value or valueFrom, not both",
            field_path=".valueFrom",
        ),
    )

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str | None = Field(
        default=None,
        max_length=32768,
        description="Literal value. Never a secret: use `valueFrom.secretKeyRef` (a literal token gets a warning).",
    )
    value_from: EnvVarSource | None = Field(
        default=None,
        description="A source for the value (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef).",
    )

    @model_validator(mode="after")
    def _check_rules(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            _raise_violations(
                [
                    RuleViolation(
                        "env-value-or-value-from",
                        "valueFrom",
                        f"env {self.name!r} sets both value and valueFrom; keep one",
                    )
                ]
            )
        return self


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


class ModelCacheSpec(_Model):
    """A PersistentVolumeClaim that keeps downloaded weights across pod restarts."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="model-cache-claim-or-size",
            rule="has(self.claimName) != has(self.size)",
            message="set exactly one of modelCache.claimName (use an existing PVC) "
            "or modelCache.size (have the operator create one)",
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
        if (self.claim_name is None) == (self.size is None):
            out.append(
                RuleViolation(
                    "model-cache-claim-or-size",
                    "claimName",
                    "set exactly one of modelCache.claimName (use an existing PVC) "
                    "or modelCache.size (have the operator create one)",
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


#: An extended resource name (a device plugin's): a DNS subdomain prefix, a slash, a name (Kubernetes
#: IsExtendedResourceName / IsQualifiedName).
EXTENDED_RESOURCE_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
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

#: An adapter's name as clients send it in `model` (vLLM splits `--lora-modules name=source` on the first `=`).
LORA_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
#: A Hugging Face repository id or an absolute path inside the container (vLLM's get_adapter_absolute_path).
LORA_SOURCE_PATTERN = MODEL_SOURCE_PATTERN
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

#: A Prometheus base URL for KEDA's Prometheus trigger.
PROMETHEUS_URL_PATTERN = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$"


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
            managed = _managed_flag_of(arg)
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


# --------------------------------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------------------------------


class Condition(_StatusModel):
    """A standard Kubernetes condition."""

    type: str = Field(min_length=1, description="Ready, Progressing, Degraded, PlanFeasible or MetricsAvailable.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(min_length=1, description="CamelCase reason, one of the constants in the operator.")
    message: str = Field(
        default="", description="What happened and, when something is wrong, what to change."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec this condition was computed from."
    )
    last_transition_time: str = Field(
        json_schema_extra={"format": "date-time"},
        description="When status last changed (RFC 3339).",
    )


class MemoryBreakdown(_StatusModel):
    """Where the planned GPU memory goes, per GPU, in GiB, as vLLM's startup log reports it (the tightest worker or
    pipeline stage). The planner computes it (`planner.memory.predict_startup`) and status shows it as computed."""

    gpu_total_gib: float = Field(alias="gpuTotalGiB", ge=0, description="Total memory of one GPU.")
    requested_gib: float = Field(
        alias="requestedGiB", ge=0, description="What vLLM may use: total x gpu-memory-utilization."
    )
    weights_gib: float = Field(alias="weightsGiB", ge=0, description="This GPU's share of the weights.")
    activation_gib: float = Field(
        alias="activationGiB", ge=0, description="Peak activation memory of a forward pass."
    )
    non_torch_gib: float = Field(
        alias="nonTorchGiB", ge=0, description="CUDA context, NCCL buffers and the like."
    )
    cudagraph_gib: float = Field(
        alias="cudagraphGiB", ge=0, description="CUDA graphs (0 with enforce-eager)."
    )
    kv_cache_gib: float = Field(alias="kvCacheGiB", ge=0, description="What is left for the KV cache.")
    headroom_gib: float = Field(
        default=0.0, alias="headroomGiB", ge=0,
        description="Total minus requested: CUDA context, CUDA graphs (before vLLM 0.21), other processes.",
    )
    persistent_gib: float = Field(
        default=0.0, alias="persistentGiB", ge=0,
        description="Taken out of the KV cache budget besides the above (vLLM 0.27+): Model Runner V2's sampler "
                    "state and allocator leftovers.",
    )
    estimated: list[str] = Field(
        default_factory=list,
        description="The figures above (field names) that rest on an estimate no vLLM log has calibrated yet.",
    )


class PlanFailure(_StatusModel):
    """Why no plan fits."""

    kind: str = Field(
        min_length=1, description="Class of the failure, e.g. WeightsDoNotFit or KVCacheTooSmall."
    )
    message: str = Field(description="What does not fit, with the numbers.")


class PlanOption(_StatusModel):
    """An alternative that would fit, offered when the spec as written does not."""

    model_config = ConfigDict(extra="allow")

    summary: str = Field(min_length=1, description="The change, in words, e.g. 'use 2 GPUs per pod (TP=2)'.")
    flags: FlagMap = Field(default_factory=dict, description="The flags the alternative would run with.")
    gpu_count: int | None = Field(default=None, ge=1, description="GPUs per pod of the alternative.")
    gpu_product: str | None = Field(default=None, description="GPU product of the alternative.")


class PlanStatus(_StatusModel):
    """The flags the operator computed, and why."""

    fits: bool = Field(description="Whether the model and the workload fit the GPUs with these flags.")
    flags: FlagMap = Field(
        default_factory=dict,
        description="Planned and pinned vLLM flags, named as in spec.flags, e.g. maxModelLen: 32768.",
    )
    args: list[str] = Field(
        default_factory=list, description="The vLLM command-line arguments rendered from the plan."
    )
    memory: MemoryBreakdown | None = Field(default=None, description="Planned GPU memory per GPU.")
    kv_cache_tokens: int | None = Field(default=None, ge=0, description="Tokens the planned KV cache holds.")
    max_concurrency: float | None = Field(
        default=None, ge=0, description="Requests of max-model-len tokens the KV cache holds at once."
    )
    reasons: list[str] = Field(default_factory=list, description="How each flag was chosen, in words.")
    failure: PlanFailure | None = Field(default=None, description="Why it does not fit, when it does not.")
    options: list[PlanOption] = Field(default_factory=list, description="Alternatives that would fit.")
    vllm_version: str | None = Field(default=None, description="vLLM version the plan was computed for.")
    spec_hash: str | None = Field(default=None, description="Hash of the spec fields the plan depends on.")


class StageStatus(_StatusModel):
    """One pipeline stage's GPU (one tensor-parallel rank), as its worker's startup would report it."""

    stage: int = Field(ge=0, description="Pipeline stage (with TP = GPUs per node: the node's rank).")
    first_layer: int = Field(ge=0, description="First decoder layer of the stage.")
    layers: int = Field(ge=0, description="Decoder layers on the stage (vLLM's get_pp_indices split).")
    weights_gib: float = Field(alias="weightsGiB", ge=0, description="Weights per GPU, GiB.")
    activation_gib: float = Field(alias="activationGiB", ge=0, description="Activation peak per GPU, GiB.")
    kv_cache_gib: float = Field(alias="kvCacheGiB", ge=0, description="KV cache memory per GPU, GiB.")
    num_blocks: int = Field(ge=0, description="KV blocks the stage could hold (vLLM takes the minimum).")


class GroupFailureStatus(_StatusModel):
    """A failure of one pod of a LeaderWorkerSet group, recorded from the pod before the group is recreated."""

    pod: str = Field(description="Pod name (<lws>-<group> for the leader, <lws>-<group>-<worker> for workers).")
    pod_uid: str = Field(alias="podUID", description="Pod UID (a recreated group has new pods).")
    node_rank: int = Field(ge=0, description="vLLM --node-rank (the LWS worker index; 0 = leader).")
    stages: list[int] = Field(default_factory=list, description="Pipeline stages whose ranks ran on this pod.")
    failure_class: str = Field(description="The classifier's class (Network: NCCL/Gloo/ZMQ, never a memory flag).")
    summary: str = Field(description="One line of what failed.")
    time: str = Field(json_schema_extra={"format": "date-time"}, description="When it was seen (RFC 3339).")


class MultiNodeStatus(_StatusModel):
    """How one replica spans nodes (set only when the plan spans more than one node)."""

    nodes: int = Field(ge=1, description="Nodes per replica (the LeaderWorkerSet size).")
    gpus_per_node: int = Field(ge=1, description="GPUs each pod requests.")
    tensor_parallel_size: int = Field(ge=1, description="Tensor parallel size (inside a node).")
    pipeline_parallel_size: int = Field(ge=1, description="Pipeline parallel size (across nodes).")
    limiting_stage: int = Field(ge=0, description="The stage with the fewest KV blocks: it caps every stage's KV.")
    stages: list[StageStatus] = Field(default_factory=list, description="Memory per pipeline stage.")
    leader_worker_set: str | None = Field(default=None, description="Name of the LeaderWorkerSet.")
    group_recreations: int = Field(
        default=0, ge=0, description="Groups recreated by LeaderWorkerSet after a pod failed (profile changes excluded)."
    )
    leaders: dict[str, str] = Field(
        default_factory=dict, description="Leader pod UID and plan hash per group index, to count recreations."
    )
    failures: list[GroupFailureStatus] = Field(
        default_factory=list, description="The latest pod failures of the groups (first failure first), at most 8."
    )


class ShareMemberStatus(_StatusModel):
    """One member of a shared GPU, with its share."""

    name: str = Field(description="The member VLLMService.")
    utilization: float = Field(ge=0, le=1, description="Its --gpu-memory-utilization.")
    budget_gib: float = Field(alias="budgetGiB", ge=0, description="Its budget: total × utilization, GiB.")
    footprint_gib: float = Field(alias="footprintGiB", ge=0,
                                 description="Budget plus what its process holds outside it (CUDA context, NCCL, "
                                             "graphs where not budgeted), GiB.")


class ShareStatus(_StatusModel):
    """The shared GPU this service runs on, as its group's plan (recorded before any pod changes) gives it."""

    group: str = Field(description="spec.gpu.share.group.")
    gpu_index: int | None = Field(default=None, ge=0, description="The group's GPU this service is placed on.")
    mode: str | None = Field(default=None, description="How the GPU is shared: dra or time-slicing.")
    claim: str | None = Field(default=None, description="DRA: the ResourceClaim of the shared GPU.")
    node: str | None = Field(default=None, description="Time-slicing: the single-GPU node the members share.")
    gpu_total_gib: float | None = Field(default=None, alias="gpuTotalGiB", ge=0, description="The GPU's total, GiB.")
    free_gib: float | None = Field(default=None, alias="freeGiB",
                                   description="What the members' footprints leave free, GiB.")
    members: list[ShareMemberStatus] = Field(default_factory=list, max_length=64,
                                             description="Every member on this GPU, in start order.")
    start_position: int | None = Field(default=None, ge=0,
                                       description="Members of one GPU start one at a time: this one's place.")
    message: str | None = Field(default=None, description="Why it is not placed, when it is not.")


class GPUStatus(_StatusModel):
    """The GPUs the plan is for."""

    product: str | None = Field(default=None, description="GPU product, e.g. NVIDIA-H100-80GB-HBM3.")
    count: int | None = Field(default=None, ge=0, description="GPUs per pod.")
    nodes: int | None = Field(
        default=None, ge=0, description="Nodes (pods) one replica spans: 1, or the LeaderWorkerSet group size."
    )
    memory_gib: float | None = Field(
        default=None, alias="memoryGiB", ge=0, description="Memory of one GPU in GiB."
    )
    source: str | None = Field(
        default=None,
        description="How the product was found: from the spec, from node labels, or from the catalog.",
    )
    share: ShareStatus | None = Field(default=None, description="The shared GPU, with spec.gpu.share.")


class RemediationEvent(_StatusModel):
    """One remediation step taken."""

    step: int = Field(ge=0, description="Step number after this change (1 = first step away from the plan).")
    time: str = Field(
        json_schema_extra={"format": "date-time"}, description="When the step was taken (RFC 3339)."
    )
    failure_class: str = Field(description="The classified failure, e.g. KVCacheTooSmall or CUDAOOMStartup.")
    evidence: str = Field(
        default="", description="The log line or termination message the class was read from."
    )
    pod_uid: str | None = Field(default=None, alias="podUID", description="UID of the pod that failed.")
    restart_count: int | None = Field(default=None, ge=0, description="The container's restart count then.")
    flags_before: FlagMap = Field(default_factory=dict, description="Flags before the step.")
    flags_after: FlagMap = Field(default_factory=dict, description="Flags after the step.")
    profile_before: FlagMap = Field(
        default_factory=dict, description="The ladder's constraints before this step (what a step back restores)."
    )
    message: str = Field(default="", description="What was changed and why.")


class RemediationStatus(_StatusModel):
    """Where the operator is on the remediation ladder."""

    step: int = Field(
        default=0, ge=0, description="Steps currently applied on top of the plan (0 = the plan)."
    )
    profile: FlagMap = Field(
        default_factory=dict,
        description="Constraints the ladder learned (e.g. maxModelLen, gpuFreeGib), applied on top of the plan.",
    )
    history: list[RemediationEvent] = Field(default_factory=list, description="Steps taken, oldest first.")
    exhausted: bool = Field(default=False, description="No further step is allowed or would help.")
    last_failure_key: str | None = Field(
        default=None,
        description="Identifies the last failure acted on, so one failure is acted on only once.",
    )
    handled_keys: list[str] = Field(
        default_factory=list,
        description="Failures (pod UID/restart count) already reported without a step, newest last (at most 20).",
    )
    inputs_hash: str | None = Field(
        default=None,
        max_length=64,
        description="Hash of the plan's inputs the profile was learned on (model, GPU request, image and vLLM "
                    "release, pinned flags and extra args, workload, LoRA). The profile is reset when they change, "
                    "and only then: replicas, labels, annotations, env and other plan-neutral edits keep it.",
    )


class KVCacheStatus(_StatusModel):
    """The KV cache vLLM measured at startup ("GPU KV cache size: N tokens") next to the plan's prediction."""

    measured_tokens: int = Field(ge=0, description="Tokens of KV cache vLLM allocated (its own startup log line).")
    predicted_tokens: int | None = Field(
        default=None, ge=0, description="The plan's prediction for the same flags (status.plan.kvCacheTokens)."
    )
    difference_tokens: int | None = Field(default=None, description="measuredTokens - predictedTokens.")
    difference_percent: float | None = Field(
        default=None, description="The difference as a percentage of the prediction (negative: vLLM has less)."
    )
    pod: str = Field(max_length=253, description="The pod whose log said it (a Deployment pod or a group leader).")
    template: str | None = Field(
        default=None, max_length=64,
        description="The pod's plan annotation (vllm-operator.dev/plan): the profile the measurement belongs to.",
    )
    time: str = Field(json_schema_extra={"format": "date-time"}, description="When it was read (RFC 3339).")


class MetricsStatus(_StatusModel):
    """vLLM metrics observed through Prometheus."""

    kv_cache_usage: float | None = Field(default=None, ge=0, le=1, description="KV cache usage, 0 to 1.")
    preemption_rate: float | None = Field(default=None, ge=0, description="Preemptions per second.")
    waiting: float | None = Field(default=None, ge=0, description="Requests waiting.")
    running: float | None = Field(default=None, ge=0, description="Requests running.")
    time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When these were observed (RFC 3339).",
    )
    desired_replicas: int | None = Field(
        default=None, ge=0,
        description="Replicas the metrics watch scaled to, within spec.replicas..spec.maxReplicas (the Deployment "
                    "is rendered with it; spec is never written).",
    )
    recommendation: str | None = Field(default=None, description="The last advice the metrics watch gave.")


class ModelCacheStatus(_StatusModel):
    """How the weights reach the model cache, and the download last measured (render/cache.py)."""

    download_init: bool | None = Field(
        default=None, description="Whether the model-download init container fills the cache before vLLM starts."
    )
    checkpoint_bytes: int | None = Field(
        default=None, ge=0, description="The checkpoint's size as the planner knows it (what vLLM downloads)."
    )
    downloaded_bytes: int | None = Field(default=None, ge=0, description="Bytes the last measured download fetched.")
    download_seconds: float | None = Field(default=None, ge=0, description="Seconds the last measured download took.")
    bytes_per_second: int | None = Field(default=None, ge=0, description="The measured download rate.")
    measured_pod: str | None = Field(default=None, description="The pod whose download was measured.")
    measured_by: str | None = Field(
        default=None, description="How it was measured: init-container (its termination message) or vllm-log."
    )
    measured_at: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, description="When the measured download ended."
    )
    download_error: str | None = Field(
        default=None, description="Why the model-download init container fails (its last log lines), while it does."
    )
    download_error_pod: str | None = Field(default=None, description="The pod whose download fails.")
    shape_pods: int | None = Field(
        default=None, ge=0,
        description="The most pods the persistent cache was shaped for (its bounds, and any replica count it had): a "
                    "scale back below it keeps the cache's shape, so scaling never switches the pod template back.",
    )
    budget_bytes_per_second: int | None = Field(
        default=None, ge=0,
        description="The rate the current startup budget was computed with (unset: the operator's assumed rate). "
                    "A new measurement takes effect at the next change of vLLM's arguments, never by itself.",
    )


def _phase(description: str) -> Any:
    return Field(default=None, ge=0, description=description)


class ColdStartStatus(_StatusModel):
    """How long the service's last measured pod start took, phase by phase (render/coldstart.py)."""

    pod_start_seconds: float | None = _phase("Scheduled to the first container started: image pull, volume attach.")
    download_seconds: float | None = _phase("The weight download (init container, or vLLM's own line).")
    load_seconds: float | None = _phase("vLLM loading the weights into GPU memory.")
    compile_seconds: float | None = _phase("torch.compile (or loading its cached result).")
    graph_capture_seconds: float | None = _phase("CUDA-graph capture.")
    engine_init_seconds: float | None = _phase("vLLM's engine start: profiling, KV cache, compile, graphs.")
    ready_seconds: float | None = _phase("Scheduled to the vLLM container Ready: the whole start.")
    slowest_engine_init_seconds: float | None = _phase(
        "The slowest engine start measured for this service: what the startup probe budgets (times 2).")
    budget_engine_seconds: float | None = _phase(
        "What the current startup probe allows for the engine start: 2 × the slowest measured, taken at the next "
        "change of vLLM's arguments (a measurement alone never rolls the pods out); unset: the assumed 600 s.")
    starts: int | None = Field(default=None, ge=0, description="Pod starts measured so far.")
    compile_cache: str | None = Field(
        default=None, description="Where vLLM's compile and CUDA-graph caches were: persistent (the model cache "
                                  "claim, per vLLM release and GPU) or ephemeral (compiled again on every start).")
    measured_pod: str | None = Field(default=None, description="The pod whose start was measured last.")
    measured_at: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, description="When that pod became Ready."
    )


class VLLMServiceStatus(_StatusModel):
    """Observed state of a VLLMService. Written by the operator only."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec last reconciled."
    )
    state: str | None = Field(
        default=None,
        description="One word for the STATUS column of `kubectl get vllms`, derived from the conditions: Ready, "
                    "RollingOut, Downloading (the model-download init container runs), ScaledToZero, Pending, or what is "
                    "wrong (InvalidSpec, Infeasible, ModelNotFound, Unschedulable, ModelDownloadFailed, Remediating, "
                    "RemediationExhausted, a pod failure such as ContainerCrashLoopBackOff).",
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Progressing, Degraded and PlanFeasible."
    )
    plan: PlanStatus | None = Field(default=None, description="The flags the operator computed, and why.")
    gpu: GPUStatus | None = Field(default=None, description="The GPUs the plan is for.")
    multi_node: MultiNodeStatus | None = Field(
        default=None, description="How one replica spans nodes, when the plan spans more than one."
    )
    workload_switch: WorkloadSwitch | None = Field(
        default=None, description="A Deployment <-> LeaderWorkerSet switch under way: each step is recorded here "
                                  "before it acts (docs/convergence.md)."
    )
    replicas: int | None = Field(
        default=None, ge=0, description="Pods that exist (the scale subresource reads it)."
    )
    ready_replicas: int | None = Field(default=None, ge=0, description="Pods that are ready.")
    selector: str | None = Field(
        default=None,
        description="Label selector of the pods, for the scale subresource (HorizontalPodAutoscaler).",
    )
    endpoint: str | None = Field(
        default=None, description="URL of the OpenAI-compatible API inside the cluster."
    )
    remediation: RemediationStatus | None = Field(default=None, description="Remediation steps taken.")
    metrics: MetricsStatus | None = Field(default=None, description="vLLM metrics last observed.")
    kv_cache: KVCacheStatus | None = Field(
        default=None,
        description="What vLLM measured of its KV cache next to the plan's prediction, for the current profile's pods.",
    )
    model_cache: ModelCacheStatus | None = Field(
        default=None, description="How the weights reach the model cache, and the download last measured."
    )
    cold_start: ColdStartStatus | None = Field(
        default=None, description="How long a pod start takes, phase by phase, as last measured."
    )
    kopf: FreeForm | None = Field(
        default=None, description="Bookkeeping of the kopf framework (handler progress)."
    )


class VLLMService(_Model):
    """A model served by vLLM, with its flags planned from the GPUs' memory and adjusted after failures."""

    api_version: Literal["vllm-operator.dev/v1alpha1"] = Field(default="vllm-operator.dev/v1alpha1")
    kind: Literal["VLLMService"] = "VLLMService"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: VLLMServiceSpec
    status: VLLMServiceStatus | None = None


# --------------------------------------------------------------------------------------------------
# Validation for people: field paths and fixes
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecError:
    """One problem with a spec: `field` is a dotted camelCase path such as `spec.flags.gpuMemoryUtilization`."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SpecValidationError(ValueError):
    """The spec is invalid; `errors` says where and what to change."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def _join(base: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{base}[{part}]"
    if part.startswith("["):
        return base + part
    return f"{base}.{part}" if base else part


def _model_class(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `X`, `X | None`, `list[X]` or `dict[str, X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType, list, dict, Annotated):
        for arg in get_args(annotation):
            found = _model_class(arg)
            if found is not None:
                return found
    return None


def _fields_at(loc: tuple[str | int, ...]) -> list[str]:
    """camelCase field names of the spec model reached by `loc` (used to suggest a fix for a typo)."""
    model: type[BaseModel] = VLLMServiceSpec
    for part in loc:
        if isinstance(part, int):
            continue
        for name, info in model.model_fields.items():
            if part in (name, info.alias):
                found = _model_class(info.annotation)
                if found is None:
                    return []
                model = found
                break
        else:
            return []
    return [info.alias or name for name, info in model.model_fields.items()]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_PATTERN_WORDS = {
    HF_MODEL_ID_PATTERN: "must be a Hugging Face model id such as Qwen/Qwen2.5-7B-Instruct",
    IMAGE_PATTERN: "must be an image reference such as vllm/vllm-openai:v0.11.0 or registry:5000/repo/img@sha256:…",
    DNS1123_SUBDOMAIN_PATTERN: "must be a Kubernetes object name: lower-case letters, digits, '-' and '.'",
    DATA_KEY_PATTERN: "must be a ConfigMap/Secret key: letters, digits, '-', '_' and '.'",
    MOUNT_PATH_PATTERN: "must be an absolute path of letters, digits, '.', '_' and '-' (no '..' segment)",
    LABEL_VALUE_PATTERN: "must be a label value: at most 63 letters, digits, '-', '_' or '.', starting and ending "
                         "with a letter or digit",
    LABEL_KEY_PATTERN: "must be a label key such as example.com/pool",
    DNS1123_LABEL_PATTERN: "must be a namespace name: lower-case letters, digits and '-', at most 63 characters",
    TOLERATION_KEY_PATTERN: "must be a taint key such as nvidia.com/gpu (or empty)",
    ENV_NAME_PATTERN: "must be an environment variable name: letters, digits, '_', '-' and '.'",
    REVISION_PATTERN: "must be a branch, tag or commit such as main or v1.0",
    SERVED_NAME_PATTERN: "must be a model name clients send, such as qwen-7b or org/model:v1: letters, digits, "
                         "'.', '_', '/', ':' and '-', starting with a letter or digit",
    VLLM_VERSION_PATTERN: "must be a vLLM release such as 0.11.0 or v0.26.0 (or latest)",
    DNS1035_LABEL_PATTERN: "must be a Service name: lower-case letters, digits and '-', starting with a letter, "
                           "at most 63 characters",
    SPECULATIVE_METHOD_PATTERN: "must be eagle, eagle3, mtp (or <model>_mtp), ngram, ngram_gpu, suffix or "
                                "draft_model",
    LORA_NAME_PATTERN: "must be an adapter name: letters, digits, '.', '_' and '-', starting and ending with a "
                       "letter or digit (no '=': vLLM splits name=source on it)",
    MODEL_SOURCE_PATTERN: "must be a Hugging Face repository id such as org/model, or an absolute path in the "
                          "container without '.' or '..' segments",
    PROMETHEUS_URL_PATTERN: "must be an http(s) URL such as http://prometheus.monitoring:9090",
    API_VERSION_PATTERN: "must be an API version such as v1",
    FIELD_PATH_PATTERN: "must be a pod field path such as metadata.name or metadata.labels['app']",
    RESOURCE_NAME_PATTERN: "must be a container resource such as limits.memory or requests.cpu",
    EXTENDED_RESOURCE_PATTERN: "must be a device plugin's resource name <domain>/<name>, such as rdma/ib or "
                               "nvidia.com/hostdev",
}


def _spec_errors(exc: ValidationError, prefix: str) -> list[SpecError]:
    errors: list[SpecError] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        path = prefix
        for part in loc:
            path = _join(path, part)
        kind = err["type"]
        ctx = err.get("ctx") or {}
        if kind == "spec_rule":
            for violation in ctx.get("violations", []):
                errors.append(SpecError(_join(path, violation["field"]), violation["message"]))
            continue
        if kind == "extra_forbidden":
            name = str(loc[-1]) if loc else ""
            close = difflib.get_close_matches(name, _fields_at(loc[:-1]), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; remove it"
            errors.append(SpecError(path, f"unknown field {name!r}{hint}"))
            continue
        if kind == "missing":
            errors.append(SpecError(path, "is required; set it"))
            continue
        if kind == "string_pattern_mismatch" and ctx.get("pattern") == QUANTITY_PATTERN:
            message = "must be a Kubernetes quantity such as 64Gi, 500m or 8"
        elif kind == "string_pattern_mismatch" and ctx.get("pattern") in _PATTERN_WORDS:
            message = _PATTERN_WORDS[ctx["pattern"]]
        else:
            message = err["msg"]
            if message.startswith("Input should be"):
                message = "must be" + message.removeprefix("Input should be")
            elif message.startswith("Value error, "):
                message = message.removeprefix("Value error, ")
        errors.append(SpecError(path, f"{message} (got {_short(err.get('input'))})"))
    return errors


#: The deepest nesting of a whole spec (the deepest field, an affinity term's values, is 9 levels; an inline config
#: adds at most MAX_INLINE_JSON_DEPTH). Checked before anything recurses: a stored object may nest 10,000 levels.
MAX_SPEC_DEPTH = 32
#: The largest spec, as compact JSON. kopf keeps a copy of the spec as its diff base (an annotation where it fits,
#: status otherwise) and etcd holds at most 1.5 MiB per object: spec + copy + status stay under it.
MAX_SPEC_BYTES = 512 * 1024


def _path_name(path: tuple[str | int, ...]) -> str:
    """The field of the spec's schema a deep path is in: `spec.model.config` for a path into the free-form config,
    `spec.affinity` for a path through unknown keys of affinity."""
    name = "spec"
    model: type[BaseModel] | None = VLLMServiceSpec
    for part in path:
        if isinstance(part, int):
            name = _join(name, part)
            continue
        if model is None:
            break
        field = next((info for key, info in model.model_fields.items() if part in (key, info.alias)), None)
        if field is None:
            break
        name = _join(name, part)
        model = _model_class(field.annotation)
    return name


def _plain(value: Any) -> Any:
    """Plain dicts and lists from any mappings and sequences (kopf passes read-only mapping views), without recursion:
    raises SpecValidationError naming the field when the value nests deeper than MAX_SPEC_DEPTH."""

    def copy(item: Any) -> Any:
        if isinstance(item, Mapping):
            return {}
        if isinstance(item, list | tuple):
            return []
        return item

    top = copy(value)
    stack: list[tuple[Any, Any, tuple[str | int, ...]]] = [(value, top, ())]
    while stack:
        source, target, path = stack.pop()
        if len(path) > MAX_SPEC_DEPTH:
            raise SpecValidationError([SpecError(_path_name(path), (
                f"nests deeper than {MAX_SPEC_DEPTH} levels (a real value nests a few); remove the nesting")),
            ])
        items = source.items() if isinstance(source, Mapping) else enumerate(source)
        for key, item in items:
            child = copy(item)
            if isinstance(target, dict):
                target[key] = child
            else:
                target.append(child)
            if isinstance(item, Mapping | list | tuple):
                stack.append((item, child, (*path, key)))
    return top


def _spec_of(obj: Mapping[str, Any]) -> Any:
    """The spec inside a whole VLLMService object, or the object itself when it is a spec, as plain JSON data
    (bounded in depth and size: SpecValidationError naming the field otherwise)."""
    spec = obj.get("spec")
    plain = _plain(spec) if isinstance(spec, Mapping) and "model" not in obj else _plain(obj)
    try:
        size = len(json.dumps(plain, separators=(",", ":"), default=str))
    except (TypeError, ValueError):  # not JSON at all (a NaN is JSON to Python): pydantic names the field
        return plain
    if size > MAX_SPEC_BYTES and isinstance(plain, dict):
        path: tuple[str | int, ...] = ()
        node: Any = plain
        largest = size
        for _ in range(2):  # the largest field, and the largest inside it (spec.model.config, not spec.model)
            if not isinstance(node, dict) or not node:
                break
            sizes = {key: len(json.dumps(item, separators=(",", ":"), default=str)) for key, item in node.items()}
            key = max(sizes, key=lambda k: sizes[k])
            path, node, largest = (*path, key), node[key], sizes[key]
        raise SpecValidationError([SpecError(_path_name(path), (
            f"makes the spec {size // 1024} KiB, over the {MAX_SPEC_BYTES // 1024} KiB the operator keeps "
            f"(this field is {largest // 1024} KiB); shorten it, or move model files to model.configMapRef"))])
    return plain


def parse_spec(obj: Mapping[str, Any]) -> VLLMServiceSpec:
    """Parse a spec, or a whole VLLMService object's spec. Raises SpecValidationError with field paths."""
    try:
        return VLLMServiceSpec.model_validate(_spec_of(obj))
    except RecursionError as exc:  # bounded above; kept so that no input can become an InternalError
        raise SpecValidationError([SpecError("spec", "nests too deep; remove the nesting")]) from exc
    except ValidationError as exc:
        raise SpecValidationError(_spec_errors(exc, "spec")) from exc


def validate_spec(obj: Mapping[str, Any]) -> list[SpecError]:
    """Problems with a spec (or a whole VLLMService object's spec); empty when it is valid.

    Each error names the field as a dotted camelCase path (`spec.flags.gpuMemoryUtilization`,
    `spec.env[2].valueFrom`) and says what to change, ready for a condition message or an event.
    """
    try:
        parse_spec(obj)
    except SpecValidationError as exc:
        return exc.errors
    return []
