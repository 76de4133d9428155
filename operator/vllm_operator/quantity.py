"""Kubernetes resource quantities, read exactly. Pure.

Kubernetes stores a quantity as an int64 of its smallest unit after scaling (resource.Quantity); anything the CRD's
pattern admits beyond that (`1e400`, `99999999999999999999Ei`) is not a resource any node has. `quantity_value`
reads the whole syntax (every suffix, decimal exponents) with `Decimal`, never a float, and says None for what
is unreadable or out of range, so no caller meets an infinity or an overflow.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["MAX_QUANTITY", "quantity_gib", "quantity_problem", "quantity_value"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal(10**3),
            "K": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}
_SYNTAX = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))((?:[KMGTPE]i)|[numkKMGTPE]|[eE][+-]?[0-9]{1,6})?")
#: The largest quantity Kubernetes represents (int64; e.g. 8 EiB of memory). Larger ones are refused here.
MAX_QUANTITY = Decimal(2**63 - 1)


def quantity_value(value: Any) -> Decimal | None:
    """'39Gi' → 41875931136, '500m' → 0.5, '1e3' → 1000; None for missing, unreadable or out-of-range values
    (negative, or above int64 as Kubernetes stores quantities)."""
    if value is None or isinstance(value, bool):
        return None
    text = str(value).strip()
    if len(text) > 64:
        return None
    match = _SYNTAX.fullmatch(text)
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        amount = Decimal(number)
        if suffix in _BINARY:
            amount *= _BINARY[suffix]
        elif suffix in _DECIMAL:
            amount *= _DECIMAL[suffix]
        else:  # a decimal exponent, at most 6 digits by the pattern above
            exponent = int(suffix[1:])
            if exponent > 30:  # 1e31 and more exceed int64 whatever the mantissa (which is >= 1 or a fraction)
                if amount == 0:
                    return Decimal(0)
                return None
            if exponent < -30:
                return Decimal(0)
            amount = amount.scaleb(exponent)
    except (InvalidOperation, ValueError):
        return None
    if amount < 0 or amount > MAX_QUANTITY or not amount.is_finite():
        return None
    return amount


def quantity_problem(value: Any) -> str | None:
    """Why a quantity the pattern admits is no resource Kubernetes can hold, or None."""
    if quantity_value(value) is None:
        return "is larger than Kubernetes can represent (at most 2^63-1 of the unit, e.g. 8Ei); give a real size"
    return None


def quantity_gib(value: Any) -> float | None:
    """'39Gi' → 39.0, '42G' → 39.1, '1073741824' → 1.0; None for missing, unreadable or out-of-range values."""
    amount = quantity_value(value)
    return None if amount is None else float(amount / 2**30)
