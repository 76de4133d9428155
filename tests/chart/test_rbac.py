"""The chart's RBAC is enough and nothing broader, derived from what the real operator calls.

The real `vllm-operator run` process runs against the emulated API server (vllm_operator_sim.emulator) through
a scenario: create VLLMServices (catalog model, model from a ConfigMap with a model-cache PVC, one that does not
fit, one whose model cannot be found), a spec update of the PVC-backed one, a crash-looping pod with an empty
termination message (remediation reads the log), a spec update, a new pod the scheduler cannot place, the pod
becoming ready, deletion. The emulator's access log gives every (verb, group, resource/subresource,
namespace) requested. Three runs:

* all namespaces, standalone (no peering), the full scenario;
* all namespaces with the chart's own arguments (`--peering`) and its ClusterKopfPeering, a short scenario;
* namespaced with the chart's arguments for `watchNamespaces: [team-a, team-b]` and its KopfPeerings, the full
  scenario.

Then, for each mode, the rendered chart must allow every call (through the ServiceAccount's bindings: a
ClusterRole everywhere, Roles only in their namespace), and every verb it grants must have been called, or be in
ALLOWED_UNUSED below with the reason.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from kit.api import emulated_api, http_get, l4_node
from kit.ports import free_port
from kit.process import OperatorProcess, start_operator
from vllm_operator_sim.emulator import AccessRecord, EmulatedAPIServer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CATALOG_MODEL = ROOT / "operator" / "vllm_operator" / "catalog" / "models" / "Qwen__Qwen2.5-0.5B-Instruct.json"
WAIT = 30.0

#: (group, resource, verb) the chart grants although no scenario calls it, and why. Keep it short.
_ECOSYSTEM = ("only for services with spec.autoscaling / spec.routing.inferencePool (the scenario has none; "
              "tests/handlers/test_autoscalers_and_pools.py runs them against the emulator)")
ALLOWED_UNUSED: dict[tuple[str, str, str], str] = {
    (group, resource, verb): _ECOSYSTEM
    for group, resource in (("autoscaling", "horizontalpodautoscalers"), ("keda.sh", "scaledobjects"),
                            ("inference.networking.k8s.io", "inferencepools"))
    for verb in ("get", "create", "patch", "delete")}
# multi-node services only (spec.gpu.maxNodes > 1); the scenario has none, nor the LWS CRD (so kopf does not watch
# them either). tests/handlers/test_lws_handlers.py runs them against the emulator with the LWS CRD installed.
ALLOWED_UNUSED.update({("leaderworkerset.x-k8s.io", "leaderworkersets", verb): "multi-node services only (issue 13)"
                       for verb in ("get", "create", "patch", "delete")})
ALLOWED_UNUSED.update({("leaderworkerset.x-k8s.io", "leaderworkersets", verb): (
    "kopf lists and watches them only where the LWS CRD is installed (tests/handlers/test_lws_handlers.py)")
    for verb in ("list", "watch")})
# share groups only (spec.gpu.share, issue 26); the scenario has none. tests/e2e/test_share_group_process.py runs
# them against the simulated cluster with the DRA API.
_SHARE = "share groups only (spec.gpu.share, issue 26; tests/e2e/test_share_group_process.py)"
ALLOWED_UNUSED.update({("", "configmaps", "create"): _SHARE, ("", "configmaps", "patch"): _SHARE,
                       ("resource.k8s.io", "resourceclaims", "get"): _SHARE,
                       ("resource.k8s.io", "resourceclaims", "create"): _SHARE,
                       ("resource.k8s.io", "deviceclasses", "list"): _SHARE})
ALLOWED_UNUSED[("", "secrets", "get")] = (
    "only for services with spec.hfTokenSecretRef: the service's own hub token (tests/unit/test_tenant_tokens.py)")
ALLOWED_UNUSED[("", "events", "get")] = (
    "only when a recorded step's Event answers 409: whether it exists (tests/handlers/test_ladder_under_faults.py)")
ALLOWED_UNUSED.update({("apps", "daemonsets", verb): (
    "only for services with spec.modelCache.prewarm (issue 25; tests/e2e/test_prewarm_process.py runs them)")
    for verb in ("get", "create", "patch", "delete")})
ALLOWED_UNUSED.update({("apps", "statefulsets", verb): (
    "only for services that may run several pods on ReadWriteOnce storage without the LeaderWorkerSet API (issue 25; "
    "tests/e2e/test_statefulset_process.py runs them)") for verb in ("create", "patch", "delete")})
ALLOWED_UNUSED[("", "persistentvolumeclaims", "delete")] = (
    "only when a switch to a claim per pod leaves a service's own claim unused (tests/handlers/test_switch_claims.py)")
ALLOWED_UNUSED[("apps", "deployments", "delete")] = (
    "only when a service moves from one node to a LeaderWorkerSet (tests/handlers/test_lws_handlers.py)")

#: vLLM's startup failure when other processes hold GPU memory (remediation lowers --gpu-memory-utilization).
FREE_MEMORY_ERROR = ("ValueError: Free memory on device cuda:0 (17.40/21.84 GiB) on startup is less than desired "
                     "GPU memory utilization (0.9, 19.66 GiB). Decrease GPU memory utilization or reduce GPU memory "
                     "used by other processes.")


# --- running the operator ---------------------------------------------------------------------------------------


@dataclass
class Run:
    """One emulated cluster (kit.api) and one or more operator processes (kit.process) against it."""

    tmp: Path
    processes: list[OperatorProcess] = field(default_factory=list)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self.server: EmulatedAPIServer = self._stack.enter_context(emulated_api(
            self.tmp / "kubeconfig", with_crd=True, nodes=[l4_node("gpu-node-1", allocatable=True)],
            namespaces=("team-a", "team-b", "elsewhere")))
        assert self.server.kubeconfig_path is not None
        self.kubeconfig = self.server.kubeconfig_path

    def start(self, args: list[str], pod_id: str = "vllm-operator-0") -> subprocess.Popen[bytes]:
        op = start_operator(self.kubeconfig, self.tmp / f"operator-{len(self.processes)}.log", args,
                            env={"POD_ID": pod_id, "HF_HOME": str(self.tmp / "hf")}, probes=False)
        self.processes.append(op)
        return op.process

    def logs(self) -> str:
        return "\n".join(f"--- {op.log_path.name}\n{op.log()[-4000:]}" for op in self.processes)

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        def done() -> Any:
            return predicate() or any(op.process.poll() is not None for op in self.processes)

        try:
            result = self.server.wait_for(done, timeout=timeout, message=what)
        except TimeoutError:
            pytest.fail(f"timed out: {what}\n{self.logs()}")
        if result is True and any(op.process.poll() is not None for op in self.processes):
            pytest.fail(f"the operator exited before: {what}\n{self.logs()}")
        return result

    def stop(self) -> set[AccessRecord]:
        for op in self.processes:  # all of them told first, so none waits for the others
            if op.process.poll() is None:
                op.process.send_signal(signal.SIGTERM)
        for op in self.processes:
            op.stop()
        calls = self.server.accessed()
        self._stack.close()
        return calls

    # --- scenario steps ---

    def get(self, resource: str, name: str, namespace: str) -> dict[str, Any] | None:
        return self.server.get_object(resource, name, namespace=namespace)

    def args_of(self, namespace: str, name: str) -> list[str] | None:
        deployment = self.get("deployments", name, namespace)
        return deployment["spec"]["template"]["spec"]["containers"][0]["args"] if deployment else None

    def condition(self, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
        """The condition as written for the service's current generation. (`create_service` stores through the
        emulator's direct path, which skips the CRD's defaults: the operator's first patch adds them and moves the
        generation once, which a real API server, defaulting at create, never does.)"""
        service = self.get("vllmservices", name, namespace) or {}
        generation = (service.get("metadata") or {}).get("generation")
        return next((c for c in (service.get("status") or {}).get("conditions") or []
                     if c["type"] == type_ and c.get("observedGeneration") == generation), None)

    def create_service(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        self.server.create_object("vllmservices", {
            "apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec})

    def snapshot(self, label: str, namespace: str, name: str) -> None:
        service = self.get("vllmservices", name, namespace)
        assert service is not None
        self.snapshots[label] = service


def full_scenario(run: Run, main: str, other: str) -> None:
    """create → remediation (log read) → update → ready → delete, plus a ConfigMap model with a PVC and a plan
    that does not fit."""
    config = json.loads(CATALOG_MODEL.read_text())["config"]
    run.server.create_object("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                            "metadata": {"name": "tiny-config", "namespace": other},
                                            "data": {"config.json": json.dumps(config)}})
    run.create_service(other, "tiny", {"model": {"name": "my-org/tiny", "configMapRef": {"name": "tiny-config"}},
                                       "modelCache": {"size": "10Gi"}})
    run.create_service(main, "qwen", {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
                                      "remediation": {"minIntervalSeconds": 0}})
    run.create_service(main, "too-big", {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}})
    run.create_service(main, "missing", {"model": {"name": "no-such-org/no-such-model"}})

    first = run.wait(lambda: run.args_of(main, "qwen"), "the Deployment of qwen")
    run.wait(lambda: run.args_of(other, "tiny"), "the Deployment of tiny (model from a ConfigMap)")
    run.wait(lambda: run.server.list_objects("persistentvolumeclaims", namespace=other), "the model-cache PVC")
    # A change of tiny's spec: its children are read and compared now (a new service's were created unread).
    tiny_args = run.args_of(other, "tiny")
    run.server.patch_object("vllmservices", "tiny", {"spec": {"flags": {"maxModelLen": 4096}}}, namespace=other)
    run.wait(lambda: (a := run.args_of(other, "tiny")) != tiny_args and a, "tiny's update")
    degraded = run.wait(lambda: run.condition(main, "too-big", "Degraded"), "too-big planned")
    assert degraded["reason"] == "PlanInfeasible", degraded
    run.wait(lambda: run.condition(main, "qwen", "Progressing"), "qwen's first status")
    run.snapshot("deploying", main, "qwen")
    run.snapshot("infeasible", main, "too-big")

    # A crash-looping pod of the current plan whose termination message is empty: the operator reads its log.
    template = run.get("deployments", "qwen", main)["spec"]["template"]  # type: ignore[index]
    run.server.create_object("pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "qwen-7d9f-abcde", "namespace": main, "labels": template["metadata"]["labels"],
                     "annotations": template["metadata"].get("annotations") or {}},
        "spec": template["spec"],
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "vllm", "ready": False, "restartCount": 1, "image": "vllm", "imageID": "",
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "message": ""}}}]}})
    run.server.set_pod_log(main, "qwen-7d9f-abcde", f"INFO loading weights\n{FREE_MEMORY_ERROR}\n", container="vllm")
    remediated = run.wait(lambda: (a := run.args_of(main, "qwen")) != first and a, "a remediation step")
    run.snapshot("remediating", main, "qwen")

    # The user changes the spec (and the Service's port): the Deployment and the Service are patched.
    # (a pinned flag: since issue 16 a shorter workload context alone no longer changes max-num-seqs)
    run.server.patch_object("vllmservices", "qwen", {"spec": {"workload": {"contextLength": 4096},
                                                              "flags": {"maxNumSeqs": 8},
                                                              "service": {"port": 8080}}}, namespace=main)
    run.wait(lambda: (a := run.args_of(main, "qwen")) not in (first, remediated) and a, "the update")
    run.wait(lambda: run.get("services", "qwen", main)["spec"]["ports"][0]["port"] == 8080,  # type: ignore[index]
             "the Service's new port")
    # An update of the service with a model-cache claim: its children are read before they are applied.
    # (its second spec change: the generation is read back, not assumed)
    run.server.patch_object("vllmservices", "tiny", {"spec": {"workload": {"contextLength": 2048}}}, namespace=other)
    tiny_generation = (run.get("vllmservices", "tiny", other) or {})["metadata"]["generation"]
    run.wait(lambda: ((run.get("vllmservices", "tiny", other) or {}).get("status") or {}).get(
        "observedGeneration") == tiny_generation, "the update of tiny")

    # The new profile's pod cannot be scheduled (the crash-looping pod is gone): the operator reports the scheduler's
    # message, never a finished rollout.
    deployment = run.get("deployments", "qwen", main)
    assert deployment is not None
    template = deployment["spec"]["template"]
    run.server.delete_object("pods", "qwen-7d9f-abcde", namespace=main)
    run.server.create_object("pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "qwen-5c6d-fghij", "namespace": main, "labels": template["metadata"]["labels"],
                     "annotations": template["metadata"].get("annotations") or {}},
        "spec": template["spec"],
        "status": {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]}})
    run.server.patch_status("deployments", "qwen", {
        "observedGeneration": deployment["metadata"]["generation"], "replicas": 1, "updatedReplicas": 1,
        "readyReplicas": 0, "availableReplicas": 0}, namespace=main)
    run.wait(lambda: (c := run.condition(main, "qwen", "Degraded")) and c["reason"] == "Unschedulable",
             "Degraded=Unschedulable")
    run.snapshot("unschedulable", main, "qwen")

    # The pod is scheduled and becomes ready: the operator folds it into the Ready condition.
    run.server.patch_status("pods", "qwen-5c6d-fghij", {
        "phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"},
                                           {"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "vllm", "ready": True, "restartCount": 0, "image": "vllm", "imageID": "",
                               "state": {"running": {}}}]}, namespace=main)
    run.server.patch_status("deployments", "qwen", {
        "observedGeneration": deployment["metadata"]["generation"], "replicas": 1, "updatedReplicas": 1,
        "readyReplicas": 1, "availableReplicas": 1}, namespace=main)
    run.wait(lambda: (c := run.condition(main, "qwen", "Ready")) and c["status"] == "True", "Ready=True")
    run.snapshot("ready", main, "qwen")
    missing = run.wait(lambda: run.condition(main, "missing", "Degraded"), "missing planned")
    assert missing["reason"] == "ModelNotFound", missing
    run.snapshot("model-not-found", main, "missing")
    assert run.server.list_objects("events", namespace=main), "no Events posted"

    # Deletion: kopf removes its finalizer; children go by garbage collection.
    for namespace, name in ((main, "qwen"), (main, "too-big"), (main, "missing"), (other, "tiny")):
        run.server.delete_object("vllmservices", name, namespace=namespace)
    run.wait(lambda: not run.server.list_objects("vllmservices"), "the VLLMServices to be deleted")


def short_scenario(run: Run, namespace: str) -> None:
    run.create_service(namespace, "qwen", {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}})
    run.wait(lambda: run.args_of(namespace, "qwen"), "the Deployment of qwen")
    run.server.delete_object("vllmservices", "qwen", namespace=namespace)
    run.wait(lambda: not run.server.list_objects("vllmservices"), "qwen to be deleted")


def chart_args(objects: list[dict[str, Any]], health_port: int, metrics_port: int) -> list[str]:
    """The rendered operator arguments, with the endpoints moved to free loopback ports."""
    container = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    args = []
    for arg in container["args"]:
        if arg.startswith("--liveness="):
            path = urlparse(arg.partition("=")[2]).path
            arg = f"--liveness=http://127.0.0.1:{health_port}{path}"
        elif arg.startswith("--metrics-port="):
            arg = f"--metrics-port={metrics_port}"
        args.append(arg)
    assert args[0] == "run"
    return args[1:]


def create_peering_objects(run: Run, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    plurals = {"ClusterKopfPeering": "clusterkopfpeerings", "KopfPeering": "kopfpeerings"}
    peerings = [o for o in objects if o["kind"] in plurals]
    for obj in peerings:
        run.server.create_object(plurals[obj["kind"]], obj, namespace=obj["metadata"].get("namespace"))
    return peerings


# --- the runs (once per module) ---------------------------------------------------------------------------------


@dataclass
class Observed:
    calls: set[AccessRecord]
    snapshots: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def clusterwide(chart: Any, tmp_path_factory: pytest.TempPathFactory) -> Observed:
    calls: set[AccessRecord] = set()
    run = Run(tmp_path_factory.mktemp("standalone"))
    try:
        run.start(["-A", "--standalone", "--liveness", "", "--metrics-port", "0"])
        full_scenario(run, "team-a", "team-b")
    finally:
        calls |= run.stop()
    snapshots = run.snapshots

    run = Run(tmp_path_factory.mktemp("peering"))
    try:
        objects = chart.objects()
        assert [p["metadata"]["name"] for p in create_peering_objects(run, objects)] == ["vllm-operator"]
        health, metrics = free_port(), free_port()
        run.start(chart_args(objects, health, metrics))
        short_scenario(run, "elsewhere")
        # The endpoints the chart's probes and the metrics Service point at.
        probe = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
        assert http_get(f"http://127.0.0.1:{health}{probe['livenessProbe']['httpGet']['path']}", timeout=5)[0] == 200
        assert "vllm_operator_reconciles_total" in http_get(f"http://127.0.0.1:{metrics}/metrics", timeout=5)[1]
        peers = run.server.get_object("clusterkopfpeerings", "vllm-operator")["status"]
        assert "vllm-operator-0" in peers, peers
    finally:
        calls |= run.stop()
    return Observed(calls, snapshots)


@pytest.fixture(scope="module")
def namespaced(chart: Any, tmp_path_factory: pytest.TempPathFactory) -> Observed:
    run = Run(tmp_path_factory.mktemp("namespaced"))
    try:
        objects = chart.objects("namespaced.yaml")
        assert len(create_peering_objects(run, objects)) == 2
        run.start(chart_args(objects, free_port(), free_port()))
        full_scenario(run, "team-a", "team-b")
    finally:
        calls = run.stop()
    return Observed(calls, run.snapshots)


# --- RBAC as the API server evaluates it -----------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    namespace: str | None  # None: cluster-wide (a ClusterRoleBinding)
    rule: dict[str, Any]

    def allows(self, call: AccessRecord) -> bool:
        if self.namespace is not None and call.namespace != self.namespace:
            return False
        resource = f"{call.resource}/{call.subresource}" if call.subresource else call.resource
        # resourceNames: the access log has no object names; kopf patches only the peering object it is named
        # after, which is the name the chart grants (checked in test_peering_patch_is_limited_to_its_object).
        return (call.group in self.rule["apiGroups"] and resource in self.rule["resources"]
                and call.verb in self.rule["verbs"])


def grants(objects: list[dict[str, Any]], release_namespace: str) -> list[Grant]:
    """The rules bound to the operator's ServiceAccount, with where they apply."""
    sa = next(o for o in objects if o["kind"] == "ServiceAccount")["metadata"]
    subject = {"kind": "ServiceAccount", "name": sa["name"], "namespace": release_namespace}
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects
             if o["kind"] in ("ClusterRole", "Role")}
    found = []
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding") or subject not in binding["subjects"]:
            continue
        namespace = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        found += [Grant(namespace, rule) for rule in role["rules"]]
    return found


