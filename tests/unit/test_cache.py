"""The default model cache (render/cache.py) and how the reconcile core uses it: weights downloaded once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.render.cache import (
    DOWNLOAD_CONTAINER,
    DOWNLOAD_SCRIPT,
    EPHEMERAL,
    MODEL_CACHE,
    PERSISTENT,
    CacheSettings,
    ObservedClaim,
    default_size,
    download_failure,
    download_from_vllm_log,
    fold_download,
    fold_download_failure,
    measured_download,
    observed_claim,
    plan_cache,
    read_write_many_class,
    shared_claim_name,
    startup_failure_threshold,
)
from vllm_operator.sources import load_model_files

QWEN = "Qwen/Qwen2.5-7B-Instruct"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}


def run(spec: dict[str, Any], *, name: str = "svc", storage_class: str | None = "standard",
        settings: CacheSettings | None = None, namespace: str = "ns", shared_class: str | None = None,
        status: dict[str, Any] | None = None, claim: ObservedClaim | None = None,
        lws: bool | None = None) -> reconcile.Desired:
    return reconcile.desired_state(reconcile.Observed(
        name=name, namespace=namespace, uid=f"uid-{name}", generation=1, spec=spec, status=status or {},
        now=datetime(2025, 1, 1, tzinfo=UTC), nodes=(H100,), model_files=load_model_files(spec["model"]["name"],
                                                                                           offline=True),
        cache_settings=settings or CacheSettings(), default_storage_class=storage_class,
        shared_storage_class=shared_class, cache_claim=claim, lws_installed=lws))


def kinds(desired: reconcile.Desired) -> dict[str, dict[str, Any]]:
    assert desired.children is not None
    return {c["kind"]: c for c in desired.children}


def cache_volume(desired: reconcile.Desired) -> dict[str, Any]:
    pod = kinds(desired)["Deployment"]["spec"]["template"]["spec"]
    return next(v for v in pod["volumes"] if v["name"] == "model-cache")


def pod_spec(desired: reconcile.Desired) -> dict[str, Any]:
    return dict(kinds(desired)["Deployment"]["spec"]["template"]["spec"])


def vllm_container(desired: reconcile.Desired) -> dict[str, Any]:
    return dict(next(c for c in pod_spec(desired)["containers"] if c["name"] == "vllm"))


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


def test_several_pods_on_read_write_once_storage_get_a_claim_each() -> None:
    """No ReadWriteMany class and no LeaderWorkerSet API (not asked here): a StatefulSet, a claim per pod."""
    desired = run({"model": {"name": QWEN}, "replicas": 2})
    status, reason, message = cache_condition(desired)
    assert (status, reason) == (cond.TRUE, PERSISTENT) and "StatefulSet" in message
    assert "PersistentVolumeClaim" not in kinds(desired) and "Deployment" not in kinds(desired)
    assert kinds(desired)["StatefulSet"]["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "model-cache"


def test_the_ephemeral_condition_says_what_each_start_downloads() -> None:
    _, _, message = cache_condition(run({"model": {"name": QWEN}, "replicas": 2}, storage_class=None))
    assert re.search(r"downloads them again \(\d+\.\d GiB each time\)", message)


@pytest.mark.parametrize("spec", [{"replicas": 2}, {"maxReplicas": 4},
                                  {"autoscaling": {"minReplicas": 1, "maxReplicas": 3}}])
def test_several_pods_share_a_read_write_many_claim_where_the_cluster_has_one(spec: dict[str, Any]) -> None:
    desired = run({"model": {"name": QWEN}, **spec}, shared_class="nfs-client")
    claim = kinds(desired)["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and claim["spec"]["storageClassName"] == "nfs-client"
    assert claim["metadata"]["name"] == shared_claim_name(QWEN, None)
    assert cache_volume(desired) == {"name": "model-cache", "persistentVolumeClaim": {
        "claimName": claim["metadata"]["name"]}}
    assert kinds(desired)["Deployment"]["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 1
    assert cache_condition(desired)[:2] == (cond.TRUE, PERSISTENT)
    # one replica shares it too (any service may be scaled: the template must not change when it is), and surges
    single = run({"model": {"name": QWEN}}, shared_class="nfs-client")
    assert kinds(single)["PersistentVolumeClaim"] == claim and cache_volume(single) == cache_volume(desired)
    assert kinds(single)["Deployment"]["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 1
    # a service that wants its own claim on block storage asks for it
    own = kinds(run({"model": {"name": QWEN}, "modelCache": {"size": "50Gi", "storageClassName": "fast"}},
                    shared_class="nfs-client"))["PersistentVolumeClaim"]
    assert own["spec"]["accessModes"] == ["ReadWriteOnce"] and own["spec"]["storageClassName"] == "fast"


def _template(desired: reconcile.Desired) -> str:
    return json.dumps(kinds(desired)["Deployment"]["spec"]["template"], sort_keys=True)


@pytest.mark.parametrize("spec", [{}, {"maxReplicas": 3}])
def test_scaling_one_two_one_never_changes_the_pod_template(spec: dict[str, Any]) -> None:
    """`kubectl scale vllm NAME --replicas=2` and back (the scale subresource writes spec.replicas): the Deployment's
    replicas follow, its pod template stays byte for byte the same (no rollout, no re-download)."""
    status: dict[str, Any] = {}
    templates, replicas = [], []
    for count in (1, 2, 1):
        desired = run({"model": {"name": QWEN}, **spec, "replicas": count}, shared_class="nfs-client", status=status)
        templates.append(_template(desired))
        replicas.append(kinds(desired)["Deployment"]["spec"]["replicas"])
        status = desired.status.model_dump(by_alias=True, exclude_none=True)
    assert replicas == [1, 2, 1]
    assert templates[0] == templates[1] == templates[2]


def test_a_scale_back_to_one_pod_keeps_the_shared_cache() -> None:
    """Scaling never switches the template back: the shape recorded (status.modelCache.shapePods) stays."""
    two = run({"model": {"name": QWEN}, "replicas": 2}, shared_class="nfs-client")
    recorded = two.status.model_dump(by_alias=True, exclude_none=True)
    assert recorded["modelCache"]["shapePods"] == 2
    one = run({"model": {"name": QWEN}, "replicas": 1}, shared_class="nfs-client", status=recorded)
    assert cache_volume(one) == cache_volume(two)
    assert pod_spec(one) == pod_spec(two)
    # an ephemeral multi-pod shape is not kept: one pod gets its claim back (nothing persistent to lose)
    ephemeral = run({"model": {"name": QWEN}, "replicas": 2}, settings=CacheSettings(mode="ephemeral")).status \
        .model_dump(by_alias=True, exclude_none=True)
    assert "shapePods" not in ephemeral.get("modelCache", {})
    assert "persistentVolumeClaim" in cache_volume(run({"model": {"name": QWEN}}, status=ephemeral))


@pytest.mark.parametrize(("classes", "expected"), [
    ([], None),
    ([{"metadata": {"name": "standard"}, "provisioner": "ebs.csi.aws.com"}], None),
    ([{"metadata": {"name": "efs"}, "provisioner": "efs.csi.aws.com"}], "efs"),
    ([{"metadata": {"name": "nfs-client"}, "provisioner": "cluster.local/nfs-subdir-external-provisioner"}],
     "nfs-client"),
    ([{"metadata": {"name": "mine", "annotations": {"vllm-operator.dev/access-mode": "ReadWriteMany"}},
       "provisioner": "example.com/fs"}], "mine"),
    ([{"metadata": {"name": "not-nfs", "annotations": {"vllm-operator.dev/access-mode": "ReadWriteOnce"}},
       "provisioner": "nfs.csi.k8s.io"}], None),
    ([{"metadata": {"name": "a"}, "provisioner": "nfs.csi.k8s.io"},
      {"metadata": {"name": "b", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
       "provisioner": "rook-ceph.cephfs.csi.ceph.com"}], "b"),
])
def test_read_write_many_classes_are_found(classes: list[dict[str, Any]], expected: str | None) -> None:
    assert read_write_many_class(classes) == expected


def test_a_multi_node_group_gets_a_claim_per_pod() -> None:
    plan = plan_cache(service="big", namespace="ns", model=QWEN, revision=None, spec=None, settings=CacheSettings(),
                      default_storage_class="standard", checkpoint_gib=756.0, max_pods=2, labels={"a": "b"},
                      owner={}, group_pods=True)
    assert plan.persistent and plan.claim is None and plan.volume == {}
    assert plan.claim_template is not None and plan.claim_template["metadata"]["name"] == "model-cache"
    assert plan.claim_template["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "claim per pod" in plan.message
    # with a ReadWriteMany class the group shares one claim instead
    shared = plan_cache(service="big", namespace="ns", model=QWEN, revision=None, spec=None,
                        settings=CacheSettings(), default_storage_class="standard", checkpoint_gib=756.0, max_pods=2,
                        labels={}, owner={}, group_pods=True, shared_storage_class="cephfs")
    assert shared.claim_template is None and shared.claim is not None
    assert shared.claim["spec"]["accessModes"] == ["ReadWriteMany"]


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
    """vLLM downloads into an emptyDir itself: the probe budgets the download (> 50 minutes for 131 GiB); with a
    persistent cache the init container downloads, and the probe budgets engine start and loading only."""
    spec = {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, "gpu": {"count": 4}}
    probe = vllm_container(run(spec, storage_class=None))["startupProbe"]
    assert probe["periodSeconds"] == 10 and probe["failureThreshold"] > 300
    # 600 s + 6 s/GiB x 131.4 GiB = 1388.4 s: 139 periods, no download in it
    assert vllm_container(run(spec))["startupProbe"]["failureThreshold"] == 139


# --- the model-download init container ---------------------------------------------------------------------------


def test_a_persistent_cache_is_filled_by_an_init_container() -> None:
    desired = run({"model": {"name": QWEN, "revision": "a1b2c3"},
                   "hfTokenSecretRef": {"name": "hf"}, "env": [{"name": "HF_ENDPOINT", "value": "http://mirror"}]})
    [init] = pod_spec(desired)["initContainers"]
    vllm = vllm_container(desired)
    assert init["name"] == DOWNLOAD_CONTAINER and init["image"] == vllm["image"]
    # the model id and revision are argv data after a constant script, never part of any shell or Python text
    assert init["command"] == ["python3", "-c", DOWNLOAD_SCRIPT]
    assert init["args"] == [QWEN, "a1b2c3", "/dev/termination-log"]
    assert init["env"] == vllm["env"] and init["volumeMounts"] == vllm["volumeMounts"]  # same HF_HOME, token, mirror
    assert init["securityContext"] == vllm["securityContext"]
    assert "startupProbe" not in init and "livenessProbe" not in init  # no probe, no deadline: resumes on failure
    status, _reason, message = cache_condition(desired)
    assert status == cond.TRUE and "model-download init container fills it" in message
    assert desired.status.model_cache is not None and desired.status.model_cache.download_init is True


@pytest.mark.parametrize(("spec", "storage_class", "settings", "why"), [
    ({}, None, None, ""),  # an emptyDir: vLLM's own download is as good
    ({}, "standard", CacheSettings(download_init=False), "--no-model-cache-download-init"),
    ({"env": [{"name": "HF_HUB_OFFLINE", "value": "1"}]}, "standard", None, "HF_HUB_OFFLINE"),
    ({"extraArgs": ["--download-dir=/models"]}, "standard", None, "--download-dir in spec.extraArgs"),
    ({"extraArgs": ["--load-format", "runai_streamer"]}, "standard", None, "--load-format in spec.extraArgs"),
])
def test_no_init_container_where_it_would_not_help(spec: dict[str, Any], storage_class: str | None,
                                                    settings: CacheSettings | None, why: str) -> None:
    desired = run({"model": {"name": QWEN}, **spec}, storage_class=storage_class, settings=settings)
    assert "initContainers" not in pod_spec(desired)
    assert why in cache_condition(desired)[2]
    # vLLM downloads: its probe budgets the download (Qwen 14.2 GiB at 100 MiB/s: 87 periods)
    assert vllm_container(desired)["startupProbe"]["failureThreshold"] == 87


def test_the_download_script_fetches_what_vllm_loads(tmp_path: Path) -> None:
    """Run the script against a stand-in huggingface_hub: the index's shards and the small files are fetched (not
    `original/` nor the consolidated copy), and the termination message says how many bytes in how long."""
    fake = tmp_path / "fake" / "huggingface_hub"
    fake.mkdir(parents=True)
    cache = tmp_path / "hub"
    (fake / "__init__.py").write_text(FAKE_HUB.replace("HUB_DIR", repr(str(cache))))
    message = tmp_path / "termination-log"
    done = subprocess.run([sys.executable, "-c", DOWNLOAD_SCRIPT, "org/model", "", str(message)],
                          env={"PYTHONPATH": str(fake.parent), "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(message.read_text())
    fetched = json.loads((cache / "fetched.json").read_text())
    assert sorted(fetched) == ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                               "model.safetensors.index.json", "tokenizer.json"]
    # the shards and the small files; the index was fetched before the measurement began (to pick the shards)
    assert report["downloadedBytes"] == 1000 + 2000 + 10 + 10 and report["seconds"] >= 0
    assert "Time spent downloading weights for org/model:" in done.stdout
    measure = measured_download({"metadata": {"name": "p"}, "status": {"initContainerStatuses": [
        {"name": DOWNLOAD_CONTAINER, "state": {"terminated": {"exitCode": 0, "message": message.read_text()}}}]}})
    assert measure is not None and measure.downloaded_bytes == report["downloadedBytes"]

    # the hub unreachable: the cached snapshot serves (exit 0, nothing downloaded, no measurement) ...
    (cache / "offline").touch()
    again = subprocess.run([sys.executable, "-c", DOWNLOAD_SCRIPT, "org/model", "", str(message)],
                           env={"PYTHONPATH": str(fake.parent), "PATH": "/usr/bin:/bin"}, capture_output=True,
                           text=True, timeout=60, check=False)
    assert again.returncode == 0 and "using the cached snapshot" in again.stdout, again.stderr
    assert json.loads(message.read_text()) == {"downloadedBytes": 0, "seconds": 0.0}
    # ... and without one the container fails with the hub's error (the kubelet restarts it)
    failed = subprocess.run([sys.executable, "-c", DOWNLOAD_SCRIPT, "other/model", "", str(message)],
                            env={"PYTHONPATH": str(fake.parent), "PATH": "/usr/bin:/bin"}, capture_output=True,
                            text=True, timeout=60, check=False)
    assert failed.returncode == 1 and "Connection refused" in failed.stderr


FAKE_HUB = '''
import json
from pathlib import Path

FILES = {"config.json": 10, "tokenizer.json": 10, "model.safetensors.index.json": 200, "consolidated.safetensors": 5000,
         "model-00001-of-00002.safetensors": 1000, "model-00002-of-00002.safetensors": 2000,
         "original/consolidated.00.pth": 5000}


class constants:
    HF_HUB_CACHE = HUB_DIR


def _blobs():
    path = Path(HUB_DIR) / "models--org--model" / "blobs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fetch(name):
    (_blobs() / name.replace("/", "_")).write_bytes(b"x" * FILES[name])
    seen = Path(HUB_DIR) / "fetched.json"
    got = set(json.loads(seen.read_text())) if seen.exists() else set()
    seen.write_text(json.dumps(sorted(got | {name})))


class HfApi:
    def list_repo_files(self, repo, revision=None):
        if (Path(HUB_DIR) / "offline").exists():
            raise OSError("Connection refused")
        return list(FILES)


def hf_hub_download(repo, filename, revision=None):
    _fetch(filename)
    weights = {"model.embed": "model-00001-of-00002.safetensors", "lm_head": "model-00002-of-00002.safetensors"}
    path = Path(HUB_DIR) / "index.json"
    path.write_text(json.dumps({"weight_map": weights}))
    return str(path)


def snapshot_download(repo, revision=None, allow_patterns=None, local_files_only=False):
    snapshot = Path(HUB_DIR) / ("snapshot-" + repo.replace("/", "--"))
    if local_files_only:
        if not snapshot.exists():
            raise FileNotFoundError("no snapshot in the cache")
        return str(Path(HUB_DIR))
    snapshot.touch()
    for name in allow_patterns:
        if name != "model.safetensors.index.json":
            _fetch(name)
    return str(Path(HUB_DIR))
'''


# --- the measured download ---------------------------------------------------------------------------------------


def _pod(message: Any, exit_code: int = 0, name: str = "svc-abc") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"initContainerStatuses": [
        {"name": DOWNLOAD_CONTAINER, "state": {"terminated": {"exitCode": exit_code, "message": message,
                                                               "finishedAt": "2025-01-01T00:10:00Z"}}}]}}


def test_a_measured_download_is_read_from_the_init_container() -> None:
    measure = measured_download(_pod(json.dumps({"downloadedBytes": 15 * 2**30, "seconds": 61.44})))
    assert measure is not None and measure.source == "init-container" and measure.pod == "svc-abc"
    assert round(measure.bytes_per_second / 2**20) == 250  # 15 GiB in 61.44 s
    folded = fold_download({"downloadInit": True}, measure)
    assert folded == {"downloadInit": True, "downloadedBytes": 15 * 2**30, "downloadSeconds": 61.44,
                      "bytesPerSecond": 262144000, "measuredPod": "svc-abc", "measuredBy": "init-container",
                      "measuredAt": "2025-01-01T00:10:00Z"}
    assert fold_download(folded, measure) is None  # recorded once


@pytest.mark.parametrize("pod", [
    _pod("not json"), _pod("[1, 2]"), _pod(json.dumps({"downloadedBytes": -1, "seconds": 3})),
    _pod(json.dumps({"downloadedBytes": 10**10, "seconds": "fast"})), _pod(json.dumps({"downloadedBytes": True,
                                                                                       "seconds": 3})),
    _pod(json.dumps({"downloadedBytes": 10**10, "seconds": 30}), exit_code=1), {"status": None}, {},
    {"status": {"initContainerStatuses": ["x", {"name": DOWNLOAD_CONTAINER}]}},
])
def test_bad_reports_measure_nothing(pod: dict[str, Any]) -> None:
    assert measured_download(pod) is None


def test_a_warm_cache_is_not_a_measurement() -> None:
    """The init container found the weights: a few bytes in a second say nothing about the network."""
    assert fold_download({}, measured_download(_pod(json.dumps({"downloadedBytes": 4096, "seconds": 1.2})))) is None


def test_vllms_own_log_line_is_a_measurement() -> None:
    """vLLM 0.33 weight_utils.download_weights_from_hf logs the time when it downloaded (an emptyDir cache)."""
    text = ("INFO 01-01 00:00:00 [weight_utils.py:538] Time spent downloading weights for Qwen/Qwen2.5-7B-Instruct: "
            "120.500000 seconds\n")
    measure = download_from_vllm_log(text, checkpoint_bytes=15_231_233_024, pod="p")
    assert measure is not None and measure.source == "vllm-log" and measure.seconds == 120.5
    assert download_from_vllm_log("Loading weights took 3.1 seconds", checkpoint_bytes=1, pod="p") is None


def _stepped(status: dict[str, Any], settings: CacheSettings | None = None) -> reconcile.Desired:
    return reconcile.desired_state(reconcile.Observed(
        name="svc", namespace="ns", uid="uid-svc", generation=1, spec={"model": {"name": QWEN}}, status=status,
        now=datetime(2025, 1, 1, tzinfo=UTC), nodes=(H100,), model_files=load_model_files(QWEN, offline=True),
        default_storage_class=None, cache_settings=settings or CacheSettings()))


def test_the_measured_rate_applies_at_the_next_change_of_args_only() -> None:
    """Ephemeral cache (vLLM downloads): 25 MiB/s measured. The serving template keeps its budget (a measurement
    alone never rolls the pods out); the next remediation step's template budgets with the measured rate."""
    first = _stepped({})
    assert first.status.plan is not None and first.status.model_cache is not None
    assert first.status.model_cache.budget_bytes_per_second is None
    served = first.status.to_dict()
    served["modelCache"] = {**served["modelCache"], "bytesPerSecond": 25 * 2**20, "downloadedBytes": 15 * 2**30}
    again = _stepped(served)
    assert vllm_container(again)["startupProbe"] == vllm_container(first)["startupProbe"]  # 87 periods still
    stepped = _stepped({**served, "remediation": {"profile": {"max_utilization": 0.8}, "step": 1}})
    threshold = vllm_container(stepped)["startupProbe"]["failureThreshold"]
    # 600 + 6 x 14.19 + 1.25 x 14.19 GiB x 1024 / 25 MiB/s = 1411.6 s
    assert threshold == startup_failure_threshold(14.19, download_mib_per_s=100, measured_mib_per_s=25) == 142
    assert stepped.status.model_cache is not None
    assert stepped.status.model_cache.budget_bytes_per_second == 25 * 2**20
    after = _stepped({**stepped.status.to_dict(), "remediation": {"profile": {"max_utilization": 0.8}, "step": 1}})
    assert vllm_container(after)["startupProbe"]["failureThreshold"] == 142  # and it stays


