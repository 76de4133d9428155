"""The VLLMService status models: written by the operator only, read back tolerantly (unknown fields ignored)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from .flags import FlagMap
from .schema import FreeForm, _StatusModel
from .switch import WorkloadSwitch

# --------------------------------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------------------------------


class Condition(_StatusModel):
    """A standard Kubernetes condition."""

    type: str = Field(min_length=1, description="Ready, Progressing, Degraded, PlanFeasible or MetricsAvailable.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(min_length=1, description="CamelCase reason, one of the constants in the operator.")
    message: str = Field(
        default="", description="What happened and, when something is wrong, what to change."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec this condition was computed from."
    )
    last_transition_time: str = Field(
        json_schema_extra={"format": "date-time"},
        description="When status last changed (RFC 3339).",
    )


class MemoryBreakdown(_StatusModel):
    """Where the planned GPU memory goes, per GPU, in GiB, as vLLM's startup log reports it (the tightest worker or
    pipeline stage). The planner computes it (`planner.memory.predict_startup`) and status shows it as computed."""

    gpu_total_gib: float = Field(alias="gpuTotalGiB", ge=0, description="Total memory of one GPU.")
    requested_gib: float = Field(
        alias="requestedGiB", ge=0, description="What vLLM may use: total x gpu-memory-utilization."
    )
    weights_gib: float = Field(alias="weightsGiB", ge=0, description="This GPU's share of the weights.")
    activation_gib: float = Field(
        alias="activationGiB", ge=0, description="Peak activation memory of a forward pass."
    )
    non_torch_gib: float = Field(
        alias="nonTorchGiB", ge=0, description="CUDA context, NCCL buffers and the like."
    )
    cudagraph_gib: float = Field(
        alias="cudagraphGiB", ge=0, description="CUDA graphs (0 with enforce-eager)."
    )
    kv_cache_gib: float = Field(alias="kvCacheGiB", ge=0, description="What is left for the KV cache.")
    headroom_gib: float = Field(
        default=0.0, alias="headroomGiB", ge=0,
        description="Total minus requested: CUDA context, CUDA graphs (before vLLM 0.21), other processes.",
    )
    persistent_gib: float = Field(
        default=0.0, alias="persistentGiB", ge=0,
        description="Taken out of the KV cache budget besides the above (vLLM 0.27+): Model Runner V2's sampler "
                    "state and allocator leftovers.",
    )
    estimated: list[str] = Field(
        default_factory=list,
        description="The figures above (field names) that rest on an estimate no vLLM log has calibrated yet.",
    )


class PlanFailure(_StatusModel):
    """Why no plan fits."""

    kind: str = Field(
        min_length=1, description="Class of the failure, e.g. WeightsDoNotFit or KVCacheTooSmall."
    )
    message: str = Field(description="What does not fit, with the numbers.")


class PlanOption(_StatusModel):
    """An alternative that would fit, offered when the spec as written does not."""

    model_config = ConfigDict(extra="allow")

    summary: str = Field(min_length=1, description="The change, in words, e.g. 'use 2 GPUs per pod (TP=2)'.")
    flags: FlagMap = Field(default_factory=dict, description="The flags the alternative would run with.")
    gpu_count: int | None = Field(default=None, ge=1, description="GPUs per pod of the alternative.")
    gpu_product: str | None = Field(default=None, description="GPU product of the alternative.")


class PlanStatus(_StatusModel):
    """The flags the operator computed, and why."""

    fits: bool = Field(description="Whether the model and the workload fit the GPUs with these flags.")
    flags: FlagMap = Field(
        default_factory=dict,
        description="Planned and pinned vLLM flags, named as in spec.flags, e.g. maxModelLen: 32768.",
    )
    args: list[str] = Field(
        default_factory=list, description="The vLLM command-line arguments rendered from the plan."
    )
    memory: MemoryBreakdown | None = Field(default=None, description="Planned GPU memory per GPU.")
    kv_cache_tokens: int | None = Field(default=None, ge=0, description="Tokens the planned KV cache holds.")
    max_concurrency: float | None = Field(
        default=None, ge=0, description="Requests of max-model-len tokens the KV cache holds at once."
    )
    reasons: list[str] = Field(default_factory=list, description="How each flag was chosen, in words.")
    failure: PlanFailure | None = Field(default=None, description="Why it does not fit, when it does not.")
    options: list[PlanOption] = Field(default_factory=list, description="Alternatives that would fit.")
    vllm_version: str | None = Field(default=None, description="vLLM version the plan was computed for.")
    spec_hash: str | None = Field(default=None, description="Hash of the spec fields the plan depends on.")


class StageStatus(_StatusModel):
    """One pipeline stage's GPU (one tensor-parallel rank), as its worker's startup would report it."""

    stage: int = Field(ge=0, description="Pipeline stage (with TP = GPUs per node: the node's rank).")
    first_layer: int = Field(ge=0, description="First decoder layer of the stage.")
    layers: int = Field(ge=0, description="Decoder layers on the stage (vLLM's get_pp_indices split).")
    weights_gib: float = Field(alias="weightsGiB", ge=0, description="Weights per GPU, GiB.")
    activation_gib: float = Field(alias="activationGiB", ge=0, description="Activation peak per GPU, GiB.")
    kv_cache_gib: float = Field(alias="kvCacheGiB", ge=0, description="KV cache memory per GPU, GiB.")
    num_blocks: int = Field(ge=0, description="KV blocks the stage could hold (vLLM takes the minimum).")


class GroupFailureStatus(_StatusModel):
    """A failure of one pod of a LeaderWorkerSet group, recorded from the pod before the group is recreated."""

    pod: str = Field(description="Pod name (<lws>-<group> for the leader, <lws>-<group>-<worker> for workers).")
    pod_uid: str = Field(alias="podUID", description="Pod UID (a recreated group has new pods).")
    node_rank: int = Field(ge=0, description="vLLM --node-rank (the LWS worker index; 0 = leader).")
    stages: list[int] = Field(default_factory=list, description="Pipeline stages whose ranks ran on this pod.")
    failure_class: str = Field(description="The classifier's class (Network: NCCL/Gloo/ZMQ, never a memory flag).")
    summary: str = Field(description="One line of what failed.")
    time: str = Field(json_schema_extra={"format": "date-time"}, description="When it was seen (RFC 3339).")


class MultiNodeStatus(_StatusModel):
    """How one replica spans nodes (set only when the plan spans more than one node)."""

    nodes: int = Field(ge=1, description="Nodes per replica (the LeaderWorkerSet size).")
    gpus_per_node: int = Field(ge=1, description="GPUs each pod requests.")
    tensor_parallel_size: int = Field(ge=1, description="Tensor parallel size (inside a node).")
    pipeline_parallel_size: int = Field(ge=1, description="Pipeline parallel size (across nodes).")
    limiting_stage: int = Field(ge=0, description="The stage with the fewest KV blocks: it caps every stage's KV.")
    stages: list[StageStatus] = Field(default_factory=list, description="Memory per pipeline stage.")
    leader_worker_set: str | None = Field(default=None, description="Name of the LeaderWorkerSet.")
    group_recreations: int = Field(
        default=0, ge=0, description="Groups recreated by LeaderWorkerSet after a pod failed (profile changes excluded)."
    )
    leaders: dict[str, str] = Field(
        default_factory=dict, description="Leader pod UID and plan hash per group index, to count recreations."
    )
    failures: list[GroupFailureStatus] = Field(
        default_factory=list, description="The latest pod failures of the groups (first failure first), at most 8."
    )


class ShareMemberStatus(_StatusModel):
    """One member of a shared GPU, with its share."""

    name: str = Field(description="The member VLLMService.")
    utilization: float = Field(ge=0, le=1, description="Its --gpu-memory-utilization.")
    budget_gib: float = Field(alias="budgetGiB", ge=0, description="Its budget: total × utilization, GiB.")
    footprint_gib: float = Field(alias="footprintGiB", ge=0,
                                 description="Budget plus what its process holds outside it (CUDA context, NCCL, "
                                             "graphs where not budgeted), GiB.")


class ShareStatus(_StatusModel):
    """The shared GPU this service runs on, as its group's plan (recorded before any pod changes) gives it."""

    group: str = Field(description="spec.gpu.share.group.")
    gpu_index: int | None = Field(default=None, ge=0, description="The group's GPU this service is placed on.")
    mode: str | None = Field(default=None, description="How the GPU is shared: dra or time-slicing.")
    claim: str | None = Field(default=None, description="DRA: the ResourceClaim of the shared GPU.")
    node: str | None = Field(default=None, description="Time-slicing: the single-GPU node the members share.")
    gpu_total_gib: float | None = Field(default=None, alias="gpuTotalGiB", ge=0, description="The GPU's total, GiB.")
    free_gib: float | None = Field(default=None, alias="freeGiB",
                                   description="What the members' footprints leave free, GiB.")
    members: list[ShareMemberStatus] = Field(default_factory=list, max_length=64,
                                             description="Every member on this GPU, in start order.")
    start_position: int | None = Field(default=None, ge=0,
                                       description="Members of one GPU start one at a time: this one's place.")
    message: str | None = Field(default=None, description="Why it is not placed, when it is not.")


