"""Every remediation class end to end: the real `vllm-operator run` process against the simulated GPU cluster.

Each case is a VLLMService plus hidden facts (sim/startup.py's HiddenFacts, which the planner cannot see) chosen so
that the operator's first plan really fails in the startup simulator with that class; the test then asserts the
end state: Ready with which flags (and Deployment resources), or a clear verdict. All cases run concurrently in ONE
simulated cluster (compressed clock, `spec.remediation.minIntervalSeconds: 0`), so the file takes ~10 s.

Pools: 1-GPU L4 nodes for most cases, 2-GPU A10G nodes for the weights cases (tensor parallelism needs a node with
two free GPUs; the scheduler spreads 1-GPU pods, so they get a product of their own).

The last sections pin down bugs these scenarios exposed (small, deterministic tests; the open ones strict-xfail).
"""

from __future__ import annotations

import queue
import re
import urllib.request
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from scenario_kit import Case, Observed, Run, arg, replay, run_cases

from kit.catalog import catalog_arch
from vllm_operator.handlers import remediation as remediation_handlers
from vllm_operator.handlers.remediation import death_index
from vllm_operator.planner import messages
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator.remediation.classifier import classify_text
from vllm_operator.remediation.evidence import evidence_from_pod
from vllm_operator.remediation.policy import failure_key
from vllm_operator.render.manifests import OwnerRef, RenderInput, build_deployment
from vllm_operator.sources import load_model_files
from vllm_operator_sim.clock import SimClock
from vllm_operator_sim.cluster import NodePool, gpu_node
from vllm_operator_sim.demo import _Session, _Tracked, _View
from vllm_operator_sim.emulator import EmulatedAPIServer
from vllm_operator_sim.kubelet import Kubelet, ServiceStats
from vllm_operator_sim.scenarios import ScenarioSet, Traffic
from vllm_operator_sim.startup import HiddenFacts, simulate_startup, termination_message

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

L4 = "NVIDIA-L4"
A10G = "NVIDIA-A10G"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen2.5-7B-Instruct"
FAST = {"minIntervalSeconds": 0}
#: Every case ends (and the verdicts' later looks are taken) within this much simulated time. The clock is paced — it
#: stands still while the operator works — so this bounds the operator's decisions (steps, back-offs waited), not the
#: machine's speed; the run's real time is a figure (CONTRIBUTING.md), not a test.
SIM_LIMIT_S = 900.0


def _spec(model: str, product: str = L4, max_count: int = 1, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"name": model}, "gpu": {"product": product, "maxCount": max_count},
                            "remediation": dict(FAST)}
    for key, value in extra.items():
        spec[key] = {**spec[key], **value} if isinstance(spec.get(key), dict) else value
    return spec


V023 = "vllm/vllm-openai:v0.23.0"

