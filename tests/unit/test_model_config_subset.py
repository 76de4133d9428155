"""`spec.model.config` / `spec.model.safetensorsIndex` are typed subsets of config.json and the safetensors index
(issue 20: the CRD bounds the depth of every free-form field).

One source of truth: the planner is run over every config the repository has (the built-in catalog, the benchmark
data, the test kits) through a recording mapping, and every key it reads, present or not, must be a key the typed
subset keeps. A new key read by the planner and missing from `api/model_config.py` fails here, not in a cluster
where the API server silently pruned it. And the subset hands the planner the same data: the architecture read
from the pruned config equals the one read from the whole file.
"""

from __future__ import annotations

import functools
import json
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel

from kit.adversarial import _inline_config
from vllm_operator import modelfiles
from vllm_operator.api.crd import build_openapi_schema
from vllm_operator.api.model_config import ArchConfig, ModelConfigSubset, SafetensorsIndexSubset
from vllm_operator.api.v1alpha1 import SpecValidationError, parse_spec, validate_spec
from vllm_operator.planner import arch as arch_module
from vllm_operator.planner.arch import ArchError, arch_from_config, check_arch_bounds
from vllm_operator_sim.emulator_admission import prune_unknown, schema_errors
from vllm_operator_sim.realvllm import tiny_llama_config

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "vllmservices.vllm-operator.dev.yaml"
#: The path segment the merged text config (top level + text_config) is recorded under.
MERGED = "*"


def _configs() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted((ROOT / "operator" / "vllm_operator" / "catalog" / "models").glob("*.json")):
        yield f"catalog/{path.stem}", json.loads(path.read_text())["config"]
    for path in sorted((ROOT / "benchmarks" / "data").glob("models*/*/config.json")):
        yield f"benchmarks/{path.parent.parent.name}/{path.parent.name}", json.loads(path.read_text())
    yield "tiny-llama", tiny_llama_config()
    yield "adversarial-inline", _inline_config(32)


CONFIGS = dict(_configs())


class _Key(str):
    """A config key that records a lookup that finds it, also after `{**config}` copied it into a plain dict."""

    path: str
    reads: set[str]

    def __new__(cls, name: str, path: str, reads: set[str]) -> _Key:
        key = super().__new__(cls, name)
        key.path, key.reads = path, reads
        return key

    def __eq__(self, other: object) -> bool:
        equal = str.__eq__(self, other)
        if equal is True:
            self.reads.add(self.path)
        return equal

    __hash__ = str.__hash__


