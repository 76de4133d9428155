"""The ladder belongs to what it was learned on: a learned profile is kept through plan-neutral edits (a scale
write through the /scale subresource, as the HPA and KEDA do; labels, annotations, env; an operator restart) and
reset exactly once when the plan's inputs change (a model change), also when the status writes answer 409.

The operator runs in-process behind the fault proxy (`kit.faults`); the test plays the user, the autoscaler and the
kubelet directly against the emulated API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kit.inprocess import (  # noqa: F401 (`cluster`: faulty_cluster_fixture)
    Cluster,
    args_of,
    deploy,
    faulty_cluster_fixture,
    history,
    no_kv_crash,
    plan_annotation,
    remediation,
)
from vllm_operator.api.v1alpha1 import GROUP, PLURAL, VERSION
from vllm_operator.handlers.service import PROFILE_RESET

NAME = "qwen"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"  # fits the same L4: a model change the planner can serve
STATUS = r"/vllmservices/qwen/status$"
TIMEOUT = 30.0


def stepped(cluster: Cluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """A service whose ladder took one step (NoKVCacheMemory): (its Deployment after the step, the service)."""
    deployment, service = deploy(cluster, NAME, {"remediation": {"maxSteps": 6}})
    cluster.crashed_pod(deployment, "qwen-a", message=no_kv_crash(service))
    obj = cluster.wait_history(NAME, 1, timeout=TIMEOUT)
    after = cluster.wait_deployment(NAME, lambda d: plan_annotation(d) != plan_annotation(deployment),
                                    timeout=TIMEOUT, message="the step rolled out")
    assert remediation(obj)["profile"] and remediation(obj)["step"] == 1 and remediation(obj)["inputsHash"]
    return after, obj


def handled(cluster: Cluster, done: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """The service once the operator has handled `what` (its reconcile ran and the API went quiet)."""
    cluster.wait_for(lambda: (obj if done(obj := cluster.service(NAME)) else None), TIMEOUT, what)
    return cluster.wait_settled(NAME, timeout=TIMEOUT)


def caught_up(obj: dict[str, Any]) -> bool:
    return (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]


def kept(before: dict[str, Any], obj: dict[str, Any]) -> None:
    rem, was = remediation(obj), remediation(before)
    assert (rem["profile"], rem["step"], rem["inputsHash"]) == (was["profile"], was["step"], was["inputsHash"])
    assert history(obj) == history(before)


def test_plan_neutral_edits_and_a_restart_keep_the_profile(cluster: Cluster) -> None:
    deployment, before = stepped(cluster)
    custom = cluster.custom

    # the autoscaler's write: PATCH .../vllmservices/qwen/scale (spec.replicas; a new generation)
    custom.patch_namespaced_custom_object_scale(GROUP, VERSION, cluster.namespace, PLURAL, NAME,
                                                {"spec": {"replicas": 2}})
    obj = handled(cluster, lambda o: o["spec"]["replicas"] == 2 and caught_up(o), "the scale write")
    kept(before, obj)
    scaled = cluster.wait_deployment(NAME, lambda d: d["spec"]["replicas"] == 2, timeout=TIMEOUT)
    assert plan_annotation(scaled) == plan_annotation(deployment) and args_of(scaled) == args_of(deployment)

    # labels and annotations (no new generation: kopf's update handler still runs), then an env var
    custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, NAME, {"metadata": {
        "labels": {"team": "search"}, "annotations": {"example.com/owner": "search"}}})
    obj = handled(cluster, lambda o: "search" in (o["metadata"].get("annotations") or {}).get(
        "vllm-operator.dev/last-handled-configuration", ""), "the label edit")
    kept(before, obj)
    cluster.patch_spec(NAME, {"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]})
    obj = handled(cluster, caught_up, "the env edit")
    kept(before, obj)
    with_env = cluster.wait_deployment(NAME, lambda d: any(
        e.get("name") == "VLLM_LOGGING_LEVEL" for e in d["spec"]["template"]["spec"]["containers"][0].get("env")
        or []), timeout=TIMEOUT)
    assert args_of(with_env) == args_of(deployment)  # the learned profile still renders

    # a restart: kopf resumes every service
    cluster.stop_operator()
    cluster.clear_access_log()
    cluster.start_operator()
    cluster.wait_for(lambda: cluster.accessed("get", PLURAL) or None, TIMEOUT, "the resumed reconcile read it")
    obj = cluster.wait_settled(NAME, timeout=TIMEOUT)
    kept(before, obj)
    assert cluster.events(NAME, PROFILE_RESET) == []


@pytest.mark.parametrize("conflicts", [0, 3, 8], ids=["no-fault", "409-retried-at-once", "409-retried-by-kopf"])
def test_a_model_change_resets_the_profile_exactly_once(cluster: Cluster, conflicts: int) -> None:
    _, before = stepped(cluster)
    assert cluster.faults is not None
    # the reset's own status write (the only one that changes the inputs' hash) answers 409: with 8, more often than
    # the writer retries at once (6), so the whole reconcile is retried by kopf
    rule = cluster.faults.add(method="PATCH", path=STATUS, body='"inputsHash"', status=409,
                              times=conflicts) if conflicts else None
    cluster.patch_spec(NAME, {"model": {"name": LLAMA_8B}})
    obj = handled(cluster, lambda o: caught_up(o) and not remediation(o)["profile"], "the model change")
    rem = remediation(obj)
    assert rem["step"] == 0 and not rem.get("exhausted")
    assert rem["inputsHash"] != remediation(before)["inputsHash"]
    assert history(obj) == history(before)  # the history stays: no failure is acted on twice
    deployment = cluster.wait_deployment(NAME, lambda d: args_of(d)[0] == LLAMA_8B, timeout=TIMEOUT)
    assert "--gpu-memory-utilization" in args_of(deployment)
    if rule is not None:
        assert rule.fired == conflicts, "the conflicts did not happen as planned"
    assert len(cluster.events(NAME, PROFILE_RESET)) == 1

    # the next plan-neutral edit, and a second look at the same spec, reset nothing
    cluster.patch_spec(NAME, {"replicas": 2})
    obj = handled(cluster, caught_up, "a replicas edit")
    assert remediation(obj)["inputsHash"] == rem["inputsHash"]
    assert len(cluster.events(NAME, PROFILE_RESET)) == 1
