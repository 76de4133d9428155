"""A deterministic work budget for planning one spec (issue 20: one spec can cost seconds of CPU per plan).

Planning a spec is a search: layouts (TP × KV dtype × eager, per GPU count up to `spec.gpu.maxCount`), the GPU pools
of the cluster (every one without `spec.gpu.product`), node counts (up to `spec.gpu.maxNodes`), and, for a plan that
does not fit, alternatives (more GPUs, another GPU or pool, a quantized checkpoint, more nodes). Every candidate costs one startup prediction (`memory.predict_startup`), which is what the
CPU goes to. The budget counts predictions, not seconds, so the same spec always gets the same answer, on an idle
machine or a loaded one, and tests never depend on speed.

The shell opens a budget around one spec's planning (`spend`); the planner charges each prediction (`charge`) and
asks, before each further step of a search, whether the budget is spent (`out_of_budget`). A spent search stops
where it is: the node search keeps the fewest nodes found to fit so far (or none: infeasible), the option search
keeps the options found so far. `WorkBudget.report()` then names the spec field that sizes the search the budget
stopped, what to change, and the predictions of each search, for a condition. Without an open budget (the CLI, tests of the planner) nothing is
counted and nothing stops.

Pure: a context variable (each reconcile runs in its own thread and context), no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "PHASES",
    "PLAN_BUDGET_PREDICTIONS",
    "BudgetReport",
    "WorkBudget",
    "charge",
    "out_of_budget",
    "phase",
    "spend",
    "stops",
]

#: Startup predictions one spec's planning may make. The most any spec makes today is about 700 (the hand-picked
#: expensive specs of `benchmarks/adversarial_corpus.py --expensive`, e.g. Llama-4-Maverick on 1-GPU RTX 4090 nodes
#: with maxNodes/maxCount 64: 702; its 1,500-spec corpus: max 635, p50 123; the examples: at most 612, the Llama
#: 3.1 405B ones, under a third of the budget, tests/unit/test_plan_budget.py). A prediction costs about 0.2-0.4 ms
#: of CPU here (more for MoE models), so a spec costs at most about a second of CPU however it is written.
PLAN_BUDGET_PREDICTIONS = 2000

#: The searches a plan makes, the spec field that sets how large each is, and what to change.
PHASES: Final[dict[str, tuple[str, str]]] = {
    "layouts": ("spec.gpu.maxCount",
                "lower spec.gpu.maxCount (or set spec.gpu.count), or pin spec.flags.tensorParallelSize"),
    "nodes": ("spec.gpu.maxNodes",
              "lower spec.gpu.maxNodes, or pin spec.flags.tensorParallelSize and pipelineParallelSize"),
    "pools": ("spec.gpu.product",
              "without spec.gpu.product every GPU pool of the cluster is planned: set spec.gpu.product"),
    "options": ("spec.gpu.product",
                "the search for alternatives to a plan that does not fit: set spec.gpu.product and spec.gpu.count "
                "to GPUs the model fits, or lower spec.gpu.maxNodes"),
}
_DEFAULT_PHASE: Final = "layouts"


@dataclass(frozen=True)
class BudgetReport:
    """A spec whose planning stopped at the budget: what it spent, by search, and the field whose search it stopped
    (lowering that field is what lets the search finish)."""

    used: int
    limit: int
    phase: str
    field: str
    advice: str
    by_phase: tuple[tuple[str, int], ...]

    def message(self) -> str:
        spent = ", ".join(f"{name} {count:,}" for name, count in self.by_phase)
        return (f"planning this spec stopped at the operator's work budget ({self.used:,} of {self.limit:,} startup "
                f"predictions: {spent}) in the {self.phase} search, which {self.field} sizes; the plan is the best "
                f"found within the budget: {self.advice}")


@dataclass
class WorkBudget:
    """Predictions counted for one spec, by search, and the searches stopped because the budget was spent."""

    limit: int
    used: int = 0
    by_phase: Counter[str] = field(default_factory=Counter)
    stopped: list[str] = field(default_factory=list)

    @property
    def spent(self) -> bool:
        return self.used >= self.limit

    def report(self) -> BudgetReport | None:
        """None when every search ran to its end; else the first search the budget stopped and its field."""
        if not self.stopped:
            return None
        first = self.stopped[0]
        spec_field, advice = PHASES[first]
        return BudgetReport(used=self.used, limit=self.limit, phase=first, field=spec_field, advice=advice,
                            by_phase=tuple(sorted(self.by_phase.items(), key=lambda item: (-item[1], item[0]))))


_BUDGET: ContextVar[WorkBudget | None] = ContextVar("vllm_operator_plan_budget", default=None)
_PHASE: ContextVar[str] = ContextVar("vllm_operator_plan_phase", default=_DEFAULT_PHASE)


@contextmanager
def spend(limit: int | None = None) -> Iterator[WorkBudget]:
    """Open a budget for one spec's planning (the planner's searches stop once it is spent); `limit` defaults to
    PLAN_BUDGET_PREDICTIONS."""
    limit = PLAN_BUDGET_PREDICTIONS if limit is None else limit
    if limit < 1:
        raise ValueError("a work budget needs at least one prediction")
    budget = WorkBudget(limit=limit)
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Count the predictions made inside to the search `name` (one of PHASES)."""
    if name not in PHASES:
        raise ValueError(f"unknown planning phase {name!r}")
    token = _PHASE.set(name)
    try:
        yield
    finally:
        _PHASE.reset(token)


def charge(predictions: int = 1) -> None:
    """Count predictions against the open budget (none open: nothing)."""
    budget = _BUDGET.get()
    if budget is not None:
        budget.used += predictions
        budget.by_phase[_PHASE.get()] += predictions


def stops() -> int:
    """How many times a search stopped at the open budget so far (0 without one): a caller that remembers plans
    keeps only those made without a stop (a plan cut short for one spec is never another spec's answer)."""
    budget = _BUDGET.get()
    return len(budget.stopped) if budget is not None else 0


def out_of_budget() -> bool:
    """Whether the open budget is spent; a search asks before each further step and stops when it is (the stop is
    recorded for the report). Without an open budget: never."""
    budget = _BUDGET.get()
    if budget is None or not budget.spent:
        return False
    budget.stopped.append(_PHASE.get())
    return True
