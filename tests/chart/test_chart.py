"""The Helm chart, the operator image's Dockerfile and the install docs.

`helm lint --strict` and `helm template` run with the default values and every file in charts/tests-values;
each rendered manifest is validated against Kubernetes 1.33's schemas (kubernetes-validate, strict), custom
resources against their CRDs or a minimal schema. The RBAC rules are checked against the operator's real calls in
test_rbac.py.
"""

from __future__ import annotations

import json
import re
import shlex
import typing
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement

from vllm_operator.cli import build_parser
from vllm_operator.planner.gpus import GPUSpec, load_gpu_catalog
from vllm_operator.render.manifests import OwnerRef, RenderInput, build_deployment, labels_for

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "vllm-operator"
VALUES_FILES: list[str | None] = [None, *sorted(p.name for p in (ROOT / "charts" / "tests-values").glob("*.yaml"))]
VALUES_IDS = ["defaults" if v is None else v.removesuffix(".yaml") for v in VALUES_FILES]
KUBE_VERSION = "1.33"


def _values(values: str | None) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    if values is not None:
        _merge(data, yaml.safe_load((ROOT / "charts" / "tests-values" / values).read_text()))
    return data


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def _args(container: dict[str, Any]) -> dict[str, list[str]]:
    """`--flag=value` arguments as {flag: [values]} (flags without a value map to [''])."""
    found: dict[str, list[str]] = {}
    for arg in container["args"][1:]:
        flag, _, value = arg.partition("=")
        found.setdefault(flag, []).append(value)
    return found


# --- CRDs ------------------------------------------------------------------------------------------------------


def test_chart_crd_is_the_generated_crd() -> None:
    generated = ROOT / "crds" / "vllmservices.vllm-operator.dev.yaml"
    copy = CHART / "crds" / generated.name
    assert copy.read_bytes() == generated.read_bytes(), (
        "charts/vllm-operator/crds/ has a stale copy of the CRD; run: "
        "cp crds/vllmservices.vllm-operator.dev.yaml charts/vllm-operator/crds/")
    assert sorted(p.name for p in CHART.glob("crds/*.yaml")) == sorted(
        [generated.name, "kopf-peering.kopf.dev.yaml"]), "unexpected files in the chart's crds/"


def test_peering_crds_are_the_resources_kopf_uses() -> None:
    from kopf._cogs.structs import references

    crds = list(yaml.safe_load_all((CHART / "crds" / "kopf-peering.kopf.dev.yaml").read_text()))
    served = [references.Resource(group=c["spec"]["group"], version=v["name"], plural=c["spec"]["names"]["plural"],
                                  kind=c["spec"]["names"]["kind"], singular=c["spec"]["names"]["singular"],
                                  namespaced=c["spec"]["scope"] == "Namespaced", verbs=["list", "watch", "patch"])
              for c in crds for v in c["spec"]["versions"] if v["served"]]
    for selector, namespaced in ((references.CLUSTER_PEERINGS_K, False), (references.NAMESPACED_PEERINGS_K, True)):
        assert [r.namespaced for r in served if selector.check(r)] == [namespaced], selector
    for crd in crds:  # kopf writes its peers under status, without a status subresource
        version = crd["spec"]["versions"][0]
        assert "subresources" not in version
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True


# --- lint, render, validate -------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUES_FILES, ids=VALUES_IDS)
def test_helm_lint_strict(chart: Any, values: str | None) -> None:
    args = ["lint", "--strict", str(CHART), "--kube-version", chart.kube_version]
    if values is not None:
        args += ["--values", str(chart.test_values / values)]
    result = chart.helm(*args)
    assert result.returncode == 0, result.stdout + result.stderr


# The prometheus-operator CRDs are not in kubernetes-validate: the fields this chart uses, as the CRDs define them.
_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_LABEL_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
    "matchExpressions": {"type": "array"}}}
_NAMESPACE_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}}


def _monitor_schema(kind: str, endpoints: str) -> dict[str, Any]:
    endpoint = {"type": "object", "additionalProperties": False, "required": ["port"], "properties": {
        "port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"},
        "interval": {"type": "string", "pattern": _DURATION},
        "scrapeTimeout": {"type": "string", "pattern": _DURATION}}}
    return {"type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {
                "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": kind},
                "metadata": {"type": "object", "required": ["name", "namespace"]},
                "spec": {"type": "object", "additionalProperties": False, "required": ["selector", endpoints],
                         "properties": {"selector": _LABEL_SELECTOR, "namespaceSelector": _NAMESPACE_SELECTOR,
                                        endpoints: {"type": "array", "minItems": 1, "items": endpoint}}}}}


