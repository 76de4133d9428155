"""The upstream CustomResourceDefinitions of tests/data/crds (LeaderWorkerSet, KEDA ScaledObject, InferencePool):
their schemas, and what an API server serving them would do with an object — refuse it (`jsonschema`) or silently
prune a field the schema lacks (`unknown_fields`); and any CRD schema as plain JSON Schema
(`openapi_to_jsonschema`, strict about unknown fields as `kubectl --validate=strict`)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).resolve().parents[1] / "data" / "crds"

#: kind -> (file, served version)
FILES = {
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io_leaderworkersets.yaml", "v1"),
    "ScaledObject": ("keda.sh_scaledobjects.yaml", "v1alpha1"),
    "InferencePool": ("inference.networking.k8s.io_inferencepools.yaml", "v1"),
}


@cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of `kind`'s served version (treat it as read-only: it is cached)."""
    file, version = FILES[kind]
    # libyaml's loader where PyYAML has it: the LeaderWorkerSet CRD is 1.3 MB, 3 s in pure Python, 0.5 s in C
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    docs = [d for d in yaml.load_all((CRDS / file).read_text(), Loader=loader) if d]  # noqa: S506 - a safe loader
    served = next(v for v in docs[0]["spec"]["versions"] if v["name"] == version)
    return dict(served["schema"]["openAPIV3Schema"])


@cache
def validator(kind: str) -> jsonschema.protocols.Validator:
    """A validator for `kind` against its CRD's schema (checked once: `jsonschema.validate` re-checks every call)."""
    schema = crd_schema(kind)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the API server would prune (not in the structural schema): a typo there is silently lost."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if props is not None and key in props:
                found += unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += unknown_fields(value, extra, f"{path}.{key}")
            elif props is not None:
                found.append(f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def openapi_to_jsonschema(node: Any) -> Any:
    """Kubernetes' OpenAPI v3 flavour → JSON Schema; unknown fields rejected as `kubectl --validate=strict`."""
    if not isinstance(node, dict):
        return node
    out = {k: v for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out = {"anyOf": [{"type": "integer"}, {"type": "string"}], **{k: v for k, v in out.items() if k != "type"}}
    for bound, key in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if out.get(key) is True:
            out[key] = out.pop(bound)
        elif out.get(key) is False:
            del out[key]
    if "properties" in out:
        out["properties"] = {name: openapi_to_jsonschema(sub) for name, sub in out["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in out:
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = openapi_to_jsonschema(out[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            out[key] = [openapi_to_jsonschema(sub) for sub in out[key]]
    out.pop("nullable", None)
    return out
