"""Observe → plan → execute, the pure middle: from what the handler observed to what it should write.

`desired_state(observed)` takes a VLLMService (spec, status, metadata), the GPU nodes the handler listed and the
model files it loaded, and returns the children to apply, the next status and the events to emit — with no API
calls. The kopf handlers (vllm_operator.handlers) only gather `Observed` and apply `Desired`.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from . import sharegroup
from .api import conditions as cond
from .api.switch import Kind
from .api.v1alpha1 import (
    DEFAULT_IMAGE,
    ColdStartStatus,
    GPUStatus,
    ModelCacheStatus,
    MultiNodeStatus,
    PinnedFlags,
    PlanFailure,
    PlanOption,
    PlanStatus,
    SpecError,
    VLLMServiceSpec,
    VLLMServiceStatus,
    flags_from_api,
    parse_spec,
    validate_spec,
)
from .modelfiles import ModelFiles, ModelSourceError, find_in_catalog, model_files_from_inline
from .planner import ArchError, Constraints, Option, Plan, PlanRequest, Workload, budget, plan
from .planner.arch import ModelArch, arch_from_config, check_arch_bounds, checkpoint_bytes
from .planner.gpus import (
    LABEL_PRODUCT,
    GPUCatalog,
    GPUSpec,
    NodeGPU,
    UnknownGPUError,
    load_gpu_catalog,
    pick_gpu_pool,
    resolve_node_gpu,
)
from .planner.lora import allowed_ranks, lora_support, refusal_message, vocab_check
from .planner.multinode import MultiNodePlan
from .planner.plan import rank_options
from .planner.speculative import Speculation, parse_speculative_config, with_draft_arch
from .planner.versions import ImageVersion, VersionError, image_version
from .remediation.redact import secret_findings
from .render import multinode
from .render.cache import (
    ENGINE_START_SECONDS,
    CachePlan,
    CacheSettings,
    ObservedClaim,
    budget_rate,
    download_init_wanted,
    plan_cache,
    startup_failure_threshold,
)
from .render.coldstart import engine_seconds_budget
from .render.ecosystem import ecosystem_children
from .render.flags import extra_args_refusals, pinned_value_refusals
from .render.manifests import (
    OwnerRef,
    RenderInput,
    child_names,
    labels_for,
    render_args,
    spec_hash,
    unsupported_pinned,
)
from .render.pods import ServingPods, serving_pods

log = logging.getLogger("vllm_operator.reconcile")

#: The longest VLLMService name: it labels the pods (label values are at most 63 characters) and the handlers map
#: pods back to their service by that label.
MAX_NAME_LENGTH = 63

EVENT_NORMAL = "Normal"
EVENT_WARNING = "Warning"


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What the handler read from the cluster for one VLLMService: plain data, read once before the core runs.

    The shell reads the model's files, the nodes and the LeaderWorkerSet API only for a spec `wants` finds valid
    (what it names, nothing for an invalid one); the core never calls back into the shell."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    now: datetime
    nodes: Sequence[Mapping[str, str]] = ()          # labels of nodes matching the pod's nodeSelector
    default_image: str = DEFAULT_IMAGE               # for specs that name no image (operator-wide setting)
    model_files: ModelFiles | None = None           # the model's files as the shell read them (not inline ones)
    model_error: str | None = None                  # why the model files could not be read
    catalog: GPUCatalog | None = None
    lws_installed: bool | None = None               # whether the LeaderWorkerSet API is served; None: not asked
    cache_settings: CacheSettings = CacheSettings()  # the operator-wide model cache default
    default_storage_class: str | None = None        # the cluster's default StorageClass, if any
    shared_storage_class: str | None = None         # a StorageClass whose claims can be ReadWriteMany, if any
    served_kinds: frozenset[str] | None = None      # optional kinds served (ScaledObject, InferencePool); None: unknown
    share: sharegroup.ShareObserved | None = None   # spec.gpu.share: the group as observed (issue 26)
    cache_claim: ObservedClaim | None = None        # spec.modelCache.claimName as read; None: not read


@dataclass
class Desired:
    """What the handler should write: children (None = leave them as they are), status, events."""

    status: VLLMServiceStatus
    children: list[dict[str, Any]] | None = None
    events: list[Event] = field(default_factory=list)
    plan: Plan | None = None
    retry_after: float | None = None                # re-run later (e.g. no GPU nodes yet)
    stale: list[tuple[str, str]] = field(default_factory=list)  # optional children (kind, name) to delete if present


def _status(observed: Observed, updates: list[cond.ConditionUpdate], **changes: Any) -> VLLMServiceStatus:
    return cond.fold_status(dict(observed.status), conditions=updates, observed_generation=observed.generation,
                            now=observed.now, **changes)


#: Progressing reasons only the pods can tell (api.rollout, from the pods' init containers): a reconcile, which reads
#: only readyReplicas, keeps them rather than writing a plain Deploying over them while the download runs or fails.
_SAID_BY_PODS = (cond.DOWNLOADING, cond.MODEL_DOWNLOAD_FAILED)


def _pods_said(observed: Observed) -> bool:
    """Whether the stored Progressing condition, of this generation, carries what the pods showed."""
    return any(c.get("type") == cond.PROGRESSING and c.get("reason") in _SAID_BY_PODS
               and c.get("observedGeneration") == observed.generation
               for c in observed.status.get("conditions") or [] if isinstance(c, Mapping))


def _already_said(observed: Observed, reason: str, message: str) -> bool:
    """Whether the status already carries this problem (so its Warning event was posted before)."""
    for condition in observed.status.get("conditions") or []:
        if condition.get("type") == cond.DEGRADED and condition.get("status") == cond.TRUE:
            return bool(condition.get("reason") == reason and condition.get("message") == message
                        and condition.get("observedGeneration") == observed.generation)
    return False


def _problem(observed: Observed, reason: str, message: str, updates: list[cond.ConditionUpdate],
             retry_after: float | None = None) -> Desired:
    events = [] if _already_said(observed, reason, message) else [Event(EVENT_WARNING, reason, message)]
    return Desired(status=_status(observed, updates), events=events, retry_after=retry_after)


def _invalid(observed: Observed, errors: Sequence[SpecError]) -> Desired:
    message = "; ".join(f"{e.field}: {e.message}" for e in errors)
    updates = [
        cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, cond.INVALID_SPEC, message),
        cond.ConditionUpdate(cond.PLAN_FEASIBLE, cond.UNKNOWN, cond.INVALID_SPEC, "the spec is invalid"),
        cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, cond.INVALID_SPEC, "waiting for a valid spec"),
    ]
    return _problem(observed, cond.INVALID_SPEC, message, updates)


def resolve_gpu(spec: VLLMServiceSpec, nodes: Sequence[Mapping[str, str]],
                catalog: GPUCatalog) -> tuple[GPUSpec, str, str | None, int | None]:
    """The GPU to plan for: (spec, how it was found, the GFD product label to select nodes by, GPUs per node)."""
    if spec.gpu.product:
        gpu = catalog.get(spec.gpu.product)
        label = spec.gpu.product if spec.gpu.product in gpu.gfd_products else (gpu.gfd_products or [None])[0]
        how = f"from spec.gpu.product={spec.gpu.product}"
        if spec.gpu.memory_gib:
            gpu = gpu.model_copy(update={"reported_gib": spec.gpu.memory_gib, "memory_mib": int(
                max(spec.gpu.memory_gib + 0.7, gpu.memory_gib) * 1024)})
            how += f", memory overridden to {spec.gpu.memory_gib} GiB by spec.gpu.memoryGiB"
        return gpu, how, label, None
    found: list[NodeGPU] = []
    for labels in nodes:
        node_gpu = resolve_node_gpu(labels, catalog)
        if node_gpu is not None:
            found.append(node_gpu)
    if not found:
        raise UnknownGPUError("no node with NVIDIA GPU Feature Discovery labels (nvidia.com/gpu.product) matches "
                              "spec.nodeSelector; set spec.gpu.product or install GPU Feature Discovery")
    chosen, why = pick_gpu_pool(found)
    product_label = _product_label(nodes, chosen, catalog)
    return chosen.spec, f"{chosen.how}; {why}", product_label, chosen.count


def _product_label(nodes: Sequence[Mapping[str, str]], chosen: NodeGPU, catalog: GPUCatalog) -> str | None:
    """The nvidia.com/gpu.product value of the chosen pool's nodes, as they carry it (time-sliced `-SHARED`,
    MIG slice names), so the pods' nodeSelector matches exactly those nodes."""
    for labels in nodes:
        product = labels.get("nvidia.com/gpu.product")
        node_gpu = resolve_node_gpu(labels, catalog) if product else None
        if node_gpu is not None and node_gpu.spec.name == chosen.spec.name:
            return product
    return chosen.spec.gfd_products[0] if chosen.spec.gfd_products else None


