"""The features together: {one pod, replicas, LWS group} × {no autoscaling, HPA, KEDA} × {InferencePool off/on} ×
{cache (one ReadWriteMany claim; a claim per pod for LWS groups), none} × {LoRA off/on} — 72 VLLMServices in one emulated cluster, one operator (kopf handlers
in-process), each checked for what a user relies on, not only for schema validity:

* every selector and query addresses exactly the serving pods (Deployment pods, or LWS leaders — never workers,
  never another service's pods): the Service, the InferencePool, the scale subresource's selector (what HPA and KEDA
  read pod metrics by), and the PromQL of the KEDA triggers (series labelled `namespace` and `pod`, as a PodMonitor
  scrapes them);
* a scale write (the autoscaler's, through `/scale`) while a remediation profile is in force neither takes a ladder
  step nor resets the profile;
* removing a setting (an env var, LoRA) removes it from every container of the workload.

One setup serves every combination (created together, each phase applied to all at once); the per-combination tests
only read what the phases recorded. The Deployment ↔ LeaderWorkerSet switch has its own tests
(test_lws_handlers.py, e2e/test_record_then_act.py).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.inprocess import Cluster, history, no_kv_crash, remediation
from vllm_operator.api.v1alpha1 import GROUP, PLURAL, VERSION

CRDS = Path(__file__).resolve().parents[1] / "data" / "crds"
NS = "default"
QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
LLAMA_405B = "meta-llama/Llama-3.1-405B-Instruct"
L4, H100 = "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3"
LWS_NAME, GROUP_INDEX, WORKER_INDEX = ("leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/group-index",
                                       "leaderworkerset.sigs.k8s.io/worker-index")
MARK = "MATRIX_MARK"
#: the module fixture builds all 72 services in the first test's setup (about 50 s on 2 idle cores, over 300 s, the
#: default per-test limit, on a 2-core machine at load 20): a safety net, as the end-to-end files have
pytestmark = pytest.mark.timeout(1200)
TIMEOUT = 120.0

SHAPES = ("pod", "rep", "lws")
SCALERS = ("none", "hpa", "keda")
POOLS = ("nopool", "pool")
CACHES = ("nocache", "cache")
SHARED_CLAIM = "models"
LORAS = ("nolora", "lora")
COMBOS = [f"{s}-{a}-{p}-{c}-{lo}" for s, a, p, c, lo in itertools.product(SHAPES, SCALERS, POOLS, CACHES, LORAS)]


def spec_of(name: str) -> dict[str, Any]:
    shape, scaler, pool, cache, lora = name.split("-")
    spec: dict[str, Any] = {"env": [{"name": MARK, "value": "1"}], "remediation": {"minIntervalSeconds": 0}}
    if shape == "lws":
        spec.update(model={"name": LLAMA_405B}, gpu={"product": H100, "maxNodes": 2})
    else:
        spec.update(model={"name": QWEN}, gpu={"product": L4}, replicas=2 if shape == "rep" else 1)
    if scaler == "hpa":
        spec["autoscaling"] = {"minReplicas": 1, "maxReplicas": 4}
    elif scaler == "keda":
        spec["autoscaling"] = {"engine": "KEDA", "minReplicas": 1, "maxReplicas": 4,
                               "prometheusAddress": "http://prometheus.monitoring:9090"}
    if pool == "pool":
        spec["routing"] = {"inferencePool": {"enabled": True}}
    if cache == "cache" and shape == "lws":
        spec["modelCache"] = {"size": "1Ti", "storageClassName": "fast"}  # a claim per pod of each group
    elif cache == "cache":
        # one ReadWriteMany claim every pod mounts (a size would give pods that may be several a claim each: a
        # StatefulSet or one-pod groups, tests/e2e/test_statefulset_process.py): the Deployment surges onto it
        spec["modelCache"] = {"claimName": SHARED_CLAIM}
    if lora == "lora":
        spec["lora"] = {"adapters": [{"name": "sql", "source": "my-org/sql-lora"}]}
    return spec


# --- the pods a controller would run, and who selects them ------------------------------------------------------------

def _workload(h: Cluster, name: str) -> dict[str, Any] | None:
    return h.server.get_object("leaderworkersets" if name.startswith("lws") else "deployments", name, NS)


def _pod(name: str, template: Mapping[str, Any], extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    labels = {**((template.get("metadata") or {}).get("labels") or {}), **(extra or {})}
    return {"metadata": {"name": name, "namespace": NS, "labels": labels,
                         "annotations": dict((template.get("metadata") or {}).get("annotations") or {})},
            "spec": template["spec"]}


def pods_of(name: str, workload: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(serving pods, other pods) the workload's controller would run: a Deployment's replicas
    (`<name>-<replicaset hash>-<suffix>`), or per LWS group its leader (`<name>-<g>`) and workers (`<name>-<g>-<w>`)."""
    spec = workload["spec"]
    if workload["kind"] == "Deployment":
        # names as the ReplicaSet controller makes them: template hash and suffix from Kubernetes' safe alphabet
        return [_pod(f"{name}-7d9f8b6c5-{'bcdfg'[i % 5]}x2k{'qrstv'[i // 5]}", spec["template"])
                for i in range(spec.get("replicas", 1))], []
    lwt = spec["leaderWorkerTemplate"]
    serving, others = [], []
    for g in range(spec.get("replicas", 1)):
        group = {LWS_NAME: name, GROUP_INDEX: str(g)}
        serving.append(_pod(f"{name}-{g}", lwt["leaderTemplate"], {**group, WORKER_INDEX: "0"}))
        others.extend(_pod(f"{name}-{g}-{w}", lwt["workerTemplate"], {**group, WORKER_INDEX: str(w)})
                      for w in range(1, lwt["size"]))
    return serving, others


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def selected(selector: Mapping[str, str], pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["name"] for p in pods if _matches(p["metadata"]["labels"], selector)}


