"""Names and label values valid for their Kubernetes kind, made from hostile user strings (pure).

A valid name is kept as it is; any other is cleaned and gets a stable short hash of the original, so two different
user strings never collapse into one name.
"""

from __future__ import annotations

import hashlib
import re

_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _shorten(cleaned: str, original: str, limit: int) -> str:
    """`cleaned` cut to fit `limit` with a stable hash of `original` appended (so two long names stay apart)."""
    suffix = _short_hash(original)
    keep = cleaned[: limit - len(suffix) - 1].rstrip("-.")
    return f"{keep}-{suffix}" if keep else suffix


def label_value(text: str) -> str:
    """`text` as a valid label value: itself when it is one, else a cleaned, shortened form with a stable hash."""
    text = str(text)
    if len(text) <= 63 and _LABEL_VALUE.fullmatch(text):
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")
    return _shorten(cleaned, text, 63) if cleaned else _short_hash(text)


def dns1035_label(name: str) -> str:
    """`name` as a DNS-1035 label (a Service name): lower case, starts with a letter, at most 63 characters.

    A valid name is kept; any other gets a stable short hash of the original so that it stays unique:
    `017` -> `v017-<hash>`, `a.b` -> `a-b-<hash>`.
    """
    name = str(name)
    if len(name) <= 63 and _DNS1035_LABEL.fullmatch(name):
        return name
    cleaned = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not cleaned[:1].isalpha():
        cleaned = "v" + cleaned
    return _shorten(cleaned, name, 63)


def dns1123_subdomain(name: str, limit: int = 253) -> str:
    """`name` as a DNS-1123 subdomain (Deployment, PVC names) of at most `limit` characters."""
    name = str(name)
    if len(name) <= limit and _DNS1123_SUBDOMAIN.fullmatch(name):
        return name
    cleaned = re.sub(r"[^a-z0-9.-]+", "-", name.lower())
    cleaned = re.sub(r"\.+", ".", cleaned)
    cleaned = re.sub(r"-*\.-*", ".", cleaned).strip("-.")
    return _shorten(cleaned, name, limit)


def is_dns1123_subdomain(name: str) -> bool:
    return len(name) <= 253 and bool(_DNS1123_SUBDOMAIN.fullmatch(name))