@dataclass(frozen=True)
class _Pool:
    gpu: NodeGPU
    nodes: int
    label: str | None
    result: Plan

    @property
    def cost_gib(self) -> float:
        """GPU memory one replica takes from the cluster: the cheaper pool is the one that takes less."""
        return self.result.gpu_count * self.gpu.spec.reported_gib

    def outcome(self) -> str:
        res = self.result
        state = "usable" if res.usable else ("starts, below the default workload" if res.fits else "does not fit")
        figures = (f", TP={res.flags.get('tensor_parallel_size')}, max-model-len {res.flags.get('max_model_len')}, "
                   f"{res.prediction.kv_cache_tokens} KV tokens") if res.fits else ""
        return f"{self.nodes} node(s) with {self.gpu.count}× {self.gpu.spec.name}: {state}{figures}"


def _pool_rank(pool: _Pool) -> tuple[float, ...]:
    res = pool.result
    if not res.fits:  # nothing fits anywhere: explain it for the pool with the most GPU memory per node
        return (2.0, -pool.gpu.total_reported_gib, -pool.nodes)
    return (0.0 if res.usable else 1.0, pool.cost_gib, pool.gpu.spec.reported_gib, -pool.nodes)


def discover_pools(nodes: Sequence[Mapping[str, str]], catalog: GPUCatalog) -> list[tuple[NodeGPU, int, str | None]]:
    """The GPU pools of the cluster: (GPU model and count per node, number of such nodes, product label)."""
    pools: dict[tuple[str, int, int], list[NodeGPU]] = {}
    for labels in nodes:
        try:
            node_gpu = resolve_node_gpu(labels, catalog)
        except UnknownGPUError:
            continue
        if node_gpu is not None:
            pools.setdefault((node_gpu.spec.name, node_gpu.count, node_gpu.spec.memory_mib), []).append(node_gpu)
    return [(group[0], len(group), _product_label(nodes, group[0], catalog)) for group in pools.values()]


#: Plans of recent requests (the planner is a pure function of its frozen request): a burst of services with the same
#: model, GPUs and flags, or the watchdog's re-plan of an unchanged service, asks the same question again.
PLAN_CACHE_SIZE = 512
_plan_cache: OrderedDict[str, Plan] = OrderedDict()
_plan_cache_lock = threading.Lock()


def _plan_key(request: PlanRequest) -> str:
    """Every field of the request (the JSON dump, plus the speculation's draft architecture, which it leaves out)."""
    draft = request.speculation.draft_arch if request.speculation is not None else None
    return request.model_dump_json() + ("" if draft is None else "\x00" + draft.model_dump_json())


def cached_plan(request: PlanRequest) -> Plan:
    """`planner.plan(request)`, remembered for the last PLAN_CACHE_SIZE requests; each caller gets its own copy."""
    key = _plan_key(request)
    with _plan_cache_lock:
        hit = _plan_cache.get(key)
        if hit is not None:
            _plan_cache.move_to_end(key)
    if hit is None:
        stops = budget.stops()
        hit = plan(request)
        if budget.stops() == stops:  # a plan cut short by this spec's work budget is never another spec's answer
            with _plan_cache_lock:
                _plan_cache[key] = hit
                while len(_plan_cache) > PLAN_CACHE_SIZE:
                    _plan_cache.popitem(last=False)
    return hit.model_copy(deep=True)


def plan_for_cluster(spec: VLLMServiceSpec, arch: ModelArch, nodes: Sequence[Mapping[str, str]], catalog: GPUCatalog,
                     constraints: Constraints, resolved: tuple[GPUSpec, str, str | None, int | None],
                     ) -> tuple[GPUSpec, str, str | None, int | None, Plan]:
    """Plan on the pool that meets the objective at the least cost, and offer only options the cluster has.

    Without spec.gpu.product every pool is planned: the usable plan that takes the least GPU memory wins (an 8B
    model goes to an L4, not to an 8×H100 node), then one that at least starts. The choice and the alternatives
    are stated in status.gpu.source. Options are other pools that would fit (from the nodes' labels and counts,
    within spec.gpu.maxCount), plus changes that keep the GPUs; never GPUs the cluster does not have.
    """
    gpu, how, label, node_count = resolved
    pools = discover_pools(nodes, catalog)
    same = [node_gpu.count for node_gpu, _, _ in pools if node_gpu.spec.name == gpu.name]
    if spec.gpu.product and node_count is None and same:
        node_count = max(same)  # the product's nodes have this many GPUs: plan within them
        how += f"; its nodes have up to {node_count} GPU(s) each"
    result = cached_plan(plan_request(spec, arch, gpu, constraints, node_count))
    planned: list[_Pool] = []
    for node_gpu, count, pool_label in pools:
        if spec.gpu.product:
            continue
        with budget.phase("pools"):
            if budget.out_of_budget():  # the spec's work budget is spent: choose among the pools planned so far
                break
            res = cached_plan(plan_request(spec, arch, node_gpu.spec, constraints, node_gpu.count))
        planned.append(_Pool(node_gpu, count, pool_label, res))
    if len(planned) > 1:
        ranked = sorted(planned, key=_pool_rank)
        best = ranked[0]
        why = ("the usable plan that takes the least GPU memory" if best.result.usable else
               "no pool is usable; the plan that starts and takes the least GPU memory" if best.result.fits else
               "no pool fits; shown for the most GPU memory per node")
        gpu, label, node_count, result = best.gpu.spec, best.label, best.gpu.count, best.result
        how = (f"{best.gpu.how}; chose {best.gpu.count}× {best.gpu.spec.name} ({why}); pools: "
               + "; ".join(pool.outcome() for pool in ranked))
    if not result.usable:
        result = result.model_copy(update={"options": _cluster_options(spec, arch, constraints, gpu, node_count,
                                                                        result, pools)})
    return gpu, how, label, node_count, result


