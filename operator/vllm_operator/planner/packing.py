"""Several services on one GPU: a share group's plan, by memory arithmetic (issue 26).

vLLM's `--gpu-memory-utilization` is a fraction of the GPU's *total* memory: the budget a process may fill with
weights, activation and KV cache. Outside that budget each process also holds its CUDA context, NCCL buffers, and —
on releases that do not subtract them — its CUDA graphs and Model Runner V2's headroom buffers. At startup vLLM
refuses to start when the free memory is below its budget (`request_memory`), and after the KV cache is allocated
it captures graphs in what is left. So members fit one GPU when

    Σ (budget_i + outside_i)  ≤  total − margin

and then each member's startup passes whatever order the pods start in: with every other member already running,
the free memory a member sees is total − Σ_{j≠i} footprint_j ≥ footprint_i + margin. That is checked, not assumed:
each member's final plan is the planner's own prediction with the others' footprints held (`gpu_free_gib`).

How much of the GPU each member gets (the stated rule):
1. `memoryGiB` fixes a member's budget;
2. else the member gets the smallest budget (in steps of 0.001 of the GPU) at which its own plan is *usable* —
   the planner's test: it meets the member's workload (default: 8,192 tokens of context, 4 concurrent requests) with
   CUDA graphs;
3. what is left on a GPU after every member's footprint and the margin is shared out among the members without
   `memoryGiB`, in proportion to the KV cache each needs for its workload (every member gets the same multiple of
   it).

Members are placed first-fit by footprint, largest first, keeping a member on the GPU it was on before when it
still fits there (so a new member does not move the others). A member whose plan cannot run on one GPU, or that
fits no GPU the pool has left, is listed with the reason.

Start order: during its memory profile vLLM counts any growth of the GPU's used memory as its own non-torch memory
(`memory_profiling`: non_torch = (total − free) − torch reserved), so a neighbour that loads its weights meanwhile
shrinks this member's KV cache or fails its start. Members of one GPU therefore start one at a time, in
`GroupPlan.start_order`; the operator holds a member's pods until the member before it is Ready.

Pure: no Kubernetes client, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from ..api.v1alpha1 import PinnedFlags
from .arch import ModelArch
from .gpus import DESKTOP_RESERVE_GIB, SLACK_GIB, SLACK_SHARE, GPUSpec
from .memory import init_nontorch_gib
from .plan import Constraints, Plan, PlanRequest, Workload, flags_to_args, plan

#: Utilization is planned in thousandths of the GPU's total (80 MiB on an H100): finer than vLLM needs, coarse
#: enough to print.
_STEP = 1000
_LOWEST = 10  # 0.010: below this no model plans a usable KV cache
#: The free memory a member needs to start is found to this precision (GiB).
_FREE_RESOLUTION_GIB = 1 / 64
_SETTLE_PASSES = 3

Planner = Callable[[PlanRequest], Plan]


class PackMember(BaseModel):
    """One service of a share group, as the packing needs it."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str = Field(min_length=1, max_length=253)
    arch: ModelArch
    workload: Workload = Workload()
    pinned: PinnedFlags = PinnedFlags()
    memory_gib: float | None = Field(None, gt=0, description="spec.gpu.share.memoryGiB: this member's budget")
    constraints: Constraints = Field(Constraints(), description="what the remediation ladder learned about it (the "
                                     "free memory and utilization limits excepted: on a shared GPU those are its "
                                     "neighbours', read by remediation/neighbours.py)")


