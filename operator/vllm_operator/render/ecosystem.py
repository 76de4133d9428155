"""The optional children that plug a VLLMService into what people run (autoscaler, InferencePool), decided purely.

`ecosystem_children` returns the objects to apply, the conditions that say what was done (or why not: a CRD the
cluster does not serve), and the optional children that must go (the spec no longer asks for them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api import conditions as cond
from ..api.v1alpha1 import VLLMServiceSpec
from . import autoscaling, routing
from .cache import ENGINE_START_SECONDS, LOAD_SECONDS_PER_GIB
from .manifests import ANNOTATION_SPEC_HASH, DEFAULT_PORT, spec_hash
from .pods import ServingPods

#: The kinds a cluster may not serve, and the CRD to install.
OPTIONAL_KINDS = {"ScaledObject": "KEDA (keda.sh/v1alpha1 ScaledObject, https://keda.sh/docs/deploy/)",
                  "InferencePool": "the Gateway API Inference Extension CRDs (inference.networking.k8s.io/v1 "
                                   "InferencePool, https://gateway-api-inference-extension.sigs.k8s.io/)"}
#: Every kind this module may render (what may have to be deleted).
KINDS = ("HorizontalPodAutoscaler", "ScaledObject", "InferencePool")


@dataclass
class Extras:
    children: list[dict[str, Any]] = field(default_factory=list)
    updates: list[cond.ConditionUpdate] = field(default_factory=list)
    stale: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) to delete when present


def _hashed(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["annotations"][ANNOTATION_SPEC_HASH] = spec_hash(obj["spec"])
    return obj


def _had(conditions: Sequence[Mapping[str, Any]], type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") != cond.FALSE for c in conditions)


def ecosystem_children(*, name: str, child_name: str, namespace: str, spec: VLLMServiceSpec, owner: dict[str, Any],
                       labels: dict[str, str], pods: ServingPods, served: frozenset[str] | None,
                       conditions: Sequence[Mapping[str, Any]], checkpoint_gib: float, persistent_cache: bool,
                       cold_start: Mapping[str, Any] | None = None) -> Extras:
    """`pods`: the pods that serve the service (`render.pods.serving_pods`), which the InferencePool selects and
    the KEDA triggers query; `served`: the optional kinds the cluster serves (None: unknown, assumed served);
    `cold_start`: the measured start (status.coldStart), which the scale-from-zero figure then states instead of
    the assumed one."""
    out = Extras()

    def serves(kind: str) -> bool:
        return served is None or kind in served

    scaling = spec.autoscaling
    wanted: set[str] = set()
    if scaling is not None:
        kind = "ScaledObject" if scaling.engine == "KEDA" else "HorizontalPodAutoscaler"
        if kind == "ScaledObject" and not serves(kind):
            out.updates.append(cond.ConditionUpdate(
                cond.AUTOSCALING, cond.FALSE, cond.CRD_NOT_INSTALLED,
                f"spec.autoscaling.engine KEDA needs {OPTIONAL_KINDS[kind]}; install it, or use engine HPA. "
                f"Meanwhile spec.replicas ({spec.replicas}) holds"))
        else:
            wanted.add(kind)
            if kind == "ScaledObject":
                out.children.append(_hashed(autoscaling.build_scaled_object(
                    name=name, child_name=child_name, namespace=namespace, labels=labels, owner=owner, spec=scaling,
                    selector=pods.promql())))
            else:
                out.children.append(_hashed(autoscaling.build_hpa(
                    name=name, child_name=child_name, namespace=namespace, labels=labels, owner=owner,
                    spec=scaling)))
            message = (f"{kind} {child_name} scales spec.replicas between {scaling.min_replicas} and "
                       f"{scaling.max_replicas} on " + ", ".join(
                           f"{m.type} {m.target:g}/pod" for m in (scaling.metrics or [autoscaling.DEFAULT_METRIC]))
                       + "; the operator follows spec.replicas and only recommends")
            if scaling.min_replicas == 0:
                message += "; " + autoscaling.cold_start_message(checkpoint_gib, LOAD_SECONDS_PER_GIB,
                                                                 ENGINE_START_SECONDS, persistent_cache,
                                                                 measured=cold_start)
            out.updates.append(cond.ConditionUpdate(
                cond.AUTOSCALING, cond.TRUE,
                cond.KEDA_RENDERED if kind == "ScaledObject" else cond.HPA_RENDERED, message))
    elif _had(conditions, cond.AUTOSCALING):
        out.updates.append(cond.ConditionUpdate(cond.AUTOSCALING, cond.FALSE, cond.NOT_CONFIGURED,
                                                "spec.autoscaling is not set: spec.replicas is the pod count"))
    pool = spec.routing.inference_pool if spec.routing else None
    if pool is not None and pool.enabled:
        if not serves("InferencePool"):
            out.updates.append(cond.ConditionUpdate(
                cond.INFERENCE_POOL, cond.FALSE, cond.CRD_NOT_INSTALLED,
                f"spec.routing.inferencePool needs {OPTIONAL_KINDS['InferencePool']}; the plain Service still "
                "serves"))
        else:
            wanted.add("InferencePool")
            out.children.append(_hashed(routing.build_inference_pool(
                child_name=child_name, namespace=namespace, labels=labels, owner=owner, selector=dict(pods.match_labels),
                port=DEFAULT_PORT, spec=pool)))
            picker = (f"endpoint picker {pool.endpoint_picker.name}:{pool.endpoint_picker.port}"
                      if pool.endpoint_picker else "no endpoint picker named")
            out.updates.append(cond.ConditionUpdate(
                cond.INFERENCE_POOL, cond.TRUE, cond.INFERENCE_POOL_RENDERED,
                f"InferencePool {child_name} selects {pods.describe()} on port {DEFAULT_PORT} ({picker}); route to "
                "it from an HTTPRoute backendRef"))
    elif _had(conditions, cond.INFERENCE_POOL):
        out.updates.append(cond.ConditionUpdate(cond.INFERENCE_POOL, cond.FALSE, cond.NOT_CONFIGURED,
                                                "spec.routing.inferencePool.enabled is false"))
    # what an earlier spec asked for (its condition says so) and this one does not: delete it
    had = {"HorizontalPodAutoscaler": _had(conditions, cond.AUTOSCALING),
           "ScaledObject": _had(conditions, cond.AUTOSCALING), "InferencePool": _had(conditions, cond.INFERENCE_POOL)}
    out.stale = [(kind, child_name) for kind in KINDS if kind not in wanted and had[kind] and (
        kind == "HorizontalPodAutoscaler" or serves(kind))]
    return out