def string_selected(selector: str, pods: list[dict[str, Any]]) -> set[str]:
    """The pods a label selector string selects, as the API server reads one (`k=v`, `k==v`, `k!=v`, `k`, `!k`)."""
    def holds(term: str, labels: Mapping[str, str]) -> bool:
        term = term.strip()
        if "!=" in term:
            key, value = term.split("!=", 1)
            return labels.get(key.strip()) != value.strip()
        if "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            return labels.get(key.strip()) == value.strip()
        if term.startswith("!"):
            return term[1:].strip() not in labels
        return term in labels

    terms = [t for t in selector.split(",") if t.strip()]
    return {p["metadata"]["name"] for p in pods if terms and all(holds(t, p["metadata"]["labels"]) for t in terms)}


_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def series_selected(query: str, pods: list[dict[str, Any]]) -> set[str]:
    """The pods whose series (labels `namespace`, `pod`, as a PodMonitor scrapes them) every vector selector of the
    PromQL `query` matches; a query without any selector selects nothing."""
    blocks = re.findall(r'vllm:[a-z_:]+\{((?:[^}"]|"(?:[^"\\]|\\.)*")*)\}', query)  # braces inside quotes too
    if not blocks:
        return set()
    chosen: set[str] | None = None
    for block in blocks:
        matchers = _MATCHER.findall(block)
        hit = set()
        for pod in pods:
            labels = {"namespace": pod["metadata"]["namespace"], "pod": pod["metadata"]["name"]}
            ok = True
            for label, op, value in matchers:
                have = labels.get(label, "")
                value = value.encode().decode("unicode_escape")
                if op == "=":
                    ok &= have == value
                elif op == "!=":
                    ok &= have != value
                elif op == "=~":
                    ok &= re.fullmatch(value, have) is not None
                else:
                    ok &= re.fullmatch(value, have) is None
            if ok:
                hit.add(pod["metadata"]["name"])
        chosen = hit if chosen is None else chosen & hit
    return chosen or set()


# --- the shared setup ------------------------------------------------------------------------------------------------

@dataclass
class Seen:
    """What the phases recorded for one combination."""

    workload: dict[str, Any] | None = None
    service: dict[str, Any] | None = None
    k8s_service: dict[str, Any] | None = None
    pool: dict[str, Any] | None = None
    scaled: dict[str, Any] | None = None
    hpa: dict[str, Any] | None = None
    before_scale: dict[str, Any] = field(default_factory=dict)   # remediation status after the step
    after_scale: dict[str, Any] = field(default_factory=dict)    # ... after the scale write
    args_before_scale: list[str] = field(default_factory=list)
    args_after_scale: list[str] = field(default_factory=list)
    after_removal: dict[str, Any] | None = None
    # the Deployment <-> LeaderWorkerSet switch (one pod <-> LWS group combinations)
    switch_old: dict[str, Any] | None = None           # the old workload, as it serves during the switch
    switch_new: dict[str, Any] | None = None           # the new workload, once applied
    service_during_switch: dict[str, Any] | None = None
    old_left: bool = True                              # the old workload still exists at the end
    service_after_switch: dict[str, Any] | None = None


