"""The rollout as the pods show it (vllm_operator.api.rollout): pure, from Deployment and pod objects."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from vllm_operator.api import conditions as c
from vllm_operator.api import rollout
from vllm_operator.render.manifests import ANNOTATION_PLAN

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
NO_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."
TAINT = "0/3 nodes are available: 3 node(s) had untolerated taint {dedicated: llm}."


def deployment(plan: str = "new", *, replicas: int = 1, generation: int = 2, observed: int = 2, updated: int = 1,
               total: int = 2, strategy: dict[str, Any] | None = None,
               progressing: dict[str, Any] | None = None, gpus: int = 1) -> dict[str, Any]:
    status: dict[str, Any] = {"observedGeneration": observed, "updatedReplicas": updated, "replicas": total}
    if progressing:
        status["conditions"] = [{"type": "Progressing", **progressing}]
    return {
        "metadata": {"name": "llm", "namespace": "team", "generation": generation,
                     "ownerReferences": [{"kind": "VLLMService", "name": "llm", "uid": "u1"}]},
        "spec": {"replicas": replicas,
                 "strategy": strategy or {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                 "template": {"metadata": {"annotations": {ANNOTATION_PLAN: plan}},
                              "spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
                                       "containers": [{"name": "vllm", "resources": {
                                           "requests": {"nvidia.com/gpu": str(gpus)}}}]}}},
        "status": status,
    }


def pod(plan: str, *, ready: bool = False, unschedulable: str | None = None, node: str | None = "gpu-1",
        gpus: int = 1, deleting: bool = False) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": unschedulable})
        node = None
    meta: dict[str, Any] = {"name": f"llm-{plan}", "annotations": {ANNOTATION_PLAN: plan}}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-02T03:04:05Z"
    spec: dict[str, Any] = {"containers": [{"name": "vllm", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec,
            "status": {"phase": "Running" if ready else "Pending", "conditions": conditions}}


def node(name: str = "gpu-1", product: str = "NVIDIA-L4", gpus: int = 1, cordoned: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "spec": {"unschedulable": cordoned}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


def fold(view: rollout.RolloutView, status: dict[str, Any] | None = None) -> dict[str, Any]:
    status = status or {}
    new = c.fold_status(status, conditions=rollout.rollout_conditions(view, status), observed_generation=2, now=NOW)
    return new.to_dict()


def by_type(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {x["type"]: (x["status"], x["reason"], x["message"]) for x in status["conditions"]}


def test_a_spec_change_on_a_full_pool_is_never_reported_complete() -> None:
    """The old pod still serves (readyReplicas 1/1) but the new one cannot be scheduled."""
    view = rollout.assess(deployment(), [pod("old", ready=True), pod("new", unschedulable=NO_GPU)])
    assert not view.complete and not view.serves_desired
    assert (view.current_ready, view.previous_ready, view.unschedulable) == (0, 1, NO_GPU)
    status = fold(view, {"conditions": [{"type": "Ready", "status": "True", "reason": "Available",
                                         "lastTransitionTime": "2025-01-01T00:00:00Z"}]})
    conditions = by_type(status)
    assert conditions["Ready"][:2] == ("False", "ServingPreviousProfile")
    assert "1 pod of the previous profile still serving" in conditions["Ready"][2]
    assert conditions["Progressing"][:2] == ("True", "Unschedulable") and NO_GPU in conditions["Progressing"][2]
    assert conditions["Degraded"][:2] == ("True", "Unschedulable") and NO_GPU in conditions["Degraded"][2]
    assert status["state"] == "Unschedulable"


def test_untolerated_taints_and_scaling_without_a_free_gpu_name_the_scheduler_cause() -> None:
    view = rollout.assess(deployment(updated=1, total=1), [pod("new", unschedulable=TAINT)])
    conditions = by_type(fold(view))
    assert conditions["Ready"][:2] == ("False", "Unschedulable") and TAINT in conditions["Ready"][2]
    assert conditions["Degraded"][:2] == ("True", "Unschedulable")
    scaled = rollout.assess(deployment(replicas=2, updated=2, total=2),
                            [pod("new", ready=True), pod("new", unschedulable=NO_GPU)])
    conditions = by_type(fold(scaled))
    assert conditions["Ready"] == ("False", "Unschedulable", "1/2 pods of the current profile ready: " + NO_GPU)


def test_complete_only_when_the_current_profile_serves_and_nothing_older_is_left() -> None:
    terminating = rollout.assess(deployment(), [pod("old", ready=True), pod("new", ready=True)])
    assert terminating.serves_desired and not terminating.complete
    conditions = by_type(fold(terminating))
    assert conditions["Ready"][:2] == ("True", "Available")
    assert conditions["Progressing"][:2] == ("True", "Deploying")
    done = rollout.assess(deployment(total=1), [pod("old", ready=True, deleting=True), pod("new", ready=True)])
    assert done.complete
    was_unschedulable = {"conditions": [{"type": "Degraded", "status": "True", "reason": "Unschedulable",
                                         "lastTransitionTime": "2025-01-01T00:00:00Z"}]}
    status = fold(done, was_unschedulable)
    conditions = by_type(status)
    assert conditions["Progressing"][:2] == ("False", "RolloutComplete")
    assert conditions["Degraded"][:2] == ("False", "AsExpected")
    assert status["state"] == "Ready"


def test_the_deployment_controller_must_have_seen_the_generation() -> None:
    """Right after a template change the controller has not made new pods: the old ones are not the new profile."""
    view = rollout.assess(deployment(observed=1, updated=1, total=1), [pod("old", ready=True)])
    assert not view.serves_desired
    assert by_type(fold(view))["Ready"][:2] == ("False", "ServingPreviousProfile")
    # a change the plan annotation does not show (e.g. tolerations): the controller's counters hold it back
    same_plan = rollout.assess(deployment(plan="p", updated=1, total=2), [pod("p", ready=True), pod("p")])
    assert same_plan.serves_desired and not same_plan.complete


def test_progress_deadline_exceeded_is_degraded() -> None:
    exceeded = {"status": "False", "reason": "ProgressDeadlineExceeded",
                "message": 'ReplicaSet "llm-abc" has timed out progressing.'}
    view = rollout.assess(deployment(progressing=exceeded), [pod("old", ready=True), pod("new")])
    conditions = by_type(fold(view))
    assert conditions["Progressing"][:2] == ("False", "ProgressDeadlineExceeded")
    assert conditions["Degraded"][:2] == ("True", "ProgressDeadlineExceeded")
    assert "timed out progressing" in conditions["Degraded"][2]


def test_a_standing_verdict_is_neither_overridden_nor_cleared_by_the_rollout() -> None:
    exhausted = {"conditions": [{"type": "Degraded", "status": "True", "reason": "RemediationExhausted",
                                 "message": "no step left", "lastTransitionTime": "2025-01-01T00:00:00Z"}],
                 "remediation": {"step": 3, "exhausted": True}}
    stuck = rollout.assess(deployment(), [pod("old", ready=True), pod("new", unschedulable=NO_GPU)])
    status = fold(stuck, exhausted)
    assert by_type(status)["Degraded"][1] == "RemediationExhausted"
    assert by_type(status)["Ready"][:2] == ("False", "ServingPreviousProfile")  # exhausted while serving: not Ready
    assert status["state"] == "RemediationExhausted"
    serving = rollout.assess(deployment(total=1), [pod("new", ready=True)])
    assert by_type(fold(serving, exhausted))["Degraded"][1] == "RemediationExhausted"


def test_a_failure_class_clears_once_the_current_profile_is_ready() -> None:
    oom = {"conditions": [{"type": "Degraded", "status": "True", "reason": "CUDAOutOfMemory", "message": "OOM",
                           "lastTransitionTime": "2025-01-01T00:00:00Z"}], "remediation": {"step": 1}}
    view = rollout.assess(deployment(total=1), [pod("new", ready=True)])
    assert by_type(fold(view, oom))["Degraded"] == ("False", "AsExpected", "ready after 1 remediation step(s)")


def test_scaled_to_zero() -> None:
    status = fold(rollout.assess(deployment(replicas=0, updated=0, total=0), []))
    assert by_type(status)["Ready"][:2] == ("True", "ScaledToZero") and status["state"] == "ScaledToZero"


def test_roll_without_surge_when_the_old_pods_hold_the_gpus_the_new_one_needs() -> None:
    pods = [pod("old", ready=True), pod("new", unschedulable=NO_GPU)]
    dep = deployment()
    view = rollout.assess(dep, pods)
    why = rollout.surge_blocked(dep, view, pods, [node()])
    assert why is not None and "without surge" in why and "gpu-1" in why and NO_GPU in why
    # a crash-looping old pod (not ready) holds GPUs the fix needs just the same
    crashing = [pod("old", ready=False), pod("new", unschedulable=NO_GPU)]
    assert rollout.surge_blocked(dep, rollout.assess(dep, crashing), crashing, [node()]) is not None


def test_no_switch_when_it_would_not_help() -> None:
    dep = deployment()
    pods = [pod("old", ready=True), pod("new", unschedulable=NO_GPU)]
    view = rollout.assess(dep, pods)
    assert rollout.surge_blocked(dep, view, pods, [node(product="NVIDIA-A100")]) is None  # old pod's node not eligible
    assert rollout.surge_blocked(dep, view, pods, [node(cordoned=True)]) is None
    assert rollout.surge_blocked(deployment(gpus=2), view, pods, [node()]) is None  # frees 1, needs 2
    tainted = [pod("old", ready=True), pod("new", unschedulable=TAINT)]
    assert rollout.surge_blocked(dep, rollout.assess(dep, tainted), tainted, [node()]) is None
    already = deployment(strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})
    assert rollout.surge_blocked(already, view, pods, [node()]) is None
    assert rollout.surge_blocked(deployment(strategy={"type": "Recreate"}), view, pods, [node()]) is None


def test_started_conditions_say_the_new_profile_is_not_running_yet() -> None:
    updates = {u.type: u for u in rollout.started_conditions(1, 1)}
    assert (updates["Ready"].status, updates["Ready"].reason) == ("False", "ServingPreviousProfile")
    assert (updates["Progressing"].status, updates["Progressing"].reason) == ("True", "Deploying")
    assert rollout.started_conditions(1, 0)[1].reason == "PodsNotReady"


# --------------------------------------------------------------------------------------------------
# the model-download init container
# --------------------------------------------------------------------------------------------------

GATED_ERROR = ("huggingface_hub.errors.GatedRepoError: 401 Client Error. / Cannot access gated repo for url "
               "https://huggingface.co/api/models/org/model. / Access to model org/model is restricted (token ***).")


def init_pod(plan: str, init: dict[str, Any], *, vllm: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod of `plan` in its init phase: the model-download init container's status `init`."""
    found = pod(plan)
    found["spec"]["initContainers"] = [{"name": "model-download"}]
    found["status"]["initContainerStatuses"] = [{"name": "model-download", "ready": False, "restartCount": 0, **init}]
    found["status"]["containerStatuses"] = [vllm or {"name": "vllm", "ready": False, "restartCount": 0,
                                                     "state": {"waiting": {"reason": "PodInitializing"}}}]
    return found