class PackRequest(BaseModel):
    """A share group: its members, the GPU kind of its pool, and how many GPUs the pool has for it."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    group: str = Field(min_length=1, max_length=63)
    gpu: GPUSpec
    members: tuple[PackMember, ...]
    gpus: int | None = Field(None, ge=1, description="GPUs the group may use; None: as many as it needs")
    vllm_version: str | None = None
    previous: dict[str, int] = Field(default_factory=dict,
                                     description="member name -> the GPU index its last recorded plan gave it")
    grown: str | None = Field(None, description="a member whose needs grew: the others keep their GPUs first")


class MemberShare(BaseModel):
    """One member's share of a GPU, with its memory picture (GiB) and its plan's flags."""

    name: str
    model_id: str
    gpu_index: int
    utilization: float = Field(description="--gpu-memory-utilization: budget / the GPU's total")
    budget_gib: float = Field(description="ceil(total × utilization): what vLLM may fill")
    workload_budget_gib: float = Field(description="the smallest budget that meets the member's workload")
    outside_gib: float = Field(description="held beside the budget: CUDA context, NCCL, graphs where not budgeted")
    footprint_gib: float = Field(description="budget + outside: what the process holds once serving")
    weights_gib: float
    kv_cache_gib: float
    kv_cache_tokens: int
    max_model_len: int
    fixed: bool = Field(False, description="the budget is spec.gpu.share.memoryGiB")
    flags: dict[str, object]
    args: list[str]
    plan: Plan | None = Field(None, exclude=True, description="the member's plan at its share (not serialized)")


class SharedGPU(BaseModel):
    """One GPU of the pool and the members it holds."""

    index: int
    total_gib: float
    margin_gib: float
    members: list[MemberShare]

    @property
    def used_gib(self) -> float:
        return round(sum(m.footprint_gib for m in self.members), 2)

    @property
    def free_gib(self) -> float:
        return round(self.total_gib - self.used_gib, 2)


class Unplaced(BaseModel):
    """A member the group could not place, and why."""

    name: str
    model_id: str
    reason: str
    footprint_gib: float | None = Field(None, description="what it needs on one GPU, when it can run on one")


class GroupPlan(BaseModel):
    """The plan of one share group: which member runs on which GPU, with which flags, and in which start order."""

    group: str
    gpu: str
    gpu_total_gib: float
    margin_gib: float
    gpus: list[SharedGPU]
    unplaced: list[Unplaced]
    start_order: list[str]
    reasons: list[str]

    @property
    def fits(self) -> bool:
        return not self.unplaced

    def member(self, name: str) -> MemberShare | None:
        return next((m for g in self.gpus for m in g.members if m.name == name), None)

    def start_order_of(self, names: Sequence[str]) -> list[str]:
        """`names` in the group's start order."""
        wanted = set(names)
        return [n for n in self.start_order if n in wanted]

    def neighbours(self, name: str) -> list[MemberShare]:
        """The other members on `name`'s GPU."""
        for shared in self.gpus:
            if any(m.name == name for m in shared.members):
                return [m for m in shared.members if m.name != name]
        return []


def gpu_margin_gib(gpu: GPUSpec) -> float:
    """What a shared GPU keeps free: the slack (and desktop reserve) a service alone keeps (`safe_utilization`)."""
    total = gpu.reported_gib
    return round(DESKTOP_RESERVE_GIB.get(gpu.tier, 0.0) + SLACK_GIB + SLACK_SHARE * total, 2)


class _Sized:
    """A member with its smallest usable budget and the plan there."""

    def __init__(self, member: PackMember, util: int, result: Plan, footprint: float) -> None:
        self.member = member
        self.util = util  # thousandths
        self.plan = result
        self.footprint = footprint  # GiB held once serving, at `util`

    @property
    def kv_gib(self) -> float:
        return self.plan.memory.kv_cache_gib


def _request(member: PackMember, gpu: GPUSpec, version: str | None, util: int,
             free_gib: float | None = None, pinned: PinnedFlags | None = None) -> PlanRequest:
    base = pinned if pinned is not None else member.pinned
    learned = member.constraints.model_copy(update={"gpu_free_gib": None, "max_utilization": None,
                                                    "min_utilization": None})
    return PlanRequest(arch=member.arch, gpu=gpu, gpu_count=1, workload=member.workload, vllm_version=version,
                       pinned=base.model_copy(update={"gpu_memory_utilization": util / _STEP}),
                       gpu_free_gib=free_gib, constraints=learned)


def _frozen_flags(member: PackMember, result: Plan) -> PinnedFlags:
    """The member's pinned flags plus every flag `result` chose: replanned with these, the planner chooses nothing."""
    chosen = {name: value for name, value in result.flags.items()
              if name in PinnedFlags.model_fields and name != "speculative_config"}
    # flags the planner leaves at vLLM's default unless they decide the fit: held at what `result` runs with
    chosen.setdefault("enforce_eager", False)
    chosen.setdefault("kv_cache_dtype", "auto")
    return member.pinned.model_copy(update=chosen)


def _starts(result: Plan) -> bool:
    return result.fits and result.prediction.failure is None


