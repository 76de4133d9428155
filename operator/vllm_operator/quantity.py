"""Kubernetes resource quantities (memory) as GiB. Pure."""

from __future__ import annotations

from typing import Any

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9,
          "T": 10**12}


def quantity_gib(value: Any) -> float | None:
    """'39Gi' → 39.0, '42G' → 39.1, '1073741824' → 1.0; None for missing or unreadable values."""
    if value is None:
        return None
    text = str(value).strip()
    for unit, factor in _UNITS.items():
        if text.endswith(unit):
            try:
                return float(text[: -len(unit)]) * factor / 2**30
            except ValueError:
                return None
    try:
        return float(text) / 2**30
    except ValueError:
        return None