RUNNING = {"state": {"running": {"startedAt": "2025-01-02T03:00:00Z"}}}
FAILED = {"state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "GatedRepoError: hf_x"}}}
CRASH_LOOP = {"restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
              "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "GatedRepoError: hf_x"}}}
RECORDED = {"modelCache": {"downloadError": GATED_ERROR, "downloadErrorPod": "llm-new"}}


def test_the_init_container_tie_to_the_renderer() -> None:
    from vllm_operator.render.cache import DOWNLOAD_CONTAINER
    assert rollout.DOWNLOAD_CONTAINER == DOWNLOAD_CONTAINER


def test_a_running_download_is_reported_as_downloading() -> None:
    view = rollout.assess(deployment(updated=1, total=1), [init_pod("new", RUNNING)])
    assert view.downloading == "pod llm-new, started at 2025-01-02T03:00:00Z" and view.download_failed is None
    status = fold(view)
    conditions = by_type(status)
    assert conditions["Progressing"][:2] == ("True", "Downloading")
    assert "downloading the model into the cache: pod llm-new, started at 2025-01-02T03:00:00Z" in \
        conditions["Progressing"][2]
    assert conditions["Ready"][:2] == ("False", "Downloading")
    assert "Degraded" not in conditions
    assert status["state"] == "Downloading"
    # the same pod later: the status is the same (a start time, not an age), so nothing is written again
    assert fold(rollout.assess(deployment(updated=1, total=1), [init_pod("new", RUNNING)])) == status


def test_a_download_while_the_previous_profile_serves() -> None:
    view = rollout.assess(deployment(), [pod("old", ready=True), init_pod("new", RUNNING)])
    status = fold(view)
    conditions = by_type(status)
    assert conditions["Ready"][:2] == ("False", "ServingPreviousProfile")
    assert conditions["Progressing"][:2] == ("True", "Downloading") and status["state"] == "Downloading"


@pytest.mark.parametrize("init", [FAILED, CRASH_LOOP], ids=["Init:Error", "Init:CrashLoopBackOff"])
def test_a_failed_download_is_degraded_with_the_recorded_reason(init: dict[str, Any]) -> None:
    view = rollout.assess(deployment(updated=1, total=1), [init_pod("new", init)])
    assert view.download_failed is not None and view.downloading is None
    status = fold(view, dict(RECORDED))
    conditions = by_type(status)
    assert conditions["Degraded"][:2] == ("True", "ModelDownloadFailed")
    assert "exit code 1 (Error)" in conditions["Degraded"][2] and GATED_ERROR in conditions["Degraded"][2]
    assert conditions["Ready"][:2] == ("False", "ModelDownloadFailed")
    assert conditions["Progressing"][:2] == ("True", "ModelDownloadFailed")
    assert status["state"] == "ModelDownloadFailed"
    # the pod's own text (the log's tail, unredacted) never reaches the status: only what the pod hook recorded
    assert "hf_x" not in str(status)


def test_the_kubelet_s_word_alone_before_the_reason_is_recorded() -> None:
    view = rollout.assess(deployment(updated=1, total=1), [init_pod("new", CRASH_LOOP)])
    degraded = by_type(fold(view))["Degraded"]
    assert degraded == ("True", "ModelDownloadFailed", "the model download fails: pod llm-new: the model-download "
                        "init container failed, exit code 1 (Error), 2 restarts, back-off before the next try")
    other_pod = fold(view, {"modelCache": {"downloadError": GATED_ERROR, "downloadErrorPod": "llm-older"}})
    assert "pod llm-older's download said: " + GATED_ERROR in by_type(other_pod)["Degraded"][2]


def test_a_retry_after_a_failure_is_still_failing_and_success_clears_it() -> None:
    retry = {"restartCount": 1, **RUNNING, "lastState": CRASH_LOOP["lastState"]}
    view = rollout.assess(deployment(updated=1, total=1), [init_pod("new", retry)])
    assert view.downloading is None and "trying again" in (view.download_failed or "")
    failed = fold(view, dict(RECORDED))
    assert failed["state"] == "ModelDownloadFailed"
    done = {"restartCount": 1, "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": "{}"}},
            "lastState": CRASH_LOOP["lastState"]}
    starting = init_pod("new", done, vllm={"name": "vllm", "ready": False, "restartCount": 0,
                                           "state": {"running": {"startedAt": "2025-01-02T03:05:00Z"}}})
    view = rollout.assess(deployment(updated=1, total=1), [starting])
    assert view.download_failed is None and view.downloading is None
    conditions = by_type(fold(view, failed))
    assert conditions["Degraded"] == ("False", "AsExpected", "the model download no longer fails")
    assert conditions["Progressing"][:2] == ("True", "Deploying")