def _footprint(member: PackMember, gpu: GPUSpec, version: str | None, util: int, result: Plan,
               planner: Planner) -> float:
    """The memory the member holds once serving: its CUDA context plus the least free memory (as vLLM sees it once
    its context exists) with which its plan still starts, found with the planner's own startup prediction (the
    budget, and graphs and buffers that go beside it)."""
    frozen = _frozen_flags(member, result)
    context = _context_gib(gpu)
    lo, hi = 0.0, gpu.reported_gib - context  # starts with `hi` free (`result` starts), not with `lo`
    while hi - lo > _FREE_RESOLUTION_GIB:
        mid = (lo + hi) / 2
        if _starts(planner(_request(member, gpu, version, util, free_gib=mid, pinned=frozen))):
            hi = mid
        else:
            lo = mid
    return round(hi + context, 3)


def _context_gib(gpu: GPUSpec) -> float:
    """A one-GPU vLLM's CUDA context: held before its free-memory check, so not part of what it sees free."""
    return init_nontorch_gib(1, gpu.nvlink)


def _usable_at(member: PackMember, gpu: GPUSpec, version: str | None, util: int, planner: Planner) -> Plan:
    return planner(_request(member, gpu, version, util))


def _size(member: PackMember, gpu: GPUSpec, version: str | None, planner: Planner) -> _Sized | str:
    """The member's smallest usable budget (or its memoryGiB), or why it cannot share a GPU. A 16-bit KV cache when
    the member can have one on a whole GPU (the planner would otherwise pick fp8 KV just to fit a smaller budget)."""
    if member.pinned.kv_cache_dtype is None:
        sixteen = member.model_copy(update={"pinned": member.pinned.model_copy(update={"kv_cache_dtype": "auto"})})
        sized = _size_as_given(sixteen, gpu, version, planner)
        if isinstance(sized, _Sized):
            return sized
    return _size_as_given(member, gpu, version, planner)


def _size_as_given(member: PackMember, gpu: GPUSpec, version: str | None, planner: Planner) -> _Sized | str:
    if (member.pinned.tensor_parallel_size or 1) * (member.pinned.pipeline_parallel_size or 1) * \
            (member.pinned.data_parallel_size or 1) > 1:
        return "it pins more than one GPU per replica (tensor/pipeline/data parallel); only one-GPU services share"
    total = gpu.reported_gib
    if member.memory_gib is not None:
        util = math.floor(member.memory_gib / total * _STEP)
        if util < _LOWEST or util > _STEP:
            return (f"spec.gpu.share.memoryGiB {member.memory_gib} is not between {_LOWEST / _STEP * total:.2f} "
                    f"and {total:.2f} GiB (the {gpu.name}'s total)")
        result = _usable_at(member, gpu, version, util, planner)
        if not result.usable:
            why = result.failure.message if result.failure else "its workload does not fit"
            return f"its memoryGiB {member.memory_gib} is too small: {why}"
        return _Sized(member, util, result, _footprint(member, gpu, version, util, result, planner))
    alone = planner(PlanRequest(arch=member.arch, gpu=gpu, gpu_count=1, workload=member.workload,
                                vllm_version=version, pinned=member.pinned,
                                constraints=_request(member, gpu, version, _STEP).constraints))
    if not alone.usable:
        why = f"vLLM would fail ({alone.failure.kind})" if alone.failure else "its workload does not fit"
        return (f"it does not run usably on one whole {gpu.name}: {why}; plan it alone "
                "(`vllm-operator plan`) for the GPUs it needs")
    hi = round(float(alone.flags.get("gpu_memory_utilization", 0.9)) * _STEP)
    best = _usable_at(member, gpu, version, hi, planner)
    if not best.usable:
        return f"it does not run usably on one whole {gpu.name} at utilization {hi / _STEP:.3f}"
    lo = _LOWEST - 1  # not usable (or below the floor)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        result = _usable_at(member, gpu, version, mid, planner)
        if result.usable:
            hi, best = mid, result
        else:
            lo = mid
    return _Sized(member, hi, best, _footprint(member, gpu, version, hi, best, planner))


