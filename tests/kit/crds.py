"""The upstream CustomResourceDefinitions of tests/data/crds (LeaderWorkerSet, KEDA ScaledObject, InferencePool):
their schemas, and what an API server serving them would do with an object — refuse it (`jsonschema`) or silently
prune a field the schema lacks (`unknown_fields`)."""

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
    docs = [d for d in yaml.safe_load_all((CRDS / file).read_text()) if d]
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
