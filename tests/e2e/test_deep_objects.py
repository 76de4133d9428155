"""End to end (issue 20): a VLLMService nested deeper than Python's recursion limit against the real
`vllm-operator run` process.

The API server stores objects up to 10,000 levels deep; Python's json raises RecursionError at about 1,000, and kopf
decoded every watch event with it: a 1,500-level `spec.model.config` (7.5 kB) made the watch raise and the operator
exit, and exit again on every restart. Here the emulated API server (this test process, with its recursion limit
raised as a Go server needs none) stores and streams such an object: the operator process stays up, the object gets
InvalidSpec naming `spec.model.config`, and a valid service created after it is planned.

Today's CRD types `spec.model.config` (the API server prunes what the planner does not read, so no new object is
deep there); an object stored under an earlier release's CRD, where the field was free-form, stays as it was stored
until it is written again. The test installs that earlier schema for the field, so the deep object is stored as it
would have been.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from kit.api import CRD_PATH
from kit.inprocess import condition
from kit.process import OperatorProcess
from vllm_operator_sim.emulator import APIError, EmulatedAPIServer

pytestmark = pytest.mark.e2e

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
LEVELS = 1500


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def _service(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


@contextlib.contextmanager
def _deep_stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The emulated API server copies and encodes objects recursively: let it, as a real one would (its CEL library
    lowers the limit to 2,500 whenever it builds an environment: not below ours while the test runs)."""
    before = sys.getrecursionlimit()
    floor = 20 * LEVELS
    setlimit = sys.setrecursionlimit
    setlimit(max(before, floor))
    monkeypatch.setattr(sys, "setrecursionlimit", lambda limit: setlimit(max(limit, floor)))
    try:
        yield
    finally:
        monkeypatch.undo()
        setlimit(before)


def _earlier_crd() -> dict[str, Any]:
    """The CRD as an earlier release had it: `spec.model.config` free-form (preserve-unknown-fields)."""
    crd = yaml.safe_load(CRD_PATH.read_text())
    [version] = crd["spec"]["versions"]
    model = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["model"]
    model["properties"]["config"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return crd


def test_todays_crd_refuses_a_deep_config_as_kubectl_applies_it(cluster: EmulatedAPIServer,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # kubectl's default strict field validation: the key the typed config does not know is refused, so no object
    # of today's CRD stores a deep config (with --validate=warn the API server prunes it instead)
    cluster.create_object("customresourcedefinitions", yaml.safe_load(CRD_PATH.read_text()))
    with _deep_stack(monkeypatch), pytest.raises(APIError, match=r'unknown field "spec\.model\.config\.a"'):
        cluster.create_object("vllmservices", _service("deep", {"model": {"name": MODEL, "config": _deep(LEVELS)}}),
                              manager="kubectl")
    assert cluster.get_object("vllmservices", "deep") is None


def test_a_deep_object_is_its_own_problem_not_the_operators(
        cluster: EmulatedAPIServer, operator_process: Callable[[], OperatorProcess],
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster.create_object("customresourcedefinitions", _earlier_crd())
    with _deep_stack(monkeypatch):
        cluster.create_object("vllmservices", _service("deep", {"model": {"name": MODEL, "config": _deep(LEVELS)}}))
        op = operator_process()  # lists the deep object first, as after a restart
        cluster.create_object("vllmservices", _service("valid", {"model": {"name": MODEL}}))
        try:
            def planned() -> bool:
                feasible = condition(cluster.get_object("vllmservices", "valid"), "PlanFeasible")
                return bool(feasible and feasible["status"] == "True")

            cluster.wait_for(planned, timeout=60, interval=0.2,
                             message=f"the valid service got no plan next to the deep one:\n{op.log()[-4000:]}")

            def answered() -> dict[str, Any] | None:
                return condition(cluster.get_object("vllmservices", "deep"), "Degraded")

            degraded = cluster.wait_for(answered, timeout=60, interval=0.2,
                                        message=f"no answer for the deep service:\n{op.log()[-4000:]}")
            assert degraded["reason"] == "InvalidSpec", degraded
            assert "spec.model.config" in degraded["message"], degraded["message"]
            assert op.process.poll() is None, f"the operator exited:\n{op.log()[-4000:]}"
            assert "RecursionError" not in op.log()
        finally:
            cluster.delete_object("vllmservices", "deep", "default")
