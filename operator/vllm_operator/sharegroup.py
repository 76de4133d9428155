"""A share group seen from one member's reconcile (issue 26): the group's plan, this member's part of it, and what
its children become (pure).

The shell (handlers/share.py) observes the group once per reconcile — every VLLMService of the namespace naming the
same `spec.gpu.share.group`, their model architectures, how the cluster can share a GPU, and the group's record —
and `reconcile` calls `decide` after planning the member alone. Every member computes the same group plan from the
same observation, so they agree without talking to each other; the plan is written as the group's record (a
ConfigMap, the first child applied, so it is recorded before any pod changes) and in each member's
`status.gpu.share`.

Start order: a member's pods run only once every member before it on its GPU (the plan's `start_order`) is Ready
with its planned share — until then its Deployment has 0 replicas and its Progressing condition says which
neighbour it waits for.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .api import conditions as cond
from .api.v1alpha1 import PinnedFlags, ShareMemberStatus, ShareStatus
from .modelfiles import ModelFiles
from .planner.arch import ArchError, ModelArch, arch_from_config, check_arch_bounds
from .planner.gpus import GPUSpec
from .planner.packing import GroupPlan, MemberShare, PackMember, PackRequest, pack
from .planner.plan import Constraints, Plan, Workload
from .remediation.neighbours import (
    explain_free_memory,
    neighbour_to_move,
    no_room_message,
    workload_footprint,
)
from .render.manifests import ANNOTATION_SPEC_HASH, spec_hash
from .render.names import dns1123_subdomain, label_value
from .render.sharing import (
    GROUP_LABEL,
    MANAGED_BY,
    SharingSupport,
    build_resource_claim,
    claim_name,
    on_time_sliced_node,
    time_slicing_nodes,
    with_claim,
)

#: The group's record: one ConfigMap per group, data key RECORD_KEY.
RECORD_KEY = "plan.json"
#: Members beyond this are not planned (bounded work per reconcile); they are told so.
MAX_MEMBERS = 32
#: Group plans remembered (each member of a group reconciles with the same inputs: one computation serves all).
MEMO_SIZE = 64
_memo: OrderedDict[str, GroupPlan] = OrderedDict()
_memo_lock = threading.Lock()


@dataclass(frozen=True)
class ShareMember:
    """One member of the group as observed: what its plan needs, and whether it serves its recorded share."""

    name: str
    uid: str
    arch: ModelArch | None               # None: its model could not be read (it is left out, and says so itself)
    workload: Workload = field(default_factory=Workload)
    pinned: PinnedFlags = field(default_factory=PinnedFlags)
    memory_gib: float | None = None
    ready_args: tuple[str, ...] | None = None  # its pods' args when every pod of its Deployment's template is Ready
    busy: bool = False  # its Deployment has pods that are not settled (starting, rolling): they may hold anything
    constraints: Constraints = field(default_factory=Constraints)  # what the remediation ladder learned about it
    product: str | None = None  # its spec.gpu.product: the members of a group share one pool


@dataclass(frozen=True)
class ShareObserved:
    group: str
    members: tuple[ShareMember, ...]
    support: SharingSupport
    gpus: int | None = None                          # GPUs the pool has for the group (None: as many as needed)
    recorded: Mapping[str, Any] | None = None        # the group's record as stored (for stable placement)


@dataclass
class ShareDecision:
    """This member's part of the group's plan, or why it has none."""

    group: GroupPlan | None
    share: MemberShare | None
    status: ShareStatus
    refusal: tuple[str, str] | None = None           # (reason, message): no children
    waiting_for: str | None = None                    # a neighbour earlier in the start order that is not Ready yet
    keeps_pods: bool = False                          # while it waits, its running pods (and Deployment) stay as they are
    condition: tuple[str, str, str] | None = None     # ('True', reason, message) of GPUShared
    extra_children: list[dict[str, Any]] = field(default_factory=list)  # the record first, then the claim

    @property
    def plan(self) -> Plan | None:
        return self.share.plan if self.share is not None else None


def record_name(group: str) -> str:
    return dns1123_subdomain(f"vllm-share-{group}")


def _previous(recorded: Mapping[str, Any] | None) -> tuple[dict[str, int], dict[int, str]]:
    """Member → GPU index and GPU index → node, from the group's record (tolerant of anything stored there)."""
    placed: dict[str, int] = {}
    nodes: dict[int, str] = {}
    try:
        doc = json.loads(str((recorded or {}).get(RECORD_KEY) or "{}"))
        for name, index in dict(doc.get("placement") or {}).items():
            if isinstance(index, int):
                placed[str(name)] = index
        for index, node in dict(doc.get("nodes") or {}).items():
            nodes[int(index)] = str(node)
    except (ValueError, TypeError, AttributeError):
        return {}, {}
    return placed, nodes


