"""What vLLM measured of its KV cache, next to the plan's prediction (pure).

At startup vLLM's engine logs the KV cache it allocated: ``GPU KV cache size: 17,712 tokens`` (``CPU``/``XPU`` on
other devices; vllm/v1/core/kv_cache_utils.py, every release the operator plans for). A serving pod's log holds it
among its first lines. `measured_tokens` reads it from a bounded log tail (hostile text: only the number leaves it);
`fold_measured` puts it next to `status.plan.kvCacheTokens` with the difference — only for a pod that runs the
recorded plan's arguments, so a pod of an older profile never stands for the current one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ..api.conditions import format_time
from ..api.v1alpha1 import KVCacheStatus

_KV_LINE = re.compile(r"\b(?:GPU|CPU|XPU|TPU|HPU)? ?KV cache size: ([0-9][0-9,]{0,20}) tokens")
#: More tokens than any KV cache holds (a line made up to overflow the status is ignored).
MAX_TOKENS = 10**12


def measured_tokens(log: str) -> int | None:
    """The tokens of the last "KV cache size: N tokens" line in `log` (the newest start), None without one."""
    found = None
    for match in _KV_LINE.finditer(log):
        digits = match.group(1).replace(",", "")
        if digits and int(digits) <= MAX_TOKENS:
            found = int(digits)
    return found


def runs_plan(pod_args: Sequence[str], plan_args: Sequence[str]) -> bool:
    """Whether a container's args carry the plan's args as they were rendered (a contiguous run)."""
    plan, args = list(plan_args), list(pod_args)
    if not plan:
        return False
    return any(args[i:i + len(plan)] == plan for i in range(len(args) - len(plan) + 1))


def fold_measured(status: Mapping[str, Any], *, pod: str, template: str | None, pod_args: Sequence[str],
                  tokens: int, now: datetime) -> KVCacheStatus | None:
    """The `status.kvCache` for a measurement from `pod` (None: nothing to record — the pod does not run the
    recorded plan, or the same template's measurement is recorded already)."""
    plan = status.get("plan") if isinstance(status.get("plan"), Mapping) else {}
    assert isinstance(plan, Mapping)
    if not runs_plan(pod_args, [str(a) for a in plan.get("args") or []]):
        return None
    recorded = status.get("kvCache") if isinstance(status.get("kvCache"), Mapping) else None
    predicted = plan.get("kvCacheTokens") if isinstance(plan.get("kvCacheTokens"), int) else None
    if recorded is not None and recorded.get("template") == template and recorded.get("measuredTokens") == tokens \
            and recorded.get("predictedTokens") == predicted:
        return None
    difference = tokens - predicted if predicted is not None else None
    percent = round(100.0 * difference / predicted, 1) if difference is not None and predicted else None
    return KVCacheStatus(measured_tokens=tokens, predicted_tokens=predicted, difference_tokens=difference,
                         difference_percent=percent, pod=pod[:253], template=(template or None) and template[:64],
                         time=format_time(now))