class GPUStatus(_StatusModel):
    """The GPUs the plan is for."""

    product: str | None = Field(default=None, description="GPU product, e.g. NVIDIA-H100-80GB-HBM3.")
    count: int | None = Field(default=None, ge=0, description="GPUs per pod.")
    nodes: int | None = Field(
        default=None, ge=0, description="Nodes (pods) one replica spans: 1, or the LeaderWorkerSet group size."
    )
    memory_gib: float | None = Field(
        default=None, alias="memoryGiB", ge=0, description="Memory of one GPU in GiB."
    )
    source: str | None = Field(
        default=None,
        description="How the product was found: from the spec, from node labels, or from the catalog.",
    )
    share: ShareStatus | None = Field(default=None, description="The shared GPU, with spec.gpu.share.")


class RemediationEvent(_StatusModel):
    """One remediation step taken."""

    step: int = Field(ge=0, description="Step number after this change (1 = first step away from the plan).")
    time: str = Field(
        json_schema_extra={"format": "date-time"}, description="When the step was taken (RFC 3339)."
    )
    failure_class: str = Field(description="The classified failure, e.g. KVCacheTooSmall or CUDAOOMStartup.")
    evidence: str = Field(
        default="", description="The log line or termination message the class was read from."
    )
    pod_uid: str | None = Field(default=None, alias="podUID", description="UID of the pod that failed.")
    restart_count: int | None = Field(default=None, ge=0, description="The container's restart count then.")
    flags_before: FlagMap = Field(default_factory=dict, description="Flags before the step.")
    flags_after: FlagMap = Field(default_factory=dict, description="Flags after the step.")
    profile_before: FlagMap = Field(
        default_factory=dict, description="The ladder's constraints before this step (what a step back restores)."
    )
    message: str = Field(default="", description="What was changed and why.")


