"""The simulated StatefulSet controller (vllm_operator_sim/statefulset.py) and the API server's rules for apps/v1
StatefulSets: first the controller alone over the emulator (pod status set by the test, so each rule is seen on its
own), then the operator's pod template through the simulated kubelet on a manual clock (claims per pod, cached
weights surviving pod deletion, a rolling update and scale down/up)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from simkit import SimHarness, deployment

from kit.api import emulated_api
from kit.kubectl import Kubectl
from vllm_operator_sim.cluster import NodePool, SimulatedCluster
from vllm_operator_sim.emulator import APIError, EmulatedAPIServer, KubeEmulator
from vllm_operator_sim.statefulset import POD_INDEX, POD_NAME, REVISION, StatefulSetController

NS = "default"
LLAMA3_8B = "meta-llama/Meta-Llama-3-8B-Instruct"
FLAGS = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_model_len": 8192, "max_num_seqs": 13}
CLAIM_TEMPLATE = {"metadata": {"name": "data", "labels": {"tier": "cache"}},
                  "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}


def _sts(name: str = "web", replicas: int = 2, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name, "role": "server"}},
                     "spec": {"containers": [{"name": "c", "image": "img:1"}],
                              "volumes": [{"name": "scratch", "emptyDir": {}}]}},
        "volumeClaimTemplates": [CLAIM_TEMPLATE]}
    body.update(spec)
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": NS}, "spec": body}


class _Set:
    """One StatefulSet over a bare emulator, its controller driven by hand; the test plays the kubelet."""

    def __init__(self, api: KubeEmulator, sts: dict[str, Any]) -> None:
        self.api = api
        self.name = sts["metadata"]["name"]
        self.events: list[tuple[str, str, str]] = []
        api.create_object("statefulsets", sts, manager="kubectl")
        self.controller = StatefulSetController(api, on_event=lambda _ns, _m, kind, reason, message:
                                                self.events.append((kind, reason, message)))

    def sync(self, times: int = 1) -> None:
        for _ in range(times):
            self.controller.control()
        assert self.controller.errors == []

    def obj(self) -> dict[str, Any]:
        found = self.api.get_object("statefulsets", self.name, NS)
        assert found is not None
        return found

    def status(self) -> dict[str, Any]:
        return dict(self.obj().get("status") or {})

    def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.api.list_objects("pods", NS)}

    def names(self) -> list[str]:
        return sorted(self.pods())

    def claims(self) -> dict[str, dict[str, Any]]:
        return {c["metadata"]["name"]: c for c in self.api.list_objects("persistentvolumeclaims", NS)}

    def set_pod(self, name: str, *, ready: bool = True, phase: str = "Running") -> None:
        conditions = [{"type": "Ready", "status": "True" if ready else "False",
                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        self.api.patch_object("pods", name, [{"op": "replace", "path": "/status",
                                              "value": {"phase": phase, "conditions": conditions}}], NS,
                              patch_type="json", subresource="status")

    def all_ready(self) -> None:
        for name in self.pods():
            self.set_pod(name)

    def edit(self, patch: dict[str, Any]) -> None:
        self.api.patch_object("statefulsets", self.name, {"spec": patch}, NS, manager="kubectl")

    def revision(self, pod: str) -> str:
        return str(self.pods()[pod]["metadata"]["labels"][REVISION])


@pytest.fixture
def api() -> Iterator[KubeEmulator]:
    yield KubeEmulator()


def test_pods_are_named_labelled_owned_and_mount_a_claim_each(api: KubeEmulator) -> None:
    web = _Set(api, _sts(replicas=2, podManagementPolicy="Parallel"))
    web.sync()
    assert web.names() == ["web-0", "web-1"]
    uid = web.obj()["metadata"]["uid"]
    revision = web.status()["updateRevision"]
    assert revision.startswith("web-") and len(revision) > len("web-")
    for ordinal, (name, pod) in enumerate(sorted(web.pods().items())):
        assert pod["metadata"]["labels"] == {"app": "web", "role": "server", POD_NAME: name,
                                             POD_INDEX: str(ordinal), REVISION: revision}
        assert pod["metadata"]["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                                                       "uid": uid, "controller": True, "blockOwnerDeletion": True}]
        assert pod["spec"]["hostname"] == name and pod["spec"]["subdomain"] == "web"
        # the claim volume first, then the template's own volumes
        assert pod["spec"]["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": f"data-{name}"}},
                                          {"name": "scratch", "emptyDir": {}}]
    claims = web.claims()
    assert sorted(claims) == ["data-web-0", "data-web-1"]
    # the template's labels plus the selector's matchLabels; Retain (the default): no owner
    assert claims["data-web-1"]["metadata"]["labels"] == {"tier": "cache", "app": "web"}
    assert "ownerReferences" not in claims["data-web-1"]["metadata"] or not claims["data-web-1"]["metadata"][
        "ownerReferences"]
    assert claims["data-web-1"]["spec"] == {**CLAIM_TEMPLATE["spec"], "volumeMode": "Filesystem"}  # the stored one
    assert web.events == [
        ("Normal", "SuccessfulCreate", "create Claim data-web-0 Pod web-0 in StatefulSet web success"),
        ("Normal", "SuccessfulCreate", "create Pod web-0 in StatefulSet web successful"),
        ("Normal", "SuccessfulCreate", "create Claim data-web-1 Pod web-1 in StatefulSet web success"),
        ("Normal", "SuccessfulCreate", "create Pod web-1 in StatefulSet web successful")]
    [history] = api.list_objects("controllerrevisions", NS)
    assert history["metadata"]["name"] == revision and history["revision"] == 1
    assert history["metadata"]["ownerReferences"][0]["uid"] == uid


def test_ordered_ready_creates_one_ordinal_at_a_time_and_an_unready_pod_blocks(api: KubeEmulator) -> None:
    web = _Set(api, _sts(replicas=3))
    assert web.obj()["spec"]["podManagementPolicy"] == "OrderedReady"  # the API server's default
    web.sync(3)
    assert web.names() == ["web-0"]  # web-1 waits for web-0 to be Running and Ready
    web.set_pod("web-0", ready=False)
    web.sync(3)
    assert web.names() == ["web-0"]
    web.set_pod("web-0")
    web.sync()
    assert web.names() == ["web-0", "web-1"]
    web.sync(3)
    assert web.names() == ["web-0", "web-1"]
    # web-1 runs but never becomes Ready: nothing further happens, neither web-2 nor a scale down past it
    web.set_pod("web-1", ready=False)
    web.sync(3)
    assert web.names() == ["web-0", "web-1"]
    web.set_pod("web-1")
    web.sync()
    assert web.names() == ["web-0", "web-1", "web-2"]
    web.all_ready()
    # scale down: the highest ordinal first, one pod per pass, each only while the lower ones are healthy
    web.edit({"replicas": 1})
    web.sync()
    assert web.names() == ["web-0", "web-1"]
    web.set_pod("web-0", ready=False)
    web.sync(3)
    assert web.names() == ["web-0", "web-1"]  # web-0 is unhealthy: web-1 (healthy) is not the first unhealthy pod
    web.set_pod("web-0")
    web.sync()
    assert web.names() == ["web-0"]
    assert ("Normal", "SuccessfulDelete", "delete Pod web-2 in StatefulSet web successful") in web.events


def test_parallel_creates_and_deletes_all_at_once_and_an_unready_pod_blocks_nothing(api: KubeEmulator) -> None:
    web = _Set(api, _sts(replicas=3, podManagementPolicy="Parallel"))
    web.sync()
    assert web.names() == ["web-0", "web-1", "web-2"]
    web.set_pod("web-0", ready=False)
    web.edit({"replicas": 4})
    web.sync()
    assert web.names() == ["web-0", "web-1", "web-2", "web-3"]
    web.edit({"replicas": 1})
    web.sync()
    assert web.names() == ["web-0"]


def test_a_rolling_update_goes_from_the_highest_ordinal_and_keeps_the_partition(api: KubeEmulator) -> None:
    web = _Set(api, _sts(replicas=3, podManagementPolicy="Parallel"))
    web.sync()
    web.all_ready()
    web.sync()
    old = web.status()["updateRevision"]
    assert web.status() == {"observedGeneration": 1, "replicas": 3, "readyReplicas": 3, "currentReplicas": 3,
                            "updatedReplicas": 3, "currentRevision": old, "updateRevision": old, "collisionCount": 0,
                            "availableReplicas": 3}
    uids = {name: pod["metadata"]["uid"] for name, pod in web.pods().items()}
    web.edit({"template": {"metadata": {"labels": {"app": "web", "role": "server"}},
                           "spec": {"containers": [{"name": "c", "image": "img:2"}]}},
              "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}})
    web.sync()  # web-2 (the highest) is deleted …
    assert web.names() == ["web-0", "web-1"]
    web.sync()  # … and made again from the new template, same name, same claim
    new = web.status()["updateRevision"]
    assert new != old and web.revision("web-2") == new and web.pods()["web-2"]["metadata"]["uid"] != uids["web-2"]
    assert web.pods()["web-2"]["spec"]["containers"][0]["image"] == "img:2"
    assert web.pods()["web-2"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "data-web-2"
    web.sync(3)  # web-2 is not Ready yet: web-1 keeps serving at the old revision
    assert web.revision("web-1") == old and web.pods()["web-1"]["metadata"]["uid"] == uids["web-1"]
    status = web.status()
    assert (status["currentRevision"], status["updateRevision"]) == (old, new)
    assert (status["replicas"], status["readyReplicas"], status["currentReplicas"], status["updatedReplicas"]) == (
        3, 2, 2, 1)
    web.set_pod("web-2")
    web.sync(2)
    assert web.revision("web-1") == new
    web.set_pod("web-1")
    web.sync(3)
    # web-0 is below the partition: it keeps the old revision, and is made again at it when deleted
    assert web.revision("web-0") == old
    api.delete_object("pods", "web-0", NS)
    web.sync()
    assert web.revision("web-0") == old and web.pods()["web-0"]["spec"]["containers"][0]["image"] == "img:1"
    web.set_pod("web-0")
    web.sync()
    assert web.status()["currentRevision"] == old  # partitioned: the rollout is not complete
    web.edit({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}})
    web.sync(2)
    assert web.revision("web-0") == new
    web.set_pod("web-0")
    web.sync()
    status = web.status()
    assert status["currentRevision"] == status["updateRevision"] == new
    assert status["currentReplicas"] == status["updatedReplicas"] == status["readyReplicas"] == 3
    # back to the first template: a rollback reuses its revision, with the next number
    web.edit({"template": _sts()["spec"]["template"]})
    web.sync()
    revisions = {r["metadata"]["name"]: r["revision"] for r in api.list_objects("controllerrevisions", NS)}
    assert web.status()["updateRevision"] == old and revisions == {old: 3, new: 2}


def test_on_delete_replaces_a_pod_only_when_it_is_deleted(api: KubeEmulator) -> None:
    web = _Set(api, _sts(replicas=2, podManagementPolicy="Parallel", updateStrategy={"type": "OnDelete"}))
    web.sync()
    web.all_ready()
    old = web.status()["updateRevision"]
    web.edit({"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c",
                                                                                           "image": "img:2"}]}}})
    web.sync(3)
    assert web.revision("web-0") == web.revision("web-1") == old
    api.delete_object("pods", "web-0", NS)
    web.sync()
    assert web.revision("web-0") == web.status()["updateRevision"] != old
    assert web.revision("web-1") == old


@pytest.mark.parametrize(("phase", "event"), [
    ("Failed", ("Warning", "RecreatingFailedPod", "StatefulSet default/web is recreating failed Pod web-0")),
    ("Succeeded", ("Normal", "RecreatingTerminatedPod", "StatefulSet default/web is recreating terminated Pod web-0"))])
def test_a_failed_or_finished_pod_is_deleted_and_made_again(api: KubeEmulator, phase: str,
                                                            event: tuple[str, str, str]) -> None:
    web = _Set(api, _sts(replicas=1))
    web.sync()
    before = web.pods()["web-0"]["metadata"]["uid"]
    web.set_pod("web-0", ready=False, phase=phase)
    web.sync()
    assert web.pods()["web-0"]["metadata"]["uid"] != before
    assert event in web.events
    assert [c["metadata"]["name"] for c in api.list_objects("persistentvolumeclaims", NS)] == ["data-web-0"]


def test_ordinals_start_and_an_orphan_with_a_members_name_is_adopted(api: KubeEmulator) -> None:
    orphan = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-5", "namespace": NS,
                                                               "labels": {"app": "web", "role": "server"}},
              "spec": {"containers": [{"name": "c", "image": "img:1"}]}}
    api.create_object("pods", orphan)
    web = _Set(api, _sts(replicas=2, podManagementPolicy="Parallel", ordinals={"start": 5}))
    web.sync()
    assert web.names() == ["web-5", "web-6"]
    adopted = web.pods()["web-5"]
    assert adopted["metadata"]["ownerReferences"][0]["uid"] == web.obj()["metadata"]["uid"]
    assert "create Pod web-5 in StatefulSet web successful" not in {m for _, _, m in web.events}
    # a Pending pod gets its missing claims (createMissingPersistentVolumeClaims), the adopted one too
    assert sorted(web.claims()) == ["data-web-5", "data-web-6"]


def test_revision_history_keeps_only_the_live_revisions_beyond_the_limit(api: KubeEmulator) -> None:
    web = _Set(api, _sts(replicas=1, podManagementPolicy="Parallel", revisionHistoryLimit=0))
    web.sync()
    for image in ("img:2", "img:3"):
        template = _sts()["spec"]["template"]
        template["spec"]["containers"][0]["image"] = image
        web.edit({"template": template})
        web.sync(2)
        web.all_ready()
        web.sync()
    [kept] = api.list_objects("controllerrevisions", NS)  # the first two: neither current, updated nor used
    assert kept["metadata"]["name"] == web.status()["updateRevision"] == web.revision("web-0")


@pytest.mark.parametrize("when_scaled", ["Retain", "Delete"])
def test_scale_down_and_up_keeps_or_deletes_the_claim_of_the_ordinal_scaled_away(api: KubeEmulator,
                                                                                  when_scaled: str) -> None:
    web = _Set(api, _sts(replicas=2, podManagementPolicy="Parallel",
                         persistentVolumeClaimRetentionPolicy={"whenScaled": when_scaled}))
    assert web.obj()["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenScaled": when_scaled,
                                                                          "whenDeleted": "Retain"}
    web.sync()
    web.all_ready()
    claim = web.claims()["data-web-1"]["metadata"]["uid"]
    web.edit({"replicas": 1})
    web.sync()
    assert web.names() == ["web-0"]
    assert sorted(web.claims()) == (["data-web-0", "data-web-1"] if when_scaled == "Retain" else ["data-web-0"])
    web.edit({"replicas": 2})
    web.sync()
    assert web.names() == ["web-0", "web-1"]
    again = web.claims()["data-web-1"]["metadata"]["uid"]
    assert (again == claim) is (when_scaled == "Retain")  # Retain: the same claim, with what is cached on it
    created = [m for _, reason, m in web.events if reason == "SuccessfulCreate" and m.startswith("create Claim")]
    assert len(created) == (2 if when_scaled == "Retain" else 3)


@pytest.mark.parametrize("when_deleted", ["Retain", "Delete"])
def test_deleting_the_set_deletes_its_pods_and_per_policy_its_claims(api: KubeEmulator, when_deleted: str) -> None:
    web = _Set(api, _sts(replicas=2, podManagementPolicy="Parallel",
                         persistentVolumeClaimRetentionPolicy={"whenDeleted": when_deleted, "whenScaled": "Retain"}))
    web.sync()
    uid = web.obj()["metadata"]["uid"]
    owners = {name: [r["uid"] for r in c["metadata"].get("ownerReferences") or []]
              for name, c in web.claims().items()}
    assert owners == {"data-web-0": [uid] if when_deleted == "Delete" else [],
                      "data-web-1": [uid] if when_deleted == "Delete" else []}
    api.delete_object("statefulsets", "web", NS)
    assert web.names() == []
    assert api.list_objects("controllerrevisions", NS) == []
    assert sorted(web.claims()) == ([] if when_deleted == "Delete" else ["data-web-0", "data-web-1"])


def test_a_retention_policy_change_reaches_the_existing_claims(api: KubeEmulator) -> None:
    web = _Set(api, _sts(replicas=1))
    web.sync()
    web.all_ready()  # under OrderedReady the controller reaches a pod's claims only once it is Ready
    assert not web.claims()["data-web-0"]["metadata"].get("ownerReferences")
    web.edit({"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"}})
    web.sync()
    [ref] = web.claims()["data-web-0"]["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"]) == ("StatefulSet", "web", web.obj()["metadata"]["uid"])


def test_status_omits_zero_counts_as_the_apps_v1_json_does(api: KubeEmulator) -> None:
    web = _Set(api, _sts(replicas=2, podManagementPolicy="Parallel"))
    assert web.status() == {"replicas": 0, "availableReplicas": 0}  # a new set, before the controller
    web.sync()
    status = web.status()
    assert "readyReplicas" not in status and status["availableReplicas"] == 0 and status["replicas"] == 2
    web.set_pod("web-0")
    web.sync()
    assert web.status()["readyReplicas"] == 1
    web.set_pod("web-0", ready=False)
    web.sync()
    assert "readyReplicas" not in web.status()  # the whole status is replaced: a count back at 0 disappears


def test_min_ready_seconds_holds_availability_and_ordered_progress(api: KubeEmulator) -> None:
    import datetime

    clock = {"now": datetime.datetime(2026, 1, 1, 0, 0, 5, tzinfo=datetime.UTC)}
    web = _Set(api, _sts(replicas=2, minReadySeconds=30))
    web.controller.now = lambda: clock["now"]
    web.sync()
    web.set_pod("web-0")  # Ready since 00:00:00
    web.sync(2)
    assert web.names() == ["web-0"] and web.status()["availableReplicas"] == 0
    clock["now"] += datetime.timedelta(seconds=30)
    web.sync()
    assert web.names() == ["web-0", "web-1"] and web.status()["availableReplicas"] == 1


# --- the API server: validation, subresources, tables ------------------------------------------------------------


def test_a_selector_that_does_not_match_the_template_is_refused(api: KubeEmulator) -> None:
    bad = _sts()
    bad["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    with pytest.raises(APIError) as refused:
        api.create_object("statefulsets", bad, manager="kubectl")
    assert refused.value.code == 422
    assert str(refused.value).endswith('spec.template.metadata.labels: Invalid value: map[string]string{"app":"web", '
                                       '"role":"server"}: `selector` does not match template `labels`')
    for spec, field in [({"selector": None}, "spec.selector"), ({"selector": {}}, "spec.selector"),
                        ({"podManagementPolicy": "Sometimes"}, "spec.podManagementPolicy"),
                        ({"replicas": -1}, "spec.replicas")]:
        body = _sts(name="bad")
        body["spec"].update(spec)
        if spec.get("selector", 1) is None:
            del body["spec"]["selector"]
        with pytest.raises(APIError) as refused:
            api.create_object("statefulsets", body, manager="kubectl")
        assert refused.value.code == 422 and field in str(refused.value), (spec, str(refused.value))
    restart = _sts(name="bad")
    restart["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    with pytest.raises(APIError, match='restartPolicy: Unsupported value: "OnFailure"'):
        api.create_object("statefulsets", restart, manager="kubectl")


@pytest.mark.parametrize("patch", [
    {"selector": {"matchLabels": {"app": "web", "role": "server"}}}, {"serviceName": "other"},
    {"volumeClaimTemplates": []}, {"podManagementPolicy": "Parallel"}])
def test_immutable_fields_are_refused_on_update(api: KubeEmulator, patch: dict[str, Any]) -> None:
    api.create_object("statefulsets", _sts(), manager="kubectl")
    with pytest.raises(APIError) as refused:
        api.patch_object("statefulsets", "web", {"spec": patch}, NS, manager="kubectl")
    assert refused.value.code == 422
    assert str(refused.value) == ('StatefulSet.apps "web" is invalid: spec: Forbidden: updates to statefulset spec for '
                                  "fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', "
                                  "'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden")


def test_claim_templates_are_stored_defaulted_and_the_same_manifest_applies_again(api: KubeEmulator) -> None:
    created = api.create_object("statefulsets", _sts(), manager="kubectl")
    [claim] = created["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["volumeMode"] == "Filesystem" and claim["status"] == {"phase": "Pending"}
    assert claim != CLAIM_TEMPLATE  # what a client rendered differs from what is stored …
    again = api.patch_object("statefulsets", "web", {"spec": _sts()["spec"]}, NS, manager="kubectl")
    assert again["metadata"]["generation"] == 1  # … yet sending it again changes nothing (defaulted again)
    assert again["spec"]["volumeClaimTemplates"] == created["spec"]["volumeClaimTemplates"]


def test_the_mutable_fields_change(api: KubeEmulator) -> None:
    api.create_object("statefulsets", _sts(), manager="kubectl")
    template = _sts()["spec"]["template"]
    template["spec"]["containers"][0]["image"] = "img:2"
    changed = api.patch_object("statefulsets", "web", {"spec": {
        "replicas": 5, "template": template, "minReadySeconds": 3, "revisionHistoryLimit": 2,
        "updateStrategy": {"type": "OnDelete", "rollingUpdate": None},
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete"}}}, NS, manager="kubectl")
    assert changed["spec"]["replicas"] == 5 and changed["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert changed["metadata"]["generation"] == 2


def _http(server: EmulatedAPIServer, path: str, *, method: str = "GET", body: Any = None,
          accept: str = "application/json") -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(server.url + path, data=data, method=method, headers={
        "Accept": accept, "Content-Type": "application/merge-patch+json"})
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback only
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def test_scale_subresource_table_columns_and_discovery() -> None:
    with emulated_api() as server:
        api = server.emulator
        web = _Set(api, _sts(replicas=2, podManagementPolicy="Parallel"))
        web.sync()
        web.set_pod("web-0")
        web.sync()
        base = "/apis/apps/v1/namespaces/default/statefulsets/web"
        scale = _http(server, base + "/scale")
        assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
        assert scale["spec"] == {"replicas": 2} and scale["status"] == {"replicas": 2, "selector": "app=web"}
        _http(server, base + "/scale", method="PATCH", body={"spec": {"replicas": 3}})
        assert web.obj()["spec"]["replicas"] == 3 and web.obj()["metadata"]["generation"] == 2
        table = _http(server, "/apis/apps/v1/namespaces/default/statefulsets",
                      accept="application/json;as=Table;v=v1;g=meta.k8s.io")
        assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Ready", "Age", "Containers", "Images"]
        assert [c["priority"] for c in table["columnDefinitions"]] == [0, 0, 0, 1, 1]
        [row] = table["rows"]
        assert row["cells"][:2] == ["web", "1/3"] and row["cells"][3:] == ["c", "img:1"]
        resources = _http(server, "/apis/apps/v1")["resources"]
        sts = next(r for r in resources if r["name"] == "statefulsets")
        assert sts["shortNames"] == ["sts"] and sts["kind"] == "StatefulSet"
        assert {r["name"] for r in resources} >= {"statefulsets/status", "statefulsets/scale", "controllerrevisions"}
        with pytest.raises(urllib.error.HTTPError) as refused:
            _http(server, base, method="PATCH", body={"spec": {"serviceName": "other"}})
        assert refused.value.code == 422


def test_kubectl_applies_lists_scales_and_rolls_back_a_statefulset(tmp_path: Path) -> None:
    """The real kubectl: `get sts` columns, a 422 for an immutable field, `scale`, and `rollout history`/`undo`,
    which read and apply the controller's ControllerRevisions."""
    with emulated_api(tmp_path / "kubeconfig") as server:
        assert server.kubeconfig_path is not None
        kubectl = Kubectl(server.kubeconfig_path, tmp_path)
        manifest = tmp_path / "web.yaml"
        manifest.write_text(yaml.safe_dump(_sts(replicas=1)))
        assert "statefulset.apps/web created" in kubectl("apply", "-f", str(manifest))
        controller = StatefulSetController(server.emulator)
        controller.control()
        header, row = kubectl("get", "sts").splitlines()
        assert header.split() == ["NAME", "READY", "AGE"] and row.split()[:2] == ["web", "0/1"]
        assert kubectl("get", "statefulsets", "-o", "wide").splitlines()[0].split() == [
            "NAME", "READY", "AGE", "CONTAINERS", "IMAGES"]
        refused = kubectl.run("patch", "sts", "web", "-p", '{"spec":{"serviceName":"other"}}')
        assert refused.returncode != 0 and "Forbidden: updates to statefulset spec" in refused.stderr
        created = server.emulator.get_object("statefulsets", "web", NS)
        assert created is not None
        first = created["status"]["updateRevision"]
        kubectl("set", "image", "statefulset/web", "c=img:2")
        controller.control()
        history = kubectl("rollout", "history", "statefulset/web")
        assert [line.split()[0] for line in history.splitlines()[2:] if line.strip()] == ["1", "2"]
        kubectl("rollout", "undo", "statefulset/web")
        controller.control()
        stored = server.emulator.get_object("statefulsets", "web", NS)
        assert stored is not None and stored["spec"]["template"]["spec"]["containers"][0]["image"] == "img:1"
        assert stored["status"]["updateRevision"] == first
        kubectl("scale", "statefulset", "web", "--replicas=2")
        controller.control()
        assert sorted(p["metadata"]["name"] for p in server.emulator.list_objects("pods", NS)) == ["web-0"]  # ordered


