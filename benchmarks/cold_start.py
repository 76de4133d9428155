"""What a start costs a serving service, phase by phase (issue 25): the real operator process on the simulated
cluster, one service through five events in turn.

Qwen2.5-7B-Instruct on L4 nodes (two, one GPU each), a default StorageClass (ReadWriteOnce claims), network 100 MiB/s
(`--rate`); an H100 node whose only GPU another service holds. The events:

1. first start — the service is created;
2. restart after a remediation step — vLLM's arguments change (what a ladder step does), so the pod is replaced;
3. scale 1→2 — `spec.replicas: 2`, as `kubectl scale` writes it;
4. scale 0→1 — `spec.replicas: 0`, then 1;
5. edit onto a full pool — `gpu.product` to the H100 whose GPU is taken (watched for `--window` simulated seconds);
6. first start with prewarm — on a fresh cluster of the same shape, the service created with
   `spec.modelCache.prewarm`: the pool's nodes pull the image (and, with a shared class, fill the cache) before the
   first pod; "until Ready" counts from the create, the notes give the pod's own start (status.coldStart).

Per event: simulated seconds without a Ready pod (downtime), GiB downloaded (the simulated kubelet's events), the
seconds until the event's pods are Ready, and torch.compile seconds of the last pod started (from its vLLM log:
a warm compile cache loads the compiled graphs instead). Run it on two checkouts to compare code before and after:

    .venv/bin/python benchmarks/cold_start.py [--rate 100] [--window 600] [--shared-class] [--max-replicas N]
                                              [--no-lws]

`--shared-class` adds a StorageClass with a shared-filesystem provisioner (ReadWriteMany claims). `--max-replicas N`
declares the service's bounds from its creation (`spec.maxReplicas`: it may run N pods); `--no-lws` runs the
cluster without the LeaderWorkerSet API (on ReadWriteOnce storage several pods then run as a StatefulSet, a claim
per pod; before it they shared no persistent cache).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from vllm_operator_sim.cluster import NodePool, SimulatedCluster

NAME = "qwen"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
L4, H100 = "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3"
_COMPILE = re.compile(r"torch\.compile takes ([0-9.]+) s in total")


@dataclass
class Row:
    event: str
    downtime_s: float = 0.0
    gib: float = 0.0
    to_ready_s: float | None = None
    compile_s: float | None = None
    notes: list[str] = field(default_factory=list)


def _service(spec: dict[str, Any], name: str = NAME) -> dict[str, Any]:
    return {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def _ready_pods(cluster: SimulatedCluster, name: str = NAME) -> list[dict[str, Any]]:
    pods = cluster.api.list_objects("pods", "default", label_selector=f"vllm-operator.dev/service={name}")
    return [p for p in pods if any(c.get("type") == "Ready" and c.get("status") == "True"
                                   for c in (p.get("status") or {}).get("conditions") or [])]


def _downloaded(cluster: SimulatedCluster) -> float:
    """GiB the service's pods downloaded, its prewarm pods' included (they carry none of its labels)."""
    return float(sum(e.details.get("bytes", 0) for e in cluster.kubelet.events
                     if e.kind == "download" and (e.service == NAME or e.service.startswith(f"{NAME}-prewarm")))
                 ) / 2**30


def _start_notes(cluster: SimulatedCluster, timeout: float) -> list[str]:
    """The service's last measured pod start, as status.coldStart records it."""
    def measured() -> dict[str, Any] | None:
        obj = cluster.api.get_object("vllmservices", NAME, "default") or {}
        found = (obj.get("status") or {}).get("coldStart") or {}
        return found if "readySeconds" in found else None
    try:
        found = cluster.wait_for(measured, timeout=min(timeout, 60.0), message="no start measured")
    except Exception:  # noqa: BLE001 - a note, not a result
        return ["no start measured"]
    start: dict[str, Any] = found or {}
    pull = start.get("imagePullSeconds")
    return [f"pod start {start['readySeconds']:.0f} s (image pull {'-' if pull is None else f'{pull:.0f} s'}, "
            f"download {start.get('downloadSeconds', 0.0):.0f} s)"]


