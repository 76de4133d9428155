"""Remediation beside neighbours (remediation/neighbours.py): a member's failure is read against its GPU's other
members, and no step raises its budget into another member's share."""

from __future__ import annotations

from vllm_operator.modelfiles import find_in_catalog
from vllm_operator.planner.arch import ModelArch, arch_from_config
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator.planner.packing import PackMember, PackRequest, pack
from vllm_operator.planner.plan import Workload
from vllm_operator.remediation.neighbours import ShareAction, explain_free_memory, step_beside_neighbours

L40S = load_gpu_catalog().get("L40S")


def _arch(ref: str) -> ModelArch:
    files = find_in_catalog(ref)
    assert files is not None
    return arch_from_config(files.config, model_id=files.model_id, total_size=files.total_size,
                            total_size_estimated=files.total_size_estimated)


def _three(gpus: int | None = None, fixed: bool = True) -> PackRequest:
    """Three small members with fixed budgets, so GPU 0 keeps free room."""
    refs = ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "meta-llama/Llama-3.2-1B-Instruct")
    return PackRequest(group="g", gpu=L40S, gpus=gpus, members=tuple(
        PackMember(name=f"m{i}", arch=_arch(ref), memory_gib=(8.0 if fixed else None)) for i, ref in enumerate(refs)))


def _budgets(group, names=("m0", "m1", "m2")):  # type: ignore[no-untyped-def]
    return {n: (group.member(n).gpu_index, group.member(n).utilization) for n in names if group.member(n)}


def test_a_member_grows_into_free_room_and_neighbours_keep_their_budgets() -> None:
    request = _three()
    group = pack(request)
    grown = request.members[1].model_copy(update={"memory_gib": None,
                                                  "workload": Workload(context_length=32768, concurrency=8)})
    step = step_beside_neighbours(request, group, "m1", grown)
    assert step.action is ShareAction.GROW and step.plan is not None
    after = _budgets(step.plan)
    assert after["m0"] == _budgets(group)["m0"] and after["m2"] == _budgets(group)["m2"]
    assert after["m1"][1] > _budgets(group)["m1"][1]


def test_a_member_that_outgrows_its_gpu_moves_and_neighbours_stay() -> None:
    request = _three(fixed=False)  # the leftover shared out: GPU 0 has no free room
    group = pack(request)
    grown = request.members[1].model_copy(update={"workload": Workload(context_length=32768, concurrency=64)})
    step = step_beside_neighbours(request, group, "m1", grown)
    assert step.action is ShareAction.MOVE and step.gpu_index == 1 and step.plan is not None
    assert _budgets(step.plan, ("m0", "m2")) == _budgets(group, ("m0", "m2"))


def test_a_capped_pool_names_the_neighbour_to_move() -> None:
    request = _three(gpus=1, fixed=False)
    group = pack(request)
    grown = request.members[1].model_copy(update={"workload": Workload(context_length=32768, concurrency=24)})
    step = step_beside_neighbours(request, group, "m1", grown)
    assert step.action is ShareAction.REPORT
    assert step.neighbour in {"m0", "m2"} and f"move {step.neighbour}" in step.message


def test_less_free_memory_than_planned_names_the_neighbour_running_a_larger_budget() -> None:
    request = _three()
    group = pack(request)
    me = group.member("m1")
    assert me is not None
    planned_free = group.gpu_total_gib - sum(n.footprint_gib for n in group.neighbours("m1")) - (
        me.footprint_gib - me.budget_gib)
    m0 = group.member("m0")
    assert m0 is not None
    step = explain_free_memory(group, "m1", planned_free - 6.0, {"m0": m0.utilization + 0.14})
    assert step is not None and step.action is ShareAction.NEIGHBOUR and step.neighbour == "m0"
    unknown = explain_free_memory(group, "m1", planned_free - 6.0, {})
    assert unknown is not None and unknown.neighbour is None and "not account for" in unknown.message
    assert explain_free_memory(group, "m1", planned_free - 0.1, {}) is None  # as planned: its own figures
