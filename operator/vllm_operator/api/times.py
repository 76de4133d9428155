"""Kubernetes timestamps (RFC 3339, as the API server writes them: `2025-06-01T12:00:00Z`), read and written in one
place: conditions, container states, Events, the remediation history, the metrics watch's decisions, peering."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

#: The API server's form: UTC, second precision, a literal Z.
RFC3339 = "%Y-%m-%dT%H:%M:%SZ"


def format_time(now: datetime) -> str:
    """RFC 3339 in UTC with second precision (`2025-01-02T03:04:05Z`), as the API server stores it."""
    if now.tzinfo is None:
        raise ValueError("a timezone-aware datetime is required (use datetime.now(UTC))")
    return now.astimezone(UTC).strftime(RFC3339)


def parse_time(value: Any) -> datetime | None:
    """A timestamp as the API (or kopf, or a stored status) writes it — `Z` or an offset, with or without fractional
    seconds — as an aware datetime (one without an offset is read as UTC); a datetime passes through (made aware the
    same way). None for anything else: a missing, empty, non-string or malformed value."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