# --- through the simulated kubelet: the operator's pod template, a claim per pod ----------------------------------


def test_a_cluster_without_leaderworkerset_runs_a_statefulset_in_order(tmp_path: Path) -> None:
    """The whole simulated cluster (HTTP admission, the paced clock): OrderedReady starts chat-1 once chat-0 serves;
    each pod downloads into its own claim."""
    with SimulatedCluster([NodePool("L4", 1, 2)], leaderworkerset=False, speed=200, workdir=tmp_path) as cluster:
        assert cluster.api.get_object("customresourcedefinitions", "leaderworkersets.leaderworkerset.x-k8s.io") is None
        cluster.apply(_operator_sts("chat", 2, policy="OrderedReady"))

        def status() -> dict[str, Any]:
            found = cluster.api.get_object("statefulsets", "chat", NS)
            return dict((found or {}).get("status") or {})

        cluster.wait_for(lambda: status().get("readyReplicas") == 2, timeout=60, message=str(status()))
        events = [(e.pod, e.kind) for e in cluster.kubelet.events if e.kind in ("scheduled", "ready", "download")]
        assert events == [("chat-0", "scheduled"), ("chat-0", "download"), ("chat-0", "ready"),
                          ("chat-1", "scheduled"), ("chat-1", "download"), ("chat-1", "ready")]
        assert status()["currentRevision"] == status()["updateRevision"] and status()["availableReplicas"] == 2


