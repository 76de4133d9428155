"""Will the new pod of an edit find a GPU before the serving pod goes? Pure: nodes and pods in, a decision out.

A rollout that cannot surge (a ReadWriteOnce model cache: the new pod must wait for the serving pod to let go of the
claim) stops the serving pod first. When the new pod then cannot be scheduled (an edit onto a pool without a free
GPU), the service is down until someone frees one. `decide` is asked before such a rollout of a serving Deployment,
or of a serving LeaderWorkerSet (it rolls a group at a time without surge, `maxSurge: 0`: a group is deleted
before its replacement starts, and the new group needs a node for each of its pods):

- `proceed`: nothing to protect (no serving pod, the template unchanged, or the rollout surges: the serving pods
  stay until the new ones are Ready);
- `interrupt`: the new pod fits on a node of its pool (counting the GPUs the serving pods free on their nodes), but
  the service is unavailable between the old pod stopping and the new one Ready — said before it starts;
- `hold`: no node of the new pod's pool has the GPUs it asks for (for a group: fewer such nodes than the group has
  pods): the old template keeps serving, and the condition says what would let the rollout proceed.

A LeaderWorkerSet with more than one group ready keeps serving while one group rolls: it proceeds unsaid when the new
group fits (the GPUs freed are those of the group the rollout replaces first, `own_pods`). A StatefulSet (a claim per
pod without LeaderWorkerSet) rolls the same way, one pod at a time from the highest ordinal and never with a surge:
with one pod every rollout interrupts service (said before it starts); with more the others serve.

`decide_switch` is asked before a switch between workload kinds creates its new workload beside the serving one
(make before break): as many of its pods (groups) as now serve must fit beside the serving pods, which stay until the
new workload serves as many; when they cannot, the switch would wait forever, serving but never converging, so it is
held with the previous workload kept.

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

__all__ = ["Placement", "decide", "decide_switch", "free_gpus", "pod_template", "surges_any", "template_gpus"]

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


def _is_group(workload: Mapping[str, Any]) -> bool:
    return workload.get("kind") == "LeaderWorkerSet"


def _group(workload: Mapping[str, Any]) -> Mapping[str, Any]:
    return (workload.get("spec") or {}).get("leaderWorkerTemplate") or {}


def group_size(workload: Mapping[str, Any]) -> int:
    """The pods one replica runs: a LeaderWorkerSet's group size, 1 for a Deployment."""
    return max(_int(_group(workload).get("size") or 1), 1) if _is_group(workload) else 1


