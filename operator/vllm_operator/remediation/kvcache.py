"""What vLLM measured of its KV cache, next to the plan's prediction (pure).

At startup vLLM's engine logs the KV cache it allocated: ``GPU KV cache size: 17,712 tokens`` (``CPU``/``XPU`` on
other devices; vllm/v1/core/kv_cache_utils.py, every release the operator plans for). A serving pod's log holds it
among its first lines. `measured_tokens` reads it from a bounded log tail (hostile text: only the number leaves it);
`fold_measured` puts it next to `status.plan.kvCacheTokens` with the difference — only for a pod that runs the
recorded plan's arguments, so a pod of an older profile never stands for the current one.

With `--max-model-len auto` (or -1; vLLM 0.14+) vLLM fits the context to the KV cache it measured and says so
(vllm/v1/core/kv_cache_utils.py `_auto_fit_max_model_len`): "Auto-fit max_model_len: reduced from 131072 to 98304 to
fit in available KV cache memory (…)" or "Auto-fit max_model_len: full model context length 32768 fits in …".
`auto_fit_length` reads the context it chose, so the status says when vLLM started shorter than the plan.
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
_AUTO_FIT = re.compile(r"Auto-fit max_model_len: (?:reduced from ([0-9]{1,13}) to ([0-9]{1,13}) to fit"
                       r"|full model context length ([0-9]{1,13}) fits)")


def measured_tokens(log: str) -> int | None:
    """The tokens of the last "KV cache size: N tokens" line in `log` (the newest start), None without one."""
    found = None
    for match in _KV_LINE.finditer(log):
        digits = match.group(1).replace(",", "")
        if digits and int(digits) <= MAX_TOKENS:
            found = int(digits)
    return found


def auto_fit_length(log: str) -> tuple[int, int] | None:
    """(the context vLLM's `--max-model-len auto` chose, the model's full context) from the last "Auto-fit
    max_model_len" line in `log`, None without one (an explicit length, or a release before 0.14)."""
    found = None
    for match in _AUTO_FIT.finditer(log):
        full, chosen = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(3))
        if int(chosen) <= MAX_TOKENS and int(full) <= MAX_TOKENS:
            found = (int(chosen), int(full))
    return found


def runs_plan(pod_args: Sequence[str], plan_args: Sequence[str]) -> bool:
    """Whether a container's args carry the plan's args as they were rendered (a contiguous run)."""
    plan, args = list(plan_args), list(pod_args)
    if not plan:
        return False
    return any(args[i:i + len(plan)] == plan for i in range(len(args) - len(plan) + 1))


def fold_measured(status: Mapping[str, Any], *, pod: str, template: str | None, pod_args: Sequence[str],
                  tokens: int, now: datetime, auto_fit: tuple[int, int] | None = None) -> KVCacheStatus | None:
    """The `status.kvCache` for a measurement from `pod` (None: nothing to record — the pod does not run the
    recorded plan, or the same template's measurement is recorded already)."""
    plan = status.get("plan") if isinstance(status.get("plan"), Mapping) else {}
    assert isinstance(plan, Mapping)
    if not runs_plan(pod_args, [str(a) for a in plan.get("args") or []]):
        return None
    recorded = status.get("kvCache") if isinstance(status.get("kvCache"), Mapping) else None
    predicted = plan.get("kvCacheTokens") if isinstance(plan.get("kvCacheTokens"), int) else None
    chosen = auto_fit[0] if auto_fit else None
    flags = plan.get("flags")
    length = flags.get("maxModelLen") if isinstance(flags, Mapping) else None
    planned = length if chosen is not None and isinstance(length, int) and not isinstance(length, bool) else None
    if recorded is not None and recorded.get("template") == template and recorded.get("measuredTokens") == tokens \
            and recorded.get("predictedTokens") == predicted and recorded.get("maxModelLen") == chosen:
        return None
    difference = tokens - predicted if predicted is not None else None
    percent = round(100.0 * difference / predicted, 1) if difference is not None and predicted else None
    return KVCacheStatus(measured_tokens=tokens, predicted_tokens=predicted, difference_tokens=difference,
                         difference_percent=percent, pod=pod[:253], template=(template or None) and template[:64],
                         time=format_time(now), max_model_len=chosen, planned_max_model_len=planned)


def context_reduced(kv_cache: KVCacheStatus) -> str | None:
    """The Warning to post when vLLM's `--max-model-len auto` started with a shorter context than the plan (None:
    it did not, or the length was explicit)."""
    chosen, planned = kv_cache.max_model_len, kv_cache.planned_max_model_len
    if chosen is None or planned is None or chosen >= planned:
        return None
    return (f"vLLM's --max-model-len auto started pod {kv_cache.pod} with a context of {chosen:,} tokens where the "
            f"plan expected {planned:,}: its KV cache ({kv_cache.measured_tokens:,} tokens) is smaller than "
            f"predicted ({kv_cache.predicted_tokens if kv_cache.predicted_tokens is not None else '?'}). Requests "
            f"longer than {chosen:,} tokens are refused; pin spec.flags.maxModelLen to make a longer context a "
            f"startup failure the operator remediates instead")
