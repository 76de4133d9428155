"""Objects the API server stores but the spec refuses (issue 20), through the operator's kopf registry in-process
against the emulated API: each one becomes that service's InvalidSpec condition naming the field — never an
AttributeError in the shell, an InternalError, or a stopped operator — and a valid service next to them is served."""

from __future__ import annotations

from typing import Any

from kit.inprocess import Cluster, condition

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    # `gpu: "L4"` raised AttributeError in the shell (service.py read spec.gpu.maxNodes of a string)
    "gpu-string": ({"model": {"name": QWEN}, "gpu": "L4"}, "spec.gpu"),
    "remediation-string": ({"model": {"name": QWEN}, "remediation": "on"}, "spec.remediation"),
    # deeper than any real spec (500–999 levels, which the emulator cannot copy, are in tests/unit/test_hardening.py)
    "deep-config": ({"model": {"name": QWEN, "config": deep(40)}}, "spec.model.config"),
    "deep-value-from": ({"model": {"name": QWEN},
                         "env": [{"name": "X", "valueFrom": {"secretKeyRef": deep(40)}}]}, "spec.env[0].valueFrom.secretKeyRef"),
    # quantities the CRD's pattern admits but no int64 holds
    "huge-memory": ({"model": {"name": QWEN}, "resources": {"memory": "1e400"}}, "spec.resources.memory"),
    "huge-shm": ({"model": {"name": QWEN}, "resources": {"shmSize": "99999999999999999999Ei"}},
                 "spec.resources.shmSize"),
    # a spec larger than the operator keeps (kopf's diff base + etcd's object limit)
    "huge-spec": ({"model": {"name": QWEN}, "extraArgs": ["--x=" + "y" * 4090] * 140}, "spec.extraArgs"),
}


def test_hostile_objects_get_invalid_spec_naming_the_field(cluster: Cluster) -> None:
    cluster.start_operator()
    for name, (spec, _) in HOSTILE.items():
        cluster.create_unadmitted(name, spec)
    cluster.create_service("fine", {"model": {"name": QWEN}})
    cluster.wait_deployment("fine")
    for name, (_, field) in HOSTILE.items():
        def answered(name: str = name) -> dict[str, Any] | None:
            found = condition(cluster.service(name), "Degraded")
            return found if found and found.get("reason") not in (None, "AsExpected") else None

        degraded = cluster.wait_for(answered, message=f"{name}: Degraded")
        assert degraded["reason"] == "InvalidSpec", (name, degraded)
        assert field in degraded["message"], (name, degraded["message"][:300])
        assert cluster.deployment(name) is None
    log = cluster.operator_log(last=400)
    # kopf's own bookkeeping patch of an object the schema refuses is the API server's 422 to kopf, not ours
    assert "AttributeError" not in log and "RecursionError" not in log and "OverflowError" not in log


def test_a_spec_too_large_for_an_annotation_keeps_its_diff_base_in_status(cluster: Cluster) -> None:
    """80 × 4 kB values are within the CRD's bounds, but kopf's diff base (the spec again) no longer fits the
    256 KiB the API server allows all annotations together: the PATCH was refused and kopf stopped handling the
    service. The diff base goes to status instead, and a later spec change is handled as an update."""
    cluster.start_operator()
    env = [{"name": f"X{i}", "value": "y" * 32000} for i in range(10)]  # 320 kB
    cluster.create_service("large", {"model": {"name": QWEN}, "env": env})
    cluster.wait_deployment("large")

    def kept() -> dict[str, Any] | None:
        obj = cluster.service("large")
        return obj if ((obj.get("status") or {}).get("kopf") or {}).get("lastHandledConfiguration") else None

    obj = cluster.wait_for(kept, message="the diff base kept in status")
    assert not any("last-handled-configuration" in key for key in obj["metadata"].get("annotations") or {})
    cluster.patch_spec("large", {"env": [*env[:9], {"name": "X9", "value": "z"}]})
    deployment = cluster.wait_deployment("large", lambda d: any(
        e.get("value") == "z" for c in d["spec"]["template"]["spec"]["containers"] for e in c.get("env") or []))
    assert deployment is not None
    assert "Too long" not in cluster.operator_log(last=400)
    # back under the bound: the diff base returns to its annotation, and leaves status
    cluster.patch_spec("large", {"env": [{"name": "X0", "value": "small"}]})

    def annotated() -> dict[str, Any] | None:
        found = cluster.service("large")
        in_annotation = any("last-handled-configuration" in k for k in found["metadata"].get("annotations") or {})
        in_status = ((found.get("status") or {}).get("kopf") or {}).get("lastHandledConfiguration")
        return found if in_annotation and not in_status else None

    cluster.wait_for(annotated, message="the diff base back in its annotation")