def pod_template(workload: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod template of a Deployment, or a LeaderWorkerSet's leader template (its worker template when none)."""
    if _is_group(workload):
        group = _group(workload)
        return group.get("leaderTemplate") or group.get("workerTemplate") or {}
    return (workload.get("spec") or {}).get("template") or {}


def _templates(workload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    if _is_group(workload):
        group = _group(workload)
        return [t for t in (group.get("leaderTemplate"), group.get("workerTemplate")) if isinstance(t, Mapping)]
    return [pod_template(workload)]


def surges_any(workload: Mapping[str, Any]) -> bool:
    """Whether the workload's rollout adds pods before removing old ones: a Deployment's strategy, or a
    LeaderWorkerSet's `rolloutStrategy.rollingUpdateConfiguration.maxSurge` (0 when unset, as in its API); a
    StatefulSet never does (it replaces a pod, then the next)."""
    if workload.get("kind") == "StatefulSet":
        return False
    if not _is_group(workload):
        return surges(workload)
    strategy = (workload.get("spec") or {}).get("rolloutStrategy") or {}
    surge = (strategy.get("rollingUpdateConfiguration") or {}).get("maxSurge", 0)
    return str(surge) not in ("0", "0%")


def _gpus(workload: Mapping[str, Any]) -> int:
    """The GPUs one pod asks for (the most any pod of a group asks for)."""
    return max((template_gpus(t) for t in _templates(workload)), default=0)


def _same_pods(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the desired workload starts the same pods (same plan annotation, selector, requests, group size)."""
    a, b = pod_template(current), pod_template(desired)
    plan_a = ((a.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PLAN)
    plan_b = ((b.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PLAN)
    return bool(plan_a == plan_b and (a.get("spec") or {}).get("nodeSelector") == (b.get("spec") or {})
                .get("nodeSelector") and _gpus(current) == _gpus(desired)
                and group_size(current) == group_size(desired) and _is_group(current) == _is_group(desired))


def decide(current: Mapping[str, Any] | None, desired: Mapping[str, Any], *, ready: int,
           nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
           own_pods: Sequence[str], start_seconds: float | None) -> Placement:
    """See the module docstring. `current`/`desired`: the Deployment or LeaderWorkerSet as it is and as rendered;
    `ready`: its ready replicas (pods, or groups); `nodes`: the nodes the new pod's nodeSelector allows; `pods`: the
    pods on them; `own_pods`: this service's pods that stop first (a group's: the group replaced first);
    `start_seconds`: the last measured start (status.coldStart), for the message."""
    if current is None or ready <= 0 or _same_pods(current, desired) or surges_any(desired):
        return Placement("proceed")
    need, size, group = _gpus(desired), group_size(desired), _is_group(desired)
    free = free_gpus(nodes, pods, leaving=own_pods)
    fitting, slots = _fitting(free, need)
    pool, gpus = _pool(desired), _gpus_text(need)
    if slots < size:
        seen = ", ".join(f"{n}: {max(f, 0)} free" for n, f in sorted(free.items())) or "no node matches"
        wants = (f"the new group needs {size} pods of {gpus} each on nodes of {pool} and {slots} "
                 f"{'fits' if slots == 1 else 'fit'}" if group else
                 f"the new pod needs {gpus} on a node of {pool} and none has them free")
        frees = "GPUs" if group else "a GPU"
        return Placement("hold", (
            f"{wants} ({seen}); the serving pods stay on the previous profile instead of stopping for "
            f"{'a group' if group else 'a pod'} that would stay Pending. Free {frees} in that pool (the rollout "
            "proceeds at the next reconcile), or edit the spec back"))
    stateful = desired.get("kind") == "StatefulSet"
    if (group or stateful) and ready > 1:
        return Placement("proceed")  # the other groups (pods) serve while one rolls
    downtime = f"about {int(round(start_seconds))} s, the last measured start" if start_seconds else (
        "until the new pod is Ready")
    if stateful:
        return Placement("interrupt", (
            f"the rollout stops the serving pod before its replacement starts (a StatefulSet replaces its pods one "
            f"at a time without surge: each pod's claim is ReadWriteOnce): the service is unavailable for "
            f"{downtime}; the new pod fits on {fitting[0]}"))
    if group:
        return Placement("interrupt", (
            f"the rollout stops the serving group before its replacement starts (a LeaderWorkerSet rolls without "
            f"surge): the service is unavailable for {downtime}; the new group fits on {', '.join(fitting[:size])}"))
    return Placement("interrupt", (
        f"the rollout stops the serving pod before its replacement starts (the model cache is a ReadWriteOnce claim: "
        f"one node mounts it): the service is unavailable for {downtime}; the new pod fits on {fitting[0]}"))


def _fitting(free: Mapping[str, int], need: int) -> tuple[list[str], int]:
    """The nodes with room for one pod of `need` GPUs, and how many such pods fit on them in all (a node with room
    for two takes two: the scheduler spreads nothing here)."""
    fitting = sorted(n for n, f in free.items() if f >= need)
    return fitting, (sum(free[n] // need for n in fitting) if need > 0 else len(fitting))


def _pool(workload: Mapping[str, Any]) -> str:
    selector = (pod_template(workload).get("spec") or {}).get("nodeSelector") or {}
    return ", ".join(f"{k}={v}" for k, v in sorted(selector.items())) or "any node"


def _gpus_text(need: int) -> str:
    return f"{need} GPU{'s' if need != 1 else ''}"


def decide_switch(previous: Mapping[str, Any], desired: Mapping[str, Any], *, ready: int,
                  nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], why: str) -> Placement:
    """Before a switch creates `desired` (a workload of another kind) beside `previous` (`ready` pods or groups
    serving): `proceed` when as many of its replicas as now serve — what it must serve before it takes over
    (handlers/effects.py `takes_over`), at most its own replica count — fit on the nodes its nodeSelector allows with
    every pod there staying (`pods`, the serving ones included), or nothing serves (nothing to keep); else `hold`,
    saying what would let it proceed. `why`: why the service switches (for the message)."""
    if ready <= 0:
        return Placement("proceed")
    replicas = _int((desired.get("spec") or {}).get("replicas", 1))
    wanted = max(min(replicas, ready), 1)
    need, size = _gpus(desired), group_size(desired)
    free = free_gpus(nodes, pods)
    _, slots = _fitting(free, need)
    if slots >= wanted * size:
        return Placement("proceed")
    pool, gpus = _pool(desired), _gpus_text(need)
    seen = ", ".join(f"{n}: {max(f, 0)} free" for n, f in sorted(free.items())) or "no node matches"
    unit = "group" if size > 1 else "pod"
    first = (f"{wanted} {unit}{'s' if wanted != 1 else ''} of it must serve before it takes over "
             f"({wanted * size} pod{'s' if wanted * size != 1 else ''} of {gpus} each)")
    short = max(wanted * size - slots, 1) * need
    kind, before = desired.get("kind"), previous.get("kind")
    name = (previous.get("metadata") or {}).get("name")
    return Placement("hold", (
        f"{why}, so it switches from its {before} to a {kind}, which starts beside the serving pods (make before "
        f"break): {first} on nodes of {pool}, and {slots} fit{'s' if slots == 1 else ''} ({seen}); the {before} "
        f"{name} keeps serving as it is instead of waiting for a {kind} that would stay Pending. Free {short} "
        f"GPU{'s' if short != 1 else ''} of {pool} (the switch proceeds at the next reconcile; while it is held "
        f"the {before} is not changed, its replica count included), or give the service a cache that needs no "
        "switch: spec.modelCache (a claim of its own or a ReadWriteMany one), or a StorageClass that gives "
        "ReadWriteMany claims"))
