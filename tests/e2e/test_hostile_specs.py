"""End to end (issue 10): hostile and odd VLLMServices against the real `vllm-operator run` process.

The emulated API server does no schema validation, so every payload reaches the operator as a tenant could get it
past a lax admission: injection payloads in every string field, services named `017`, `yes` and a 63-character
name, `dev/zero` as a model, a 100,000-layer inline config. Each must end as a condition (or a literal value in a
valid child), never as structure; the operator's memory stays bounded and a valid service created next to them
still gets its plan promptly.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from vllm_operator_sim.emulator import EmulatedAPIServer

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "vllmservices.vllm-operator.dev.yaml"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OperatorProcess = Any  # conftest.OperatorProcess

PAYLOADS = [
    "x\n          securityContext: {privileged: true, capabilities: {add: [SYS_ADMIN]}}",
    "x\n      hostPID: true\n      hostNetwork: true",
    "x}: {privileged: true",
]
# Every string field of the spec (and a few structured ones) that a payload goes into.
STRING_FIELDS: list[tuple[str, ...]] = [
    ("image",), ("model", "name"), ("model", "revision"), ("model", "servedName"), ("gpu", "product"),
    ("modelCache", "claimName"), ("modelCache", "mountPath"), ("modelCache", "storageClassName"),
    ("resources", "memory"), ("resources", "cpu"), ("resources", "shmSize"), ("hfTokenSecretRef", "name"),
    ("hfTokenSecretRef", "key"), ("nodeSelector", "pool"), ("tolerations", "0", "key"), ("env", "0", "value"),
    ("env", "0", "name"), ("extraArgs", "0"), ("imagePullPolicy",), ("service", "type"),
    ("model", "configMapRef", "name"), ("model", "configMapRef", "configKey"), ("tolerations", "0", "value"),
    ("security", "profile"), ("workload", "profile"),
]
BASE_SPEC: dict[str, Any] = {
    "model": {"name": MODEL}, "modelCache": {"claimName": "models"}, "resources": {},
    "hfTokenSecretRef": {"name": "hf"}, "nodeSelector": {}, "tolerations": [{"key": "k", "operator": "Exists"}],
    "env": [{"name": "A", "value": "1"}], "extraArgs": ["--disable-log-requests"], "service": {},
}


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE_SPEC)
    node: Any = spec
    for part in path[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(path[-1])] = value
    else:
        node[path[-1]] = value
    if path == ("modelCache", "storageClassName"):
        spec["modelCache"] = {"size": "10Gi", "storageClassName": value}
    return spec


def _service(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for condition in ((obj or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_:
            return dict(condition)
    return None


def _hostile_specs() -> dict[str, dict[str, Any]]:
    """An injection payload in every string field, local-file model names, and four 100k-layer inline configs."""
    hostile: dict[str, dict[str, Any]] = {}
    for index, path in enumerate(STRING_FIELDS):
        hostile[f"inject-{index}"] = _with(path, PAYLOADS[index % len(PAYLOADS)])
    hostile["dev-zero"] = {"model": {"name": "dev/zero"}}
    hostile["etc-passwd"] = {"model": {"name": "etc/passwd"}}
    config = {"model_type": "llama", "num_hidden_layers": 100_000, "hidden_size": 4096, "num_attention_heads": 32,
              "num_key_value_heads": 8, "vocab_size": 32000, "intermediate_size": 14336,
              "max_position_embeddings": 8192}
    for copy_index in range(4):  # two within the size bound (refused by the layer bound), two far over it
        extra = {"layer_types": ["full_attention"] * 100_000} if copy_index >= 2 else {}
        hostile[f"layers-{copy_index}"] = {"model": {"name": "org/huge", "config": {**config, **extra}}}
    return hostile


def _answer_is_literal_or_refusal(cluster: EmulatedAPIServer, name: str, planned: bool) -> bool:
    """A hostile service is either refused (InvalidSpec/ModelNotFound naming a spec field) or deployed with its
    payload as a literal value, verbatim; True when it was deployed."""
    degraded = _condition(cluster.get_object("vllmservices", name), "Degraded")
    if degraded is not None and degraded["status"] == "True":
        assert degraded["reason"] in ("InvalidSpec", "ModelNotFound"), (name, degraded)
        if degraded["reason"] == "InvalidSpec":
            assert "spec." in degraded["message"], degraded
    if not (name.startswith("inject-") and planned):
        return False
    payload = PAYLOADS[int(name.split("-")[1]) % len(PAYLOADS)]
    deployment = cluster.wait_for(lambda: cluster.get_object("deployments", name), timeout=30,
                                  interval=0.2, message=f"no Deployment for {name}")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert payload in container["args"] or payload in [e.get("value") for e in container["env"]], name
    return True


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the operator's RSS from /proc")
def test_hostile_services_get_answers_and_never_structure(
        cluster: EmulatedAPIServer, operator_process: Callable[[], OperatorProcess]) -> None:
    cluster.create_object("customresourcedefinitions", yaml.safe_load(CRD_PATH.read_text()))
    op = operator_process()
    hostile = _hostile_specs()
    odd_names = ["017", "yes", "n" * 63]
    for name, spec in hostile.items():
        cluster.create_object("vllmservices", _service(name, spec))
    for name in odd_names:
        cluster.create_object("vllmservices", _service(name, {"model": {"name": MODEL}}))
    started = time.monotonic()
    cluster.create_object("vllmservices", _service("valid", {"model": {"name": MODEL}}))

    def planned(name: str) -> bool:
        condition = _condition(cluster.get_object("vllmservices", name), "PlanFeasible")
        return bool(condition and condition["status"] == "True")
    cluster.wait_for(lambda: planned("valid"), timeout=60, interval=0.2,
                     message=f"the valid service got no plan next to the hostile ones:\n{op.log()[-4000:]}")
    latency = time.monotonic() - started

    def answered() -> list[str]:
        missing = [n for n in [*hostile, *odd_names]
                   if _condition(cluster.get_object("vllmservices", n), "Degraded") is None
                   and not planned(n)]
        return [] if missing else ["all"]
    try:
        cluster.wait_for(answered, timeout=90, interval=0.5)
    except TimeoutError:
        missing = [n for n in [*hostile, *odd_names] if _condition(cluster.get_object("vllmservices", n),
                                                                   "Degraded") is None and not planned(n)]
        raise AssertionError(f"no status condition for {missing}:\n{op.log()[-6000:]}") from None

    deployed_payloads = sum(_answer_is_literal_or_refusal(cluster, name, planned(name)) for name in hostile)
    for name in ("layers-0", "layers-1"):
        degraded = _condition(cluster.get_object("vllmservices", name), "Degraded")
        assert degraded and degraded["reason"] == "InvalidSpec" and "100000" in degraded["message"], degraded
    for name in ("layers-2", "layers-3"):
        degraded = _condition(cluster.get_object("vllmservices", name), "Degraded")
        assert degraded and degraded["reason"] == "InvalidSpec" and "256 KiB" in degraded["message"], degraded
    for name in ("dev-zero", "etc-passwd"):
        degraded = _condition(cluster.get_object("vllmservices", name), "Degraded")
        assert degraded and degraded["reason"] == "ModelNotFound", degraded
        assert "passwd" not in degraded["message"] or "root:" not in degraded["message"]

    # Odd names: children exist under valid names, owned by the service, labelled with it.
    for name in odd_names:
        cluster.wait_for(lambda name=name: planned(name), timeout=30, interval=0.2,
                         message=f"{name} was not planned:\n{op.log()[-4000:]}")
    deployments = cluster.wait_for(lambda: [d for d in cluster.list_objects("deployments", "default")
                                            if d["metadata"]["labels"].get("vllm-operator.dev/service")
                                            in [*odd_names, "valid"]], timeout=30, interval=0.2)
    services = cluster.list_objects("services", "default")
    service_names = {s["metadata"]["name"] for s in services}
    assert any(n.startswith("v017-") for n in service_names) and "yes" in service_names
    assert "n" * 63 in service_names

    # Every child the operator wrote is a valid Kubernetes object with a least-privilege pod; payloads are literals.
    for child in [*cluster.list_objects("deployments"), *services,
                  *cluster.list_objects("persistentvolumeclaims")]:
        clean = copy.deepcopy(child)
        clean["metadata"] = {k: v for k, v in clean["metadata"].items()
                             if k in ("name", "namespace", "labels", "annotations", "ownerReferences")}
        clean.pop("status", None)
        kubernetes_validate.validate(clean, "1.33", strict=True)
        if child["kind"] == "Deployment":
            pod = child["spec"]["template"]["spec"]
            assert not {"hostPID", "hostNetwork", "hostIPC"} & set(pod)
            assert pod["automountServiceAccountToken"] is False
            assert pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
            assert pod["containers"][0]["securityContext"].get("privileged") is False
    assert len(deployments) >= 4
    assert deployed_payloads >= 2  # env value and extraArgs take any string: they ran as literals

    rss = _rss_mib(op.process.pid)
    print(f"valid service planned after {latency:.1f} s next to {len(hostile)} hostile ones; operator RSS {rss:.0f} MiB")
    assert latency < 45, latency
    assert rss < 400, f"operator RSS {rss:.0f} MiB"
    assert op.process.poll() is None
    assert os.environ.get("HF_HUB_OFFLINE", "1")  # the fixture runs the operator offline: no hub in tests