def assert_enough_and_nothing_broader(grants_: list[Grant], calls: set[AccessRecord]) -> None:
    denied = sorted({c for c in calls if not any(g.allows(c) for g in grants_)}, key=str)
    assert not denied, "the operator made calls the chart does not allow:\n" + "\n".join(map(str, denied))
    unused = []
    for grant in grants_:
        for group in grant.rule["apiGroups"]:
            for resource in grant.rule["resources"]:
                name, _, sub = resource.partition("/")
                for verb in grant.rule["verbs"]:
                    # The Roles of all watched namespaces are the same: a call in any of them uses the rule.
                    used = any(c.group == group and c.resource == name and (c.subresource or "") == sub
                               and c.verb == verb for c in calls)
                    if not used and (group, resource, verb) not in ALLOWED_UNUSED:
                        unused.append(f"{verb} {group or 'core'}/{resource} in {grant.namespace or 'the cluster'}")
    assert not unused, "the chart grants what the operator never calls:\n" + "\n".join(unused)


def test_clusterwide_rbac_is_exactly_what_the_operator_calls(chart: Any, clusterwide: Observed) -> None:
    objects = chart.objects()
    grants_ = grants(objects, chart.namespace)
    assert {g.namespace for g in grants_} == {None}
    assert_enough_and_nothing_broader(grants_, clusterwide.calls)