class RemediationStatus(_StatusModel):
    """Where the operator is on the remediation ladder."""

    step: int = Field(
        default=0, ge=0, description="Steps currently applied on top of the plan (0 = the plan)."
    )
    profile: FlagMap = Field(
        default_factory=dict,
        description="Constraints the ladder learned (e.g. maxModelLen, gpuFreeGib), applied on top of the plan.",
    )
    history: list[RemediationEvent] = Field(default_factory=list, description="Steps taken, oldest first.")
    exhausted: bool = Field(default=False, description="No further step is allowed or would help.")
    last_failure_key: str | None = Field(
        default=None,
        description="Identifies the last failure acted on, so one failure is acted on only once.",
    )
    handled_keys: list[str] = Field(
        default_factory=list,
        description="Failures (pod UID/restart count) already reported without a step, newest last (at most 20).",
    )
    inputs_hash: str | None = Field(
        default=None,
        max_length=64,
        description="Hash of the plan's inputs the profile was learned on (model, GPU request, image and vLLM "
                    "release, pinned flags and extra args, workload, LoRA). The profile is reset when they change, "
                    "and only then: replicas, labels, annotations, env and other plan-neutral edits keep it.",
    )


class KVCacheStatus(_StatusModel):
    """The KV cache vLLM measured at startup ("GPU KV cache size: N tokens") next to the plan's prediction."""

    measured_tokens: int = Field(ge=0, description="Tokens of KV cache vLLM allocated (its own startup log line).")
    predicted_tokens: int | None = Field(
        default=None, ge=0, description="The plan's prediction for the same flags (status.plan.kvCacheTokens)."
    )
    difference_tokens: int | None = Field(default=None, description="measuredTokens - predictedTokens.")
    difference_percent: float | None = Field(
        default=None, description="The difference as a percentage of the prediction (negative: vLLM has less)."
    )
    pod: str = Field(max_length=253, description="The pod whose log said it (a Deployment pod or a group leader).")
    template: str | None = Field(
        default=None, max_length=64,
        description="The pod's plan annotation (vllm-operator.dev/plan): the profile the measurement belongs to.",
    )
    time: str = Field(json_schema_extra={"format": "date-time"}, description="When it was read (RFC 3339).")
    max_model_len: int | None = Field(
        default=None, ge=0,
        description="The context vLLM's `--max-model-len auto` chose at startup (its \"Auto-fit max_model_len\" "
                    "line); unset when the length was explicit.",
    )
    planned_max_model_len: int | None = Field(
        default=None, ge=0, description="The context the plan expected `auto` to keep (status.plan.flags.maxModelLen).",
    )