def _containers(workload: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]
    if workload["kind"] == "Deployment":
        templates = [spec["template"]]
    else:
        lwt = spec["leaderWorkerTemplate"]
        templates = [lwt["leaderTemplate"], lwt["workerTemplate"]]
    return [c for t in templates for c in [*t["spec"]["containers"], *(t["spec"].get("initContainers") or [])]]


def _vllm_args(workload: Mapping[str, Any]) -> list[str]:
    return [a for c in _containers(workload) if c["name"] == "vllm" for a in c.get("args") or []]


def _wait_all(h: Cluster, check: Any, what: str, names: list[str] = COMBOS) -> None:
    """Wait until `check(name)` holds for every combination, or the time is up (each test then says which)."""
    started = time.monotonic()
    with contextlib.suppress(AssertionError):
        h.wait_for(lambda: all(check(n) for n in names) or None, TIMEOUT, what)
    print(f"{what}: {time.monotonic() - started:.1f} s")  # noqa: T201 (shown with -s: where the time goes)


def _install(h: Cluster) -> None:
    for file in ("keda.sh_scaledobjects.yaml", "inference.networking.k8s.io_inferencepools.yaml",
                 "leaderworkerset.x-k8s.io_leaderworkersets.yaml"):
        crd = next(d for d in yaml.safe_load_all((CRDS / file).read_text()) if d)
        h.server.create_object("customresourcedefinitions", crd)
    h.server.create_object("storageclasses", {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                              "provisioner": "x", "metadata": {"name": "fast"}})
    h.server.create_object("persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": SHARED_CLAIM, "namespace": NS},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Ti"}}}})
    for i in range(4):
        h.add_node(f"l4-{i}", L4, count=4)
    for i in range(2):
        h.add_node(f"h100-{i}", H100, count=8)


def _create_all(h: Cluster, seen: dict[str, Seen]) -> None:
    for name in COMBOS:
        h.create(name, spec_of(name))
    _wait_all(h, lambda n: _workload(h, n) and h.k8s_service(n) and (h.service(n) or {}).get("status", {}).get(
        "plan"), "every workload, Service and plan")
    h.wait_quiet(1.0, timeout=TIMEOUT)
    for name, s in seen.items():
        s.workload, s.service, s.k8s_service = _workload(h, name), h.service(name), h.k8s_service(name)
        s.pool = h.server.get_object("inferencepools", name, NS)
        s.scaled = h.server.get_object("scaledobjects", name, NS)
        s.hpa = h.server.get_object("horizontalpodautoscalers", name, NS)


def _step_then_scale(h: Cluster, seen: dict[str, Seen]) -> None:
    """One pod of each crashes with no memory left for the KV cache (one ladder step each); then the autoscaler
    writes spec.replicas through the scale subresource."""
    for name, s in seen.items():
        if s.workload is None or s.service is None:
            continue
        pod = pods_of(name, s.workload)[0][0]
        status = h.crashed_status(_containers(s.workload)[0]["image"], restart_count=1,
                                  message=no_kv_crash(s.service), reason="Error", exit_code=1,
                                  ready_before=False)
        h.server.create_object("pods", {"apiVersion": "v1", "kind": "Pod",
                                        "metadata": {**pod["metadata"], "name": f"{pod['metadata']['name']}-c"},
                                        "spec": {**pod["spec"], "nodeName": "l4-0"}, "status": status}, NS)
    _wait_all(h, lambda n: len(history(h.service(n))) >= 1, "a ladder step each")
    h.wait_quiet(1.0, timeout=TIMEOUT)
    for name, s in seen.items():
        s.before_scale = remediation(h.service(name))
        workload = _workload(h, name)
        s.args_before_scale = _vllm_args(workload) if workload else []
    for name in COMBOS:
        if h.service(name) is not None:
            h.custom.patch_namespaced_custom_object_scale(GROUP, VERSION, NS, PLURAL, name, {"spec": {"replicas": 3}})
    _wait_all(h, lambda n: (h.service(n) or {}).get("status", {}).get("observedGeneration") ==
              (h.service(n) or {}).get("metadata", {}).get("generation"), "the scale write reconciled")
    h.wait_quiet(1.0, timeout=TIMEOUT)
    for name, s in seen.items():
        s.after_scale = remediation(h.service(name))
        workload = _workload(h, name)
        s.args_after_scale = _vllm_args(workload) if workload else []


def _remove_settings(h: Cluster, seen: dict[str, Seen]) -> None:
    for name in COMBOS:
        if h.service(name) is not None:
            h.patch_spec(name, {"env": None, "lora": None})
    _wait_all(h, lambda n: (w := _workload(h, n)) is not None and not any(
        MARK in {e["name"] for e in c.get("env") or []} for c in _containers(w)), "the removals applied")
    for name, s in seen.items():
        s.after_removal = _workload(h, name)


