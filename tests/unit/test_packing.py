"""The share group's plan (planner/packing.py): budgets + what each process holds outside them fit the GPU with the
margin; every member's start is predicted with its neighbours running; what does not fit says why."""

from __future__ import annotations

import pytest

from vllm_operator.api.v1alpha1 import PinnedFlags
from vllm_operator.modelfiles import find_in_catalog
from vllm_operator.planner.arch import ModelArch, arch_from_config
from vllm_operator.planner.gpus import GPUSpec, load_gpu_catalog
from vllm_operator.planner.memory import init_nontorch_gib
from vllm_operator.planner.packing import PackMember, PackRequest, gpu_margin_gib, gpus_alone, pack
from vllm_operator.planner.plan import PlanRequest, Workload, plan


def _arch(ref: str) -> ModelArch:
    files = find_in_catalog(ref)
    assert files is not None
    return arch_from_config(files.config, model_id=files.model_id, total_size=files.total_size,
                            total_size_estimated=files.total_size_estimated)


def _gpu(name: str) -> GPUSpec:
    return load_gpu_catalog().get(name)


def _member(name: str, ref: str, **kw: object) -> PackMember:
    return PackMember(name=name, arch=_arch(ref), **kw)  # type: ignore[arg-type]


SMALL = ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "meta-llama/Llama-3.2-1B-Instruct")


def _started_with_neighbours(group, gpu: GPUSpec, members: dict[str, PackMember], version: str | None = None) -> None:
    """Every member, replanned with all its flags pinned and the rest of its GPU held by its neighbours' footprints,
    is predicted to start: the startup check passes whatever order the pods start in."""
    for shared in group.gpus:
        for m in shared.members:
            others = sum(n.footprint_gib for n in shared.members if n.name != m.name)
            free = gpu.reported_gib - others - init_nontorch_gib(1, gpu.nvlink)
            pinned = members[m.name].pinned.model_copy(update={
                k: v for k, v in m.flags.items() if k in PinnedFlags.model_fields})
            checked = plan(PlanRequest(arch=members[m.name].arch, gpu=gpu, pinned=pinned, gpu_free_gib=free,
                                       workload=members[m.name].workload, vllm_version=version))
            assert checked.fits and checked.prediction.failure is None, (m.name, checked.failure)


@pytest.mark.parametrize("version", [None, "0.11.0"])
def test_three_small_models_share_one_l40s_and_each_starts_beside_the_others(version: str | None) -> None:
    gpu = _gpu("L40S")
    members = {f"m{i}": _member(f"m{i}", ref) for i, ref in enumerate(SMALL)}
    group = pack(PackRequest(group="g", gpu=gpu, members=tuple(members.values()), vllm_version=version))
    assert group.fits and [len(g.members) for g in group.gpus] == [3]
    shared = group.gpus[0]
    assert shared.used_gib <= gpu.reported_gib - gpu_margin_gib(gpu) + 0.01
    for m in shared.members:
        assert m.footprint_gib == pytest.approx(m.budget_gib + m.outside_gib, abs=0.011)
        assert m.outside_gib >= init_nontorch_gib(1, gpu.nvlink) - 0.01  # the CUDA context is outside the budget
        assert m.budget_gib >= m.workload_budget_gib
        assert m.flags["gpu_memory_utilization"] == m.utilization
    _started_with_neighbours(group, gpu, members, version)
    assert sorted(group.start_order) == sorted(members)


def test_old_releases_book_cuda_graphs_outside_the_budget() -> None:
    gpu = _gpu("L40S")
    member = _member("a", "meta-llama/Llama-3.1-8B-Instruct")
    old = pack(PackRequest(group="g", gpu=gpu, members=(member,), vllm_version="0.11.0")).gpus[0].members[0]
    new = pack(PackRequest(group="g", gpu=gpu, members=(member,), vllm_version="0.33.0")).gpus[0].members[0]
    assert old.outside_gib > new.outside_gib + 0.1  # graphs captured beside the budget before 0.21