CUSTOM_SCHEMAS = {
    "ServiceMonitor": _monitor_schema("ServiceMonitor", "endpoints"),
    "PodMonitor": _monitor_schema("PodMonitor", "podMetricsEndpoints"),
}


def _peering_schemas() -> dict[str, dict[str, Any]]:
    crds = yaml.safe_load_all((CHART / "crds" / "kopf-peering.kopf.dev.yaml").read_text())
    return {c["spec"]["names"]["kind"]: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"] for c in crds}


@pytest.mark.parametrize("values", VALUES_FILES, ids=VALUES_IDS)
def test_rendered_manifests_are_valid_kubernetes_1_33(chart: Any, values: str | None) -> None:
    objects = chart.objects(values, include_crds=True)
    peering = _peering_schemas()
    kinds = set()
    for obj in objects:
        kinds.add(obj["kind"])
        where = f"{obj['kind']} {obj['metadata'].get('name')}"
        if obj["kind"] in CUSTOM_SCHEMAS:
            jsonschema.validate(obj, CUSTOM_SCHEMAS[obj["kind"]])
        elif obj["kind"] in peering:
            assert obj["apiVersion"] == "kopf.dev/v1", where
            jsonschema.validate(obj, peering[obj["kind"]])
        else:
            try:
                kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where} is not valid for Kubernetes {KUBE_VERSION}: {exc.message} at {list(exc.path)}")
        if obj["kind"] not in ("CustomResourceDefinition",):
            assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == chart.release, where
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= kinds


@pytest.mark.parametrize("values", VALUES_FILES, ids=VALUES_IDS)
def test_rendering_is_deterministic(chart: Any, values: str | None) -> None:
    """Same values, same bytes (GitOps): render twice in separate helm processes."""
    first = chart.helm(*chart.template_args(values, include_crds=True))
    second = chart.helm(*chart.template_args(values, include_crds=True))
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout


def test_templates_use_nothing_random_or_time_dependent() -> None:
    forbidden = re.compile(r"\b(rand\w*|uuidv4|now|date\w*|genCA|genPrivateKey|genSelfSigned\w*|genSigned\w*|lookup|"
                           r"htpasswd|shuffle)\b")
    for path in sorted((CHART / "templates").iterdir()):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for action in re.findall(r"{{(.*?)}}", line):
                assert not forbidden.search(action), f"{path.name}:{number}: {line.strip()}"


@pytest.mark.parametrize("values", VALUES_FILES, ids=VALUES_IDS)
def test_operator_args_are_accepted_by_the_cli(chart: Any, values: str | None) -> None:
    container = chart.operator_container(chart.objects(values))
    assert container["args"][0] == "run"
    args = build_parser().parse_args(container["args"])  # exits 2 on an unknown flag
    assert args.func.__name__ == "cmd_run"


def test_default_vllm_image_is_passed_to_the_operator(chart: Any) -> None:
    container = chart.operator_container(chart.objects(sets=["defaultVLLMImage=vllm/vllm-openai:v0.11.0"]))
    assert "--default-image=vllm/vllm-openai:v0.11.0" in container["args"]
    args = build_parser().parse_args(container["args"])
    assert args.default_image == "vllm/vllm-openai:v0.11.0"


# --- what the defaults install ----------------------------------------------------------------------------------


