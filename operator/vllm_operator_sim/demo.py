"""`vllm-operator demo`: the operator in a simulated GPU cluster, shown live in the terminal.

Starts a :class:`~vllm_operator_sim.cluster.SimulatedCluster` (nodes with 4×L4, 4×A100-40GB, 1×RTX-4090, seven nodes of 8×H100), runs
the real operator (`vllm-operator run`) against it as a subprocess, applies the VLLMServices of ``examples/`` and
prints, in simulated time, what happens to each: the plan, the pods (scheduled, loading, Ready, failed with
vLLM's own message, CrashLoopBackOff), the operator's remediation steps; then a summary table. Each service is
judged against its scenario (``sim/scenarios.yaml``, keyed by the VLLMService's name): the infeasible example is
*expected* to end infeasible, the shared-GPU one to be Ready after remediation. Exit code 0 when every service
ended as expected, 1 otherwise.

Examples come from ``--examples DIR`` (or a single file), else ``./examples`` or the repository's ``examples/``,
else the built-in scenario manifests (so an installed package can run the demo too).

Environment: ``VLLM_OPERATOR_DEMO_TIMEOUT`` (real seconds to wait for every service, default 600: a safety net, the
limit that matters is two simulated hours) and
``VLLM_OPERATOR_DEMO_REPORT`` (write the results as JSON to this path).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from vllm_operator.api.v1alpha1 import KIND, flags_from_api

from .clock import DEFAULT_SPEED, format_duration
from .cluster import DEFAULT_POOLS, NodePool, SimulatedCluster
from .kubelet import SimEvent
from .scenarios import Scenario, ScenarioSet, load_scenarios

__all__ = ["ServiceResult", "find_manifests", "format_flags", "run_demo", "run_services", "service_outcome"]

#: Real seconds to wait for every service: a safety net — the paced clock stands still while the operator works, so
#: a busy machine takes longer in real time, and the limit that matters is DEFAULT_SIM_TIMEOUT_S.
DEFAULT_TIMEOUT_S = 600.0
#: Simulated seconds after which a service that reached no terminal state counts as timed out.
DEFAULT_SIM_TIMEOUT_S = 7200.0
STABLE_AFTER_TRAFFIC_S = 60.0
_OPERATOR_COMPONENT = "vllm-operator"
_SKIP_OPERATOR_REASONS = ("Planned", "PlanInfeasible")


@dataclass
class ServiceResult:
    """How one VLLMService ended."""

    name: str
    model: str
    gpu: str
    outcome: str
    flags: dict[str, Any]
    failed_starts: int
    serving_failures: int
    remediation_steps: int
    time_to_ready_s: float | None
    expected: str
    as_expected: bool
    why: str = ""
    needs: list[str] = field(default_factory=list)
    title: str = ""
    namespace: str = "default"
    gpu_product: str | None = None
    gpu_count: int | None = None
    image: str | None = None


def find_manifests(examples: str | Path | None, scenarios: ScenarioSet) -> tuple[list[dict[str, Any]], str]:
    """The VLLMServices to apply, and where they came from."""
    candidates: list[Path] = []
    if examples is not None:
        path = Path(examples)
        if not path.exists():
            raise FileNotFoundError(f"--examples {examples}: no such file or directory")
        candidates = [path]
    else:
        repo_examples = Path(__file__).resolve().parents[3] / "examples"
        candidates = [p for p in (Path.cwd() / "examples", repo_examples) if p.is_dir()]
    for path in candidates:
        files = sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml")) if path.is_dir() else [path]
        docs = [doc for file in files for doc in yaml.safe_load_all(file.read_text(encoding="utf-8"))
                if isinstance(doc, dict) and doc.get("kind") == KIND]
        if docs:
            return docs, str(path)
        if examples is not None:
            raise ValueError(f"--examples {examples}: no {KIND} manifests found")
    return [s.vllmservice() for s in scenarios if s.manifest is not None], "the built-in scenarios"


def _conditions(obj: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def service_outcome(obj: Mapping[str, Any] | None) -> str | None:
    """Ready, Infeasible, Exhausted or Degraded when the service reached a terminal state; None while it moves."""
    conds = _conditions(obj)
    if conds.get("Ready", {}).get("status") == "True":
        return "Ready"
    if conds.get("PlanFeasible", {}).get("status") == "False":
        return "Infeasible"
    degraded = conds.get("Degraded", {})
    if degraded.get("status") == "True":
        if degraded.get("reason") == "RemediationExhausted":
            return "Exhausted"
        if degraded.get("reason") in ("InvalidSpec", "ModelNotFound", "GPUNotFound"):
            return "Degraded"
    return None


def format_flags(flags: Mapping[str, Any]) -> str:
    """The flags that matter for memory, compactly: ``TP=1 util=0.90 len=8192 seqs=13``."""
    if not flags:
        return "-"
    parts = []
    names = (("tensor_parallel_size", "TP"), ("pipeline_parallel_size", "PP"), ("gpu_memory_utilization", "util"),
             ("max_model_len", "len"), ("max_num_seqs", "seqs"), ("max_num_batched_tokens", "batch"),
             ("kv_cache_dtype", "kv"))
    for key, short in names:
        if key in flags and flags[key] is not None:
            value = flags[key]
            parts.append(f"{short}={value:.2f}" if isinstance(value, float) else f"{short}={value}")
    if flags.get("enforce_eager"):
        parts.append("eager")
    if flags.get("enable_prefix_caching"):
        parts.append("prefix-caching")
    return " ".join(parts)


def _changed_flags(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    keys = list(dict.fromkeys([*before, *after]))
    changes = [f"{k.replace('_', '-')} {before.get(k, '-')} → {after.get(k, '-')}" for k in keys
               if before.get(k) != after.get(k)]
    return ", ".join(changes) or "no flag changed"


def _short(text: str, limit: int = 170) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _View:
    """Prints one line per thing that happened, stamped with simulated time since the examples were applied."""

    def __init__(self, out: TextIO | None, width: int) -> None:
        self.out = out
        self.width = width
        self.t0 = 0.0

    def line(self, t: float, service: str, text: str) -> None:
        if self.out is None:
            return
        seconds = max(int(t - self.t0), 0)
        stamp = f"[t+{seconds // 60:02d}:{seconds % 60:02d}]"
        self.out.write(f"{stamp} {service:<{self.width}} {text}\n")
        self.out.flush()

    def say(self, text: str = "") -> None:
        if self.out is not None:
            self.out.write(text + "\n")
            self.out.flush()


@dataclass
class _Tracked:
    name: str
    namespace: str
    scenario: Scenario
    applied_at: float
    plan_key: str | None = None
    history_seen: int = 0
    outcome: str | None = None
    ended_at: float | None = None
    announced: str | None = None
    traffic_at: float | None = None
    last_failures: int = 0
    settle_from: float | None = None
    then_generation: int | None = None  # the generation the scenario's `then` change made
    then_shown: bool = False


def _pod_label(pod: str, service: str) -> str:
    rest = pod[len(service) + 1:] if pod.startswith(service + "-") else pod
    return f"pod …{rest[-11:]}" if len(rest) > 11 else f"pod {rest}"


class _Session:
    def __init__(self, cluster: SimulatedCluster, manifests: Sequence[Mapping[str, Any]], scenarios: ScenarioSet,
                 view: _View, events: queue.Queue[SimEvent]) -> None:
        self.cluster = cluster
        self.manifests = manifests
        self.scenarios = scenarios
        self.view = view
        self.events = events
        self.tracked: dict[tuple[str, str], _Tracked] = {}
        self.seen_events: set[str] = set()

    # --- applying ------------------------------------------------------------------------------------------

    def apply_all(self) -> None:
        now = self.cluster.clock.now()
        self.view.t0 = now
        self._create_token_secrets(now)
        for manifest in self.manifests:
            meta = manifest.get("metadata") or {}
            name, namespace = meta["name"], meta.get("namespace") or "default"
            scenario = self.scenarios.get(name)
            self.tracked[namespace, name] = _Tracked(name, namespace, scenario, now)
            self.cluster.apply(manifest)
            spec = manifest.get("spec") or {}
            gpu = (spec.get("gpu") or {}).get("product") or "any GPU node"
            model = (spec.get("model") or {}).get("name", "?")
            self.view.line(now, name, f"applied: {model} on {gpu}" + (f" — {scenario.title}" if scenario.title
                                                                        and name in self.scenarios else ""))

    def _create_token_secrets(self, now: float) -> None:
        """The Secrets the examples reference for a Hugging Face token, with a placeholder (nothing is downloaded)."""
        for manifest in self.manifests:
            spec = manifest.get("spec") or {}
            ref = spec.get("hfTokenSecretRef") or {}
            namespace = (manifest.get("metadata") or {}).get("namespace") or "default"
            if not ref.get("name") or self.cluster.api.get_object("secrets", ref["name"], namespace):
                continue
            key = ref.get("key") or "HF_TOKEN"
            self.cluster.api.create_object("secrets", {
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": ref["name"], "namespace": namespace},
                "type": "Opaque", "stringData": {key: "hf_simulated_placeholder"}}, namespace=namespace)
            self.view.line(now, "", f"created Secret {namespace}/{ref['name']} ({key}: a placeholder; the simulated "
                                    "cluster downloads nothing)")

    # --- watching ------------------------------------------------------------------------------------------

    def watch(self, timeout_s: float, sim_timeout_s: float = DEFAULT_SIM_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        sim_deadline = self.view.t0 + sim_timeout_s
        while True:
            self._drain_events()
            self._poll_services()
            if all(t.outcome is not None for t in self.tracked.values()):
                return
            if time.monotonic() > deadline or self.cluster.clock.now() > sim_deadline or (
                    self.cluster.operator is not None and self.cluster.operator.poll() is not None):
                break
            with contextlib.suppress(TimeoutError):
                self.cluster.api.wait_for(lambda: False, timeout=0.1, interval=0.1)
        self._drain_events()
        now = self.cluster.clock.now()
        for t in self.tracked.values():
            if t.outcome is None:
                t.outcome, t.ended_at = "Timeout", now
                self.view.line(now, t.name, "still not in a terminal state: gave up waiting")

    def _drain_events(self) -> None:
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            if (event.namespace, event.service) not in self.tracked:
                continue
            self.view.line(event.t, event.service, self._describe(event))

    def _describe(self, e: SimEvent) -> str:
        pod = _pod_label(e.pod, e.service)
        d = e.details
        if e.kind == "scheduled":
            return f"{pod} scheduled on {d.get('node')} ({d.get('gpus')} GPU)"
        if e.kind == "unschedulable":
            return f"{pod} Pending: {_short(e.message, 140)}"
        if e.kind == "pulling":
            return f"{pod} ContainerCreating: {e.message.lower()}"
        if e.kind == "started":
            restart = f" (restart {d.get('restart')})" if d.get("restart") else ""
            return f"{pod} Running, not ready: vLLM loading{restart} [{d.get('flags')}]"
        if e.kind == "ready":
            tokens = d.get("kv_cache_tokens")
            if tokens:
                return (f"{pod} Ready: KV cache {tokens:,} tokens, {d.get('max_concurrency'):.2f}x requests of "
                        f"{d.get('max_model_len')}")
            return f"{pod} Ready"
        if e.kind == "failed":
            where = "while serving" if d.get("while_serving") else "at startup"
            return (f"{pod} Terminated {d.get('term_reason')} (exit {d.get('exit_code')}) {where}, "
                    f"{d.get('failure')}: {_short(e.message, 150)}")
        if e.kind == "backoff":
            return f"{pod} CrashLoopBackOff: back-off {d.get('delay')}s, restarts {d.get('restarts')}"
        if e.kind == "deleted":
            return f"{pod} deleted ({_short(e.message.split(': ', 1)[-1], 80)})"
        return f"{pod} {e.kind}: {_short(e.message)}"

    def _poll_services(self) -> None:
        now = self.cluster.clock.now()
        api = self.cluster.api
        for key, t in self.tracked.items():
            obj = api.get_object("vllmservices", t.name, t.namespace)
            if obj is None:
                continue
            status = obj.get("status") or {}
            self._show_plan(t, status, now)
            self._show_remediation(t, status, now)
            self._show_operator_events(t, obj, now)
            self._judge(t, key, obj, now)

    def _show_plan(self, t: _Tracked, status: Mapping[str, Any], now: float) -> None:
        plan = status.get("plan") or {}
        if not plan:
            return
        key = json.dumps([plan.get("specHash"), plan.get("flags"), plan.get("fits")], sort_keys=True, default=str)
        if key == t.plan_key:
            return
        first = t.plan_key is None
        t.plan_key = key
        gpu = status.get("gpu") or {}
        where = f"{gpu.get('count', '?')}× {gpu.get('product', '?')} ({gpu.get('memoryGiB', '?')} GiB)"
        label = "plan" if first else "re-plan"
        if plan.get("fits"):
            tokens = plan.get("kvCacheTokens") or 0
            self.view.line(now, t.name, f"{label}: {where} {format_flags(flags_from_api(plan.get('flags')) or {})} → "
                                        f"{tokens:,} KV tokens, {plan.get('maxConcurrency', 0):.2f}x concurrency")
        else:
            failure = plan.get("failure") or {}
            self.view.line(now, t.name, f"{label}: does NOT fit {where}: {failure.get('kind', '?')}: "
                                        f"{_short(failure.get('message', ''), 120)}")
            options = [o.get("summary", "") for o in plan.get("options") or []]
            if options:
                self.view.line(now, t.name, "options that would fit: " + "; ".join(options[:4]))

    def _show_remediation(self, t: _Tracked, status: Mapping[str, Any], now: float) -> None:
        history = (status.get("remediation") or {}).get("history") or []
        for entry in history[t.history_seen:]:
            before = flags_from_api(entry.get("flagsBefore")) or {}
            after = flags_from_api(entry.get("flagsAfter")) or {}
            kind = entry.get("failureClass") or "?"
            message = _short(entry.get("message", ""), 130)
            if "→" not in message:
                message += f"; {_changed_flags(before, after)}"
            self.view.line(now, t.name, f"operator remediation step {entry.get('step')} ({kind}): {message}")
        t.history_seen = len(history)

    def _show_operator_events(self, t: _Tracked, obj: Mapping[str, Any], now: float) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        for event in self.cluster.api.list_objects("events", t.namespace):
            meta = event.get("metadata") or {}
            involved = event.get("involvedObject") or {}
            source = (event.get("source") or {}).get("component") or event.get("reportingComponent")
            if involved.get("uid") != uid or source != _OPERATOR_COMPONENT or meta.get("uid") in self.seen_events:
                continue
            self.seen_events.add(meta.get("uid", ""))
            reason = event.get("reason", "")
            if reason in _SKIP_OPERATOR_REASONS or reason.startswith("Remediated"):
                continue
            self.view.line(now, t.name, f"operator {event.get('type', '').lower()} {reason}: "
                                        f"{_short(event.get('message', ''), 150)}")

    def _judge(self, t: _Tracked, key: tuple[str, str], obj: Mapping[str, Any], now: float) -> None:
        outcome = service_outcome(obj)
        if outcome != t.announced:
            t.announced = outcome
            if outcome == "Ready":
                self.view.line(now, t.name, "VLLMService Ready")
            elif outcome is not None:
                reason = _conditions(obj).get("Degraded", {}).get("reason", "")
                self.view.line(now, t.name, f"VLLMService {outcome} ({reason})")
        if outcome == "Ready" and t.scenario.then is not None and not self._after_then(t, obj, now):
            return
        if outcome is None:
            t.outcome = None if t.outcome != "Ready" or t.scenario.traffic is None else t.outcome
            t.settle_from = None  # the stability window under traffic restarts once the service is Ready again
            return
        if outcome == "Ready" and t.scenario.traffic is not None:
            traffic = t.scenario.traffic
            if t.traffic_at is None:
                t.traffic_at = t.settle_from = now
                self.cluster.kubelet.send_traffic(t.name, traffic.concurrency, traffic.context, t.namespace)
                self.view.line(now, t.name, f"traffic: {traffic.concurrency} concurrent requests of "
                                            f"{traffic.context} tokens")
            if t.settle_from is None:
                t.settle_from = now
            failures = self.cluster.kubelet.stats(t.name, t.namespace).serving_failures
            if failures != t.last_failures:
                t.last_failures, t.settle_from = failures, now
            if now - (t.settle_from or now) < STABLE_AFTER_TRAFFIC_S:
                return
        if t.outcome is None:
            t.outcome, t.ended_at = outcome, now

    def _after_then(self, t: _Tracked, obj: Mapping[str, Any], now: float) -> bool:
        """The scenario's `then` change: made once the service is first Ready; True once it is Ready again at the
        generation the change made (its pods replaced), and the GPUShared condition, if any, shown."""
        then = t.scenario.then
        assert then is not None
        if t.then_generation is None:
            self.cluster.api.patch_object("vllmservices", t.name, {"spec": then.spec}, t.namespace)
            changed = self.cluster.api.get_object("vllmservices", t.name, t.namespace) or {}
            t.then_generation = int((changed.get("metadata") or {}).get("generation") or 0)
            self.view.line(now, t.name, f"then: {then.title or then.spec}")
            return False
        status = obj.get("status") or {}
        progressing = _conditions(obj).get("Progressing", {}).get("status") == "True"
        if int(status.get("observedGeneration") or 0) < t.then_generation or progressing:
            return False
        shared = _conditions(obj).get("GPUShared")
        if shared is not None and not t.then_shown:
            t.then_shown = True
            self.view.line(now, t.name, f"shared GPU: {_short(str(shared.get('message', '')), 150)}")
        return True

    # --- results -------------------------------------------------------------------------------------------

    def results(self) -> list[ServiceResult]:
        found = []
        for t in self.tracked.values():
            obj = self.cluster.api.get_object("vllmservices", t.name, t.namespace) or {}
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            stats = self.cluster.kubelet.stats(t.name, t.namespace)
            flags = dict(flags_from_api((status.get("plan") or {}).get("flags")) or {})
            gpu = status.get("gpu") or {}
            outcome = t.outcome or "Timeout"
            ok, why = t.scenario.expect.check(outcome, stats.failed_starts, flags)
            ready_s = stats.ready_at - t.applied_at if stats.ready_at is not None and outcome == "Ready" else None
            found.append(ServiceResult(
                name=t.name, model=(spec.get("model") or {}).get("name", "?"),
                gpu=f"{gpu.get('count', '?')}× {gpu.get('product', '?')}" if gpu else "-", outcome=outcome,
                flags=flags, failed_starts=stats.failed_starts, serving_failures=stats.serving_failures,
                remediation_steps=int((status.get("remediation") or {}).get("step") or 0),
                time_to_ready_s=ready_s, expected=t.scenario.expect.describe(), as_expected=ok, why=why,
                needs=list(t.scenario.needs), title=t.scenario.title, namespace=t.namespace,
                gpu_product=gpu.get("product"), gpu_count=gpu.get("count"), image=spec.get("image")))
        return found


def run_services(manifests: Sequence[Mapping[str, Any]], *, scenarios: ScenarioSet | None = None,
                 speed: float = DEFAULT_SPEED, pools: Iterable[NodePool | Sequence[Any]] = DEFAULT_POOLS,
                 timeout_s: float = DEFAULT_TIMEOUT_S, sim_timeout_s: float = DEFAULT_SIM_TIMEOUT_S,
                 out: TextIO | None = None,
                 on_results: Callable[[SimulatedCluster, list[ServiceResult]], None] | None = None,
                 leaderworkerset: bool = True) -> list[ServiceResult]:
    """Apply ``manifests`` to a fresh simulated cluster running the real operator; wait; return the results.

    A service that reached no terminal state after ``sim_timeout_s`` simulated seconds (or, as a safety net,
    ``timeout_s`` real ones) ends as ``Timeout``. ``out`` receives the live view (None: quiet). ``on_results``, if given, is called with the cluster still
    running once the results are known (the demo prints its summary there, and waits with --keep-running).
    ``leaderworkerset``: whether the cluster serves the LeaderWorkerSet API.
    """
    scenarios = scenarios if scenarios is not None else load_scenarios()
    names = [(m.get("metadata") or {}).get("name", "") for m in manifests]
    view = _View(out, max([len(n) for n in names] + [12]))
    events: queue.Queue[SimEvent] = queue.Queue()
    with SimulatedCluster(pools, scenarios, speed=speed, on_event=events.put, dra=True,
                          leaderworkerset=leaderworkerset) as cluster:
        describe = ", ".join(f"{n} ({p.gpus_per_node}× {p.gpu})" for n, p in zip(cluster.nodes, cluster.pools,
                                                                                  strict=False))
        view.say(f"cluster   {len(cluster.nodes)} GPU nodes: {describe}; API server {cluster.server.url}")
        pid = cluster.start_operator()
        view.say(f"operator  `vllm-operator run` pid {pid}, log {cluster.operator_log_path}")
        view.say("")
        session = _Session(cluster, manifests, scenarios, view, events)
        session.apply_all()
        session.watch(timeout_s, sim_timeout_s)
        results = session.results()
        if cluster.operator is not None and cluster.operator.poll() is not None:
            view.say(f"the operator exited with code {cluster.operator.returncode}; its log:\n"
                     f"{cluster.operator_log()[-3000:]}")
            for result in results:
                if result.as_expected:
                    result.as_expected, result.why = False, "the operator exited"
        if on_results is not None:
            on_results(cluster, results)
        return results


def summary_table(results: Sequence[ServiceResult]) -> str:
    """The results as a plain-text table."""
    header = ("service", "model", "GPU", "outcome", "flags", "failed starts", "time to Ready", "verdict")
    rows = []
    for r in results:
        outcome = r.outcome + (f" after {r.remediation_steps} step(s)" if r.remediation_steps else "")
        verdict = "ok" if r.as_expected else f"UNEXPECTED: {r.why}"
        starts = str(r.failed_starts) + (f" (+{r.serving_failures} serving)" if r.serving_failures else "")
        rows.append((r.name, r.model, r.gpu, outcome, format_flags(r.flags) if r.outcome != "Infeasible" else "-",
                     starts, format_duration(r.time_to_ready_s), verdict))
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(header)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    return "\n".join(lines)


def _wait_for_interrupt(cluster: SimulatedCluster, out: TextIO) -> None:
    out.write("\nThe simulated cluster keeps running; in another terminal:\n"
              f"  export KUBECONFIG={cluster.kubeconfig_path}\n"
              "  kubectl get vllms\n"
              "  kubectl get pods -o wide\n"
              "  kubectl describe vllms <name>\n"
              "Press Ctrl-C to stop it.\n")
    out.flush()
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            if cluster.operator is not None and cluster.operator.poll() is not None:
                out.write(f"the operator exited with code {cluster.operator.returncode}\n")
                break
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    out.write("\nstopping the simulated cluster\n")


def run_demo(keep_running: bool = False, examples: str | None = None, speed: float | None = None) -> int:
    """`vllm-operator demo`: 0 when every service ended as its scenario expects, else 1."""
    out = sys.stdout
    started = time.monotonic()
    speed = speed or DEFAULT_SPEED
    scenarios = load_scenarios()
    try:
        manifests, source = find_manifests(examples, scenarios)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        out.write(f"vllm-operator demo: error: {exc}\n")
        return 1
    timeout_s = float(os.environ.get("VLLM_OPERATOR_DEMO_TIMEOUT") or DEFAULT_TIMEOUT_S)
    out.write(f"vllm-operator demo: the operator in a simulated GPU cluster (no GPU needed); simulated time runs "
              f"up to {speed:g}x real time and stands still while the operator works.\n")
    out.write(f"examples  {len(manifests)} VLLMService(s) from {source}\n")
    out.flush()

    def finish(cluster: SimulatedCluster, results: list[ServiceResult]) -> None:
        out.write("\n" + summary_table(results) + "\n\n")
        good = sum(1 for r in results if r.as_expected)
        out.write(f"{good}/{len(results)} services ended as expected; {time.monotonic() - started:.1f} s real time, "
                  f"{format_duration(cluster.clock.now())} simulated.\n")
        out.flush()
        report = os.environ.get("VLLM_OPERATOR_DEMO_REPORT")
        if report:
            Path(report).write_text(json.dumps([asdict(r) for r in results], indent=2, default=str))
        if keep_running:
            _wait_for_interrupt(cluster, out)

    try:
        results = run_services(manifests, scenarios=scenarios, speed=speed, timeout_s=timeout_s, out=out,
                               on_results=finish)
    except (RuntimeError, TimeoutError, ValueError) as exc:
        out.write(f"vllm-operator demo: error: {exc}\n")
        return 1
    return 0 if results and all(r.as_expected for r in results) else 1
