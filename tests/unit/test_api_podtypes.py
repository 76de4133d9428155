"""The hand-typed Pod API types (api/podtypes.py) against Kubernetes' own OpenAPI schema, as kubernetes-validate
packages it: each is a subset of its upstream definition (every property we declare exists there with a compatible
type, everything upstream requires is required here), in the oldest supported release and the newest packaged."""

from __future__ import annotations

import importlib.resources
import json
import re
from collections.abc import Mapping
from typing import Any

import kubernetes_validate
import pytest
from pydantic import BaseModel

from vllm_operator.api import podtypes
from vllm_operator.api.crd import to_structural
from vllm_operator.api.schema import _Model

Schema = Mapping[str, Any]
CORE = "io.k8s.api.core.v1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."

#: Each hand-typed model and the upstream definition(s) it mirrors.
UPSTREAM: dict[type[BaseModel], tuple[str, ...]] = {
    podtypes.Toleration: (CORE + "Toleration",),
    podtypes.KeySelector: (CORE + "SecretKeySelector", CORE + "ConfigMapKeySelector"),
    podtypes.ObjectFieldSelector: (CORE + "ObjectFieldSelector",),
    podtypes.ResourceFieldSelector: (CORE + "ResourceFieldSelector",),
    podtypes.EnvVarSource: (CORE + "EnvVarSource",),
    podtypes.EnvVar: (CORE + "EnvVar",),
    podtypes.NodeSelectorRequirement: (CORE + "NodeSelectorRequirement",),
    podtypes.NodeSelectorFieldRequirement: (CORE + "NodeSelectorRequirement",),
    podtypes.NodeSelectorTerm: (CORE + "NodeSelectorTerm",),
    podtypes.NodeSelector: (CORE + "NodeSelector",),
    podtypes.PreferredSchedulingTerm: (CORE + "PreferredSchedulingTerm",),
    podtypes.NodeAffinity: (CORE + "NodeAffinity",),
    podtypes.LabelSelectorRequirement: (META + "LabelSelectorRequirement",),
    podtypes.LabelSelector: (META + "LabelSelector",),
    podtypes.PodAffinityTerm: (CORE + "PodAffinityTerm",),
    podtypes.WeightedPodAffinityTerm: (CORE + "WeightedPodAffinityTerm",),
    podtypes.PodAffinity: (CORE + "PodAffinity", CORE + "PodAntiAffinity"),
    podtypes.Affinity: (CORE + "Affinity",),
}


def _packaged() -> list[str]:
    root = importlib.resources.files(kubernetes_validate).joinpath("kubernetes-json-schema")
    return sorted((m.group(1) for p in root.iterdir() if (m := re.fullmatch(r"v(\d+\.\d+)\.\d+-local", p.name))),
                  key=lambda v: tuple(int(x) for x in v.split(".")))


RELEASES = (podtypes.OLDEST_KUBERNETES, _packaged()[-1])


def _definitions(release: str) -> dict[str, Schema]:
    root = importlib.resources.files(kubernetes_validate).joinpath("kubernetes-json-schema")
    document = json.loads(root.joinpath(f"v{release}.0-local", "_definitions.json").read_text())
    defs: dict[str, Schema] = document["$defs"]
    return defs


def _resolve(node: Schema, defs: Mapping[str, Schema]) -> Schema:
    while "$ref" in node:
        node = defs[node["$ref"].removeprefix("#/$defs/")]
    return node


def _types(node: Schema) -> set[str]:
    """JSON types a schema node admits (null dropped; oneOf/anyOf branches joined; integer within number)."""
    out: set[str] = set()
    for branch in [node, *node.get("oneOf", []), *node.get("anyOf", [])]:
        kind = branch.get("type")
        out.update([kind] if isinstance(kind, str) else kind or [])
    out.discard("null")
    if node.get("x-kubernetes-int-or-string"):
        out |= {"integer", "string"}
    return out | ({"integer"} if "number" in out else set())