def test_default_deployment(chart: Any) -> None:
    objects = chart.objects()
    deployment = chart.one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = chart.operator_container(objects)
    app_version = chart.chart_yaml()["appVersion"]

    assert container["image"] == f"ghcr.io/vllm-operator/vllm-operator:{app_version}"
    assert deployment["spec"]["replicas"] == 1  # a standby's takeover is not yet reliable (test_rbac.py)
    args = _args(container)
    assert args["--all-namespaces"] == [""]
    assert args["--peering"] == ["vllm-operator"]
    assert "--standalone" not in args
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"

    # Probes hit the endpoint the operator serves (--liveness URL) through the named container port.
    liveness = urlparse(args["--liveness"][0])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == liveness.port == 8080 and liveness.hostname == "0.0.0.0"
    assert ports["metrics"] == int(args["--metrics-port"][0]) == 9090
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": liveness.path, "port": "health"}

    # Non-root, read-only root filesystem, no capabilities.
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    env = {e["name"]: e for e in container["env"]}
    assert "/tmp" in mounts  # writable scratch on a read-only root filesystem
    assert any(env["HF_HOME"]["value"].startswith(m + "/") for m in mounts), "the hub cache must be writable"
    assert env["POD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # kopf's peer identity

    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    assert pod["serviceAccountName"] == chart.one(objects, "ServiceAccount")["metadata"]["name"]

    # The peering object the operator needs (kopf does not create it, and pauses without it).
    peering = chart.one(objects, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "vllm-operator"
    assert not chart.find(objects, "KopfPeering")
    assert not chart.find(objects, "PodDisruptionBudget")  # one replica: a budget would block node drains
    two = chart.objects(sets=["replicaCount=2"])
    assert chart.one(two, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert chart.one(two, "Deployment")["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]

    # A metrics Service whose port reaches the container's metrics port.
    service = chart.one(objects, "Service")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]


def test_single_replica_without_peering(chart: Any) -> None:
    objects = chart.objects("single-replica.yaml")
    deployment = chart.one(objects, "Deployment")
    args = _args(chart.operator_container(objects))
    assert deployment["spec"]["replicas"] == 1
    assert "--standalone" in args and "--peering" not in args
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # never two operators, even during an upgrade
    for kind in ("ClusterKopfPeering", "KopfPeering", "PodDisruptionBudget", "Service"):
        assert not chart.find(objects, kind), kind
    rules = chart.one(objects, "ClusterRole")["rules"]
    assert not [r for r in rules if "kopf.dev" in r["apiGroups"]]
    assert [r["metadata"]["name"] for r in chart.find(objects, "ClusterRole")] == [chart.release]


def test_namespaced_rbac(chart: Any) -> None:
    objects = chart.objects("namespaced.yaml")
    args = _args(chart.operator_container(objects))
    assert args["--namespace"] == ["team-a", "team-b"] and "--all-namespaces" not in args
    sa = chart.one(objects, "ServiceAccount")["metadata"]
    for namespace in ("team-a", "team-b"):
        role = [o for o in chart.find(objects, "Role") if o["metadata"]["namespace"] == namespace]
        binding = [o for o in chart.find(objects, "RoleBinding") if o["metadata"]["namespace"] == namespace]
        assert len(role) == len(binding) == 1, namespace
        assert binding[0]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                         "name": role[0]["metadata"]["name"]}
        assert binding[0]["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"],
                                           "namespace": sa["namespace"]}]
        resources = {res for rule in role[0]["rules"] for res in rule["resources"]}
        assert {"vllmservices", "deployments", "pods", "kopfpeerings"} <= resources
        # spec.model.configMapRef (and spec.hfTokenSecretRef) is read, and a share group's record
        # (vllm-share-<group>) written, in the service's own namespace: configmaps there, nowhere else
        assert [(r["resources"], r["verbs"]) for r in role[0]["rules"] if "configmaps" in r["resources"]] == [
            (["configmaps", "secrets"], ["get"]), (["configmaps"], ["get", "create", "patch"])]
        peerings = [o for o in chart.find(objects, "KopfPeering") if o["metadata"]["namespace"] == namespace]
        assert [p["metadata"]["name"] for p in peerings] == ["vllm-operator"]
    assert len(chart.find(objects, "Role")) == 2 and not chart.find(objects, "ClusterKopfPeering")
    # The operator's ClusterRole keeps only the cluster-scoped reads (no configmaps, no secrets cluster-wide).
    assert not [r for r in chart.find(objects, "ClusterRole") for rule in r["rules"]
                if {"configmaps", "secrets"} & set(rule["resources"])]
    operator_role = chart.one(objects, "ClusterRole", chart.release)
    assert {(res, verb) for rule in operator_role["rules"] for res in rule["resources"] for verb in rule["verbs"]} == {
        ("nodes", "list"), ("namespaces", "list"), ("namespaces", "watch"), ("storageclasses", "list"),
        ("customresourcedefinitions", "list"), ("customresourcedefinitions", "watch"), ("deviceclasses", "list")}
    pod_monitor_namespaces = chart.objects("namespaced.yaml", sets=["monitoring.podMonitor.enabled=true"])
    assert chart.one(pod_monitor_namespaces, "PodMonitor")["spec"]["namespaceSelector"] == {
        "matchNames": ["team-a", "team-b"]}


