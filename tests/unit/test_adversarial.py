"""Property-based: generated VLLMService specs, valid and hostile, through the reconcile core (issue 10).

Zero exceptions escape `desired_state`; no spec ends in the InternalError safety net; every rejection names its
field; nothing is fetched for an invalid spec; every rendered child is valid for a real API server
(`kubernetes-validate`, strict) and has no key the renderer's full reference rendering lacks. The sample is
CI-sized (ADVERSARIAL_EXAMPLES, default 300); benchmarks/adversarial_corpus.py runs the large corpus with counts.
"""

from __future__ import annotations

import copy
import os
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kit import adversarial
from vllm_operator import reconcile
from vllm_operator.api.v1alpha1 import validate_spec

EXAMPLES = int(os.environ.get("ADVERSARIAL_EXAMPLES", "300"))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(spec=adversarial.specs, name=adversarial.name, node_labels=adversarial.nodes)
def test_every_spec_gets_a_typed_answer(spec: Any, name: str, node_labels: Any) -> None:
    adversarial.CALLS.clear()
    observed = adversarial.observe(spec, name, node_labels)
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

        observed = reconcile.Observed(name="svc", namespace="ns", uid="u", generation=1,
                                      spec={"model": {"name": model}}, status={}, now=adversarial.NOW,
                                      nodes=(adversarial.L4_NODE,), resolve_model=resolve)
        desired = reconcile.desired_state(observed)
        assert asked == [model]
        assert desired.children is None and desired.retry_after
    for bad in ("/dev/zero", "../etc/passwd", "./x", "a/b/c"):
        assert validate_spec({"model": {"name": bad}}), bad


def test_a_failing_shell_lookup_propagates_for_the_shell_to_retry() -> None:
    """An API error in an injected lookup is the shell's to retry: the core re-raises it, unchanged, instead of
    turning it into an InternalError condition."""

    class Transient(Exception):
        pass

    def broken(_selector: Any) -> Any:
        raise Transient("list nodes: 503")

    observed = reconcile.Observed(name="svc", namespace="ns", uid="u", generation=1,
                                  spec={"model": {"name": adversarial.CATALOG_IDS[0]}}, status={},
                                  now=adversarial.NOW, list_nodes=broken,
                                  resolve_model=adversarial.resolver({"model": {"name": adversarial.CATALOG_IDS[0]}}))
    with pytest.raises(Transient, match="503"):
        reconcile.desired_state(observed)
    hostile = reconcile.Observed(name="svc", namespace="ns", uid="u", generation=1,
                                 spec={"model": {"name": "org/m"}, "nodeSelector": {"pool": "x\nhostPID: true"}},
                                 status={}, now=adversarial.NOW, list_nodes=broken)
    desired = reconcile.desired_state(hostile)  # invalid: the lister is never called
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
    condition = next(c for c in desired.status.conditions if c.type == reconcile.SECRETS_BY_REFERENCE)
    assert condition.status == "False" and "spec.env[0].value" in condition.message
    assert "spec.extraArgs[1]" in condition.message and "hf_aaaa" not in condition.message
    assert [e.reason for e in desired.events if e.type == "Warning"] == [reconcile.LITERAL_SECRET]
    status = desired.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    again = reconcile.desired_state(reconcile.Observed(
        name="svc", namespace="ns", uid="uid-1", generation=1, spec=spec, status=status, now=adversarial.NOW,
        resolve_model=adversarial.resolver(spec)))
    assert not [e for e in again.events if e.reason == reconcile.LITERAL_SECRET]
    clean = {k: v for k, v in spec.items() if k not in ("env", "extraArgs")}
    cleared = reconcile.desired_state(reconcile.Observed(
        name="svc", namespace="ns", uid="uid-1", generation=2, spec=clean, status=status, now=adversarial.NOW,
        resolve_model=adversarial.resolver(clean)))
    assert next(c for c in cleared.status.conditions if c.type == reconcile.SECRETS_BY_REFERENCE).status == "True"


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

    observed = reconcile.Observed(name="svc", namespace="ns", uid="u", generation=1, spec=spec, status={},
                                  now=adversarial.NOW, resolve_model=resolver)
    desired = reconcile.desired_state(observed)
    assert next(c for c in desired.status.conditions if c.type == "Degraded").reason == "InvalidSpec"
    assert calls == []
