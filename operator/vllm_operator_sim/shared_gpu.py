"""One simulated GPU that several vLLM processes share (issue 26): each start sees the memory the running ones hold.

`SharedGPU.start(name, args, …)` runs the startup simulator with `HiddenFacts.other_process_gib` set to what the
processes already running on this GPU hold; a process that reaches Ready then holds its serving peak — its CUDA
context, weights, non-torch memory, the activation peak it profiled (reused by every forward pass), its KV cache,
and its captured CUDA graphs, all as the simulator measured them with its hidden perturbations (not the planner's
figures) — until `stop(name)`. Pure bookkeeping over `simulate_startup`: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm_operator.modelfiles import ModelFiles
from vllm_operator.planner.arch import ModelArch
from vllm_operator.planner.gpus import GPUSpec
from vllm_operator.planner.memory import init_nontorch_gib

from .startup import HiddenFacts, StartupOutcome, perturbations, simulate_startup


def held_gib(outcome: StartupOutcome, gpu: GPUSpec) -> float:
    """GPU memory a Ready process holds at its serving peak, as the simulator measured its start."""
    if not outcome.starts or outcome.flags is None:
        return 0.0
    ctx = init_nontorch_gib(outcome.flags.tensor_parallel_size, gpu.nvlink, outcome.flags.pipeline_parallel_size)
    capture = 1 + perturbations(outcome.model_id)["cudagraph_capture"]
    graphs = 0.0 if outcome.flags.enforce_eager else outcome.cudagraph_gib * capture
    return (ctx + outcome.weights_gib + outcome.non_torch_gib + outcome.activation_gib
            + max(outcome.available_kv_gib, 0.0) + graphs)


class SharedGPU:
    """A GPU and the simulated vLLM processes on it."""

    def __init__(self, gpu: GPUSpec, hidden: HiddenFacts | None = None) -> None:
        self.gpu = gpu
        self.hidden = hidden or HiddenFacts()
        self.held: dict[str, float] = {}

    def used_gib(self, *, besides: str | None = None) -> float:
        return sum(v for k, v in self.held.items() if k != besides)

    def start(self, name: str, args: Sequence[str], image: str, model: ModelArch | ModelFiles | None,
              *, hidden: HiddenFacts | None = None, **kwargs: Any) -> StartupOutcome:
        """Start (or restart) `name` beside the processes running: a failed start holds nothing afterwards.
        `hidden`: this process's own hidden facts (default: the GPU's); `kwargs` go to `simulate_startup`."""
        self.held.pop(name, None)
        own = hidden or self.hidden
        facts = own.model_copy(update={"other_process_gib": own.other_process_gib + self.used_gib()})
        kwargs.setdefault("gpu_count", 1)
        outcome = simulate_startup(args, image, self.gpu, facts, model, **kwargs)
        if outcome.starts:
            self.held[name] = held_gib(outcome, self.gpu)
        return outcome

    def stop(self, name: str) -> None:
        self.held.pop(name, None)

    def over_committed(self) -> bool:
        """The Ready processes' serving peaks together exceed the GPU: one of them would run out while serving."""
        return self.hidden.other_process_gib + self.used_gib() > self.gpu.reported_gib - self.hidden.total_delta_gib


# --- what the simulated kubelet asks (kubelet.py): which pods share one GPU -------------------------------------


def pod_claim(namespace: str, spec: Mapping[str, Any]) -> str | None:
    """The DRA ResourceClaim a pod's GPU comes from ("<namespace>/<name>"), or None."""
    for entry in spec.get("resourceClaims") or []:
        name = entry.get("resourceClaimName") if isinstance(entry, Mapping) else None
        if name:
            return f"{namespace}/{name}"
    return None


def claim_fits(allocated: str | None, node: str, used_gpus: int, node_gpus: int) -> bool:
    """A pod of a claim goes where the claim's GPU is; a claim not yet allocated needs a free GPU on the node."""
    if allocated is not None:
        return allocated == node
    return used_gpus + 1 <= node_gpus


def sharing_key(claim: str | None, node: str, labels: Mapping[str, str], gpus: int) -> str | None:
    """The shared GPU a pod runs on: its DRA claim, or its node when that node's one GPU is time-sliced (the device
    plugin hands every pod a replica of it); None for a pod with a GPU of its own."""
    if claim is not None:
        return "claim:" + claim
    try:
        replicas = int(str(labels.get("nvidia.com/gpu.replicas", "1")))
        count = int(str(labels.get("nvidia.com/gpu.count", "0")))
    except ValueError:
        return None
    if gpus == 1 and replicas > 1 and count == 1:
        return "node:" + node
    return None