def test_aggregated_roles_for_people(chart: Any) -> None:
    roles = {r["metadata"]["name"]: r for r in chart.find(chart.objects(), "ClusterRole")}
    edit, view = roles[f"{chart.release}-edit"], roles[f"{chart.release}-view"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert {v for r in view["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    # bound to nobody by the chart: only the built-in roles aggregate them
    bound = {b["roleRef"]["name"] for b in chart.find(chart.objects(), "ClusterRoleBinding")}
    assert bound == {chart.release}


def test_monitoring(chart: Any) -> None:
    objects = chart.objects("monitoring.yaml")
    service = chart.one(objects, "Service")
    monitor = chart.one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [chart.namespace]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"

    pod_monitor = chart.one(objects, "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}
    # It selects the pods the operator renders, on the port vLLM serves /metrics on.
    selector = pod_monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels_for("any-service").items()
    assert [e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]] == ["http"]
    ports = build_deployment(RenderInput(
        name="any-service", namespace="ns", owner=OwnerRef(name="any-service", uid="u"), model="org/model",
        image="vllm/vllm-openai:v0.26.0", vllm_version="0.26.0", flags={}))["spec"]["template"]["spec"][
        "containers"][0]["ports"]
    assert "http" in [p["name"] for p in ports], "the vLLM container no longer has port 'http'"


def test_grafana_dashboards_configmap(chart: Any) -> None:
    dashboards = sorted((CHART / "dashboards").glob("*.json")) if (CHART / "dashboards").is_dir() else []
    found = chart.find(chart.objects("monitoring.yaml"), "ConfigMap")
    if not dashboards:
        assert not found, "no dashboards in the chart, no ConfigMap"
        return
    config_map = chart.one(found, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert sorted(config_map["data"]) == [p.name for p in dashboards]
    for path in dashboards:
        assert json.loads(config_map["data"][path.name]) == json.loads(path.read_text())
    assert len(json.dumps(config_map).encode()) < 1024 * 1024, "a ConfigMap holds at most 1 MiB"


def test_gpu_catalog_overrides_and_prometheus(chart: Any) -> None:
    values = _values("gpu-catalog-prometheus.yaml")
    objects = chart.objects("gpu-catalog-prometheus.yaml")
    container = chart.operator_container(objects)
    deployment = chart.one(objects, "Deployment")
    args = _args(container)

    config_map = chart.one(objects, "ConfigMap", f"{chart.release}-gpu-catalog")
    rows = yaml.safe_load(config_map["data"]["gpus.yaml"])
    assert rows == values["gpuCatalog"]["overrides"]
    catalog = load_gpu_catalog(rows)  # what the operator does at startup: it refuses bad rows
    assert catalog.get("L4").default_utilization == 0.88
    assert catalog.get("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition").name == "RTX-PRO-6000-Blackwell"

    path = Path(args["--gpu-catalog"][0])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "gpu-catalog")
    assert mount["mountPath"] == str(path.parent) and mount["readOnly"] is True
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "gpu-catalog")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"] and path.name in config_map["data"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/gpu-catalog"])  # a catalog change rolls the pods

    assert args["--prometheus-url"] == ["http://prometheus-operated.monitoring.svc:9090"]
    assert args["--verbose"] == [""]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}
    assert env["HF_ENDPOINT"]["value"] == "https://hf-mirror.internal.example"
    assert container["image"] == "ghcr.io/vllm-operator/vllm-operator:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"

    other = chart.objects("gpu-catalog-prometheus.yaml",
                          sets=['json:gpuCatalog.overrides=[{"name": "L4", "default_utilization": 0.85}]'])
    changed = chart.one(other, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert changed["checksum/gpu-catalog"] != annotations["checksum/gpu-catalog"]


def test_app_version_is_the_package_version() -> None:
    """The default image tag is the chart's appVersion: keep it the operator's version."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == project["version"]


def test_image_digest_pins_the_image(chart: Any) -> None:
    digest = "sha256:" + "a" * 64
    container = chart.operator_container(chart.objects(sets=[f"image.digest={digest}"]))
    assert container["image"] == f"ghcr.io/vllm-operator/vllm-operator@{digest}"


# --- values.schema.json -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sets", "message"), [
    (["unknownValue=1"], "additional properties 'unknownValue' not allowed"),
    (["image.registry=docker.io"], "additional properties 'registry' not allowed"),
    (["peering.enabled=false", "replicaCount=2"], "replicaCount"),  # two replicas without peering would both act
    (["watchNamespaces[0]=Team_A"], "watchNamespaces"),
    (["gpuCatalog.overrides[0].name=L4", "gpuCatalog.overrides[0].memory=24"], "memory"),
    (["gpuCatalog.overrides[0].name=L4", "gpuCatalog.overrides[0].tier=cloud"], "tier"),
    (["prometheus.url=prometheus:9090"], "prometheus"),
], ids=["top-level", "nested", "replicas-without-peering", "namespace-name", "gpu-field", "gpu-enum", "url"])
def test_schema_rejects_bad_values(chart: Any, sets: list[str], message: str) -> None:
    result = chart.helm(*chart.template_args(sets=sets))
    assert result.returncode != 0, f"{sets} rendered"
    assert message in result.stderr, result.stderr


def test_schema_is_strict_at_the_top_level() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert sorted(values) == sorted(k for k in schema["properties"] if k != "global"), "values.yaml vs schema"
    jsonschema.validate(values, schema)


def test_schema_gpu_rows_match_the_planner() -> None:
    """The schema's GPU override fields are GPUSpec's, so the chart neither rejects nor lets through what the
    operator would not."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    row = schema["properties"]["gpuCatalog"]["properties"]["overrides"]["items"]
    # utilization_set is the operator's own mark that an override set default_utilization, not a value to give
    assert set(row["properties"]) == set(GPUSpec.model_fields) - {"utilization_set"}
    for field in ("arch", "tier"):
        assert row["properties"][field]["enum"] == list(typing.get_args(GPUSpec.model_fields[field].annotation))


# --- NOTES.txt --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, "namespaced.yaml", "monitoring.yaml"], ids=["defaults", "namespaced",
                                                                                       "monitoring"])