def _cluster_options(spec: VLLMServiceSpec, arch: ModelArch, constraints: Constraints, gpu: GPUSpec,
                     node_count: int | None, result: Plan, pools: list[tuple[NodeGPU, int, str | None]],
                     ) -> list[Option]:
    """The planner's options cut to what this cluster can run, plus the cluster's other pools that would fit."""
    per_node = node_count or spec.gpu.max_count
    options: list[Option] = []
    for option in result.options:
        if option.kind == "larger-gpu":
            continue  # replaced by the pools the cluster has
        if option.kind == "gpus" and (option.gpu_count > per_node or gpu.is_mig):
            continue
        if option.kind == "gpus" and option.gpu_count > spec.gpu.max_count:
            # only the user's own limit stands between the spec and GPUs its nodes have: name it (issue 23)
            option = option.model_copy(update={
                "summary": f"{option.summary}: raise spec.gpu.maxCount to {option.gpu_count}"})
        options.append(option.model_copy(update={"source": "cluster"}))
    for node_gpu, _count, pool_label in pools:
        if node_gpu.spec.name == gpu.name:
            continue
        with budget.phase("options"):
            if budget.out_of_budget():  # the spec's work budget is spent: the options found so far
                break
        res = cached_plan(plan_request(spec, arch, node_gpu.spec, constraints, node_gpu.count))
        limits = [f"{'change' if spec.gpu.product else 'set'} spec.gpu.product to {pool_label or node_gpu.spec.name}"]
        if not res.fits and node_gpu.count > spec.gpu.max_count:
            # the pool's nodes have more GPUs than spec.gpu.maxCount lets a pod take: plan with what they have
            lifted = spec.model_copy(update={"gpu": spec.gpu.model_copy(update={"max_count": node_gpu.count})})
            res = cached_plan(plan_request(lifted, arch, node_gpu.spec, constraints, node_gpu.count))
            if res.fits:
                limits.append(f"raise spec.gpu.maxCount to {res.gpu_count}")
        if res.fits and (res.usable or not result.fits):
            options.append(Option(
                summary=f"Use the cluster's {node_gpu.count}× {node_gpu.spec.name} nodes ({' and '.join(limits)})",
                kind="pool", source="cluster", flags=res.flags, gpu=node_gpu.spec.name, gpu_count=res.gpu_count,
                kv_cache_tokens=res.prediction.kv_cache_tokens, max_model_len=int(res.flags["max_model_len"]),
                max_concurrency=res.prediction.max_concurrency))
    if not options and not result.fits:
        # nothing this cluster has would run it: say what would, from the catalog, and say that it is not here
        options = [o.model_copy(update={"source": "catalog", "summary": o.summary + " (not in this cluster)"})
                   for o in result.options]
    return rank_options(options, in_cluster=True)


def constraints_from_status(status: Mapping[str, Any]) -> Constraints:
    """The remediation ladder's learned limits, kept in status.remediation.profile."""
    remediation = status.get("remediation") or {}
    profile = flags_from_api(remediation.get("profile")) or {}
    known = {k: v for k, v in profile.items() if k in Constraints.model_fields}
    return Constraints(**known)


# What spec.workload.profile fills in when the explicit fields are unset: prefix caching for workloads that resend
# long shared prefixes, and the typical request length max-num-seqs is sized for (a soft hint, never a minimum).
PROFILE_DEFAULTS: dict[str, dict[str, Any]] = {
    "chat": {"prefix_caching": True, "typical_request_tokens": 2048},
    "agent": {"prefix_caching": True, "typical_request_tokens": 8192},
    "rag": {"prefix_caching": True, "typical_request_tokens": 8192},
    "batch": {"prefix_caching": False, "typical_request_tokens": 1024},
}


def lora_flags(spec: VLLMServiceSpec) -> dict[str, Any]:
    """The vLLM flags spec.lora asks for (empty without spec.lora)."""
    return spec.lora.to_vllm(spec.flags.max_lora_rank) if spec.lora else {}


def catalog_speculation(pinned: PinnedFlags) -> Speculation | None:
    """spec.flags.speculativeConfig as the planner reads it: a draft model or EAGLE head from the bundled model catalog
    is sized from its config.json; any other draft is booked by the planner's conservative estimate
    (planner/speculative.py). None when nothing is pinned."""
    if pinned.speculative_config is None:
        return None
    speculation = parse_speculative_config(pinned.speculative_config.to_vllm())
    files = find_in_catalog(speculation.model) if speculation.model else None
    if files is None:
        return speculation
    return with_draft_arch(speculation, files.config, total_size=files.total_size)


def plan_request(spec: VLLMServiceSpec, arch: ModelArch, gpu: GPUSpec, constraints: Constraints,
                 node_count: int | None) -> PlanRequest:
    # the planner takes spec.flags as they are; only --trust-remote-code reaches vLLM another way (the renderer
    # adds it from RenderInput.trust_remote_code), so it is not one of the plan's flags
    pinned = spec.flags.model_copy(update={"trust_remote_code": None})
    if spec.model.quantization and pinned.quantization is None:
        pinned = pinned.model_copy(update={"quantization": str(spec.model.quantization)})  # the user's word
    per_node = min(spec.gpu.max_count, node_count) if node_count else spec.gpu.max_count
    count = spec.gpu.count or per_node
    tp_pp = (pinned.tensor_parallel_size or 1) * (pinned.pipeline_parallel_size or 1)
    profile = PROFILE_DEFAULTS.get(spec.workload.profile or "", {})
    prefix = spec.workload.prefix_caching
    workload = Workload(context_length=spec.workload.context_length, concurrency=spec.workload.concurrency,
                        prefix_caching=prefix if prefix is not None else profile.get("prefix_caching"),
                        typical_request_tokens=profile.get("typical_request_tokens"))
    version = image_version(spec.image or DEFAULT_IMAGE, spec.vllm_version)
    if spec.gpu.count and not pinned.tensor_parallel_size:
        # spec.gpu.count is the GPUs each pod gets: tensor parallelism uses all of them
        wanted = max(spec.gpu.count // (pinned.pipeline_parallel_size or 1), 1)
        constraints = constraints.model_copy(update={
            "min_tensor_parallel_size": max(constraints.min_tensor_parallel_size or 1, wanted)})
    return PlanRequest(arch=arch, gpu=gpu, gpu_count=max(count, tp_pp), pinned=pinned, lora=spec.lora,
                       workload=workload,
                       constraints=constraints, vllm_version=version.version, version_note=version.note,
                       speculation=catalog_speculation(pinned))


def plan_status(result: Plan, args: list[str], digest: str) -> PlanStatus:
    return PlanStatus(
        fits=result.fits,
        flags=result.flags,
        args=args,
        memory=result.memory,
        kv_cache_tokens=result.prediction.kv_cache_tokens,
        max_concurrency=result.prediction.max_concurrency,
        reasons=result.reasons,
        failure=PlanFailure(kind=str(result.failure.kind), message=result.failure.message) if result.failure else None,
        options=[PlanOption.model_validate({
            "summary": o.summary, "flags": o.flags, "gpuCount": o.gpu_count, "gpuProduct": o.gpu, "kind": o.kind,
            "changes": o.changes, "source": o.source, "maxModelLen": o.max_model_len,
            "kvCacheTokens": o.kv_cache_tokens}) for o in result.options],
        vllm_version=result.vllm_version,
        spec_hash=digest,
    )


def _arch(files: ModelFiles, spec: VLLMServiceSpec) -> ModelArch:
    total = files.total_size
    inline_total = spec.model.weights_bytes()
    if inline_total:
        total = inline_total
    check_arch_bounds(files.config, model_id=spec.model.name)  # before any arithmetic on the values
    return arch_from_config(files.config, model_id=spec.model.name, total_size=total,
                            total_size_estimated=files.total_size_estimated)


def _config_field(spec: VLLMServiceSpec) -> str:
    """The field a bad model config comes from, for the condition."""
    if spec.model.config:
        return "spec.model.config"
    if spec.model.config_map_ref:
        return "spec.model.configMapRef"
    return "spec.model.name"


def _model_files(observed: Observed, spec: VLLMServiceSpec) -> tuple[ModelFiles | None, str | None]:
    """The model's files: inline (read here, pure) or as the shell read them."""
    if spec.model.config:
        try:
            return model_files_from_inline(spec.model.config, spec.model.safetensors_index, spec.model.name), None
        except ModelSourceError as exc:
            return None, str(exc)
    return observed.model_files, observed.model_error


def _secret_warning(observed: Observed, spec: VLLMServiceSpec) -> tuple[list[cond.ConditionUpdate], list[Event]]:
    """A Warning condition (and one Event) while the spec carries a literal secret; cleared when it is gone."""
    secret_vars = [e.name for e in spec.env if e.value_from is not None and e.value_from.secret_key_ref]
    if spec.hf_token_secret_ref:
        secret_vars.append("HF_TOKEN")
    findings = secret_findings((e.to_dict() for e in spec.env), spec.extra_args, secret_vars)
    before = next((c for c in observed.status.get("conditions") or [] if c.get("type") == cond.SECRETS_BY_REFERENCE),
                  None)
    if not findings:
        if before is not None and before.get("status") == cond.FALSE:
            return [cond.ConditionUpdate(cond.SECRETS_BY_REFERENCE, cond.TRUE, cond.AS_EXPECTED,
                                         "no literal secret in spec.env or spec.extraArgs")], []
        return [], []
    message = "; ".join(f"{f.field}: {f.message}" for f in findings[:8])
    if len(findings) > 8:
        message += f"; and {len(findings) - 8} more in spec.env / spec.extraArgs"
    said = before is not None and before.get("message") == message and before.get("status") == cond.FALSE
    return ([cond.ConditionUpdate(cond.SECRETS_BY_REFERENCE, cond.FALSE, cond.LITERAL_SECRET, message)],
            [] if said else [Event(EVENT_WARNING, cond.LITERAL_SECRET, message)])


def desired_state(observed: Observed) -> Desired:
    """Everything the handler should write for one VLLMService, computed without API calls.

    Total: it returns for every spec, however hostile. A spec problem is an InvalidSpec condition naming the field
    and the fix; a model that cannot be read is ModelNotFound; a failure nobody foresaw is an InternalError
    condition (and a log line), never an exception into kopf's retry loop.
    """
    try:
        return _desired_state(observed)
    except Exception as exc:  # noqa: BLE001 - the core must answer every VLLMService; the test corpus keeps this unused
        log.exception("reconcile core failed for %s/%s", observed.namespace, observed.name)
        message = (f"the operator could not plan this spec ({type(exc).__name__}); this is a bug in the operator, "
                   "please report it with the spec")
        updates = [cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, cond.INTERNAL_ERROR, message),
                   cond.ConditionUpdate(cond.PLAN_FEASIBLE, cond.UNKNOWN, cond.INTERNAL_ERROR, message)]
        try:
            return _problem(observed, cond.INTERNAL_ERROR, message, updates)
        except Exception:  # noqa: BLE001 - even the status could not be folded (a malformed status)
            return Desired(status=VLLMServiceStatus(), events=[Event(EVENT_WARNING, cond.INTERNAL_ERROR, message)])