def _recorded_utilization(recorded: Mapping[str, Any] | None) -> dict[str, float]:
    try:
        doc = json.loads(str((recorded or {}).get(RECORD_KEY) or "{}"))
        return {str(k): float(v) for k, v in dict(doc.get("utilization") or {}).items()
                if isinstance(v, (int, float)) and 0 < v <= 1}
    except (ValueError, TypeError, AttributeError):
        return {}


def _pack_member(m: ShareMember, recorded: Mapping[str, float], gpu: GPUSpec, *, fixed: bool) -> PackMember:
    """The member for the packing. While a neighbour is under remediation (the ladder learned something about it),
    a member keeps the budget recorded for it: no step raises one member's budget into another's share."""
    memory = m.memory_gib
    if fixed and memory is None and m.name in recorded:
        memory = recorded[m.name] * gpu.reported_gib + 1e-6
    assert m.arch is not None
    return PackMember(name=m.name, arch=m.arch, workload=m.workload, pinned=m.pinned, memory_gib=memory,
                      constraints=m.constraints)


def group_plan(observed: ShareObserved, gpu: GPUSpec, version: str | None) -> GroupPlan:
    """The group's plan from what every member needs (members whose model could not be read are left out)."""
    placed, _ = _previous(observed.recorded)
    recorded = _recorded_utilization(observed.recorded)
    remediated = [m.name for m in observed.members if m.constraints != Constraints()]
    members = tuple(_pack_member(m, recorded, gpu, fixed=bool(remediated) and m.name not in remediated)
                    for m in sorted(observed.members, key=lambda m: m.name)[:MAX_MEMBERS] if m.arch is not None)
    request = PackRequest(group=observed.group, gpu=gpu, members=members, gpus=observed.gpus, vllm_version=version,
                          previous=placed, grown=remediated[0] if len(remediated) == 1 else None)
    key = request.model_dump_json()  # every member's architecture, workload, pins and the placement recorded
    with _memo_lock:
        hit = _memo.get(key)
        if hit is not None:
            _memo.move_to_end(key)
            return hit
    result = pack(request)
    with _memo_lock:
        _memo[key] = result
        while len(_memo) > MEMO_SIZE:
            _memo.popitem(last=False)
    return result


def _record(observed: ShareObserved, plan: GroupPlan, namespace: str, nodes: Mapping[int, str]) -> dict[str, Any]:
    doc = {"group": plan.group, "gpu": plan.gpu,
           "placement": {m.name: m.gpu_index for g in plan.gpus for m in g.members},
           "utilization": {m.name: m.utilization for g in plan.gpus for m in g.members},
           "startOrder": plan.start_order, "nodes": {str(k): v for k, v in sorted(nodes.items())},
           "unplaced": {u.name: u.reason for u in plan.unplaced}, "mode": observed.support.mode}
    owners = [{"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService", "name": m.name, "uid": m.uid,
               "controller": False, "blockOwnerDeletion": False} for m in sorted(observed.members, key=lambda m: m.name)]
    data = {RECORD_KEY: json.dumps(doc, sort_keys=True)}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": record_name(observed.group), "namespace": namespace,
                         "labels": {**MANAGED_BY, GROUP_LABEL: label_value(observed.group)},
                         "annotations": {ANNOTATION_SPEC_HASH: spec_hash(data)}, "ownerReferences": owners},
            "data": data}


