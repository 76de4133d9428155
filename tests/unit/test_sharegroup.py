"""A share group seen from one member's reconcile (sharegroup.py + reconcile): the member's share of the group's
plan, its children on the shared GPU (DRA claim or time-sliced node), the group's record first, the start order, and
the refusals."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
import pytest

from vllm_operator import reconcile, sharegroup
from vllm_operator.modelfiles import find_in_catalog
from vllm_operator.planner.arch import ModelArch, arch_from_config
from vllm_operator.render.sharing import DRA_DEVICE_CLASS, sharing_support
from vllm_operator.sharegroup import RECORD_KEY, ShareMember, ShareObserved
from vllm_operator.sources import load_model_files

NOW = datetime(2026, 11, 27, 15, 0, tzinfo=UTC)
L40S_NODE = {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "1",
             "kubernetes.io/hostname": "gpu-a"}
SLICED = {"nvidia.com/gpu.product": "NVIDIA-L40S-SHARED", "nvidia.com/gpu.count": "1",
          "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing",
          "kubernetes.io/hostname": "gpu-a"}
MODELS = {"a": "Qwen/Qwen2.5-0.5B-Instruct", "b": "Qwen/Qwen2.5-1.5B-Instruct", "c": "meta-llama/Llama-3.2-1B-Instruct"}


def _arch(ref: str) -> ModelArch:
    files = find_in_catalog(ref)
    assert files is not None
    return arch_from_config(files.config, model_id=files.model_id, total_size=files.total_size,
                            total_size_estimated=files.total_size_estimated)


def _spec(name: str) -> dict[str, Any]:
    return {"model": {"name": MODELS[name]}, "gpu": {"product": "L40S", "share": {"group": "small"}}}


def _group(mode: str = "dra", ready: dict[str, tuple[str, ...]] | None = None,
           recorded: dict[str, Any] | None = None) -> ShareObserved:
    support = sharing_support(dra_served=mode == "dra", device_classes=[DRA_DEVICE_CLASS] if mode == "dra" else [],
                              nodes=[("gpu-a", SLICED)] if mode == "time-slicing" else [], product="NVIDIA-L40S")
    members = tuple(ShareMember(name=n, uid=f"uid-{n}", arch=_arch(ref), ready_args=(ready or {}).get(n))
                    for n, ref in MODELS.items())
    return ShareObserved(group="small", members=members, support=support, recorded=recorded)


def _desired(name: str, group: ShareObserved) -> reconcile.Desired:
    files = load_model_files(MODELS[name], offline=True)
    observed = reconcile.Observed(name=name, namespace="team", uid=f"uid-{name}", generation=1, spec=_spec(name),
                                  status={}, now=NOW, nodes=(L40S_NODE,), model_files=files, share=group)
    return reconcile.desired_state(observed)


def _conditions(desired: reconcile.Desired) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in desired.status.conditions}


def test_dra_members_get_their_share_a_claim_and_the_record_first() -> None:
    group = _group()
    plan = sharegroup.group_plan(group, _l40s(), None)
    first = plan.start_order[0]
    desired = _desired(first, group)
    assert desired.children is not None
    kinds = [c["kind"] for c in desired.children]
    assert kinds[:2] == ["ConfigMap", "ResourceClaim"] and "Deployment" in kinds
    for child in desired.children:
        kubernetes_validate.validate(child, "1.34", strict=True)
    record = json.loads(desired.children[0]["data"][RECORD_KEY])
    assert set(record["placement"]) == set(MODELS) and record["startOrder"] == plan.start_order
    deployment = next(c for c in desired.children if c["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["resourceClaims"][0]["resourceClaimName"] == desired.children[1]["metadata"]["name"]
    share = plan.member(first)
    assert share is not None
    args = pod["containers"][0]["args"]
    assert args[args.index("--gpu-memory-utilization") + 1] == str(share.utilization)
    assert deployment["spec"]["replicas"] == 1  # first in the start order: starts now
    status = desired.status.gpu.share if desired.status.gpu else None
    assert status is not None and status.mode == "dra" and len(status.members) == 3 and status.start_position == 0
    assert _conditions(desired)["GPUShared"] == ("True", "SharedByDRA")


def _l40s():  # type: ignore[no-untyped-def]
    from vllm_operator.planner.gpus import load_gpu_catalog
    return load_gpu_catalog().get("L40S")


def test_a_later_member_waits_until_the_one_before_it_serves_its_share() -> None:
    group = _group()
    plan = sharegroup.group_plan(group, _l40s(), None)
    first, second = plan.start_order[:2]
    waiting = _desired(second, group)
    deployment = next(c for c in waiting.children or [] if c["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 0
    assert _conditions(waiting)["Progressing"] == ("True", "WaitingForNeighbour")
    share = plan.member(first)
    assert share is not None
    ready = _group(ready={first: ("--gpu-memory-utilization", str(share.utilization))})
    going = _desired(second, ready)
    assert next(c for c in going.children or [] if c["kind"] == "Deployment")["spec"]["replicas"] == 1
    stale = _group(ready={first: ("--gpu-memory-utilization", "0.9")})  # Ready, but with an older, larger budget
    assert next(c for c in _desired(second, stale).children or [] if c["kind"] == "Deployment")["spec"]["replicas"] == 0


def test_time_slicing_pins_the_node_and_says_memory_is_not_isolated() -> None:
    desired = _desired("a", _group("time-slicing"))
    deployment = next(c for c in desired.children or [] if c["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"] == "gpu-a"
    status, reason = _conditions(desired)["GPUShared"]
    assert reason == "MemoryNotIsolated"
    assert "ResourceClaim" not in [c["kind"] for c in desired.children or []]


def test_without_dra_or_time_slicing_the_group_is_refused_with_what_to_install() -> None:
    desired = _desired("a", _group("none"))
    assert desired.children is None
    degraded = next(c for c in desired.status.conditions if c.type == "Degraded")
    assert degraded.reason == "GPUSharingUnavailable" and "k8s-dra-driver-gpu" in degraded.message


def test_a_service_alone_in_its_group_plans_as_without_share() -> None:
    alone = ShareObserved(group="small", members=(ShareMember(name="a", uid="uid-a", arch=_arch(MODELS["a"])),),
                          support=sharing_support(dra_served=False, device_classes=[], nodes=[]))
    files = load_model_files(MODELS["a"], offline=True)
    spec = _spec("a")
    shared = reconcile.desired_state(reconcile.Observed(
        name="a", namespace="team", uid="uid-a", generation=1, spec=spec, status={}, now=NOW, nodes=(L40S_NODE,),
        model_files=files, share=alone))
    plain = dict(spec, gpu={"product": "L40S"})
    without = reconcile.desired_state(reconcile.Observed(
        name="a", namespace="team", uid="uid-a", generation=1, spec=plain, status={}, now=NOW, nodes=(L40S_NODE,),
        model_files=files))
    assert shared.status.plan is not None and without.status.plan is not None
    assert shared.status.plan.args == without.status.plan.args


@pytest.mark.parametrize("stored", [{RECORD_KEY: "not json"}, {RECORD_KEY: json.dumps({"placement": {"a": "x"}})}])
def test_a_damaged_record_is_ignored(stored: dict[str, Any]) -> None:
    desired = _desired("a", _group(recorded=stored))
    assert desired.children is not None


def test_a_member_that_grows_waits_for_a_neighbour_still_above_its_share_which_restarts_at_once() -> None:
    group = _group()
    plan = sharegroup.group_plan(group, _l40s(), None)
    first, second = plan.start_order[:2]
    placed = {RECORD_KEY: json.dumps({"placement": {n: 0 for n in MODELS}})}
    a, b = plan.member(first), plan.member(second)
    assert a is not None and b is not None
    # `second` runs a larger budget than its share (the group changed); `first` runs less than its share
    running = {first: ("--gpu-memory-utilization", str(round(a.utilization - 0.05, 3))),
               second: ("--gpu-memory-utilization", str(round(b.utilization + 0.05, 3)))}
    changed = _group(ready=running, recorded=placed)
    grows = sharegroup.decide(changed, first, "team", _l40s(), None)
    assert grows.waiting_for == second  # first in the order, but it waits for the neighbour to come down
    shrinks = sharegroup.decide(changed, second, "team", _l40s(), None)
    assert shrinks.waiting_for is None  # its new budget fits in what it frees: no wait, so no circle


def test_a_member_under_remediation_never_takes_its_neighbours_shares() -> None:
    from vllm_operator.planner.plan import Constraints

    first = sharegroup.group_plan(_group(), _l40s(), None)
    record = {RECORD_KEY: json.dumps({"placement": {m.name: m.gpu_index for g in first.gpus for m in g.members},
                                      "utilization": {m.name: m.utilization for g in first.gpus for m in g.members}})}
    members = tuple(ShareMember(name=n, uid=f"uid-{n}", arch=_arch(ref),
                                constraints=Constraints(extra_activation_gib=6.0) if n == "b" else Constraints())
                    for n, ref in MODELS.items())
    group = ShareObserved(group="small", members=members, support=_group().support, recorded=record)
    after = sharegroup.group_plan(group, _l40s(), None)
    for name in ("a", "c"):
        before, now = first.member(name), after.member(name)
        assert before is not None and now is not None
        assert (now.gpu_index, now.utilization) == (before.gpu_index, before.utilization)
    b_before, b_now = first.member("b"), after.member("b")
    assert b_before is not None and b_now is not None
    assert b_now.gpu_index != b_before.gpu_index or b_now.utilization > b_before.utilization
    assert b_now.workload_budget_gib > b_before.workload_budget_gib  # the learned activation is planned for


def test_a_free_memory_failure_is_read_against_the_neighbours() -> None:
    from vllm_operator.planner.plan import Constraints

    plan = sharegroup.group_plan(_group(), _l40s(), None)
    first, second = plan.start_order[:2]
    a = plan.member(first)
    assert a is not None
    members = tuple(ShareMember(
        name=n, uid=f"uid-{n}", arch=_arch(ref),
        ready_args=("--gpu-memory-utilization", str(round(a.utilization + 0.2, 3))) if n == first else None,
        constraints=Constraints(gpu_free_gib=3.0) if n == second else Constraints()) for n, ref in MODELS.items())
    group = ShareObserved(group="small", members=members, support=_group().support)
    decision = sharegroup.decide(group, second, "team", _l40s(), None)
    assert decision.condition is not None and f"neighbour {first} still runs" in decision.condition[2]


def test_members_beyond_the_limit_are_told_why_they_have_no_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sharegroup, "MAX_MEMBERS", 2)
    desired = _desired("c", _group())
    degraded = next(c for c in desired.status.conditions if c.type == "Degraded")
    assert degraded.reason == "ShareDoesNotFit" and "more than 2 members" in degraded.message


def test_members_naming_different_gpu_products_are_refused() -> None:
    base = _group()
    members = tuple(ShareMember(name=m.name, uid=m.uid, arch=m.arch, product="L40S" if m.name == "a" else "H100")
                    for m in base.members)
    decision = sharegroup.decide(ShareObserved(group="small", members=members, support=base.support), "a", "team",
                                 _l40s(), None)
    assert decision.refusal is not None and "different GPU products" in decision.refusal[1]


def test_a_member_asking_for_more_than_one_pod_is_refused() -> None:
    files = load_model_files(MODELS["a"], offline=True)
    spec = {**_spec("a"), "replicas": 2}
    desired = reconcile.desired_state(reconcile.Observed(
        name="a", namespace="team", uid="uid-a", generation=1, spec=spec, status={}, now=NOW, nodes=(L40S_NODE,),
        model_files=files, share=_group()))
    degraded = next(c for c in desired.status.conditions if c.type == "Degraded")
    assert desired.children is None and degraded.reason == "ShareDoesNotFit" and "one pod" in degraded.message