class MetricsStatus(_StatusModel):
    """vLLM metrics observed through Prometheus."""

    kv_cache_usage: float | None = Field(default=None, ge=0, le=1, description="KV cache usage, 0 to 1.")
    preemption_rate: float | None = Field(default=None, ge=0, description="Preemptions per second.")
    waiting: float | None = Field(default=None, ge=0, description="Requests waiting.")
    running: float | None = Field(default=None, ge=0, description="Requests running.")
    time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When these were observed (RFC 3339).",
    )
    desired_replicas: int | None = Field(
        default=None, ge=0,
        description="Replicas the metrics watch scaled to, within spec.replicas..spec.maxReplicas (the Deployment "
                    "is rendered with it; spec is never written).",
    )
    recommendation: str | None = Field(default=None, description="The last advice the metrics watch gave.")


class PrewarmNodeStatus(_StatusModel):
    """One node of the pool being warmed."""

    node: str = Field(max_length=253, description="The node.")
    state: str = Field(max_length=32, description="Pending, Pulling (the image), Filling (the cache), Done, or "
                                                  "Failing (with the reason).")
    message: str | None = Field(default=None, max_length=512, description="Why it fails, while it does.")


class PrewarmStatus(_StatusModel):
    """spec.modelCache.prewarm: what was warmed, and where (render/prewarm.py)."""

    key: str | None = Field(default=None, description="What was warmed: image, model, revision, pool and cache.")
    phase: str | None = Field(default=None, description="Running, Done, or Skipped (no node of the pool yet).")
    nodes: list[PrewarmNodeStatus] = Field(default_factory=list, max_length=64,
                                           description="Per node (the first 64 by name).")
    ready: int | None = Field(default=None, ge=0, description="Nodes done.")
    desired: int | None = Field(default=None, ge=0, description="Nodes of the pool the DaemonSet runs on.")
    daemon_set: str | None = Field(default=None, description="The prewarm DaemonSet's name, while it exists.")


class ModelCacheStatus(_StatusModel):
    """How the weights reach the model cache, and the download last measured (render/cache.py)."""

    download_init: bool | None = Field(
        default=None, description="Whether the model-download init container fills the cache before vLLM starts."
    )
    checkpoint_bytes: int | None = Field(
        default=None, ge=0, description="The checkpoint's size as the planner knows it (what vLLM downloads)."
    )
    downloaded_bytes: int | None = Field(default=None, ge=0, description="Bytes the last measured download fetched.")
    download_seconds: float | None = Field(default=None, ge=0, description="Seconds the last measured download took.")
    bytes_per_second: int | None = Field(default=None, ge=0, description="The measured download rate.")
    measured_pod: str | None = Field(default=None, description="The pod whose download was measured.")
    measured_by: str | None = Field(
        default=None, description="How it was measured: init-container (its termination message) or vllm-log."
    )
    measured_at: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, description="When the measured download ended."
    )
    download_error: str | None = Field(
        default=None, description="Why the model-download init container fails (its last log lines), while it does."
    )
    download_error_pod: str | None = Field(default=None, description="The pod whose download fails.")
    shape_pods: int | None = Field(
        default=None, ge=0,
        description="The most pods the persistent cache was shaped for (its bounds, and any replica count it had): a "
                    "scale back below it keeps the cache's shape, so scaling never switches the pod template back.",
    )
    budget_bytes_per_second: int | None = Field(
        default=None, ge=0,
        description="The rate the current startup budget was computed with (unset: the operator's assumed rate). "
                    "A new measurement takes effect at the next change of vLLM's arguments, never by itself.",
    )
    prewarm: PrewarmStatus | None = Field(default=None, description="spec.modelCache.prewarm's progress.")


def _phase(description: str) -> Any:
    return Field(default=None, ge=0, description=description)