def _unsupported_flags(spec: VLLMServiceSpec, version: str) -> list[SpecError]:
    """Pinned flags and spec.lora's flags the image's vLLM release lacks."""
    errors = [SpecError(spec.flags.field_path(name), f"{why}; remove it or use another image")
              for name, why in unsupported_pinned(spec.flags.to_vllm(), version)]
    errors += [SpecError("spec.lora", f"{why}; remove spec.lora or use another image")
               for _name, why in unsupported_pinned(lora_flags(spec), version)]
    errors += [SpecError(spec.flags.field_path(name), f"{why}; pin a length or use another image")
               for name, why in pinned_value_refusals(spec.flags.to_vllm(), version)]
    errors += [SpecError(f"spec.extraArgs[{index}]", f"{why}; remove it or use another image")
               for index, why in extra_args_refusals(spec.extra_args, version)]
    return errors + _lora_rank_errors(spec, version)


def _lora_rank_errors(spec: VLLMServiceSpec, version: str) -> list[SpecError]:
    """A LoRA rank the image's release does not accept (its choices changed: catalog/lora_support.yaml)."""
    field, rank = (("spec.lora.maxRank", spec.lora.max_rank) if spec.lora and spec.lora.max_rank
                   else ("spec.flags.maxLoraRank", spec.flags.max_lora_rank))
    ranks = allowed_ranks(version)
    if rank is None or rank in ranks:
        return []
    return [SpecError(field, f"vLLM {version} accepts --max-lora-rank {', '.join(map(str, ranks))}, not {rank}; "
                             "pick one of those or use another image")]


def _lora_refused(observed: Observed, spec: VLLMServiceSpec, version: str, arch: ModelArch) -> Desired | None:
    """InvalidSpec when the image's release refuses --enable-lora for this model's class: no pod is rolled out to
    crash on it (catalog/lora_support.yaml; the plan carries vLLM's text)."""
    if not (spec.lora or spec.flags.enable_lora):
        return None
    support = lora_support(arch.architectures, version)
    field = "spec.lora" if spec.lora else "spec.flags.enableLora"
    if support.supported is not False:
        return _lora_vocab_refused(observed, field, version, arch)
    text = refusal_message(support, arch.model_id).splitlines()
    said = next((line.strip() for line in text if "LoRA" in line), text[0] if text else "")
    return _invalid(observed, [SpecError(field, f"vLLM {version} does not serve {support.architecture} with LoRA "
                                                f"(read from {support.basis}); it would print: {said}; remove "
                                                f"{field} or serve a model whose architecture supports LoRA")])


def _lora_vocab_refused(observed: Observed, field: str, version: str, arch: ModelArch) -> Desired | None:
    """InvalidSpec when the release makes the LM head a LoRA target and refuses its vocabulary (planner/lora.py)."""
    check = vocab_check(arch.architectures, arch.vocab_size, version)
    if check is None or not check.refused:
        return None
    return _invalid(observed, [SpecError(field, f"vLLM {version} refuses LoRA on the LM head of {check.architecture} "
                                                f"above {check.limit.max} tokens ({check.vocab} here, read from "
                                                f"{check.basis}); it would print: {check.limit.text}; remove "
                                                f"{field} or use a release with a higher limit")])


@dataclass(frozen=True)
class _Planned:
    """What the plan step leaves for the status step: the spec, the plan and what status shows of them."""

    spec: VLLMServiceSpec
    resolved: ImageVersion
    arch: ModelArch
    gpu: GPUSpec
    product_label: str | None
    constraints: Constraints
    result: Plan
    gpu_status: GPUStatus
    args: list[str]
    dropped: list[str]
    status_plan: PlanStatus
    changed: bool
    secret_updates: list[cond.ConditionUpdate]
    secret_events: list[Event]
    spread: MultiNodePlan | None = None     # the plan over nodes when spec.gpu.maxNodes > 1 (issue 13)
    nodes_per_replica: int = 1
    multi: MultiNodeStatus | None = None    # status.multiNode, when the plan spans nodes
    stop: multinode.Blocker | None = None   # what a spanning plan lacks that does not block the render
    budget_updates: list[cond.ConditionUpdate] = field(default_factory=list)  # PlanBudget (issue 20)
    budget_events: list[Event] = field(default_factory=list)


def _desired_state(observed: Observed) -> Desired:
    """The named steps, each answering early when it cannot go on: validate → resolve image/version → model files →
    arch → GPU/pool → plan → status (and children when the plan fits)."""
    spec = _validate(observed)
    if isinstance(spec, Desired):
        return spec
    resolved = _resolve_image_version(observed, spec)
    if isinstance(resolved, Desired):
        return resolved
    files = _read_model_files(observed, spec)
    if isinstance(files, Desired):
        return files
    arch = _model_arch(observed, spec, files)
    if isinstance(arch, Desired):
        return arch
    refused = _lora_refused(observed, spec, resolved.version, arch)
    if refused is not None:
        return refused
    catalog = observed.catalog or load_gpu_catalog()
    pool = _gpu_and_pool(observed, spec, catalog)
    if isinstance(pool, Desired):
        return pool
    planned = _plan(observed, spec, resolved, arch, catalog, pool)
    shared = _shared(observed, planned)  # spec.gpu.share with neighbours: the group's plan decides (issue 26)
    if isinstance(shared, Desired):
        return shared
    planned, decision = shared
    if not planned.result.fits:
        return _infeasible_status(observed, planned)
    gated = _multinode_gate(observed, planned, pool[4])  # a replica spanning nodes needs LeaderWorkerSet (issue 13)
    if isinstance(gated, Desired):
        return gated
    rendered = _render_children(observed, gated)
    if decision is None:
        return _deployable_status(observed, gated, rendered)
    rendered = replace(rendered, children=sharegroup.shared_children(rendered.children, decision, decision.status.group))
    return _share_conditions(observed, decision, _deployable_status(observed, gated, rendered))


