"""Generated VLLMService specs, valid and hostile, and the checks every one of them must pass through the reconcile
core (issues 10 and 14). Shared by tests/unit/test_adversarial.py (a CI-sized sample) and
benchmarks/adversarial_corpus.py (the large corpus, with counts).

Every field of the spec is generated, from the pydantic models themselves: `spec_fields()` walks `VLLMServiceSpec`,
mutations may hit every path it yields (whole blocks and leaves), and each leaf has a hand-written pool of valid
values in `VALID` (a test fails when a new field has none, so the next field cannot be forgotten).

`specs` draws from three families: valid specs (a few blocks, a few fields each, made consistent by `_repair`),
mutated valid specs (one to four paths replaced by an adversarial value: newlines and YAML syntax, unicode, huge,
negative and boundary numbers, NaN, wrong types, unknown fields, names invalid for their Kubernetes kind, path
traversal, duplicate adapter names, conflicting autoscaler settings, deep or huge inline configs), and raw junk.
`check(observed, desired)` returns the outcome name, or raises AssertionError naming what broke.
"""

from __future__ import annotations

import copy
import json
import math
import re
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import jsonschema
import kubernetes_validate
from hypothesis import strategies as st
from pydantic import BaseModel

from kit.crds import FILES as CRD_KINDS
from kit.crds import crd_schema, unknown_fields, validator
from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.api.v1alpha1 import INT32_MAX, VLLMServiceSpec, _model_class
from vllm_operator.handlers import observe as observe_shell
from vllm_operator.modelfiles import ModelFiles, find_in_catalog, list_catalog
from vllm_operator.render import cache

K8S_VERSION = "1.33"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
L4_NODE = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "2"}
H100_NODE = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
OPTIONAL_KINDS = frozenset({"ScaledObject", "InferencePool"})

CATALOG_IDS = sorted(f.model_id for f in list_catalog())[:12]
#: Models that only fit across nodes (multi-node plans, LeaderWorkerSets), and small ones that fit anywhere.
BIG_MODELS = ["meta-llama/Llama-3.1-405B-Instruct", "deepseek-ai/DeepSeek-R1"]
SMALL_MODELS = ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen3-8B"]

Path = tuple[str | int, ...]

# --- adversarial values --------------------------------------------------------------------------------

INJECTIONS = [
    "x\nprivileged: true",
    "x\n          securityContext: {privileged: true, capabilities: {add: [SYS_ADMIN]}}",
    "x\n      hostPID: true\n      hostNetwork: true",
    "x}: {hostPID: true",
    "'; hostNetwork: true; '",
    "$(rm -rf /)", "`id`", "a; sh -c id", "a && curl x|sh", "a|b", "a=b", "a b",
    "&a x", "*a", "!!python/object:os.system", "{{ 7*7 }}", "${HOME}", "$(HF_TOKEN)",
    "017", "yes", "no", "on", "null", "~", "1e3", "0x1F", "True", "-", "--", "", " ", "\t",
    "a" * 300, "é", "模型", "\u2028", "\x00", "\u202eevil", "zero\u200bwidth", "😀", "٣٣", "１２",
    "../../etc/passwd", "/dev/zero", "dev/zero", "etc/passwd", "/a/../b", "org/../x", "C:\\x", "file:///etc/passwd",
    "vllm/vllm-openai:v0.11.0\n", "vllm/vllm-openai:v0.4.2", "hf_abcdefghijklmnopqrstuvwxyz012345",
]
#: Names invalid for one Kubernetes kind or another (DNS-1123 label/subdomain, DNS-1035 label, label value).
K8S_NAMES = ["UPPER", "-lead", "trail-", "a..b", "a_b", "a.b", "1abc", "x" * 63, "x" * 64, "x" * 254, "a/b", ".", ".."]
NUMBERS = [0, -1, 1, 2, 7, 63, 64, 65535, 65536, 2**31 - 1, 2**31, 2**53 + 1, 2**63, -(2**63), 10**30, -(10**30),
           1e18, 1e308, 0.5, 1e-9, 5e-324, -0.0, float("nan"), float("inf"), float("-inf")]
WRONG_TYPES: list[Any] = [None, True, False, [], {}, ["a"], {"a": 1}, [[[]]], "1", 1.5]

junk_scalar = st.one_of(st.sampled_from(INJECTIONS), st.sampled_from(NUMBERS), st.sampled_from(WRONG_TYPES),
                        st.text(max_size=40), st.integers(), st.floats(allow_nan=True))
junk = st.recursive(junk_scalar, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                    max_leaves=12)