def _operator_sts(name: str, replicas: int, *, policy: str = "Parallel", **extra: Any) -> dict[str, Any]:
    """The operator's Deployment pod template (model-download init container, the vLLM container) as a StatefulSet
    whose `model-cache` volume comes from a claim template: a claim per pod."""
    deploy = deployment(name, LLAMA3_8B, FLAGS, cached=True)
    template = deploy["spec"]["template"]
    template["spec"]["volumes"] = [v for v in template["spec"]["volumes"] if v["name"] != "model-cache"]
    claim = {"metadata": {"name": "model-cache"},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "40Gi"}}}}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": NS, "labels": {"vllm-operator.dev/service": name}},
            "spec": {"replicas": replicas, "serviceName": name, "selector": deploy["spec"]["selector"],
                     "template": template, "podManagementPolicy": policy, "volumeClaimTemplates": [claim], **extra}}


def _fetches(sim: SimHarness, service: str) -> list[tuple[str, str, str]]:
    """(download or cache-hit, pod, container) in order, as the kubelet fetched the weights."""
    return [(e.kind, e.pod, str(e.details.get("container"))) for e in sim.events
            if e.service == service and e.kind in ("download", "cache-hit")]


def _ready(sim: SimHarness, service: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in sim.pods(service)
                  if any(c.get("type") == "Ready" and c.get("status") == "True"
                         for c in p["status"].get("conditions") or []))