@pytest.mark.parametrize(("argv", "env", "expected"), [
    ([], None, True), (["--no-model-cache-download-init"], None, False), ([], "false", False), ([], "1", True),
    (["--model-cache-download-init"], "no", True),
])
def test_the_operator_setting(argv: list[str], env: str | None, expected: bool,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_operator import cli
    if env is None:
        monkeypatch.delenv("VLLM_OPERATOR_MODEL_CACHE_DOWNLOAD_INIT", raising=False)
    else:
        monkeypatch.setenv("VLLM_OPERATOR_MODEL_CACHE_DOWNLOAD_INIT", env)
    args = cli.build_parser().parse_args(["run", *argv])
    assert cli._cache_settings(args).download_init is expected


def _failing(state: dict[str, Any], last: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "svc-abc"}, "status": {"initContainerStatuses": [
        {"name": DOWNLOAD_CONTAINER, "state": state, "lastState": last or {}, "restartCount": 2}]}}


GATED = ("Traceback (most recent call last):\n  ...\nhuggingface_hub.errors.GatedRepoError: 401 Client Error.\n"
         "Cannot access gated repo for url https://huggingface.co/api/models/meta-llama/Llama-3.1-8B-Instruct.\n"
         "Access to model meta-llama/Llama-3.1-8B-Instruct is restricted. You must have access to it and be "
         "authenticated to access it. Please log in.\n")


