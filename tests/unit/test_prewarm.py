"""spec.modelCache.prewarm's pure part (render/prewarm.py): the DaemonSet that warms the pool's nodes, and how far
it got."""

from __future__ import annotations

import copy
from typing import Any

from vllm_operator.handlers.effects import ours
from vllm_operator.render.cache import DOWNLOAD_CONTAINER
from vllm_operator.render.pods import instance_selector
from vllm_operator.render.prewarm import (
    LABEL_PREWARM_KEY,
    PAUSE_IMAGE,
    build_prewarm_daemonset,
    prewarm_key,
    prewarm_progress,
)

IMAGE = "vllm/vllm-openai:v0.32.0"
OWNER = {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService", "name": "chat", "uid": "u-1"}


def _deployment(claim: str = "model-cache-qwen", image: str = IMAGE, args: tuple[str, ...] = ("--max-num-seqs", "8"),
                product: str = "NVIDIA-L4") -> dict[str, Any]:
    mounts = [{"name": "model-cache", "mountPath": "/root/.cache/huggingface"}]
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "chat", "labels": {"app.kubernetes.io/managed-by": "vllm-operator",
                                                     "vllm-operator.dev/service": "chat"}, "ownerReferences": [OWNER]},
            "spec": {"template": {"metadata": {"labels": dict(instance_selector("chat"))}, "spec": {
                "nodeSelector": {"nvidia.com/gpu.product": product},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "initContainers": [{"name": DOWNLOAD_CONTAINER, "image": image, "args": ["Qwen/Qwen2.5-7B", ""],
                                    "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf",
                                                                                             "key": "token"}}}],
                                    "volumeMounts": mounts}],
                "containers": [{"name": "vllm", "image": image, "args": list(args), "volumeMounts": mounts,
                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": claim}},
                            {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}}}


def _claim(name: str, mode: str) -> dict[str, Any]:
    return {"kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": {"accessModes": [mode]}}