def test_namespaced_rbac_is_exactly_what_the_operator_calls(chart: Any, namespaced: Observed) -> None:
    objects = chart.objects("namespaced.yaml")
    grants_ = grants(objects, chart.namespace)
    assert {g.namespace for g in grants_} == {None, "team-a", "team-b"}
    # cluster-wide grants only for cluster-scoped resources
    namespaced_kinds = {"vllmservices", "deployments", "services", "persistentvolumeclaims", "pods", "configmaps",
                        "events", "kopfpeerings"}
    assert not [g for g in grants_ if g.namespace is None
                and {r.partition("/")[0] for r in g.rule["resources"]} & namespaced_kinds]
    assert not [c for c in namespaced.calls if c.namespace not in (None, "team-a", "team-b")]
    assert_enough_and_nothing_broader(grants_, namespaced.calls)


def test_single_replica_rbac_has_no_peering(chart: Any, clusterwide: Observed) -> None:
    """Without peering the chart drops the kopf.dev rules; the standalone run never called them."""
    grants_ = grants(chart.objects("single-replica.yaml"), chart.namespace)
    standalone_calls = {c for c in clusterwide.calls if c.group != "kopf.dev"}
    denied = [c for c in standalone_calls if not any(g.allows(c) for g in grants_)]
    assert not denied
    assert not [g for g in grants_ if "kopf.dev" in g.rule["apiGroups"]]