class ColdStartStatus(_StatusModel):
    """How long the service's last measured pod start took, phase by phase (render/coldstart.py)."""

    pod_start_seconds: float | None = _phase("Scheduled to the first container started: image pull, volume attach.")
    image_pull_seconds: float | None = _phase(
        "The image pull alone, from the kubelet's Pulled Events (0: the image was on the node already).")
    image_bytes: int | None = Field(default=None, ge=0, description="The image size the kubelet reported.")
    download_seconds: float | None = _phase("The weight download (init container, or vLLM's own line).")
    load_seconds: float | None = _phase("vLLM loading the weights into GPU memory.")
    compile_seconds: float | None = _phase("torch.compile (or loading its cached result).")
    graph_capture_seconds: float | None = _phase("CUDA-graph capture.")
    engine_init_seconds: float | None = _phase("vLLM's engine start: profiling, KV cache, compile, graphs.")
    ready_seconds: float | None = _phase("Scheduled to the vLLM container Ready: the whole start.")
    slowest_engine_init_seconds: float | None = _phase(
        "The slowest engine start measured for this service: what the startup probe budgets (times 2).")
    budget_engine_seconds: float | None = _phase(
        "What the current startup probe allows for the engine start: 2 × the slowest measured, taken at the next "
        "change of vLLM's arguments (a measurement alone never rolls the pods out); unset: the assumed 600 s.")
    starts: int | None = Field(default=None, ge=0, description="Pod starts measured so far.")
    compile_cache: str | None = Field(
        default=None, description="Where vLLM's compile and CUDA-graph caches were: persistent (the model cache "
                                  "claim, per vLLM release and GPU) or ephemeral (compiled again on every start).")
    measured_pod: str | None = Field(default=None, description="The pod whose start was measured last.")
    measured_at: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, description="When that pod became Ready."
    )


class VLLMServiceStatus(_StatusModel):
    """Observed state of a VLLMService. Written by the operator only."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec last reconciled."
    )
    state: str | None = Field(
        default=None,
        description="One word for the STATUS column of `kubectl get vllms`, derived from the conditions: Ready, "
                    "RollingOut, Downloading (the model-download init container runs), ScaledToZero, Pending, or what is "
                    "wrong (InvalidSpec, Infeasible, ModelNotFound, Unschedulable, ModelDownloadFailed, Remediating, "
                    "RemediationExhausted, a pod failure such as ContainerCrashLoopBackOff).",
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Progressing, Degraded and PlanFeasible."
    )
    plan: PlanStatus | None = Field(default=None, description="The flags the operator computed, and why.")
    gpu: GPUStatus | None = Field(default=None, description="The GPUs the plan is for.")
    multi_node: MultiNodeStatus | None = Field(
        default=None, description="How one replica spans nodes, when the plan spans more than one."
    )
    workload: Literal["Deployment", "LeaderWorkerSet", "StatefulSet"] | None = Field(
        default=None, description="The workload kind the recorded plan runs on: a LeaderWorkerSet when one replica "
                                  "spans nodes, or when each pod needs a cache claim of its own (several pods on "
                                  "ReadWriteOnce storage: one pod per group) and the LeaderWorkerSet API is served; "
                                  "a StatefulSet for that claim per pod where it is not (volumeClaimTemplates); a "
                                  "Deployment otherwise."
    )
    workload_switch: WorkloadSwitch | None = Field(
        default=None, description="A switch between workload kinds (Deployment, LeaderWorkerSet, StatefulSet) under "
                                  "way: each step is recorded here "
                                  "before it acts (docs/convergence.md)."
    )
    replicas: int | None = Field(
        default=None, ge=0, description="Pods that exist (the scale subresource reads it)."
    )
    ready_replicas: int | None = Field(default=None, ge=0, description="Pods that are ready.")
    selector: str | None = Field(
        default=None,
        description="Label selector of the pods, for the scale subresource (HorizontalPodAutoscaler).",
    )
    endpoint: str | None = Field(
        default=None, description="URL of the OpenAI-compatible API inside the cluster."
    )
    remediation: RemediationStatus | None = Field(default=None, description="Remediation steps taken.")
    metrics: MetricsStatus | None = Field(default=None, description="vLLM metrics last observed.")
    kv_cache: KVCacheStatus | None = Field(
        default=None,
        description="What vLLM measured of its KV cache next to the plan's prediction, for the current profile's pods.",
    )
    model_cache: ModelCacheStatus | None = Field(
        default=None, description="How the weights reach the model cache, and the download last measured."
    )
    cold_start: ColdStartStatus | None = Field(
        default=None, description="How long a pod start takes, phase by phase, as last measured."
    )
    kopf: FreeForm | None = Field(
        default=None, description="Bookkeeping of the kopf framework (handler progress)."
    )
