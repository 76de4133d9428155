"""Every write to the Kubernetes API goes through `handlers/effects.py` (over `handlers/kube.py`, the only module that
holds the client): an AST scan of the shell for write calls anywhere else.

A write call is a call of `kube`'s writing functions (`create`, `patch`, `delete`, `post_event`, `_call`), however
imported, or of a kubernetes-client method whose name says it writes (`create_…`, `patch_…`, `replace_…`,
`delete_…`), or `kube.client().call_api`. No module is excepted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import vllm_operator.handlers as handlers

HANDLERS = Path(handlers.__file__).parent
ALLOWED = {"effects.py", "kube.py"}
KUBE_WRITES = {"create", "patch", "delete", "post_event", "_call"}
CLIENT_WRITE_PREFIXES = ("create_", "patch_", "replace_", "delete_")


def writes(source: str) -> set[str]:
    """The write calls in a module's source, as `kube.patch` / `create_namespaced_pod` / `patch` (imported bare)."""
    tree = ast.parse(source)
    bare = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.module or "").endswith("kube") for alias in node.names if alias.name in KUBE_WRITES}
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if owner == "kube" and func.attr in KUBE_WRITES:
                found.add(f"kube.{func.attr}")
            elif func.attr.startswith(CLIENT_WRITE_PREFIXES) and owner not in ("effects", "asyncio"):
                found.add(func.attr)
            elif func.attr == "call_api":
                found.add("call_api")
        elif isinstance(func, ast.Name) and func.id in bare:
            found.add(func.id)
    return found


def test_the_scan_sees_each_kind_of_write() -> None:
    source = ("from . import effects, kube\nfrom .kube import patch as p\nimport asyncio\n"
              "kube.create(1)\np(2)\napi.replace_namespaced_deployment(3)\nkube.client().call_api('PATCH')\n"
              "effects.patch_status(4)\nkube.get(5)\nasyncio.create_task(6)\n")
    assert writes(source) == {"kube.create", "p", "replace_namespaced_deployment", "call_api"}


def test_only_effects_writes_to_the_api() -> None:
    found = {(path.name, call) for path in sorted(HANDLERS.glob("*.py")) if path.name not in ALLOWED
             for call in writes(path.read_text(encoding="utf-8"))}
    assert not found, f"API writes outside handlers/effects.py (write through effects instead): {sorted(found)}"
