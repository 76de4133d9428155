"""Token-shaped strings out of text that leaves the pod: vLLM's log lines and termination messages become Events,
conditions, status (remediation history) and operator log lines, and none of those may carry a secret.

Pure: strings in, strings out. `redact` replaces what looks like a credential with `***` and keeps the rest (so the
classifier still reads the failure); `secret_findings` says which literal values of a spec look like secrets, for the
warning that tells the author to use `hfTokenSecretRef` / `valueFrom.secretKeyRef` instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MASK", "SecretFinding", "looks_like_token", "redact", "secret_findings"]

MASK = "***"

# Well-known token formats (whole tokens, anywhere in a line).
_TOKEN_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),                         # Hugging Face user / org tokens
    re.compile(r"\bapi_org_[A-Za-z0-9]{20,}"),                    # Hugging Face legacy org tokens
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"),        # OpenAI / Anthropic style API keys
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"),                  # GitHub tokens
    re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"),                    # GitLab personal access tokens
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),               # Slack tokens
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),                 # AWS access key ids
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),                       # Google API keys
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWTs (Kubernetes SA tokens)
)

# Values that follow a secret-bearing name: `--api-key VALUE`, `--api-key=VALUE`, `Authorization: Bearer VALUE`,
# `'api_key': 'VALUE'` / `'api_key': ['VALUE', 'VALUE2']` (vLLM's "non-default args" line), `HF_TOKEN=VALUE`,
# `AWS_SECRET_ACCESS_KEY=VALUE`, `token: VALUE`, `invalid token VALUE`, `https://user:VALUE@host/`.
_SECRET_NAME = r"(?:api[_-]?keys?|hf[_-]?token|access[_-]?token|auth[_-]?token|token|secret|password|passwd)"
# a value: quoted (anything up to the closing quote) or bare (up to white space or a delimiter)
_VALUE = r"""(?:'[^'\n]*'|"[^"\n]*"|(?!None\b)[^\s'",\[\](){}<>][^\s'",\[\](){}<>]*)"""
# environment-style names with a secret-bearing segment anywhere (`*_SECRET*`, `*_KEY*`, `*_TOKEN*`), upper case
_ENV_SECRET = r"\b[A-Z0-9_]*(?<![A-Z0-9])(?:SECRET|KEY|KEYS|TOKEN|PASSWORD|PASSWD|CREDENTIALS?|APIKEY)(?![A-Z0-9])" \
              r"[A-Z0-9_]*\b"
# any-case names that end in one (`aws_secret_access_key`, `client_secret`, `x-api-key`); never `*_tokens`
_NAME_SECRET = r"\b[\w.-]*?(?:secret|password|passwd|credentials?|api[_-]?keys?|access[_-]?key|private[_-]?key" \
               r"|token)(?![\w.-])|\b[\w.-]*?[_-](?:secret|key|token)[\w.-]*?(?<![sS])(?![\w.-])"
_CONTEXT_PATTERNS: tuple[re.Pattern[str], ...] = (
    # URL userinfo: scheme://user:password@host, scheme://token@host
    re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)()([^/\s@'\"<>]+)(?=@)"),
    # Authorization / Proxy-Authorization header values, with or without a scheme
    re.compile(r"(?i)(\b(?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?(?:(?:bearer|basic|token|digest|apikey)\s+)?)()"
               r"([^\s'\",]+)"),
    re.compile(r"(?i)(\bbearer\s+)()([A-Za-z0-9._~+/=-]{6,})"),
    re.compile(r"(?i)(\bbasic\s+)()([A-Za-z0-9+/=]{8,})"),
    # "invalid token X", "bad api key: X", "expired credentials X"
    re.compile(r"(?i)(\b(?:invalid|bad|wrong|expired|unknown|revoked|incorrect|malformed)\s+(?:hf\s+|api\s+|access\s+|"
               r"auth\s+|bearer\s+)?(?:token|key|api[_ -]?key|secret|password|credentials?)\s*[:=]?\s*)(['\"]?)"
               r"((?!for\b|in\b|is\b|was\b|provided\b|given\b|or\b|and\b|the\b|format\b)[^\s'\",]{4,})"),
)
# a list or tuple after a secret-bearing name: every item goes
_LIST_AFTER_NAME = re.compile(r"(?i)((?:['\"]?\b[\w-]*" + _SECRET_NAME + r"|" + _ENV_SECRET + r")['\"]?\s*[:=]\s*)"
                              r"([\[(])([^\])\n]*)([\])]|$)", re.MULTILINE)
_ITEM = re.compile(r"""'[^']*'|"[^"]*"|[^\s,'"]+""")
# one value after a secret-bearing name (after the lists are masked: `***` is not masked again)
_VALUE_AFTER_NAME = (
    re.compile(r"(?i)(['\"]?(?:" + _NAME_SECRET + r")['\"]?\s*[:=]\s*)()(" + _VALUE + r")"),
    re.compile(r"(['\"]?" + _ENV_SECRET + r"['\"]?\s*[:=]\s*)()(" + _VALUE + r")"),
)
# a command-line flag naming a secret: every value after it up to the next flag (vLLM's --api-key takes several)
_SECRET_FLAG_VALUES = re.compile(r"(?i)(--[\w-]*" + _SECRET_NAME + r"[\w-]*(?:=|[ \t]+))((?:(?!--)" + _VALUE
                                 + r"(?:[ \t]+|$))*(?:(?!--)" + _VALUE + r")?)", re.MULTILINE)


