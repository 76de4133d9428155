"""The remediation ladder: from a classified failure to the next, safer profile — or a clear stop.

`decide(...)` is pure. Each step adds one constraint learned from vLLM's own numbers (its estimated maximum
length, the free memory it saw) to `status.remediation.profile`; the planner then computes the next flags with
that constraint, so a step is computed, not a blind halving. Pinned flags are never changed: when the only remedy
needs one, the ladder stops and says which flag and what value would work. Bounded by `maxSteps` and
`minIntervalSeconds`; the same failure (pod UID + restart count) never causes two steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..api.v1alpha1 import flags_from_api
from ..planner import Constraints
from ..planner.failures import FailureKind
from ..planner.multinode import pp_partition
from .classifier import MEMORY_FAILURES, Failure

_MAX_UTILIZATION = 0.95
_UTIL_STEP = 0.03
_MIN_BATCHED_TOKENS = 512
_FREE_MARGIN_GIB = 0.3


class Action(StrEnum):
    STEP = "step"            # apply new constraints (re-plan, roll out)
    WAIT = "wait"            # a step is due, but the minimum interval has not passed: look again later
    SURFACE = "surface"      # not a memory failure: change nothing, tell the user
    EXHAUSTED = "exhausted"  # no step allowed or none would help: stop with a verdict
    IGNORE = "ignore"        # already handled (same pod UID + restart count) or stale


class Current(BaseModel):
    """What the ladder needs to know about the service now."""

    model_config = ConfigDict(frozen=True)

    flags: dict[str, Any] = Field(description="the flags the failed pod ran with (status.plan.flags)")
    pinned: frozenset[str] = Field(frozenset(), description="vLLM flag names the user pinned (snake_case)")
    constraints: Constraints = Constraints()
    step: int = 0
    history_keys: frozenset[str] = frozenset()
    last_step_time: datetime | None = None
    max_steps: int = 5
    min_interval_seconds: int = 60
    enabled: bool = True
    max_gpus: int = 8
    gpu_count_fixed: bool = Field(False, description="max_gpus comes from spec.gpu.count (not gpu.maxCount)")
    min_context: int | None = Field(None, description="workload.contextLength: never plan below it")
    gpu_total_gib: float | None = None
    host_memory_gib: float | None = Field(None, description="the container's current memory limit")
    node_memory_gib: float | None = Field(None, description="allocatable memory of the largest GPU node")
    memory_pinned: bool = False
    planned_kv_gib: float | None = Field(None, description="KV memory per GPU the current plan predicted")
    # multi-node (status.multiNode): what a stage-specific step needs
    stage_layers: tuple[int, ...] = Field((), description="layers per pipeline stage as planned now (empty: one node)")
    failed_stages: tuple[int, ...] = Field((), description="the pipeline stages of the failed pod's ranks")
    nodes: int = Field(1, ge=1, description="nodes one replica spans now")
    max_nodes: int = Field(1, ge=1, description="spec.gpu.maxNodes")
    partition_pinned: bool = Field(False, description="spec.env sets VLLM_PP_LAYER_PARTITION")


class Decision(BaseModel):
    action: Action
    failure_class: str
    constraints: Constraints | None = None
    message: str
    changed: dict[str, Any] = Field(default_factory=dict, description="constraint fields set by this step")


def failure_key(pod_uid: str, restart_count: int) -> str:
    return f"{pod_uid}/{restart_count}"


def decide(failure: Failure, key: str, current: Current, now: datetime) -> Decision:
    """The ladder's next move for one classified failure."""
    kind = failure.kind
    if key in current.history_keys:
        return Decision(action=Action.IGNORE, failure_class=kind, message=f"failure {key} was already handled")
    if kind not in MEMORY_FAILURES and kind not in (FailureKind.INVALID_PARALLELISM, FailureKind.MAX_MODEL_LEN_TOO_LONG):
        return Decision(action=Action.SURFACE, failure_class=kind,
                        message=f"{kind}: {failure.summary} (not a memory failure: flags unchanged)")
    if not current.enabled:
        return Decision(action=Action.SURFACE, failure_class=kind,
                        message=f"{kind}: {failure.summary} (remediation is disabled by spec.remediation.enabled)")
    if current.step >= current.max_steps:
        return Decision(action=Action.EXHAUSTED, failure_class=kind,
                        message=f"{kind} after {current.step} remediation steps (spec.remediation.maxSteps="
                                f"{current.max_steps}): {failure.summary} {_advice(failure, current)}")
    if current.last_step_time is not None:
        due = current.last_step_time + timedelta(seconds=current.min_interval_seconds)
        if now < due:
            return Decision(action=Action.WAIT, failure_class=kind,
                            message=f"next step allowed after {due.isoformat()} (spec.remediation."
                                    "minIntervalSeconds)")
    step = _stage_step(failure, current)
    if step is None:
        step = _STEPS[kind](failure, current)
    if isinstance(step, str):
        return Decision(action=Action.EXHAUSTED, failure_class=kind, message=f"{kind}: {failure.summary} {step}")
    changes, why = step
    constraints = current.constraints.model_copy(update=changes)
    if constraints == current.constraints:
        return Decision(action=Action.EXHAUSTED, failure_class=kind,
                        message=f"{kind}: {failure.summary} No further step would change the flags. "
                                f"{_advice(failure, current)}")
    return Decision(action=Action.STEP, failure_class=kind, constraints=constraints, changed=changes, message=why)


