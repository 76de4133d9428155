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

Usage: python benchmarks/adversarial_corpus.py [--examples 12500] [--seed 0]
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

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from kit import adversarial  # noqa: E402
from vllm_operator import reconcile  # noqa: E402
from vllm_operator.api.v1alpha1 import validate_spec  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=12500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    outcomes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    failures: list[str] = []
    timings: list[float] = []
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
        started = time.perf_counter()
        try:
            desired = reconcile.desired_state(observed)
        except Exception:  # noqa: BLE001 - counted: the property is that this never happens
            outcomes["EXCEPTION"] += 1
            failures.append(traceback.format_exc(limit=3))
            return
        finally:
            timings.append(time.perf_counter() - started)
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
    bad = outcomes["EXCEPTION"] + outcomes["CHECK FAILED"]
    print(f"exceptions escaping the core: {outcomes['EXCEPTION']}; failed checks: {outcomes['CHECK FAILED']}")
    for failure in failures[:20]:
        print("---\n" + failure)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