CASES = [
    Case("kv-too-small", _spec(LLAMA), "Ready", HiddenFacts(extra_activation_gib=1.5),
         title="activation peak 1.5 GiB above the estimate: the planned 26624 tokens do not fit the KV cache"),
    Case("kv-too-small-v083", _spec(LLAMA, image="vllm/vllm-openai:v0.8.3"), "Ready",
         HiddenFacts(extra_activation_gib=1.5),
         title="the same on vLLM 0.8.3, whose message has no estimated length (only needed vs available GiB)"),
    # L4 plans at 0.92 (issue 16). max-num-seqs pinned: since issue 15 the planner books CUDA graphs for the graphs
    # vLLM captures at the planned max-num-seqs, so an unpinned plan of this workload is an fp8 one whose failed
    # start still leaves vLLM's estimate above 32768 (the ladder then just shortens the context)
    Case("kv-min-context", _spec(LLAMA, workload={"contextLength": 32768}, flags={"maxNumSeqs": 8}), "Ready",
         HiddenFacts(extra_activation_gib=1.5),
         title="vLLM's estimate is below workload.contextLength: the ladder raises utilization instead"),
    Case("free-gpu-memory", _spec(QWEN), "Ready", HiddenFacts(other_process_gib=3.0),
         title="a stale process holds 3 GiB of the GPU"),
    # the two no-kv-memory cases are tuned to the V1 model runner's budget with its CUDA-graph estimate inside it
    # (0.21-0.23 for Qwen2.5; Model Runner V2 runs it from 0.25 and books differently), so they name such a release
    # 5.1 GiB: since issue 15 the planner books fewer CUDA graphs at its small max-num-seqs (vLLM captures graphs only
    # up to 2 x max-num-seqs), so 4.8 GiB left a little KV memory (KVCacheTooSmall instead of NoKVCacheMemory)
    Case("no-kv-memory", _spec(QWEN, image=V023, flags={"maxModelLen": 4096}), "Ready",
         HiddenFacts(extra_activation_gib=5.1),
         title="activation peak 5.1 GiB above the estimate: nothing left for the KV cache at 0.92"),
    # max-num-seqs pinned at vLLM's L4 default: vLLM then captures its whole graph set (51 + 35 graphs, ~0.45 GiB
    # estimated, planner.memory.cudagraph_bytes), which --enforce-eager gives to the KV cache; with the planner's own
    # small max-num-seqs vLLM captures few graphs and eager frees too little to matter
    Case("no-kv-memory-util-pinned", _spec(QWEN, image=V023, flags={"maxModelLen": 4096, "gpuMemoryUtilization": 0.9,
                                                                    "maxNumSeqs": 256}),
         "Ready", HiddenFacts(extra_activation_gib=4.2),
         title="the same with utilization pinned: the ladder's next rung (enforce-eager)"),
    Case("weights-tp2", _spec(QWEN, A10G, max_count=2), "Ready", HiddenFacts(total_delta_gib=8.0),
         title="the driver reports 8 GiB less than the catalog: the weights do not fit one GPU"),
    Case("weights-max1", _spec(QWEN, A10G, max_count=1), "Exhausted", HiddenFacts(total_delta_gib=8.0),
         title="the same with gpu.maxCount 1: no remedy allowed"),
    Case("cuda-graphs-oom", _spec(QWEN, image="vllm/vllm-openai:v0.19.0"), "Ready",
         HiddenFacts(extra_cudagraph_gib=3.0),
         title="vLLM 0.19 captures CUDA graphs outside its budget; they take 3 GiB more than estimated"),
    Case("serving-oom", _spec(QWEN), "Ready", HiddenFacts(serving_oom_above_seqs=16),
         Traffic(concurrency=64, context=2048),
         title="Ready, then 64 concurrent requests: more than 16 running sequences run out of GPU memory"),
    Case("host-oom", _spec(QWEN), "Ready", HiddenFacts(extra_host_memory_gib=20.0),
         title="loading needs 20 GiB more host memory than usual: OOMKilled at the planned limit"),
    Case("host-oom-capped", _spec(QWEN, remediation={"maxSteps": 2}), "Exhausted",
         HiddenFacts(host_memory_limit_gib=8.0),
         title="a LimitRange caps the container at 8 GiB whatever its limit says: bounded by maxSteps"),
    Case("pinned-exhausted", _spec(LLAMA, flags={"maxModelLen": 16384, "gpuMemoryUtilization": 0.9}), "Exhausted",
         HiddenFacts(extra_activation_gib=2.5),
         title="max-model-len and utilization pinned, 2.5 GiB more activation: every remedy needs a pinned flag"),
    Case("invalid-tp", _spec(QWEN, max_count=4, flags={"tensorParallelSize": 3}), "Infeasible",
         title="tensor-parallel-size 3 pinned; Qwen2.5-7B has 28 attention heads"),
]

POOLS = [NodePool("L4", 1, nodes=14), NodePool("A10G", 2, nodes=3)]