def _place(sized: list[_Sized], capacity: float, limit: int | None, previous: dict[str, int],
           grown: str | None = None) -> tuple[list[list[_Sized]], list[tuple[_Sized, str]]]:
    """First fit, largest footprint first; members stay on their previous GPU when they still fit there, smallest
    first (so a member that grew moves rather than pushing its neighbours off; `grown` names one that did, kept only
    after every other member has kept its GPU)."""
    bins: list[list[_Sized]] = []
    left: list[tuple[_Sized, str]] = []

    def used(b: list[_Sized]) -> float:
        return sum(s.footprint for s in b)

    rest: list[_Sized] = []
    for s in sorted(sized, key=lambda s: (s.member.name == grown, s.footprint, s.member.name)):
        index = previous.get(s.member.name)
        if index is None or index < 0 or (limit is not None and index >= limit):
            rest.append(s)
            continue
        while len(bins) <= index:
            bins.append([])
        if used(bins[index]) + s.footprint <= capacity:
            bins[index].append(s)
        else:
            rest.append(s)
    for s in sorted(rest, key=lambda s: (-s.footprint, s.member.name)):
        if s.footprint > capacity:
            left.append((s, f"it needs {s.footprint:.2f} GiB, more than one GPU keeps for its members "
                            f"({capacity:.2f} GiB)"))
            continue
        target = next((b for b in bins if used(b) + s.footprint <= capacity), None)
        if target is None and (limit is None or len(bins) < limit):
            target = []
            bins.append(target)
        if target is None:
            room = max((capacity - used(b) for b in bins), default=capacity)
            left.append((s, f"it needs {s.footprint:.2f} GiB and the most any of the pool's {limit} GPU(s) has "
                            f"left is {room:.2f} GiB"))
            continue
        target.append(s)
    return bins, left


def _shares(members: list[_Sized], gpu: GPUSpec, capacity: float) -> dict[str, int]:
    """Utilization (thousandths) per member: fixed or smallest usable, plus the GPU's leftover shared out in
    proportion to the KV cache each member's workload needs."""
    total = gpu.reported_gib
    left = capacity - sum(s.footprint for s in members)
    growing = [s for s in members if s.member.memory_gib is None]
    weight = sum(max(s.kv_gib, 0.01) for s in growing)
    out: dict[str, int] = {}
    for s in members:
        extra = 0
        if s in growing and left > 0:
            extra = math.floor(left * max(s.kv_gib, 0.01) / weight / total * _STEP)
        out[s.member.name] = s.util + extra
    return out


def _share(s: _Sized, gpu: GPUSpec, version: str | None, index: int, util: int, result: Plan,
           footprint: float) -> MemberShare:
    total = gpu.reported_gib
    budget = math.ceil(total * util / _STEP * 2**30) / 2**30
    minimum = math.ceil(total * s.util / _STEP * 2**30) / 2**30
    flags = dict(result.flags)
    return MemberShare(
        name=s.member.name, model_id=s.member.arch.model_id, gpu_index=index, utilization=util / _STEP,
        budget_gib=round(budget, 2), workload_budget_gib=round(minimum, 2),
        outside_gib=round(footprint - budget, 2), footprint_gib=round(footprint, 2),
        weights_gib=result.memory.weights_gib, kv_cache_gib=result.memory.kv_cache_gib,
        kv_cache_tokens=result.prediction.kv_cache_tokens, max_model_len=int(flags.get("max_model_len", 0)),
        fixed=s.member.memory_gib is not None, flags=flags, args=flags_to_args(flags), plan=result)


def _final(members: list[_Sized], utils: dict[str, int], gpu: GPUSpec, version: str | None,
           planner: Planner, capacity: float) -> list[tuple[_Sized, int, Plan, float]] | float | None:
    """Each member's plan at its share, checked with every other member of the GPU already running. When the
    footprints overshoot `capacity` (a larger cache admits more sequences, and more CUDA graphs beside the budget on
    older releases), the overshoot in GiB; None when a member would not start."""
    sized: list[tuple[_Sized, int, Plan, float]] = []
    for s in members:
        util = utils[s.member.name]
        result = s.plan if util == s.util else _usable_at(s.member, gpu, version, util, planner)
        if not result.usable:
            return None
        footprint = s.footprint if util == s.util else _footprint(s.member, gpu, version, util, result, planner)
        sized.append((s, util, result, footprint))
    overshoot = sum(f for _, _, _, f in sized) - capacity
    if overshoot > 0:
        return overshoot
    total = gpu.reported_gib
    out: list[tuple[_Sized, int, Plan, float]] = []
    for s, util, result, footprint in sized:
        others = sum(f for t, _, _, f in sized if t is not s)
        free = total - others - _context_gib(gpu)
        checked = planner(_request(s.member, gpu, version, util, free_gib=free, pinned=_frozen_flags(s.member, result)))
        if not _starts(checked):
            return None
        out.append((s, util, result, footprint))  # the flags as planned (the check pinned vLLM's defaults too)
    return out