def _running(member: ShareMember) -> float | None:
    """The utilization the member's Ready pods run with (None: no Ready pod, or args without it)."""
    if member.ready_args is None:
        return None
    args = list(member.ready_args)
    try:
        return float(args[args.index("--gpu-memory-utilization") + 1])
    except (ValueError, IndexError):
        return None


def _serves(member: ShareMember, share: MemberShare) -> bool:
    """The member's Ready pods run its planned share (the utilization is the share)."""
    running = _running(member)
    return running is not None and abs(running - share.utilization) < 1e-9


def _waits_for(me: str, order: Sequence[str], plan: GroupPlan, by_name: Mapping[str, ShareMember],
               before: Mapping[str, int]) -> str | None:
    """Who this member waits for before its pods run, or None. A member that keeps or lowers its budget restarts at
    once (its new budget fits in what it frees). One that is new or grows waits until every neighbour still running
    above its share has come down, then for every member before it in the start order to serve its share — so no
    start meets a neighbour holding more than the plan gives it, and nothing waits in a circle."""
    mine = shared_member(plan, me)
    running = _running(by_name[me]) if me in by_name else None
    stays = before.get(me) == mine.gpu_index
    if stays and running is not None and running >= mine.utilization - 1e-9:
        return None
    for name, index in sorted(before.items()):  # moved off this GPU: its old pod holds memory here until it moves
        now = plan.member(name)
        if name != me and index == mine.gpu_index and now is not None and now.gpu_index != index \
                and name in by_name and not _serves(by_name[name], now):
            return name
    for name in order:
        other = by_name.get(name)
        theirs = _running(other) if other is not None else None
        if name != me and other is not None and (other.busy or (
                theirs is not None and theirs > shared_member(plan, name).utilization + 1e-9)):
            return name  # still holds more than its share, or its pods are starting
    return next((n for n in order[:order.index(me)] if n in by_name and not _serves(by_name[n], shared_member(plan, n))),
                None)


