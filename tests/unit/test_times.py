"""api/times: the one reader and writer of Kubernetes timestamps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from vllm_operator.api.times import format_time, parse_time

NOON = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "expected"), [
    ("2025-06-01T12:00:00Z", NOON),
    ("2025-06-01T12:00:00+00:00", NOON),
    ("2025-06-01T14:00:00+02:00", NOON),
    ("2025-06-01T12:00:00.123456Z", NOON + timedelta(microseconds=123456)),
    ("2025-06-01T12:00:00.5+00:00", NOON + timedelta(milliseconds=500)),
    ("2025-06-01T12:00:00", NOON),  # no offset: UTC, as kopf's peering writes it
], ids=["Z", "+00:00", "+02:00", "fractional-Z", "fractional-offset", "naive"])
def test_parse_reads_what_the_api_and_kopf_write(text: str, expected: datetime) -> None:
    parsed = parse_time(text)
    assert parsed == expected and parsed is not None and parsed.tzinfo is not None


@pytest.mark.parametrize("value", [None, "", "yesterday", "2025-13-01T00:00:00Z", "12:00", 1717243200, [],
                                   "2025-06-01T12:00:00Z" * 10, "2025-06-01T12:00:00ZZ"])
def test_garbage_is_none(value: object) -> None:
    assert parse_time(value) is None


def test_a_datetime_passes_through_aware() -> None:
    assert parse_time(NOON) is NOON
    assert parse_time(datetime(2025, 6, 1, 12)) == NOON


def test_format_is_the_api_servers_form_and_reads_back() -> None:
    local = NOON.astimezone(timezone(timedelta(hours=-7))) + timedelta(microseconds=999)
    assert format_time(local) == "2025-06-01T12:00:00Z"
    assert parse_time(format_time(local)) == NOON
    with pytest.raises(ValueError, match="timezone-aware"):
        format_time(datetime(2025, 6, 1, 12))