def _compile_s(cluster: SimulatedCluster, pod: dict[str, Any]) -> float | None:
    """torch.compile seconds from the pod's vLLM log (`GET pods/log` on the loopback API server)."""
    url = f"{cluster.server.url}/api/v1/namespaces/default/pods/{pod['metadata']['name']}/log?container=vllm"
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - loopback only
        log = answer.read().decode("utf-8", "replace")
    found = _COMPILE.findall(log)
    return float(found[-1]) if found else None


def _watch(cluster: SimulatedCluster, row: Row, done: Any, *, limit_s: float, timeout: float) -> None:
    """Poll until `done()` (or `limit_s` simulated seconds): downtime is the simulated time with no Ready pod."""
    start = last = cluster.clock.now()
    deadline = time.monotonic() + timeout
    gib0 = _downloaded(cluster)
    while True:
        now = cluster.clock.now()
        if not _ready_pods(cluster):
            row.downtime_s += now - last
        last = now
        if done():
            row.to_ready_s = now - start
            break
        if now - start >= limit_s or time.monotonic() > deadline:
            row.notes.append(f"not done after {now - start:.0f} s")
            break
        time.sleep(0.05)
    row.gib = _downloaded(cluster) - gib0
    pods = sorted(_ready_pods(cluster), key=lambda p: p["metadata"].get("creationTimestamp") or "")
    if pods:
        row.compile_s = _compile_s(cluster, pods[-1])


def _settled(cluster: SimulatedCluster) -> bool:
    """The service is Ready with no workload switch under way (a scale that moves a one-pod Deployment to one-pod
    groups is done when the groups serve, not when the Deployment's pod and the first group do)."""
    status = (cluster.api.get_object("vllmservices", NAME, "default") or {}).get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    return "workloadSwitch" not in status and ready.get("status") == "True"


def _args_of(pod: dict[str, Any]) -> list[str]:
    return [str(a) for a in pod["spec"]["containers"][0].get("args") or []]


@contextlib.contextmanager
def _cluster(rate: float, shared_class: bool, lws: bool) -> Iterator[SimulatedCluster]:
    """The benchmark's cluster, the operator started: two one-GPU L4 nodes and an H100 node, downloads at `rate`
    MiB/s, an NFS (ReadWriteMany) StorageClass beside the default one when `shared_class`."""
    with SimulatedCluster([NodePool("L4", 1, 2), NodePool("H100-SXM-80GB", 1, 1)], speed=50,
                          leaderworkerset=lws) as cluster:
        cluster.kubelet.download_mib_per_s = rate
        if shared_class:
            cluster.api.create_object("storageclasses", {
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "nfs"},
                "provisioner": "nfs.csi.k8s.io"})
        cluster.start_operator()
        yield cluster