def _mask_items(match: re.Match[str]) -> str:
    items = _ITEM.sub(lambda item: item.group()[0] + MASK + item.group()[0] if item.group()[0] in "'\""
                      else (item.group() if item.group() in ("None", MASK) else MASK), match.group(3))
    return f"{match.group(1)}{match.group(2)}{items}{match.group(4)}"


def _mask_flag_values(match: re.Match[str]) -> str:
    values = match.group(2)
    if not values.strip():
        return match.group(0)
    trailing = values[len(values.rstrip()):]
    return f"{match.group(1)}{MASK}{trailing}"


def redact(text: str) -> str:
    """`text` with every token-shaped string replaced by `***`, and every value after a secret-bearing name."""
    if not text:
        return text
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(MASK, text)
    text = _LIST_AFTER_NAME.sub(_mask_items, text)
    text = _SECRET_FLAG_VALUES.sub(_mask_flag_values, text)
    for pattern in (*_CONTEXT_PATTERNS, *_VALUE_AFTER_NAME):
        text = pattern.sub(lambda m: m.group(0) if m.group(3).strip("'\"") in (MASK, "None", "")
                           else f"{m.group(1)}{m.group(2)}{MASK}", text)
    return text


def looks_like_token(value: str) -> bool:
    """Whether a whole value has the shape of a known credential format."""
    return any(pattern.search(value) for pattern in _TOKEN_PATTERNS)


_SECRET_ENV_NAME = re.compile(r"(?i)(token|secret|passw(or)?d|api[_-]?key|credential|private[_-]?key)")
_EXPANSION = re.compile(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_SECRET_FLAG = re.compile(r"(?i)^--" + _SECRET_NAME + r"(=.*)?$")


@dataclass(frozen=True)
class SecretFinding:
    """A literal secret in a spec: where (camelCase path) and what to do instead."""

    field: str
    message: str


def secret_findings(env: Iterable[Mapping[str, Any]], extra_args: Iterable[str],
                    secret_env_names: Iterable[str] = ()) -> list[SecretFinding]:
    """Literal secrets in `spec.env` values and `spec.extraArgs`, and `$(VAR)` expansions of secret-backed
    variables in `spec.extraArgs` (the kubelet pastes the secret into argv, where `ps` and vLLM's own
    "non-default args" log line show it). Values are never quoted back."""
    findings: list[SecretFinding] = []
    secret_vars = set(secret_env_names)
    for index, var in enumerate(env):
        name = str(var.get("name", ""))
        value = var.get("value")
        value_from = var.get("valueFrom") or var.get("value_from")
        if isinstance(value_from, Mapping) and "secretKeyRef" in value_from:
            secret_vars.add(name)
        if not isinstance(value, str) or not value:
            continue
        if looks_like_token(value) or (_SECRET_ENV_NAME.search(name) and len(value) >= 8
                                       and not _EXPANSION.fullmatch(value)):
            findings.append(SecretFinding(
                f"spec.env[{index}].value",
                f"{name} holds a literal secret: anyone who can read the VLLMService or its Deployment reads it; "
                "put it in a Secret and use valueFrom.secretKeyRef (or spec.hfTokenSecretRef for a Hugging Face "
                "token)"))
    args = list(extra_args)
    for index, arg in enumerate(args):
        previous = args[index - 1] if index else ""
        if looks_like_token(arg) or (_SECRET_FLAG.match(previous) and not _EXPANSION.search(arg)
                                     and not arg.startswith("-")) or (
                _SECRET_FLAG.match(arg) and "=" in arg and not _EXPANSION.search(arg)):
            findings.append(SecretFinding(
                f"spec.extraArgs[{index}]",
                "is a literal secret on vLLM's command line (visible in the Deployment, in ps and in vLLM's "
                "startup log); put it in a Secret and reference it with valueFrom.secretKeyRef in spec.env, "
                "and let vLLM read it from the environment (e.g. VLLM_API_KEY for --api-key)"))
            continue
        for variable in _EXPANSION.findall(arg):
            if variable in secret_vars or variable == "HF_TOKEN":
                findings.append(SecretFinding(
                    f"spec.extraArgs[{index}]",
                    f"$({variable}) expands a secret into vLLM's command line (visible in ps and in vLLM's "
                    f"startup log); let vLLM read it from the environment instead (e.g. VLLM_API_KEY for "
                    "--api-key, HF_TOKEN for the hub)"))
                break
    return findings
