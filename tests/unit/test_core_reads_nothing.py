"""The reconcile core and the remediation ladder decide over data: neither imports anything from the shell
(`vllm_operator.handlers`), however the import is spelled — an AST scan beside import-linter's layers, which would
also miss an import hidden in a function body executed only at run time."""

from __future__ import annotations

import ast
from pathlib import Path

import vllm_operator

PACKAGE = Path(vllm_operator.__file__).parent
CORE = (PACKAGE / "reconcile.py", PACKAGE / "remediation" / "ladder.py")


def shell_imports(source: str, module: str) -> list[str]:
    """Every import in `source` (of the module named `module`) that resolves into vllm_operator.handlers."""
    package = module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if called in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
                names = [str(node.args[0].value)]
        found += [n for n in names if n == "vllm_operator.handlers" or n.startswith("vllm_operator.handlers.")]
    return found


def test_the_scan_sees_each_spelling() -> None:
    source = ("from .handlers import observe\nfrom ..handlers.kube import get\nimport vllm_operator.handlers.kube\n"
              "from . import handlers\nimportlib.import_module('vllm_operator.handlers.observe')\n"
              "from .render import pods\n")
    found = shell_imports(source, "vllm_operator.remediation.ladder")
    assert "vllm_operator.remediation.handlers.observe" not in found
    assert set(found) >= {"vllm_operator.handlers.kube", "vllm_operator.handlers.kube.get",
                          "vllm_operator.handlers.observe"}
    assert shell_imports("from .handlers import observe\n", "vllm_operator.reconcile") == [
        "vllm_operator.handlers", "vllm_operator.handlers.observe"]
    assert shell_imports("from .render import pods\n", "vllm_operator.reconcile") == []


def test_the_core_and_the_ladder_import_nothing_from_the_shell() -> None:
    for path in CORE:
        module = "vllm_operator." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        assert shell_imports(path.read_text(encoding="utf-8"), module) == [], path