def _sts_status(sim: SimHarness, name: str) -> dict[str, Any]:
    found = sim.api.get_object("statefulsets", name, NS)
    assert found is not None
    return dict(found.get("status") or {})


def test_each_pod_downloads_into_its_own_claim_once_and_finds_it_again(sim: SimHarness) -> None:
    sim.api.create_object("statefulsets", _operator_sts("chat", 2), manager="kubectl")
    sim.run_until(lambda: _ready(sim, "chat") == ["chat-0", "chat-1"])
    # Parallel: both pods at once, each init container fills its own claim, then vLLM finds the weights there
    assert _fetches(sim, "chat") == [("download", "chat-0", "model-download"), ("download", "chat-1", "model-download"),
                                     ("cache-hit", "chat-0", "vllm"), ("cache-hit", "chat-1", "vllm")]
    downloads = [e for e in sim.events if e.service == "chat" and e.kind == "download"]
    assert sorted(str(e.details["volume"]) for e in downloads) == ["pvc:model-cache-chat-0", "pvc:model-cache-chat-1"]
    assert sim.kubelet.cached_on("model-cache-chat-1") == {LLAMA3_8B} and sim.kubelet.cached_on("other") == set()
    status = _sts_status(sim, "chat")
    assert (status["readyReplicas"], status["availableReplicas"], status["updatedReplicas"]) == (2, 2, 2)
    posted = [e for e in sim.api.list_objects("events", NS) if e["involvedObject"].get("kind") == "StatefulSet"]
    assert {e["source"]["component"] for e in posted} == {"statefulset-controller"}
    assert "create Pod chat-1 in StatefulSet chat successful" in {e["message"] for e in posted}
    # a pod deleted (a remediation step): made again with the same name and claim; its weights are there
    seen = len(_fetches(sim, "chat"))
    sim.api.delete_object("pods", "chat-1", NS)
    sim.run_until(lambda: "chat-1" in _ready(sim, "chat") and len(_fetches(sim, "chat")) >= seen + 2)
    assert _fetches(sim, "chat")[seen:] == [("cache-hit", "chat-1", "model-download"), ("cache-hit", "chat-1", "vllm")]