@pytest.mark.parametrize("values", [None, "namespaced.yaml", "monitoring.yaml", "gpu-catalog-prometheus.yaml",
                                    "single-replica.yaml"])
def test_no_wildcards(chart: Any, values: str | None) -> None:
    for role in chart.objects(values):
        if role["kind"] not in ("ClusterRole", "Role"):
            continue
        assert "aggregationRule" not in role
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert not [v for v in rule.get(key, []) if "*" in v], f"{role['metadata']['name']}: {rule}"
            assert "nonResourceURLs" not in rule


def test_peering_patch_is_limited_to_its_object(chart: Any, clusterwide: Observed, namespaced: Observed) -> None:
    for values, plural, observed in ((None, "clusterkopfpeerings", clusterwide),
                                     ("namespaced.yaml", "kopfpeerings", namespaced)):
        objects = chart.objects(values)
        name = next(a for a in chart.operator_container(objects)["args"] if a.startswith("--peering=")).partition(
            "=")[2]
        patch_rules = [g.rule for g in grants(objects, chart.namespace)
                       if plural in g.rule["resources"] and "patch" in g.rule["verbs"]]
        assert patch_rules and all(r.get("resourceNames") == [name] for r in patch_rules)
        assert any(c.resource == plural and c.verb == "patch" for c in observed.calls)


