"""Issue 20's bounds, at the unit level: every input the API server can store gets InvalidSpec naming its field —
never a RecursionError, an overflow or an infinity — and the API server's JSON is decoded whatever its depth."""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from typing import Any

import pytest

from vllm_operator.api.v1alpha1 import MAX_SPEC_BYTES, MAX_SPEC_DEPTH, validate_spec
from vllm_operator.handlers import decode
from vllm_operator.quantity import quantity_gib, quantity_value

MODEL = {"name": "Qwen/Qwen2.5-0.5B-Instruct"}


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize("levels", [MAX_SPEC_DEPTH + 1, 500, 999, 1500, 5000])
@pytest.mark.parametrize(("where", "field"), [
    (lambda d: {"model": {**MODEL, "config": d}}, "spec.model.config"),
    (lambda d: {"model": {**MODEL, "safetensorsIndex": d}}, "spec.model.safetensorsIndex"),
    (lambda d: {"model": MODEL, "env": [{"name": "X", "valueFrom": {"secretKeyRef": d}}]}, "spec.env[0].valueFrom.secretKeyRef"),
    (lambda d: {"model": MODEL, "affinity": d}, "spec.affinity"),
])
def test_deep_values_are_invalid_specs_naming_the_field(levels: int, where: Any, field: str) -> None:
    """500–999 levels were a RecursionError in `_plain` (InternalError: "a bug in the operator")."""
    errors = validate_spec(where(deep(levels)))
    assert [e.field for e in errors] == [field], errors
    assert "deeper" in errors[0].message


def test_value_from_is_typed_so_the_crd_bounds_it() -> None:
    ok = {"model": MODEL, "env": [
        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token", "optional": True}}},
        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
        {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name", "apiVersion": "v1"}}},
        {"name": "D", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}}]}
    assert validate_spec(ok) == []
    bad = {"model": MODEL, "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k",
                                                                               "blob": {"x": 1}}}}]}
    assert [e.field for e in validate_spec(bad)] == ["spec.env[0].valueFrom.secretKeyRef.blob"]


def test_a_spec_over_the_size_bound_names_its_largest_field() -> None:
    spec = {"model": MODEL, "extraArgs": ["--x=" + "y" * 4090] * (MAX_SPEC_BYTES // 4096 + 8)}
    errors = validate_spec(spec)
    assert [e.field for e in errors] == ["spec.extraArgs"], errors
    assert "KiB" in errors[0].message


@pytest.mark.parametrize("text", ["1e400", "99999999999999999999Ei", "9223372036854775808", "1e19", "9Ei",
                                  "1e2.5", "1e9999999"])
@pytest.mark.parametrize("field", ["memory", "cpu", "shmSize"])
def test_quantities_no_int64_holds_are_invalid(text: str, field: str) -> None:
    """They passed the CRD's pattern and reached the Deployment and the remediation arithmetic (overflow)."""
    errors = validate_spec({"model": MODEL, "resources": {field: text}})
    assert [e.field for e in errors] == [f"spec.resources.{field}"], errors
    assert quantity_gib(text) is None


@pytest.mark.parametrize(("text", "value"), [
    ("64Gi", Decimal(64 * 2**30)), ("500m", Decimal("0.5")), ("1e3", Decimal(1000)), ("8", Decimal(8)),
    ("1.5Ki", Decimal(1536)), ("7Ei", Decimal(7 * 2**60)), ("1E", Decimal(10**18)), (".5", Decimal("0.5")),
])
def test_quantities_read_exactly(text: str, value: Decimal) -> None:
    assert quantity_value(text) == value
    assert validate_spec({"model": MODEL, "resources": {"memory": text}}) == []


def test_the_decoder_cuts_what_json_cannot_nest_and_keeps_the_rest() -> None:
    normal = {"a": [1, {"b": "}}]]{["}], "c": "\\\"", "d": deep(30)}
    assert decode.loads(json.dumps(normal)) == normal
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    try:
        text = json.dumps({"type": "ADDED", "object": {"spec": {"model": {"config": deep(5000)}}, "tail": [1, "]"]}})
    finally:
        sys.setrecursionlimit(before)
    with pytest.raises(RecursionError):
        json.loads(text)
    event = decode.loads(text)
    node, levels = event["object"]["spec"]["model"]["config"], 4
    while isinstance(node, dict):
        node, levels = node["a"], levels + 1
    assert node == decode.CUT and levels == decode.MAX_DEPTH
    assert event["object"]["tail"] == [1, "]"]
    # the cut value fails the spec's own bound, naming the field
    assert [e.field for e in validate_spec(event["object"])] == ["spec.model.config"]
