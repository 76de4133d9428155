"""Data in, decisions out: the remediation ladder reads the cluster once per decision and re-plans over that data.

The ladder's status write is a read-build-write loop retried on a conflict (up to six times); each try re-plans the
stepped profile through the pure core. The model's files, the nodes, the StorageClasses and the served kinds are
read once, before that loop: a second read of any of them fails the test, and the core is handed data, never a
reader (`reconcile.Observed` holds no callable).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kit.inprocess import Cluster, deploy, history, no_kv_crash
from vllm_operator import reconcile
from vllm_operator.handlers import effects, kube, observe
from vllm_operator.handlers.remediation import remediate_service
from vllm_operator.remediation import ladder

NAME = "qwen"
READERS = ("load_model", "list_gpu_nodes", "default_storage_class", "shared_storage_class", "served_kinds",
           "lws_served")


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    env = Cluster(tmp_path)
    try:
        yield env
    finally:
        env.close()


def test_a_ladder_step_reads_the_cluster_once_however_often_its_write_is_retried(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    deployment, service = deploy(cluster, NAME)
    cluster.stop_operator()  # the handler by hand: only its own reads are counted
    kube.configure(str(cluster.kubeconfig))
    reads: Counter[str] = Counter()

    def once(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def read(*args: Any, **kwargs: Any) -> Any:
            reads[name] += 1
            assert reads[name] == 1, f"observe.{name} called again inside the ladder's decision"
            return real(*args, **kwargs)
        return read

    for reader in READERS:
        monkeypatch.setattr(observe, reader, once(reader, getattr(observe, reader)))
    renders: list[Any] = []
    real_next_step = ladder.next_step

    def next_step(seen: ladder.Observed, *args: Any, **kwargs: Any) -> Any:
        def render(status: Any) -> Any:
            renders.append(status)
            return seen.render(status)
        return real_next_step(dataclasses.replace(seen, render=render), *args, **kwargs)

    monkeypatch.setattr(ladder, "next_step", next_step)
    conflicts = {"left": 2}
    real_patch = effects.patch_status

    def patch_status(*args: Any, **kwargs: Any) -> Any:
        if conflicts["left"]:
            conflicts["left"] -= 1
            return None  # as a 409: the loop reads the service again and builds again
        return real_patch(*args, **kwargs)

    monkeypatch.setattr(effects, "patch_status", patch_status)

    cluster.crashed_pod(deployment, "qwen-a", message=no_kv_crash(service))
    remediate_service(cluster.namespace, NAME, logging.getLogger("test"))

    assert len(history(cluster.service(NAME))) == 1, "the step was recorded"
    assert conflicts["left"] == 0 and len(renders) >= 3, "three tries of the write, each re-planned"
    assert reads["load_model"] == 1 and reads["list_gpu_nodes"] == 1, reads
    assert reads["lws_served"] == 0, "a one-node spec never asks for LeaderWorkerSets"


def test_the_core_is_handed_data_not_readers() -> None:
    """Nothing the core receives can call back into the shell: no field of `Observed` is a callable."""
    for item in dataclasses.fields(reconcile.Observed):
        assert "Callable" not in str(item.type) and "Resolver" not in str(item.type), item
