"""End to end: the real `vllm-operator run` process against the emulated API server, driven with kubectl as a
user would: apply the CRD and an example, get, wait, patch, delete; plus the liveness and metrics endpoints."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from kit.api import CRD_PATH, EXAMPLES
from kit.kubectl import Kubectl
from kit.process import OperatorProcess
from vllm_operator_sim.emulator import EmulatedAPIServer

pytestmark = pytest.mark.e2e

MINIMAL = EXAMPLES / "minimal.yaml"


def _args(deployment: dict[str, Any]) -> list[str]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return list(next(c for c in containers if c["name"] == "vllm")["args"])


def _value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_kubectl_drives_the_real_operator_process(cluster: EmulatedAPIServer, kubectl: Kubectl,
                                                  operator_process: Callable[[], OperatorProcess]) -> None:
    name = yaml.safe_load(MINIMAL.read_text())["metadata"]["name"]
    assert "created" in kubectl("apply", "-f", str(CRD_PATH))
    kubectl("wait", "--for=condition=established", "crd/vllmservices.vllm-operator.dev", "--timeout=10s")
    op = operator_process()

    assert "created" in kubectl("apply", "-f", str(MINIMAL))
    kubectl("wait", f"vllmservice/{name}", "--for=jsonpath={.status.conditions[?(@.type==\"PlanFeasible\")]"
            ".status}=True", "--timeout=20s")
    table = kubectl("get", "vllms")
    assert name in table and "NVIDIA-L4" in table and "MODEL" in table, table

    def poll(predicate: Callable[[], Any], message: str) -> Any:  # re-checked on every API change
        return cluster.wait_for(predicate, timeout=20, interval=0.2, message=message)

    def deployment() -> dict[str, Any] | None:
        out = kubectl("get", "deployment", name, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None
    created = poll(deployment, message="kubectl get deployment shows the Deployment")
    status = kubectl.json("get", "vllmservice", name)["status"]
    args = _args(created)
    assert " ".join(status["plan"]["args"]) in " ".join(args)
    assert kubectl.json("get", "service", name)["spec"]["ports"][0]["port"] == 8000

    assert "patched" in kubectl("patch", "vllmservice", name, "--type=merge",
                                "-p", '{"spec":{"flags":{"maxModelLen":4096}}}')
    patched = poll(lambda: (d := deployment()) and _value(_args(d), "--max-model-len") == "4096" and d,
                   message="the patched maxModelLen reaches the Deployment")
    assert patched["metadata"]["generation"] > created["metadata"]["generation"]
    kubectl("wait", f"vllmservice/{name}", "--for=jsonpath={.status.observedGeneration}=2", "--timeout=20s")

    code, body = op.liveness()
    assert code == 200, body
    code, metrics = op.metrics()
    assert code == 200 and "vllm_operator_reconciles_total" in metrics
    assert 'vllm_operator_reconciles_total{outcome="ok"}' in metrics

    assert "deleted" in kubectl("delete", "--wait=false", "-f", str(MINIMAL))
    poll(lambda: cluster.get_object("vllmservices", name) is None, message="the operator releases its finalizer")
    poll(lambda: not kubectl("get", "deployment,service", "-l", f"app.kubernetes.io/instance={name}",
                             "-o", "name").strip(), message="the children are garbage-collected")
    assert op.process.poll() is None, "the operator is still running"


def test_operator_process_reports_an_infeasible_example(cluster: EmulatedAPIServer, kubectl: Kubectl,
                                                        operator_process: Callable[[], OperatorProcess]) -> None:
    example = EXAMPLES / "llama3-70b-24gb-infeasible.yaml"
    name = yaml.safe_load(example.read_text())["metadata"]["name"]
    kubectl("apply", "-f", str(CRD_PATH))
    operator_process()
    kubectl("apply", "-f", str(example))
    kubectl("wait", f"vllmservice/{name}", "--for=jsonpath={.status.conditions[?(@.type==\"PlanFeasible\")]"
            ".reason}=PlanInfeasible", "--timeout=20s")
    status = kubectl.json("get", "vllmservice", name)["status"]
    assert status["plan"]["fits"] is False and status["plan"]["options"]
    events = cluster.wait_for(lambda: [e for e in kubectl.json("get", "events")["items"]
                           if e["reason"] == "PlanInfeasible" and e["involvedObject"]["name"] == name],
                              timeout=20, interval=0.2, message="a PlanInfeasible event")
    assert events[0]["type"] == "Warning"
    assert not kubectl("get", "deployment", name, "--ignore-not-found").strip()