@pytest.fixture(scope="module")
def run() -> Run:
    """All cases at once; the cluster and the operator are stopped before the first test looks."""
    return run_cases(CASES, pools=POOLS, speed=50.0)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _expect_remediated(o: Observed, classes: list[str], *, serving: bool = False) -> None:
    """Ready after steps of exactly these classes, with the history, Events and bounded failures that go with it."""
    why = o.explain()
    assert o.result.outcome == "Ready", why
    assert o.condition("Ready")["status"] == "True", why
    assert o.condition("Degraded")["status"] == "False", why
    history = o.history
    assert [h["failureClass"] for h in history] == classes, why
    assert o.remediation["step"] == len(history) and not o.remediation.get("exhausted"), why
    assert [h["step"] for h in history] == list(range(1, len(history) + 1)), why
    times = [_time(h["time"]) for h in history]
    assert times == sorted(times), why
    keys = [(h.get("podUID"), h.get("restartCount")) for h in history]
    assert all(uid and count is not None for uid, count in keys) and len(set(keys)) == len(keys), why
    for entry in history:
        assert entry["evidence"] and entry["message"], entry
        assert entry["flagsBefore"] and entry["flagsAfter"], entry
        if entry["failureClass"] != "HostOOMKilled":  # a memory limit is not a vLLM flag
            assert entry["flagsBefore"] != entry["flagsAfter"], entry
    for before, after in zip(history, history[1:], strict=False):
        assert after["flagsBefore"] == before["flagsAfter"], why
    assert history[-1]["flagsAfter"] == o.flags, why
    for cls in set(classes):
        events = o.operator_events(f"Remediated{cls}")
        assert len(events) == classes.count(cls), why
        assert all(e["type"] == "Warning" and e["message"].startswith("step ") for e in events), events
    # the first plan really failed in the simulator with the first class
    assert o.failures() and o.failures()[0] == classes[0], why
    stats = o.now.stats
    bound = 2 * len(history) + 1  # a restart may beat a rollout
    if serving:
        assert stats.failed_starts == 0 and 1 <= stats.serving_failures <= bound, why
    else:
        assert 1 <= stats.failed_starts <= bound, why
    # the Deployment runs the final plan (`auto` where it keeps the model's full context: planner/plan.py renders
    # vLLM's auto-fit there, _operator_auto)
    args = o.args()
    full = catalog_arch(o.case.spec["model"]["name"]).derived_max_model_len
    assert arg(args, "--max-model-len") == str(o.flags["maxModelLen"]) or (
        arg(args, "--max-model-len") == "auto" and o.flags["maxModelLen"] == full), args
    assert arg(args, "--gpu-memory-utilization") == str(o.flags["gpuMemoryUtilization"]), args
    assert arg(args, "--tensor-parallel-size") == str(o.flags["tensorParallelSize"]), args
    assert arg(args, "--max-num-seqs") == str(o.flags["maxNumSeqs"]), args
    assert ("--enforce-eager" in args) == bool(o.flags.get("enforceEager")), args


def _expect_verdict(o: Observed) -> dict[str, Any]:
    """Degraded=True RemediationExhausted, and nothing moved while the pods kept failing."""
    why = o.explain()
    assert o.result.outcome == "Exhausted", why
    degraded = o.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "RemediationExhausted", why
    assert o.condition("Ready")["status"] == "False", why
    assert o.remediation.get("exhausted") is True, why
    max_steps = o.case.spec["remediation"].get("maxSteps", 5)
    assert o.remediation.get("step", 0) <= max_steps, why
    assert len(o.history) == o.remediation.get("step", 0), why
    assert o.operator_events("RemediationExhausted"), why
    later = o.later
    assert later is not None, why
    assert later.stats.failed_starts >= o.now.stats.failed_starts + 2, f"the pods stopped failing?\n{why}"
    assert later.deployment is not None and o.now.deployment is not None
    assert later.deployment["metadata"]["generation"] == o.now.deployment["metadata"]["generation"], why
    assert later.deployment["spec"]["template"] == o.now.deployment["spec"]["template"], why
    status_later = later.service.get("status") or {}
    assert (status_later.get("remediation") or {}).get("step", 0) == o.remediation.get("step", 0), why
    assert (status_later.get("plan") or {}).get("flags") == o.flags, why
    assert o.condition("Degraded", later)["reason"] == "RemediationExhausted", why
    return degraded


# --- the run as a whole ------------------------------------------------------------------------------------------

def test_every_case_reaches_its_terminal_state_in_one_cluster_quickly(run: Run) -> None:
    unexpected = {name: f"{o.result.outcome} (expected {o.case.expect})" for name, o in run.observed.items()
                  if o.result.outcome != o.case.expect}
    assert not unexpected, "\n".join(run[n].explain() for n in unexpected) + "\n" + run.operator_log[-4000:]
    assert set(run.observed) == {c.name for c in CASES}
    assert not run.errors, run.errors
    assert run.sim_s < SIM_LIMIT_S, f"{run.sim_s:.0f} s simulated ({run.wall_s:.1f} s real)"