def test_notes_tell_what_to_do_next(chart: Any, values: str | None) -> None:
    args = ["install", chart.release, str(CHART), "--namespace", chart.namespace, "--dry-run=client"]
    if values is not None:
        args += ["--values", str(chart.test_values / values)]
    result = chart.helm(*args)
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "examples/minimal.yaml" in notes and "kubectl get vllms" in notes
    assert "nvidia.com/gpu.product" in notes
    assert "dashboards" in notes.lower()
    if values == "namespaced.yaml":
        assert "team-a, team-b" in notes and "-n team-a" in notes


# --- Dockerfile -------------------------------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comments dropped and continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        instructions.append((keyword.upper(), " ".join(rest.split())))
        pending = ""
    return instructions


def _stages() -> list[dict[str, Any]]:
    instructions = _dockerfile()
    args = {}
    for keyword, rest in instructions:
        if keyword == "FROM":
            break
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
    stages: list[dict[str, Any]] = []
    for keyword, rest in instructions:
        if keyword == "FROM":
            words = rest.split()
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], words[0])
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append({"image": image, "alias": alias, "instructions": []})
        elif stages:
            stages[-1]["instructions"].append((keyword, rest))
    return stages


def test_dockerfile_is_multi_stage_and_builds_a_wheel() -> None:
    stages = _stages()
    assert len(stages) >= 2
    builder, runtime = stages[0], stages[-1]
    assert builder["alias"] == "builder"
    assert runtime["image"] == "python:3.11-slim" and builder["image"] == "python:3.11-slim"
    builder_runs = " ".join(rest for keyword, rest in builder["instructions"] if keyword == "RUN")
    assert "build --wheel" in builder_runs
    runtime_runs = [rest for keyword, rest in runtime["instructions"] if keyword == "RUN"]
    assert any("from=builder" in run and "--no-index" in run for run in runtime_runs), (
        "the runtime stage installs only the wheels the builder made")
    assert not [rest for keyword, rest in runtime["instructions"] if keyword == "COPY" and "from=builder" not in rest]


def test_dockerfile_runs_the_operator_as_non_root() -> None:
    runtime = _stages()[-1]
    users = [rest for keyword, rest in runtime["instructions"] if keyword == "USER"]
    assert users, "no USER in the runtime stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) == 10001, "a numeric non-root uid (runAsNonRoot checks it)"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    entrypoint = [rest for keyword, rest in runtime["instructions"] if keyword == "ENTRYPOINT"]
    cmd = [rest for keyword, rest in runtime["instructions"] if keyword == "CMD"]
    assert json.loads(entrypoint[-1]) == ["vllm-operator"]
    assert json.loads(cmd[-1]) == ["run", "--all-namespaces"]
    assert build_parser().parse_args(json.loads(cmd[-1])).all_namespaces is True


