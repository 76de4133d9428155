"""Remediation scenarios end to end: many VLLMServices, each with hidden facts, in ONE simulated GPU cluster that runs
the real `vllm-operator run` process (``vllm_operator_sim.demo.run_services``), observed once every service reached
a terminal state (Ready, Exhausted, Infeasible).

A :class:`Case` is a VLLMService spec, the facts the planner cannot see and the terminal state it must reach;
:func:`run_cases` applies them all at once and returns one :class:`Observed` per case: the VLLMService, its
Deployment, the operator's Events on it, what the simulated kubelet saw (failed starts, the failure class of each
container run) and, for services that end with a verdict, a second look taken after the pods failed again (so a test
can tell that nothing moved). :func:`replay` runs the startup simulator on a service's container with other flags,
to check a number the operator quoted (vLLM's estimate, the value a verdict recommends) against the ground truth.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_operator.api.v1alpha1 import GROUP, KIND, VERSION, flags_from_api
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator.quantity import quantity_gib
from vllm_operator.sources import load_model_files
from vllm_operator_sim.cluster import NodePool, SimulatedCluster
from vllm_operator_sim.demo import ServiceResult, run_services
from vllm_operator_sim.kubelet import ServiceStats, SimEvent
from vllm_operator_sim.scenarios import Expectation, Outcome, Scenario, ScenarioSet, Traffic
from vllm_operator_sim.startup import HiddenFacts, StartupOutcome, simulate_startup

__all__ = ["Case", "Observed", "Run", "arg", "replay", "run_cases", "with_flags"]

NAMESPACE = "default"
OPERATOR = "vllm-operator"


@dataclass(frozen=True)
class Case:
    """One VLLMService: its spec, the facts only the simulated cluster knows, and how it must end."""

    name: str
    spec: Mapping[str, Any]
    expect: Outcome
    hidden: HiddenFacts = HiddenFacts()
    traffic: Traffic | None = None
    title: str = ""

    def manifest(self) -> dict[str, Any]:
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                "metadata": {"name": self.name, "namespace": NAMESPACE}, "spec": copy.deepcopy(dict(self.spec))}

    def scenario(self) -> Scenario:
        return Scenario(name=self.name, title=self.title, hidden=self.hidden, traffic=self.traffic,
                        expect=Expectation(outcome=self.expect))


@dataclass
class Snapshot:
    """The service's objects at one moment."""

    service: dict[str, Any]
    deployment: dict[str, Any] | None
    events: list[dict[str, Any]]        # the operator's Events on the VLLMService, oldest first
    stats: ServiceStats
    sim_time: float