class Recording(dict[str, Any]):
    """A config.json that records every key read from it: present or not, at any depth."""

    def __init__(self, data: dict[str, Any], prefix: str, reads: set[str]) -> None:
        super().__init__({_Key(k, prefix + k, reads): _wrap(v, prefix + k + ".", reads) for k, v in data.items()})
        self._prefix, self._reads = prefix, reads

    def get(self, key: str, default: Any = None) -> Any:
        self._reads.add(self._prefix + key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self._reads.add(self._prefix + key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._reads.add(self._prefix + str(key))
        return super().__contains__(key)


def _wrap(value: Any, prefix: str, reads: set[str]) -> Any:
    if isinstance(value, dict):
        return Recording(value, prefix, reads)
    if isinstance(value, list):
        return [_wrap(item, prefix + "[].", reads) if isinstance(item, dict) else item for item in value]
    return value


def _planner_reads(config: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Every key path the planner reads from `config` (check_config, check_arch_bounds, arch_from_config)."""
    reads: set[str] = set()
    merge = arch_module._text_config

    def recorded_merge(cfg: Any) -> Any:  # the merged text config is a plain dict: record lookups of its keys too
        return Recording(merge(cfg), f"{MERGED}.", reads)

    monkeypatch.setattr(arch_module, "_text_config", recorded_merge)
    recording = Recording(config, "", reads)
    modelfiles._check_config(recording, "recorded")
    check_arch_bounds(recording, model_id="recorded")
    arch_from_config(recording, model_id="recorded")
    monkeypatch.setattr(arch_module, "_text_config", merge)
    return reads


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType, dict) or hasattr(annotation, "__metadata__"):
        for arg in get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def _kept(path: str) -> bool:
    """Whether the typed subset keeps `path` (dotted; `*.` is the merged text config, `[].` a list item)."""
    model: type[BaseModel] | None = ModelConfigSubset
    parts = path.split(".")
    if parts[0] == MERGED:
        model, parts = ArchConfig, parts[1:]
    map_values = False
    for part in parts:
        if model is None:
            return False
        if map_values:  # a key of config_groups: any name
            map_values = False
            continue
        field = model.model_fields.get(part)
        if field is None:
            return False
        model = _model_of(field.annotation)
        map_values = get_origin(_strip_optional(field.annotation)) is dict
    return True


def _strip_optional(annotation: Any) -> Any:
    args = [a for a in get_args(annotation) if a is not type(None)] if get_origin(annotation) in (
        Union, types.UnionType) else [annotation]
    inner = args[0] if len(args) == 1 else annotation
    return get_args(inner)[0] if hasattr(inner, "__metadata__") else inner


def test_the_corpus_is_the_repositorys_configs() -> None:
    assert len(CONFIGS) >= 100
    assert any(name.startswith("catalog/") for name in CONFIGS)
    assert any(name.startswith("benchmarks/models-2026") for name in CONFIGS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_planner_reads_only_keys_the_typed_subset_keeps(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _planner_reads(CONFIGS[name], monkeypatch)
    assert reads, "the recording saw no read: the planner no longer reads through it"
    pruned = sorted(path for path in reads if not _kept(path))
    assert not pruned, (f"{name}: the planner reads {pruned}, which spec.model.config would prune; add them to "
                        "api/model_config.py (and regenerate the CRD)")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_pasted_config_plans_as_the_whole_file(name: str) -> None:
    config = CONFIGS[name]
    spec = parse_spec({"model": {"name": "org/model", "config": config}})
    kept = spec.model.config
    assert kept is not None and set(kept) <= set(config)
    assert ModelConfigSubset.model_validate(kept).model_dump(exclude_none=True) == kept  # a fixed point
    assert arch_from_config(kept, model_id="m") == arch_from_config(config, model_id="m")


def test_the_recording_sees_a_read_of_a_key_the_subset_prunes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a read of an unknown key, nested or merged, is found."""
    original = arch_module._moe_layers

    def reads_more(cfg: Any, layers: int, num_experts: int) -> Any:  # cfg: the merged text config
        cfg.get("an_unknown_key")
        rope = cfg.get("rope_scaling")
        if isinstance(rope, dict):
            rope.get("beta_fast")
        return original(cfg, layers, num_experts)

    monkeypatch.setattr(arch_module, "_moe_layers", reads_more)
    config = {**tiny_llama_config(), "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    reads = _planner_reads(config, monkeypatch)
    assert {"*.an_unknown_key", "*.rope_scaling.beta_fast"} <= reads
    assert not _kept("*.an_unknown_key") and not _kept("*.rope_scaling.beta_fast")
    assert _kept("*.hidden_size") and _kept("text_config.rope_scaling.factor")
    assert _kept("quantization_config.config_groups.group_0.weights.num_bits")


def test_the_crd_has_no_free_form_field_in_the_spec() -> None:
    """Every node of spec is typed: no `x-kubernetes-preserve-unknown-fields` (the API server would store 10,000
    levels there), and spec.model.config is a handful of levels deep."""
    schema = build_openapi_schema()
    free: list[str] = []

    def walk(node: Any, path: str, depth: int) -> int:
        if not isinstance(node, dict):
            return depth
        if node.get("x-kubernetes-preserve-unknown-fields"):
            free.append(path)
        children = [walk(sub, f"{path}.{key}", depth + 1) for key, sub in (node.get("properties") or {}).items()]
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                children.append(walk(node[key], f"{path}[]", depth + 1))
        return max([depth, *children])

    walk(schema["properties"]["spec"], "spec", 0)
    assert free == []
    model = schema["properties"]["spec"]["properties"]["model"]["properties"]
    assert walk(model["config"], "config", 1) == 7  # config.text_config.quantization_config.config_groups.<g>.weights.num_bits
    assert walk(model["safetensorsIndex"], "safetensorsIndex", 1) == 3
    assert "configMapRef" in model["config"]["description"]
    assert _crd_schema() == schema


def test_unknown_keys_and_nulls_are_dropped_as_the_api_server_prunes_them() -> None:
    config = {**tiny_llama_config(), "rope_scaling": None, "torch_dtype": "float16", "rms_norm_eps": 1e-5,
              "text_config": {"num_hidden_layers": 2, "attention_bias": False},
              "quantization_config": {"quant_method": "awq", "bits": 4, "zero_point": True,
                                      "modules_to_not_convert": {"a": {"a": {}}}}}
    kept = parse_spec({"model": {"name": "org/m", "config": config}}).model.config
    assert kept is not None
    assert "rope_scaling" not in kept and "rms_norm_eps" not in kept
    assert kept["text_config"] == {"num_hidden_layers": 2}
    assert kept["quantization_config"] == {"quant_method": "awq", "bits": 4}
    assert isinstance(kept["quantization_config"]["bits"], int) and kept["torch_dtype"] == "float16"


@pytest.mark.parametrize(("config", "field"), [
    ({"hidden_size": "4096"}, "spec.model.config.hidden_size"),
    ({"rope_scaling": {"factor": {"a": 1}}}, "spec.model.config.rope_scaling.factor"),
    ({"text_config": {"layer_types": [["full"]]}}, "spec.model.config.text_config.layer_types[0]"),
    ({"tie_word_embeddings": "yes"}, "spec.model.config.tie_word_embeddings"),
    ({"quantization_config": {"config_groups": {"g": {"weights": {"num_bits": "4"}}}}},
     "spec.model.config.quantization_config.config_groups.g.weights.num_bits"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_its_path(config: dict[str, Any], field: str) -> None:
    errors = validate_spec({"model": {"name": "org/m", "config": {**tiny_llama_config(), **config}}})
    assert [e.field for e in errors] == [field], errors


def test_deep_and_huge_inline_documents_are_still_refused_before_pruning() -> None:
    """The Python-side bounds stay (an object stored before this CRD, or by a server that does not prune)."""
    deep: dict[str, Any] = {}
    for _ in range(20):  # over the inline bound (16), under the whole spec's (32)
        deep = {"a": deep}
    for field, value in (("config", {**tiny_llama_config(), "x": deep}), ("safetensorsIndex", {"x": deep}),
                         ("config", {**tiny_llama_config(), "blob": "x" * 300_000})):
        with pytest.raises(SpecValidationError) as caught:
            parse_spec({"model": {"name": "org/m", field: value}})
        assert [e.field for e in caught.value.errors] == [f"spec.model.{field}"]
        assert re.search(r"nests deeper than 16 levels|larger than 256 KiB", caught.value.errors[0].message)


def test_the_safetensors_index_keeps_only_its_total_size() -> None:
    index = {"metadata": {"total_size": 15_231_233_024}, "weight_map": {f"layer.{i}": "a.safetensors"
                                                                        for i in range(500)}}
    model = parse_spec({"model": {"name": "org/m", "safetensorsIndex": index}}).model
    assert model.safetensors_index == {"metadata": {"total_size": 15_231_233_024}}
    assert model.weights_bytes() == 15_231_233_024
    assert parse_spec({"model": {"name": "org/m", "safetensorsIndex": {"totalSize": 7}}}).model.weights_bytes() == 7
    assert SafetensorsIndexSubset.model_validate({"totalSize": 7}).model_dump(by_alias=True, exclude_none=True) == {
        "totalSize": 7}
    errors = validate_spec({"model": {"name": "org/m", "safetensorsIndex": {"metadata": {"total_size": "big"}}}})
    assert "spec.model.safetensorsIndex.metadata.total_size" in [e.field for e in errors]


def test_the_spec_serializes_the_kept_config_as_given() -> None:
    config = tiny_llama_config()
    spec = parse_spec({"model": {"name": "org/m", "config": config}})
    dumped = spec.model_dump(mode="json", by_alias=True, exclude_none=True)["model"]["config"]
    assert dumped == spec.model.config
    assert parse_spec({"model": {"name": "org/m", "config": dumped}}).model.config == dumped


def test_check_arch_bounds_still_names_an_out_of_range_value() -> None:
    kept = parse_spec({"model": {"name": "org/m", "config": {**tiny_llama_config(),
                                                               "num_hidden_layers": 100_000}}}).model.config
    with pytest.raises(ArchError, match="num_hidden_layers"):
        check_arch_bounds(kept, model_id="m")


@functools.cache
def _crd_schema() -> dict[str, Any]:
    schema: dict[str, Any] = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _drop_nulls(value: Any) -> Any:
    """What the API server does with a null in a field the CRD does not mark nullable: drops it."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_api_server_stores_what_the_operator_reads(name: str) -> None:
    """One source of truth: the CRD's pruning (as the emulated API server applies it) keeps exactly the keys and
    values the pydantic subset hands the planner, and admits every real config."""
    schema = _crd_schema()
    obj = {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
           "spec": {"model": {"name": "org/m", "config": json.loads(json.dumps(CONFIGS[name]))}}}
    dropped = prune_unknown(obj, schema)
    stored = _drop_nulls(obj)
    assert schema_errors(stored, crd_schema=schema) == []
    assert stored["spec"]["model"]["config"] == parse_spec(stored).model.config
    assert stored["spec"]["model"]["config"] == parse_spec({"model": {"name": "org/m",
                                                                       "config": CONFIGS[name]}}).model.config
    if name.startswith(("catalog/", "benchmarks/")):  # kubectl's default (strict) validation names these keys
        assert dropped and all(path.startswith("spec.model.config.") for path in dropped)
