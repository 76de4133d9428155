"""Children converge to exactly the render, and only the operator's own objects are touched — through the kopf
handlers against the emulated API server over real HTTP (it implements server-side apply and field managers).

* Each optional setting removed from the spec, in turn, is gone from the child after the next reconcile (server-side
  apply as field manager `vllm-operator` removes what the operator applied before and no longer sets), while what
  another manager wrote to the same Deployment (a `kubectl rollout restart` annotation, a label) stays.
* A child whose name is taken by an object that is not this VLLMService's (no ownerReference to its uid, or not
  labelled as the operator's) is never patched, adopted or deleted — not even when the VLLMService is deleted — and
  the `NameConflict` condition names it and what to rename; the other children still converge, and the condition
  clears once the name is free.
* Children written before the operator applied them server-side (created with POST, merge-patched) are taken over
  once, so a field dropped later goes as well.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes
import pytest

from kit.inprocess import Cluster, condition, container, harness_fixture  # noqa: F401 (`harness`)
from vllm_operator.api import conditions as cond
from vllm_operator.handlers import effects, kube

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
NODE = {"nodeSelector": {"pool": "serving", "zone": "a"}}
TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
AFFINITY = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 1, "preference": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}}]}}


def _get(h: Cluster, resource: str, name: str) -> dict[str, Any] | None:
    return h.server.get_object(resource, name, h.namespace)


def _template(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"])


def _env(deployment: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container(deployment).get("env") or []}


def _init_names(deployment: dict[str, Any]) -> list[str]:
    return [c["name"] for c in _template(deployment).get("initContainers") or []]


def _storage_class(h: Cluster) -> None:
    h.server.create_object("storageclasses", {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "x", "metadata": {"name": "fast"}})


#: (what the spec drops, the patch that drops it, a check on the Deployment that the dropped setting is gone)
REMOVALS: list[tuple[str, dict[str, Any], Any]] = [
    ("a nodeSelector key", {"nodeSelector": {"zone": None}},
     lambda d: "zone" not in (_template(d).get("nodeSelector") or {}) and _template(d)["nodeSelector"]["pool"]),
    ("a toleration", {"tolerations": None},
     lambda d: [t["key"] for t in _template(d).get("tolerations") or []] == ["nvidia.com/gpu"]),
    ("the affinity", {"affinity": None}, lambda d: not _template(d).get("affinity")),
    ("an env var", {"env": [{"name": "KEEP", "value": "1"}]},
     lambda d: "DROP_ME" not in _env(d) and _env(d).get("KEEP") == "1"),
    ("the restricted profile's runAsUser", {"security": {"profile": "baseline", "runAsUser": None}},
     lambda d: "runAsUser" not in (container(d).get("securityContext") or {})
     and "runAsUser" not in (_template(d).get("securityContext") or {})),
    ("LoRA", {"lora": None}, lambda d: "--enable-lora" not in container(d)["args"]),
    ("the model cache claim (and its model-download init container)", {"modelCache": None},
     lambda d: "model-download" not in _init_names(d)),
]


def test_every_removed_setting_is_gone_and_other_managers_fields_stay(harness: Cluster) -> None:
    h = harness
    h.add_node("gpu-1", "NVIDIA-L4", pool="serving", zone="a")
    _storage_class(h)
    h.create("chat", {"model": {"name": QWEN}, **NODE, "tolerations": [TOLERATION], "affinity": AFFINITY,
                      "env": [{"name": "DROP_ME", "value": "x"}, {"name": "KEEP", "value": "1"}],
                      "security": {"profile": "restricted", "runAsUser": 2000},
                      "lora": {"adapters": [{"name": "sql", "source": "my-org/sql-lora"}]},
                      "modelCache": {"size": "20Gi", "storageClassName": "fast"}})
    first = h.wait_deployment("chat", lambda d: "model-download" in _init_names(d))
    assert _template(first)["nodeSelector"]["zone"] == "a" and _template(first)["tolerations"]
    assert _template(first)["affinity"] and "DROP_ME" in _env(first) and "--enable-lora" in container(first)["args"]
    assert (container(first).get("securityContext") or {}).get("runAsUser") == 2000 or \
        (_template(first).get("securityContext") or {}).get("runAsUser") == 2000
    # another manager writes to the same Deployment, as `kubectl rollout restart` and a labelling tool do
    apps = kubernetes.client.AppsV1Api(h.api)
    apps.patch_namespaced_deployment("chat", h.namespace, {
        "metadata": {"labels": {"team": "search"}},
        "spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-27T10:00:00Z"}}}}},
        field_manager="kubectl-rollout")

    for what, patch, gone in REMOVALS:
        h.wait_settled("chat")  # one edit at a time (an edit during the last one's retry waits out kopf's backoff)
        h.patch_spec("chat", patch)
        deployment = h.wait_deployment("chat", lambda d, gone=gone: bool(gone(d)), message=f"{what} gone")
        assert deployment["metadata"]["labels"]["team"] == "search", what
        assert deployment["spec"]["template"]["metadata"]["annotations"][
            "kubectl.kubernetes.io/restartedAt"] == "2026-11-27T10:00:00Z", what
    managers = {(m["manager"], m["operation"]) for m in deployment["metadata"]["managedFields"]}
    assert (kube.FIELD_MANAGER, "Apply") in managers and ("kubectl-rollout", "Update") in managers


def test_a_child_created_by_post_is_taken_over_so_a_later_removal_still_removes(harness: Cluster) -> None:
    """The creation path posts the children (one request each); the first apply after it moves that ownership into
    the operator's apply entry, so a key dropped two edits later is removed, not kept by the POST's entry."""
    h = harness
    h.add_node("gpu-1", "NVIDIA-L4", pool="serving", zone="a")
    h.create("chat", {"model": {"name": QWEN}, **NODE})
    created = h.wait_deployment("chat")
    entries = {(m["manager"], m["operation"]) for m in created["metadata"]["managedFields"]}
    assert (kube.FIELD_MANAGER, "Update") in entries  # POSTed with the operator's field manager
    h.patch_spec("chat", {"env": [{"name": "A", "value": "1"}]})
    h.wait_deployment("chat", lambda d: _env(d).get("A") == "1")
    h.patch_spec("chat", {"nodeSelector": {"zone": None}, "env": None})
    d = h.wait_deployment("chat", lambda d: "zone" not in (_template(d).get("nodeSelector") or {}))
    assert "A" not in _env(d)
    assert not any(m["operation"] == "Update" and m["manager"] == kube.FIELD_MANAGER and not m.get("subresource")
                   for m in d["metadata"]["managedFields"])
    # the Service, POSTed too: a new port replaces the old one (an item keyed by port and protocol)
    h.wait_settled("chat")
    h.patch_spec("chat", {"service": {"port": 8080}})
    service = h.wait_for(lambda: (s := h.k8s_service("chat")) and s["spec"]["ports"][-1]["port"] == 8080 and s,
                         message="the Service's new port")
    assert [p["port"] for p in service["spec"]["ports"]] == [8080]


def test_adopted_fields_moves_only_the_operators_update_entries() -> None:
    managed = [
        {"manager": "OpenAPI-Generator", "operation": "Update", "apiVersion": "apps/v1",
         "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:nodeSelector": {"f:zone": {}}}}}}},
        {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status", "apiVersion": "apps/v1",
         "fieldsV1": {"f:status": {"f:replicas": {}}}},
        {"manager": "kubectl-rollout", "operation": "Update", "apiVersion": "apps/v1",
         "fieldsV1": {"f:spec": {"f:template": {"f:metadata": {"f:annotations": {"f:x": {}}}}}}},
        {"manager": "vllm-operator", "operation": "Apply", "apiVersion": "apps/v1",
         "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:nodeSelector": {"f:pool": {}}}}}}},
    ]
    before = copy.deepcopy(managed)
    out = effects.adopted_fields(managed, "apps/v1")
    assert managed == before  # not modified in place
    assert out is not None and [e["manager"] for e in out] == [
        "kube-controller-manager", "kubectl-rollout", "vllm-operator"]
    assert out[2]["fieldsV1"] == {"f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:nodeSelector": {
        "f:pool": {}, "f:zone": {}}}}}}
    assert effects.adopted_fields(out, "apps/v1") is None  # nothing left to move: no write
    assert effects.adopted_fields(None, "apps/v1") is None
    # a render that still sets every field the old entries hold needs no move (the apply co-owns them) ...
    still = {"spec": {"replicas": 2, "template": {"spec": {"nodeSelector": {"zone": "b", "pool": "x"}}}}}
    assert effects.adopted_fields(managed, "apps/v1", still) is None
    # ... one that drops one of them does
    dropped = {"spec": {"replicas": 2, "template": {"spec": {"nodeSelector": {"pool": "x"}}}}}
    assert effects.adopted_fields(managed, "apps/v1", dropped) == out


def test_holds_reads_list_items_by_the_keys_the_server_recorded() -> None:
    env = {"f:spec": {"f:containers": {'k:{"name":"vllm"}': {".": {}, "f:name": {}, "f:env": {
        'k:{"name":"A"}': {".": {}, "f:name": {}, "f:value": {}}}}}, "f:finalizers": {'v:"x"': {}}}}
    config = {"spec": {"containers": [{"name": "vllm", "env": [{"name": "A", "value": "1"}]}], "finalizers": ["x"]}}
    assert effects.holds(config, env)
    config["spec"]["containers"][0]["env"] = [{"name": "B", "value": "1"}]
    assert not effects.holds(config, env)
    assert not effects.holds({"spec": {"containers": [{"name": "vllm", "env": [{"name": "A"}]}], "finalizers": ["x"]}},
                             env)  # the item is there, its value is not
    assert not effects.holds({"spec": {"containers": [{"name": "vllm", "env": [{"name": "A", "value": "1"}]}]}}, env)


# --- only the operator's own objects ---------------------------------------------------------------------------------

def _foreign(kind: str, name: str, namespace: str) -> tuple[str, dict[str, Any]]:
    meta = {"name": name, "namespace": namespace, "labels": {"app": "theirs"}}
    if kind == "Service":
        return "services", {"apiVersion": "v1", "kind": "Service", "metadata": meta,
                            "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80, "targetPort": 8080}]}}
    if kind == "HorizontalPodAutoscaler":
        return "horizontalpodautoscalers", {
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta,
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "theirs"},
                     "minReplicas": 1, "maxReplicas": 3}}
    return "deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "theirs"}}, "template": {
            "metadata": {"labels": {"app": "theirs"}}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}


@pytest.mark.parametrize("kind", ["Service", "HorizontalPodAutoscaler", "Deployment"])
def test_a_name_taken_by_someone_elses_object_is_left_alone_and_said(harness: Cluster, kind: str) -> None:
    h = harness
    h.add_node("gpu-1", "NVIDIA-L4", count=2)
    resource, theirs = _foreign(kind, "chat", h.namespace)
    stored = h.server.create_object(resource, theirs, h.namespace)
    h.create("chat", {"model": {"name": QWEN}, "autoscaling": {"minReplicas": 1, "maxReplicas": 2}})
    obj = h.wait_condition("chat", cond.NAME_CONFLICT, "True", cond.NAME_CONFLICT)
    message = condition(obj, cond.NAME_CONFLICT)["message"]  # type: ignore[index]
    assert f"{kind} chat" in message and "rename" in message.lower(), message
    event = h.wait_events("chat", cond.NAME_CONFLICT)[0]
    assert event["type"] == "Warning" and f"{kind} chat" in event["message"]
    # the rest of the children converge
    others = {"Service": "services", "HorizontalPodAutoscaler": "horizontalpodautoscalers",
              "Deployment": "deployments"}
    for other, other_resource in others.items():
        if other != kind:
            child = h.wait_for(lambda r=other_resource: _get(h, r, "chat"), message=f"our {other}")
            assert child["metadata"]["ownerReferences"][0]["uid"] == h.service("chat")["metadata"]["uid"]
    h.wait_settled("chat")
    untouched = _get(h, resource, "chat")
    assert untouched is not None
    assert untouched["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]  # never written
    assert not untouched["metadata"].get("ownerReferences")
    # the only object of that kind here is theirs: no patch, update or delete of that kind at all
    assert not [w for w in h.writes() if w.resource == resource and w.verb != "create"]

    # deleting the VLLMService leaves their object alone (no ownerReference: the garbage collector skips it)
    h.delete("chat")
    h.wait_for(lambda: h.service("chat") is None, message="the VLLMService gone")
    for other_resource in others.values():
        if other_resource != resource:
            h.wait_for(lambda r=other_resource: _get(h, r, "chat") is None or None,
                       message=f"our {other_resource} collected")
    assert _get(h, resource, "chat") == untouched


def test_the_conflict_clears_once_the_name_is_free(harness: Cluster) -> None:
    h = harness
    h.add_node("gpu-1", "NVIDIA-L4")
    resource, theirs = _foreign("Service", "chat", h.namespace)
    h.server.create_object(resource, theirs, h.namespace)
    h.create("chat", {"model": {"name": QWEN}})
    h.wait_condition("chat", cond.NAME_CONFLICT, "True", cond.NAME_CONFLICT)
    h.server.delete_object(resource, "chat", h.namespace)
    h.patch_spec("chat", {"env": [{"name": "NUDGE", "value": "1"}]})  # any reconcile (the watchdog's, in 120 s)
    service = h.wait_for(lambda: (s := _get(h, "services", "chat")) and s["metadata"].get("ownerReferences") and s,
                         message="our Service")
    assert service["spec"]["selector"]["vllm-operator.dev/service"] == "chat"
    h.wait_condition("chat", cond.NAME_CONFLICT, "False", cond.NO_CONFLICT)


def test_the_emulators_apply_removes_what_a_removal_empties() -> None:
    """Server-side apply as the real server does it: an item whose fields all go is removed (its key fields last, or
    it could not be found by them), and so is a map or list the removal leaves empty — unless someone else owns it."""
    from datetime import UTC, datetime

    from vllm_operator_sim.emulator_apply import apply

    schema = {"properties": {"spec": {"properties": {
        "env": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                "items": {"properties": {"name": {"type": "string"}, "value": {"type": "string"}}}},
        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port", "protocol"],
                  "items": {"properties": {"port": {"type": "integer"}}}},
        "affinity": {"type": "object"}, "keep": {"type": "object"}}}}}
    now = lambda: datetime(2026, 11, 27, tzinfo=UTC)  # noqa: E731
    first = {"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}, "spec": {
        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP", "targetPort": "http"}],
        "affinity": {"nodeAffinity": {"preferred": [1]}}, "keep": {"a": 1}}}
    live = apply({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}}, first, "op", schema, force=True,
                 now=now)
    live = apply(live, {**first, "spec": {"keep": {"b": 2}}}, "other", schema, force=True, now=now)  # shares keep
    port = {"name": "http", "port": 8080, "protocol": "TCP", "targetPort": "http"}
    second = {"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"},
              "spec": {"env": [{"name": "B", "value": "2"}], "ports": [port]}}
    after = apply(live, second, "op", schema, force=True, now=now)
    assert after["spec"]["env"] == [{"name": "B", "value": "2"}]
    assert after["spec"]["ports"] == [port]  # the item of two keys went whole
    assert "affinity" not in after["spec"]
    assert after["spec"]["keep"] == {"b": 2}  # `a` was op's and went; `b` is other's
    gone = apply(after, {**second, "spec": {}}, "op", schema, force=True, now=now)
    assert "env" not in gone["spec"] and "ports" not in gone["spec"]
