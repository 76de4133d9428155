"""Rules for every test directory.

No test passes by skipping over a missing module: ``pytest.importorskip`` in a test (or fixture) that carries no
marker of an optional extra (``vllm``) is reported as a failure, so a renamed or missing module cannot silently turn
a test into a skip.
"""

from __future__ import annotations

from typing import Any

import pytest

#: Markers of the optional extras a test may skip without (pyproject.toml's [tool.pytest.ini_options] markers).
OPTIONAL_EXTRAS = frozenset({"vllm"})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    excinfo = call.excinfo
    if (report.skipped and excinfo is not None and excinfo.errisinstance(pytest.skip.Exception)
            and any(entry.name == "importorskip" for entry in excinfo.traceback)
            and not any(item.get_closest_marker(name) for name in OPTIONAL_EXTRAS)):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid}: skipped over a missing module ({excinfo.value}); a test may only do that "
                           f"with a marker of an optional extra ({', '.join(sorted(OPTIONAL_EXTRAS))})")
    return report
