"""Will the new pod of an edit find a GPU before the serving pod goes? Pure: nodes and pods in, a decision out.

A rollout that cannot surge (a ReadWriteOnce model cache: the new pod must wait for the serving pod to let go of the
claim) stops the serving pod first. When the new pod then cannot be scheduled (an edit onto a pool without a free
GPU), the service is down until someone frees one. `decide` is asked before such a rollout of a serving Deployment:

- `proceed`: nothing to protect (no serving pod, the template unchanged, or the rollout surges: the serving pods
  stay until the new ones are Ready);
- `interrupt`: the new pod fits on a node of its pool (counting the GPUs the serving pods free on their nodes), but
  the service is unavailable between the old pod stopping and the new one Ready — said before it starts;
- `hold`: no node of the new pod's pool has the GPUs it asks for: the old template keeps serving, and the
  condition says what would let the rollout proceed.

GPUs in use on a node are the `nvidia.com/gpu` requests of its pods that have not ended. What the operator cannot see
(pods in namespaces it does not watch) is not counted: then a rollout may still wait for a GPU, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from . import conditions as cond
from .labels import ANNOTATION_PLAN
from .rollout import GPU_RESOURCE, surges

__all__ = ["Placement", "decide", "free_gpus", "template_gpus"]

#: Condition reasons (Progressing) of the two outcomes that change what happens (api/conditions.py).
ROLLOUT_HELD, ROLLOUT_INTERRUPTS = cond.ROLLOUT_HELD, cond.ROLLOUT_INTERRUPTS
_ENDED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Placement:
    verdict: Literal["proceed", "interrupt", "hold"]
    message: str = ""


def _int(value: Any) -> int:
    try:
        return max(int(str(value)), 0)
    except (TypeError, ValueError):
        return 0


def template_gpus(template: Mapping[str, Any]) -> int:
    """The GPUs one pod of the template asks for (its containers' requests, else limits)."""
    total = 0
    for container in (template.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        total += _int((resources.get("requests") or {}).get(GPU_RESOURCE)
                      or (resources.get("limits") or {}).get(GPU_RESOURCE))
    return total


def _pod_gpus(pod: Mapping[str, Any]) -> int:
    return template_gpus({"spec": pod.get("spec") or {}})


def free_gpus(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
              leaving: Sequence[str] = ()) -> dict[str, int]:
    """GPUs free on each node: allocatable less what its pods ask for, the pods in `leaving` (by name) not
    counted (they stop before the new pod starts)."""
    used: dict[str, int] = {}
    for pod in pods:
        on = str((pod.get("spec") or {}).get("nodeName") or "")
        name = str((pod.get("metadata") or {}).get("name") or "")
        if not on or name in leaving or (pod.get("status") or {}).get("phase") in _ENDED:
            continue
        used[on] = used.get(on, 0) + _pod_gpus(pod)
    out: dict[str, int] = {}
    for node in nodes:
        meta, status = node.get("metadata") or {}, node.get("status") or {}
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        name = str(meta.get("name") or "")
        allocatable = _int((status.get("allocatable") or {}).get(GPU_RESOURCE))
        out[name] = allocatable - used.get(name, 0)
    return out


def _template(deployment: Mapping[str, Any]) -> Mapping[str, Any]:
    return (deployment.get("spec") or {}).get("template") or {}


def _same_pods(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the desired Deployment starts the same pods (same plan annotation, selector and requests)."""
    a, b = _template(current), _template(desired)
    plan_a = ((a.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PLAN)
    plan_b = ((b.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PLAN)
    return bool(plan_a == plan_b and (a.get("spec") or {}).get("nodeSelector") == (b.get("spec") or {})
                .get("nodeSelector") and template_gpus(a) == template_gpus(b))


def decide(current: Mapping[str, Any] | None, desired: Mapping[str, Any], *, ready: int,
           nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
           own_pods: Sequence[str], start_seconds: float | None) -> Placement:
    """See the module docstring. `nodes`: the nodes the new pod's nodeSelector allows; `pods`: the pods on them;
    `own_pods`: this service's pods (they stop first); `start_seconds`: the last measured start (status.coldStart),
    for the message."""
    if current is None or ready <= 0 or _same_pods(current, desired) or surges(desired):
        return Placement("proceed")
    need = template_gpus(_template(desired))
    free = free_gpus(nodes, pods, leaving=own_pods)
    fitting = sorted(n for n, f in free.items() if f >= need)
    selector = (_template(desired).get("spec") or {}).get("nodeSelector") or {}
    pool = ", ".join(f"{k}={v}" for k, v in sorted(selector.items())) or "any node"
    if not fitting:
        seen = ", ".join(f"{n}: {max(f, 0)} free" for n, f in sorted(free.items())) or "no node matches"
        return Placement("hold", (
            f"the new pod needs {need} GPU{'s' if need != 1 else ''} on a node of {pool} and none has them free "
            f"({seen}); the serving pods stay on the previous profile instead of stopping for a pod that would stay "
            "Pending. Free a GPU in that pool (the rollout proceeds at the next reconcile), or edit the spec back"))
    downtime = f"about {int(round(start_seconds))} s, the last measured start" if start_seconds else (
        "until the new pod is Ready")
    return Placement("interrupt", (
        f"the rollout stops the serving pod before its replacement starts (the model cache is a ReadWriteOnce claim: "
        f"one node mounts it): the service is unavailable for {downtime}; the new pod fits on {fitting[0]}"))
