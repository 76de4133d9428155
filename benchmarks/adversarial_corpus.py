#!/usr/bin/env python3
"""The large adversarial corpus of issue 10 through the reconcile core, with counts.

Draws N specs (valid ones over every field of the API, ones spanning nodes, mutated ones - every field path, with
injections / huge, boundary or wrong-typed values / hostile inline configs / aimed values - and raw junk; the
generators of tests/kit/adversarial.py) against drawn clusters (nodes, optional CRDs served, the LeaderWorkerSet API),
runs each through `reconcile.desired_state` with the checks of the property test (no exception, no InternalError,
every undeployed service a condition and an event, rejections name their field, nothing fetched for an invalid spec,
children valid for Kubernetes 1.33 or their upstream CRD, least privilege, no shell), and prints how many ended how,
the children rendered by kind, how many the spec validation admits, every failure (first 20), and the time per
reconcile.

Also the CPU time per spec (process time: what a reconcile takes from the others under one GIL), with the worst
specs and, with --expensive, the hand-picked expensive ones (issue 20: large models on small GPUs with high
gpu.maxNodes / maxCount on several clusters); and the planning work per spec in startup predictions (the unit of
the operator's work budget, planner/budget.py): the most any spec made and how many specs hit the budget.

Usage: python benchmarks/adversarial_corpus.py [--examples 12500] [--seed 0] [--expensive]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from kit import adversarial  # noqa: E402
from vllm_operator import reconcile  # noqa: E402
from vllm_operator.api.v1alpha1 import validate_spec  # noqa: E402
from vllm_operator.planner import budget  # noqa: E402

#: The work budget of every spec planned here: (predictions made, whether a search stopped at the budget, the field)
WORK: list[tuple[int, bool, str]] = []
_spend = budget.spend


@contextmanager
def _counted_spend(limit: int | None = None) -> Iterator[budget.WorkBudget]:
    """The reconcile core's own budget, read when it closes (the benchmark's only instrumentation)."""
    with _spend(limit) as work:
        yield work
    report = work.report()
    WORK.append((work.used, report is not None, report.field if report else ""))


budget.spend = _counted_spend  # the reconcile core calls budget.spend()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=12500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--expensive", action="store_true", help="also the hand-picked expensive specs")
    args = parser.parse_args()

    outcomes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    failures: list[str] = []
    timings: list[float] = []
    cpu: list[tuple[float, str]] = []
    admitted = 0

    @seed(args.seed)
    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(spec=adversarial.specs, name=adversarial.name, cluster=adversarial.clusters)
    def run(spec: Any, name: str, cluster: adversarial.ClusterView) -> None:
        nonlocal admitted
        adversarial.CALLS.clear()
        valid = not validate_spec(spec) if isinstance(spec, dict) else False
        admitted += valid
        observed = adversarial.observe(spec, name, cluster)
        started, started_cpu = time.perf_counter(), time.process_time()
        try:
            desired = reconcile.desired_state(observed)
        except Exception:  # noqa: BLE001 - counted: the property is that this never happens
            outcomes["EXCEPTION"] += 1
            failures.append(traceback.format_exc(limit=3))
            return
        finally:
            timings.append(time.perf_counter() - started)
            cpu.append((time.process_time() - started_cpu, _describe(spec, cluster)))
        try:
            outcome = adversarial.check(observed, desired)
            if not valid and adversarial.CALLS:
                raise AssertionError("the model was looked up for an invalid spec")
            outcomes[outcome] += 1
            kinds.update(child["kind"] for child in desired.children or [])
        except AssertionError as exc:
            outcomes["CHECK FAILED"] += 1
            failures.append(str(exc)[:400])

    started = time.perf_counter()
    run()
    wall = time.perf_counter() - started
    total = sum(outcomes.values())
    print(f"specs: {total} (seed {args.seed}); admitted by the spec validation (CRD mirror): {admitted}")
    for outcome, count in outcomes.most_common():
        print(f"  {outcome:<28} {count:>7}")
    print("children rendered: " + ", ".join(f"{kind} {count}" for kind, count in kinds.most_common()))
    timings.sort()
    print(f"reconcile time per spec: p50 {statistics.median(timings) * 1e3:.2f} ms, "
          f"p99 {timings[int(len(timings) * 0.99)] * 1e3:.2f} ms, max {timings[-1] * 1e3:.1f} ms; wall {wall:.0f} s")
    cpu.sort(key=lambda pair: pair[0])
    seconds = [c for c, _ in cpu]
    print(f"CPU per spec: p50 {statistics.median(seconds) * 1e3:.1f} ms, p95 {seconds[int(len(seconds) * 0.95)] * 1e3:.1f}"
          f" ms, p99 {seconds[int(len(seconds) * 0.99)] * 1e3:.1f} ms, max {seconds[-1] * 1e3:.1f} ms; worst:")
    for spent, what in cpu[-5:][::-1]:
        print(f"  {spent * 1e3:8.1f} ms  {what}")
    _print_work("corpus")
    if args.expensive:
        WORK.clear()
        print("expensive specs (CPU per reconcile):")
        for what, spent in expensive_specs():
            print(f"  {spent * 1e3:8.1f} ms  {what}")
        _print_work("expensive specs")
    bad = outcomes["EXCEPTION"] + outcomes["CHECK FAILED"]
    print(f"exceptions escaping the core: {outcomes['EXCEPTION']}; failed checks: {outcomes['CHECK FAILED']}")
    for failure in failures[:20]:
        print("---\n" + failure)
    return 1 if bad else 0


def _print_work(what: str) -> None:
    if not WORK:
        print(f"planning work ({what}): no spec was planned")
        return
    made = sorted(used for used, _, _ in WORK)
    over = Counter(field for _, hit, field in WORK if hit)
    print(f"planning work ({what}; {len(WORK)} specs planned): startup predictions per spec p50 "
          f"{statistics.median(made):.0f}, p99 {made[int(len(made) * 0.99)]}, max {made[-1]} (budget "
          f"{budget.PLAN_BUDGET_PREDICTIONS}); specs that hit the budget: {sum(over.values())}"
          + (" (" + ", ".join(f"{field} {count}" for field, count in over.most_common()) + ")" if over else ""))


def _describe(spec: Any, cluster: Any) -> str:
    if not isinstance(spec, dict):
        return f"{type(spec).__name__} spec"
    model = spec.get("model") if isinstance(spec.get("model"), dict) else {}
    return (f"model {str((model or {}).get('name'))[:50]} gpu {str(spec.get('gpu'))[:80]} on "
            f"{len(cluster.nodes)} node(s)")


#: Large models on 24 GB GPUs allowed many nodes and GPUs (issue 20: Maverick with maxNodes/maxCount 64 cost 4.7 s).
EXPENSIVE_MODELS = ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", "deepseek-ai/DeepSeek-R1",
                    "meta-llama/Llama-3.1-405B-Instruct")
EXPENSIVE_NODES = {
    "2x L4": {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "2"},
    "1x RTX 4090": {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090", "nvidia.com/gpu.count": "1"},
    "8x H100": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"},
}


def expensive_specs() -> list[tuple[str, float]]:
    out = []
    for model in EXPENSIVE_MODELS:
        for label, node in EXPENSIVE_NODES.items():
            for gpu in ({"maxNodes": 64, "maxCount": 64}, {"maxNodes": 64, "maxCount": 64, "count": 1}):
                spec = {"model": {"name": model}, "gpu": gpu}
                observed = adversarial.observe(spec, "svc", (node, dict(EXPENSIVE_NODES["2x L4"])))
                started = time.process_time()
                desired = reconcile.desired_state(observed)
                spent = time.process_time() - started
                out.append((f"{model.split('/')[-1]} on {label} (+2x L4) gpu {gpu}: "
                            f"{adversarial.check(observed, desired)}", spent))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
