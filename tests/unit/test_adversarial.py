"""Property-based: generated VLLMService specs, valid and hostile, through the reconcile core (issue 10).

Every field of the spec is generated (the generators walk the pydantic models; a field without a valid-value pool
fails `test_every_spec_field_has_a_valid_generator`). Zero exceptions escape `desired_state`; no spec ends in the
InternalError safety net; every service is answered (a Degraded condition and a Warning event with its reason;
a rejection names its field and says what to write, never a bare pattern); nothing is fetched for an invalid spec;
every rendered child is valid for a real API server (`kubernetes-validate` strict for built-in kinds, the upstream
CRDs for LeaderWorkerSet, ScaledObject and InferencePool, nothing they would prune) and for what the server checks
beyond the schema (distinct mount paths, a positive HPA target); no key the renderer's full reference rendering
lacks; no pod runs a shell or gets a privilege from the spec. The sample is CI-sized (ADVERSARIAL_EXAMPLES,
default 300); benchmarks/adversarial_corpus.py runs the large corpus with counts. The regression tests at the end
pin each bug the corpus found.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import replace
from typing import Any, get_args

import kopf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kit import adversarial
from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.api.v1alpha1 import validate_spec
from vllm_operator.handlers import observe

EXAMPLES = int(os.environ.get("ADVERSARIAL_EXAMPLES", "300"))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(spec=adversarial.specs, name=adversarial.name, cluster=adversarial.clusters)
def test_every_spec_gets_a_typed_answer(spec: Any, name: str, cluster: adversarial.ClusterView) -> None:
    adversarial.CALLS.clear()
    observed = adversarial.observe(spec, name, cluster)
    desired = reconcile.desired_state(observed)
    adversarial.check(observed, desired)
    if validate_spec(spec):
        assert adversarial.CALLS == [], "the model or the nodes were looked up for an invalid spec"


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(config=st.sampled_from(adversarial.HOSTILE_CONFIGS), name=adversarial.name)
def test_hostile_inline_configs_are_refused_quickly(config: Any, name: str) -> None:
    spec = {"model": {"name": "org/m", "config": config}, "gpu": {"product": "H100-80GB"}}
    started = time.perf_counter()
    desired = reconcile.desired_state(adversarial.observe(spec, name, ()))
    elapsed = time.perf_counter() - started
    outcome = adversarial.check(adversarial.observe(spec, name, ()), desired)
    assert outcome != "Deployed" or config.get("num_hidden_layers", 0) <= 1024, outcome
    assert elapsed < 5.0, f"one plan took {elapsed:.1f} s (was 91 s for 100k layers before the bounds)"


def test_the_core_never_resolves_a_path() -> None:
    """`dev/zero` and `etc/passwd` are hub ids to the operator: the injected resolver gets them, no file is read."""
    for model in ("dev/zero", "etc/passwd"):
        asked: list[str] = []

        def resolve(model: str = model, asked: list[str] = asked) -> tuple[None, str]:
            asked.append(model)
            return None, f"'{model}' is unknown on the hub"

        base = reconcile.Observed(name="svc", namespace="ns", uid="u", generation=1,
                                  spec={"model": {"name": model}}, status={}, now=adversarial.NOW,
                                  nodes=(adversarial.L4_NODE,))
        observed = observe.complete(base, model=resolve, nodes=None, lws=None)
        desired = reconcile.desired_state(observed)
        assert asked == [model]
        assert desired.children is None and desired.retry_after
    for bad in ("/dev/zero", "../etc/passwd", "./x", "a/b/c"):
        assert validate_spec({"model": {"name": bad}}), bad


def test_a_failing_shell_lookup_propagates_for_the_shell_to_retry() -> None:
    """An API error while observing is the shell's to retry: it propagates from the observation, before the core
    runs (the core gets data, never a reader it could fail in). With spec.gpu.product named a failed node listing
    only costs the pools' options: the service is still planned."""

    def broken(_selector: Any) -> Any:
        raise kopf.TemporaryError("list nodes: API server answered 503", delay=5)

    model = adversarial.CATALOG_IDS[0]
    base = reconcile.Observed(name="svc", namespace="ns", uid="u", generation=1, spec={"model": {"name": model}},
                              status={}, now=adversarial.NOW)
    with pytest.raises(kopf.TemporaryError, match="503"):
        observe.complete(base, model=adversarial.resolver(base.spec), nodes=broken, lws=None)
    named = replace(base, spec={"model": {"name": model}, "gpu": {"product": "NVIDIA-L4"}})
    observed = observe.complete(named, model=adversarial.resolver(named.spec), nodes=broken, lws=None)
    assert observed.nodes == () and observed.model_files is not None
    assert reconcile.desired_state(observed).plan is not None
    hostile = replace(base, spec={"model": {"name": "org/m"}, "nodeSelector": {"pool": "x\nhostPID: true"}})
    observed = observe.complete(hostile, model=adversarial.resolver(hostile.spec), nodes=broken, lws=None)
    assert observed == hostile  # invalid: nothing read, the lister never called
    desired = reconcile.desired_state(observed)
    assert next(c for c in desired.status.conditions if c.type == "Degraded").reason == "InvalidSpec"


