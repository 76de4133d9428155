"""One apps/v1 StatefulSet for a VLLMService whose one-node pods each need a cache claim of their own where the
LeaderWorkerSet API is not served (render/cache.py: several pods on ReadWriteOnce storage).

The pod is the Deployment's pod template (the same containers, probes, `model-download` init container, compile-cache
environment, GPU resources and node selection) with the workload label `statefulset` (render/pods.py) and without
the `model-cache` volume: `volumeClaimTemplates: [model-cache]` gives pod `<sts>-<n>` the claim
`model-cache-<sts>-<n>` (the template render/cache.py's `_per_pod` made for one-pod groups).

- `persistentVolumeClaimRetentionPolicy: {whenDeleted: Delete, whenScaled: Retain}`: a scale back up finds its
  weights; the claims go with the StatefulSet, so with the service.
- `podManagementPolicy: Parallel`: the replicas are independent. With OrderedReady a pod that never gets Ready
  blocks every later pod and every rollout (kubernetes/kubernetes#67250), so neither an edit nor a remediation step
  could replace a crash-looping pod.
- `updateStrategy: RollingUpdate`: one pod at a time from the highest ordinal, the others serving; it cannot surge
  (a new pod's claim would be empty, and a ReadWriteOnce claim cannot be shared with the pod it replaces), so
  handlers/placement.py holds a rollout whose new pod could not be placed and says when one interrupts service.
- `serviceName`: the service's own Service. apps/v1's schema requires the field up to Kubernetes 1.32
  (kubernetes-validate's bundled schemas: required in 1.25–1.32, optional from 1.33); the governing Service gives per-pod DNS records only when it
  is headless, which nothing here needs (the replicas are independent and addressed through the Service), so no
  second, headless Service is made.
- `spec.selector` (immutable): the service's labels and `vllm-operator.dev/workload: statefulset`, which no pod of
  the same service's Deployment or LeaderWorkerSet carries.

Pure: builds dicts; nothing here talks to the API.
"""

from __future__ import annotations

import copy
from typing import Any

from .manifests import (
    ANNOTATION_SPEC_HASH,
    INT32_MAX,
    RenderInput,
    build_cache_pvc,
    build_deployment,
    build_service,
    child_names,
    spec_hash,
)
from .pods import WORKLOAD_LABEL as WORKLOAD_LABEL
from .pods import serving_pods, statefulset_name, statefulset_pod_labels

KIND = "StatefulSet"
#: The fields of a StatefulSet's spec the API server refuses to change (apps/v1 `ValidateStatefulSetUpdate`).
IMMUTABLE_FIELDS = ("selector", "serviceName", "volumeClaimTemplates", "podManagementPolicy")
#: What happens to the claims when the StatefulSet scales down or is deleted.
RETENTION = {"whenDeleted": "Delete", "whenScaled": "Retain"}


def build_statefulset(inp: RenderInput) -> dict[str, Any]:
    """The StatefulSet: `inp.replicas` pods of the Deployment's template, each with its own `model-cache` claim."""
    if inp.cache_claim_template is None:
        raise ValueError("a StatefulSet is rendered for one-node pods that each need a cache claim of their own "
                         "(render/cache.py)")
    deployment = build_deployment(inp)
    template = copy.deepcopy(deployment["spec"]["template"])
    labels = statefulset_pod_labels(inp.name)
    template["metadata"]["labels"] = {**template["metadata"]["labels"], **labels}
    meta = deployment["metadata"]
    sts: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": KIND,
        "metadata": {"name": statefulset_name(inp.name), "namespace": inp.namespace, "labels": dict(meta["labels"]),
                     "annotations": {}, "ownerReferences": list(meta["ownerReferences"])},
        "spec": {
            "replicas": max(min(inp.replicas, INT32_MAX), 0),
            "serviceName": child_names(inp.name).service,
            "selector": {"matchLabels": dict(labels)},
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "revisionHistoryLimit": 3,
            "persistentVolumeClaimRetentionPolicy": dict(RETENTION),
            "template": template,
            "volumeClaimTemplates": [copy.deepcopy(inp.cache_claim_template)],
        },
    }
    sts["metadata"]["annotations"][ANNOTATION_SPEC_HASH] = spec_hash(sts["spec"])
    return sts


def build_statefulset_children(inp: RenderInput) -> list[dict[str, Any]]:
    """Every object such a VLLMService owns, in apply order (cache PVC if asked, StatefulSet, Service)."""
    pvc = build_cache_pvc(inp)
    service = build_service(inp, serving_pods(inp.name, inp.namespace, kind=KIND))
    return ([pvc] if pvc else []) + [build_statefulset(inp), service]


def keep_immutable(rendered: dict[str, Any], existing: dict[str, Any] | None) -> dict[str, Any]:
    """`rendered` as it can be applied over `existing`: the fields the API server refuses to change keep their
    values (a new model's claim size, say: the pods keep their claims and the weights on them). The spec-hash
    annotation stays the render's, so the next reconcile finds the StatefulSet as rendered and applies nothing."""
    if existing is None:
        return rendered
    out = copy.deepcopy(rendered)
    before = existing.get("spec") or {}
    for field in IMMUTABLE_FIELDS:
        if field in before:
            out["spec"][field] = copy.deepcopy(before[field])
    return out
