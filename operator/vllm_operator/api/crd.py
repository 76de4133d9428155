"""Generate the VLLMService CustomResourceDefinition from the pydantic models in `v1alpha1`.

    python -m vllm_operator.api.crd                 # print the CRD
    python -m vllm_operator.api.crd --write crds/   # write crds/vllmservices.vllm-operator.dev.yaml
    python -m vllm_operator.api.crd --check crds/   # exit 1 with a diff when the committed file is stale

The JSON Schema pydantic produces is turned into a *structural* OpenAPI v3 schema, as the API server
requires (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/):

* `$ref`/`$defs` are inlined; `title` is dropped; `const` becomes a one-value `enum`; numeric
  `exclusiveMinimum: 0` becomes OpenAPI's `minimum: 0, exclusiveMinimum: true`.
* `anyOf: [X, null]` becomes `X`. The CRD does not say `nullable: true`: for a non-nullable field the API
  server prunes an explicit null before validation, so `count: null` means "unset", exactly as pydantic's
  `None` default does, and the CEL rules (which test `has(...)`) never see a null.
* `additionalProperties: false` (pydantic's `extra="forbid"`) is dropped: structural schemas prune unknown
  fields instead. `additionalProperties: true` becomes `x-kubernetes-preserve-unknown-fields: true`.
* `default` is dropped, because defaults live in the models (see `v1alpha1`), except on fields marked
  with `SERVER_SIDE_DEFAULT`.
* Anything else unexpected (a real union, an unknown keyword) raises, so a model change cannot silently
  produce a schema the API server would reject.

The output is deterministic: mapping keys are sorted; lists keep the models' field order.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from vllm_operator.api import v1alpha1
from vllm_operator.api.schema import SERVER_SIDE_DEFAULT
from vllm_operator.api.v1alpha1 import VLLMService

__all__ = [
    "CRD_FILENAME",
    "PRINTER_COLUMNS",
    "SchemaConversionError",
    "build_crd",
    "build_openapi_schema",
    "check_crds",
    "main",
    "render_crd",
    "to_structural",
    "write_crds",
]

CRD_FILENAME = f"{v1alpha1.CRD_NAME}.yaml"

HEADER = (
    "# Generated from operator/vllm_operator/api/v1alpha1.py by\n"
    "#   python -m vllm_operator.api.crd --write crds/\n"
    "# Do not edit: change the models and regenerate (tests/unit/test_crd.py fails when this file is stale).\n"
)

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
    {"name": "GPU", "type": "string", "jsonPath": ".status.gpu.product"},
    {"name": "TP", "type": "integer", "jsonPath": ".status.plan.flags.tensorParallelSize"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".status.gpu.nodes"},
    {"name": "MaxLen", "type": "integer", "jsonPath": ".status.plan.flags.maxModelLen"},
    {"name": "Status", "type": "string", "jsonPath": ".status.state"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {
        "name": "Reason",
        "type": "string",
        "priority": 1,
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
    },
    {
        "name": "Message",
        "type": "string",
        "priority": 1,
        "jsonPath": '.status.conditions[?(@.type=="Degraded")].message',
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# Keywords a structural schema may carry through unchanged.
_PASSTHROUGH = frozenset(
    {
        "type",
        "description",
        "enum",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-int-or-string",
        "x-kubernetes-validations",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
    }
)
_DROPPED = frozenset({"title", "$defs"})
_FORMATS = frozenset({"date-time", "date", "duration", "uri", "int32", "int64", "float", "double"})
_INT_OR_STRING_ANY_OF = [{"type": "integer"}, {"type": "string"}]


class SchemaConversionError(ValueError):
    """The models produced JSON Schema that has no structural OpenAPI v3 equivalent."""


def _resolve(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    """Inline a top-level `$ref`, letting the referring node's own keywords (description) win."""
    while "$ref" in node:
        ref = node["$ref"]
        prefix = "#/$defs/"
        if not isinstance(ref, str) or not ref.startswith(prefix) or ref[len(prefix) :] not in defs:
            raise SchemaConversionError(f"{path}: cannot resolve $ref {ref!r}")
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        node = {**defs[ref[len(prefix) :]], **siblings}
    return node


