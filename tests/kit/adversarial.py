"""Generated VLLMService specs, valid and hostile, and the checks every one of them must pass through the reconcile
core (issue 10). Shared by tests/unit/test_adversarial.py (a CI-sized sample) and benchmarks/adversarial_corpus.py
(the large corpus, with counts).

`specs()` draws from three families: valid specs (catalog models, inline configs, every optional block), mutated
valid specs (one to four fields replaced by an adversarial value: newlines and YAML syntax, unicode, huge and
negative numbers, NaN, wrong types, unknown fields, contradictory flags, deep or huge inline configs), and raw
junk. `check(observed, desired)` returns the outcome name, or raises AssertionError naming what broke.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
from hypothesis import strategies as st

from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.modelfiles import ModelFiles, find_in_catalog, list_catalog

K8S_VERSION = "1.33"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
L4_NODE = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "2"}
H100_NODE = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}

CATALOG_IDS = sorted(f.model_id for f in list_catalog())[:12]

# --- adversarial values --------------------------------------------------------------------------------

INJECTIONS = [
    "x\nprivileged: true",
    "x\n          securityContext: {privileged: true, capabilities: {add: [SYS_ADMIN]}}",
    "x\n      hostPID: true\n      hostNetwork: true",
    "x}: {hostPID: true",
    "'; hostNetwork: true; '",
    "&a x", "*a", "!!python/object:os.system", "{{ 7*7 }}", "${HOME}", "$(HF_TOKEN)",
    "017", "yes", "no", "on", "null", "~", "1e3", "0x1F", "True", "-", "--", "", " ", "\t",
    "a" * 300, "é", "模型", "\u2028", "\x00", "../../etc/passwd", "/dev/zero", "dev/zero", "etc/passwd",
    "vllm/vllm-openai:v0.11.0\n", "vllm/vllm-openai:v0.4.2", "hf_abcdefghijklmnopqrstuvwxyz012345",
]
NUMBERS = [0, -1, 1, 2, 7, 63, 64, 65536, 2**31, 2**63, 10**30, -(10**30), 1e18, 1e308, 0.5, -0.0, float("nan"),
           float("inf")]
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

# --- valid specs -----------------------------------------------------------------------------------------

name = st.sampled_from(["svc", "017", "yes", "true", "a.b", "x" * 63, "llama-3", "m" * 64, "0", "a-b.c-d"])

valid_model = st.one_of(
    st.fixed_dictionaries({"name": st.sampled_from(CATALOG_IDS)}),
    st.fixed_dictionaries({"name": st.just("org/inline-model"),
                           "config": st.builds(_inline_config, st.integers(1, 96), st.sampled_from([1024, 4096]))},
                          optional={"safetensorsIndex": st.just({"metadata": {"total_size": 2 * 10**9}})}),
)

valid_spec = st.fixed_dictionaries(
    {"model": valid_model},
    optional={
        "image": st.sampled_from(["vllm/vllm-openai:v0.26.0", "vllm/vllm-openai:v0.11.0", "vllm/vllm-openai:v0.8.5",
                                  "vllm/vllm-openai:v0.17.1", "registry.local:5000/vllm/vllm-openai:v0.26.0"]),
        "gpu": st.fixed_dictionaries({}, optional={"product": st.sampled_from(["L4", "H100-80GB", "A100-80GB"]),
                                                   "maxCount": st.integers(1, 8)}),
        "flags": st.fixed_dictionaries({}, optional={
            "maxModelLen": st.integers(16, 32768), "gpuMemoryUtilization": st.floats(0.5, 0.95),
            "enforceEager": st.booleans(), "enableLora": st.just(True), "swapSpace": st.integers(0, 16),
            "enablePrefixCaching": st.booleans(), "maxNumSeqs": st.integers(1, 256)}),
        "extraArgs": st.lists(st.sampled_from(["--disable-log-requests", "--api-key", "$(HF_TOKEN)",
                                               "--uvicorn-log-level=debug"]), max_size=3),
        "env": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["A", "HF_TOKEN", "API_KEY"]),
                                               "value": st.sampled_from(["1", "hf_" + "a" * 34, "debug"])}),
                        max_size=2),
        "replicas": st.integers(0, 3),
        "modelCache": st.one_of(st.just({"claimName": "models"}), st.just({"size": "100Gi",
                                                                           "storageClassName": "fast"})),
        "resources": st.fixed_dictionaries({}, optional={"memory": st.just("64Gi"), "cpu": st.just("8")}),
        "nodeSelector": st.just({"pool": "gpu"}),
        "tolerations": st.just([{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}]),
        "service": st.fixed_dictionaries({}, optional={"type": st.sampled_from(["ClusterIP", "LoadBalancer"]),
                                                       "port": st.integers(1, 65535)}),
        "hfTokenSecretRef": st.just({"name": "hf", "key": "token"}),
        "security": st.fixed_dictionaries({"profile": st.sampled_from(["baseline", "restricted"])}),
        "workload": st.fixed_dictionaries({}, optional={"contextLength": st.integers(1, 8192),
                                                        "profile": st.sampled_from(["chat", "rag"])}),
    },
)

# Paths a mutation may replace: every string field (for the injections) and the numeric/structured ones.
PATHS: list[tuple[str, ...]] = [
    ("model", "name"), ("model", "revision"), ("model", "servedName"), ("model", "config"),
    ("model", "safetensorsIndex"), ("model", "configMapRef", "name"), ("model", "configMapRef", "configKey"),
    ("image",), ("imagePullPolicy",), ("gpu", "product"), ("gpu", "count"), ("gpu", "maxCount"),
    ("gpu", "memoryGiB"), ("flags", "maxModelLen"), ("flags", "tensorParallelSize"), ("flags", "maxLoraRank"),
    ("flags", "gpuMemoryUtilization"), ("flags", "kvCacheDtype"), ("flags", "swapSpace"), ("flags", "enableLora"),
    ("extraArgs",), ("extraArgs", 0), ("workload", "contextLength"), ("workload", "concurrency"), ("replicas",),
    ("maxReplicas",), ("resources", "memory"), ("resources", "cpu"), ("resources", "shmSize"), ("nodeSelector",),
    ("nodeSelector", "pool"), ("tolerations", 0, "key"), ("tolerations", 0, "value"), ("affinity",),
    ("env", 0, "name"), ("env", 0, "value"), ("env", 0, "valueFrom"), ("hfTokenSecretRef", "name"),
    ("hfTokenSecretRef", "key"), ("modelCache", "claimName"), ("modelCache", "size"),
    ("modelCache", "storageClassName"), ("modelCache", "mountPath"), ("service", "type"), ("service", "port"),
    ("remediation", "maxSteps"), ("prometheus", "enabled"), ("security", "profile"), ("security", "runAsUser"),
    ("unknownField",), ("flags", "unknownFlag"),
]


def _set(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    node: Any = doc
    for part, following in zip(path, path[1:], strict=False):
        if isinstance(node, dict):
            nxt = node.get(part) if isinstance(part, str) else None
            if not isinstance(nxt, dict | list):
                nxt = [] if isinstance(following, int) else {}
                node[part] = nxt
            node = nxt
        elif isinstance(node, list):
            while len(node) <= int(part):
                node.append({} if not isinstance(following, int) else [])
            node = node[int(part)]
    last = path[-1]
    if isinstance(node, dict):
        node[last] = value
    elif isinstance(node, list):
        while len(node) <= int(last):
            node.append(None)
        node[int(last)] = value


mutation_value = st.one_of(st.sampled_from(INJECTIONS), st.sampled_from(NUMBERS), st.sampled_from(WRONG_TYPES),
                           st.sampled_from(HOSTILE_CONFIGS), junk)


@st.composite
def mutated_spec(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(draw(valid_spec))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(PATHS))
        _set(doc, path, draw(mutation_value))
    return doc


specs = st.one_of(valid_spec, mutated_spec(), mutated_spec(), st.dictionaries(st.text(max_size=10), junk, max_size=4))

nodes = st.sampled_from([(L4_NODE,), (H100_NODE,), (), (L4_NODE, H100_NODE),
                         ({"nvidia.com/gpu.product": "0GB\nx", "nvidia.com/gpu.count": "-1"},)])

# --- the checks -------------------------------------------------------------------------------------------


def resolver(spec: Mapping[str, Any]) -> reconcile.ModelResolver:
    """The shell's resolver, minus the hub: a catalog id resolves, anything else is not found. Records calls."""

    def resolve() -> tuple[ModelFiles | None, str | None]:
        CALLS.append(spec)
        model = spec.get("model") if isinstance(spec, Mapping) else None
        found = find_in_catalog(str(model.get("name"))) if isinstance(model, Mapping) else None
        return (found, None) if found else (None, "not in the catalog (the hub is not reachable in tests)")

    return resolve


