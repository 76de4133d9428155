"""One simulated GPU that several vLLM processes share (issue 26): each start sees the memory the running ones hold.

`SharedGPU.start(name, args, …)` runs the startup simulator with `HiddenFacts.other_process_gib` set to what the
processes already running on this GPU hold; a process that reaches Ready then holds its serving peak — its CUDA
context, weights, non-torch memory, the activation peak it profiled (reused by every forward pass), its KV cache,
and its captured CUDA graphs, all as the simulator measured them with its hidden perturbations (not the planner's
figures) — until `stop(name)`. Pure bookkeeping over `simulate_startup`: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

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
              *, memory_limit_gib: float | None = None) -> StartupOutcome:
        """Start (or restart) `name` beside the processes running: a failed start holds nothing afterwards."""
        self.held.pop(name, None)
        hidden = self.hidden.model_copy(update={
            "other_process_gib": self.hidden.other_process_gib + self.used_gib()})
        outcome = simulate_startup(args, image, self.gpu, hidden, model, gpu_count=1,
                                   memory_limit_gib=memory_limit_gib)
        if outcome.starts:
            self.held[name] = held_gib(outcome, self.gpu)
        return outcome

    def stop(self, name: str) -> None:
        self.held.pop(name, None)

    def over_committed(self) -> bool:
        """The Ready processes' serving peaks together exceed the GPU: one of them would run out while serving."""
        return self.hidden.other_process_gib + self.used_gib() > self.gpu.reported_gib - self.hidden.total_delta_gib