def _convert(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:  # noqa: C901 - a case per schema keyword
    node = _resolve(node, defs, path)

    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        branches = [b for b in node["anyOf"] if b != {"type": "null"}]
        if len(branches) != 1:
            raise SchemaConversionError(
                f"{path}: unions other than `X | None` are not structural: {node['anyOf']}"
            )
        outer = {k: v for k, v in node.items() if k != "anyOf"}
        node = {**_resolve(branches[0], defs, path), **outer}
        return _convert(node, defs, path)

    out: dict[str, Any] = {}
    keep_default = bool(node.get(SERVER_SIDE_DEFAULT))
    for key, value in node.items():
        if key in _DROPPED or key == SERVER_SIDE_DEFAULT:
            continue
        if key == "default":
            if keep_default:
                out["default"] = value
        elif key in _PASSTHROUGH:
            out[key] = value
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            if isinstance(value, bool):
                out[key] = value
            else:
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
        elif key == "format":
            if value in _FORMATS:
                out["format"] = value
        elif key == "anyOf":
            if value != _INT_OR_STRING_ANY_OF:
                raise SchemaConversionError(
                    f"{path}: int-or-string must be anyOf integer, string; got {value}"
                )
            out["anyOf"] = value
        elif key == "properties":
            out["properties"] = {name: _convert(sub, defs, f"{path}.{name}") for name, sub in value.items()}
        elif key == "items":
            out["items"] = _convert(value, defs, f"{path}[]")
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out["additionalProperties"] = _convert(value, defs, f"{path}.*")
            # False: pydantic's extra="forbid"; the API server prunes unknown fields instead.
        elif key == "required":
            if value:
                out["required"] = list(value)
        else:
            raise SchemaConversionError(f"{path}: unsupported JSON Schema keyword {key!r}")

    if "type" not in out and not (
        out.get("x-kubernetes-preserve-unknown-fields") or out.get("x-kubernetes-int-or-string")
    ):
        raise SchemaConversionError(f"{path}: every node of a structural schema needs a type")
    if "properties" in out and "additionalProperties" in out:
        raise SchemaConversionError(f"{path}: properties and additionalProperties are mutually exclusive")
    return out


def to_structural(schema: dict[str, Any]) -> dict[str, Any]:
    """Convert a pydantic JSON Schema (with `$defs`) to a structural OpenAPI v3 schema."""
    return _convert(schema, schema.get("$defs", {}), "")


def build_openapi_schema() -> dict[str, Any]:
    """The `openAPIV3Schema` of the CRD's only version."""
    schema = to_structural(VLLMService.model_json_schema(mode="validation", by_alias=True))
    properties = schema["properties"]
    properties["apiVersion"] = {
        "type": "string",
        "description": "APIVersion defines the versioned schema of this representation of an object.",
    }
    properties["kind"] = {
        "type": "string",
        "description": "Kind is a string value representing the REST resource this object represents.",
    }
    # The API server owns metadata's schema; a CRD may only say it is an object.
    properties["metadata"] = {"type": "object"}
    schema["required"] = ["spec"]
    return schema


def build_crd() -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of VLLMService."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": v1alpha1.CRD_NAME},
        "spec": {
            "group": v1alpha1.GROUP,
            "names": {
                "kind": v1alpha1.KIND,
                "listKind": f"{v1alpha1.KIND}List",
                "plural": v1alpha1.PLURAL,
                "singular": v1alpha1.SINGULAR,
                "shortNames": list(v1alpha1.SHORT_NAMES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": v1alpha1.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": build_openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def render_crd() -> str:
    """The CRD as the YAML text committed under crds/."""
    body: str = yaml.safe_dump(
        build_crd(), sort_keys=True, default_flow_style=False, width=100, allow_unicode=False
    )
    return HEADER + body


def write_crds(directory: Path | str) -> Path:
    """Write the CRD into `directory`; returns the file written."""
    target = Path(directory) / CRD_FILENAME
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_crd(), encoding="utf-8")
    return target


def check_crds(directory: Path | str) -> list[str]:
    """Unified diff from the committed CRD in `directory` to the generated one; empty when up to date."""
    target = Path(directory) / CRD_FILENAME
    expected = render_crd()
    actual = target.read_text(encoding="utf-8") if target.exists() else ""
    if actual == expected:
        return []
    return list(
        difflib.unified_diff(
            actual.splitlines(),
            expected.splitlines(),
            fromfile=f"{target} (committed)",
            tofile=f"{target} (generated)",
            lineterm="",
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_operator.api.crd", description="Generate the VLLMService CRD from the models."
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="DIR", help=f"write DIR/{CRD_FILENAME}")
    group.add_argument("--check", metavar="DIR", help=f"exit 1 when DIR/{CRD_FILENAME} is stale")
    args = parser.parse_args(argv)

    if args.write:
        print(f"wrote {write_crds(args.write)}")
        return 0
    if args.check:
        diff = check_crds(args.check)
        if not diff:
            print(f"{Path(args.check) / CRD_FILENAME} is up to date")
            return 0
        changed = sum(1 for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---"))
        shown = 60
        print(f"{Path(args.check) / CRD_FILENAME} is stale ({changed} lines differ); diff:", file=sys.stderr)
        for line in diff[:shown]:
            print(line, file=sys.stderr)
        if len(diff) > shown:
            print(f"... {len(diff) - shown} more diff lines", file=sys.stderr)
        print(f"regenerate with: python -m vllm_operator.api.crd --write {args.check}", file=sys.stderr)
        return 1
    sys.stdout.write(render_crd())
    return 0


if __name__ == "__main__":
    sys.exit(main())