def run(rate: float, window: float, timeout: float, shared_class: bool, max_replicas: int | None = None,
        lws: bool = True) -> list[Row]:
    rows: list[Row] = []
    with _cluster(rate, shared_class, lws) as cluster:
        spec: dict[str, Any] = {"model": {"name": MODEL}, "gpu": {"product": L4},
                                "flags": {"maxNumSeqs": 16}, **({"maxReplicas": max_replicas} if max_replicas else {})}
        cluster.apply(_service({"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "gpu": {"product": H100}},
                               name="other"))

        row = Row("first start")
        cluster.apply(_service(spec))
        _watch(cluster, row, lambda: len(_ready_pods(cluster)) == 1, limit_s=3600, timeout=timeout)
        row.downtime_s = 0.0  # nothing served before
        row.notes = _start_notes(cluster, timeout)
        rows.append(row)

        row = Row("restart after a remediation step")
        spec = {**spec, "flags": {"maxNumSeqs": 8}}
        cluster.apply(_service(spec))
        _watch(cluster, row, lambda: [p for p in _ready_pods(cluster) if "8" in _args_of(p)[
            _args_of(p).index("--max-num-seqs") + 1:][:1]], limit_s=3600, timeout=timeout)
        rows.append(row)

        row = Row("scale 1→2")
        spec = {**spec, "replicas": 2}
        cluster.apply(_service(spec))
        _watch(cluster, row, lambda: len(_ready_pods(cluster)) == 2 and _settled(cluster), limit_s=3600,
               timeout=timeout)
        rows.append(row)

        row = Row("scale 0→1")
        cluster.apply(_service({**spec, "replicas": 0}))
        cluster.wait_for(lambda: not cluster.api.list_objects(
            "pods", "default", label_selector=f"vllm-operator.dev/service={NAME}"), timeout=timeout,
            message="the pods never went at replicas 0")
        spec = {**spec, "replicas": 1}
        cluster.apply(_service(spec))
        _watch(cluster, row, lambda: len(_ready_pods(cluster)) == 1, limit_s=3600, timeout=timeout)
        row.downtime_s = 0.0  # scaled to zero on purpose: the wait is the start
        rows.append(row)

        row = Row("edit onto a full pool")
        cluster.apply(_service({**spec, "gpu": {"product": H100}}))
        _watch(cluster, row, lambda: False, limit_s=window, timeout=timeout)
        row.to_ready_s = None
        obj = cluster.api.get_object("vllmservices", NAME, "default") or {}
        progressing: dict[str, Any] = next((c for c in (obj.get("status") or {}).get("conditions") or []
                            if c.get("type") == "Progressing"), {})
        row.notes = [f"watched {window:.0f} s; Progressing {progressing.get('reason')}"]
        rows.append(row)
        workload = ((cluster.api.get_object("vllmservices", NAME, "default") or {}).get("status") or {}).get(
            "workload") or "Deployment (status.workload unset)"
        rows[0].notes.append(f"runs on a {workload} at the end")
    rows.append(_prewarmed_start(rate, timeout, shared_class, max_replicas, lws))
    return rows


def _prewarmed_start(rate: float, timeout: float, shared_class: bool, max_replicas: int | None = None,
                     lws: bool = True) -> Row:
    """A fresh cluster of the same shape; the service created with spec.modelCache.prewarm."""
    row = Row("first start with prewarm")
    with _cluster(rate, shared_class, lws) as cluster:
        cluster.apply(_service({"model": {"name": MODEL}, "gpu": {"product": L4}, "flags": {"maxNumSeqs": 16},
                                "modelCache": {"prewarm": {}},
                                **({"maxReplicas": max_replicas} if max_replicas else {})}))
        _watch(cluster, row, lambda: len(_ready_pods(cluster)) == 1, limit_s=3600, timeout=timeout)
        row.downtime_s = 0.0  # nothing served before
        obj = cluster.api.get_object("vllmservices", NAME, "default") or {}
        prewarm = ((obj.get("status") or {}).get("modelCache") or {}).get("prewarm") or {}
        row.notes = [*_start_notes(cluster, timeout), f"prewarm {prewarm.get('phase')} on {prewarm.get('ready')}/"
                     f"{prewarm.get('desired')} nodes"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="simulated download rate, MiB/s (default 100)")
    parser.add_argument("--window", type=float, default=600.0, help="simulated seconds the full-pool edit is watched")
    parser.add_argument("--timeout", type=float, default=300.0, help="real seconds per event at most")
    parser.add_argument("--shared-class", action="store_true", help="add a ReadWriteMany (NFS) StorageClass")
    parser.add_argument("--max-replicas", type=int, default=None, help="spec.maxReplicas from the creation on")
    parser.add_argument("--no-lws", action="store_true", help="a cluster without the LeaderWorkerSet API")
    args = parser.parse_args(argv)
    rows = run(args.rate, args.window, args.timeout, args.shared_class, args.max_replicas, not args.no_lws)
    print(f"{MODEL} on L4 nodes, default StorageClass (ReadWriteOnce){' + an NFS class' if args.shared_class else ''}"
          f"{'' if args.no_lws else ', LeaderWorkerSet served'}"
          f"{f', spec.maxReplicas {args.max_replicas}' if args.max_replicas else ''}"
          f", network {args.rate:g} MiB/s (simulated seconds)")
    print("| event | downtime | GiB downloaded | until Ready | torch.compile of the last pod | notes |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ready = f"{r.to_ready_s:.0f} s" if r.to_ready_s is not None else "-"
        compiled = f"{r.compile_s:.1f} s" if r.compile_s is not None else "-"
        print(f"| {r.event} | {r.downtime_s:.0f} s | {r.gib:.1f} | {ready} | {compiled} | {'; '.join(r.notes)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