SWITCHED = [n for n in COMBOS if not n.startswith("rep")]


def _switch_spec(name: str) -> dict[str, Any]:
    if name.startswith("lws") and "-cache-" in name:
        # onto one pod on the shared claim, as the pods' cache variant (a size would keep a claim per pod: the
        # one-pod groups of a LeaderWorkerSet, no switch)
        return {"model": {"name": QWEN}, "gpu": {"product": L4, "maxNodes": None},
                "modelCache": {"claimName": SHARED_CLAIM, "size": None, "storageClassName": None}}
    if name.startswith("lws"):
        return {"model": {"name": QWEN}, "gpu": {"product": L4, "maxNodes": None}}
    return {"model": {"name": LLAMA_405B}, "gpu": {"product": H100, "maxNodes": 2}}


def _play_ready(h: Cluster, name: str, workload: Mapping[str, Any]) -> None:
    """Play the new workload's controller: every replica (group) ready; an LWS's leader pods appear Ready."""
    n = workload["spec"].get("replicas", 1)
    if workload["kind"] == "Deployment":
        h.server.patch_status("deployments", name, {
            "observedGeneration": workload["metadata"]["generation"], "replicas": n, "updatedReplicas": n,
            "readyReplicas": n, "availableReplicas": n}, NS)
        return
    h.server.patch_status("leaderworkersets", name, {"replicas": n, "readyReplicas": n, "updatedReplicas": n}, NS)
    for pod in pods_of(name, workload)[0]:
        h.server.create_object("pods", {"apiVersion": "v1", "kind": "Pod", **pod,
                                        "status": {"phase": "Running", "conditions": [
                                            {"type": "Ready", "status": "True"}]}}, NS)


def _switch(h: Cluster, seen: dict[str, Seen]) -> None:
    """Each one-pod service moves onto a LWS group and each LWS group onto one pod: the old workload keeps the
    Service until the new one is Ready, then the Service moves and the old workload goes."""
    new_kind = {n: "LeaderWorkerSet" if n.startswith("pod") else "Deployment" for n in SWITCHED}
    resource = {"LeaderWorkerSet": "leaderworkersets", "Deployment": "deployments"}
    for name in SWITCHED:
        seen[name].switch_old = _workload(h, name) if name.startswith("lws") else h.server.get_object(
            "deployments", name, NS)
        h.patch_spec(name, _switch_spec(name))
    _wait_all(h, lambda n: h.server.get_object(resource[new_kind[n]], n, NS) is not None, "the new workloads",
              SWITCHED)
    h.wait_quiet(1.0, timeout=TIMEOUT)
    for name in SWITCHED:
        s = seen[name]
        s.switch_new = h.server.get_object(resource[new_kind[name]], name, NS)
        s.service_during_switch = h.k8s_service(name)
        if s.switch_new is not None:
            _play_ready(h, name, s.switch_new)
    old_kind = {n: "Deployment" if k == "LeaderWorkerSet" else "LeaderWorkerSet" for n, k in new_kind.items()}
    _wait_all(h, lambda n: h.server.get_object(resource[old_kind[n]], n, NS) is None, "the old workloads deleted",
              SWITCHED)
    h.wait_quiet(1.0, timeout=TIMEOUT)
    for name in SWITCHED:
        seen[name].old_left = h.server.get_object(resource[old_kind[name]], name, NS) is not None
        seen[name].service_after_switch = h.k8s_service(name)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Seen]]:
    h = Cluster(tmp_path_factory.mktemp("matrix"))
    try:
        _install(h)
        h.start_operator()
        seen = {name: Seen() for name in COMBOS}
        _create_all(h, seen)
        _step_then_scale(h, seen)
        _remove_settings(h, seen)
        _switch(h, seen)
        yield seen
    finally:
        h.close()


# --- the checks, per combination -------------------------------------------------------------------------------------

def _universe(matrix: dict[str, Seen]) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = []
    for name, s in matrix.items():
        if s.workload is not None:
            serving, others = pods_of(name, s.workload)
            pods.extend(serving + others)
    return pods