# --- KVCacheTooSmall ---------------------------------------------------------------------------------------------

def test_kv_cache_too_small_shrinks_max_model_len_to_vllms_estimate(run: Run) -> None:
    o = run["kv-too-small"]
    _expect_remediated(o, ["KVCacheTooSmall"])
    first = o.history[0]["flagsBefore"]
    failed = replay(o, first)  # the first plan, once more, in the simulator: vLLM's own estimate
    assert failed.failure_kind == "KVCacheTooSmall", failed.message
    estimate = int(re.search(r"estimated maximum model length is (\d+)", failed.message).group(1))  # type: ignore[union-attr]
    assert o.flags["maxModelLen"] < first["maxModelLen"]
    assert 0.75 * estimate <= o.flags["maxModelLen"] <= estimate, (estimate, o.flags)  # computed, not halved
    assert str(estimate) in o.history[0]["message"]
    assert {k: v for k, v in o.flags.items() if k not in ("maxModelLen", "maxNumSeqs")} == \
        {k: v for k, v in first.items() if k not in ("maxModelLen", "maxNumSeqs")}
    assert replay(o, o.flags).starts


def test_kv_cache_too_small_without_an_estimate_in_the_message_computes_one(run: Run) -> None:
    """vLLM 0.8.3 says only "(N GiB KV cache is needed, which is larger than the available KV cache memory (M
    GiB)": the ladder scales max-model-len by M/N instead of a blind halving."""
    o = run["kv-too-small-v083"]
    _expect_remediated(o, ["KVCacheTooSmall"])
    first = o.history[0]["flagsBefore"]
    failed = replay(o, first)
    assert failed.failure_kind == "KVCacheTooSmall" and "estimated maximum model length" not in failed.message
    numbers = re.search(r"\((\d+\.\d+) GiB KV cache is needed.*?\((\d+\.\d+) GiB\)", failed.message)
    assert numbers is not None, failed.message
    needed, available = float(numbers.group(1)), float(numbers.group(2))
    fits = first["maxModelLen"] * available / needed
    assert 0.75 * fits <= o.flags["maxModelLen"] <= fits, (fits, o.flags)
    assert o.flags["maxModelLen"] != first["maxModelLen"] // 2


def test_kv_cache_too_small_below_the_workload_context_raises_utilization(run: Run) -> None:
    o = run["kv-min-context"]
    classes = [h["failureClass"] for h in o.history]
    _expect_remediated(o, classes)
    assert classes and set(classes) == {"KVCacheTooSmall"}
    assert o.flags["maxModelLen"] >= 20000, o.flags
    assert o.flags["gpuMemoryUtilization"] > o.history[0]["flagsBefore"]["gpuMemoryUtilization"], o.history
    assert "workload.contextLength" in o.history[0]["message"]


def test_a_utilization_step_after_kv_cache_too_small_does_not_grow_the_context(run: Run) -> None:
    """Found by this file: the utilization step used to re-plan max-model-len UP (26624 → 35840), past the length
    vLLM had just said does not fit, so a second failed start and step were needed."""
    o = run["kv-min-context"]
    first = o.history[0]
    assert first["flagsAfter"]["maxModelLen"] <= first["flagsBefore"]["maxModelLen"], first
    # one step, and the stepped profile started: a second step would mean the new length failed too. (The failed
    # start count itself is not exact: on the compressed clock the old template's crash loop may restart once more
    # before the step rolls out when the machine is loaded.)
    assert len(o.history) == 1, o.explain()
    assert o.now.stats.failed_starts <= 2, o.explain()


# --- InsufficientFreeGPUMemory -----------------------------------------------------------------------------------

def test_insufficient_free_gpu_memory_lowers_utilization_to_what_is_free(run: Run) -> None:
    o = run["free-gpu-memory"]
    _expect_remediated(o, ["InsufficientFreeGPUMemory"])
    before = o.history[0]["flagsBefore"]
    failed = replay(o, before)
    assert failed.failure_kind == "InsufficientFreeGPUMemory"
    free, total = (float(x) for x in re.search(r"\((\d+\.\d+)/(\d+\.\d+) GiB\)", failed.message).groups())  # type: ignore[union-attr]
    util = o.flags["gpuMemoryUtilization"]
    assert util < before["gpuMemoryUtilization"] and util * total <= free, (util, free, total)
    assert o.remediation["profile"].get("gpuFreeGib") == pytest.approx(free, abs=0.01)
    assert arg(o.args(), "--gpu-memory-utilization") == str(util)