def _shared(observed: Observed, planned: _Planned) -> tuple[_Planned, sharegroup.ShareDecision | None] | Desired:
    """A member of a share group with neighbours: its plan is its share of the group's plan, or the answer says why
    it has none. A service alone in its group (or not sharing) keeps its own plan."""
    group = observed.share
    if planned.spec.gpu.share is None or group is None or len(group.members) < 2:
        return planned, None
    decision = sharegroup.decide(group, observed.name, observed.namespace, planned.gpu, planned.resolved.version)
    spec = planned.spec
    if spec.replicas > 1 or spec.max_replicas or spec.autoscaling is not None:
        # every pod of a member would take the member's whole share of the one GPU
        decision.refusal = (cond.SHARE_DOES_NOT_FIT, (
            f"{observed.name} asks for more than one pod (replicas, maxReplicas or autoscaling); a share group "
            "member runs one pod on its share of a GPU: set replicas 1 without autoscaling, or leave the group"))
    if decision.refusal is not None or decision.plan is None:
        reason, message = decision.refusal or (cond.SHARE_DOES_NOT_FIT, "no share")
        updates = [cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, reason, message),
                   cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, reason, message),
                   cond.ConditionUpdate(cond.READY, cond.FALSE, reason, "no share of a GPU")]
        events = [] if _already_said(observed, reason, message) else [Event(EVENT_WARNING, reason, message)]
        gpu_status = planned.gpu_status.model_copy(update={"share": decision.status})
        return Desired(status=_status(observed, updates, gpu=gpu_status), children=None, events=events,
                       retry_after=60)
    result = decision.plan
    args, dropped = render_args(result.flags, result.vllm_version, tuple(result.pinned))
    before = observed.status.get("plan") or {}
    return replace(planned, result=result, args=args, dropped=dropped,
                   status_plan=plan_status(result, args, planned.status_plan.spec_hash or ""),
                   gpu_status=planned.gpu_status.model_copy(update={"share": decision.status}),
                   changed=(before.get("fits"), before.get("args")) != (result.fits, args)), decision


def _share_conditions(observed: Observed, decision: sharegroup.ShareDecision, desired: Desired) -> Desired:
    """GPUShared (how the GPU is shared; with time-slicing, that memory is not isolated), and Progressing while the
    member waits for a neighbour earlier in its GPU's start order."""
    updates = []
    if decision.condition is not None:
        _, reason, message = decision.condition
        updates.append(cond.ConditionUpdate(cond.GPU_SHARED, cond.TRUE, reason, message))
    if decision.waiting_for is not None:
        message = (f"waiting for {decision.waiting_for} to be Ready with its share: members of one GPU start one at "
                   "a time")
        updates += [cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, cond.WAITING_FOR_NEIGHBOUR, message),
                    cond.ConditionUpdate(cond.READY, cond.FALSE, cond.WAITING_FOR_NEIGHBOUR, message)]
        desired.retry_after = 5 if desired.retry_after is None else min(desired.retry_after, 5)
    desired.status = cond.fold_status(desired.status, conditions=updates,
                                      observed_generation=observed.generation, now=observed.now)
    return desired


def _validate(observed: Observed) -> VLLMServiceSpec | Desired:
    """Step 1: the spec as the CRD and `validate_spec` admit it (plus the name's own limit), the default image set."""
    errors = validate_spec(dict(observed.spec))
    if len(observed.name) > MAX_NAME_LENGTH:
        errors = [SpecError("metadata.name", f"is {len(observed.name)} characters; at most {MAX_NAME_LENGTH} "
                                             "(it labels the pods); use a shorter name"), *errors]
    if errors:
        return _invalid(observed, errors)
    spec = parse_spec(dict(observed.spec))
    if not spec.image:
        spec = spec.model_copy(update={"image": observed.default_image})
    return spec


def _resolve_image_version(observed: Observed, spec: VLLMServiceSpec) -> ImageVersion | Desired:
    """Step 2: the vLLM release the image runs, and every pinned flag that release has."""
    try:
        resolved = image_version(spec.image or DEFAULT_IMAGE, spec.vllm_version)
    except VersionError as exc:
        return _invalid(observed, [SpecError("spec.vllmVersion", str(exc))])
    unsupported = _unsupported_flags(spec, resolved.version)
    if unsupported:
        return _invalid(observed, unsupported)
    return resolved


@dataclass(frozen=True)
class Wants:
    """What the shell reads for a valid spec before the core runs: the model's files (unless inline), the nodes
    matching `node_selector` (a failed listing only costs the pools when `nodes_optional`: spec.gpu.product names the
    GPU, so the plan does not depend on them) and whether the LeaderWorkerSet API is served (`lws`: a plan may span
    nodes)."""

    model: bool
    node_selector: dict[str, str]
    nodes_optional: bool
    lws: bool
    cache_claim: str | None = None  # spec.modelCache.claimName: read it (its access modes decide the rollout)


def wants(observed: Observed) -> Wants | None:
    """What the shell must observe for this service, or None when the spec is invalid: nothing is fetched or read for
    an invalid spec (validation is pure and needs none of it)."""
    try:
        spec = _validate(observed)
        if isinstance(spec, Desired) or isinstance(_resolve_image_version(observed, spec), Desired):
            return None
    except Exception:  # noqa: BLE001 - desired_state answers this spec (InternalError); nothing to read for it
        return None
    # the LeaderWorkerSet API: for a plan that may span nodes, and for a service that may run several pods (on
    # ReadWriteOnce storage each gets a claim of its own as a one-pod group: render/cache.py)
    return Wants(model=not spec.model.config, node_selector=dict(spec.node_selector),
                 nodes_optional=bool(spec.gpu.product),
                 lws=spec.gpu.max_nodes > 1 or cache_pods(spec, observed.status) > 1,
                 cache_claim=spec.model_cache.claim_name if spec.model_cache is not None else None)


def renderer(observed: Observed) -> Callable[[Mapping[str, Any]], Desired]:
    """`desired_state` over what was observed, with another status (the remediation ladder re-plans a stepped
    profile with it): the same plain data, no reads."""

    def render(status: Mapping[str, Any]) -> Desired:
        return desired_state(replace(observed, status=dict(status)))

    return render


def _read_model_files(observed: Observed, spec: VLLMServiceSpec) -> ModelFiles | Desired:
    """Step 3: the model's config.json (+ checkpoint size), only now that the spec is valid."""
    files, model_error = _model_files(observed, spec)
    if files is not None:
        return files
    message = model_error or "the model's config.json could not be read"
    if spec.model.config:  # inline: the spec itself is wrong, retrying cannot help
        return _invalid(observed, [SpecError("spec.model.config", message)])
    updates = [cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, cond.MODEL_NOT_FOUND, message),
               cond.ConditionUpdate(cond.PLAN_FEASIBLE, cond.UNKNOWN, cond.MODEL_NOT_FOUND, message)]
    return _problem(observed, cond.MODEL_NOT_FOUND, message, updates, retry_after=60)


def _model_arch(observed: Observed, spec: VLLMServiceSpec, files: ModelFiles) -> ModelArch | Desired:
    """Step 4: the architecture, its values bounded before any arithmetic on them."""
    try:
        arch = _arch(files, spec)
    except ArchError as exc:
        return _invalid(observed, [SpecError(_config_field(spec), str(exc))])
    except (ValueError, TypeError, ArithmeticError, AttributeError, KeyError) as exc:
        # a value of an unexpected type deep in config.json (quantization_config, rope_scaling, ...)
        return _invalid(observed, [SpecError(_config_field(spec), f"config.json of {spec.model.name} has a value "
                                             f"the planner cannot read ({type(exc).__name__}: {str(exc)[:120]}); "
                                             "use the model's own config.json")])
    pp = spec.flags.pipeline_parallel_size
    if pp is not None and pp > arch.num_layers:  # a stage without layers: its one null block would cap every rank
        return _invalid(observed, [SpecError("spec.flags.pipelineParallelSize", (
            f"{pp} pipeline stages for the {arch.num_layers} decoder layers of {spec.model.name}: each stage needs at "
            f"least one layer; pin at most {arch.num_layers}, or unpin it"))])
    return arch