@pytest.mark.parametrize("name", COMBOS)
def test_every_selector_and_query_addresses_exactly_the_serving_pods(matrix: dict[str, Seen], name: str) -> None:
    s = matrix[name]
    assert s.workload is not None and s.k8s_service is not None and s.service is not None, "not rendered"
    serving = {p["metadata"]["name"] for p in pods_of(name, s.workload)[0]}
    everyone = _universe(matrix)
    assert selected(s.k8s_service["spec"]["selector"], everyone) == serving, "the Service"
    assert string_selected(s.service["status"]["selector"], everyone) == serving, \
        "status.selector (the HPA's and KEDA's pod metrics)"
    _, scaler, pool, _, _ = name.split("-")
    if pool == "pool":
        assert s.pool is not None
        assert selected(s.pool["spec"]["selector"]["matchLabels"], everyone) == serving, "the InferencePool"
    else:
        assert s.pool is None
    if scaler == "keda":
        assert s.scaled is not None and s.hpa is None
        for trigger in s.scaled["spec"]["triggers"]:
            query = trigger["metadata"]["query"]
            assert series_selected(query, everyone) == serving, f"KEDA trigger {trigger['name']}: {query}"
    elif scaler == "hpa":
        assert s.hpa is not None and s.scaled is None
        assert s.hpa["spec"]["scaleTargetRef"] == {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VLLMService",
                                                   "name": name}
    else:
        assert s.hpa is None and s.scaled is None


@pytest.mark.parametrize("name", COMBOS)
def test_a_scale_write_during_remediation_neither_steps_nor_resets(matrix: dict[str, Seen], name: str) -> None:
    s = matrix[name]
    assert len(s.before_scale.get("history") or []) == 1, f"no ladder step to begin with: {s.before_scale}"
    assert s.before_scale.get("profile"), "the step left no profile"
    assert s.after_scale.get("history") == s.before_scale.get("history"), "the scale write took a step"
    assert s.after_scale.get("profile") == s.before_scale.get("profile"), "the scale write reset the profile"
    assert s.after_scale.get("step") == s.before_scale.get("step")
    assert s.args_after_scale == s.args_before_scale, "the workload went back to the profile that crashed"


@pytest.mark.parametrize("name", COMBOS)
def test_removing_a_setting_removes_it(matrix: dict[str, Seen], name: str) -> None:
    s = matrix[name]
    assert s.workload is not None and s.after_removal is not None
    assert any(MARK in {e["name"] for e in c.get("env") or []} for c in _containers(s.workload))
    assert not any(MARK in {e["name"] for e in c.get("env") or []} for c in _containers(s.after_removal))
    if name.endswith("-lora"):
        assert "--enable-lora" in _vllm_args(s.workload)
    assert "--enable-lora" not in _vllm_args(s.after_removal)
    assert not any(a.startswith("sql=") for a in _vllm_args(s.after_removal))


def endpoints(service: Mapping[str, Any], pods: list[dict[str, Any]], ready: set[str]) -> set[str]:
    """The pods a Service sends traffic to: selected by its labels, Ready, and — for a named targetPort — with a
    container port of that name (the EndpointSlice controller skips a pod without it: the LWS workers)."""
    target = service["spec"]["ports"][0].get("targetPort")
    out = set()
    for name in selected(service["spec"]["selector"], pods) & ready:
        pod = next(p for p in pods if p["metadata"]["name"] == name)
        ports = {port.get("name") for c in pod["spec"]["containers"] for port in c.get("ports") or []}
        if not isinstance(target, str) or target in ports:
            out.add(name)
    return out


@pytest.mark.parametrize("name", SWITCHED)
def test_a_switch_keeps_the_service_reachable(matrix: dict[str, Seen], name: str) -> None:
    """While the new workload starts (its pods run, none Ready yet) the Service sends traffic to exactly the old
    workload's serving pods; once the new one is Ready, to exactly its serving pods, and the old workload is gone."""
    s = matrix[name]
    assert s.switch_old is not None and s.switch_new is not None, "the new workload was not applied"
    old_pods, old_others = pods_of(name, s.switch_old)
    new_pods, new_others = pods_of(name, s.switch_new)
    old_serving = {p["metadata"]["name"] for p in old_pods}
    new_serving = {p["metadata"]["name"] for p in new_pods}
    assert s.service_during_switch is not None
    running = old_pods + old_others + new_pods + new_others
    ready_then = {p["metadata"]["name"] for p in old_pods + old_others}
    assert endpoints(s.service_during_switch, running, ready_then) == old_serving, "during the switch"
    assert not s.old_left, "the old workload was not deleted once the new one was Ready"
    assert s.service_after_switch is not None
    now = new_pods + new_others
    assert endpoints(s.service_after_switch, now, {p["metadata"]["name"] for p in now}) == new_serving, "after"
    # and by labels alone (what an InferencePool or a `kubectl get pods -l` sees): exactly the new serving pods
    assert selected(s.service_after_switch["spec"]["selector"], now) == new_serving
