"""Tenants use their own credentials (issue 20): a service's model is looked up on the hub with its own
`hfTokenSecretRef` token, read from its namespace, or with no token at all; the operator's own HF_TOKEN only when
the chart allows it for every namespace. A tenant's token gets a hub cache of its own."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from vllm_operator.handlers import config, kube, observe

MODEL = {"name": "acme/private-model"}


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def resolve(name: str, **kwargs: Any) -> str:
        seen.append({"name": name, **kwargs})
        return "files"

    secrets = {("team-a", "hf"): {"data": {"token": base64.b64encode(b"hf_tenantAAAAAAAAAAAAAAAAAAAA").decode()}},
               ("team-b", "hf"): {"data": {"token": base64.b64encode(b"hf_tenantBBBBBBBBBBBBBBBBBBBB").decode()}}}
    reads: list[tuple[str, str]] = []

    def get(resource: kube.Resource, namespace: str, name: str) -> dict[str, Any] | None:
        assert resource == kube.SECRETS
        reads.append((namespace, name))
        return secrets.get((namespace, name))

    monkeypatch.setattr(observe, "resolve_model_id", resolve)
    monkeypatch.setattr(kube, "get", get)
    monkeypatch.setattr(config, "CONFIG", config.OperatorConfig())
    monkeypatch.setenv("HF_HOME", "/tmp/hf-home")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    seen.append({"reads": reads})
    return seen


def test_without_a_secret_ref_the_lookup_sends_no_token(lookups: list[dict[str, Any]]) -> None:
    files, problem = observe.load_model({"model": MODEL}, "team-a")
    assert problem is None and files == "files"
    assert lookups[-1]["token"] is False  # huggingface_hub: send no token (not even the operator's HF_TOKEN)
    assert lookups[-1]["cache_dir"] == "/tmp/hf-home/hub/anonymous"


def test_the_operator_token_only_when_allowed_for_all_namespaces(lookups: list[dict[str, Any]],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "CONFIG", config.OperatorConfig(hub_token_all_namespaces=True))
    observe.load_model({"model": MODEL}, "team-a")
    assert lookups[-1]["token"] is None and lookups[-1]["cache_dir"] is None  # huggingface_hub's own: HF_TOKEN


def test_a_service_uses_its_own_token_and_cache(lookups: list[dict[str, Any]]) -> None:
    ref = {"hfTokenSecretRef": {"name": "hf", "key": "token"}}
    observe.load_model({"model": MODEL, **ref}, "team-a")
    a = lookups[-1]
    observe.load_model({"model": MODEL, **ref}, "team-b")
    b = lookups[-1]
    assert a["token"] == "hf_tenantAAAAAAAAAAAAAAAAAAAA" and b["token"] == "hf_tenantBBBBBBBBBBBBBBBBBBBB"
    assert a["cache_dir"] != b["cache_dir"] and "tenantA" not in a["cache_dir"]
    assert lookups[0]["reads"] == [("team-a", "hf"), ("team-b", "hf")]  # each in the service's own namespace


def test_a_missing_secret_is_the_services_problem_not_the_operator_token(lookups: list[dict[str, Any]]) -> None:
    files, problem = observe.load_model({"model": MODEL, "hfTokenSecretRef": {"name": "absent"}}, "team-a")
    assert files is None and problem is not None and "spec.hfTokenSecretRef" in problem
    assert len(lookups) == 1  # nothing looked up


@pytest.mark.parametrize(("value", "allowed"), [(None, False), ("", False), ("false", False), ("true", True),
                                                ("1", True)])
def test_the_chart_setting_reaches_the_operator(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                                allowed: bool) -> None:
    from vllm_operator.handlers import main

    if value is None:
        monkeypatch.delenv(main.HUB_TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(main.HUB_TOKEN_ENV, value)
    assert main.hub_token_for_all_namespaces() is allowed


def test_a_catalog_model_reads_no_secret(lookups: list[dict[str, Any]]) -> None:
    """The built-in catalog needs no hub and no token: a missing Secret is not a reason to stop (the vLLM pods
    need it, the operator does not)."""
    files, problem = observe.load_model({"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                                         "hfTokenSecretRef": {"name": "absent"}}, "team-a")
    assert problem is None and files is not None and files != "files"
    assert lookups[0]["reads"] == [] and len(lookups) == 1
