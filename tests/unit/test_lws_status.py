"""A multi-node service's readiness from its LeaderWorkerSet groups (api/lws_status.py), the model-download init
container of leader and worker pods included: Downloading naming the ranks, ModelDownloadFailed (Degraded, never
Ready) with the redacted reason, cleared once the download no longer fails; standing verdicts are kept."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from vllm_operator.api import conditions as cond
from vllm_operator.api import lws_status
from vllm_operator.api.lws_status import GROUP_INDEX_LABEL, WORKER_INDEX_LABEL

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
GATED_ERROR = ("huggingface_hub.errors.GatedRepoError: 401 Client Error. / Cannot access gated repo for url "
               "https://huggingface.co/api/models/org/model. / Access to model org/model is restricted (token ***).")
RUNNING = {"state": {"running": {"startedAt": "2025-01-02T03:00:00Z"}}}
DONE = {"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
CRASH_LOOP = {"restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
              "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "GatedRepoError: hf_x"}}}


def lws(replicas: int = 1, size: int = 2) -> dict[str, Any]:
    return {"metadata": {"name": "big"}, "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": size}}}


def pod(group: int, worker: int, *, init: dict[str, Any] | None = None, ready: bool = False,
        deleting: bool = False) -> dict[str, Any]:
    name = f"big-{group}" + (f"-{worker}" if worker else "")
    found: dict[str, Any] = {
        "metadata": {"name": name, "uid": f"uid-{name}",
                     "labels": {GROUP_INDEX_LABEL: str(group), WORKER_INDEX_LABEL: str(worker)}},
        "status": {"phase": "Running" if ready else "Pending",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    if deleting:
        found["metadata"]["deletionTimestamp"] = "2025-01-02T03:04:00Z"
    if init is not None:
        found["status"]["initContainerStatuses"] = [{"name": "model-download", "ready": False, "restartCount": 0,
                                                     **init}]
        found["status"]["containerStatuses"] = [{"name": "vllm", "ready": ready, "restartCount": 0,
                                                 "state": {"running": {}} if ready else
                                                 {"waiting": {"reason": "PodInitializing"}}}]
    return found


def fold(view: lws_status.GroupView, status: dict[str, Any] | None = None) -> dict[str, Any]:
    folded = cond.fold_status(status, conditions=lws_status.group_conditions(view, status), observed_generation=1,
                              now=NOW)
    return folded.model_dump(by_alias=True, exclude_none=True, mode="json")


def by_type(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c.get("message", "")) for c in status.get("conditions") or []}


def test_a_group_downloading_names_its_pods_and_ranks() -> None:
    view = lws_status.assess_groups(lws(), [pod(0, 0, init=RUNNING), pod(0, 1, init=RUNNING)])
    assert view.downloading == ("leader of group 0: pod big-0, started at 2025-01-02T03:00:00Z",
                                "worker 1 of group 0: pod big-0-1, started at 2025-01-02T03:00:00Z")
    assert not view.download_failed and not view.download_failed_groups
    status = fold(view)
    conditions = by_type(status)
    assert conditions["Progressing"][:2] == ("True", "Downloading")
    assert conditions["Ready"][:2] == ("False", "Downloading")
    assert "worker 1 of group 0: pod big-0-1" in conditions["Progressing"][2]
    assert "0/1 groups of 2 pods ready" in conditions["Ready"][2]
    assert "Degraded" not in conditions and status["state"] == "Downloading"
    # the same pods later: the same status (a start time, not an age)
    assert fold(lws_status.assess_groups(lws(), [pod(0, 0, init=RUNNING), pod(0, 1, init=RUNNING)])) == status


def test_a_download_that_finished_on_one_rank_still_downloads_on_the_other() -> None:
    view = lws_status.assess_groups(lws(), [pod(0, 0, init=DONE), pod(0, 1, init=RUNNING)])
    assert view.downloading == ("worker 1 of group 0: pod big-0-1, started at 2025-01-02T03:00:00Z",)
    assert by_type(fold(view))["Progressing"][:2] == ("True", "Downloading")


def test_a_failed_download_on_a_worker_is_degraded_with_the_recorded_reason() -> None:
    pods = [pod(0, 0, init=RUNNING), pod(0, 1, init=CRASH_LOOP)]
    view = lws_status.assess_groups(lws(), pods)
    assert view.download_failed_groups == frozenset({"0"})
    recorded = {"modelCache": {"downloadError": GATED_ERROR, "downloadErrorPod": "big-0-1"}}
    status = fold(view, recorded)
    conditions = by_type(status)
    assert conditions["Degraded"][:2] == ("True", "ModelDownloadFailed")
    assert conditions["Degraded"][2] == (
        "the model download fails: worker 1 of group 0: pod big-0-1: the model-download init container failed, "
        f"exit code 1 (Error), 2 restarts, back-off before the next try: {GATED_ERROR}")
    assert conditions["Ready"][:2] == ("False", "ModelDownloadFailed")
    assert conditions["Progressing"][:2] == ("True", "ModelDownloadFailed")
    assert status["state"] == "ModelDownloadFailed"
    assert "hf_x" not in str(status)  # the pod's own text never reaches the status: only what the hook recorded


def test_without_the_status_the_kubelet_s_word_is_said() -> None:
    view = lws_status.assess_groups(lws(), [pod(0, 0, init=CRASH_LOOP), pod(0, 1, init=CRASH_LOOP)])
    degraded = by_type(fold(view))["Degraded"]
    assert degraded[:2] == ("True", "ModelDownloadFailed")
    assert degraded[2].startswith("the model download fails: leader of group 0: pod big-0: the model-download")
    assert degraded[2].endswith("(and 1 more pod of the groups)")


def test_a_failed_download_is_never_ready_even_when_another_group_serves() -> None:
    pods = [pod(0, 0, init=DONE, ready=True), pod(0, 1, init=DONE, ready=True),
            pod(1, 0, init=DONE), pod(1, 1, init=CRASH_LOOP)]
    view = lws_status.assess_groups(lws(replicas=2), pods)
    assert view.ready_groups == 1 and view.download_failed_groups == frozenset({"1"})
    conditions = by_type(fold(view))
    assert conditions["Ready"][:2] == ("False", "ModelDownloadFailed")
    assert "1/2 groups of 2 pods ready" in conditions["Ready"][2]


def test_a_standing_verdict_is_kept_and_a_cleared_failure_is_said() -> None:
    standing = {"conditions": [{"type": "Degraded", "status": "True", "reason": "RemediationExhausted",
                                "message": "no step left", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}
    failing = lws_status.assess_groups(lws(), [pod(0, 0, init=CRASH_LOOP), pod(0, 1, init=RUNNING)])
    assert by_type(fold(failing, standing))["Degraded"][:2] == ("True", "RemediationExhausted")

    failed = fold(failing)
    assert by_type(failed)["Degraded"][:2] == ("True", "ModelDownloadFailed")
    downloading = lws_status.assess_groups(lws(), [pod(0, 0, init=RUNNING), pod(0, 1, init=RUNNING)])
    cleared = by_type(fold(downloading, failed))
    assert cleared["Degraded"] == ("False", "AsExpected", "the model download no longer fails")
    assert cleared["Progressing"][:2] == ("True", "Downloading")
    ready = lws_status.assess_groups(lws(), [pod(0, 0, init=DONE, ready=True), pod(0, 1, init=DONE, ready=True)])
    served = by_type(fold(ready, failed))
    assert served["Ready"][:2] == ("True", "Available") and served["Degraded"][:2] == ("False", "AsExpected")


def test_a_pod_of_a_group_being_deleted_says_nothing_of_the_download() -> None:
    view = lws_status.assess_groups(lws(), [pod(0, 0, init=CRASH_LOOP, deleting=True),
                                            pod(0, 1, init=CRASH_LOOP, deleting=True)])
    assert not view.download_failed and not view.download_failed_groups
    assert by_type(fold(view))["Progressing"][:2] == ("True", "Deploying")


def test_groups_without_init_containers_are_unchanged() -> None:
    view = lws_status.assess_groups(lws(), [pod(0, 0, ready=True), pod(0, 1)])
    conditions = by_type(fold(view))
    assert conditions["Ready"][:2] == ("False", "PodsNotReady")
    assert conditions["Progressing"][:2] == ("True", "Deploying")
    assert "Degraded" not in conditions


def test_a_group_recreated_after_its_download_failed_keeps_the_verdict_until_a_pod_says_otherwise() -> None:
    """LeaderWorkerSet recreates the group on the init container's retry: the fresh pods have said nothing of their
    download yet, and the recorded failure (cleared by the pod hook only after a success) stands — no flapping to
    Deploying and back with every recreation."""
    recorded = {"modelCache": {"downloadError": GATED_ERROR, "downloadErrorPod": "big-0-1"}}
    failed = fold(lws_status.assess_groups(lws(), [pod(0, 0, init=RUNNING), pod(0, 1, init=CRASH_LOOP)]), recorded)
    fresh = lws_status.assess_groups(lws(), [pod(0, 0), pod(0, 1)])
    assert lws_status.group_conditions(fresh, failed) == []
    assert fold(fresh, failed)["state"] == "ModelDownloadFailed"
    # without a recorded reason (or once it is cleared) the fresh group is just deploying, the verdict cleared
    cleared = by_type(fold(fresh, {**failed, "modelCache": {}}))
    assert cleared["Degraded"][:2] == ("False", "AsExpected") and cleared["Progressing"][:2] == ("True", "Deploying")
    # a pod of the new group downloads: the failure no longer stands
    downloading = by_type(fold(lws_status.assess_groups(lws(), [pod(0, 0, init=RUNNING), pod(0, 1)]), failed))
    assert downloading["Degraded"][:2] == ("False", "AsExpected")
    assert downloading["Progressing"][:2] == ("True", "Downloading")
    # the download succeeded so fast nothing saw it run, and vLLM starts before the pod hook cleared the record
    started = pod(0, 0, init=DONE)
    started["status"]["containerStatuses"] = [{"name": "vllm", "ready": False, "restartCount": 0,
                                               "state": {"running": {"startedAt": "2025-01-02T03:01:00Z"}}}]
    loading = by_type(fold(lws_status.assess_groups(lws(), [started, pod(0, 1, init=DONE)]), failed))
    assert loading["Degraded"][:2] == ("False", "AsExpected") and loading["Progressing"][:2] == ("True", "Deploying")


def test_groups_no_vllm_failure_can_have_recreated() -> None:
    """What remediation/groups.count_recreations is told: a group whose download fails (even with vLLM already
    running on another rank) or whose vLLM never ran is no vLLM pod failure when LeaderWorkerSet recreates it."""
    serving = {"name": "vllm", "ready": True, "restartCount": 0, "state": {"running": {}}}
    leader_serving = pod(1, 0, init=DONE)
    leader_serving["status"]["containerStatuses"] = [serving]
    crashed = pod(2, 0, init=DONE)
    crashed["status"]["containerStatuses"] = [{"name": "vllm", "ready": False, "restartCount": 1,
                                               "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                               "lastState": {"terminated": {"exitCode": 1}}}]
    view = lws_status.assess_groups(lws(replicas=3), [
        pod(0, 0, init=RUNNING), pod(0, 1),                  # downloading: vLLM not started
        leader_serving, pod(1, 1, init=CRASH_LOOP),          # the leader's vLLM runs, the worker's download fails
        crashed, pod(2, 1, init=DONE)])                      # vLLM ran and failed: a real failure
    assert view.unstarted_groups == frozenset({"0"})
    assert view.download_failed_groups == frozenset({"1"})
    assert view.not_failing_groups == frozenset({"0", "1"})


def test_a_group_that_recovered_through_remediation_is_no_longer_degraded() -> None:
    remediating = {"remediation": {"step": 2, "profile": {"maxModelLen": 16384}},
                   "conditions": [{"type": "Degraded", "status": "True", "reason": "Remediating",
                                   "message": "step 2: max-model-len 32768 → 16384",
                                   "lastTransitionTime": "2025-01-01T00:00:00Z"}]}
    starting = lws_status.assess_groups(lws(), [pod(0, 0, ready=True), pod(0, 1)])
    assert by_type(fold(starting, remediating))["Degraded"][:2] == ("True", "Remediating")  # not over yet
    ready = lws_status.assess_groups(lws(2), [pod(g, w, ready=True) for g in (0, 1) for w in (0, 1)])
    served = by_type(fold(ready, remediating))
    assert served["Ready"][:2] == ("True", "Available")
    assert served["Degraded"] == ("False", "AsExpected", "2/2 groups of 2 pods ready after 2 remediation step(s)")
    # a pod failure said while no step was taken clears the same way; a verdict stands
    crashed = {"conditions": [{**remediating["conditions"][0], "reason": "ContainerCrashLoopBackOff"}]}
    assert by_type(fold(ready, crashed))["Degraded"] == ("False", "AsExpected", "2/2 groups of 2 pods ready")
    for verdict in ("RemediationExhausted", "PlanInfeasible"):
        standing = {"conditions": [{**remediating["conditions"][0], "reason": verdict}]}
        assert by_type(fold(ready, standing))["Degraded"][:2] == ("True", verdict)
