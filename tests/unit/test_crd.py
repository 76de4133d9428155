"""The generated CRD: committed file up to date, structural, valid for Kubernetes, and in step with the models."""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from kit.crds import openapi_to_jsonschema
from vllm_operator.api import crd as crd_module
from vllm_operator.api import v1alpha1
from vllm_operator.api.crd import (
    CRD_FILENAME,
    SchemaConversionError,
    build_crd,
    check_crds,
    main,
    render_crd,
    to_structural,
    write_crds,
)

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"


def _load_api_cases() -> ModuleType:
    # The spec examples and rule cases live in test_api.py; load it by path (independent of import mode).
    spec = importlib.util.spec_from_file_location("_vllm_api_cases", Path(__file__).with_name("test_api.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


API_CASES = _load_api_cases()


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    loaded = yaml.safe_load((CRDS / CRD_FILENAME).read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> dict[str, Any]:
    version = crd["spec"]["versions"][0]
    result = version["schema"]["openAPIV3Schema"]
    assert isinstance(result, dict)
    return result


# --------------------------------------------------------------------------------------------------
# The committed file is the generated one
# --------------------------------------------------------------------------------------------------


def test_committed_crd_is_up_to_date() -> None:
    diff = check_crds(CRDS)
    assert diff == [], "crds/ is stale; run `python -m vllm_operator.api.crd --write crds/`:\n" + "\n".join(
        diff[:40]
    )


def test_generation_is_deterministic() -> None:
    assert render_crd() == render_crd()
    assert yaml.safe_load(render_crd()) == build_crd()


def test_cli_write_then_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check", str(tmp_path)]) == 1  # missing file is stale
    assert main(["--write", str(tmp_path)]) == 0
    assert (tmp_path / CRD_FILENAME).read_text() == render_crd()
    assert main(["--check", str(tmp_path)]) == 0
    target = tmp_path / CRD_FILENAME
    target.write_text(target.read_text().replace("shortNames:\n    - vllms", "shortNames:\n    - vs"))
    capsys.readouterr()
    assert main(["--check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "is stale (2 lines differ)" in err
    assert "-    - vs" in err and "+    - vllms" in err
    assert "--write" in err
    assert write_crds(tmp_path) == target and check_crds(tmp_path) == []


def test_cli_prints_without_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert capsys.readouterr().out == render_crd()


# --------------------------------------------------------------------------------------------------
# Shape of the CRD
# --------------------------------------------------------------------------------------------------


def test_names_scope_and_version(crd: dict[str, Any]) -> None:
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == "vllmservices.vllm-operator.dev"
    spec = crd["spec"]
    assert spec["group"] == "vllm-operator.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "VLLMService",
        "listKind": "VLLMServiceList",
        "plural": "vllmservices",
        "singular": "vllmservice",
        "shortNames": ["vllms", "vllm"],
    }
    [version] = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]


def test_subresources(crd: dict[str, Any]) -> None:
    assert crd["spec"]["versions"][0]["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }


def test_printer_columns(crd: dict[str, Any]) -> None:
    columns = {col["name"]: col for col in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert list(columns) == ["Model", "GPU", "TP", "Nodes", "MaxLen", "Status", "Ready", "Reason", "Message", "Age"]
    assert columns["Status"]["jsonPath"] == ".status.state"  # filled for every service, invalid ones included
    assert columns["Message"] == {"name": "Message", "type": "string", "priority": 1,
                                  "jsonPath": '.status.conditions[?(@.type=="Degraded")].message'}
    assert columns["Model"]["jsonPath"] == ".spec.model.name"
    assert columns["GPU"]["jsonPath"] == ".status.gpu.product"
    assert columns["TP"]["jsonPath"] == ".status.plan.flags.tensorParallelSize"
    assert columns["MaxLen"]["jsonPath"] == ".status.plan.flags.maxModelLen"
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    assert columns["Reason"]["priority"] == 1


def test_crd_is_a_valid_kubernetes_object(crd: dict[str, Any]) -> None:
    kubernetes_validate.validate(crd, "1.33", strict=True)


def _walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    nodes = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        nodes += _walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        nodes += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        nodes += _walk(node["additionalProperties"], f"{path}.*")
    return nodes


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    for path, node in _walk(schema):
        for banned in ("$ref", "$defs", "definitions", "title", "oneOf", "allOf", "not", "const", "nullable"):
            assert banned not in node, f"{path}: {banned}"
        untyped_ok = node.get("x-kubernetes-preserve-unknown-fields") or node.get(
            "x-kubernetes-int-or-string"
        )
        assert "type" in node or untyped_ok, f"{path}: no type"
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") and node["anyOf"] == [
                {"type": "integer"},
                {"type": "string"},
            ]
        assert not ("properties" in node and "additionalProperties" in node), path
        assert node.get("additionalProperties") is not False, path
        if isinstance(node.get("exclusiveMinimum"), bool):
            assert "minimum" in node, path
    assert schema["properties"]["metadata"] == {"type": "object"}
    assert schema["required"] == ["spec"]


def test_only_replicas_has_a_server_side_default(schema: dict[str, Any]) -> None:
    defaults = {path: node["default"] for path, node in _walk(schema) if "default" in node}
    assert defaults == {".spec.replicas": 1}
    assert v1alpha1.VLLMServiceSpec.model_fields["replicas"].default == 1


def test_descriptions_are_kept(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]
    assert "Hugging Face" in spec["properties"]["model"]["properties"]["name"]["description"]
    # the typed subset of config.json keeps config.json's own key names (Hugging Face documents them); its objects
    # say what they hold (api/model_config.py), its leaves are the file's keys
    mirrored = (".model.config.", ".model.safetensorsIndex.")
    missing = [
        path for path, node in _walk(spec)
        if not node.get("description") and not path.endswith(("[]", ".*"))
        and not (path.startswith(mirrored) and node.get("type") != "object")
    ]
    assert missing == []


def test_free_form_and_bookkeeping_fields_are_preserved(schema: dict[str, Any]) -> None:
    props = schema["properties"]
    status = props["status"]["properties"]
    # (spec has no free-form field left: test_model_config_subset.py)
    preserved = [
        status["kopf"],
        status["plan"]["properties"]["flags"],
        status["plan"]["properties"]["options"]["items"],
        status["remediation"]["properties"]["profile"],
        status["remediation"]["properties"]["history"]["items"]["properties"]["flagsBefore"],
    ]
    for node in preserved:
        assert node.get("x-kubernetes-preserve-unknown-fields") is True
        assert node["type"] == "object"


def test_value_from_is_typed_so_every_field_is_bounded(schema: dict[str, Any]) -> None:
    """Issue 20: `env[].valueFrom` was four free-form objects (any depth, any size); now the Pod API's own shapes."""
    value_from = schema["properties"]["spec"]["properties"]["env"]["items"]["properties"]["valueFrom"]["properties"]
    for name in ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef"):
        node = value_from[name]
        assert "x-kubernetes-preserve-unknown-fields" not in node
        assert all(("maxLength" in p) or p.get("type") == "boolean" or "x-kubernetes-int-or-string" in p
                   for p in node["properties"].values()), name
    model = schema["properties"]["spec"]["properties"]["model"]["properties"]
    for name in ("config", "safetensorsIndex"):  # typed subsets (tests/unit/test_model_config_subset.py)
        assert "x-kubernetes-preserve-unknown-fields" not in model[name] and model[name]["properties"]


def test_affinity_is_typed_so_unknown_keys_are_pruned_or_refused(schema: dict[str, Any]) -> None:
    affinity = schema["properties"]["spec"]["properties"]["affinity"]["properties"]
    node = affinity["nodeAffinity"]["properties"]
    term = node["requiredDuringSchedulingIgnoredDuringExecution"]["properties"]["nodeSelectorTerms"]
    expression = term["items"]["properties"]["matchExpressions"]["items"]
    assert expression["properties"]["operator"]["enum"] == ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    pod_term = affinity["podAntiAffinity"]["properties"]["requiredDuringSchedulingIgnoredDuringExecution"]["items"]
    assert "topologyKey" in pod_term["required"]
    weighted = affinity["podAffinity"]["properties"]["preferredDuringSchedulingIgnoredDuringExecution"]["items"]
    assert (weighted["properties"]["weight"]["minimum"], weighted["properties"]["weight"]["maximum"]) == (1, 100)

    def walk(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            yield node
            for value in node.values():
                yield from walk(value)

    assert not any(n.get("x-kubernetes-preserve-unknown-fields") for n in walk(affinity))


def test_camel_case_names_in_the_schema(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    assert "maxModelLen" in spec["flags"]["properties"]
    assert "memoryGiB" in spec["gpu"]["properties"]
    assert "hfTokenSecretRef" in spec
    memory = schema["properties"]["status"]["properties"]["plan"]["properties"]["memory"]["properties"]
    assert set(memory) == {
        "gpuTotalGiB",
        "requestedGiB",
        "weightsGiB",
        "activationGiB",
        "nonTorchGiB",
        "cudagraphGiB",
        "kvCacheGiB",
        "headroomGiB",
        "persistentGiB",
        "estimated",
    }


def _all_cel_rules() -> list[v1alpha1.CelRule]:
    return [
        rule
        for obj in vars(v1alpha1).values()
        if isinstance(obj, type) and issubclass(obj, BaseModel)
        for rule in getattr(obj, "CEL_RULES", ())
    ]


def test_every_cel_rule_is_in_the_crd(schema: dict[str, Any]) -> None:
    in_crd = [rule for _, node in _walk(schema) for rule in node.get("x-kubernetes-validations", [])]
    expected = [rule.to_k8s() for rule in _all_cel_rules()]

    def key(rule: dict[str, str]) -> tuple[str, str]:
        return rule["rule"], rule["message"]

    # a model used in several places (a LabelSelector in every pod affinity term) carries its rules in each
    assert sorted({key(r) for r in in_crd}) == sorted(key(r) for r in expected)
    for rule in in_crd:
        assert "\n" not in rule["message"]
        assert rule.get("fieldPath", ".").startswith(".")


def test_unions_are_refused() -> None:
    class Bad(BaseModel):
        x: int | str

    with pytest.raises(SchemaConversionError, match="unions"):
        to_structural(Bad.model_json_schema())


def test_unknown_keywords_are_refused() -> None:
    with pytest.raises(SchemaConversionError, match="unsupported"):
        to_structural(
            {"type": "object", "properties": {"a": {"type": "string", "contentEncoding": "base64"}}}
        )


def test_module_exports() -> None:
    assert crd_module.CRD_FILENAME == "vllmservices.vllm-operator.dev.yaml"


# --------------------------------------------------------------------------------------------------
# Documents against the CRD's schema (the API server's own checks, without CEL)
# --------------------------------------------------------------------------------------------------




def _prune_nulls(value: Any) -> Any:
    """The API server drops explicit nulls of non-nullable fields before validating."""
    if isinstance(value, dict):
        return {k: _prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune_nulls(v) for v in value]
    return value


@pytest.fixture(scope="module")
def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    converted = openapi_to_jsonschema(schema)
    jsonschema.Draft202012Validator.check_schema(converted)
    return jsonschema.Draft202012Validator(converted)


def _doc(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "vllm-operator.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "llm", "namespace": "default"},
        "spec": spec,
    }
    if status is not None:
        doc["status"] = status
    pruned: dict[str, Any] = _prune_nulls(doc)
    return pruned


def _errors(validator: jsonschema.Draft202012Validator, doc: dict[str, Any]) -> list[str]:
    return sorted(".".join(str(p) for p in e.absolute_path) for e in validator.iter_errors(doc))


def test_valid_documents(validator: jsonschema.Draft202012Validator) -> None:
    status = {k: v for k, v in API_CASES.STATUS.items() if k != "create_fn"}  # unknown: pruned by the server
    for doc in [
        _doc({"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}}),
        _doc(API_CASES.FULL_SPEC, status),
        _doc({"model": {"name": "m"}, "resources": {"cpu": 4, "memory": "64Gi"}, "gpu": {"memoryGiB": 23.5}}),
        _doc({"model": {"name": "m"}, "flags": {"gpuMemoryUtilization": 1}}),
    ]:
        assert _errors(validator, doc) == []


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        ({}, ""),
        ({"model": {}}, "model"),
        ({"model": {"name": "a b"}}, "model.name"),
        ({"model": {"name": "m"}, "flags": {"maxModelLength": 4096}}, "flags"),
        ({"model": {"name": "m"}, "flags": {"gpuMemoryUtilization": 0}}, "flags.gpuMemoryUtilization"),
        ({"model": {"name": "m"}, "flags": {"gpuMemoryUtilization": 1.2}}, "flags.gpuMemoryUtilization"),
        ({"model": {"name": "m"}, "flags": {"maxModelLen": 8}}, "flags.maxModelLen"),
        ({"model": {"name": "m"}, "flags": {"kvCacheDtype": "int4"}}, "flags.kvCacheDtype"),
        ({"model": {"name": "m"}, "flags": {"blockSize": 24}}, "flags.blockSize"),
        ({"model": {"name": "m"}, "flags": {"enforceEager": "yes"}}, "flags.enforceEager"),
        ({"model": {"name": "m", "quantization": "int3"}}, "model.quantization"),
        ({"model": {"name": "m"}, "gpu": {"count": 0}}, "gpu.count"),
        ({"model": {"name": "m"}, "replicas": -1}, "replicas"),
        ({"model": {"name": "m"}, "resources": {"memory": "64 GB"}}, "resources.memory"),
        ({"model": {"name": "m"}, "service": {"type": "Ingress"}}, "service.type"),
        ({"model": {"name": "m"}, "service": {"port": 70000}}, "service.port"),
        ({"model": {"name": "m"}, "workload": {"profile": "game"}}, "workload.profile"),
        (
            {"model": {"name": "m"}, "modelCache": {"claimName": "c", "mountPath": "cache"}},
            "modelCache.mountPath",
        ),
        ({"model": {"name": "m"}, "nodeSelector": {"a": 1}}, "nodeSelector.a"),
        ({"model": {"name": "m"}, "extraArgs": "--seed 1"}, "extraArgs"),
    ],
)
def test_invalid_documents(
    validator: jsonschema.Draft202012Validator, spec: dict[str, Any], where: str
) -> None:
    errors = _errors(validator, _doc(spec))
    assert errors, spec
    assert all(e == f"spec.{where}".rstrip(".") for e in errors), errors
    # pydantic rejects the same documents
    assert v1alpha1.validate_spec(spec)


# --------------------------------------------------------------------------------------------------
# The CEL rules agree with their Python mirrors (needs the optional `cel-python` package)
# --------------------------------------------------------------------------------------------------


def _cel_failures(celpy: Any, schema: dict[str, Any], value: Any) -> list[str]:
    failures: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        env = celpy.Environment()
        program = env.program(env.compile(rule["rule"]))
        result = program.evaluate({"self": celpy.json_to_cel(value)})
        assert isinstance(result, celpy.celtypes.BoolType), f"{rule['rule']} on {value}: {result!r}"
        if not result:
            failures.append(rule["rule"])
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                failures += _cel_failures(celpy, sub, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            failures += _cel_failures(celpy, schema["items"], item)
    return failures


@pytest.mark.parametrize(("doc", "rule", "field"), API_CASES.RULE_CASES)
def test_cel_rules_agree_with_pydantic(
    schema: dict[str, Any], doc: dict[str, Any], rule: str | None, field: str | None
) -> None:
    import celpy  # cel-python: a dependency of the dev and sim extras, never skipped
    stored = copy.deepcopy(doc)
    stored.setdefault("replicas", 1)  # the one server-side default, applied before CEL runs
    by_text = {r.rule: r.id for r in _all_cel_rules()}
    failed = [by_text[text] for text in _cel_failures(celpy, schema["properties"]["spec"], stored)]
    assert failed == API_CASES.rule_ids(doc)
    assert failed == ([rule] if rule else [])