def test_pinned_flags_reach_the_args_or_name_the_release() -> None:
    lora = {"model": {"name": adversarial.CATALOG_IDS[0]}, "flags": {"enableLora": True, "maxLoraRank": 64},
            "gpu": {"product": "H100-80GB"}}
    desired = reconcile.desired_state(adversarial.observe(lora, "svc", ()))
    assert desired.children is not None, desired.status.conditions
    args = next(c for c in desired.children if c["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert "--enable-lora" in args and args[args.index("--max-lora-rank") + 1] == "64"
    swap = {**lora, "flags": {"swapSpace": 8}, "image": "vllm/vllm-openai:v0.11.0"}
    desired = reconcile.desired_state(adversarial.observe(swap, "svc", ()))
    assert desired.children is not None
    args = desired.children[-2]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert float(args[args.index("--swap-space") + 1]) == 8
    removed = {**swap, "image": "vllm/vllm-openai:v0.26.0"}
    desired = reconcile.desired_state(adversarial.observe(removed, "svc", ()))
    message = next(c.message for c in desired.status.conditions if c.type == "Degraded")
    assert desired.children is None and "spec.flags.swapSpace" in message and "0.18.0" in message
    trusted = {**lora, "flags": {"trustRemoteCode": True}}
    desired = reconcile.desired_state(adversarial.observe(trusted, "svc", ()))
    assert desired.children is not None and desired.plan is not None
    args = next(c for c in desired.children if c["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert args.count("--trust-remote-code") == 1  # rendered once, by the renderer, not also as a planned flag


def test_literal_secrets_get_a_warning_condition_once() -> None:
    spec = {"model": {"name": adversarial.CATALOG_IDS[0]}, "gpu": {"product": "H100-80GB"},
            "env": [{"name": "HF_TOKEN", "value": "hf_" + "a" * 34}],
            "hfTokenSecretRef": {"name": "hf"}, "extraArgs": ["--api-key", "$(HF_TOKEN)"]}
    desired = reconcile.desired_state(adversarial.observe(spec, "svc", ()))
    condition = next(c for c in desired.status.conditions if c.type == cond.SECRETS_BY_REFERENCE)
    assert condition.status == "False" and "spec.env[0].value" in condition.message
    assert "spec.extraArgs[1]" in condition.message and "hf_aaaa" not in condition.message
    assert [e.reason for e in desired.events if e.type == "Warning"] == [cond.LITERAL_SECRET]
    status = desired.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    again = reconcile.desired_state(observe.complete(reconcile.Observed(
        name="svc", namespace="ns", uid="uid-1", generation=1, spec=spec, status=status, now=adversarial.NOW),
        model=adversarial.resolver(spec), nodes=None, lws=None))
    assert not [e for e in again.events if e.reason == cond.LITERAL_SECRET]
    clean = {k: v for k, v in spec.items() if k not in ("env", "extraArgs")}
    cleared = reconcile.desired_state(observe.complete(reconcile.Observed(
        name="svc", namespace="ns", uid="uid-1", generation=2, spec=clean, status=status, now=adversarial.NOW),
        model=adversarial.resolver(clean), nodes=None, lws=None))
    assert next(c for c in cleared.status.conditions if c.type == cond.SECRETS_BY_REFERENCE).status == "True"


# Every field the CRD bounds by a pattern, with a value it must accept.
PATTERNED = {
    ("image",): "registry.example.com:5000/vllm/vllm-openai:v0.11.0",
    ("model", "name"): "Qwen/Qwen2.5-7B-Instruct",
    ("model", "revision"): "refs/pr/1",
    ("model", "servedName"): "qwen:7b",
    ("gpu", "product"): "NVIDIA-H100-80GB-HBM3",
    ("modelCache", "claimName"): "models.fast",
    ("modelCache", "mountPath"): "/root/.cache/huggingface",
    ("hfTokenSecretRef", "name"): "hf-token",
    ("hfTokenSecretRef", "key"): "HF_TOKEN",
    ("nodeSelector", "pool"): "a100_80gb",
    ("tolerations", 0, "key"): "nvidia.com/gpu",
    ("tolerations", 0, "value"): "present",
    ("env", 0, "name"): "VLLM_LOGGING_LEVEL",
    ("model", "configMapRef", "name"): "llama-config",
    ("model", "configMapRef", "configKey"): "config.json",
}
ANCHOR_PAYLOADS = ["x\nprivileged: true", "x}: {privileged: true", "ok\n", " ok", "ok ", "a b"]
PATH_PAYLOADS = ["a/../b", "../x", "/", "/dev/../etc"]
PATH_FIELDS = {("model", "name"), ("model", "revision"), ("modelCache", "mountPath"), ("modelCache", "claimName"),
               ("hfTokenSecretRef", "name"), ("model", "configMapRef", "name")}


@pytest.mark.parametrize("path", list(PATTERNED), ids=lambda p: ".".join(map(str, p)))
def test_patterned_fields_refuse_payloads_and_accept_real_values(path: tuple[Any, ...]) -> None:
    def spec_with(value: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"model": {"name": "org/m"}}
        base = {"modelCache": {"claimName": "c"}, "hfTokenSecretRef": {"name": "hf"}, "env": [{"name": "A"}],
                "model": {"name": "org/m", "configMapRef": {"name": "cm"}} if "configMapRef" in path else None}
        if base.get(str(path[0])):
            doc[str(path[0])] = copy.deepcopy(base[str(path[0])])
        adversarial._set(doc, path, value)
        return doc

    assert validate_spec(spec_with(PATTERNED[path])) == []
    prefix = "spec." + str(path[0])
    for payload in ANCHOR_PAYLOADS + (PATH_PAYLOADS if path in PATH_FIELDS else []):
        errors = validate_spec(spec_with(payload))
        assert errors and all(e.field.startswith(prefix) for e in errors), (payload, errors)


@pytest.mark.parametrize("spec", [
    {"model": {"name": "org/m", "configMapRef": {"name": "../kube-system/x"}}},
    {"model": {"name": "org/m", "configMapRef": {"name": "cm\nkind: Secret"}}},
    {"model": {"name": "../etc/passwd"}},
    {"model": {"name": "org/m"}, "gpu": {"count": 0}},
], ids=["configmap-path", "configmap-newline", "model-path", "invalid-elsewhere"])
def test_an_invalid_spec_never_reaches_the_model_resolver(spec: dict[str, Any]) -> None:
    """The handlers' resolver (ConfigMap read, hub download) runs only after the whole spec validated."""
    calls: list[str] = []

    def resolver() -> tuple[Any, str | None]:
        calls.append("resolved")
        return None, "not reached"

    base = reconcile.Observed(name="svc", namespace="ns", uid="u", generation=1, spec=spec, status={},
                              now=adversarial.NOW)
    observed = observe.complete(base, model=resolver, nodes=lambda _selector: calls.append("nodes") or [], lws=None)
    assert observed == base
    desired = reconcile.desired_state(observed)
    assert next(c for c in desired.status.conditions if c.type == "Degraded").reason == "InvalidSpec"
    assert calls == []


# --- every field has generators ---------------------------------------------------------------------------


def test_every_spec_field_has_a_valid_generator() -> None:
    """A new field of the API fails here until it has a pool of valid values (hostile ones come with its path)."""
    missing = sorted(set(adversarial.LEAVES) - set(adversarial.VALID), key=str)
    stale = sorted(set(adversarial.VALID) - set(adversarial.LEAVES), key=str)
    assert not missing, f"add valid values to kit.adversarial.VALID for {missing}"
    assert not stale, f"kit.adversarial.VALID names fields the API no longer has: {stale}"
    assert set(adversarial.FIELDS) <= set(adversarial.PATHS), "every field is a mutation path"
    assert {("lora",), ("autoscaling",), ("routing", "inferencePool"), ("gpu", "maxNodes"), ("vllmVersion",),
            ("flags", "speculativeConfig"), ("security", "profile"), ("modelCache",)} <= set(adversarial.FIELDS)


@pytest.mark.parametrize("leaf", adversarial.LEAVES, ids=lambda p: ".".join(map(str, p)))
@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_valid_generator_gives_admitted_values(leaf: adversarial.Path, data: st.DataObject) -> None:
    spec = data.draw(adversarial.minimal_spec(leaf))
    assert validate_spec(spec) == [], (leaf, spec)


def test_every_pattern_error_says_what_to_write() -> None:
    """A spec that breaks a field's pattern is told what the field takes, in words (not the regular expression)."""
    from vllm_operator.api import v1alpha1

    bare = []
    for path, field in adversarial.FIELDS.items():
        info = field.model.model_fields[field.name]
        for pattern in _patterns(info.metadata) + _patterns(getattr(info.annotation, "__metadata__", ())) + [
                p for arg in get_args(info.annotation) for p in _patterns(getattr(arg, "__metadata__", ()))]:
            if pattern != v1alpha1.QUANTITY_PATTERN and pattern not in v1alpha1._PATTERN_WORDS:
                bare.append(path)
    assert not bare, f"add words for these fields' patterns to v1alpha1._PATTERN_WORDS: {bare}"


def _patterns(metadata: Any) -> list[str]:
    return [m.pattern for m in metadata if isinstance(getattr(m, "pattern", None), str)]


# --- regressions: the bugs the corpus found ---------------------------------------------------------------


def _deployed(spec: dict[str, Any], name: str = "svc",
              cluster: adversarial.ClusterView | None = None) -> list[dict[str, Any]]:
    observed = adversarial.observe(spec, name, cluster or adversarial.ClusterView((adversarial.L4_NODE,)))
    desired = reconcile.desired_state(observed)
    assert adversarial.check(observed, desired) == "Deployed", desired.status.conditions
    assert desired.children is not None
    return desired.children


def _refused(spec: dict[str, Any]) -> str:
    observed = adversarial.observe(spec, "svc", (adversarial.L4_NODE,))
    desired = reconcile.desired_state(observed)
    assert adversarial.check(observed, desired) == "InvalidSpec", desired.status.conditions
    return next(c.message for c in desired.status.conditions if c.type == "Degraded")


SMALL = {"name": "meta-llama/Llama-3.1-8B-Instruct"}


@pytest.mark.parametrize("target", [1e-9, 0.0004, 5e-324])
def test_an_autoscaling_target_below_a_thousandth_is_refused_not_rendered_as_zero(target: float) -> None:
    """Was: an HPA `averageValue: 0m` (the API server refuses a target that is not positive)."""
    spec = {"model": SMALL, "autoscaling": {"maxReplicas": 3, "metrics": [{"type": "WaitingRequests",
                                                                             "target": target}]}}
    assert "spec.autoscaling.metrics[0].target" in _refused(spec)
    spec["autoscaling"]["metrics"][0]["target"] = 0.001
    hpa = next(c for c in _deployed(spec) if c["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "1m"


@pytest.mark.parametrize("draft", ["../../etc/passwd", "/models/../../etc", "x\nprivileged: true", "/", "org/a b"])
def test_a_speculative_draft_is_a_hub_id_or_an_absolute_path(draft: str) -> None:
    """Was: any string up to 512 characters reached `--speculative-config` (a path out of the container's tree)."""
    spec = {"model": SMALL, "flags": {"speculativeConfig": {"method": "draft_model", "model": draft,
                                                            "numSpeculativeTokens": 3}}}
    message = _refused(spec)
    assert "spec.flags.speculativeConfig.model" in message and "Hugging Face repository id" in message
    for good in ("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "/models/draft"):
        assert validate_spec({**spec, "flags": {"speculativeConfig": {
            "method": "draft_model", "model": good, "numSpeculativeTokens": 3}}}) == []


@pytest.mark.parametrize(("path", "profile"), [("/dev/shm", "baseline"), ("/tmp", "restricted"),
                                               ("/home/vllm", "restricted")])
def test_the_model_cache_cannot_take_a_mount_path_of_the_pod(path: str, profile: str) -> None:
    """Was: a second volume on /dev/shm (or /tmp, /home/vllm when restricted): a Deployment the API server refuses."""
    spec = {"model": SMALL, "modelCache": {"claimName": "models", "mountPath": path},
            "security": {"profile": profile}}
    assert "spec.modelCache.mountPath" in _refused(spec)
    from vllm_operator.api.v1alpha1 import RESERVED_MOUNT_PATHS
    from vllm_operator.render.manifests import RESTRICTED_HOME

    restricted = {**spec, "modelCache": {"claimName": "models"}, "security": {"profile": "restricted"}}
    deployment = next(c for c in _deployed(restricted) if c["kind"] == "Deployment")
    mounts = [m["mountPath"] for m in deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]]
    assert set(mounts) - {f"{RESTRICTED_HOME}/.cache/huggingface"} == set(RESERVED_MOUNT_PATHS)  # the pod's own


@pytest.mark.parametrize("name", ["-a", "UPPER", "a_b"])
def test_the_service_s_own_cache_claim_is_a_valid_name_whatever_the_service_is_called(name: str) -> None:
    """Was: `-a-model-cache`, a PersistentVolumeClaim name the API server refuses."""
    children = _deployed({"model": SMALL, "modelCache": {"size": "100Gi"}}, name=name)
    claim = next(c for c in children if c["kind"] == "PersistentVolumeClaim")["metadata"]["name"]
    volumes = next(c for c in children if c["kind"] == "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": claim}} in volumes
    assert _deployed({"model": SMALL, "modelCache": {"size": "100Gi"}}, name="svc")[0]["metadata"]["name"] == (
        "svc-model-cache")  # a valid name stays as it was


def test_a_leaderworkerset_gets_at_most_the_replicas_its_api_takes() -> None:
    """Was: `replicas: 2147483647` on the LeaderWorkerSet, above the LWS CRD's maximum (1,000,000)."""
    from vllm_operator.render.lws import MAX_REPLICAS

    spec = {"model": {"name": "meta-llama/Llama-3.1-405B-Instruct"}, "gpu": {"maxNodes": 4}, "replicas": 2**31 - 1}
    children = _deployed(spec, cluster=adversarial.ClusterView((adversarial.H100_NODE,) * 4, lws=True))
    lws = next(c for c in children if c["kind"] == "LeaderWorkerSet")
    assert lws["spec"]["replicas"] == MAX_REPLICAS


def test_more_pipeline_stages_than_layers_is_an_invalid_spec_not_an_internal_error() -> None:
    """Was: ZeroDivisionError in the planner (a stage without layers has no KV block size) → InternalError."""
    config = adversarial._inline_config(1)
    spec = {"model": {"name": "org/one-layer", "config": config,
                      "safetensorsIndex": {"metadata": {"total_size": 2 * 10**9}}},
            "flags": {"pipelineParallelSize": 2}}
    message = _refused(spec)
    assert message.startswith("spec.flags.pipelineParallelSize: 2 pipeline stages for the 1 decoder layers")
    spec["flags"]["pipelineParallelSize"] = 1
    assert _deployed(spec)


@pytest.mark.parametrize("source", [{}, {"fieldRef": {"fieldPath": "metadata.name"},
                                         "secretKeyRef": {"name": "s", "key": "k"}}], ids=["none", "two"])
def test_an_env_value_from_has_exactly_one_source(source: dict[str, Any]) -> None:
    """Was: passed to the pod as given, where the Pod API refuses none and more than one (the Deployment a 422)."""
    spec = {"model": SMALL, "env": [{"name": "A", "valueFrom": source}]}
    assert _refused(spec).startswith("spec.env[0].valueFrom: set exactly one of secretKeyRef")
    spec["env"][0]["valueFrom"] = {"fieldRef": {"fieldPath": "metadata.name"}}
    assert _deployed(spec)


@pytest.mark.parametrize("version", ["٠.١١.٠", "０.１１.０", "v0.٣٣.0"])
def test_vllm_version_takes_ascii_digits_as_the_api_server_does(version: str) -> None:
    """Was: pydantic's `\\d` took other scripts' digits that the CRD's pattern (RE2) refuses: the operator planned a
    spec the API server would not have stored."""
    assert "spec.vllmVersion" in _refused({"model": SMALL, "vllmVersion": version})
    assert validate_spec({"model": SMALL, "vllmVersion": "0.11.1+cu128"}) == []


def test_the_download_init_container_gets_no_capability_the_group_s_vllm_container_gets() -> None:
    """Was: the init container's securityContext shared the vLLM container's dicts, so a LeaderWorkerSet's IPC_LOCK
    (spec.network.ipcLock) was added to the model-download container too."""
    spec = {"model": {"name": "meta-llama/Llama-3.1-405B-Instruct"}, "gpu": {"maxNodes": 4},
            "modelCache": {"size": "1Ti"}, "network": {"ipcLock": True, "rdmaResources": [{"name": "rdma/ib",
                                                                                         "count": 1}]}}
    children = _deployed(spec, cluster=adversarial.ClusterView((adversarial.H100_NODE,) * 4, lws=True))
    lws = next(c for c in children if c["kind"] == "LeaderWorkerSet")
    for template in adversarial.pod_templates(lws):
        (init,) = template["spec"]["initContainers"]
        (container,) = template["spec"]["containers"]
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert "rdma/ib" not in init["resources"]["limits"] and container["resources"]["limits"]["rdma/ib"] == "1"


@pytest.mark.parametrize("model", ["org/m\nimport os; os.system('id')", "o/m'); import os; x=('"])
def test_the_download_script_is_fixed_and_the_model_is_argv_data(model: str) -> None:
    """`python3 -c` with the FIXED script of render/cache.py runs no shell; the invariant fails a pod whose script
    text differs from it (a user string pasted into the program), and the model id reaches it only as argv."""
    from vllm_operator.render import cache

    deployment = next(c for c in _deployed({"model": SMALL, "modelCache": {"size": "100Gi"}})
                      if c["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"] == ["python3", "-c", cache.DOWNLOAD_SCRIPT] and init["args"][0] == SMALL["name"]
    adversarial.check_pod(pod, {"model": SMALL})
    init["command"] = ["python3", "-c", cache.DOWNLOAD_SCRIPT.replace("def main(repo", f"# {model}\ndef main(repo")]
    with pytest.raises(AssertionError):
        adversarial.check_pod(pod, {"model": SMALL})