def test_a_failing_download_is_said_and_cleared_by_a_success() -> None:
    crash = _failing({"waiting": {"reason": "CrashLoopBackOff"}},
                     {"terminated": {"exitCode": 1, "reason": "Error", "message": GATED}})
    why = download_failure(crash)
    assert why is not None and why.startswith("huggingface_hub.errors.GatedRepoError: 401") and "log in" in why
    assert download_failure(_failing({"terminated": {"exitCode": 2, "reason": "Error"}})) == "exit code 2 (Error)"
    # running again after a failure: still failing until it succeeds; a success clears it
    assert download_failure(_failing({"running": {}}, {"terminated": {"exitCode": 1, "message": "x"}})) == "x"
    ok = _failing({"terminated": {"exitCode": 0, "message": json.dumps({"downloadedBytes": 0, "seconds": 1})}},
                  {"terminated": {"exitCode": 1, "message": "x"}})
    assert download_failure(ok) is None and download_failure({"status": {}}) is None
    failed = fold_download_failure({"downloadInit": True}, "svc-abc", why)
    assert failed == {"downloadInit": True, "downloadError": why, "downloadErrorPod": "svc-abc"}
    assert fold_download_failure(failed, "svc-abc", why) is None  # said once
    assert fold_download_failure(failed, "svc-def", None) == {"downloadInit": True}
    assert fold_download_failure({"downloadInit": True}, "svc-def", None) is None


