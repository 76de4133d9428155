"""How long one remediation step takes, from the pod's death to the step recorded and rolled out, with and without
API faults between the operator and the API server — and how many requests the operator made for it.

The operator runs in-process (its kopf registry) against the emulated API behind the fault proxy of the project's
test kit (`tests/kit`: `inprocess.Cluster`, `faults.FaultProxy`); a pod of the Deployment's template dies of
NoKVCacheMemory (vLLM's own text) and the script times the step. Faults: none; the step's status write answering
503 eight times (more than the status writer's six immediate attempts: the prompt retry takes it); the status write
landing but answering 500 (the rebuild finds it recorded); the rollout answering 503 six times (more than the four
immediate attempts: the step is recorded, the retry completes the rollout).

    .venv/bin/python benchmarks/ladder_faults.py [--runs 5]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from kit.inprocess import Cluster, deploy, history, no_kv_crash, plan_annotation  # noqa: E402

NAME = "qwen"
FAULTS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "status 503 x8": {"method": "PATCH", "path": r"/vllmservices/qwen/status$", "body": '"history"', "status": 503,
                      "times": 8},
    "status landed, 500": {"method": "PATCH", "path": r"/vllmservices/qwen/status$", "body": '"history"',
                           "land_then": 500, "times": 1},
    "rollout 503 x6": {"method": "PATCH", "path": r"/deployments/qwen$", "body": "gpu-memory-utilization",
                       "status": 503, "times": 6},
}


def one_step(fault: dict[str, Any] | None) -> tuple[float, float, int]:
    """(seconds to the record, seconds to the rollout, operator requests in between)."""
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), faults=True)
        try:
            deployment, service = deploy(cluster, NAME)
            cluster.wait_quiet(0.3, timeout=30)
            proxy = cluster.faults
            assert proxy is not None
            if fault is not None:
                proxy.add(**fault)
            before = plan_annotation(deployment)
            seen = len(proxy.log)
            start = time.monotonic()
            cluster.crashed_pod(deployment, "qwen-a", message=no_kv_crash(service))
            cluster.wait_for(lambda: len(history(cluster.service(NAME))) == 1, 60, "step recorded")
            recorded = time.monotonic() - start
            cluster.wait_deployment(NAME, lambda d: plan_annotation(d) != before, timeout=60)
            rolled = time.monotonic() - start
            cluster.wait_quiet(0.3, timeout=30)
            return recorded, rolled, len(proxy.log) - seen
        finally:
            cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    logging.disable(logging.INFO)
    print(f"{'fault':<22} {'recorded (median s)':>20} {'rolled out (median s)':>22} {'requests':>9}")
    for label, fault in FAULTS.items():
        results = [one_step(fault) for _ in range(args.runs)]
        print(f"{label:<22} {statistics.median(r[0] for r in results):>20.2f} "
              f"{statistics.median(r[1] for r in results):>22.2f} {statistics.median(r[2] for r in results):>9.0f}")


if __name__ == "__main__":
    main()