_Step = tuple[dict[str, Any], str] | str  # (constraint changes, why) or the verdict when nothing is allowed


def _flag(current: Current, name: str, default: Any = None) -> Any:
    return current.flags.get(name, default)


def _pinned(current: Current, name: str) -> bool:
    return name in current.pinned


def _kv_too_small(failure: Failure, current: Current) -> _Step:
    length = failure.max_model_len or _flag(current, "max_model_len")
    fits = failure.estimated_max_model_len
    if fits is None and failure.kv_cache_tokens:
        fits = failure.kv_cache_tokens  # V0: the cache holds this many tokens
    if fits is None and length and failure.needed_kv_gib and failure.available_kv_gib:
        fits = int(length * failure.available_kv_gib / failure.needed_kv_gib)
    if fits is None:
        fits = int(length * 0.75) if length else None
    minimum = current.min_context or 0
    learned = _learned_activation(failure, current)
    if not _pinned(current, "max_model_len") and fits and fits >= max(minimum, 16):
        target = _round_down(fits)
        if minimum and target < minimum:
            target = fits
        return ({"max_model_len": target},
                f"vLLM's KV cache holds at most {fits} tokens per request; max-model-len {length} → {target}")
    util = float(_flag(current, "gpu_memory_utilization", 0.9))
    if not _pinned(current, "gpu_memory_utilization") and round(util + _UTIL_STEP, 2) <= _MAX_UTILIZATION:
        raised = round(min(util + 2 * _UTIL_STEP, _MAX_UTILIZATION), 2)
        # more memory must not buy a longer context than the one that just failed
        cap = {"max_model_len": int(length)} if length and not _pinned(current, "max_model_len") else {}
        return ({"min_utilization": raised, **cap, **learned},
                f"the context cannot shrink (pinned or below workload.contextLength {minimum}); "
                f"gpu-memory-utilization {util} → {raised}")
    others = ("use more GPUs (spec.gpu.maxCount), an fp8 KV cache (spec.flags.kvCacheDtype: fp8) or a larger "
              "GPU.")
    if minimum and fits is not None and fits < minimum:
        return (f"Only {fits} tokens fit per request, less than spec.workload.contextLength ({minimum}). Lower "
                f"spec.workload.contextLength to {fits} or less, or {others}")
    return f"Only {fits} tokens fit per request. Set spec.flags.maxModelLen to {fits} or less, or {others}"


def _learned_activation(failure: Failure, current: Current) -> dict[str, Any]:
    """vLLM said how much KV memory it really had: what the plan predicted beyond that is memory the plan did not
    see (a larger activation peak, other overheads). Learn it, so the next plans are computed on vLLM's figures."""
    if failure.available_kv_gib is None or current.planned_kv_gib is None:
        return {}
    missing = round(current.planned_kv_gib - failure.available_kv_gib, 2)
    if missing <= 0.05:
        return {}
    return {"extra_activation_gib": round(current.constraints.extra_activation_gib + missing, 2)}