CALLS: list[Mapping[str, Any]] = []

# Key paths of the rendered children; dict keys that are data (labels, annotations, selectors) become '*', and
# the free-form blocks the spec passes through (affinity, env valueFrom) are not descended into.
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
    """Every key path the renderer can produce, from a rendering with every feature on."""
    from vllm_operator.render.manifests import OwnerRef, RenderInput, build_children

    full = RenderInput(
        name="ref", namespace="ns", owner=OwnerRef(name="ref", uid="u"), model="org/m", revision="main",
        served_name="m", image="vllm/vllm-openai:v0.26.0", vllm_version="0.26.0", flags={"max_model_len": 1},
        extra_args=("--x",), gpu_count=2, gpu_product_label="NVIDIA-L4", node_selector={"a": "b"},
        tolerations=({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule",
                      "tolerationSeconds": 1},),
        affinity={"nodeAffinity": {}}, env=({"name": "A", "value": "1"}, {"name": "B", "valueFrom": {}}),
        hf_token_secret="hf", cache_claim="c", cache_create=True, cache_storage_class="s",
        security_profile="restricted")
    paths: dict[str, set[str]] = {}
    for child in build_children(full):
        paths.setdefault(child["kind"], set()).update(key_paths(child))
    return paths


REFERENCE = _reference_paths()
FIELD = re.compile(r"(spec|metadata)\.[A-Za-z]")