# --- NoKVCacheMemory ---------------------------------------------------------------------------------------------

def test_no_kv_cache_memory_raises_utilization(run: Run) -> None:
    o = run["no-kv-memory"]
    _expect_remediated(o, ["NoKVCacheMemory"])
    before = o.history[0]["flagsBefore"]
    assert o.flags["gpuMemoryUtilization"] > before["gpuMemoryUtilization"], o.flags
    assert o.flags["gpuMemoryUtilization"] <= 0.95
    assert o.flags["maxModelLen"] == 4096  # pinned


def test_no_kv_cache_memory_with_utilization_pinned_enforces_eager(run: Run) -> None:
    o = run["no-kv-memory-util-pinned"]
    _expect_remediated(o, ["NoKVCacheMemory"])
    assert o.flags["enforceEager"] is True and "--enforce-eager" in o.args()
    assert o.flags["gpuMemoryUtilization"] == 0.9 and o.flags["maxModelLen"] == 4096  # pinned


# --- WeightsDoNotFit ---------------------------------------------------------------------------------------------

def test_weights_that_do_not_fit_one_gpu_go_tensor_parallel_on_a_two_gpu_node(run: Run) -> None:
    o = run["weights-tp2"]
    _expect_remediated(o, ["WeightsDoNotFit"])
    assert o.history[0]["flagsBefore"]["tensorParallelSize"] == 1
    assert o.flags["tensorParallelSize"] == 2
    resources = o.container()["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "2", resources
    assert o.status["gpu"]["count"] == 2
    placed = [e for e in o.sim_events if e.kind == "scheduled"][-1]
    assert placed.details.get("gpus") == 2 and str(placed.details.get("node", "")).startswith("gpu-a10g-")


def test_weights_that_do_not_fit_with_max_count_one_end_in_a_verdict_naming_max_count(run: Run) -> None:
    o = run["weights-max1"]
    degraded = _expect_verdict(o)
    assert set(o.failures()) == {"WeightsDoNotFit"}, o.failures()
    assert "WeightsDoNotFit" in degraded["message"] and "spec.gpu.maxCount" in degraded["message"], degraded
    assert "2 GPUs" in degraded["message"], degraded
    assert o.flags["tensorParallelSize"] == 1 and o.container()["resources"]["limits"]["nvidia.com/gpu"] == "1"


# --- CUDAOOMStartup ----------------------------------------------------------------------------------------------

def test_cuda_oom_at_graph_capture_enforces_eager(run: Run) -> None:
    o = run["cuda-graphs-oom"]
    _expect_remediated(o, ["CUDAOOMStartup"])
    assert o.flags.get("enforceEager") is True and "--enforce-eager" in o.args()
    assert not o.history[0]["flagsBefore"].get("enforceEager")
    assert o.container()["image"] == "vllm/vllm-openai:v0.19.0"
    failed = replay(o, o.history[0]["flagsBefore"])
    assert failed.failure_kind == "CUDAOOMStartup" and failed.phase == "cuda_graphs", failed.phase


# --- CUDAOOMServing ----------------------------------------------------------------------------------------------

def test_cuda_oom_while_serving_lowers_max_num_seqs_until_the_traffic_is_served(run: Run) -> None:
    o = run["serving-oom"]
    steps = len(o.history)
    _expect_remediated(o, ["CUDAOOMServing"] * steps, serving=True)
    assert steps >= 1
    seqs = [o.history[0]["flagsBefore"]["maxNumSeqs"], *(h["flagsAfter"]["maxNumSeqs"] for h in o.history)]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == len(seqs), seqs
    assert seqs[0] > 16 >= o.flags["maxNumSeqs"], seqs
    assert all(f == "CUDAOOMServing" for f in o.failures()), o.failures()
    # Ready again under the same traffic: the last pod's Ready comes after the last serving failure
    last_failed = max(e.t for e in o.sim_events if e.kind == "failed")
    assert any(e.kind == "ready" and e.t > last_failed for e in o.sim_events), o.explain()


# --- HostOOMKilled -----------------------------------------------------------------------------------------------

def test_host_oom_raises_the_containers_memory_limit(run: Run) -> None:
    o = run["host-oom"]
    _expect_remediated(o, ["HostOOMKilled"])
    assert o.history[0]["flagsAfter"] == o.history[0]["flagsBefore"]  # vLLM's flags are not the problem
    assert "GiB" in o.history[0]["message"] and "→" in o.history[0]["message"]
    limit = o.memory_limit_gib()
    raised = o.remediation["profile"]["hostMemoryGib"]
    assert limit == raised, (limit, raised)
    resources = o.container()["resources"]
    assert resources["limits"]["memory"] == resources["requests"]["memory"] == f"{int(raised)}Gi", resources
    failed = replay(o, o.flags, memory_limit_gib=26.0)
    assert failed.failure_kind == "HostOOMKilled" and failed.host_peak_gib > 26.0
    assert limit is not None and limit >= failed.host_peak_gib > 26.0


def test_host_oom_under_a_limitrange_cap_stops_after_max_steps(run: Run) -> None:
    o = run["host-oom-capped"]
    degraded = _expect_verdict(o)
    assert [h["failureClass"] for h in o.history] == ["HostOOMKilled", "HostOOMKilled"]
    assert o.remediation["step"] == 2
    assert "spec.remediation.maxSteps=2" in degraded["message"], degraded
    assert len(o.operator_events("RemediatedHostOOMKilled")) == 2
    limits = [o.memory_limit_gib(), o.memory_limit_gib(o.later)]
    assert limits[0] == limits[1] == o.remediation["profile"]["hostMemoryGib"], limits


# --- pinned flags: the verdict ------------------------------------------------------------------------------------

def test_pinned_flags_that_block_every_remedy_give_a_verdict_with_a_value_that_works(run: Run) -> None:
    o = run["pinned-exhausted"]
    degraded = _expect_verdict(o)
    message = degraded["message"]
    assert "KVCacheTooSmall" in message, message
    found = re.search(r"spec\.flags\.maxModelLen to (\d+) or less", message)
    assert found is not None, message
    suggested = int(found.group(1))
    assert suggested < 16384
    assert o.history == [] and o.remediation.get("step", 0) == 0
    args = o.args(o.later)
    assert arg(args, "--max-model-len") == "16384" and arg(args, "--gpu-memory-utilization") == "0.9", args
    assert set(o.failures()) == {"KVCacheTooSmall"}
    # the value the verdict names really works (same GPU, same hidden facts)
    assert replay(o, {**o.flags, "maxModelLen": suggested}).starts
    assert not replay(o, o.flags).starts


def test_a_verdict_is_announced_once_however_often_the_pod_restarts(run: Run) -> None:
    """Found by this file: a new RemediationExhausted Event used to be posted for every restart of the crash-looping
    pod after the verdict (the README promises events only when a decision changes)."""
    for name in ("pinned-exhausted", "weights-max1"):
        o = run[name]
        assert o.later is not None and o.later.stats.failed_starts >= 3
        assert len(o.operator_events("RemediationExhausted", o.later)) == 1, (
            name, [e["message"][:80] for e in o.operator_events("RemediationExhausted", o.later)])


# --- InvalidParallelism ------------------------------------------------------------------------------------------

def test_a_pinned_tensor_parallel_size_that_does_not_divide_the_heads_is_infeasible_before_any_pod(run: Run) -> None:
    o = run["invalid-tp"]
    why = o.explain()
    assert o.result.outcome == "Infeasible", why
    feasible = o.condition("PlanFeasible")
    assert feasible["status"] == "False" and feasible["reason"] == "PlanInfeasible", feasible
    message = feasible["message"]
    assert "tensor-parallel-size" in message and "(3)" in message and "28" in message, message
    found = re.search(r"tensor-parallel-size from 3 to (\d+)", message)
    assert found is not None and 28 % int(found.group(1)) == 0, message
    assert o.condition("Ready")["status"] == "False"
    assert o.now.deployment is None and o.now.stats.pods_created == 0 and not o.sim_events
    assert not o.history and o.operator_events("PlanInfeasible")


# --- the demo's judge (sim/demo.py), which run_services and `make demo` use -----------------------------------------

class _Kubelet:
    def __init__(self) -> None:
        self.serving_failures = 0

    def send_traffic(self, *_: object) -> None:
        pass

    def stats(self, *_: object) -> ServiceStats:
        return ServiceStats(serving_failures=self.serving_failures)


def test_the_demo_judges_a_service_under_traffic_ready_only_after_it_served_it() -> None:
    """Found by this file: the demo's judge counted its stability window from the last serving failure it saw, also
    across the time the service was not Ready, so a pod Ready again after a step was judged 'Ready' at once (seen:
    serving-oom judged Ready at max-num-seqs 18, which died 4 s later)."""
    kubelet = _Kubelet()
    cluster = SimpleNamespace(kubelet=kubelet)
    scenario = Case("busy", {}, "Ready", traffic=Traffic(concurrency=64, context=2048)).scenario()
    session = _Session(cluster, [], ScenarioSet({"busy": scenario}), _View(None, 12), queue.Queue())  # type: ignore[arg-type]
    tracked = _Tracked("busy", "default", scenario, applied_at=0.0)

    def judge(now: float, ready: bool) -> str | None:
        obj = {"status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
        session._judge(tracked, ("default", "busy"), obj, now)
        return tracked.outcome

    assert judge(100.0, ready=True) is None        # Ready: traffic starts
    kubelet.serving_failures = 1                   # the pod dies of a serving OOM ...
    assert judge(105.0, ready=True) is None        # ... while the service's Ready condition is not yet updated
    assert judge(110.0, ready=False) is None       # remediation, a new pod loads
    assert judge(200.0, ready=True) is None        # the new pod is Ready this instant: not yet proven under load


# --- what made the CUDA-graph case take extra failed starts (up to 13 on a loaded machine) --------------------------

GRAPH_OOM_ARGS = ["vllm", "serve", QWEN, "--host", "0.0.0.0", "--port", "8000", "--tensor-parallel-size", "1",
                  "--gpu-memory-utilization", "0.9", "--max-model-len", "32768", "--max-num-seqs", "41"]
GRAPH_OOM = HiddenFacts(extra_cudagraph_gib=3.0)
V019 = "vllm/vllm-openai:v0.19.0"


def test_the_classifier_places_a_process_tagged_cuda_graph_oom_by_its_frames() -> None:
    """Found by this file: the classifier stripped the process tag '(EngineCore_DP0 pid=281) ' together with the
    indentation after it, so the OOM's own frames (capture_model) were never seen and the phase was None — which
    made the handler treat the failure as vague and re-read the log."""
    outcome = simulate_startup(GRAPH_OOM_ARGS, V019, load_gpu_catalog().get("L4"), GRAPH_OOM,
                               load_model_files(QWEN, offline=True), gpu_count=1, memory_limit_gib=26)
    assert outcome.failure_kind == "CUDAOOMStartup" and outcome.phase == "cuda_graphs"
    message = termination_message(outcome.log_text(datetime(2026, 1, 1, tzinfo=UTC)))  # what the pod shows
    assert "in capture_model" in message and "self._capture_cudagraphs(" in message
    failure = classify_text(message, terminated_reason="Error", exit_code=1)
    assert failure.kind == "CUDAOOMStartup"
    assert failure.phase == "cudagraph", failure.phase


def _deployment(name: str) -> dict[str, Any]:
    files = load_model_files(QWEN, offline=True)
    flags = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_model_len": 32768, "max_num_seqs": 41}
    deployment = build_deployment(RenderInput(
        name=name, namespace="default", owner=OwnerRef(name=name, uid=f"uid-{name}"), model=QWEN, image=V019,
        vllm_version="0.19.0", flags=flags, gpu_count=1, gpu_product_label=L4,
        weights_gib_total=(files.total_size or 0) / 2**30))
    deployment["metadata"].pop("ownerReferences", None)
    return deployment


def test_the_simulated_cluster_serves_the_previous_containers_log() -> None:
    server = EmulatedAPIServer().start()
    try:
        api, clock = server.emulator, SimClock.manual()
        kubelet = Kubelet(api, clock, hidden=lambda _ns, _name: GRAPH_OOM)
        api.create_object("nodes", gpu_node("gpu-l4-0", load_gpu_catalog().get("L4"), 1))
        api.create_object("deployments", _deployment("graphs"))

        def restarted() -> dict[str, Any] | None:
            kubelet.tick()
            pods = api.list_objects("pods", "default")
            status = ((pods[0].get("status") or {}).get("containerStatuses") or [{}])[0] if pods else {}
            return pods[0] if status.get("restartCount", 0) >= 1 and "running" in status.get("state", {}) else None

        pod = None
        for _ in range(2000):
            pod = restarted()
            if pod is not None:
                break
            clock.advance(0.5)
        assert pod is not None, "the container never restarted"
        terminated = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
        assert "CUDA out of memory" in terminated["message"]
        clock.advance(6.0)  # the new run prints its first lines, as it had when the operator read the log
        kubelet.tick()
        url = f"{server.url}/api/v1/namespaces/default/pods/{pod['metadata']['name']}/log?container=vllm&previous=true"
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback only
            previous = response.read().decode()
        assert "CUDA out of memory" in previous, previous[-500:]
    finally:
        server.stop()


def test_an_unhelpful_log_tail_does_not_turn_a_recognised_failure_into_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by this file: the log tail's class used to replace the termination message's even when the tail said
    nothing recognisable (a CUDA OOM became Unknown and no step was taken)."""
    oom = messages.cuda_oom_message(device=0, tried_mib=786.0, total_gib=21.84, free_mib=632.31, in_use_gib=19.78,
                                    torch_gib=19.27)
    message = (f"(EngineCore_DP0 pid=281) {oom}\n(APIServer pid=1) RuntimeError: Engine core initialization failed. "
               "See root cause above. Failed core proc(s): {}")
    pod = {"metadata": {"name": "graphs-abc", "namespace": "default", "uid": "uid-1"},
           "status": {"phase": "Running", "containerStatuses": [{
               "name": "vllm", "ready": False, "restartCount": 1, "state": {"running": {"startedAt": "2026-01-01T00:01:00Z"}},
               "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "message": message,
                                            "startedAt": "2026-01-01T00:00:00Z",
                                            "finishedAt": "2026-01-01T00:00:50Z"}}}]}}
    assert classify_text(message, terminated_reason="Error", exit_code=1).kind == "CUDAOOMStartup"
    tail = ("(APIServer pid=1) INFO 01-01 00:01:02 [api_server.py:1839] vLLM API server version 0.19.0\n"
            "(EngineCore_DP0 pid=281) INFO 01-01 00:01:06 [core.py:77] Initializing a V1 LLM engine (v0.19.0) with "
            f"config: model='{QWEN}'\n")
    monkeypatch.setattr(remediation_handlers, "read_log_tail", lambda _namespace, _pod: tail)
    [(_, failure)] = remediation_handlers.classify_pod(pod)
    assert failure.kind == "CUDAOOMStartup", failure.summary


def _crashed(restarts: int, state: dict[str, Any], run: int) -> dict[str, Any]:
    """A pod whose vLLM container's run number ``run`` died (exit 1), ``restarts`` restarts so far."""
    return {"metadata": {"name": "svc-abc", "namespace": "default", "uid": "uid-1"},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "vllm", "ready": False, "restartCount": restarts, "state": state,
                "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "message": "ValueError: boom",
                                             "containerID": f"containerd://run{run}",
                                             "startedAt": f"2026-01-01T00:0{run}:00Z",
                                             "finishedAt": f"2026-01-01T00:0{run}:50Z"}}}]}}


def test_one_container_death_has_one_failure_key_before_and_after_the_restart() -> None:
    def key(pod: dict[str, Any]) -> str:
        [evidence] = evidence_from_pod(pod, container="vllm")
        return failure_key(evidence.pod_uid, death_index(pod, evidence))  # as the handler derives it

    backoff = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}}
    first_death_in_backoff = key(_crashed(0, backoff, run=0))
    first_death_running_again = key(_crashed(1, {"running": {"startedAt": "2026-01-01T00:01:00Z"}}, run=0))
    second_death_in_backoff = key(_crashed(1, backoff, run=1))
    assert second_death_in_backoff != first_death_running_again, "a new death looks already handled"
    assert first_death_in_backoff == first_death_running_again, "one death, two keys"