@dataclass
class Observed:
    """How one case ended (``now``) and, for a verdict, a later look after more failed starts (``later``)."""

    case: Case
    result: ServiceResult
    now: Snapshot
    sim_events: list[SimEvent]
    view: list[str]
    later: Snapshot | None = None

    # --- the VLLMService ---------------------------------------------------------------------------------------

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.now.service.get("status") or {})

    def condition(self, kind: str, snapshot: Snapshot | None = None) -> dict[str, Any]:
        status = (snapshot or self.now).service.get("status") or {}
        found = next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)
        assert found is not None, f"{self.case.name}: no {kind} condition\n{self.explain()}"
        return dict(found)

    @property
    def flags(self) -> dict[str, Any]:
        return dict((self.status.get("plan") or {}).get("flags") or {})

    @property
    def remediation(self) -> dict[str, Any]:
        return dict(self.status.get("remediation") or {})

    @property
    def history(self) -> list[dict[str, Any]]:
        return list(self.remediation.get("history") or [])

    def operator_events(self, reason: str | None = None, snapshot: Snapshot | None = None) -> list[dict[str, Any]]:
        events = (snapshot or self.now).events
        return [e for e in events if reason is None or e.get("reason") == reason]

    # --- the Deployment ----------------------------------------------------------------------------------------

    def container(self, snapshot: Snapshot | None = None) -> dict[str, Any]:
        deployment = (snapshot or self.now).deployment
        assert deployment is not None, f"{self.case.name}: no Deployment\n{self.explain()}"
        containers = deployment["spec"]["template"]["spec"]["containers"]
        return dict(next(c for c in containers if c["name"] == "vllm"))

    def args(self, snapshot: Snapshot | None = None) -> list[str]:
        container = self.container(snapshot)
        return [*map(str, container.get("command") or []), *map(str, container.get("args") or [])]

    def memory_limit_gib(self, snapshot: Snapshot | None = None) -> float | None:
        limits = (self.container(snapshot).get("resources") or {}).get("limits") or {}
        return quantity_gib(limits.get("memory"))

    # --- what the simulated kubelet saw ------------------------------------------------------------------------

    def failures(self) -> list[str]:
        """The failure class of every container run that died, in order (startup and serving)."""
        return [str(e.details.get("failure")) for e in self.sim_events if e.kind == "failed"]

    def explain(self) -> str:
        """The live view of this service and its conditions, for assertion messages."""
        conditions = [(c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
                      for c in self.status.get("conditions") or []]
        lines = "\n".join(self.view[-60:])
        return (f"--- {self.case.name}: {self.result.outcome} (expected {self.case.expect}); failures "
                f"{self.failures()}\nconditions: {conditions}\nremediation: {self.remediation}\n{lines}")


@dataclass
class Run:
    observed: dict[str, Observed]
    wall_s: float
    sim_s: float
    operator_log: str
    view: str = ""
    errors: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> Observed:
        return self.observed[name]


def arg(args: Sequence[str], flag: str) -> str | None:
    """The value after ``flag`` (None when absent)."""
    items = list(args)
    return items[items.index(flag) + 1] if flag in items and items.index(flag) + 1 < len(items) else None


def with_flags(args: Sequence[str], flags: Mapping[str, Any]) -> list[str]:
    """``args`` with each flag (snake_case → ``--kebab-case``) set to the value: True adds a bare flag, False/None
    removes it."""
    out = list(args)
    for name, value in flags.items():
        cli = "--" + name.replace("_", "-")
        while cli in out:
            i = out.index(cli)
            takes_value = i + 1 < len(out) and not out[i + 1].startswith("--")
            del out[i:i + (2 if takes_value else 1)]
        if value is True:
            out.append(cli)
        elif value is not None and value is not False:
            out += [cli, str(value)]
    return out


def replay(observed: Observed, flags: Mapping[str, Any], *, memory_limit_gib: float | None = None,
           gpus: int | None = None) -> StartupOutcome:
    """Start the service's container once more in the startup simulator (same image, GPU and hidden facts) with the
    flags of a plan (``status.plan.flags``' shape; flags of the current plan missing from it are dropped) — the
    ground truth a quoted number is checked against."""
    container = observed.container()
    spec = observed.case.spec
    gpu = load_gpu_catalog().get(str((spec.get("gpu") or {})["product"]))
    model = (spec.get("model") or {})["name"]
    limits = (container.get("resources") or {}).get("limits") or {}
    count = gpus if gpus is not None else int(str(limits.get("nvidia.com/gpu", 1)))
    memory = memory_limit_gib if memory_limit_gib is not None else observed.memory_limit_gib()
    whole = flags_from_api({**dict.fromkeys(observed.flags), **flags})
    return simulate_startup(with_flags(observed.args(), whole), str(container["image"]), gpu, observed.case.hidden,
                            load_model_files(model, offline=True), gpu_count=count, memory_limit_gib=memory)


def _snapshot(cluster: SimulatedCluster, name: str) -> Snapshot:
    api = cluster.api
    service = api.get_object("vllmservices", name, NAMESPACE) or {}
    uid = (service.get("metadata") or {}).get("uid")
    events = [e for e in api.list_objects("events", NAMESPACE)
              if (e.get("involvedObject") or {}).get("uid") == uid
              and ((e.get("source") or {}).get("component") or e.get("reportingComponent")) == OPERATOR]
    events.sort(key=lambda e: int((e.get("metadata") or {}).get("resourceVersion") or 0))
    return Snapshot(service=copy.deepcopy(service),
                    deployment=copy.deepcopy(api.get_object("deployments", name, NAMESPACE)),
                    events=copy.deepcopy(events), stats=cluster.kubelet.stats(name, NAMESPACE),
                    sim_time=cluster.clock.now())


def _serving_steadily(cluster: SimulatedCluster, name: str, serving_s: float) -> bool:
    """The service is Ready and its current pod has been Ready (under the traffic) for ``serving_s`` simulated
    seconds since the last container death."""
    service = cluster.api.get_object("vllmservices", name, NAMESPACE) or {}
    conditions = (service.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
        return False
    events = [e for e in list(cluster.kubelet.events) if (e.namespace, e.service) == (NAMESPACE, name)]
    last_ready = max((e.t for e in events if e.kind == "ready"), default=None)
    last_death = max((e.t for e in events if e.kind == "failed"), default=float("-inf"))
    return last_ready is not None and last_ready > last_death and cluster.clock.now() - last_ready >= serving_s


def _failed_at_least(cluster: SimulatedCluster, name: str, count: int) -> bool:
    return cluster.kubelet.stats(name, NAMESPACE).failed_starts >= count


def _wait_simulated(cluster: SimulatedCluster, predicate: Callable[[], bool], sim_s: float, real_s: float) -> None:
    """Wait until ``predicate`` holds, for at most ``sim_s`` more simulated seconds (``real_s`` real ones as a safety
    net); TimeoutError otherwise."""
    until = cluster.clock.now() + sim_s
    cluster.wait_for(lambda: predicate() or cluster.clock.now() > until, timeout=real_s)
    if not predicate():
        raise TimeoutError(f"not within {sim_s:g} simulated seconds")


def run_cases(cases: Iterable[Case], *, pools: Iterable[NodePool], speed: float = 50.0,
              sim_timeout_s: float = 3600.0, timeout_s: float = 900.0, serving_s: float = 60.0,
              failures_after_verdict: int = 2, verdict_speed: float = 200.0) -> Run:
    """Apply every case at once to one simulated cluster running the real operator; wait for each to end; observe.

    The cluster's clock is paced (``vllm_operator_sim.pacer``): simulated time moves at ``speed`` only while the
    operator is idle, so how the cases end does not depend on the machine's load. A case that reached no terminal
    state after ``sim_timeout_s`` simulated seconds ends as Timeout; ``timeout_s`` real seconds is a safety net for
    each wait, not a bound the cases are meant to meet. A Ready service given traffic is observed once its current pod
    has served it for ``serving_s`` simulated seconds. Services that end with a verdict (Exhausted) are watched
    further, at ``verdict_speed``, until their pods failed ``failures_after_verdict`` more times; that look is
    ``Observed.later``. Everything is stopped on return.
    """
    cases = list(cases)
    by_name = {c.name: c for c in cases}
    scenarios = ScenarioSet({c.name: c.scenario() for c in cases})
    out = io.StringIO()
    observed: dict[str, Observed] = {}
    extra: dict[str, Any] = {}

    def observe(cluster: SimulatedCluster, results: list[ServiceResult]) -> None:
        extra["log"] = cluster.operator_log()
        extra["errors"] = list(cluster.errors)
        for result in results:
            case = by_name[result.name]
            observed[case.name] = Observed(case=case, result=result, now=_snapshot(cluster, case.name),
                                           sim_events=[], view=[])
        for o in observed.values():
            if o.case.traffic is not None and o.result.outcome == "Ready":
                # observed once the current pod has served the traffic for a while without dying (the demo's own
                # judge used to call it Ready too early: see the tests)
                name = o.case.name
                with contextlib.suppress(TimeoutError):
                    _wait_simulated(cluster, functools.partial(_serving_steadily, cluster, name, serving_s),
                                    sim_timeout_s, timeout_s)
                o.now = _snapshot(cluster, o.case.name)
        verdicts = [o for o in observed.values() if o.result.outcome == "Exhausted"]
        if verdicts:
            cluster.clock.set_speed(verdict_speed)  # only back-off delays are left to wait for
            for o in verdicts:
                want = o.now.stats.failed_starts + failures_after_verdict
                # on timeout the test sees it: later.stats.failed_starts is lower than it expects
                with contextlib.suppress(TimeoutError):
                    _wait_simulated(cluster, functools.partial(_failed_at_least, cluster, o.case.name, want),
                                    sim_timeout_s, timeout_s)
                o.later = _snapshot(cluster, o.case.name)
        events = list(cluster.kubelet.events)
        for o in observed.values():
            o.sim_events = [e for e in events if (e.namespace, e.service) == (NAMESPACE, o.case.name)]
        extra["log"] = cluster.operator_log()
        extra["sim_s"] = cluster.clock.now()

    started = time.monotonic()
    run_services([c.manifest() for c in cases], scenarios=scenarios, speed=speed, pools=pools, timeout_s=timeout_s,
                 sim_timeout_s=sim_timeout_s, out=out, on_results=observe)
    wall = time.monotonic() - started
    view = out.getvalue()
    for o in observed.values():
        o.view = [line for line in view.splitlines() if line.split()[1:2] == [o.case.name]]
    return Run(observed=observed, wall_s=wall, sim_s=float(extra.get("sim_s", 0.0)), operator_log=extra.get("log", ""),
               view=view, errors=list(extra.get("errors") or []))