#: What the GPU/pool step found: the GPU, how it was found, its product label, GPUs per node, the nodes listed.
_GPUChoice = tuple[GPUSpec, str, str | None, int | None, Sequence[Mapping[str, str]]]


def _gpu_and_pool(observed: Observed, spec: VLLMServiceSpec, catalog: GPUCatalog) -> _GPUChoice | Desired:
    """Step 5: the GPU the plan is for, from spec.gpu or the labels of the cluster's GPU nodes."""
    nodes = observed.nodes
    try:
        gpu, how, product_label, node_count = resolve_gpu(spec, nodes, catalog)
    except (UnknownGPUError, ValueError) as exc:
        message = str(exc)
        if spec.gpu.product:
            return _invalid(observed, [SpecError("spec.gpu.product", message)])
        updates = [cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, cond.GPU_NOT_FOUND, message),
                   cond.ConditionUpdate(cond.PLAN_FEASIBLE, cond.UNKNOWN, cond.GPU_NOT_FOUND, message),
                   cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, cond.GPU_NOT_FOUND, "waiting for GPU nodes")]
        return _problem(observed, cond.GPU_NOT_FOUND, message, updates, retry_after=30)
    return gpu, how, product_label, node_count, nodes


def _plan(observed: Observed, spec: VLLMServiceSpec, resolved: ImageVersion, arch: ModelArch, catalog: GPUCatalog,
          pool: _GPUChoice) -> _Planned:
    """Step 6: the plan (with what the remediation ladder learned), its args and what status shows of it."""
    gpu, how, product_label, node_count, nodes = pool
    constraints = constraints_from_status(observed.status)
    with budget.spend() as work:  # bounded work per spec: the searches stop at the budget (planner/budget.py)
        gpu, how, product_label, node_count, result = plan_for_cluster(
            spec, arch, nodes, catalog, constraints, (gpu, how, product_label, node_count))
        request = plan_request(spec, arch, gpu, constraints, node_count)
        pool_nodes = sum(1 for n in nodes if product_label and n.get(LABEL_PRODUCT) == product_label)
        result, spread, nodes_per_replica = _plan_maybe_across_nodes(spec, request, node_count, result, pool_nodes)
    budget_updates, budget_events = _budget_condition(observed, work.report())
    gpu_status = GPUStatus(product=product_label or gpu.name, nodes=nodes_per_replica, memoryGiB=gpu.reported_gib,
                           count=result.gpu_count // nodes_per_replica, source=how)
    secret_updates, secret_events = _secret_warning(observed, spec)
    args, dropped = render_args(result.rendered_flags(), result.vllm_version, tuple(result.pinned))
    digest = spec_hash({"spec": dict(observed.spec), "constraints": constraints.model_dump(), "gpu": gpu.name})
    before = observed.status.get("plan") or {}
    decided_before = (before.get("fits"), before.get("args"), (observed.status.get("gpu") or {}).get("product"))
    return _Planned(spec=spec, resolved=resolved, arch=arch, gpu=gpu, product_label=product_label,
                    constraints=constraints, result=result, gpu_status=gpu_status, args=args, dropped=dropped,
                    status_plan=plan_status(result, args, digest),
                    changed=decided_before != (result.fits, args, product_label or gpu.name),
                    secret_updates=secret_updates, secret_events=secret_events, spread=spread,
                    nodes_per_replica=nodes_per_replica, budget_updates=budget_updates, budget_events=budget_events)


def _budget_condition(observed: Observed, report: budget.BudgetReport | None,
                      ) -> tuple[list[cond.ConditionUpdate], list[Event]]:
    """PlanBudget=True/OverBudget naming the expensive field (and one Warning Event per new message) when planning
    stopped at the work budget; False/WithinBudget once a spec that hit it no longer does; nothing otherwise."""
    before = cond.find_condition(_status(observed, []).conditions, cond.PLAN_BUDGET)
    if report is None:
        if before is None or before.status != cond.TRUE:
            return [], []
        return [cond.ConditionUpdate(cond.PLAN_BUDGET, cond.FALSE, cond.WITHIN_BUDGET,
                                     "planning this spec ran within the operator's work budget")], []
    message = report.message()
    said = before is not None and before.status == cond.TRUE and before.message == message
    return ([cond.ConditionUpdate(cond.PLAN_BUDGET, cond.TRUE, cond.OVER_BUDGET, message)],
            [] if said else [Event(EVENT_WARNING, cond.OVER_BUDGET, message)])


def _infeasible_status(observed: Observed, planned: _Planned) -> Desired:
    """Step 7, when no plan fits: PlanInfeasible with the figures and the options, no children."""
    result, gpu = planned.result, planned.gpu
    summary = result.failure.message if result.failure else "does not fit"
    options = "; ".join(o.summary for o in result.options[:4]) or "none in the GPU catalog"
    message = f"{planned.arch.model_id} does not fit {result.gpu_count}× {gpu.name}: {summary} Options: {options}"
    if planned.resolved.note:
        message += f". {planned.resolved.note}"
    updates = [
        cond.ConditionUpdate(cond.PLAN_FEASIBLE, cond.FALSE, cond.PLAN_INFEASIBLE, message),
        cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, cond.PLAN_INFEASIBLE, message),
        cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, cond.PLAN_INFEASIBLE, "no Deployment: the plan does "
                                                                               "not fit"),
        cond.ConditionUpdate(cond.READY, cond.FALSE, cond.PLAN_INFEASIBLE, "the plan does not fit"),
    ]
    events = [Event(EVENT_WARNING, cond.PLAN_INFEASIBLE, message)] if planned.changed else []
    events.extend(planned.secret_events + planned.budget_events)
    status = _status(observed, updates + planned.secret_updates + planned.budget_updates, plan=planned.status_plan,
                     gpu=planned.gpu_status, multi_node=None)
    return Desired(status=status, children=None, events=events, plan=result)


def previous_still_serves(status: VLLMServiceStatus, *, kind: str, name: str, ready: int, generation: int,
                          now: datetime) -> VLLMServiceStatus:
    """An infeasible plan renders nothing and deletes nothing: the workload of the last plan that fit (`kind`
    `name`, `ready` pods ready, as observed now) still runs. Say so instead of "no Deployment"."""
    pods = f"{ready} pod{'s' if ready != 1 else ''} ready"
    serving = (f"the previous {kind} {name} still serves ({pods}); this spec's plan does not fit, so it is not "
               "rolled out" if ready else
               f"the previous {kind} {name} is kept ({pods}); this spec's plan does not fit, so it is not rolled out")
    updates = [cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, cond.PLAN_INFEASIBLE, serving),
               cond.ConditionUpdate(cond.READY, cond.FALSE, cond.PLAN_INFEASIBLE, serving)]
    return cond.fold_status(status, conditions=updates, observed_generation=generation, now=now, ready_replicas=ready)


def _model_cache(observed: Observed, planned: _Planned) -> CachePlan:
    """Where the weights live: spec.modelCache, else the operator-wide default (a claim that survives restarts and
    remediation steps when the cluster can provide one, an emptyDir otherwise)."""
    spec = planned.spec
    return plan_cache(service=observed.name, namespace=observed.namespace, model=spec.model.name,
                      revision=spec.model.revision, spec=spec.model_cache, settings=observed.cache_settings,
                      default_storage_class=observed.default_storage_class,
                      checkpoint_gib=checkpoint_bytes(planned.arch) / 2**30,
                      max_pods=cache_pods(spec, observed.status) * planned.nodes_per_replica,  # a group: several
                      labels=labels_for(observed.name),
                      owner=OwnerRef(name=observed.name, uid=observed.uid).to_k8s(),
                      shared_storage_class=observed.shared_storage_class, group_pods=planned.nodes_per_replica > 1,
                      lws_served=bool(observed.lws_installed), previous_workload=_running_kind(observed),
                      user_claim=_user_claim(observed, spec))