def _insufficient_free(failure: Failure, current: Current) -> _Step:
    free = failure.free_gib
    total = failure.total_gib or current.gpu_total_gib
    if free is None:
        return "The message did not say how much memory is free; free the GPU or lower gpu-memory-utilization."
    if _pinned(current, "gpu_memory_utilization"):
        util = max(int((free - _FREE_MARGIN_GIB) / total * 100) / 100, 0.01) if total else None
        return (f"Only {free} GiB of {total} GiB is free (another process holds the rest) and "
                f"spec.flags.gpuMemoryUtilization is pinned; set it to {util} or less, or free the GPU.")
    return ({"gpu_free_gib": round(free, 2)},
            f"another process holds GPU memory: {free} of {total} GiB free; re-planned to fit in what is free")


def _no_kv_memory(failure: Failure, current: Current) -> _Step:
    util = float(_flag(current, "gpu_memory_utilization", 0.9))
    c = current.constraints
    if not _pinned(current, "gpu_memory_utilization") and c.gpu_free_gib is None and \
            round(util + _UTIL_STEP, 2) <= _MAX_UTILIZATION:
        raised = round(min(util + 2 * _UTIL_STEP, _MAX_UTILIZATION), 2)
        return {"min_utilization": raised}, f"no memory left for the KV cache; gpu-memory-utilization {util} → {raised}"
    if not _pinned(current, "enforce_eager") and not c.force_enforce_eager and not _flag(current, "enforce_eager"):
        return {"force_enforce_eager": True}, "no memory left for the KV cache; enforce-eager frees the CUDA-graph pool"
    tokens = _flag(current, "max_num_batched_tokens")
    if not _pinned(current, "max_num_batched_tokens") and (tokens is None or tokens > _MIN_BATCHED_TOKENS):
        smaller = max((tokens or 2048) // 2, _MIN_BATCHED_TOKENS)
        return ({"max_num_batched_tokens": smaller},
                f"no memory left for the KV cache; max-num-batched-tokens → {smaller} shrinks the activation peak")
    if not _pinned(current, "kv_cache_dtype") and not c.force_fp8_kv:
        return {"force_fp8_kv": True}, "no memory left for the KV cache; fp8 KV cache halves bytes per token"
    return _more_gpus(current, "no memory left for the KV cache")


def _more_gpus(current: Current, why: str) -> _Step:
    tp = int(_flag(current, "tensor_parallel_size", 1))
    pp = int(_flag(current, "pipeline_parallel_size", 1) or 1)
    if _pinned(current, "tensor_parallel_size"):
        return (f"{why}; more tensor parallelism would help but spec.flags.tensorParallelSize is pinned at {tp}: "
                f"set it to {tp * 2} with spec.gpu.count {tp * 2 * pp}.")
    needed = tp * 2 * pp
    if needed > current.max_gpus:
        field = "spec.gpu.count" if current.gpu_count_fixed else "spec.gpu.maxCount"
        return (f"{why}; {needed} GPUs per pod (TP {tp * 2} × PP {pp}) would be needed but {field} is "
                f"{current.max_gpus}: raise it, use a quantized variant of the model, or a larger GPU.")
    return {"min_tensor_parallel_size": tp * 2}, f"{why}; tensor-parallel-size {tp} → {tp * 2}"


def _weights(failure: Failure, current: Current) -> _Step:
    return _more_gpus(current, "the weights do not fit in GPU memory")


def _oom_startup(failure: Failure, current: Current) -> _Step:
    c = current.constraints
    if not _pinned(current, "enforce_eager") and not c.force_enforce_eager and not _flag(current, "enforce_eager"):
        return ({"force_enforce_eager": True},
                "CUDA out of memory after loading (profiling/CUDA-graph capture); enforce-eager skips graph capture")
    util = float(_flag(current, "gpu_memory_utilization", 0.9))
    if not _pinned(current, "gpu_memory_utilization") and util > 0.5:
        lowered = round(util - 0.05, 2)
        return ({"max_utilization": lowered},
                f"CUDA out of memory outside vLLM's budget; gpu-memory-utilization {util} → {lowered} leaves headroom")
    return _smaller_batches(current, "CUDA out of memory after loading")


def _smaller_batches(current: Current, why: str) -> _Step:
    seqs = _flag(current, "max_num_seqs")
    if not _pinned(current, "max_num_seqs") and seqs and seqs > 1:
        fewer = max(int(seqs) // 2, 1)
        return {"max_num_seqs": fewer}, f"{why}; max-num-seqs {seqs} → {fewer}"
    tokens = _flag(current, "max_num_batched_tokens")
    if not _pinned(current, "max_num_batched_tokens") and (tokens is None or tokens > _MIN_BATCHED_TOKENS):
        smaller = max((tokens or 2048) // 2, _MIN_BATCHED_TOKENS)
        return {"max_num_batched_tokens": smaller}, f"{why}; max-num-batched-tokens → {smaller}"
    return f"{why}; max-num-seqs and max-num-batched-tokens are pinned or at their minimum: lower them by hand."


def _oom_serving(failure: Failure, current: Current) -> _Step:
    return _smaller_batches(current, "CUDA out of memory while serving")


def _host_oom(failure: Failure, current: Current) -> _Step:
    if current.memory_pinned:
        return ("The container ran out of host memory and spec.resources.memory is set by you; raise it "
                f"(now {current.host_memory_gib} GiB) or lower cpu-offload-gb/swap-space.")
    limit = current.constraints.host_memory_gib or current.host_memory_gib or 16.0
    raised = float(int(limit * 1.5 + 0.999))
    if current.node_memory_gib is not None and raised > current.node_memory_gib * 0.9:
        raised = float(int(current.node_memory_gib * 0.9))
        if raised <= limit:
            return (f"The container ran out of host memory at {limit} GiB and the nodes allocate at most "
                    f"{current.node_memory_gib} GiB; lower cpu-offload-gb or use nodes with more memory.")
    return {"host_memory_gib": raised}, f"host memory limit {limit} GiB → {raised} GiB (OOMKilled while loading)"


def _invalid_parallelism(failure: Failure, current: Current) -> _Step:
    tp = _flag(current, "tensor_parallel_size", 1)
    if _pinned(current, "tensor_parallel_size"):
        shapes = [n for n in (failure.num_kv_heads, failure.num_heads, failure.dividend) if n]
        sizes = [t for t in (1, 2, 4, 8, 16) if t != tp and all(n % t == 0 or (t % n == 0 and n == failure.num_kv_heads)
                                                               for n in shapes)]
        suggestion = ", ".join(map(str, sizes)) if shapes and sizes else "a power of two that divides the heads"
        return f"spec.flags.tensorParallelSize={tp} does not divide the model's shapes; use one of: {suggestion}."
    return "the planner chose an invalid tensor-parallel size; please report this with the model's config.json."


def _too_long(failure: Failure, current: Current) -> _Step:
    derived = failure.derived_max_model_len
    if _pinned(current, "max_model_len") or derived is None:
        return (f"spec.flags.maxModelLen exceeds the model's context ({derived}); set it to {derived} or less.")
    return {"max_model_len": derived}, f"max-model-len above the model's own context; → {derived}"


#: Failures that can be one stage's: a CUDA OOM loading that stage's weights, at its profiling peak or graph
#: capture. (The KV-cache checks are the engine's, over the minimum of every stage: they take the uniform steps.)
STAGE_FAILURES = frozenset({FailureKind.CUDA_OOM_STARTUP, FailureKind.WEIGHTS_DO_NOT_FIT})
#: At most this share of a stage's own (vLLM-split) layers is moved off it before a node is added instead.
MAX_SHIFT_FRACTION = 0.125


def _stage_step(failure: Failure, current: Current) -> _Step | None:
    """A step for a memory failure of ONE pipeline stage of a group, before the uniform steps: move a layer off
    that stage (VLLM_PP_LAYER_PARTITION), or span one more node within spec.gpu.maxNodes. None: no such step
    applies (one node, a failure of every stage, a pinned layout), and the uniform ladder decides."""
    layers = current.stage_layers
    if failure.kind not in STAGE_FAILURES or len(layers) < 2 or len(current.failed_stages) != 1:
        return None
    stage = current.failed_stages[0]
    if not 0 <= stage < len(layers):
        return None
    moved = _moved_partition(layers, stage, current)
    if moved is not None:
        return moved
    return _more_nodes(current, f"{failure.kind} on pipeline stage {stage} of {len(layers)}")


def _moved_partition(layers: tuple[int, ...], stage: int, current: Current) -> _Step | None:
    if current.partition_pinned:
        return None
    total = sum(layers)
    own = pp_partition(total, len(layers))
    if layers[stage] > own[stage] or own[stage] - layers[stage] + 1 > max(1, int(own[stage] * MAX_SHIFT_FRACTION)):
        return None  # the stage already took layers from another (no ping-pong), or gave all it may
    others = [i for i in range(len(layers)) if i != stage]
    # the receiving stage: the one holding the fewest layers (the nearest of equals: neighbours share less state)
    receiver = min(others, key=lambda i: (layers[i], abs(i - stage)))
    parts = list(layers)
    parts[stage] -= 1
    parts[receiver] += 1
    if parts[stage] < 1:
        return None
    value = ",".join(map(str, parts))
    try:
        pp_partition(total, len(parts), value)  # the planner's own check
    except ValueError:
        return None
    role = "lm_head and sampler" if stage == len(layers) - 1 else ("embedding" if stage == 0 else "")
    return ({"pp_layer_partition": value},
            f"out of memory on pipeline stage {stage}" + (f" (it also holds the {role})" if role else "")
            + f"; VLLM_PP_LAYER_PARTITION {','.join(map(str, layers))} → {value} moves one layer to stage {receiver}")


def _more_nodes(current: Current, why: str) -> _Step | None:
    if _pinned(current, "tensor_parallel_size") or _pinned(current, "pipeline_parallel_size"):
        return None
    if current.nodes + 1 > current.max_nodes:
        return None
    return ({"min_nodes": current.nodes + 1, "pp_layer_partition": None},
            f"{why}: one more node ({current.nodes} → {current.nodes + 1}, spec.gpu.maxNodes {current.max_nodes}) "
            "spreads the layers over more pipeline stages")


_STEPS: dict[str, Any] = {
    FailureKind.KV_CACHE_TOO_SMALL: _kv_too_small,
    FailureKind.INSUFFICIENT_FREE_GPU_MEMORY: _insufficient_free,
    FailureKind.NO_KV_CACHE_MEMORY: _no_kv_memory,
    FailureKind.WEIGHTS_DO_NOT_FIT: _weights,
    FailureKind.CUDA_OOM_STARTUP: _oom_startup,
    FailureKind.CUDA_OOM_SERVING: _oom_serving,
    FailureKind.HOST_OOM_KILLED: _host_oom,
    FailureKind.INVALID_PARALLELISM: _invalid_parallelism,
    FailureKind.MAX_MODEL_LEN_TOO_LONG: _too_long,
}


def _round_down(length: int) -> int:
    if length >= 4096:
        return length // 1024 * 1024
    if length >= 512:
        return length // 256 * 256
    return length


def _advice(failure: Failure, current: Current) -> str:
    step = _STEPS.get(failure.kind)
    if step is None:
        return ""
    nxt = step(failure, current)
    if isinstance(nxt, str):
        return nxt
    changes, why = nxt
    return f"The next step would have been: {why}. Raise spec.remediation.maxSteps or apply it by hand."


def step_up(current: Current, profile_order: Sequence[str], now: datetime, stable_since: datetime | None,
            stable_window_seconds: int) -> tuple[Constraints, str] | None:
    """Opt-in (spec.remediation.allowStepUp): after a stable window, drop the most recent constraint once."""
    if stable_since is None or not profile_order:
        return None
    if now - stable_since < timedelta(seconds=stable_window_seconds):
        return None
    last = profile_order[-1]
    default = Constraints.model_fields[last].default
    relaxed = current.constraints.model_copy(update={last: default})
    return relaxed, f"stable for {stable_window_seconds}s: retrying without the constraint {last}"


def constraints_to_profile(constraints: Constraints) -> dict[str, Any]:
    """The constraints worth storing (status.remediation.profile): only fields that differ from the defaults."""
    out: dict[str, Any] = {}
    for name, info in Constraints.model_fields.items():
        value = getattr(constraints, name)
        if value != info.default:
            out[name] = value
    return out


def profile_constraints(profile: Mapping[str, Any]) -> Constraints:
    """The constraints of a profile, keyed either way (as stored in status, `maxModelLen`, or by vLLM's name)."""
    return Constraints(**{k: v for k, v in flags_from_api(profile).items() if k in Constraints.model_fields})