def test_dockerfile_installs_no_vllm_or_torch() -> None:
    for stage in _stages():
        for keyword, rest in stage["instructions"]:
            if keyword != "RUN" or "pip" not in rest:
                continue
            for command in re.split(r"&&|;", rest):
                words = shlex.split(command)
                if "install" not in words and "wheel" not in words:
                    continue
                for word in words:
                    name = re.split(r"[\[<>=!~ ]", word, maxsplit=1)[0].lower()
                    assert name not in ("vllm", "torch", "torchvision", "torchaudio"), command
                    assert not word.startswith("vllm-operator["), f"no extras in the image: {command}"


def test_image_dependencies_have_no_vllm_or_torch() -> None:
    """What `pip install vllm-operator` (no extras) pulls in, from the installed metadata."""
    seen: set[str] = set()
    todo = ["vllm-operator"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # a platform-specific dependency not installed here
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(re.sub(r"[-_.]+", "-", requirement.name).lower())
    assert {"kopf", "kubernetes", "pydantic"} <= seen
    assert not {name for name in seen if name in ("vllm", "torch") or name.startswith("nvidia-")}, sorted(seen)


def test_dockerignore_keeps_what_the_build_copies() -> None:
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "**", "start from nothing, then allow what the build needs"
    copied = [rest.split()[:-1] for keyword, rest in _stages()[0]["instructions"] if keyword == "COPY"]
    for sources in copied:
        for source in sources:
            assert f"!{source}" in ignore, f"{source} is copied but excluded by .dockerignore"


# --- docs/install.md --------------------------------------------------------------------------------------------

DOCS = ROOT / "docs" / "install.md"
ECOSYSTEM = ROOT / "docs" / "ecosystem.md"  # GitOps (Argo CD, Flux) lives there


def _doc_yaml_blocks() -> list[Any]:
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", ECOSYSTEM.read_text(), re.S)]


def test_docs_install_commands_and_columns() -> None:
    text = DOCS.read_text()
    assert "helm install vllm-operator ./charts/vllm-operator -n vllm-operator --create-namespace" in text
    assert "kubectl apply -f examples/minimal.yaml" in text
    for label in ("nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/gpu.count"):
        assert f"`{label}`" in text
    crd = yaml.safe_load((ROOT / "crds" / "vllmservices.vllm-operator.dev.yaml").read_text())
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    default = [c["name"] for c in columns if not c.get("priority")]
    header = next(line for line in text.splitlines() if line.startswith("NAME "))
    assert header.split()[1:] == [c.upper() for c in default], "the sample `kubectl get vllms` output is stale"
    for column in columns:
        assert f"**{column['name']}**" in text, f"column {column['name']} is not explained"


def test_docs_argocd_ignore_differences() -> None:
    app = next(b for b in _doc_yaml_blocks() if (b or {}).get("kind") == "Application")
    ignored = {entry["kind"]: entry for entry in app["spec"]["ignoreDifferences"]}
    service = ignored["VLLMService"]
    assert service["group"] == "vllm-operator.dev"
    # What kopf writes (handlers/service.py operator_startup): the finalizer and the diff-base annotation.
    assert service["jsonPointers"] == ["/metadata/annotations/vllm-operator.dev~1last-handled-configuration"]
    assert "vllm-operator.dev/finalizer" in service["jqPathExpressions"][0]
    source = (ROOT / "operator" / "vllm_operator" / "handlers" / "service.py").read_text()
    assert 'finalizer = "vllm-operator.dev/finalizer"' in source
    assert 'prefix="vllm-operator.dev", key="last-handled-configuration"' in source
    assert "RespectIgnoreDifferences=true" in app["spec"]["syncPolicy"]["syncOptions"]


def _condition(type_: str, status: str, reason: str, generation: int = 1, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message or f"{type_} {reason}",
            "observedGeneration": generation, "lastTransitionTime": "2025-01-01T00:00:00Z"}


def _service(*conditions: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService",
                           "metadata": {"name": "qwen", "namespace": "default", "generation": generation},
                           "spec": {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}}}
    if conditions:
        obj["status"] = {"conditions": list(conditions)}
    return obj