def test_the_model_cache_condition_repeats_a_failing_download() -> None:
    first = run({"model": {"name": QWEN}})
    status = first.status.to_dict()
    status["modelCache"] = {**status["modelCache"], "downloadError": "GatedRepoError: 401", "downloadErrorPod": "p-1"}
    again = reconcile.desired_state(reconcile.Observed(
        name="svc", namespace="ns", uid="uid-svc", generation=1, spec={"model": {"name": QWEN}}, status=status,
        now=datetime(2025, 1, 1, tzinfo=UTC), nodes=(H100,), model_files=load_model_files(QWEN, offline=True),
        default_storage_class="standard"))
    message = cache_condition(again)[2]
    assert "the model-download init container of pod p-1 fails: GatedRepoError: 401" in message
    assert again.status.model_cache is not None and again.status.model_cache.download_error == "GatedRepoError: 401"


def test_the_init_container_follows_the_restricted_profile() -> None:
    """A non-root user: the init container runs as vLLM does, with HOME and the caches on the writable volumes."""
    desired = run({"model": {"name": QWEN}, "security": {"profile": "restricted"}})
    [init] = pod_spec(desired)["initContainers"]
    vllm = vllm_container(desired)
    assert init["securityContext"]["runAsNonRoot"] is True and init["securityContext"] == vllm["securityContext"]
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert env["HOME"] == "/home/vllm" and env["HF_HOME"] == "/home/vllm/.cache/huggingface"
    assert {"name": "model-cache", "mountPath": "/home/vllm/.cache/huggingface"} in init["volumeMounts"]