def _user_claim(observed: Observed, spec: VLLMServiceSpec) -> ObservedClaim | None:
    """The claim spec.modelCache.claimName names as observed, when it is that claim (None: not read)."""
    claim = observed.cache_claim
    named = spec.model_cache.claim_name if spec.model_cache is not None else None
    return claim if claim is not None and claim.name == named else None


def _running_kind(observed: Observed) -> str | None:
    """The workload kind the service runs on as its status records it (None for a status without one)."""
    kind = observed.status.get("workload")
    return str(kind) if isinstance(kind, str) else None


@dataclass(frozen=True)
class _Download:
    """How the weights reach the cache: by the init container or by vLLM, and the rate the probe budgets with."""

    init: bool
    why: str
    rate_mib_per_s: float | None
    checkpoint_bytes: int
    shape_pods: int | None   # the pods a persistent cache was shaped for (None: not persistent, nothing to keep)

    def status(self, observed: Observed) -> ModelCacheStatus:
        """status.modelCache: the measurement as recorded (pod hook), the init choice, the checkpoint's size and
        the budget's rate."""
        budget = int(self.rate_mib_per_s * 2**20) if self.rate_mib_per_s else None
        current = ModelCacheStatus.model_validate(observed.status.get("modelCache") or {})
        return current.model_copy(update={"download_init": self.init, "budget_bytes_per_second": budget,
                                          "checkpoint_bytes": self.checkpoint_bytes, "shape_pods": self.shape_pods})


def _download(observed: Observed, planned: _Planned, cache: CachePlan) -> _Download:
    spec = planned.spec
    init, why = download_init_wanted(cache, observed.cache_settings, [e.to_dict() for e in spec.env],
                                     spec.extra_args)
    return _Download(init=init, why=why, rate_mib_per_s=budget_rate(observed.status.get("modelCache"),
                                                                    args_changed=planned.changed),
                     checkpoint_bytes=checkpoint_bytes(planned.arch),
                     shape_pods=cache_pods(spec, observed.status) if cache.persistent else None)


def _engine_budget(observed: Observed, planned: _Planned) -> float:
    """Seconds the startup probe allows for vLLM's engine start: from the measured starts (status.coldStart) when
    vLLM's arguments change anyway, else what the current template was budgeted with (no rollout for a
    measurement alone)."""
    stored = observed.status.get("coldStart") or {}
    if planned.changed:
        return engine_seconds_budget(stored, ENGINE_START_SECONDS)
    kept = stored.get("budgetEngineSeconds")
    return float(kept) if isinstance(kept, (int, float)) and not isinstance(kept, bool) else ENGINE_START_SECONDS


def _cold_start_status(observed: Observed, engine_seconds: float) -> ColdStartStatus | None:
    stored = observed.status.get("coldStart")
    if not stored and engine_seconds == ENGINE_START_SECONDS:
        return None
    current = ColdStartStatus.model_validate(stored or {})
    return current.model_copy(update={"budget_engine_seconds": engine_seconds})


def _render_input(observed: Observed, planned: _Planned, cache: CachePlan, download: _Download) -> RenderInput:
    """What the renderer needs of the spec, the plan and the model cache."""
    spec, result, constraints = planned.spec, planned.result, planned.constraints
    return RenderInput(
        name=observed.name, namespace=observed.namespace, owner=OwnerRef(name=observed.name, uid=observed.uid),
        model=spec.model.name, revision=spec.model.revision, served_name=spec.model.served_name,
        image=spec.image or DEFAULT_IMAGE, image_pull_policy=spec.image_pull_policy or "IfNotPresent",
        vllm_version=result.vllm_version, flags=result.rendered_flags(), pinned=tuple(result.pinned),
        extra_args=tuple(spec.extra_args), gpu_count=result.gpu_count // planned.nodes_per_replica,
        gpu_product_label=planned.product_label,
        weights_gib_total=checkpoint_bytes(planned.arch) / 2**30, replicas=desired_replicas(spec, observed.status),
        node_selector=dict(spec.node_selector),
        tolerations=tuple(t.to_dict() for t in spec.tolerations), affinity=spec.affinity.to_dict() if spec.affinity else None,
        env=tuple(e.to_dict() for e in spec.env),
        hf_token_secret=spec.hf_token_secret_ref.name if spec.hf_token_secret_ref else None,
        hf_token_key=spec.hf_token_secret_ref.key if spec.hf_token_secret_ref else "HF_TOKEN",
        cache_volume=cache.volume, cache_claim_template=cache.claim_template,
        per_pod_workload=cache.per_pod_workload or "LeaderWorkerSet", roll_without_surge=cache.exclusive,
        download_init=download.init, compile_cache=cache.persistent,
        startup_failure_threshold=startup_failure_threshold(
            checkpoint_bytes(planned.arch) / 2**30, download_mib_per_s=observed.cache_settings.download_mib_per_s,
            measured_mib_per_s=download.rate_mib_per_s, download=not download.init,
            engine_seconds=_engine_budget(observed, planned)),
        cache_mount_path=spec.model_cache.mount_path if spec.model_cache else "/root/.cache/huggingface",
        memory=str(spec.resources.memory) if spec.resources.memory else (
            f"{int(constraints.host_memory_gib)}Gi" if constraints.host_memory_gib else None),
        cpu=str(spec.resources.cpu) if spec.resources.cpu else None,
        shm_size=str(spec.resources.shm_size) if spec.resources.shm_size else None,
        service_type=spec.service.type, service_port=spec.service.port,
        trust_remote_code=bool(spec.flags.trust_remote_code),
        security_profile=spec.security.profile, run_as_user=spec.security.run_as_user,
    )


@dataclass(frozen=True)
class _Rendered:
    """What the render step leaves for the status step: the children, their conditions, the optional children to
    delete (an autoscaler or InferencePool no longer asked for)."""

    render: RenderInput
    children: list[dict[str, Any]]
    kind: Kind      # the workload: a Deployment, a LeaderWorkerSet (a plan over nodes, or one-pod groups with their
    #                 own claims) or a StatefulSet (a claim per pod where the LeaderWorkerSet API is not served)
    updates: list[cond.ConditionUpdate]
    stale: list[tuple[str, str]]
    model_cache: ModelCacheStatus
    cold_start: ColdStartStatus | None


def _serving(observed: Observed, kind: Kind) -> ServingPods:
    """The pods that serve the service in this plan's shape (a Deployment's or StatefulSet's pods, or a
    LeaderWorkerSet's leaders)."""
    return serving_pods(observed.name, observed.namespace, kind=kind)


def _render_children(observed: Observed, planned: _Planned) -> _Rendered:
    """Step 7, when the plan fits: the children rendered as data — the model cache claim, Service and Deployment
    (a LeaderWorkerSet when one replica spans nodes),
    then the ecosystem objects (HPA or KEDA ScaledObject, InferencePool) — and the conditions they report."""
    spec = planned.spec
    cache = _model_cache(observed, planned)
    download = _download(observed, planned, cache)
    render = _render_input(observed, planned, cache, download)
    # a Deployment; a LeaderWorkerSet when one replica spans nodes (issue 13) or each pod needs a claim (issue 25),
    # a StatefulSet for that claim where the LeaderWorkerSet API is not served
    kind = multinode.workload_kind(render, planned.nodes_per_replica)
    children = ([cache.claim] if cache.claim else []) + multinode.children_for(
        render, planned.nodes_per_replica, multinode.group_options(spec, planned.spread))
    deployment = child_names(observed.name).deployment
    extras = ecosystem_children(
        name=observed.name, child_name=deployment, namespace=observed.namespace, spec=spec,
        owner=render.owner.to_k8s(), labels=labels_for(observed.name), pods=_serving(observed, kind),
        served=observed.served_kinds,
        conditions=observed.status.get("conditions") or [], checkpoint_gib=checkpoint_bytes(planned.arch) / 2**30,
        persistent_cache=cache.persistent, cold_start=observed.status.get("coldStart"))
    message = f"{cache.message}; {download.why}" if download.why else cache.message
    failing = (observed.status.get("modelCache") or {}).get("downloadError") if download.init else None
    if failing:
        message += (f"; the model-download init container of pod "
                    f"{(observed.status.get('modelCache') or {}).get('downloadErrorPod')} fails: {failing}")
    updates = [cond.ConditionUpdate(cond.MODEL_CACHE, cond.TRUE if cache.persistent and cache.fits else cond.FALSE,
                                    cache.reason, message), *extras.updates]
    return _Rendered(render=render, children=children + extras.children, kind=kind, updates=updates,
                     stale=extras.stale,
                     model_cache=download.status(observed),
                     cold_start=_cold_start_status(observed, _engine_budget(observed, planned)))