HEALTH_CASES = [
    (_service(), "Progressing"),
    (_service(_condition("Ready", "True", "Available"), _condition("Degraded", "False", "AsExpected")), "Healthy"),
    (_service(_condition("Ready", "False", "PlanInfeasible"), _condition("Degraded", "True", "PlanInfeasible"),
              _condition("Progressing", "False", "PlanInfeasible")), "Degraded"),
    (_service(_condition("Ready", "False", "CUDAOutOfMemory"),
              _condition("Degraded", "True", "RemediationExhausted")), "Degraded"),
    (_service(_condition("Degraded", "True", "InvalidSpec")), "Degraded"),
    (_service(_condition("Ready", "False", "Deploying"), _condition("Progressing", "True", "Deploying")),
     "Progressing"),
    (_service(_condition("Ready", "False", "KVCacheTooSmall"), _condition("Degraded", "True", "Remediating"),
              _condition("Progressing", "True", "Remediating")), "Progressing"),
    (_service(_condition("Ready", "False", "PodsNotReady")), "Progressing"),
    # every reason that needs a person maps to Degraded, whatever Ready says
    (_service(_condition("Degraded", "True", "ModelNotFound"), _condition("PlanFeasible", "Unknown", "ModelNotFound")),
     "Degraded"),
    (_service(_condition("Ready", "True", "Available"), _condition("Degraded", "True", "RemediationExhausted")),
     "Degraded"),  # exhausted while an older pod still serves
    (_service(_condition("Ready", "False", "ServingPreviousProfile"), _condition("Progressing", "True", "Unschedulable"),
              _condition("Degraded", "True", "Unschedulable")), "Degraded"),
    (_service(_condition("Ready", "False", "ServingPreviousProfile"),
              _condition("Progressing", "False", "ProgressDeadlineExceeded"),
              _condition("Degraded", "True", "ProgressDeadlineExceeded")), "Degraded"),
    (_service(_condition("Degraded", "True", "ReconcileError")), "Degraded"),
    (_service(_condition("Degraded", "True", "ChildRejected")), "Degraded"),
    (_service(_condition("Degraded", "True", "GPUNotFound")), "Degraded"),
    (_service(_condition("Ready", "False", "ServingPreviousProfile"), _condition("Progressing", "True", "Deploying"),
              _condition("Degraded", "False", "AsExpected")), "Progressing"),
    # the model-download init container: running → Progressing, failed → Degraded (also while an old pod serves)
    (_service(_condition("Ready", "False", "Downloading"), _condition("Progressing", "True", "Downloading")),
     "Progressing"),
    (_service(_condition("Ready", "False", "ModelDownloadFailed"), _condition("Progressing", "True", "ModelDownloadFailed"),
              _condition("Degraded", "True", "ModelDownloadFailed")), "Degraded"),
    (_service(_condition("Ready", "False", "ServingPreviousProfile"),
              _condition("Progressing", "True", "ModelDownloadFailed"),
              _condition("Degraded", "True", "ModelDownloadFailed")), "Degraded"),
    # conditions of an older generation: the operator has not looked at the new spec yet
    (_service(_condition("Ready", "True", "Available", generation=1), generation=2), "Progressing"),
    (_service(_condition("Degraded", "True", "PlanInfeasible", generation=1), generation=2), "Progressing"),
]


@pytest.mark.parametrize(("obj", "expected"), HEALTH_CASES)
def test_argocd_health_check(argocd_health: Any, obj: dict[str, Any], expected: str) -> None:
    health = argocd_health(obj)
    assert health["status"] == expected
    assert health["message"]