def _inline_config(layers: int, hidden: int = 4096, heads: int = 32, kv: int = 8, vocab: int = 32000) -> dict[str, Any]:
    return {"model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "num_key_value_heads": kv, "vocab_size": vocab, "intermediate_size": 4 * hidden,
            "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


def deep(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        node = {"n": node}
    return node


HOSTILE_CONFIGS: list[Any] = [
    _inline_config(100_000),
    {**_inline_config(32), "layer_types": ["full_attention"] * 100_000},
    _inline_config(32, hidden=10**9), _inline_config(32, heads=0), _inline_config(32, kv=7),
    _inline_config(32, vocab=10**12), {**_inline_config(32), "num_local_experts": 10**6, "num_experts_per_tok": 8},
    {**_inline_config(32), "max_position_embeddings": 10**30}, {**_inline_config(32), "hidden_size": 1e308},
    {**_inline_config(32), "rope_scaling": {"type": "linear", "factor": 1e300}},
    {**_inline_config(32), "quantization_config": {"quant_method": "compressed-tensors", "config_groups": [1, 2]}},
    {**_inline_config(32), "quantization_config": {"quant_method": "gptq", "bits": "four"}},
    {**_inline_config(32), "intermediate_size": "big"},
    {**_inline_config(32), "text_config": {"num_hidden_layers": -5}},
    {**_inline_config(32), "blob": "x" * 300_000},
    deep(40), {"num_hidden_layers": 2}, {}, {"a": [1] * 5000},
]

# --- the spec's fields, from the models ------------------------------------------------------------------


@dataclass(frozen=True)
class SpecField:
    path: Path               # camelCase keys; 0 for the items of a list of objects
    leaf: bool               # no model inside (a scalar, a list of scalars, a map, a free-form object)
    required: bool
    model: type[BaseModel]   # the model the field belongs to
    name: str                # its Python name there


def _is_list(annotation: Any) -> bool:
    origin = get_origin(annotation)
    if origin is list:
        return True
    if origin in (Union, types.UnionType, Annotated):
        return any(_is_list(a) for a in get_args(annotation) if a is not type(None))
    return False


def spec_fields(model: type[BaseModel] = VLLMServiceSpec, prefix: Path = ()) -> Iterator[SpecField]:
    """Every field of the spec, depth first, as the API spells it."""
    for name, info in model.model_fields.items():
        path = (*prefix, info.alias or name)
        sub = _model_class(info.annotation)
        yield SpecField(path, sub is None, info.is_required(), model, name)
        if sub is not None:
            yield from spec_fields(sub, (*path, 0) if _is_list(info.annotation) else path)


FIELDS: dict[Path, SpecField] = {f.path: f for f in spec_fields()}
LEAVES: list[Path] = [p for p, f in FIELDS.items() if f.leaf]
LISTS: set[Path] = {p[:-2] for p in FIELDS if len(p) > 2 and p[-2] == 0}  # lists of objects


def _literal(path: Path) -> list[Any]:
    """The values of a Literal field (`X | None` included)."""
    field = FIELDS[path]
    annotation = field.model.model_fields[field.name].annotation
    for arg in (annotation, *get_args(annotation)):
        if get_origin(arg) is Literal:
            return list(get_args(arg))
    raise TypeError(f"{path} is not a Literal field")


def bounds(path: Path) -> list[Any]:
    """The numeric field's own bounds, each side of them (valid edges, then just outside)."""
    field = FIELDS.get(path)
    if field is None:
        return []
    out: list[Any] = []
    for rule in field.model.model_fields[field.name].metadata:
        for attr, inside, outside in (("ge", 0, -1), ("le", 0, 1), ("gt", 1, 0), ("lt", -1, 0)):
            value = getattr(rule, attr, None)
            if isinstance(value, int | float) and not isinstance(value, bool):
                step = 1 if isinstance(value, int) else max(abs(value) * 1e-9, 1e-12)
                out += [value + inside * step, value + outside * step]
    return out


# --- valid values, one pool per leaf ----------------------------------------------------------------------

_lit = _literal
_k8s_name = st.sampled_from(["models", "a", "models.fast", "x" * 63, "hf-token", "a-b.c-d"])
_label_value = st.sampled_from(["gpu", "a100_80gb", "x" * 63, "A.b-c_d", ""])

#: A pool of valid values for every leaf of the spec (`test_every_spec_field_has_a_valid_generator` keeps it whole).
VALID: dict[Path, st.SearchStrategy[Any]] = {
    ("model", "name"): st.sampled_from([*CATALOG_IDS, *SMALL_MODELS, *BIG_MODELS, "org/inline-model"]),
    ("model", "revision"): st.sampled_from(["main", "v1.0", "refs/pr/1", "a" * 40]),
    ("model", "config"): st.builds(_inline_config, st.integers(1, 96), st.sampled_from([1024, 4096])),
    ("model", "safetensorsIndex"): st.just({"metadata": {"total_size": 2 * 10**9}}),
    ("model", "configMapRef", "name"): _k8s_name,
    ("model", "configMapRef", "configKey"): st.sampled_from(["config.json", "a_b-c.d"]),
    ("model", "configMapRef", "safetensorsIndexKey"): st.just("model.safetensors.index.json"),
    ("model", "quantization"): st.sampled_from(["awq", "fp8", "gptq"]),
    ("model", "servedName"): st.sampled_from(["qwen:7b", "chat", "org/m", "a" * 200]),
    ("gpu", "product"): st.sampled_from(["L4", "H100-80GB", "A100-80GB", "NVIDIA-H100-80GB-HBM3", "x" * 63]),
    ("gpu", "count"): st.sampled_from([1, 2, 8, 64]),
    ("gpu", "maxCount"): st.sampled_from([1, 2, 8, 64]),
    ("gpu", "maxNodes"): st.sampled_from([1, 2, 4, 64]),
    ("gpu", "memoryGiB"): st.sampled_from([24, 80, 1e-3, 4096]),
    ("gpu", "share", "group"): st.sampled_from(["team-a", "a", "a" * 63]),
    ("gpu", "share", "memoryGiB"): st.sampled_from([8, 20.5, 1e-3, 4096]),
    ("image",): st.sampled_from(["vllm/vllm-openai:v0.26.0", "vllm/vllm-openai:v0.11.0", "vllm/vllm-openai:v0.8.5",
                                 "vllm/vllm-openai:v0.17.1", "registry.local:5000/vllm/vllm-openai:v0.26.0",
                                 "vllm/vllm-openai@sha256:" + "a" * 64, "registry.local/vllm:prod"]),
    ("vllmVersion",): st.sampled_from(["0.11.0", "v0.26.0", "latest", "0.33.0", "0.0.1", "9999.0", "0.11.1+cu128"]),
    ("imagePullPolicy",): st.sampled_from(_lit(("imagePullPolicy",))),
    ("flags", "tensorParallelSize"): st.sampled_from([1, 2, 4, 8]),
    ("flags", "pipelineParallelSize"): st.sampled_from([1, 2]),
    ("flags", "dataParallelSize"): st.sampled_from([1, 2, 4]),
    ("flags", "enableExpertParallel"): st.booleans(),
    ("flags", "gpuMemoryUtilization"): st.floats(0.5, 0.95) | st.sampled_from([1e-9, 1.0]),
    ("flags", "maxModelLen"): st.integers(16, 32768),
    ("flags", "maxNumSeqs"): st.integers(1, 256),
    ("flags", "maxNumBatchedTokens"): st.integers(256, 16384),
    ("flags", "kvCacheDtype"): st.sampled_from(_lit(("flags", "kvCacheDtype"))),
    ("flags", "quantization"): st.sampled_from(["fp8", "awq", "gguf"]),
    ("flags", "dtype"): st.sampled_from(_lit(("flags", "dtype"))),
    ("flags", "enforceEager"): st.booleans(),
    ("flags", "blockSize"): st.sampled_from(_lit(("flags", "blockSize"))),
    ("flags", "enablePrefixCaching"): st.booleans(),
    ("flags", "enableChunkedPrefill"): st.booleans(),
    ("flags", "cpuOffloadGb"): st.sampled_from([0, 4, 4096]),
    ("flags", "swapSpace"): st.integers(0, 16),
    ("flags", "enableLora"): st.just(True),
    ("flags", "maxLoraRank"): st.sampled_from(_lit(("flags", "maxLoraRank"))),
    ("flags", "trustRemoteCode"): st.booleans(),
    ("flags", "kvCacheMemoryBytes"): st.sampled_from([2**30, 2**34, 1, 2**50]),
    ("flags", "speculativeConfig", "method"): st.sampled_from(["ngram", "eagle3", "mtp", "suffix", "qwen3_mtp"]),
    ("flags", "speculativeConfig", "numSpeculativeTokens"): st.integers(1, 64),
    ("flags", "speculativeConfig", "model"): st.sampled_from(["yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                                              "/models/draft"]),
    ("flags", "speculativeConfig", "draftTensorParallelSize"): st.sampled_from([1, 2]),
    ("extraArgs",): st.lists(st.sampled_from(["--disable-log-requests", "--api-key", "$(HF_TOKEN)", "a; rm -rf /",
                                              "--uvicorn-log-level=debug", "x\nprivileged: true"]), max_size=3),
    ("workload", "contextLength"): st.integers(1, 8192),
    ("workload", "concurrency"): st.sampled_from([1, 4, 2**20]),
    ("workload", "prefixCaching"): st.booleans(),
    ("workload", "profile"): st.sampled_from(_lit(("workload", "profile"))),
    ("replicas",): st.sampled_from([0, 1, 3, INT32_MAX]),
    ("maxReplicas",): st.sampled_from([1, 4, INT32_MAX]),
    ("resources", "memory"): st.sampled_from(["64Gi", "1", "0.5", "1e3", "500m"]),
    ("resources", "cpu"): st.sampled_from(["8", "7500m", "0"]),
    ("resources", "shmSize"): st.sampled_from(["16Gi", "1Mi"]),
    ("nodeSelector",): st.dictionaries(st.sampled_from(["pool", "example.com/pool", "a" * 63]), _label_value,
                                       max_size=2),
    ("tolerations", 0, "key"): st.sampled_from(["dedicated", "nvidia.com/gpu", ""]),
    ("tolerations", 0, "operator"): st.sampled_from(_lit(("tolerations", 0, "operator"))),
    ("tolerations", 0, "value"): _label_value,
    ("tolerations", 0, "effect"): st.sampled_from(_lit(("tolerations", 0, "effect"))),
    ("tolerations", 0, "tolerationSeconds"): st.sampled_from([0, 300, -(2**63), 2**63 - 1]),
    ("env", 0, "name"): st.sampled_from(["A", "HF_TOKEN", "API_KEY", "HF_HOME", "LD_PRELOAD", "a.b-c"]),
    ("env", 0, "value"): st.sampled_from(["1", "hf_" + "a" * 34, "debug", "x\nprivileged: true", "$(rm -rf /)"]),
    **{("env", 0, "valueFrom", ref, leaf): pool for ref in ("secretKeyRef", "configMapKeyRef") for leaf, pool in (
        ("name", st.sampled_from(["hf", "cm", "a.b-c"])), ("key", st.sampled_from(["token", "k", "HF_TOKEN"])),
        ("optional", st.booleans()))},
    ("env", 0, "valueFrom", "fieldRef", "fieldPath"): st.sampled_from(["metadata.name", "status.podIP",
                                                                       "metadata.labels['app']"]),
    ("env", 0, "valueFrom", "fieldRef", "apiVersion"): st.just("v1"),
    ("env", 0, "valueFrom", "resourceFieldRef", "resource"): st.sampled_from(["limits.memory", "requests.cpu"]),
    ("env", 0, "valueFrom", "resourceFieldRef", "containerName"): st.just("vllm"),
    ("env", 0, "valueFrom", "resourceFieldRef", "divisor"): st.sampled_from(["1Mi", "1"]),
    ("hfTokenSecretRef", "name"): _k8s_name,
    ("hfTokenSecretRef", "key"): st.sampled_from(["token", "HF_TOKEN", "a.b-c_d"]),
    ("modelCache", "claimName"): _k8s_name,
    ("modelCache", "size"): st.sampled_from(["100Gi", "1", "1e3"]),
    ("modelCache", "storageClassName"): _k8s_name,
    ("modelCache", "prewarm", "enabled"): st.booleans(),
    ("modelCache", "prewarm", "keep"): st.booleans(),
    ("modelCache", "mountPath"): st.sampled_from(["/models", "/root/.cache/huggingface", "/a/.b/c-d_e",
                                                  "/home/vllm/.cache/huggingface"]),
    ("lora", "adapters", 0, "name"): st.sampled_from(["sql", "chat-v2", "A.b_c-1", "x" * 128]),
    ("lora", "adapters", 0, "source"): st.sampled_from(["org/sql-lora", "/models/adapters/sql", "/mnt/.hidden/a",
                                                        "a", "o/" + "a" * 1000]),
    ("lora", "maxRank"): st.sampled_from(_lit(("lora", "maxRank"))),
    ("lora", "maxLoras"): st.sampled_from([1, 4, 256]),
    ("autoscaling", "engine"): st.sampled_from(_lit(("autoscaling", "engine"))),
    ("autoscaling", "minReplicas"): st.sampled_from([0, 1, 2]),
    ("autoscaling", "maxReplicas"): st.sampled_from([1, 4, INT32_MAX]),
    ("autoscaling", "metrics", 0, "type"): st.sampled_from(_lit(("autoscaling", "metrics", 0, "type"))),
    ("autoscaling", "metrics", 0, "target"): st.sampled_from([5, 0.8, 1, 0.001, 0.0015, 999_999.5, 1e6]),
    ("autoscaling", "prometheusAddress"): st.sampled_from(["http://prometheus.monitoring:9090",
                                                           "https://p.example.com/prom/"]),
    ("autoscaling", "activationQuery"): st.sampled_from(['sum(rate(gw_requests{svc="a"}[1m]))', "up\n> 0",
                                                         "x" * 4096]),
    ("autoscaling", "cooldownSeconds"): st.sampled_from([0, 300, 86400]),
    ("routing", "inferencePool", "enabled"): st.booleans(),
    ("routing", "inferencePool", "endpointPicker", "name"): st.sampled_from(["epp", "a" * 63, "a-1"]),
    ("routing", "inferencePool", "endpointPicker", "port"): st.sampled_from([1, 9002, 65535]),
    ("routing", "inferencePool", "endpointPicker", "failureMode"): st.sampled_from(
        _lit(("routing", "inferencePool", "endpointPicker", "failureMode"))),
    ("remediation", "enabled"): st.booleans(),
    ("remediation", "maxSteps"): st.sampled_from([0, 5, 50]),
    ("remediation", "minIntervalSeconds"): st.sampled_from([0, 60, 7 * 86400]),
    ("remediation", "allowStepUp"): st.booleans(),
    ("remediation", "stableWindowSeconds"): st.sampled_from([0, 3600, 30 * 86400]),
    ("remediation", "maxGroupRecreations"): st.sampled_from([0, 5, 100]),
    ("network", "rdmaResources", 0, "name"): st.sampled_from(["rdma/rdma_shared_device_a", "rdma/ib",
                                                              "nvidia.com/hostdev", "a.b-c/" + "X" * 63]),
    ("network", "rdmaResources", 0, "count"): st.sampled_from([1, 8, 64]),
    ("network", "ipcLock"): st.booleans(),
    ("service", "type"): st.sampled_from(_lit(("service", "type"))),
    ("service", "port"): st.sampled_from([1, 8000, 9000, 65535]),
    ("prometheus", "enabled"): st.booleans(),
    ("security", "profile"): st.sampled_from(_lit(("security", "profile"))),
    ("security", "runAsUser"): st.sampled_from([1, 1000, INT32_MAX]),
}


#: spec.affinity (the Pod API's blocks, typed): its leaves' pools by leaf name, wherever they sit in it; the operator
#: and values of one requirement are drawn apart and made to agree by `_repair_affinity`.
_label_key = st.sampled_from(["zone", "topology.kubernetes.io/zone", "kubernetes.io/hostname", "app", "a" * 63,
                              "example.com/" + "a" * 63, "A.b-c_d"])
_AFFINITY_LEAVES: dict[str, st.SearchStrategy[Any]] = {
    "key": _label_key,
    "topologyKey": _label_key,
    "values": st.lists(_label_value, min_size=1, max_size=3),
    "weight": st.sampled_from([1, 50, 100]),
    "matchLabels": st.dictionaries(_label_key, _label_value, max_size=3),
    "namespaces": st.lists(st.sampled_from(["default", "a", "x" * 63, "team-1"]), max_size=3),
    "matchLabelKeys": st.lists(st.sampled_from(["pod-template-hash", "example.com/rev"]), max_size=2, unique=True),
    "mismatchLabelKeys": st.lists(st.sampled_from(["tenant", "example.com/team"]), max_size=2, unique=True),
}


def _affinity_pool(path: Path) -> st.SearchStrategy[Any]:
    if path[-1] == "operator":
        return st.sampled_from(_lit(path))
    if path[-3:-1] == ("matchFields", 0):  # the one node field: metadata.name, In/NotIn, one node name
        return st.sampled_from(_lit(path)) if path[-1] != "values" else st.lists(_k8s_name, min_size=1, max_size=1)
    return _AFFINITY_LEAVES[str(path[-1])]


VALID.update({p: _affinity_pool(p) for p in LEAVES if p[0] == "affinity"})


def _direct(prefix: Path) -> list[SpecField]:
    """The fields of the object at `prefix` (a list's items: prefix ends in 0)."""
    return [f for p, f in FIELDS.items() if len(p) == len(prefix) + 1 and p[:len(prefix)] == prefix]


def _value(field: SpecField) -> st.SearchStrategy[Any]:
    if field.leaf:
        return VALID[field.path]
    if field.path in LISTS:
        return st.lists(_object((*field.path, 0)), min_size=1, max_size=3)
    return _object(field.path)


@st.composite
def _object(draw: st.DrawFn, prefix: Path, most: int = 3) -> dict[str, Any]:
    """The object at `prefix`: its required fields and up to `most` optional ones, each from its pool."""
    fields = _direct(prefix)
    required = [f for f in fields if f.required]
    optional = [f for f in fields if not f.required]
    chosen = draw(st.permutations(optional))[:draw(st.integers(0, min(most, len(optional))))]
    return {str(f.path[-1]): draw(_value(f)) for f in [*required, *chosen]}


def _repair(doc: dict[str, Any]) -> dict[str, Any]:
    """Make a drawn spec obey the cross-field rules (the CEL rules and their Python mirrors), so the valid family
    reaches the planner and the renderer."""
    flags, gpu = doc.get("flags") or {}, doc.get("gpu") or {}
    if {"tensorParallelSize", "pipelineParallelSize", "dataParallelSize"} & flags.keys():
        world = flags.get("tensorParallelSize", 1) * flags.get("pipelineParallelSize", 1)
        world *= flags.get("dataParallelSize", 1)
        doc["gpu"] = gpu = {**gpu, "count": world}
    if "count" in gpu:
        gpu["maxCount"] = max(gpu.get("maxCount", 8), gpu["count"])
    if "maxNumBatchedTokens" in flags and "maxNumSeqs" in flags:
        flags["maxNumBatchedTokens"] = max(flags["maxNumBatchedTokens"], flags["maxNumSeqs"])
    workload = doc.get("workload") or {}
    if "contextLength" in workload and "maxModelLen" in flags:
        workload["contextLength"] = min(workload["contextLength"], flags["maxModelLen"])
    if "maxLoraRank" in flags or "lora" in doc:
        flags["enableLora"] = True
        doc["flags"] = flags
    if "lora" in doc and "maxLoraRank" in flags and "maxRank" in doc["lora"]:
        flags["maxLoraRank"] = doc["lora"]["maxRank"]
    _repair_lora(doc.get("lora"))
    _repair_env(doc.get("env"))
    _repair_speculative(flags.get("speculativeConfig"))
    _repair_cache(doc)
    _repair_scaling(doc)
    _repair_network(doc)
    _repair_affinity(doc.get("affinity"))
    return doc


def _repair_affinity(node: Any) -> None:
    """Make every requirement's values agree with its operator and every pod term's label keys with its selector,
    as the Pod API requires (walks the whole block)."""
    if isinstance(node, list):
        for item in node:
            _repair_affinity(item)
        return
    if not isinstance(node, dict):
        return
    operator = node.get("operator")
    if operator in ("Exists", "DoesNotExist"):
        node.pop("values", None)
    elif operator in ("Gt", "Lt"):
        node["values"] = ["4"]
    elif operator in ("In", "NotIn"):
        node.setdefault("values", ["a"])
    if "topologyKey" in node and (node.get("matchLabelKeys") or node.get("mismatchLabelKeys")):
        selector = node.setdefault("labelSelector", {})
        taken = set(selector.get("matchLabels") or {}) | {r["key"] for r in selector.get("matchExpressions") or []}
        node["matchLabelKeys"] = [k for k in node.get("matchLabelKeys") or [] if k not in taken]
        node["mismatchLabelKeys"] = [k for k in node.get("mismatchLabelKeys") or [] if k not in taken]
    for value in node.values():
        _repair_affinity(value)


def _repair_network(doc: dict[str, Any]) -> None:
    network = doc.get("network") or {}
    if network.get("ipcLock") and (doc.get("security") or {}).get("profile") == "restricted":
        network["ipcLock"] = False  # ipc-lock-needs-baseline
    for index, resource in enumerate(network.get("rdmaResources") or []):
        resource["name"] = f"{resource['name'][:240]}{index}"  # unique


def _repair_lora(lora: dict[str, Any] | None) -> None:
    if lora and lora.get("adapters"):
        for index, adapter in enumerate(lora["adapters"]):
            adapter["name"] = f"{adapter['name'][:120]}{index}"  # unique


def _repair_env(env: list[dict[str, Any]] | None) -> None:
    for var in env or []:
        if "valueFrom" in var:  # one source, as the Pod API requires
            var.pop("value", None)
            first = next(iter(var["valueFrom"]), None)
            var["valueFrom"] = {first: var["valueFrom"][first]} if first else {"fieldRef": {"fieldPath": "x"}}


def _repair_speculative(spec: dict[str, Any] | None) -> None:
    if spec is None:
        return
    if spec["method"] in ("eagle", "eagle3", "draft_model"):
        spec.setdefault("model", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    if not spec["method"].endswith("mtp"):
        spec.setdefault("numSpeculativeTokens", 3)


def _repair_cache(doc: dict[str, Any]) -> None:
    cache = doc.get("modelCache")
    if cache is None:
        return
    if "claimName" in cache and ("size" in cache or "storageClassName" in cache):
        del cache["claimName"]
    if "claimName" not in cache:
        cache.setdefault("size", "100Gi")


def _repair_scaling(doc: dict[str, Any]) -> None:
    if "maxReplicas" in doc:
        doc["maxReplicas"] = max(doc["maxReplicas"], doc.get("replicas", 1))
    scaling = doc.get("autoscaling")
    if scaling is None:
        return
    doc.pop("maxReplicas", None)
    scaling["minReplicas"] = min(scaling.get("minReplicas", 1), scaling["maxReplicas"])
    for metric in scaling.get("metrics") or []:
        if metric["type"] == "KVCacheUsage":
            metric["target"] = min(metric["target"], 1)
    if scaling.get("engine") == "KEDA":
        scaling.setdefault("prometheusAddress", "http://prometheus.monitoring:9090")
        if scaling["minReplicas"] == 0:
            scaling.setdefault("activationQuery", "sum(rate(gw_requests[1m]))")
    else:
        scaling.pop("activationQuery", None)
        scaling["minReplicas"] = max(scaling["minReplicas"], 1)


@st.composite
def minimal_spec(draw: st.DrawFn, leaf: Path) -> dict[str, Any]:
    """The smallest spec that sets `leaf` (a valid value of its own), with what it requires around it."""
    doc: dict[str, Any] = {"model": {"name": "org/model"}}
    _set(doc, leaf, copy.deepcopy(draw(VALID[leaf])))
    for depth in range(len(leaf)):
        prefix = leaf[:depth]
        if prefix and prefix[-1] == 0 and prefix[:-1] in LISTS or prefix in FIELDS or not prefix:
            node = _get(doc, prefix)
            for field in _direct(prefix):
                if field.required and str(field.path[-1]) not in node:
                    node[str(field.path[-1])] = draw(_value(field))
    return _repair(doc)


def _get(doc: Any, path: Path) -> Any:
    for part in path:
        doc = doc[part]
    return doc


@st.composite
def _valid(draw: st.DrawFn) -> dict[str, Any]:
    doc = draw(_object((), most=5))
    return _repair(copy.deepcopy(doc))  # the pools' values are shared objects: repair a copy


valid_spec = _valid()


@st.composite
def _spanning(draw: st.DrawFn) -> dict[str, Any]:
    """A valid spec of a model no node holds, allowed to span nodes (a LeaderWorkerSet when the cluster has them)."""
    doc = draw(valid_spec)
    doc["model"] = {"name": draw(st.sampled_from(BIG_MODELS))}
    doc["gpu"] = {"maxNodes": draw(st.sampled_from([2, 4]))}
    for pinned in ("tensorParallelSize", "pipelineParallelSize", "dataParallelSize", "maxModelLen",
                   "kvCacheMemoryBytes"):
        (doc.get("flags") or {}).pop(pinned, None)
    return _repair(doc)


spanning_spec = _spanning()

# --- hostile values, by path ------------------------------------------------------------------------------

_ADAPTER = {"name": "a", "source": "org/a"}
#: Hostile values that make sense for one path (besides the generic ones every path gets).
HOSTILE: dict[Path, list[Any]] = {
    ("lora", "adapters"): [[_ADAPTER, _ADAPTER], [_ADAPTER] * 65, [{"name": "a=b", "source": "org/a"}],
                           [{"name": "a", "source": "org/a", "extra": 1}]],
    ("lora", "adapters", 0, "source"): ["../x", "/a/../b", "org/../x", "/..", "~/x", "hf://org/a", "s3://b/k",
                                        "/" + "a" * 1024, "org/a b"],
    ("lora", "adapters", 0, "name"): ["a=b", "a b", "-a", "a" * 129, "org/a"],
    ("flags", "speculativeConfig", "model"): ["../x", "/a/../b", "x\ny", "a" * 513, "http://evil/x"],
    ("flags", "speculativeConfig"): [{"method": "eagle"}, {"method": "ngram"}, {"method": "x; rm"},
                                     {"method": "mtp", "numSpeculativeTokens": 0}],
    ("autoscaling",): [{"maxReplicas": 2, "activationQuery": "up"}, {"engine": "KEDA", "maxReplicas": 2},
                       {"minReplicas": 5, "maxReplicas": 2}, {"minReplicas": 0, "maxReplicas": 2},
                       {"engine": "HPA", "minReplicas": 0, "maxReplicas": 2, "activationQuery": "up"},
                       {"engine": "KEDA", "minReplicas": 0, "maxReplicas": INT32_MAX,
                        "prometheusAddress": "http://p:9090", "activationQuery": "up"},
                       {"maxReplicas": 3, "metrics": [{"type": "KVCacheUsage", "target": 2}]},
                       {"maxReplicas": 3, "metrics": [{"type": "WaitingRequests", "target": 1}] * 4}],
    ("autoscaling", "metrics", 0, "target"): [1e-9, 0.0004, 5e-324, -1, 1e6 + 1],
    ("autoscaling", "prometheusAddress"): ["http://p:9090/?q=1", "file:///etc/passwd", "http://a b",
                                           "http://p:99999999"],
    ("routing", "inferencePool", "endpointPicker", "name"): K8S_NAMES,
    ("modelCache", "mountPath"): ["/dev/shm", "/tmp", "/home/vllm", "/", "/a/../b", "relative", "/proc", "/a//b"],
    ("gpu",): [{"maxNodes": 64, "maxCount": 64}, {"count": 64, "maxNodes": 64}, {"maxNodes": 65}],
    ("replicas",): [INT32_MAX, INT32_MAX + 1, -1],
    ("security",): [{"profile": "restricted", "runAsUser": 0}, {"profile": "privileged"},
                    {"runAsUser": -1}, {"profile": "restricted", "runAsUser": INT32_MAX + 1}],
    ("network",): [{"ipcLock": True}, {"rdmaResources": [{"name": "rdma/ib", "count": 1}] * 5},
                   {"rdmaResources": [{"name": "rdma/ib", "count": 1}] * 2}],
    ("network", "rdmaResources", 0, "name"): ["nvidia.com/gpu", "nvidia.com/gpu.shared", "kubernetes.io/x",
                                              "cpu", "memory", "rdma", "rdma/", "/ib", "rdma/ib\nx", "RDMA/ib",
                                              "a" * 254 + "/b", "rdma/a b", "requests.nvidia.com/gpu"],
    ("flags",): [{"dataParallelSize": 64, "tensorParallelSize": 8}, {"dataParallelSize": 2, "enableExpertParallel": True},
                 {"enableExpertParallel": True}, {"pipelineParallelSize": 64}],
    # the Pod API's own refusals inside spec.affinity (the first two: the corpus's failed checks before it was typed)
    ("affinity", "nodeAffinity"): [{"a": 1}, _inline_config(32), {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": []}}, {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]}],
    ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"): [
        [{"matchExpressions": [{"key": "zone", "operator": "In"}]}],
        [{"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]}],
        [{"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["four"]}]}],
        [{"matchExpressions": [{"key": "gpus", "operator": "Lt", "values": ["1", "2"]}]}],
        [{"matchFields": [{"key": "metadata.labels", "operator": "In", "values": ["a"]}]}],
        [{"matchFields": [{"key": "metadata.name", "operator": "Exists"}]}], [{"matchExpressions": [{"key": "bad key",
                                                                           "operator": "Exists"}]}]],
    ("affinity", "podAntiAffinity"): [{"requiredDuringSchedulingIgnoredDuringExecution": [{}]},
                                      {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": ""}]},
                                      {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 101}]},
                                      {"requiredDuringSchedulingIgnoredDuringExecution": [
                                          {"topologyKey": "zone", "matchLabelKeys": ["app"]}]},
                                      {"requiredDuringSchedulingIgnoredDuringExecution": [
                                          {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "a"}},
                                           "matchLabelKeys": ["app"], "mismatchLabelKeys": ["app"]}]},
                                      {"requiredDuringSchedulingIgnoredDuringExecution": [
                                          {"topologyKey": "zone", "labelSelector": {"matchLabels": {"a b": "x"}}}]},
                                      {"requiredDuringSchedulingIgnoredDuringExecution": [
                                          {"topologyKey": "zone", "namespaces": ["UPPER"]}]}],
}
# Paths beyond the models' own: unknown fields, a second list item, a map key.
EXTRA_PATHS: list[Path] = [("unknownField",), ("flags", "unknownFlag"), ("nodeSelector", "pool"), ("extraArgs", 0),
                           ("lora", "adapters", 1, "name"), ("env", 1, "name"), ("tolerations", 1, "key"),
                           ("autoscaling", "metrics", 1)]
PATHS: list[Path] = [*FIELDS, *EXTRA_PATHS]


def _set(doc: dict[str, Any], path: Path, value: Any) -> None:
    """Set `path` in `doc`, replacing whatever stands in the way with the container the path needs."""
    node: Any = doc
    for part, following in zip(path, path[1:], strict=False):
        child = _child(node, part)
        if not isinstance(child, list if isinstance(following, int) else dict):
            child = [] if isinstance(following, int) else {}
            _put(node, part, child)
        node = child
    _put(node, path[-1], value)


def _child(node: Any, part: str | int) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    return node[int(part)] if int(part) < len(node) else None


def _put(node: Any, part: str | int, value: Any) -> None:
    if isinstance(node, dict):
        node[part] = value
        return
    while len(node) <= int(part):
        node.append(None)
    node[int(part)] = value


generic_value = st.one_of(st.sampled_from(INJECTIONS), st.sampled_from(K8S_NAMES), st.sampled_from(NUMBERS),
                          st.sampled_from(WRONG_TYPES), st.sampled_from(HOSTILE_CONFIGS), junk)


def mutation_value(path: Path) -> st.SearchStrategy[Any]:
    """A generic adversarial value, or one aimed at this path (its own hostile values, its numeric bounds)."""
    aimed = HOSTILE.get(path, []) + bounds(path)
    return st.one_of(generic_value, st.sampled_from(aimed)) if aimed else generic_value


@st.composite
def mutated_spec(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(draw(valid_spec))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(PATHS))
        _set(doc, path, copy.deepcopy(draw(mutation_value(path))))  # never a shared (module-level) object
    return doc


specs = st.one_of(valid_spec, spanning_spec, mutated_spec(), mutated_spec(),
                  st.dictionaries(st.text(max_size=10), junk, max_size=4))

name = st.sampled_from(["svc", "017", "yes", "true", "a.b", "x" * 63, "llama-3", "m" * 64, "0", "a-b.c-d",
                        "a" * 253, "UPPER", "-a"])


@dataclass(frozen=True)
class ClusterView:
    """What the shell observes besides the spec: node labels, the optional kinds served, the LWS API."""

    nodes: tuple[Mapping[str, str], ...]
    served: frozenset[str] | None = None      # None: not known (assumed served)
    lws: bool | None = None                   # None: not asked


nodes = st.sampled_from([(L4_NODE,), (H100_NODE,), (), (L4_NODE, H100_NODE), (H100_NODE,) * 2, (H100_NODE,) * 4,
                         (L4_NODE,) + (H100_NODE,) * 4, ({"nvidia.com/gpu.product": "0GB\nx", "nvidia.com/gpu.count": "-1"},)])
clusters = st.builds(ClusterView, nodes, st.sampled_from([None, frozenset(), OPTIONAL_KINDS]),
                     st.sampled_from([None, True, False]))

# --- the checks -------------------------------------------------------------------------------------------


def resolver(spec: Mapping[str, Any]) -> observe_shell.ModelReader:
    """The shell's resolver, minus the hub: a catalog id resolves, anything else is not found. Records calls."""

    def resolve() -> tuple[ModelFiles | None, str | None]:
        CALLS.append(spec)
        model = spec.get("model") if isinstance(spec, Mapping) else None
        found = find_in_catalog(str(model.get("name"))) if isinstance(model, Mapping) else None
        return (found, None) if found else (None, "not in the catalog (the hub is not reachable in tests)")

    return resolve


CALLS: list[Mapping[str, Any]] = []

# Key paths of the rendered children; dict keys that are data (labels, annotations, selectors) become '*', and
# the blocks the spec passes through as given (affinity, env valueFrom) are not descended into: their inside is
# the spec's, typed by the API models and checked against Kubernetes' schema with the rest of the child.
_DATA_KEYS = {"labels", "annotations", "matchLabels", "selector", "nodeSelector", "requests", "limits"}
_PASSED_THROUGH = {"affinity", "valueFrom"}


def key_paths(obj: Any, path: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(obj, dict):
        data = path.rsplit(".", 1)[-1] in _DATA_KEYS
        for key, value in obj.items():
            sub = f"{path}.{'*' if data else key}"
            out.add(sub)
            if key not in _PASSED_THROUGH:
                out |= key_paths(value, sub)
    elif isinstance(obj, list):
        for item in obj:
            out |= key_paths(item, path + "[]")
    return out


def _reference_paths() -> dict[str, set[str]]:
    """Every key path the renderer can produce, from renderings with every feature on."""
    from vllm_operator.api.v1alpha1 import AutoscalingSpec, InferencePoolSpec
    from vllm_operator.render import autoscaling, routing
    from vllm_operator.render.lws import GroupOptions, build_multinode_children
    from vllm_operator.render.manifests import OwnerRef, RenderInput, build_children
    from vllm_operator.render.pods import serving_pods
    from vllm_operator.render.statefulset import build_statefulset_children

    full = RenderInput(
        name="ref", namespace="ns", owner=OwnerRef(name="ref", uid="u"), model="org/m", revision="main",
        served_name="m", image="vllm/vllm-openai:v0.26.0", vllm_version="0.26.0", flags={"max_model_len": 1},
        extra_args=("--x",), gpu_count=2, gpu_product_label="NVIDIA-L4", node_selector={"a": "b"},
        tolerations=({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule",
                      "tolerationSeconds": 1},),
        affinity={"nodeAffinity": {}}, env=({"name": "A", "value": "1"}, {"name": "B", "valueFrom": {}}),
        hf_token_secret="hf", cache_claim="c", cache_create=True, cache_storage_class="s",
        security_profile="restricted", download_init=True)
    group = GroupOptions(layer_partition="1,1", rdma_resources=(("rdma/ib", 1),), ipc_lock=True)
    owner, labels = full.owner.to_k8s(), {"a": "b"}
    keda = AutoscalingSpec(engine="KEDA", min_replicas=0, max_replicas=2, prometheus_address="http://p:9090",
                           activation_query="up", metrics=[{"type": "KVCacheUsage", "target": 0.8}])
    pool = InferencePoolSpec(enabled=True, endpoint_picker={"name": "epp"})
    extras = [
        autoscaling.build_hpa(name="ref", child_name="ref", namespace="ns", labels=labels, owner=owner,
                              spec=AutoscalingSpec(max_replicas=2)),
        autoscaling.build_scaled_object(name="ref", child_name="ref", namespace="ns", labels=labels, owner=owner,
                                        spec=keda, selector="a"),
        *(routing.build_inference_pool(child_name="ref", namespace="ns", labels=labels, owner=owner,
                                       selector=dict(serving_pods("ref", "ns", multinode=multinode).match_labels),
                                       port=8000, spec=pool) for multinode in (False, True))]
    for extra in extras:
        extra["metadata"]["annotations"]["a"] = "b"
    # a claim per pod (render/cache.py): a LeaderWorkerSet's or a StatefulSet's volumeClaimTemplates
    claims = {"metadata": {"name": "model-cache", "labels": {"a": "b"}},
              "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                       "storageClassName": "s"}}
    per_pod = full.model_copy(update={"cache_claim": None, "cache_create": False, "cache_claim_template": claims})
    sts = per_pod.model_copy(update={"per_pod_workload": "StatefulSet"})
    paths: dict[str, set[str]] = {}
    for child in [*build_children(full), *build_multinode_children(full, 2, group),
                  *build_multinode_children(per_pod, 2, group), *build_statefulset_children(sts), *extras]:
        paths.setdefault(child["kind"], set()).update(key_paths(child))
    return paths


REFERENCE = _reference_paths()
FIELD = re.compile(r"(spec|metadata)\.[A-Za-z]")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
#: The name rule of each kind (apimachinery's ValidateObjectMeta name functions; LWS requires a DNS-1035 label).
NAME_RULES = {"Service": (_DNS1035_LABEL, 63), "LeaderWorkerSet": (_DNS1035_LABEL, 63),
              "Deployment": (_DNS1123_SUBDOMAIN, 253), "PersistentVolumeClaim": (_DNS1123_SUBDOMAIN, 253),
              # its pods `<name>-<ordinal>` carry the name in controller-revision-hash (a label value, 63)
              "StatefulSet": (_DNS1123_LABEL, 52),
              "HorizontalPodAutoscaler": (_DNS1123_SUBDOMAIN, 253), "ScaledObject": (_DNS1123_SUBDOMAIN, 253),
              "InferencePool": (_DNS1123_SUBDOMAIN, 253)}
#: The only commands the vLLM container runs: never a shell, so no spec string is ever shell text.
COMMANDS = (["vllm", "serve"], ["python3", "-m", "vllm.entrypoints.openai.api_server"])
#: The pod securityContext keys, and the only volume sources, any rendering may have.
POD_SECURITY_KEYS = {"seccompProfile", "runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup"}
VOLUME_SOURCES = {"emptyDir", "persistentVolumeClaim"}


def check(observed: reconcile.Observed, desired: reconcile.Desired) -> str:
    """The outcome ('Deployed', 'InvalidSpec', ...) of one reconcile; AssertionError when a rule of issue 10 broke."""
    reason = _answered(observed, desired)
    json.dumps(desired.status.model_dump(mode="json", by_alias=True, exclude_none=True), allow_nan=False)
    if desired.children is None:
        return reason or "NotDeployed"
    for child in desired.children:
        check_child(child)
    templates = [t for child in desired.children for t in pod_templates(child)]
    assert templates, "no pod template among the children"
    for template in templates:
        check_pod(template["spec"], observed.spec)
    return "Deployed"


def _answered(observed: reconcile.Observed, desired: reconcile.Desired) -> str | None:
    """Every service gets an answer: an undeployed one a Degraded condition and a Warning event with its reason; an
    invalid one names the field (and says more than a regular expression)."""
    conditions = {c.type: c for c in desired.status.conditions}
    degraded = conditions.get(cond.DEGRADED)
    reason = degraded.reason if degraded is not None and degraded.status == cond.TRUE else None
    assert reason != cond.INTERNAL_ERROR, f"unforeseen failure for spec {observed.spec!r:.300}"
    for event in desired.events:
        assert event.type in ("Normal", "Warning") and event.reason and event.message
    if reason == cond.INVALID_SPEC:
        assert degraded is not None and FIELD.search(degraded.message), degraded.message
        assert "should match pattern" not in degraded.message, f"a bare pattern, no fix: {degraded.message:.300}"
        assert desired.children is None
    if desired.children is None:
        assert reason, f"no Degraded condition for an undeployed spec {observed.spec!r:.200}"
        assert any(e.type == "Warning" and e.reason == reason for e in desired.events), f"no {reason} event"
    return reason


def check_child(child: dict[str, Any]) -> None:
    """Valid for the API server that serves its kind (built-in schema, or the upstream CRD), nothing it would prune,
    no key the renderer's reference rendering lacks, a name valid for the kind, no NaN."""
    kind = child["kind"]
    json.dumps(child, allow_nan=False)
    try:
        if kind in CRD_KINDS:
            validator(kind).validate(child)
            pruned = unknown_fields(child, crd_schema(kind))
            assert not pruned, f"{kind} has fields its CRD would prune: {pruned[:5]}"
        else:
            kubernetes_validate.validate(child, K8S_VERSION, strict=True)
    except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
        raise AssertionError(f"{kind} is invalid for Kubernetes: {exc.message[:300]}") from None
    extra = key_paths(child) - REFERENCE[kind]
    assert not extra, f"{kind} has keys the spec did not ask for: {sorted(extra)[:5]}"
    rule, limit = NAME_RULES[kind]
    child_name = child["metadata"]["name"]
    assert isinstance(child_name, str) and len(child_name) <= limit and rule.fullmatch(child_name), (kind, child_name)
    for key, value in (child["metadata"].get("labels") or {}).items():
        assert isinstance(value, str) and len(value) <= 63 and _LABEL_VALUE.fullmatch(value), (kind, key, value)
    _check_semantics(child)


def _check_semantics(child: dict[str, Any]) -> None:
    """What the API server (or the autoscaler's controller) checks beyond the schema."""
    spec = child["spec"]
    if child["kind"] == "HorizontalPodAutoscaler":
        assert 1 <= spec["minReplicas"] <= spec["maxReplicas"], spec
        for metric in spec["metrics"]:
            target = metric["pods"]["target"]["averageValue"]
            assert _quantity(target) > 0, f"HPA target {target!r} is not positive (the API server refuses it)"
    if child["kind"] == "ScaledObject":
        assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"], spec
        for trigger in spec["triggers"]:
            threshold = float(trigger["metadata"]["threshold"])
            assert math.isfinite(threshold) and threshold > 0, trigger


def _quantity(text: str) -> float:
    suffixes = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([numkMG]?)", text)
    assert match, f"not a quantity: {text!r}"
    return float(match.group(1)) * suffixes[match.group(2)]


def pod_templates(child: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates a child carries (a Deployment's or StatefulSet's, an LWS's leader and worker), each with the
    volumes its controller adds from `volumeClaimTemplates` (a claim `<template>-<pod>` per pod)."""
    if child["kind"] in ("Deployment", "StatefulSet"):
        templates, claims = [child["spec"]["template"]], child["spec"].get("volumeClaimTemplates") or []
    elif child["kind"] == "LeaderWorkerSet":
        group = child["spec"]["leaderWorkerTemplate"]
        templates, claims = [group["leaderTemplate"], group["workerTemplate"]], group.get("volumeClaimTemplates") or []
    else:
        return []
    added = [{"name": c["metadata"]["name"], "persistentVolumeClaim": {"claimName": f"{c['metadata']['name']}-pod"}}
             for c in claims]
    return [{**t, "spec": {**t["spec"], "volumes": [*(t["spec"].get("volumes") or []), *added]}} for t in templates]


def check_pod(pod: dict[str, Any], spec: Any) -> None:
    """Least privilege whatever the spec says, mounts the API server accepts, and no shell anywhere."""
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert not {"hostPID", "hostNetwork", "hostIPC", "hostUsers", "shareProcessNamespace"} & set(pod), sorted(pod)
    assert set(pod["securityContext"]) <= POD_SECURITY_KEYS, pod["securityContext"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    restricted = isinstance(spec, Mapping) and isinstance(spec.get("security"), Mapping) and spec["security"].get(
        "profile") == "restricted"
    if "runAsUser" in pod["securityContext"]:
        assert restricted and pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == spec["security"].get("runAsUser", 1000)
    volumes = pod["volumes"]
    for volume in volumes:
        assert set(volume) - {"name"} <= VOLUME_SOURCES, volume
    names = [v["name"] for v in volumes]
    assert len(names) == len(set(names)), names
    (container,) = pod["containers"]
    assert container["command"] in COMMANDS, container["command"]
    added = ["IPC_LOCK"] if _get_in(spec, ("network", "ipcLock")) is True else []
    _check_container(container, names, added)
    for init in pod.get("initContainers") or []:
        _check_download_container(init, names)


def _get_in(doc: Any, path: Path) -> Any:
    for part in path:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(part)
    return doc


def _check_container(container: dict[str, Any], volumes: list[str], added: list[str]) -> None:
    """No privilege beyond `added` (IPC_LOCK when spec.network asks for it), mounts the API server accepts, one
    source per env var."""
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False
    capabilities = security["capabilities"]
    assert capabilities.get("drop") == ["ALL"] and capabilities.get("add", []) in ([], added), capabilities
    assert set(capabilities) <= {"drop", "add"}, capabilities
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert len(mounts) == len(set(mounts)), f"two volumes on one mount path (the API server refuses it): {mounts}"
    assert {m["name"] for m in container["volumeMounts"]} <= set(volumes)
    for var in container.get("env") or []:
        assert len(var.get("valueFrom") or {"value": 1}) == 1, f"env {var['name']}: not one source (a 422): {var}"


def _check_download_container(init: dict[str, Any], volumes: list[str]) -> None:
    """The model-download init container runs `python3 -c` with the FIXED script of render/cache.py (no shell, and
    no user string inside the program text: the model id and revision are argv data), with no capability at all."""
    assert init["name"] == cache.DOWNLOAD_CONTAINER, init["name"]
    assert init["command"] == ["python3", "-c", cache.DOWNLOAD_SCRIPT], init["command"][:2]
    model, revision, message = init["args"]
    assert isinstance(model, str) and isinstance(revision, str) and message == cache.TERMINATION_LOG, init["args"]
    _check_container(init, volumes, [])
    assert "resources" in init and not set(init["resources"].get("limits") or {}) - {"memory", "cpu"}, init


def observe(spec: Any, name: str, cluster: ClusterView | tuple[Mapping[str, str], ...]) -> reconcile.Observed:
    """The core's input as the shell builds it (`handlers.observe.complete`): the model and the nodes are read by
    readers that record their calls in CALLS, so a test sees whether anything was fetched."""
    view = cluster if isinstance(cluster, ClusterView) else ClusterView(tuple(cluster))

    def list_nodes(selector: Mapping[str, str]) -> tuple[Mapping[str, str], ...]:
        CALLS.append({"nodes": dict(selector)})
        return view.nodes

    lws = view.lws
    base = reconcile.Observed(name=name, namespace="ns", uid="uid-1", generation=1, spec=spec, status={}, now=NOW,
                              served_kinds=view.served)
    return observe_shell.complete(base, model=resolver(spec), nodes=list_nodes,
                                  lws=None if lws is None else (lambda: lws))