def _deployable_status(observed: Observed, planned: _Planned, rendered: _Rendered) -> Desired:
    """Step 7, when the plan fits: PlanFeasible with the args and KV tokens, rollout progress, the children."""
    spec, result, gpu, resolved = planned.spec, planned.result, planned.gpu, planned.resolved
    render, children = rendered.render, rendered.children
    ready = (observed.status.get("readyReplicas") or 0)
    message = (f"{result.gpu_count}× {gpu.name}: " + " ".join(planned.args) +
               f" → {result.prediction.kv_cache_tokens} KV tokens")
    if not result.usable:
        trade = next((r for r in result.reasons if r.startswith("Trade-off:")), "")
        message += f". {trade}" if trade else ""
    if resolved.note:
        message += f". {resolved.note}"
    updates = [
        cond.ConditionUpdate(cond.PLAN_FEASIBLE, cond.TRUE,
                             cond.VERSION_ASSUMED if resolved.note else cond.PLAN_FITS, message),
        *rendered.updates,
    ]
    degraded = cond.find_condition(_status(observed, []).conditions, cond.DEGRADED)
    if degraded is None or degraded.reason in (cond.INVALID_SPEC, cond.PLAN_INFEASIBLE, cond.MODEL_NOT_FOUND,
                                               cond.GPU_NOT_FOUND, cond.LWS_NOT_INSTALLED,
                                               cond.MULTI_NODE_UNSUPPORTED):
        updates.append(cond.ConditionUpdate(cond.DEGRADED, cond.FALSE, cond.AS_EXPECTED, "no problem seen"))
    if ready < spec.replicas and not _pods_said(observed):
        updates.append(cond.ConditionUpdate(cond.PROGRESSING, cond.TRUE, cond.DEPLOYING,
                                            f"{ready}/{spec.replicas} pods ready"))
        updates.append(cond.ConditionUpdate(cond.READY, cond.FALSE, cond.PODS_NOT_READY,
                                            f"{ready}/{spec.replicas} pods ready"))
    updates.extend(multinode.progress_updates(planned.stop))
    events: list[Event] = []
    if planned.changed:
        events.append(Event(EVENT_NORMAL, "Planned", message))
        events.extend(Event(EVENT_NORMAL, "FlagDropped", why) for why in planned.dropped)
    events.extend(planned.secret_events + planned.budget_events)
    updates.extend(planned.secret_updates + planned.budget_updates)
    endpoint = f"http://{child_names(observed.name).service}.{observed.namespace}.svc:{spec.service.port}/v1"
    selector = _serving(observed, rendered.kind).label_selector()  # the /scale subresource's: the HPA's pods
    status = _status(observed, updates, plan=planned.status_plan, gpu=planned.gpu_status, endpoint=endpoint,
                     selector=selector, replicas=render.replicas, ready_replicas=ready, multi_node=planned.multi,
                     workload=rendered.kind,
                     model_cache=rendered.model_cache, cold_start=rendered.cold_start)
    return Desired(status=status, children=children, events=events, plan=result, stale=rendered.stale)


def _plan_maybe_across_nodes(spec: VLLMServiceSpec, request: PlanRequest, node_count: int | None, result: Plan,
                             pool_nodes: int) -> tuple[Plan, MultiNodePlan | None, int]:
    """The plan over up to spec.gpu.maxNodes nodes of the chosen pool when that is more than one, and the nodes one
    replica spans; with one node allowed, the pool's plan with 'Span N nodes' among its options when it does not fit
    (issue 13)."""
    spread = multinode.plan_spread(spec, request, node_count)
    if spread is None:
        spanned = multinode.with_spanning_option(result, spec, request, node_count, pool_nodes)
        return spanned.model_copy(update={"options": rank_options(spanned.options, in_cluster=True)}), None, 1
    return spread.plan, spread, spread.split.nodes


def _multinode_gate(observed: Observed, planned: _Planned, nodes: Sequence[Mapping[str, str]]) -> _Planned | Desired:
    """Step 7, for a plan that spans nodes: its status and what is missing (the LeaderWorkerSet API, enough nodes,
    a release that runs multi-node); the answer instead of children when that blocks the render."""
    spread, spec = planned.spread, planned.spec
    if spread is None or not spread.spans_nodes:
        return planned
    multi = multinode.multinode_status(spread, observed.name, observed.status.get("multiNode"))
    label = planned.product_label
    pool = None if spec.gpu.product else sum(1 for n in nodes if n.get(LABEL_PRODUCT) == label)
    stop = multinode.blocker(spread, spread.plan.vllm_version, lws_installed=observed.lws_installed,
                             pool_nodes=pool)
    if stop is None or not stop.blocks:
        return replace(planned, multi=multi, stop=stop)
    updates = [cond.ConditionUpdate(cond.DEGRADED, cond.TRUE, stop.reason, stop.message),
               cond.ConditionUpdate(cond.PROGRESSING, cond.FALSE, stop.reason, stop.message),
               cond.ConditionUpdate(cond.READY, cond.FALSE, stop.reason, "no LeaderWorkerSet: " + stop.reason)]
    events = [] if _already_said(observed, stop.reason, stop.message) else [
        Event(EVENT_WARNING, stop.reason, stop.message)]
    events.extend(planned.budget_events)
    status = _status(observed, updates + planned.budget_updates, plan=planned.status_plan, gpu=planned.gpu_status,
                     multi_node=multi)
    return Desired(status=status, children=None, events=events, plan=spread.plan, retry_after=stop.retry_after)


def desired_replicas(spec: VLLMServiceSpec, status: Mapping[str, Any]) -> int:
    """spec.replicas, or what the metrics watch scaled to when the user allowed a range (spec.maxReplicas)."""
    if spec.autoscaling is not None:  # an autoscaler writes spec.replicas: follow it, never override it
        return spec.replicas
    scaled = ((status.get("metrics") or {}).get("desiredReplicas"))
    if spec.max_replicas is None or not isinstance(scaled, int) or not (spec.prometheus and spec.prometheus.enabled):
        return spec.replicas
    return max(spec.replicas, min(scaled, spec.max_replicas))


def cache_pods(spec: VLLMServiceSpec, status: Mapping[str, Any]) -> int:
    """The pods the model cache is shaped for: what the service may become (max_pods), and never fewer than it was
    shaped for before (status.modelCache.shapePods) — a scale back to one pod keeps the shared cache, so no scale
    changes the pod template twice."""
    before = (status.get("modelCache") or {}).get("shapePods")
    return max(max_pods(spec), before if isinstance(before, int) and not isinstance(before, bool) else 0)


def max_pods(spec: VLLMServiceSpec) -> int:
    """The most pods this service may run (spec.replicas, spec.maxReplicas, spec.autoscaling.maxReplicas)."""
    return max(spec.replicas, spec.max_replicas or 0, spec.autoscaling.max_replicas if spec.autoscaling else 0, 1)