def test_a_shared_claim_is_filled_on_every_node_of_the_pool_without_a_gpu() -> None:
    ds, fills = build_prewarm_daemonset(_deployment(), [_claim("model-cache-qwen", "ReadWriteMany")],
                                        service="chat", namespace="default")
    assert fills
    pod = ds["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["prewarm-image", DOWNLOAD_CONTAINER]
    assert {c["image"] for c in pod["initContainers"]} == {IMAGE} and pod["containers"][0]["image"] == PAUSE_IMAGE
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"} and pod["tolerations"]
    assert pod["volumes"] == [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache-qwen"}}]
    for container in [*pod["initContainers"], *pod["containers"]]:  # the pool's GPUs stay free
        resources = container.get("resources") or {}
        assert not any("nvidia.com/gpu" in (resources.get(kind) or {}) for kind in ("requests", "limits"))
    # the download's env (the token as a secret reference) as the workload's: the secret never leaves the pod
    assert pod["initContainers"][1]["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "hf"
    # not serving pods: none of the service's labels, so no Service, remediation or metrics reaches them
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert not set(instance_selector("chat")) & set(labels)
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert ds["metadata"]["ownerReferences"] == [OWNER]


def test_a_claim_one_node_mounts_is_not_filled_ahead_only_the_image_is_pulled() -> None:
    for children in ([_claim("model-cache-qwen", "ReadWriteOnce")], []):
        ds, fills = build_prewarm_daemonset(_deployment(), children, service="chat", namespace="default")
        pod = ds["spec"]["template"]["spec"]
        assert not fills and [c["name"] for c in pod["initContainers"]] == ["prewarm-image"]
        assert "volumes" not in pod


def test_the_key_follows_image_model_and_pool_not_vllms_flags() -> None:
    def key(**kw: Any) -> str:
        ds, _ = build_prewarm_daemonset(_deployment(**kw), [], service="chat", namespace="default")
        assert ds["spec"]["template"]["metadata"]["labels"][LABEL_PREWARM_KEY] == prewarm_key(ds)
        return prewarm_key(ds)

    base = key()
    assert key(args=("--max-num-seqs", "4")) == base  # a flag edit, a remediation step: nothing to warm again
    assert key(image="vllm/vllm-openai:v0.33.0") != base
    assert key(product="NVIDIA-H100-80GB-HBM3") != base


def _ds(desired: int | None, generation: int = 1, observed: int = 1) -> dict[str, Any]:
    status = {} if desired is None else {"desiredNumberScheduled": desired, "observedGeneration": observed}
    return {"metadata": {"generation": generation}, "status": status}


def _pod(node: str, key: str = "k", *, ready: bool = False, inits: dict[str, dict[str, Any]] | None = None
         ) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{node}", "labels": {LABEL_PREWARM_KEY: key}},
            "spec": {"nodeName": node},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "initContainerStatuses": [{"name": n, "state": s} for n, s in (inits or {}).items()]}}


def test_progress_node_by_node() -> None:
    assert prewarm_progress(None, [], "k").phase == "Running"
    assert prewarm_progress(_ds(None), [], "k").phase == "Running"  # the controller has not looked yet
    assert prewarm_progress(_ds(2, generation=2, observed=1), [], "k").phase == "Running"
    assert prewarm_progress(_ds(0), [], "k").phase == "Skipped"  # no node of the pool yet: nothing to wait for
    pulled = {"terminated": {"exitCode": 0}}
    pods = [_pod("a", ready=True), _pod("b", inits={"prewarm-image": pulled, DOWNLOAD_CONTAINER: {"running": {}}}),
            _pod("c", inits={"prewarm-image": {"waiting": {"reason": "ImagePullBackOff", "message": "no such tag"}}}),
            _pod("d", key="old", ready=True)]
    progress = prewarm_progress(_ds(3), pods, "k")
    assert progress.phase == "Running" and progress.ready == 1 and progress.desired == 3
    assert [(n["node"], n["state"]) for n in progress.nodes] == [("a", "Done"), ("b", "Filling"), ("c", "Failing")]
    assert "ImagePullBackOff: no such tag" in progress.nodes[2]["message"]
    assert "1/3 nodes warm" in progress.message
    failing = prewarm_progress(_ds(1), [_pod("b", inits={"prewarm-image": pulled})], "k",
                               failures={"p-b": "GatedRepoError: 401"})
    assert failing.nodes[0]["state"] == "Failing" and "GatedRepoError" in failing.nodes[0]["message"]
    done = prewarm_progress(_ds(2), [_pod("a", ready=True), _pod("b", ready=True)], "k")
    assert done.phase == "Done" and done.ready == 2


def test_a_models_shared_claim_is_the_operators_own_not_a_name_conflict() -> None:
    """The shared claim has no owner (it outlives each service): its rendered labels identify it."""
    labels = {"app.kubernetes.io/managed-by": "vllm-operator", "app.kubernetes.io/component": "model-cache",
              "vllm-operator.dev/model-cache": "abc"}
    child = {"metadata": {"name": "model-cache-qwen", "labels": labels}}
    assert ours(copy.deepcopy(child), child)
    theirs = copy.deepcopy(child)
    theirs["metadata"]["labels"].pop("app.kubernetes.io/managed-by")
    assert not ours(theirs, child)
    other_model = copy.deepcopy(child)
    other_model["metadata"]["labels"]["vllm-operator.dev/model-cache"] = "def"
    assert not ours(other_model, child)


def test_a_prewarm_pod_done_wakes_its_services_reconcile() -> None:
    from vllm_operator.handlers.prewarm import warmed_service
    from vllm_operator.render.prewarm import LABEL_PREWARM

    pod = _pod("a", ready=True)
    assert warmed_service(pod) is None  # not a prewarm pod
    pod["metadata"]["labels"][LABEL_PREWARM] = "chat"
    assert warmed_service(pod) == "chat"
    pod["status"]["conditions"][0]["status"] = "False"
    assert warmed_service(pod) is None  # still pulling: nothing to look at yet