def _settle(members: list[_Sized], gpu: GPUSpec, version: str | None, planner: Planner,
            capacity: float) -> list[tuple[_Sized, int, Plan, float]] | None:
    """The members' final plans: the leftover shared out, less any overshoot (a few passes), else every member at
    its smallest usable budget; None when even that does not start."""
    room = capacity
    for _ in range(_SETTLE_PASSES):
        final = _final(members, _shares(members, gpu, room), gpu, version, planner, capacity)
        if not isinstance(final, float):
            return final
        room -= final + 1 / _STEP * gpu.reported_gib
    least = _final(members, {s.member.name: s.util for s in members}, gpu, version, planner, capacity)
    return None if isinstance(least, float) else least


def pack(request: PackRequest, planner: Planner = plan) -> GroupPlan:
    """The share group's plan: members placed on GPUs of the pool, each with its utilization and flags."""
    gpu = request.gpu
    version = request.vllm_version
    total = gpu.reported_gib
    margin = gpu_margin_gib(gpu)
    capacity = total - margin
    names = [m.name for m in request.members]
    if len(set(names)) != len(names):
        raise ValueError("share group members must have distinct names")
    reasons = [
        f"Members share {gpu.name} GPUs ({total:.2f} GiB each as CUDA reports it); each GPU keeps {margin:.2f} GiB "
        "free (the slack a service alone keeps) and holds members whose budgets plus what each process holds "
        "outside its budget (CUDA context, NCCL, CUDA graphs where the release does not budget them) fit the rest.",
        "Each member's budget: spec.gpu.share.memoryGiB, else the smallest that meets its workload; what a GPU has "
        "left is shared out in proportion to the KV cache each member's workload needs.",
    ]
    unplaced: list[Unplaced] = []
    sized: list[_Sized] = []
    for member in request.members:
        result = _size(member, gpu, version, planner)
        if isinstance(result, str):
            unplaced.append(Unplaced(name=member.name, model_id=member.arch.model_id, reason=result))
        else:
            sized.append(result)
    bins, left = _place(sized, capacity, request.gpus, request.previous, request.grown)
    for s, why in left:
        unplaced.append(Unplaced(name=s.member.name, model_id=s.member.arch.model_id, reason=why,
                                 footprint_gib=round(s.footprint, 2)))
    gpus: list[SharedGPU] = []
    for index, members in enumerate(bins):
        if not members:
            gpus.append(SharedGPU(index=index, total_gib=round(total, 2), margin_gib=margin, members=[]))
            continue
        final = _settle(members, gpu, version, planner, capacity)
        if final is None:
            for s in members:
                unplaced.append(Unplaced(
                    name=s.member.name, model_id=s.member.arch.model_id, footprint_gib=round(s.footprint, 2),
                    reason=f"the planner predicts a failed start with the other members of GPU {index} running"))
            gpus.append(SharedGPU(index=index, total_gib=round(total, 2), margin_gib=margin, members=[]))
            continue
        shares = [_share(s, gpu, version, index, util, result, footprint) for s, util, result, footprint in final]
        shares.sort(key=lambda m: (-m.footprint_gib, m.name))
        gpus.append(SharedGPU(index=index, total_gib=round(total, 2), margin_gib=margin, members=shares))
    order = [m.name for g in gpus for m in g.members]
    if any(len(g.members) > 1 for g in gpus):
        reasons.append(
            "Start order: vLLM counts any growth of the GPU's used memory during its memory profile as its own, so "
            "members of one GPU start one at a time, largest first (" + ", ".join(order) + "); each one's startup "
            "check was predicted with every other member of its GPU already running, so a restart in any order "
            "passes it.")
    return GroupPlan(group=request.group, gpu=gpu.name, gpu_total_gib=round(total, 2), margin_gib=margin,
                     gpus=gpus, unplaced=sorted(unplaced, key=lambda u: u.name), start_order=order, reasons=reasons)


def gpus_alone(members: Sequence[PackMember], gpu: GPUSpec, vllm_version: str | None = None,
               planner: Planner = plan) -> int:
    """GPUs the members use with one service per GPU set (the planner's own GPU count for each, alone)."""
    count = 0
    for member in members:
        result = planner(PlanRequest(arch=member.arch, gpu=gpu, gpu_count=8, workload=member.workload,
                                     vllm_version=vllm_version, pinned=member.pinned))
        count += result.gpu_count
    return count