# --- spec.modelCache.size for a service of several pods; spec.modelCache.claimName as read ---------------------------


def _strategy(desired: reconcile.Desired) -> dict[str, Any]:
    return dict(kinds(desired)["Deployment"]["spec"]["strategy"]["rollingUpdate"])


@pytest.mark.parametrize("spec", [{"replicas": 2}, {"maxReplicas": 3},
                                  {"autoscaling": {"minReplicas": 1, "maxReplicas": 3}}])
def test_a_sized_cache_of_several_pods_is_a_claim_per_pod_of_that_size_and_class(spec: dict[str, Any]) -> None:
    """No ReadWriteMany class: one ReadWriteOnce claim that every pod mounts could be attached on one node only, so
    each pod gets its own claim of the size (and class) asked, from the StatefulSet's volumeClaimTemplates."""
    desired = run({"model": {"name": QWEN}, **spec, "modelCache": {"size": "40Gi", "storageClassName": "fast"}})
    assert "PersistentVolumeClaim" not in kinds(desired) and "Deployment" not in kinds(desired)
    template = kinds(desired)["StatefulSet"]["spec"]["volumeClaimTemplates"][0]
    assert template["spec"] == {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                                "resources": {"requests": {"storage": "40Gi"}}}
    status, reason, message = cache_condition(desired)
    assert (status, reason) == (cond.TRUE, PERSISTENT)
    assert "claim per pod" in message and "spec.modelCache.size 40Gi each" in message
    # no class asked: the claims are the cluster default's, not the operator setting's
    plain = run({"model": {"name": QWEN}, **spec, "modelCache": {"size": "40Gi"}},
                settings=CacheSettings(storage_class="operator-class", size="999Gi"))
    claim_spec = kinds(plain)["StatefulSet"]["spec"]["volumeClaimTemplates"][0]["spec"]
    assert "storageClassName" not in claim_spec and claim_spec["resources"]["requests"]["storage"] == "40Gi"