def check(observed: reconcile.Observed, desired: reconcile.Desired) -> str:
    """The outcome ('Deployed', 'InvalidSpec', ...) of one reconcile; AssertionError when a rule of issue 10 broke."""
    conditions = {c.type: c for c in desired.status.conditions}
    degraded = conditions.get(cond.DEGRADED)
    reason = degraded.reason if degraded is not None and degraded.status == cond.TRUE else None
    assert reason != reconcile.INTERNAL_ERROR, f"unforeseen failure for spec {observed.spec!r:.300}"
    if reason == cond.INVALID_SPEC:
        assert degraded is not None and FIELD.search(degraded.message), degraded.message
        assert desired.children is None
    for event in desired.events:
        assert event.type in ("Normal", "Warning") and event.reason and event.message
    if desired.children is None:
        return reason or "NotDeployed"
    for child in desired.children:
        try:
            kubernetes_validate.validate(child, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{child['kind']} is invalid for Kubernetes: {exc.message[:300]}") from None
        extra = key_paths(child) - REFERENCE[child["kind"]]
        assert not extra, f"{child['kind']} has keys the spec did not ask for: {sorted(extra)[:5]}"
        assert isinstance(child["metadata"]["name"], str) and len(child["metadata"]["name"]) <= 253
    pod = next(c for c in desired.children if c["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    vllm = pod["containers"][0]["securityContext"]
    assert vllm["allowPrivilegeEscalation"] is False and vllm["capabilities"] == {"drop": ["ALL"]}
    return "Deployed"


def observe(spec: Any, name: str, node_labels: tuple[Mapping[str, str], ...]) -> reconcile.Observed:
    """The core's input as the shell builds it: the model resolver and the node lister are injected (and record
    their calls in CALLS), so a test sees whether anything was fetched."""

    def list_nodes(selector: Mapping[str, str]) -> tuple[Mapping[str, str], ...]:
        CALLS.append({"nodes": dict(selector)})
        return node_labels

    return reconcile.Observed(name=name, namespace="ns", uid="uid-1", generation=1, spec=spec, status={}, now=NOW,
                              list_nodes=list_nodes, resolve_model=resolver(spec))