def test_a_rolling_update_and_a_scale_down_and_up_start_from_the_cached_weights(sim: SimHarness) -> None:
    sim.api.create_object("statefulsets", _operator_sts("roll", 2), manager="kubectl")
    sim.run_until(lambda: _ready(sim, "roll") == ["roll-0", "roll-1"])
    first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in sim.pods("roll")}
    seen = len(_fetches(sim, "roll"))
    # a flag edit: the highest ordinal goes first, roll-0 keeps serving until roll-1 is Ready again
    edited = _operator_sts("roll", 2)["spec"]["template"]
    args = edited["spec"]["containers"][0]["args"]
    args[args.index("--max-num-seqs") + 1] = "8"
    sim.api.patch_object("statefulsets", "roll", {"spec": {"template": edited}}, NS, manager="kubectl")
    uids = lambda: {p["metadata"]["name"]: p["metadata"]["uid"] for p in sim.pods("roll")}  # noqa: E731
    sim.run_until(lambda: uids().get("roll-1") not in (None, first["roll-1"]))
    assert uids()["roll-0"] == first["roll-0"] and _ready(sim, "roll") == ["roll-0"]
    sim.run_until(lambda: uids().get("roll-0") != first["roll-0"])
    assert "roll-1" in _ready(sim, "roll")  # roll-0 was replaced only once roll-1 served again
    sim.run_until(lambda: _ready(sim, "roll") == ["roll-0", "roll-1"])
    status = _sts_status(sim, "roll")
    assert status["currentRevision"] == status["updateRevision"] and status["updatedReplicas"] == 2
    assert {kind for kind, _, _ in _fetches(sim, "roll")[seen:]} == {"cache-hit"}  # no download on the way
    # scale 2 → 1 → 2 (Retain): roll-1 comes back on its claim, and its weights
    sim.api.patch_object("statefulsets", "roll", {"spec": {"replicas": 1}}, NS, manager="kubectl")
    sim.run_until(lambda: [p["metadata"]["name"] for p in sim.pods("roll")] == ["roll-0"])
    claims = sorted(c["metadata"]["name"] for c in sim.api.list_objects("persistentvolumeclaims", NS))
    assert claims == ["model-cache-roll-0", "model-cache-roll-1"]
    seen = len(_fetches(sim, "roll"))
    sim.api.patch_object("statefulsets", "roll", {"spec": {"replicas": 2}}, NS, manager="kubectl")
    sim.run_until(lambda: _ready(sim, "roll") == ["roll-0", "roll-1"])
    assert _fetches(sim, "roll")[seen:] == [("cache-hit", "roll-1", "model-download"), ("cache-hit", "roll-1", "vllm")]
    sim.api.delete_object("statefulsets", "roll", NS)
    sim.run(1.0)
    assert sim.pods("roll") == []
    assert sim.kubelet.statefulsets.errors == []


def test_ordered_ready_starts_the_next_pod_only_once_the_previous_one_serves(sim: SimHarness) -> None:
    sim.api.create_object("statefulsets", _operator_sts("seq", 2, policy="OrderedReady"), manager="kubectl")
    sim.run_until(lambda: _ready(sim, "seq") == ["seq-0"])
    names = [p["metadata"]["name"] for p in sim.pods("seq")]
    assert names == ["seq-0"] or names == ["seq-0", "seq-1"]  # seq-1 at most just created, in the same tick
    started = [e for e in sim.events if e.service == "seq" and e.kind == "ready"]
    sim.run_until(lambda: _ready(sim, "seq") == ["seq-0", "seq-1"])
    created = {e.pod: e.t for e in sim.events if e.service == "seq" and e.kind == "scheduled"}
    assert created["seq-1"] >= started[0].t

