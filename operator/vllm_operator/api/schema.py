"""Schema building blocks of the VLLMService API: the base models every spec and status model derives from,
the field patterns and bounds, the quantity and inline-JSON field types, and the cross-field rules (CEL for the API
server, mirrored by Python checks).

Conventions of every model in `vllm_operator.api`:

* Python attributes are snake_case; YAML/JSON names are camelCase (`alias_generator=to_camel`), and both
  are accepted on input (`populate_by_name=True`). Spec models reject unknown fields (`extra="forbid"`)
  so a typo such as `maxModelLength` is reported instead of silently ignored. They are strict about
  JSON types (`enforceEager: "yes"` is an error, not True), as the API server is.
* Defaults live in the models (`v1alpha1`), in code, and are *not* emitted as server-side `default:` in the CRD. A server-side
  default rewrites every stored object, so a GitOps tool sees a diff between git and the cluster for a
  field nobody wrote. The one exception is `spec.replicas` (see its description): the scale subresource
  fails a GET when the replicas path is absent, so it must always be present.
* Cross-field rules are written twice on purpose: as CEL (`x-kubernetes-validations`, enforced by the
  API server at admission) and as Python checks in the models (the operator, the CLI preview and the emulated API
  server in tests do not run CEL). Each CEL rule has an `id`; the Python check reporting the same
  violation uses the same id, and the tests check that every CEL rule has its mirror.
* Status models ignore unknown fields: status is written by the operator only, and an older or newer
  operator must still be able to read what another version wrote.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, StringConstraints, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from ..quantity import quantity_problem

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

#: `--speculative-config` methods the planner models (vllm/config/speculative.py, 0.33), or `<model>_mtp`.
SPECULATIVE_METHOD_PATTERN = r"^(eagle|eagle3|mtp|ngram|ngram_gpu|suffix|draft_model|[a-z0-9_]+_mtp)$"

#: A namespace name (a DNS-1123 label), as in PodAffinityTerm.namespaces.
DNS1123_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

#: The Pod API's downward-API selectors: an API version, a field path, a resource name.
API_VERSION_PATTERN = r"^[a-z0-9./]+$"
FIELD_PATH_PATTERN = r"^[A-Za-z0-9_.\[\]'/-]+$"
RESOURCE_NAME_PATTERN = r"^[A-Za-z0-9_./-]+$"

#: An extended resource name (a device plugin's): a DNS subdomain prefix, a slash, a name (Kubernetes
#: IsExtendedResourceName / IsQualifiedName).
EXTENDED_RESOURCE_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

#: An adapter's name as clients send it in `model` (vLLM splits `--lora-modules name=source` on the first `=`).
LORA_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
#: A Hugging Face repository id or an absolute path inside the container (vLLM's get_adapter_absolute_path).
LORA_SOURCE_PATTERN = MODEL_SOURCE_PATTERN

#: A Prometheus base URL for KEDA's Prometheus trigger.
PROMETHEUS_URL_PATTERN = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$"

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
# Values and patterns in words, for people (api/errors.py)
# --------------------------------------------------------------------------------------------------


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
