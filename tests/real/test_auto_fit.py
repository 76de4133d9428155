"""`--max-model-len auto` against the real process: the plan keeps the model's full context (an L4's KV cache holds
its 2,097,152 tokens at 1 KiB each), so the operator renders `auto`; the real process has 1 GiB of CPU KV cache
(1,048,576 tokens), fits the context to it, says so in its own words ("Auto-fit max_model_len: reduced from … to …")
and serves. The operator reads that line back: `status.kvCache.maxModelLen` next to the plan's, and a
`ContextReducedByVLLM` Warning."""

from __future__ import annotations

import re

import pytest
from realkit import LONG_CONTEXT, TINY_AUTO, RealCluster, echo, tiny_spec, until

from kit.specs import vllmservice

pytestmark = pytest.mark.timeout(900)


def test_vllms_auto_fit_is_read_back_into_the_status_and_an_event(real: RealCluster) -> None:
    real.cluster.apply(vllmservice(tiny_spec(TINY_AUTO), name="auto"))
    try:
        first = until(lambda: real.pods("auto"), 60, "the first pod")[0]
        args = first["spec"]["containers"][0]["args"]
        assert args[args.index("--max-model-len") + 1] == "auto", args
        real.wait_ready("auto", timeout=600)
        [run] = [r for r in real.runner.history if r.uid == first["metadata"]["uid"]]
        logged = run.log_path.read_text(errors="replace")
        found = re.search(r"Auto-fit max_model_len: reduced from (\d+) to (\d+) to fit in available KV cache memory",
                          logged)
        assert found is not None, logged[-3000:]
        echo(f"real vLLM: {found.group(0)}")
        assert int(found.group(1)) == LONG_CONTEXT and int(found.group(2)) < LONG_CONTEXT

        def recorded() -> dict | None:
            kv = ((real.api.get_object("vllmservices", "auto", "default") or {}).get("status") or {}).get("kvCache")
            return kv if kv and kv.get("maxModelLen") else None

        kv = until(recorded, 120, "status.kvCache.maxModelLen")
        assert kv["maxModelLen"] == int(found.group(2)) and kv["plannedMaxModelLen"] == LONG_CONTEXT, kv
        events = until(lambda: [e for e in real.api.list_objects("events", "default")
                                if e.get("reason") == "ContextReducedByVLLM"], 60, "a ContextReducedByVLLM Event")
        assert f"{kv['maxModelLen']:,} tokens where the plan expected {LONG_CONTEXT:,}" in events[0]["message"]
    finally:
        real.delete("auto")