def subset_problems(ours: Schema, upstream: Schema, defs: Mapping[str, Schema], path: str = "") -> list[str]:
    """Where `ours` (a structural CRD schema) admits what `upstream` (a Kubernetes definition) does not know."""
    upstream = _resolve(upstream, defs)
    problems: list[str] = []
    missing_types = _types(ours) - _types(upstream)
    if missing_types and _types(upstream):
        problems.append(f"{path or '.'}: {sorted(missing_types)} where Kubernetes has {sorted(_types(upstream))}")
    if "properties" in ours:
        theirs = upstream.get("properties", {})
        for name, schema in ours["properties"].items():
            if name not in theirs:
                problems.append(f"{path}.{name}: not a field of the Kubernetes type")
            else:
                problems += subset_problems(schema, theirs[name], defs, f"{path}.{name}")
        loose = set(upstream.get("required", [])) - set(ours.get("required", []))
        problems += [f"{path}.{name}: required by Kubernetes, optional here" for name in sorted(loose)]
    if "items" in ours:
        problems += subset_problems(ours["items"], upstream.get("items", {}), defs, f"{path}[]")
    if isinstance(ours.get("additionalProperties"), Mapping):
        problems += subset_problems(ours["additionalProperties"], upstream.get("additionalProperties", {}), defs,
                                    f"{path}{{}}")
    return problems


def _structural(model: type[BaseModel]) -> Schema:
    return to_structural(model.model_json_schema(mode="validation", by_alias=True))


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("model", list(UPSTREAM), ids=lambda m: m.__name__)
def test_each_pod_type_is_a_subset_of_its_kubernetes_definition(model: type[BaseModel], release: str) -> None:
    defs = _definitions(release)
    for name in UPSTREAM[model]:
        assert subset_problems(_structural(model), defs[name], defs) == [], f"{model.__name__} vs {name} ({release})"


def test_every_model_of_the_module_is_checked() -> None:
    models = {obj for obj in vars(podtypes).values()
              if isinstance(obj, type) and issubclass(obj, _Model) and obj.__module__ == podtypes.__name__}
    assert models == set(UPSTREAM)


def test_the_releases_checked_are_packaged() -> None:
    assert podtypes.OLDEST_KUBERNETES in _packaged()  # kubernetes-validate >= 1.37 packages 1.25 on


class _Drifted(_Model):
    """A Toleration with a field Kubernetes lacks, a wrong type and a required field left optional."""

    key: int | None = None
    operator: str | None = None
    tolerate_forever: bool | None = None


class _LooseRequirement(_Model):
    key: str | None = None
    operator: str | None = None
    values: list[int] | None = None


def test_the_check_finds_drift() -> None:
    defs = _definitions(RELEASES[-1])
    assert subset_problems(_structural(_Drifted), defs[CORE + "Toleration"], defs) == [
        ".key: ['integer'] where Kubernetes has ['string']",
        ".tolerateForever: not a field of the Kubernetes type",
    ]
    assert subset_problems(_structural(_LooseRequirement), defs[CORE + "NodeSelectorRequirement"], defs) == [
        ".values[]: ['integer'] where Kubernetes has ['string']",
        ".key: required by Kubernetes, optional here",
        ".operator: required by Kubernetes, optional here",
    ]


def test_a_field_newer_than_the_oldest_release_is_found() -> None:
    # a field Kubernetes added after the oldest supported release (EnvVarSource.fileKeyRef, 1.34) is refused
    newest, oldest = _definitions(RELEASES[-1]), _definitions(RELEASES[0])
    newer = set(newest[CORE + "EnvVarSource"]["properties"]) - set(oldest[CORE + "EnvVarSource"]["properties"])
    assert newer
    field = sorted(newer)[0]
    ours = {"type": "object", "properties": {field: {"type": "object"}}}
    assert subset_problems(ours, oldest[CORE + "EnvVarSource"], oldest) == [
        f".{field}: not a field of the Kubernetes type"]