def test_allow_list_is_not_stale(clusterwide: Observed, namespaced: Observed) -> None:
    calls = clusterwide.calls | namespaced.calls
    for group, resource, verb in ALLOWED_UNUSED:
        name, _, sub = resource.partition("/")
        assert not any(c.group == group and c.resource == name and (c.subresource or "") == sub and c.verb == verb
                       for c in calls), f"{verb} {group}/{resource} is called now: drop it from ALLOWED_UNUSED"


def test_argocd_health_of_what_the_operator_writes(argocd_health: Any, clusterwide: Observed,
                                                   namespaced: Observed) -> None:
    """The documented Argo CD health check, on the statuses the real operator wrote during the scenario."""
    for observed in (clusterwide, namespaced):
        health = {label: argocd_health(obj)["status"] for label, obj in observed.snapshots.items()}
        assert health == {"deploying": "Progressing", "infeasible": "Degraded", "remediating": "Progressing",
                          "unschedulable": "Degraded", "ready": "Healthy", "model-not-found": "Degraded"}
        states = {label: (obj.get("status") or {}).get("state") for label, obj in observed.snapshots.items()}
        assert states == {"deploying": "RollingOut", "infeasible": "Infeasible", "remediating": "Remediating",
                          "unschedulable": "Unschedulable", "ready": "Ready", "model-not-found": "ModelNotFound"}


