"""Remediation beside neighbours (issue 26): a share-group member's memory failure, read against the other members of
its GPU (pure).

Two rules hold whatever the ladder decides for a member of a share group:

* a failure is read against the GPU's other members first: a free-memory failure at startup with less free than the
  group's plan leaves means a neighbour holds more than its share (it grew, or an older pod of it still runs with a
  larger budget) — the member's own budget is then not the problem, and lowering it would only starve it;
* no step raises a member's budget into another member's share. A step that needs more memory grows the member
  into what its GPU has free; else moves it to another GPU of the group's pool (one with room, or a new one the pool
  still has); else names the neighbour whose move would make room, or says the member needs a GPU of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel, Field

from ..planner.packing import GroupPlan, MemberShare, PackMember, PackRequest, Planner, pack
from ..planner.plan import plan


class ShareAction(StrEnum):
    GROW = "grow"        # more budget from what its GPU has free: neighbours unchanged
    MOVE = "move"        # to another GPU of the pool (with room, or one the pool still has)
    REPORT = "report"    # no room anywhere: the message names the neighbour to move (or asks for a GPU)
    NEIGHBOUR = "neighbour"  # a neighbour holds more than its share: not this member's failure


class ShareStep(BaseModel):
    action: ShareAction
    message: str
    gpu_index: int | None = Field(None, description="the GPU the member runs on after the step")
    neighbour: str | None = Field(None, description="the neighbour that holds too much, or whose move makes room")
    plan: GroupPlan | None = Field(None, description="the group's plan after the step (GROW, MOVE)")


def _fixed(share: MemberShare, member: PackMember, total_gib: float) -> PackMember:
    """`member` held at the budget it runs with now (its utilization exactly)."""
    return member.model_copy(update={"memory_gib": share.utilization * total_gib + 1e-6})


def explain_free_memory(group: GroupPlan, name: str, reported_free_gib: float,
                        running_utilization: Mapping[str, float]) -> ShareStep | None:
    """A startup that saw less free memory than the group's plan leaves it: which neighbour holds more than its share
    (`running_utilization`: what each neighbour's running pods were started with), or that something outside the
    group does. None when the free memory matched the plan (the member's own figures are then at fault)."""
    me = group.member(name)
    if me is None:
        return None
    neighbours = group.neighbours(name)
    planned_free = group.gpu_total_gib - sum(n.footprint_gib for n in neighbours) - (me.footprint_gib - me.budget_gib)
    missing = planned_free - reported_free_gib
    if missing <= group.margin_gib:
        return None
    over = sorted(((running_utilization[n.name] - n.utilization) * group.gpu_total_gib, n.name)
                  for n in neighbours if running_utilization.get(n.name, n.utilization) > n.utilization + 1e-9)
    if over:
        excess, culprit = over[-1]
        return ShareStep(action=ShareAction.NEIGHBOUR, neighbour=culprit, gpu_index=me.gpu_index, message=(
            f"{name} saw {reported_free_gib:.2f} GiB free at startup where the group's plan leaves it "
            f"{planned_free:.2f}: neighbour {culprit} still runs with {running_utilization[culprit]:.3f} of the GPU "
            f"({excess:.2f} GiB more than its share {next(n.utilization for n in neighbours if n.name == culprit):.3f});"
            f" {name}'s budget is kept and it starts again once {culprit} runs its planned share"))
    return ShareStep(action=ShareAction.NEIGHBOUR, gpu_index=me.gpu_index, message=(
        f"{name} saw {reported_free_gib:.2f} GiB free at startup where the group's plan leaves it {planned_free:.2f}: "
        f"{missing:.2f} GiB are held by something its neighbours' plans do not account for (a neighbour that grew "
        "beyond its budget, or a process outside the group); its budget is kept — lowering it would only take memory "
        "from it"))


def step_beside_neighbours(request: PackRequest, group: GroupPlan, name: str, grown: PackMember,
                           planner: Planner = plan) -> ShareStep:
    """The member `name` needs what `grown` asks for (a longer context, a larger workload, a learned constraint):
    grow it into its GPU's free memory, else move it, else report — every other member keeps its budget and GPU."""
    me = group.member(name)
    if me is None:
        raise ValueError(f"{name} is not placed in the group's plan")
    total = group.gpu_total_gib
    members: list[PackMember] = []
    previous: dict[str, int] = {}
    for member in request.members:
        share = group.member(member.name)
        if member.name == name:
            members.append(grown.model_copy(update={"name": name}))
        elif share is not None:
            members.append(_fixed(share, member, total))
        else:
            continue  # unplaced before: not placed by a neighbour's failure either
        if share is not None:
            previous[member.name] = share.gpu_index
    after = pack(request.model_copy(update={"members": tuple(members), "previous": previous, "grown": name}),
                 planner)
    moved = after.member(name)
    if moved is not None and moved.gpu_index == me.gpu_index:
        return ShareStep(action=ShareAction.GROW, gpu_index=me.gpu_index, plan=after, message=(
            f"{name} grows from {me.budget_gib:.2f} to {moved.budget_gib:.2f} GiB into what GPU {me.gpu_index} has "
            "free; its neighbours keep their budgets"))
    if moved is not None:
        return ShareStep(action=ShareAction.MOVE, gpu_index=moved.gpu_index, plan=after, message=(
            f"{name} needs {moved.footprint_gib:.2f} GiB and GPU {me.gpu_index} has "
            f"{max(group.gpus[me.gpu_index].free_gib - group.margin_gib, 0) + me.footprint_gib:.2f} for it beside "
            f"its neighbours' shares: it moves to GPU {moved.gpu_index} of the pool"))
    unplaced = next((u for u in after.unplaced if u.name == name), None)
    need = unplaced.footprint_gib if unplaced is not None and unplaced.footprint_gib is not None else None
    if need is None:
        why = unplaced.reason if unplaced is not None else "it no longer fits"
        return ShareStep(action=ShareAction.REPORT, gpu_index=me.gpu_index, message=(
            f"{name} cannot share a GPU with what it needs now: {why}"))
    shared = group.gpus[me.gpu_index]
    room = group.gpu_total_gib - group.margin_gib - shared.used_gib + me.footprint_gib
    candidates = sorted((n.footprint_gib, n.name) for n in group.neighbours(name) if room + n.footprint_gib >= need)
    if candidates:
        footprint, neighbour = candidates[0]
        return ShareStep(action=ShareAction.REPORT, gpu_index=me.gpu_index, neighbour=neighbour, message=(
            f"{name} needs {need:.2f} GiB; GPU {me.gpu_index} has {room:.2f} for it beside its neighbours' shares and "
            f"no GPU of the pool has room: move {neighbour} ({footprint:.2f} GiB) to another GPU, or give the pool "
            "one more GPU"))
    return ShareStep(action=ShareAction.REPORT, gpu_index=me.gpu_index, message=(
        f"{name} needs {need:.2f} GiB, more than GPU {me.gpu_index} could give it even without one of its neighbours, "
        "and no GPU of the pool has room: give it a GPU of its own (leave its share group)"))
