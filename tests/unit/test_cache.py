"""The default model cache (render/cache.py) and how the reconcile core uses it: weights downloaded once."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.render.cache import (
    EPHEMERAL,
    MODEL_CACHE,
    PERSISTENT,
    CacheSettings,
    default_size,
    shared_claim_name,
    startup_failure_threshold,
)
from vllm_operator.sources import load_model_files

QWEN = "Qwen/Qwen2.5-7B-Instruct"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}


def run(spec: dict[str, Any], *, name: str = "svc", storage_class: str | None = "standard",
        settings: CacheSettings | None = None, namespace: str = "ns") -> reconcile.Desired:
    return reconcile.desired_state(reconcile.Observed(
        name=name, namespace=namespace, uid=f"uid-{name}", generation=1, spec=spec, status={},
        now=datetime(2025, 1, 1, tzinfo=UTC), nodes=(H100,), model_files=load_model_files(spec["model"]["name"],
                                                                                           offline=True),
        cache_settings=settings or CacheSettings(), default_storage_class=storage_class))


def kinds(desired: reconcile.Desired) -> dict[str, dict[str, Any]]:
    assert desired.children is not None
    return {c["kind"]: c for c in desired.children}


def cache_volume(desired: reconcile.Desired) -> dict[str, Any]:
    pod = kinds(desired)["Deployment"]["spec"]["template"]["spec"]
    return next(v for v in pod["volumes"] if v["name"] == "model-cache")


def cache_condition(desired: reconcile.Desired) -> tuple[str, str, str]:
    found = cond.find_condition(desired.status.conditions, MODEL_CACHE)
    assert found is not None
    return found.status, found.reason, found.message


def test_default_storage_class_gives_a_claim_per_single_pod_service() -> None:
    desired = run({"model": {"name": QWEN}})
    claim = kinds(desired)["PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "svc-model-cache"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "storageClassName" not in claim["spec"]  # the cluster's default class binds it
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-svc"
    assert cache_volume(desired) == {"name": "model-cache", "persistentVolumeClaim": {"claimName": "svc-model-cache"}}
    status, reason, message = cache_condition(desired)
    assert (status, reason) == (cond.TRUE, PERSISTENT) and "do not download them again" in message
    # ReadWriteOnce: one node mounts the volume, so the Deployment rolls without a surge pod
    strategy = kinds(desired)["Deployment"]["spec"]["strategy"]["rollingUpdate"]
    assert strategy == {"maxSurge": 0, "maxUnavailable": 1}


def test_claim_size_follows_the_checkpoint() -> None:
    desired = run({"model": {"name": QWEN}})
    claim = kinds(desired)["PersistentVolumeClaim"]
    assert desired.plan is not None
    # Qwen2.5-7B: 15.2 GB of bf16 weights -> ceil(14.2 GiB x 1.5 + 10) GiB
    assert claim["spec"]["resources"]["requests"]["storage"] == "32Gi"
    assert default_size(14.19) == "32Gi" and default_size(0.0) == "10Gi"


def test_no_default_storage_class_is_ephemeral_and_says_so() -> None:
    desired = run({"model": {"name": QWEN}}, storage_class=None)
    assert "PersistentVolumeClaim" not in kinds(desired)
    assert cache_volume(desired) == {"name": "model-cache", "emptyDir": {}}
    status, reason, message = cache_condition(desired)
    assert (status, reason) == (cond.FALSE, EPHEMERAL)
    assert "no default StorageClass" in message and "spec.modelCache" in message
    assert kinds(desired)["Deployment"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_operator_setting_chooses_the_default() -> None:
    ephemeral = run({"model": {"name": QWEN}}, settings=CacheSettings(mode="ephemeral"))
    assert cache_condition(ephemeral)[:2] == (cond.FALSE, EPHEMERAL)
    forced = run({"model": {"name": QWEN}}, storage_class=None,
                 settings=CacheSettings(mode="persistent", storage_class="fast", size="500Gi"))
    claim = kinds(forced)["PersistentVolumeClaim"]
    assert claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["resources"]["requests"]["storage"] == "500Gi"


def test_several_pods_need_a_shared_claim() -> None:
    desired = run({"model": {"name": QWEN}, "replicas": 2})
    status, reason, message = cache_condition(desired)
    assert (status, reason) == (cond.FALSE, EPHEMERAL) and "ReadWriteMany" in message
    assert "PersistentVolumeClaim" not in kinds(desired)


def test_read_write_many_claim_is_shared_by_the_services_of_a_model() -> None:
    rwx = CacheSettings(access_mode="ReadWriteMany")
    a = run({"model": {"name": QWEN}, "replicas": 3}, name="a", settings=rwx)
    b = run({"model": {"name": QWEN}}, name="b", settings=rwx)
    other_ns = run({"model": {"name": QWEN}}, name="a", settings=rwx, namespace="elsewhere")
    revision = run({"model": {"name": QWEN, "revision": "v2"}}, name="c", settings=rwx)
    claim_a, claim_b = kinds(a)["PersistentVolumeClaim"], kinds(b)["PersistentVolumeClaim"]
    assert claim_a == claim_b  # the same object: whichever service applies it first creates it
    assert claim_a["metadata"]["name"] == shared_claim_name(QWEN, None)
    assert claim_a["metadata"]["name"].startswith("model-cache-qwen-qwen2-5-7b-instruct-")
    assert "ownerReferences" not in claim_a["metadata"]  # a cache outlives the services that use it
    assert claim_a["spec"]["accessModes"] == ["ReadWriteMany"]
    assert kinds(other_ns)["PersistentVolumeClaim"]["metadata"]["namespace"] == "elsewhere"
    assert kinds(revision)["PersistentVolumeClaim"]["metadata"]["name"] != claim_a["metadata"]["name"]
    assert kinds(a)["Deployment"]["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 1
    assert cache_condition(a)[:2] == (cond.TRUE, PERSISTENT)


@pytest.mark.parametrize("cache", [{"claimName": "mine"}, {"size": "300Gi", "storageClassName": "fast"}])
def test_spec_model_cache_overrides_the_default(cache: dict[str, Any]) -> None:
    desired = run({"model": {"name": QWEN}, "modelCache": cache}, storage_class=None,
                  settings=CacheSettings(mode="ephemeral"))
    volume = cache_volume(desired)
    assert cache_condition(desired)[:2] == (cond.TRUE, PERSISTENT)
    if "claimName" in cache:
        assert volume["persistentVolumeClaim"] == {"claimName": "mine"}
        assert "PersistentVolumeClaim" not in kinds(desired)
    else:
        claim = kinds(desired)["PersistentVolumeClaim"]
        assert claim["spec"]["resources"]["requests"]["storage"] == "300Gi"
        assert claim["spec"]["storageClassName"] == "fast"
        assert volume["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}


def test_the_cache_does_not_change_with_a_remediation_step() -> None:
    """A ladder step changes flags, not the cache: the same claim, so the weights are not downloaded again."""
    first = run({"model": {"name": QWEN}})
    stepped = reconcile.desired_state(reconcile.Observed(
        name="svc", namespace="ns", uid="uid-svc", generation=1, spec={"model": {"name": QWEN}},
        status={"remediation": {"profile": {"max_utilization": 0.8}, "step": 1}},
        now=datetime(2025, 1, 1, tzinfo=UTC), nodes=(H100,), model_files=load_model_files(QWEN, offline=True),
        default_storage_class="standard"))
    assert kinds(first)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"] != \
        kinds(stepped)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert cache_volume(first) == cache_volume(stepped)
    assert kinds(first)["PersistentVolumeClaim"] == kinds(stepped)["PersistentVolumeClaim"]


@pytest.mark.parametrize(("gib", "rate", "measured", "periods"), [
    # 600 s engine + 6 s/GiB loading + 1.25 x download at the rate, in 10 s periods (at least 60)
    (0.9, 100.0, None, 62),     # 600 + 5.4 + 11.5 = 616.9 s
    (14.2, 100.0, None, 87),    # 600 + 85.2 + 181.8 = 867 s
    (131.4, 100.0, None, 308),  # a 70B checkpoint: 600 + 788.4 + 1681.9 = 3070.3 s (51 min, was 12 min)
    (131.4, 100.0, 400.0, 181),  # measured 400 MiB/s: 600 + 788.4 + 420.5 = 1808.9 s
])
def test_startup_budget_follows_the_checkpoint(gib: float, rate: float, measured: float | None,
                                               periods: int) -> None:
    assert startup_failure_threshold(gib, download_mib_per_s=rate, measured_mib_per_s=measured) == periods


def test_probe_uses_the_budget() -> None:
    desired = run({"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, "gpu": {"count": 4}})
    probe = kinds(desired)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] == 10 and probe["failureThreshold"] > 300  # > 50 minutes for 131 GiB
