"""JSON from the API server, bounded in depth: one stored object can never stop the operator.

The API server stores objects nested up to 10,000 levels (its JSON parser's limit); Python's json module (C scanner
and encoder alike) raises RecursionError at about 1,000, and kopf decodes every watch event and list with it: one
VLLMService with a 1,500-level `spec.model.config` made kopf's watch raise, and `vllm-operator run` exit, in a crash
loop on every restart. `loads` cuts every value deeper than MAX_DEPTH to a marker string before decoding, so the
object arrives (its deep field then fails spec validation with InvalidSpec naming it) and every other object is
decoded exactly as json.loads would. `install` puts it under kopf's watch streams and lists; `kube` reads with it.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
from itertools import accumulate
from typing import Any

import aiohttp

__all__ = ["CUT", "MAX_DEPTH", "install", "loads", "max_depth"]

log = logging.getLogger("vllm_operator")

#: The deepest nesting kept, counted from the document's root (a watch event's object is level 2). A valid
#: VLLMService nests about 20 levels; the spec's own bound (api.v1alpha1.MAX_SPEC_DEPTH) is below this, so a cut
#: value always fails validation, naming its field.
MAX_DEPTH = 64
#: What a cut value becomes.
CUT = f"<nested deeper than {MAX_DEPTH} levels: cut by vllm-operator>"
_CUT_JSON = json.dumps(CUT)
# the only places nesting changes: a string (skipped whole, escapes included) or a bracket
_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_STEP = {"{": 1, "[": 1, "}": -1, "]": -1}


def max_depth(text: str) -> int:
    """How deep a JSON document nests (0 for a scalar), without parsing it and without recursion (the strings
    dropped and the brackets summed in C: a few microseconds for a watch event)."""
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", text))
    if not brackets:
        return 0
    return max(accumulate(map(_STEP.__getitem__, brackets)))


def _cut(text: str, limit: int) -> str:
    """`text` with every array or object that opens below `limit` levels replaced by the CUT string."""
    out: list[str] = []
    depth = 0
    skip_from: int | None = None  # the depth at which the value being skipped opened
    last = 0
    for match in _STRUCTURE.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if skip_from is None and depth > limit:
                out.append(text[last:match.start()])
                out.append(_CUT_JSON)
                skip_from = depth
        elif token in "]}":
            if skip_from is not None and depth == skip_from:
                skip_from = None
                last = match.end()
            depth -= 1
    if skip_from is None:
        out.append(text[last:])
    return "".join(out)


def loads(data: str | bytes | bytearray, limit: int = MAX_DEPTH) -> Any:
    """json.loads, with every value nested deeper than `limit` levels replaced by CUT (never a RecursionError)."""
    text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    if text.count("[") + text.count("{") > limit and max_depth(text) > limit:
        text = _cut(text, limit)
    return json.loads(text)


class _BoundedJSON:
    """Stands in for the json module inside kopf's API client (it calls only json.loads on watch lines)."""

    loads = staticmethod(loads)
    dumps = staticmethod(json.dumps)
    JSONDecodeError = json.JSONDecodeError


_installed = False


def install() -> bool:
    """Decode kopf's watch events and lists with `loads`. False (and a warning) when kopf's layout is not the one
    this was written for (kopf 1.45: `kopf._cogs.clients.api` streams with `json.loads`, lists with aiohttp's
    `ClientResponse.json`)."""
    global _installed
    if _installed:
        return True
    try:  # private, but the one place kopf decodes what the API server sends
        api: Any = importlib.import_module("kopf._cogs.clients.api")
    except ImportError:
        api = None
    if api is None or getattr(api, "json", None) is not json or not hasattr(api, "stream"):
        log.warning("kopf's watch decoder is not where vllm-operator expects it: objects nested deeper than about "
                    "1,000 levels may stop the operator")
        return False
    api.json = _BoundedJSON
    original = aiohttp.ClientResponse.json

    async def bounded_json(self: aiohttp.ClientResponse, *, encoding: str | None = None, loads: Any = loads,
                           content_type: str | None = "application/json") -> Any:
        return await original(self, encoding=encoding, loads=loads, content_type=content_type)

    aiohttp.ClientResponse.json = bounded_json  # type: ignore[method-assign]
    _installed = True
    return True