def _download_service(init: dict[str, Any], model_cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """A VLLMService whose status the operator's own rollout code computed for a pod in its model-download phase."""
    from datetime import UTC, datetime

    from vllm_operator.api import conditions as cond
    from vllm_operator.api import rollout
    from vllm_operator.api.labels import ANNOTATION_PLAN

    deployment = {"metadata": {"generation": 1}, "spec": {"replicas": 1, "template": {
        "metadata": {"annotations": {ANNOTATION_PLAN: "p"}}}},
        "status": {"observedGeneration": 1, "updatedReplicas": 1, "replicas": 1}}
    pod = {"metadata": {"name": "qwen-abc", "annotations": {ANNOTATION_PLAN: "p"}},
           "status": {"phase": "Pending", "initContainerStatuses": [{"name": "model-download", **init}],
                      "containerStatuses": [{"name": "vllm", "ready": False,
                                             "state": {"waiting": {"reason": "PodInitializing"}}}]}}
    before = {"modelCache": model_cache} if model_cache else {}
    status = cond.fold_status(before, conditions=rollout.rollout_conditions(rollout.assess(deployment, [pod]), before),
                              observed_generation=1, now=datetime(2025, 1, 1, tzinfo=UTC))
    obj = _service()
    obj["status"] = status.to_dict()
    return obj


def test_argocd_health_of_the_download_statuses_the_operator_computes(argocd_health: Any) -> None:
    running = _download_service({"state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}}})
    assert running["status"]["state"] == "Downloading"
    health = argocd_health(running)
    assert health["status"] == "Progressing" and "downloading the model into the cache: pod qwen-abc" in \
        health["message"]
    failed = _download_service({"restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}},
                               {"downloadError": "GatedRepoError: 401", "downloadErrorPod": "qwen-abc"})
    assert failed["status"]["state"] == "ModelDownloadFailed"
    health = argocd_health(failed)
    assert health["status"] == "Degraded" and health["message"].startswith("ModelDownloadFailed: ")
    assert "GatedRepoError: 401" in health["message"]


def test_argocd_health_check_text(argocd_health_script: str) -> None:
    """Without a Lua interpreter: at least the script names every outcome and reason it promises."""
    script = argocd_health_script
    for word in ('"Healthy"', '"Degraded"', '"Progressing"', '"Remediating"', "observedGeneration", "return hs"):
        assert word in script


def test_the_model_download_init_container_is_switchable(chart: Any) -> None:
    """On by default (README: with a persistent cache); `modelCache.downloadInit=false` passes the negation."""
    default = chart.operator_container(chart.objects())["args"]
    off = chart.operator_container(chart.objects(sets=["modelCache.downloadInit=false"]))["args"]
    assert "--model-cache-download-init" in default and "--no-model-cache-download-init" in off
    assert build_parser().parse_args(default).model_cache_download_init is True
    assert build_parser().parse_args(off).model_cache_download_init is False


# --- issue 20: tenants' model sources and the operator's hub token ---------------------------------------------------


def _reads(rules: list[dict[str, Any]]) -> set[str]:
    return {r for rule in rules if "get" in rule["verbs"] for r in rule["resources"] if r in ("configmaps", "secrets")}


def test_model_sources_are_read_only_in_the_listed_namespaces(chart: Any) -> None:
    """`get configmaps/secrets` was cluster-wide; with rbac.modelSourceNamespaces it is a Role in each listed
    namespace. What stays where the operator watches is the share groups' own record (`vllm-share-<group>`
    ConfigMaps: get, create, patch), never secrets."""
    default = chart.objects()
    assert _reads(chart.one(default, "ClusterRole", "vllm-operator")["rules"]) == {"configmaps", "secrets"}
    for sets in (["json:rbac.modelSourceNamespaces=[\"team-a\",\"team-b\"]"],
                 ["json:rbac.modelSourceNamespaces=[\"team-a\",\"team-b\"]", "json:watchNamespaces=[\"x\",\"team-a\"]"]):
        objects = chart.objects(sets=sets)
        assert _reads(chart.one(objects, "ClusterRole", "vllm-operator")["rules"]) <= {"configmaps"}
        roles = {r["metadata"]["namespace"]: r for r in chart.find(objects, "Role")
                 if r["metadata"]["name"].endswith("-model-sources")}
        assert sorted(roles) == ["team-a", "team-b"]
        assert all(_reads(role["rules"]) == {"configmaps", "secrets"} for role in roles.values())
        assert not [r for r in chart.find(objects, "Role") if not r["metadata"]["name"].endswith("-model-sources")
                    and _reads(r["rules"]) - {"configmaps"}]
        bindings = {b["metadata"]["namespace"] for b in chart.find(objects, "RoleBinding")
                    if b["metadata"]["name"].endswith("-model-sources")}
        assert bindings == {"team-a", "team-b"}


def test_the_operator_hub_token_serves_all_namespaces_only_when_allowed(chart: Any) -> None:
    env = {e["name"]: e for e in chart.operator_container(chart.objects(
        sets=["hfToken.existingSecret=hf"]))["env"]}
    assert "HF_TOKEN" in env and "VLLM_OPERATOR_HUB_TOKEN_FOR_ALL_NAMESPACES" not in env
    env = {e["name"]: e for e in chart.operator_container(chart.objects(
        sets=["hfToken.existingSecret=hf", "hfToken.forAllNamespaces=true"]))["env"]}
    assert env["VLLM_OPERATOR_HUB_TOKEN_FOR_ALL_NAMESPACES"]["value"] == "true"