def test_a_sized_cache_of_several_pods_is_one_pod_groups_where_leader_worker_sets_are_served() -> None:
    desired = run({"model": {"name": QWEN}, "replicas": 2, "modelCache": {"size": "40Gi"}}, lws=True)
    lws = kinds(desired)["LeaderWorkerSet"]
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 1
    claim = lws["spec"]["leaderWorkerTemplate"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "40Gi"
    assert "PersistentVolumeClaim" not in kinds(desired)


def test_a_sized_multi_node_group_gets_a_claim_per_pod_of_that_size() -> None:
    from vllm_operator.api.v1alpha1 import ModelCacheSpec
    plan = plan_cache(service="big", namespace="ns", model=QWEN, revision=None,
                      spec=ModelCacheSpec.model_validate({"size": "900Gi", "storageClassName": "fast"}),
                      settings=CacheSettings(), default_storage_class="standard", checkpoint_gib=756.0, max_pods=2,
                      labels={}, owner={}, group_pods=True)
    assert plan.claim is None and plan.claim_template is not None and plan.per_pod_workload == "LeaderWorkerSet"
    assert plan.claim_template["spec"]["resources"]["requests"]["storage"] == "900Gi"
    assert plan.claim_template["spec"]["storageClassName"] == "fast"


@pytest.mark.parametrize(("cache", "default"), [({"size": "40Gi", "storageClassName": "nfs-client"}, "standard"),
                                                ({"size": "40Gi"}, "nfs-client")])
def test_a_sized_cache_of_several_pods_on_a_read_write_many_class_is_one_shared_claim(
        cache: dict[str, Any], default: str) -> None:
    """The class asked (or the cluster default, none asked) gives ReadWriteMany: one claim of that size, the
    service's own, every pod mounts it and the Deployment surges."""
    desired = run({"model": {"name": QWEN}, "replicas": 2, "modelCache": cache}, storage_class=default,
                  shared_class="nfs-client")
    claim = kinds(desired)["PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "svc-model-cache-shared"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-svc"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "40Gi"
    assert claim["spec"].get("storageClassName") == cache.get("storageClassName")
    assert cache_volume(desired)["persistentVolumeClaim"] == {"claimName": "svc-model-cache-shared"}
    assert _strategy(desired)["maxSurge"] == 1
    assert cache_condition(desired)[:2] == (cond.TRUE, PERSISTENT)
    # a class that is not the ReadWriteMany one: a claim per pod
    block = run({"model": {"name": QWEN}, "replicas": 2, "modelCache": {"size": "40Gi", "storageClassName": "fast"}},
                storage_class=default, shared_class="nfs-client")
    assert "StatefulSet" in kinds(block) and "PersistentVolumeClaim" not in kinds(block)


def test_a_sized_cache_of_one_pod_is_its_own_claim_rolled_without_a_surge() -> None:
    desired = run({"model": {"name": QWEN}, "modelCache": {"size": "40Gi"}}, shared_class="nfs-client")
    claim = kinds(desired)["PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "svc-model-cache" and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert _strategy(desired) == {"maxSurge": 0, "maxUnavailable": 1}


def _seen(*modes: str, found: bool = True, name: str = "mine") -> ObservedClaim:
    return ObservedClaim(name=name, found=found, access_modes=modes)


@pytest.mark.parametrize(("claim", "surge"), [
    (_seen("ReadWriteOnce"), 0), (_seen("ReadWriteOncePod"), 0), (_seen("ReadWriteMany"), 1),
    (_seen("ReadWriteOnce", "ReadWriteMany"), 1), (_seen("ReadOnlyMany"), 1),
    (None, 1),  # not read (no RBAC for claims): as asked, the Deployment's default
    (_seen("ReadWriteOnce", name="another"), 1),  # what was read is not the claim the spec names now
])
def test_a_users_claim_that_one_node_mounts_rolls_without_a_surge(claim: ObservedClaim | None, surge: int) -> None:
    desired = run({"model": {"name": QWEN}, "modelCache": {"claimName": "mine"}}, claim=claim)
    assert cache_volume(desired)["persistentVolumeClaim"] == {"claimName": "mine"}
    assert _strategy(desired)["maxSurge"] == surge
    assert cache_condition(desired)[:2] == (cond.TRUE, PERSISTENT)
    assert "PersistentVolumeClaim" not in kinds(desired)


@pytest.mark.parametrize(("mode", "who"), [("ReadWriteOnce", "a pod on another node"),
                                           ("ReadWriteOncePod", "a second pod")])
@pytest.mark.parametrize("spec", [{"replicas": 2}, {"autoscaling": {"minReplicas": 1, "maxReplicas": 3}}])
def test_a_users_one_node_claim_for_several_pods_says_they_cannot_all_mount_it(
        mode: str, who: str, spec: dict[str, Any]) -> None:
    desired = run({"model": {"name": QWEN}, **spec, "modelCache": {"claimName": "mine"}}, claim=_seen(mode))
    status, reason, message = cache_condition(desired)
    assert (status, reason) == (cond.FALSE, cond.CACHE_CLAIM_NOT_SHARED)
    assert f"is {mode}" in message and who in message and "ReadWriteMany claim" in message
    assert "drop claimName" in message
    assert _strategy(desired)["maxSurge"] == 0  # still mounted as asked; an edit never waits on a surge pod
    # a ReadWriteMany claim serves them all
    shared = run({"model": {"name": QWEN}, **spec, "modelCache": {"claimName": "mine"}}, claim=_seen("ReadWriteMany"))
    assert cache_condition(shared)[:2] == (cond.TRUE, PERSISTENT)


def test_a_users_claim_that_does_not_exist_is_said() -> None:
    desired = run({"model": {"name": QWEN}, "modelCache": {"claimName": "mine"}}, claim=_seen(found=False),
                  namespace="team")
    status, reason, message = cache_condition(desired)
    assert (status, reason) == (cond.FALSE, cond.CACHE_CLAIM_NOT_FOUND)
    assert "mine" in message and "does not exist in namespace team" in message and "Pending" in message
    assert cache_volume(desired)["persistentVolumeClaim"] == {"claimName": "mine"}  # the pods wait for it


@pytest.mark.parametrize(("claim", "modes"), [
    (None, None),
    ({"spec": {"accessModes": ["ReadWriteOnce"]}}, ("ReadWriteOnce",)),
    # bound: the volume's modes, not the ones asked
    ({"spec": {"accessModes": ["ReadWriteOnce"]}, "status": {"phase": "Bound", "accessModes": ["ReadWriteMany"]}},
     ("ReadWriteMany",)),
    ({"spec": {"accessModes": ["ReadWriteOnce", "ReadWriteOnce", "Bogus", 7]}}, ("ReadWriteOnce",)),
    ({"spec": {"accessModes": "ReadWriteMany"}, "status": None}, ()),
    ({"spec": {"accessModes": ["x"] * 100_000 + ["ReadWriteMany"]}}, ()),
])
def test_what_is_read_of_a_claim(claim: dict[str, Any] | None, modes: tuple[str, ...] | None) -> None:
    seen = observed_claim("mine", claim)
    assert seen.name == "mine" and seen.found == (claim is not None)
    assert seen.access_modes == (modes or ())


def test_the_shell_reads_the_named_claim_once_and_only_when_named() -> None:
    from vllm_operator.handlers import observe
    asked: list[str] = []

    def reader(name: str) -> ObservedClaim:
        asked.append(name)
        return _seen("ReadWriteOnce", name=name)

    def observed(spec: dict[str, Any]) -> reconcile.Observed:
        base = reconcile.Observed(name="svc", namespace="ns", uid="u", generation=1, spec=spec, status={},
                                  now=datetime(2025, 1, 1, tzinfo=UTC), nodes=(H100,))
        return observe.complete(base, model=None, nodes=None, lws=None, claim=reader)

    assert observed({"model": {"name": QWEN}, "modelCache": {"claimName": "mine"}}).cache_claim == \
        _seen("ReadWriteOnce")
    assert asked == ["mine"]
    assert observed({"model": {"name": QWEN}, "modelCache": {"size": "40Gi"}}).cache_claim is None
    assert observed({"model": {"name": QWEN}}).cache_claim is None
    assert observed({"model": {"name": QWEN}, "modelCache": {"claimName": "mine"}, "replicas": -1}).cache_claim \
        is None  # an invalid spec: nothing is read
    assert asked == ["mine"]


def test_a_claim_the_operator_may_not_read_is_not_known(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forbidden (a chart without `get` on claims): unknown, so mounted as asked; any other API error propagates
    (kopf retries the reconcile)."""
    from kubernetes.client.exceptions import ApiException

    from vllm_operator.handlers import kube, observe
    answers: dict[str, Any] = {"mine": {"spec": {"accessModes": ["ReadWriteOnce"]}}, "gone": None}

    def get(resource: Any, namespace: str, name: str) -> Any:
        assert (resource, namespace) == (kube.PVCS, "ns")
        if name in answers:
            return answers[name]
        raise ApiException(status=403 if name == "forbidden" else 500)

    monkeypatch.setattr(kube, "get", get)
    assert observe.read_claim("ns", "mine") == _seen("ReadWriteOnce")
    assert observe.read_claim("ns", "gone") == _seen(found=False, name="gone")
    assert observe.read_claim("ns", "forbidden") is None
    with pytest.raises(ApiException):
        observe.read_claim("ns", "broken")