def decide(observed: ShareObserved, me: str, namespace: str, gpu: GPUSpec, version: str | None) -> ShareDecision:
    """This member's part of the group's plan: its share, its GPU's claim or node, the record, and whether it waits."""
    support = observed.support
    empty = ShareStatus(group=observed.group)
    if support.mode is None:
        return ShareDecision(group=None, share=None, status=empty.model_copy(update={"message": support.message}),
                             refusal=(cond.GPU_SHARING_UNAVAILABLE, support.message))
    products = sorted({m.product or "" for m in observed.members})
    if len(products) > 1:
        message = (f"the members of share group {observed.group} name different GPU products "
                   f"({', '.join(p or 'unset' for p in products)}); a group shares GPUs of one pool: give them one "
                   "spec.gpu.product")
        return ShareDecision(group=None, share=None, status=empty.model_copy(update={"message": message}),
                             refusal=(cond.SHARE_DOES_NOT_FIT, message))
    plan = group_plan(observed, gpu, version)
    placed_before, nodes_before = _previous(observed.recorded)
    used = [g for g in plan.gpus if g.members]
    nodes: dict[int, str] = {}
    if support.mode == "time-slicing":
        found = time_slicing_nodes(len(plan.gpus), support.nodes, nodes_before)
        if found is None:
            message = (f"the group needs {len(used)} shared GPU(s) and only {len(support.nodes)} single-GPU "
                       f"time-sliced node(s) offer one ({', '.join(support.nodes)}); add nodes or cap the group")
            return ShareDecision(group=plan, share=None, status=empty.model_copy(update={"message": message}),
                                 refusal=(cond.GPU_SHARING_UNAVAILABLE, message))
        nodes = found
    record = _record(observed, plan, namespace, nodes)
    share = plan.member(me)
    if share is None:
        ranked = [m.name for m in sorted(observed.members, key=lambda m: m.name)]
        default = (f"the group has more than {MAX_MEMBERS} members; only the first {MAX_MEMBERS} by name are planned"
                   if me in ranked[MAX_MEMBERS:] else "its model could not be read")
        unplaced = next((u for u in plan.unplaced if u.name == me), None)
        why = unplaced.reason if unplaced is not None else default
        message = f"{me} has no place in share group {observed.group}: {why}"
        before = placed_before.get(me)
        if unplaced is not None and unplaced.footprint_gib is not None and before is not None \
                and before < len(plan.gpus):
            # it had a GPU: say which neighbour's move would make room there (remediation/neighbours.py); the
            # group is planned again, so what a neighbour frees is what its workload needs (the leftover is re-shared)
            sizes = {m.name: workload_footprint(m) for m in plan.gpus[before].members}
            room = plan.gpu_total_gib - plan.margin_gib - sum(sizes.values())
            move = neighbour_to_move(sizes, room, unplaced.footprint_gib)
            message += "; " + no_room_message(me, before, room, unplaced.footprint_gib, move)
        return ShareDecision(group=plan, share=None, status=empty.model_copy(update={"message": message}),
                             refusal=(cond.SHARE_DOES_NOT_FIT, message), extra_children=[record])
    shared = plan.gpus[share.gpu_index]
    order = plan.start_order_of([m.name for m in shared.members])
    by_name = {m.name: m for m in observed.members}
    waiting = _waits_for(me, order, plan, by_name, placed_before)
    status = ShareStatus(
        group=observed.group, gpu_index=share.gpu_index, mode=support.mode,
        claim=claim_name(observed.group, share.gpu_index) if support.mode == "dra" else None,
        node=nodes.get(share.gpu_index), gpu_total_gib=plan.gpu_total_gib, free_gib=shared.free_gib,
        members=[ShareMemberStatus(name=m.name, utilization=m.utilization, budgetGiB=m.budget_gib,
                                   footprintGiB=m.footprint_gib)
                 for m in sorted(shared.members, key=lambda m: order.index(m.name))],
        start_position=order.index(me))
    extra = [record]
    if support.mode == "dra":
        owners = [{"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService", "name": m.name,
                   "uid": by_name[m.name].uid} for m in shared.members if m.name in by_name]
        extra.append(build_resource_claim(group=observed.group, gpu_index=share.gpu_index, namespace=namespace,
                                          owners=owners))
        condition = ("True", cond.SHARED_BY_DRA,
                     f"GPU {share.gpu_index} of share group {observed.group} (ResourceClaim {status.claim}) with "
                     f"{', '.join(n for n in order if n != me) or 'no other member'}: budget "
                     f"{share.budget_gib:.2f} GiB; compute and memory bandwidth are shared")
    else:
        condition = ("True", cond.MEMORY_NOT_ISOLATED,
                     f"GPU {share.gpu_index} of share group {observed.group} on time-sliced node {status.node} with "
                     f"{', '.join(n for n in order if n != me) or 'no other member'}: time-slicing isolates no "
                     f"memory — vLLM keeps to its budget of {share.budget_gib:.2f} GiB, nothing enforces it")
    mine_now = by_name.get(me)
    free = mine_now.constraints.gpu_free_gib if mine_now is not None else None
    if free is not None:  # a start saw less free memory than planned: read it against the neighbours
        running = {n: u for n, u in ((m.name, _running(m)) for m in observed.members) if u is not None}
        told = explain_free_memory(plan, me, free, running)
        if told is not None:
            condition = (condition[0], condition[1], condition[2] + "; " + told.message)
    moved = placed_before.get(me)
    if moved is not None and moved != share.gpu_index:
        condition = (condition[0], condition[1], condition[2] + f" (moved from GPU {moved})")
    mine = by_name.get(me)
    keeps = mine is not None and (mine.ready_args is not None or mine.busy)
    return ShareDecision(group=plan, share=share, status=status, waiting_for=waiting, condition=condition,
                         extra_children=extra, keeps_pods=keeps)


def shared_member(plan: GroupPlan, name: str) -> MemberShare:
    found = plan.member(name)
    assert found is not None
    return found