def test_the_smallest_budget_meets_the_workload_and_a_bigger_workload_needs_more() -> None:
    gpu = _gpu("H100")
    small = _member("a", SMALL[1], workload=Workload(context_length=4096, concurrency=2))
    large = _member("a", SMALL[1], workload=Workload(context_length=32768, concurrency=16))
    a = pack(PackRequest(group="g", gpu=gpu, members=(small,))).gpus[0].members[0]
    b = pack(PackRequest(group="g", gpu=gpu, members=(large,))).gpus[0].members[0]
    assert b.workload_budget_gib > a.workload_budget_gib
    below = plan(PlanRequest(arch=small.arch, gpu=gpu, workload=small.workload, pinned=PinnedFlags(
        gpu_memory_utilization=a.workload_budget_gib / gpu.reported_gib - 0.002, kv_cache_dtype="auto")))
    assert not below.usable  # one step less and the workload no longer fits


def test_memory_gib_fixes_a_budget_and_too_little_is_refused_with_the_reason() -> None:
    gpu = _gpu("L40S")
    fixed = _member("fixed", SMALL[1], memory_gib=8.0)
    other = _member("other", SMALL[0])
    group = pack(PackRequest(group="g", gpu=gpu, members=(fixed, other)))
    share = group.member("fixed")
    assert share is not None and share.fixed and share.budget_gib == pytest.approx(8.0, abs=0.05)
    tiny = pack(PackRequest(group="g", gpu=gpu, members=(_member("tiny", "meta-llama/Llama-3.1-8B-Instruct",
                                                                 memory_gib=10.0),)))
    assert not tiny.fits and "memoryGiB 10.0 is too small" in tiny.unplaced[0].reason


def test_members_that_do_not_fit_one_gpu_go_to_another_and_a_capped_pool_names_who_is_left() -> None:
    gpu = _gpu("L40S")
    members = tuple(_member(f"m{i}", "meta-llama/Llama-3.1-8B-Instruct") for i in range(3))
    group = pack(PackRequest(group="g", gpu=gpu, members=members))
    assert group.fits and sorted(len(g.members) for g in group.gpus) == [1, 2]
    capped = pack(PackRequest(group="g", gpu=gpu, members=members, gpus=1))
    assert [u.name for u in capped.unplaced] == ["m2"]
    assert "the most any of the pool's 1 GPU(s) has left" in capped.unplaced[0].reason
    big = pack(PackRequest(group="g", gpu=gpu, members=(_member("big", "meta-llama/Llama-3.1-70B-Instruct"),)))
    assert not big.fits and "does not run usably on one whole L40S" in big.unplaced[0].reason


def test_a_recorded_member_keeps_its_gpu_when_a_new_member_joins() -> None:
    gpu = _gpu("L40S")
    a = _member("a", "meta-llama/Llama-3.1-8B-Instruct")
    b = _member("b", SMALL[0])
    first = pack(PackRequest(group="g", gpu=gpu, members=(a, b)))
    placed = {m.name: m.gpu_index for g in first.gpus for m in g.members}
    c = _member("c", "meta-llama/Llama-3.1-8B-Instruct")
    second = pack(PackRequest(group="g", gpu=gpu, members=(a, b, c), previous=placed))
    again = {m.name: m.gpu_index for g in second.gpus for m in g.members}
    assert again["a"] == placed["a"] and again["b"] == placed["b"]


def test_packing_uses_fewer_gpus_than_one_per_service() -> None:
    gpu = _gpu("H100")
    members = tuple(_member(f"m{i}", ref) for i, ref in enumerate(SMALL + SMALL))
    group = pack(PackRequest(group="g", gpu=gpu, members=members))
    used = sum(1 for g in group.gpus if g.members)
    assert group.fits and used == 1 and gpus_alone(members, gpu) == 6


def test_multi_gpu_pins_cannot_share() -> None:
    member = _member("tp", SMALL[1], pinned=PinnedFlags(tensor_parallel_size=2))
    group = pack(PackRequest(group="g", gpu=_gpu("H100"), members=(member,)))
    assert not group.fits and "more than one GPU per replica" in group.unplaced[0].reason


def test_duplicate_names_are_refused() -> None:
    member = _member("a", SMALL[0])
    with pytest.raises(ValueError, match="distinct names"):
        pack(PackRequest(group="g", gpu=_gpu("H100"), members=(member, member)))


def test_neighbours_lists_the_others_on_the_same_gpu() -> None:
    members = tuple(_member(f"m{i}", ref) for i, ref in enumerate(SMALL))
    group = pack(PackRequest(group="g", gpu=_gpu("L40S"), members=members))
    assert sorted(n.name for n in group.neighbours("m0")) == ["m1", "m2"]
