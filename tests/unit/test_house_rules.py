"""Where things live, checked on the source (AST): kopf's decorators only in handlers/registry.py."""

from __future__ import annotations

import ast
from pathlib import Path

import vllm_operator

PACKAGE = Path(vllm_operator.__file__).parent
REGISTRY = PACKAGE / "handlers" / "registry.py"


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def kopf_decorators(source: str) -> list[str]:
    """The kopf decorators in `source` (`kopf.on.create`, `on.event`, `daemon` imported from kopf, …), used as
    decorators or called on a function."""
    tree = ast.parse(source)
    bare = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.module or "").split(".")[0] == "kopf" for alias in node.names}
    kopf_names = {"kopf"} | {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                             for alias in node.names if alias.name == "kopf"}
    found = []
    for node in ast.walk(tree):
        candidates: list[ast.expr] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            candidates = list(node.decorator_list)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Call):
            candidates = [node.func]  # kopf.on.create(...)(handler)
        for decorator in candidates:
            name = _dotted(decorator)
            head = name.split(".")[0]
            if (head in kopf_names and name.split(".")[1:2] in (["on"], ["daemon"], ["timer"], ["index"])) \
                    or (head in bare and head in ("on", "daemon", "timer", "index")):
                found.append(name)
    return found


def test_the_scan_sees_each_spelling() -> None:
    source = ("import kopf\nimport kopf as k\nfrom kopf import on, daemon\n"
              "@kopf.on.create('g', 'v', 'p')\ndef a(**_): ...\n@k.timer('x', interval=1)\nasync def b(**_): ...\n"
              "@on.event('', 'v1', 'pods')\ndef c(**_): ...\n@daemon('x')\nasync def d(**_): ...\n"
              "kopf.on.update('g', 'v', 'p')(a)\n@functools.cache\ndef e(): ...\nkopf.run(registry=r)\n")
    assert sorted(kopf_decorators(source)) == ["daemon", "k.timer", "kopf.on.create", "kopf.on.update", "on.event"]


def test_only_the_registry_uses_kopf_decorators() -> None:
    found = {str(path.relative_to(PACKAGE)): names for path in sorted(PACKAGE.rglob("*.py")) if path != REGISTRY
             for names in [kopf_decorators(path.read_text(encoding="utf-8"))] if names}
    assert not found, f"kopf handlers outside handlers/registry.py (add a delegate there instead): {found}"
    assert len(kopf_decorators(REGISTRY.read_text(encoding="utf-8"))) >= 10