def shared_children(children: Sequence[Mapping[str, Any]], decision: ShareDecision,
                    group: str) -> list[dict[str, Any]]:
    """The member's children with its Deployment on the shared GPU (claim or node), held at 0 replicas while it
    waits for a neighbour; the group's record and the claim first, so they are written before any pod changes."""
    share = decision.share
    assert share is not None
    out: list[dict[str, Any]] = [dict(c) for c in decision.extra_children]
    for child in children:
        if child.get("kind") == "Deployment":
            if decision.status.mode == "dra":
                child = with_claim(child, group=group, gpu_index=share.gpu_index)
            else:
                child = on_time_sliced_node(child, group=group, gpu_index=share.gpu_index,
                                            node=str(decision.status.node))
            if decision.waiting_for is not None and decision.keeps_pods:
                continue  # its pods run the budget they started with until it may change: its Deployment stays
            if decision.waiting_for is not None:
                child["spec"]["replicas"] = 0
            child["metadata"].setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = spec_hash(child["spec"])
        out.append(dict(child))
    return out


def running_args(deployment: Mapping[str, Any] | None) -> tuple[tuple[str, ...] | None, bool]:
    """(the vLLM args its pods run, when every pod of the Deployment's current template is Ready; whether it has pods
    that are not settled) — read from the member's Deployment, not from its status (which shows the plan)."""
    if not deployment:
        return None, False
    meta, spec, status = (deployment.get("metadata") or {}, deployment.get("spec") or {},
                          deployment.get("status") or {})
    containers = (((spec.get("template") or {}).get("spec") or {}).get("containers")) or []
    vllm = next((c for c in containers if isinstance(c, Mapping) and c.get("name") == "vllm"), None)
    args = tuple(str(a) for a in (vllm or {}).get("args") or [])
    want = int(spec.get("replicas") or 0)
    counts = [int(status.get(k) or 0) for k in ("replicas", "updatedReplicas", "readyReplicas")]
    current = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 1)
    settled = current and want >= 1 and counts == [want, want, want]
    return (args if settled else None), (counts[0] > 0 and not settled)


def member_from(name: str, uid: str, spec: Mapping[str, Any], deployment: Mapping[str, Any] | None,
                files: ModelFiles | None, status: Mapping[str, Any] | None = None) -> ShareMember:
    """One member as the group's plan needs it, from the VLLMService as stored and its Deployment (a spec the API
    would refuse, or a model that cannot be read, gives a member without an architecture: left out of the plan)."""
    from .api.v1alpha1 import parse_spec, validate_spec

    ready, busy = running_args(deployment)
    if validate_spec(dict(spec)) or files is None:
        return ShareMember(name=name, uid=uid, arch=None, ready_args=ready, busy=busy)
    parsed = parse_spec(dict(spec))
    try:
        check_arch_bounds(files.config, model_id=parsed.model.name)
        arch = arch_from_config(files.config, model_id=parsed.model.name,
                                total_size=parsed.model.weights_bytes() or files.total_size,
                                total_size_estimated=files.total_size_estimated)
    except (ArchError, ValueError, TypeError, ArithmeticError, AttributeError, KeyError):
        return ShareMember(name=name, uid=uid, arch=None, ready_args=ready, busy=busy)
    pinned = parsed.flags.model_copy(update={"trust_remote_code": None})
    workload = Workload(context_length=parsed.workload.context_length, concurrency=parsed.workload.concurrency)
    share = parsed.gpu.share
    return ShareMember(name=name, uid=uid, arch=arch, workload=workload, pinned=pinned,
                       memory_gib=share.memory_gib if share else None, ready_args=ready, busy=busy,
                       constraints=learned_constraints(status or {}), product=parsed.gpu.product)


def learned_constraints(status: Mapping[str, Any]) -> Constraints:
    """The remediation ladder's learned limits (status.remediation.profile), as the reconcile reads them."""
    from .api.v1alpha1 import flags_from_api

    profile = flags_from_api((status.get("remediation") or {}).get("profile")) or {}
    try:
        return Constraints(**{k: v for k, v in profile.items() if k in Constraints.model_fields})
    except ValueError:
        return Constraints()