@pytest.mark.xfail(strict=False, reason="intermittent under CPU load (2 cores plus 5 busy loops: 2 failures in 13 "
                   "runs, none in isolation, ~5 s): the replica that won the peering logs 'Resuming operations' at "
                   "startup, the other pauses in its favour, and the winner then handles nothing for 60 s — seen "
                   "in the FIRST phase (before any takeover), so not a re-list after a pause; not reproduced with "
                   "--verbose; cause in kopf's pause/resume of its watch streams not yet found. Found so far: "
                   "kopf 1.45.2's api.stream() cancels a watch request still waiting for its response headers from a "
                   "done-callback that calls asyncio.current_task() (None there: the AssertionError is swallowed), so "
                   "a pause during that wait does not stop the request; the emulated API (aiohttp 3.14) sends a "
                   "watch's headers only with its first event. Not shown to be the cause. Until it is, the chart "
                   "defaults to one replica (values.yaml, README)")
def test_two_replicas_one_acts_the_other_takes_over(chart: Any, tmp_path: Path) -> None:
    """`replicaCount: 2` (one replica is the chart's default until this passes reliably): 2 replicas with the same
    arguments, differing only in POD_ID (the pod's name). Exactly one acts; when it stops, the other takes over."""
    run = Run(tmp_path)
    try:
        objects = chart.objects()
        create_peering_objects(run, objects)
        pods = ["vllm-operator-5d8f9-aaaaa", "vllm-operator-5d8f9-bbbbb"]
        processes = [run.start(chart_args(objects, free_port(), free_port()), pod_id=pod) for pod in pods]
        run.wait(lambda: sorted((run.server.get_object("clusterkopfpeerings", "vllm-operator") or {}).get("status")
                                or {}) == pods, "both replicas in the peering object")
        run.create_service("elsewhere", "first", {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}})
        run.wait(lambda: run.args_of("elsewhere", "first"), "one replica to act", timeout=60)

        def actors(name: str) -> list[int]:
            return [i for i, op in enumerate(run.processes) if f"created Deployment {name}" in op.log()]

        acting = run.wait(lambda: actors("first"), "the acting replica's log")
        assert len(acting) == 1, run.logs()

        processes[acting[0]].send_signal(signal.SIGTERM)  # a rollout or a drained node
        processes[acting[0]].wait(15)
        run.processes.pop(acting[0])
        run.create_service("elsewhere", "second", {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}})
        run.wait(lambda: run.args_of("elsewhere", "second"), "the standby to take over")
    finally:
        run.stop()
