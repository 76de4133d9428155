"""Secrets stay secret (issue 10): token-shaped strings are redacted from text that vLLM prints before it becomes
evidence, conditions, Events, status or log lines; literal secrets in a spec are found without quoting them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from kit import secret_shapes
from kit.secret_shapes import MARK
from vllm_operator.remediation.classifier import classify, classify_text
from vllm_operator.remediation.evidence import ContainerEvidence, evidence_from_pod
from vllm_operator.remediation.redact import MASK, looks_like_token, redact, secret_findings

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123"
DATA = Path(__file__).parent / "data" / "vllm_failure_texts.yaml"


@pytest.mark.parametrize(("text", "secret"), [
    (f"401 Client Error: token {HF} is invalid", HF),
    ("non-default args: {'model': 'm', 'api_key': ['s3cr3t-value'], 'port': 8000}", "s3cr3t-value"),
    ("non-default args: {'api_key': 'plain-key-123'}", "plain-key-123"),
    ("vllm serve m --api-key topsecret99 --port 8000", "topsecret99"),
    ("vllm serve m --api-key=topsecret99", "topsecret99"),
    ("Authorization: Bearer abc.def-ghi_123", "abc.def-ghi_123"),
    ("OPENAI_API_KEY=sk-proj-" + "x" * 40, "sk-proj-" + "x" * 40),
    ("HF_TOKEN=abcdef0123456", "abcdef0123456"),
    ("ghp_" + "a" * 36 + " leaked", "ghp_" + "a" * 36),
    ("key AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("jwt eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJlLXZhbHVl", "eyJhbGciOiJSUzI1NiJ9"),
])
def test_token_shaped_strings_are_redacted(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out


def test_real_vllm_failure_texts_are_left_alone() -> None:
    """No false positive on the classifier's corpus of real and source-derived vLLM failure texts."""
    texts = yaml.safe_load(DATA.read_text())["texts"]
    changed = [t["id"] for t in texts if redact(t.get("text", "")) != t.get("text", "")]
    assert changed == []
    assert redact("max_num_batched_tokens=8192 api_key=None") == "max_num_batched_tokens=8192 api_key=None"


def test_evidence_and_classification_never_carry_the_secret() -> None:
    message = ("ValueError: Unauthorized for url https://huggingface.co/api/models/org/m "
               f"(Request ID: x) Invalid credentials in Authorization header, token {HF}\n")
    pod = {"metadata": {"name": "p", "uid": "u", "namespace": "ns"}, "status": {"containerStatuses": [{
        "name": "vllm", "ready": False, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "message": message}}}]}}
    (evidence,) = evidence_from_pod(pod, log_tail=f"--api-key {HF}")
    assert HF not in evidence.termination_message and HF not in (evidence.log_tail or "")
    copied = evidence.model_copy(update={"log_tail": f"bearer {HF}", "pod_message": HF})
    assert HF not in (copied.log_tail or "") and HF not in (copied.pod_message or "")
    failure = classify(ContainerEvidence(termination_message=message, terminated_reason="Error", exit_code=1))
    assert failure is not None and HF not in failure.summary + failure.excerpt
    raw = classify_text(message, terminated_reason="Error", exit_code=1)
    assert HF not in raw.summary + raw.excerpt


def test_literal_secrets_in_a_spec_are_found_without_quoting_them() -> None:
    findings = secret_findings(
        [{"name": "HF_TOKEN", "value": HF}, {"name": "LOG_LEVEL", "value": "debug"},
         {"name": "DB_PASSWORD", "value": "correct-horse-battery"},
         {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        ["--api-key", "plainvalue", "--disable-log-requests", "--api-key=$(KEY)", "--x", "$(LOG_LEVEL)"])
    assert [f.field for f in findings] == ["spec.env[0].value", "spec.env[2].value", "spec.extraArgs[1]",
                                           "spec.extraArgs[3]"]
    assert not any(HF in f.message or "plainvalue" in f.message for f in findings)
    assert "valueFrom.secretKeyRef" in findings[0].message and "VLLM_API_KEY" in findings[2].message
    assert secret_findings([{"name": "A", "value": "1"}], ["--disable-log-requests"]) == []
    assert looks_like_token(HF) and not looks_like_token("meta-llama/Llama-3.1-8B-Instruct")


# --- issue 20: the shapes the redactor missed, and a generated corpus of them -------------------------------------

@pytest.mark.parametrize(("text", "secrets"), [
    ("non-default args: {'api_key': ['first-key-1', 'second-key-2', 'third-key-3']}",
     ["first-key-1", "second-key-2", "third-key-3"]),
    ("non-default args: {'api_key': ('first-key-1', 'second-key-2')}", ["first-key-1", "second-key-2"]),
    ("OSError: could not fetch https://alice:pa55w0rd@hub.example.com/org/m", ["pa55w0rd"]),
    ("git clone https://ghs_tokenvalue123@github.com/org/repo", ["ghs_tokenvalue123"]),
    ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCY", ["wJalrXUtnFEMI/K7MDENG/bPxRfiCY"]),
    ("MY_SERVICE_KEY_ID=abc123 DB_PASSWORD='p a s s w o r d'", ["abc123", "p a s s w o r d"]),
    ("Authorization: s3cr3tvalue", ["s3cr3tvalue"]),
    ("401 Unauthorized: invalid token s3cr3tvalue", ["s3cr3tvalue"]),
    ("vllm serve m --api-key k1-value k2-value --port 8000", ["k1-value", "k2-value"]),
    ("vllm serve m --api-key '[odd key]' --port 8000", ["odd key"]),
    ("vllm serve m --api-key=*starred --port 8000", ["starred"]),
])
def test_issue_20_shapes_are_redacted(text: str, secrets: list[str]) -> None:
    out = redact(text)
    assert not [s for s in secrets if s in out], out
    assert MASK in out


def test_numbers_after_token_words_are_kept() -> None:
    for text in ("max_num_batched_tokens=8192 api_key=None", "max_model_len (4096) tokens=8192",
                 "invalid token for this model", "Maximum concurrency for 32768 tokens per request: 3.5x"):
        assert redact(text) == text


@settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=secret_shapes.secret_texts())
def test_no_generated_secret_survives_redaction_or_classification(case: tuple[str, list[str]]) -> None:
    text, secrets = case
    out = redact(text)
    assert MARK not in out, (text, out)
    failure = classify_text(text, terminated_reason="Error", exit_code=1)
    assert MARK not in failure.summary + failure.excerpt, failure
    assert redact(out) == out  # masking is stable: a masked text is not masked again