def test_an_init_container_that_cannot_start() -> None:
    pull = {"state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "vllm:x"'}}}
    view = rollout.assess(deployment(updated=1, total=1), [init_pod("new", pull)])
    assert view.download_failed == ("pod llm-new: the model-download init container cannot start (ImagePullBackOff: "
                                    'Back-off pulling image "vllm:x")')
    assert by_type(fold(view))["Degraded"][:2] == ("True", "ModelDownloadFailed")


def test_a_failed_download_never_overrides_a_standing_verdict_and_old_pods_do_not_count() -> None:
    invalid = {"conditions": [{"type": "Degraded", "status": "True", "reason": "InvalidSpec", "message": "bad",
                               "lastTransitionTime": "2025-01-01T00:00:00Z"}]}
    view = rollout.assess(deployment(updated=1, total=1), [init_pod("new", CRASH_LOOP)])
    assert by_type(fold(view, invalid))["Degraded"][1] == "InvalidSpec"
    # a pod of an earlier template whose download failed is not the current profile's problem
    old = rollout.assess(deployment(total=1), [init_pod("old", CRASH_LOOP), pod("new", ready=True)])
    assert old.download_failed is None
    assert by_type(fold(old))["Ready"][:2] == ("True", "Available") and "Degraded" not in by_type(fold(old))


def test_which_pod_events_refresh_the_rollout() -> None:
    assert rollout.in_init(init_pod("new", RUNNING)) and rollout.in_init(init_pod("new", CRASH_LOOP))
    done = {"state": {"terminated": {"exitCode": 0}}}
    assert rollout.in_init(init_pod("new", done, vllm={"name": "vllm", "ready": False, "state": {"running": {}}}))
    assert not rollout.in_init(pod("new"))  # no init container: nothing to report
    crashed = {"name": "vllm", "ready": False, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
               "lastState": {"terminated": {"exitCode": 1}}}
    assert not rollout.in_init(init_pod("new", done, vllm=crashed))  # vLLM's failure: the ladder's
    assert not rollout.in_init(init_pod("new", done, vllm={"name": "vllm", "ready": True, "state": {"running": {}}}))
