"""The emulated API as kubectl sees a cluster: validation, explain, diff, server-side apply, tables, logs.

Every test runs the real kubectl (``.tools/kubectl``) as a subprocess against the emulator on 127.0.0.1, without
``--validate=false``: kubectl finds the ``fieldValidation`` parameter in ``/openapi/v3`` and lets the server validate.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest
import yaml

from kit.api import CRD_PATH, EXAMPLES, crd, emulated_api
from kit.kubectl import Kubectl
from vllm_operator_sim.emulator import EmulatedAPIServer

MINIMAL = EXAMPLES / "minimal.yaml"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[EmulatedAPIServer]:
    with emulated_api(tmp_path / "kubeconfig") as server:
        yield server


@pytest.fixture
def kubectl(api: EmulatedAPIServer, tmp_path: Path) -> Kubectl:
    assert api.kubeconfig_path is not None
    return Kubectl(api.kubeconfig_path, tmp_path)


@pytest.fixture
def with_crd(kubectl: Kubectl) -> Kubectl:
    assert "created" in kubectl("apply", "-f", str(CRD_PATH))
    return kubectl


def _service(name: str = "bad", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, **spec}}


def _apply_manifest(kubectl: Kubectl, tmp_path: Path, obj: dict[str, Any], *args: str) -> Any:
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(obj))
    return kubectl.run("apply", "-f", str(path), *args)


def test_kubectl_applies_the_crd_and_every_example_with_validation_on(with_crd: Kubectl,
                                                                      api: EmulatedAPIServer) -> None:
    out = with_crd("apply", "-f", str(EXAMPLES))
    names = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in EXAMPLES.glob("*.yaml")}
    assert out.count("created") == len(names), out
    assert {o["metadata"]["name"] for o in api.list_objects("vllmservices")} == names


def test_an_unknown_field_is_refused_by_strict_validation_and_dropped_without_it(
        with_crd: Kubectl, api: EmulatedAPIServer, tmp_path: Path) -> None:
    obj = _service(bogus=1)
    refused = _apply_manifest(with_crd, tmp_path, obj)
    assert refused.returncode != 0 and 'unknown field "spec.bogus"' in refused.stderr, refused.stderr
    assert api.get_object("vllmservices", "bad") is None
    accepted = _apply_manifest(with_crd, tmp_path, obj, "--validate=false")
    assert accepted.returncode == 0, accepted.stderr
    stored = api.get_object("vllmservices", "bad")
    assert stored is not None and "bogus" not in stored["spec"]      # pruned, as a structural schema does


def test_a_wrong_type_is_a_422_naming_the_field(with_crd: Kubectl, api: EmulatedAPIServer, tmp_path: Path) -> None:
    result = _apply_manifest(with_crd, tmp_path, _service(flags={"maxNumSeqs": "lots"}))
    assert result.returncode != 0
    assert 'The VLLMService "bad" is invalid: spec.flags.maxNumSeqs: Invalid value: "string"' in result.stderr
    assert "must be of type integer" in result.stderr
    assert api.get_object("vllmservices", "bad") is None
    # maxModelLen takes a number or "auto" (vLLM's own fit): any other string is refused naming the field
    result = _apply_manifest(with_crd, tmp_path, _service(flags={"maxModelLen": "lots"}))
    assert result.returncode != 0
    assert 'spec.flags.maxModelLen: Invalid value: "lots"' in result.stderr and "^auto$" in result.stderr
    assert api.get_object("vllmservices", "bad") is None


def _rules(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, str]]:
    for rule in schema.get("x-kubernetes-validations") or []:
        yield path + (rule.get("fieldPath") or ""), rule["message"]
    for key, sub in (schema.get("properties") or {}).items():
        yield from _rules(sub, f"{path}.{key}")
    if "items" in schema:
        yield from _rules(schema["items"], f"{path}[0]")


#: One spec per CEL rule of the CRD that breaks it (and no other rule); keyed by the rule's field path.
BREAKS_RULE: dict[str, tuple[str, dict[str, Any]]] = {
    ".spec.flags.tensorParallelSize": ("must equal gpu.count", {"flags": {"tensorParallelSize": 2}, "gpu": {"count": 1}}),
    ".spec.flags.pipelineParallelSize": ("multiple of flags.pipelineParallelSize",
                                         {"flags": {"pipelineParallelSize": 2}, "gpu": {"count": 3}}),
    ".spec.flags.tensorParallelSize#maxCount": ("must not exceed gpu.maxCount",
                                                {"flags": {"tensorParallelSize": 4}, "gpu": {"maxCount": 2}}),
    ".spec.maxReplicas": ("maxReplicas must be at least replicas", {"replicas": 3, "maxReplicas": 2}),
    ".spec.gpu.share": ("gpu.share packs one-GPU services", {"gpu": {"count": 2, "share": {"group": "team"}}}),
    ".spec.nodeSelector": ("nodeSelector keys must be label keys", {"nodeSelector": {"bad key/with/slashes": "x"}}),
    ".spec.workload.contextLength": ("must not exceed the pinned flags.maxModelLen",
                                     {"workload": {"contextLength": 8192}, "flags": {"maxModelLen": 4096}}),
    ".spec.env[0].valueFrom": ("set either value or valueFrom", {"env": [
        {"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}),
    ".spec.flags.maxLoraRank": ("only applies with flags.enableLora", {"flags": {"maxLoraRank": 16}}),
    ".spec.flags.maxNumBatchedTokens": ("must be at least flags.maxNumSeqs",
                                        {"flags": {"maxNumBatchedTokens": 8, "maxNumSeqs": 16}}),
    ".spec.gpu.count": ("must not exceed gpu.maxCount", {"gpu": {"count": 4, "maxCount": 2}}),
    ".spec.flags.speculativeConfig.model": ("is required for eagle, eagle3 and draft_model",
                                            {"flags": {"speculativeConfig": {"method": "eagle3",
                                                                             "numSpeculativeTokens": 3}}}),
    ".spec.flags.speculativeConfig.numSpeculativeTokens": ("is required unless the method is MTP",
                                                           {"flags": {"speculativeConfig": {"method": "ngram"}}}),
    ".spec.modelCache": ("set only one of modelCache.claimName", {"modelCache": {"claimName": "c", "size": "1Gi"}}),
    ".spec.modelCache.storageClassName": ("applies only to a PVC the operator creates",
                                          {"modelCache": {"claimName": "c", "storageClassName": "fast"}}),
    ".spec.lora.adapters": ("names must be unique", {"lora": {"adapters": [{"name": "a", "source": "o/a"},
                                                                         {"name": "a", "source": "o/b"}]}}),
    ".spec.lora": ("set the rank in one place", {"lora": {"maxRank": 8}, "flags": {"enableLora": True,
                                                                                   "maxLoraRank": 16}}),
    ".spec.maxReplicas#autoscaling": ("exclude each other", {"autoscaling": {"maxReplicas": 2}, "maxReplicas": 2}),
    ".spec.autoscaling.minReplicas": ("must not exceed autoscaling.maxReplicas",
                                      {"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}),
    ".spec.autoscaling.minReplicas#zero": ("needs engine KEDA and an activationQuery",
                                           {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}),
    ".spec.autoscaling.prometheusAddress": ("set autoscaling.prometheusAddress",
                                            {"autoscaling": {"engine": "KEDA", "maxReplicas": 2}}),
    ".spec.autoscaling.activationQuery": ("applies to engine KEDA only",
                                          {"autoscaling": {"maxReplicas": 2, "activationQuery": "up"}}),
    ".spec.network.rdmaResources[0].name": ("GPUs come from spec.gpu", {"network": {"rdmaResources": [
        {"name": "nvidia.com/gpu", "count": 8}]}}),
    ".spec.network.ipcLock": ("Pod Security restricted forbids", {"network": {"ipcLock": True},
                                                                   "security": {"profile": "restricted"}}),
    ".spec.autoscaling.metrics[0].target": ("a fraction of the KV cache", {"autoscaling": {
        "maxReplicas": 2, "metrics": [{"type": "KVCacheUsage", "target": 2}]}}),
}



def _affinity_cases() -> dict[str, tuple[str, dict[str, Any]]]:
    """BREAKS_RULE cases for the rules of spec.affinity, one per place its typed blocks carry them."""
    node = ".spec.affinity.nodeAffinity"
    bad_node = {"matchExpressions": [{"key": "zone", "operator": "In"}]}
    cases = {
        f"{node}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values": (
            "Gt and Lt exactly one integer", {"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [bad_node]}}}}),
        f"{node}.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchExpressions[0].values": (
            "Gt and Lt exactly one integer", {"affinity": {"nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": bad_node}]}}}),
    }
    bad_terms: dict[str, tuple[str, dict[str, Any]]] = {
        ".labelSelector": ("need a labelSelector", {"matchLabelKeys": ["rev"]}),
        ".mismatchLabelKeys": ("in both matchLabelKeys and mismatchLabelKeys",
                               {"labelSelector": {}, "matchLabelKeys": ["t"], "mismatchLabelKeys": ["t"]}),
        ".matchLabelKeys": ("cannot also be in labelSelector",
                            {"labelSelector": {"matchLabels": {"t": "a"}}, "matchLabelKeys": ["t"]}),
    }
    for selector in ("labelSelector", "namespaceSelector"):
        bad_terms[f".{selector}.matchLabels"] = ("matchLabels keys must be label keys",
                                                 {selector: {"matchLabels": {"a b": "x"}}})
        bad_terms[f".{selector}.matchExpressions[0].values"] = ("Exists and DoesNotExist none", {selector: {
            "matchExpressions": [{"key": "app", "operator": "Exists", "values": ["a"]}]}})
    for kind in ("podAffinity", "podAntiAffinity"):
        for where, bad in bad_terms.items():
            message, term = bad
            term = {**term, "topologyKey": "zone"}
            cases[f".spec.affinity.{kind}.requiredDuringSchedulingIgnoredDuringExecution[0]{where}"] = (
                message, {"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}})
            cases[f".spec.affinity.{kind}.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm{where}"] = (
                message, {"affinity": {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "podAffinityTerm": term}]}}})
    return cases


BREAKS_RULE.update(_affinity_cases())

def test_every_cel_rule_of_the_crd_has_a_case() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = [field for field, _ in _rules(schema)]
    keys = [key.split("#")[0] for key in BREAKS_RULE]
    assert sorted(fields) == sorted(keys), "add a case to BREAKS_RULE for each new x-kubernetes-validations rule"


@pytest.mark.parametrize("key", sorted(BREAKS_RULE))
def test_each_cel_rule_is_a_422_with_its_field_and_message(key: str, with_crd: Kubectl, api: EmulatedAPIServer,
                                                           tmp_path: Path) -> None:
    expected, spec = BREAKS_RULE[key]
    result = _apply_manifest(with_crd, tmp_path, _service(**copy.deepcopy(spec)))
    assert result.returncode != 0, result.stdout
    field = key.split("#")[0].lstrip(".")
    assert f"{field}: Invalid value" in result.stderr and expected in result.stderr, result.stderr
    assert api.get_object("vllmservices", "bad") is None


def test_defaults_of_the_schema_are_applied_at_admission(with_crd: Kubectl, api: EmulatedAPIServer) -> None:
    with_crd("apply", "-f", str(MINIMAL))
    stored = api.get_object("vllmservices", "llama")
    assert stored is not None and stored["spec"]["replicas"] == 1


def test_kubectl_diff_changes_nothing(with_crd: Kubectl, api: EmulatedAPIServer, tmp_path: Path) -> None:
    with_crd("apply", "-f", str(MINIMAL))
    before = api.get_object("vllmservices", "llama")
    changed = yaml.safe_load(MINIMAL.read_text())
    changed["spec"]["replicas"] = 2
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(changed))
    result = with_crd.run("diff", "-f", str(path))
    assert result.returncode == 1, result.stderr                   # 1: there are differences
    assert "+  replicas: 2" in result.stdout and "-  replicas: 1" in result.stdout
    assert api.get_object("vllmservices", "llama") == before       # dryRun=All: nothing stored
    # kubectl-client-side-apply owns spec.replicas: a server-side diff must force (or it shows the conflict)
    result = with_crd.run("diff", "--server-side", "--force-conflicts", "-f", str(path))
    assert result.returncode == 1 and "+  replicas: 2" in result.stdout, result.stderr
    assert api.get_object("vllmservices", "llama") == before


def test_dry_run_server_creates_and_deletes_nothing(with_crd: Kubectl, api: EmulatedAPIServer) -> None:
    assert "created (server dry run)" in with_crd("apply", "--dry-run=server", "-f", str(MINIMAL))
    assert api.get_object("vllmservices", "llama") is None
    with_crd("apply", "-f", str(MINIMAL))
    assert "(server dry run)" in with_crd("delete", "--dry-run=server", "-f", str(MINIMAL))
    assert api.get_object("vllmservices", "llama") is not None


def test_server_side_apply_owns_fields_and_reports_conflicts(kubectl: Kubectl, api: EmulatedAPIServer,
                                                             tmp_path: Path) -> None:
    assert "serverside-applied" in kubectl("apply", "--server-side", "-f", str(CRD_PATH))
    assert "serverside-applied" in kubectl("apply", "--server-side", "-f", str(MINIMAL))
    stored = api.get_object("vllmservices", "llama")
    assert stored is not None
    managers = {(m["manager"], m["operation"]) for m in stored["metadata"]["managedFields"]}
    assert ("kubectl", "Apply") in managers
    kubectl("patch", "vllms", "llama", "--type=merge", "-p", '{"spec":{"replicas":3}}')
    changed = yaml.safe_load(MINIMAL.read_text())
    changed["spec"]["replicas"] = 2
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(changed))
    refused = kubectl.run("apply", "--server-side", "-f", str(path))
    assert refused.returncode != 0
    assert 'conflict with "kubectl-patch": .spec.replicas' in refused.stderr, refused.stderr
    assert "serverside-applied" in kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    assert (api.get_object("vllmservices", "llama") or {})["spec"]["replicas"] == 2
    # A field the manager stops applying is removed (nobody else owns it).
    del changed["spec"]["replicas"]
    changed["spec"]["maxReplicas"] = 4
    path.write_text(yaml.safe_dump(changed))
    kubectl("apply", "--server-side", "-f", str(path))
    spec = (api.get_object("vllmservices", "llama") or {})["spec"]
    assert spec["maxReplicas"] == 4 and spec["replicas"] == 1      # removed, then defaulted again


def test_server_side_apply_of_a_deployment_merges_containers_by_name(kubectl: Kubectl, api: EmulatedAPIServer,
                                                                    tmp_path: Path) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": {
                      "metadata": {"labels": {"app": "web"}},
                      "spec": {"containers": [{"name": "web", "image": "nginx:1"}]}}}}
    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(deployment))
    kubectl("apply", "--server-side", "--field-manager=one", "-f", str(path))
    sidecar = copy.deepcopy(deployment)
    sidecar["spec"] = {"selector": deployment["spec"]["selector"], "template": {
        "metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "sidecar", "image": "busybox"}]}}}
    path.write_text(yaml.safe_dump(sidecar))
    kubectl("apply", "--server-side", "--field-manager=two", "-f", str(path))
    stored = api.get_object("deployments", "web")
    assert stored is not None
    assert [c["name"] for c in stored["spec"]["template"]["spec"]["containers"]] == ["web", "sidecar"]


def test_kubectl_explain_reads_the_crd_and_built_in_schemas(with_crd: Kubectl) -> None:
    out = with_crd("explain", "vllmservice.spec.gpu")
    assert "KIND:       VLLMService" in out and "maxCount\t<integer>" in out
    out = with_crd("explain", "deployment.spec.template.spec.containers.resources")
    assert "KIND:       Deployment" in out and "limits\t<map[string]Quantity>" in out


def test_a_non_string_name_is_a_422_and_lists_keep_working(api: EmulatedAPIServer, kubectl: Kubectl) -> None:
    request = Request(api.url + "/apis/apps/v1/namespaces/default/deployments", method="POST",
                      data=json.dumps({"metadata": {"name": 42}, "spec": {}}).encode(),
                      headers={"Content-Type": "application/json"})
    status, body = _send(request)
    assert status == 422 and body["details"]["causes"][0]["field"] == "metadata.name", body
    assert api.list_objects("deployments") == []
    assert "No resources found" in kubectl("get", "deployments")
    request = Request(api.url + "/api/v1/namespaces/default/configmaps", method="POST",
                      data=json.dumps({"metadata": {"name": "Not_A_Name"}}).encode(),
                      headers={"Content-Type": "application/json"})
    status, body = _send(request)
    assert status == 422 and "RFC 1123 subdomain" in body["message"]


def _pod(api: EmulatedAPIServer, name: str, restarts: int, ready: bool) -> None:
    now = api.emulator.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    api.create_object("pods", {"metadata": {"name": name}, "spec": {"nodeName": "gpu-1", "containers": [
        {"name": "vllm", "image": "vllm/vllm-openai"}]}, "status": {
        "phase": "Running", "podIP": "10.244.0.7", "containerStatuses": [{
            "name": "vllm", "ready": ready, "restartCount": restarts,
            "state": {"running": {"startedAt": now}} if ready else {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": now}}}]}})


def test_get_pods_prints_ready_status_restarts_and_age(api: EmulatedAPIServer, kubectl: Kubectl) -> None:
    _pod(api, "serving", 1, True)
    _pod(api, "crashing", 3, False)
    lines = kubectl("get", "pods", "-o", "wide").splitlines()
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED", "NODE",
                                "READINESS", "GATES"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["serving"][1:4] == ["1/1", "Running", "1"] and rows["serving"][5] == "ago)"  # "1 (2s ago)"
    assert rows["crashing"][1:4] == ["0/1", "CrashLoopBackOff", "3"] and rows["crashing"][5] == "ago)"
    assert re.fullmatch(r"\(\d+s", rows["serving"][4]) and re.fullmatch(r"\d+s", rows["serving"][6])  # a fresh pod
    assert rows["serving"][7:9] == ["10.244.0.7", "gpu-1"]                  # IP, node
    assert "<invalid>" not in "\n".join(lines)


def _init_pod(api: EmulatedAPIServer, name: str, init: dict[str, Any]) -> None:
    """A pod whose model-download init container has not succeeded (its vllm container waits PodInitializing)."""
    api.create_object("pods", {"metadata": {"name": name}, "spec": {
        "nodeName": "gpu-1", "initContainers": [{"name": "model-download", "image": "vllm/vllm-openai"}],
        "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}, "status": {
        "phase": "Pending", "conditions": [{"type": "Initialized", "status": "False"}],
        "initContainerStatuses": [{"name": "model-download", "ready": False, **init}],
        "containerStatuses": [{"name": "vllm", "ready": False, "restartCount": 0,
                               "state": {"waiting": {"reason": "PodInitializing"}}}]}})


def test_get_pods_prints_the_init_phase_as_kubectl_does(api: EmulatedAPIServer, kubectl: Kubectl) -> None:
    now = api.emulator.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    failed = {"exitCode": 1, "reason": "Error", "finishedAt": now}
    _init_pod(api, "downloading", {"restartCount": 0, "state": {"running": {"startedAt": now}}})
    _init_pod(api, "failed", {"restartCount": 0, "state": {"terminated": failed}})
    _init_pod(api, "looping", {"restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                               "lastState": {"terminated": failed}})
    _init_pod(api, "signalled", {"restartCount": 0, "state": {"terminated": {"exitCode": 137, "signal": 9}}})
    rows = {line.split()[0]: line.split() for line in kubectl("get", "pods").splitlines()[1:]}
    assert rows["downloading"][1:4] == ["0/1", "Init:0/1", "0"]
    assert rows["failed"][1:4] == ["0/1", "Init:Error", "0"]
    assert rows["looping"][1:4] == ["0/1", "Init:CrashLoopBackOff", "4"]  # the init container's restarts
    assert rows["looping"][5] == "ago)"                                     # "4 (2s ago)", from its lastState
    assert rows["signalled"][2] == "Init:Signal:9"


def test_get_events_prints_kubectls_columns(api: EmulatedAPIServer, kubectl: Kubectl) -> None:
    now = api.emulator.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    api.create_object("events", {"metadata": {"name": "llama.1"}, "type": "Warning", "reason": "BackOff",
                                 "message": "Back-off restarting failed container", "lastTimestamp": now,
                                 "involvedObject": {"kind": "Pod", "name": "llama-0"}})
    lines = kubectl("get", "events").splitlines()
    assert lines[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert lines[1].split()[1:4] == ["Warning", "BackOff", "pod/llama-0"]


def test_get_vllms_prints_the_crds_printer_columns(with_crd: Kubectl) -> None:
    with_crd("apply", "-f", str(MINIMAL))
    assert with_crd("get", "vllms").splitlines()[0].split() == ["NAME", "MODEL", "GPU", "TP", "NODES", "MAXLEN",
                                                                "STATUS", "READY", "AGE"]
    wide = with_crd("get", "vllms", "-o", "wide").splitlines()[0]
    assert "REASON" in wide and "MESSAGE" in wide


def test_logs_previous_tail_and_limit(api: EmulatedAPIServer, kubectl: Kubectl) -> None:
    _pod(api, "p", 1, True)
    api.set_pod_log("default", "p", "starting\nserving\n")
    api.set_pod_log("default", "p", "loading\ntorch.OutOfMemoryError: CUDA out of memory\n", previous=True)
    assert kubectl("logs", "p") == "starting\nserving\n"
    assert kubectl("logs", "p", "--previous") == "loading\ntorch.OutOfMemoryError: CUDA out of memory\n"
    assert kubectl("logs", "p", "--previous", "--tail=1") == "torch.OutOfMemoryError: CUDA out of memory\n"
    assert kubectl("logs", "p", "--limit-bytes=4") == "star"
    _pod(api, "fresh", 0, True)
    result = kubectl.run("logs", "fresh", "--previous")
    assert result.returncode != 0 and 'previous terminated container "vllm"' in result.stderr


def _send(request: Request) -> tuple[int, dict[str, Any]]:
    try:
        with urlopen(request, timeout=5) as response:  # noqa: S310 (loopback only)
            return response.status, json.loads(response.read())
    except HTTPError as exc:
        return exc.code, json.loads(exc.read())




def test_a_built_in_kind_is_validated_with_kubernetes_schemas(kubectl: Kubectl, api: EmulatedAPIServer,
                                                             tmp_path: Path) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
                  "spec": {"replica": 2, "selector": {"matchLabels": {"app": "web"}}, "template": {
                      "metadata": {"labels": {"app": "web"}},
                      "spec": {"containers": [{"name": "web", "image": "nginx:1", "ports": [{"containerPort": "80"}]}]}}}}
    refused = _apply_manifest(kubectl, tmp_path, deployment)
    assert refused.returncode != 0 and 'unknown field "spec.replica"' in refused.stderr, refused.stderr
    del deployment["spec"]["replica"]
    refused = _apply_manifest(kubectl, tmp_path, deployment)
    assert refused.returncode != 0, refused.stdout
    assert "spec.template.spec.containers[0].ports[0].containerPort" in refused.stderr, refused.stderr
    assert api.get_object("deployments", "web") is None


def test_kubectl_wait_gets_the_end_of_the_initial_events(kubectl: Kubectl) -> None:
    """kubectl 1.35 waits with a watch-list (sendInitialEvents=true): it needs the BOOKMARK that ends the list."""
    kubectl("apply", "-f", str(CRD_PATH))
    out = kubectl("wait", "--for=condition=established", "crd/vllmservices.vllm-operator.dev", "--timeout=10s")
    assert "condition met" in out


def test_openapi_v2_and_v3_documents(api: EmulatedAPIServer, with_crd: Kubectl) -> None:
    status, v2 = _send(Request(api.url + "/openapi/v2"))
    assert status == 200 and v2["swagger"] == "2.0"
    definitions = v2["definitions"]
    assert definitions["io.k8s.api.apps.v1.Deployment"]["x-kubernetes-group-version-kind"] == [
        {"group": "apps", "kind": "Deployment", "version": "v1"}]
    assert "dev.vllm-operator.v1alpha1.VLLMService" in definitions
    assert all(isinstance(s.get("type", ""), str) for s in definitions.values())   # OpenAPI types, not lists
    status, v3 = _send(Request(api.url + "/openapi/v3"))
    url = v3["paths"]["apis/vllm-operator.dev/v1alpha1"]["serverRelativeURL"]
    status, doc = _send(Request(api.url + url))
    assert status == 200 and doc["openapi"].startswith("3.")
    patch = doc["paths"]["/apis/vllm-operator.dev/v1alpha1/namespaces/{namespace}/vllmservices/{name}"]["patch"]
    assert {"fieldValidation", "dryRun", "fieldManager", "force"} <= {p["name"] for p in patch["parameters"]}
    schema = doc["components"]["schemas"]["dev.vllm-operator.v1alpha1.VLLMService"]
    assert schema["properties"]["metadata"]["$ref"].endswith("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
