"""Where things live, checked on the source (AST): kopf's decorators only in handlers/registry.py; condition types
and reasons only in api/conditions.py (every other module names them by its constants, never by a literal)."""

from __future__ import annotations

import ast
from pathlib import Path

import vllm_operator

PACKAGE = Path(vllm_operator.__file__).parent
REGISTRY = PACKAGE / "handlers" / "registry.py"
CONDITIONS = PACKAGE / "api" / "conditions.py"
#: Calls that make a condition, and where their type and reason go: positional indexes, keyword names.
CONDITION_MAKERS = {"ConditionUpdate": ((0, 2), ("type", "reason")), "Condition": ((), ("type", "reason")),
                    "Blocker": ((0,), ("reason",)), "CachePlan": ((), ("reason",))}


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


def _literal(node: ast.expr) -> bool:
    """Whether the value of `node` may be a string written here: a literal, an f-string, or one as a branch."""
    if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return True
    if isinstance(node, ast.IfExp):
        return _literal(node.body) or _literal(node.orelse)
    if isinstance(node, ast.BoolOp):
        return any(_literal(v) for v in node.values)
    if isinstance(node, ast.BinOp):
        return _literal(node.left) or _literal(node.right)
    return False


def literal_reasons(source: str) -> list[str]:
    """Condition types and reasons written as string literals (or f-strings, or a literal fallback) in `source`:
    an argument of `ConditionUpdate`, `Condition`, a multi-node `Blocker`, a `CachePlan`, or a condition dict."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if callee not in CONDITION_MAKERS:
                continue
            positions, keywords = CONDITION_MAKERS[callee]
            args = [node.args[i] for i in positions if i < len(node.args)]
            args += [k.value for k in node.keywords if k.arg in keywords]
            found += [f"{callee}: {ast.unparse(a)}" for a in args if _literal(a)]
        elif isinstance(node, ast.Dict):  # {"type": "Ready", "status": ..., "reason": "X"}: a condition by hand
            keys = {k.value: v for k, v in zip(node.keys, node.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            if {"type", "status", "reason"} <= set(keys):
                found += [f"dict: {ast.unparse(keys[k])}" for k in ("type", "reason") if _literal(keys[k])]
    return found


def test_the_reason_scan_sees_literals() -> None:
    source = ("cond.ConditionUpdate('Ready', cond.TRUE, 'Fine', 'ok')\n"
              "ConditionUpdate(cond.READY, cond.TRUE, reason or 'Fallback')\n"
              "ConditionUpdate(cond.READY, cond.TRUE, cond.A if kind == 'x' else cond.B)\n"
              "ConditionUpdate(type=cond.READY, status=cond.TRUE, reason=f'{x}Bad')\n"
              "Blocker('NoLWS', 'message', None)\nCachePlan(volume={}, reason='Ephemeral')\n"
              "x = {'type': 'Ready', 'status': 'True', 'reason': 'ByHand'}\n"
              "cond.ConditionUpdate(cond.READY, cond.TRUE, cond.AS_EXPECTED, 'a literal message is fine')\n"
              "Event('Warning', 'AnEventReason', 'not a condition')\n")
    assert literal_reasons(source) == ["ConditionUpdate: 'Ready'", "ConditionUpdate: 'Fine'",
                                       "ConditionUpdate: reason or 'Fallback'", "ConditionUpdate: f'{x}Bad'",
                                       "Blocker: 'NoLWS'", "CachePlan: 'Ephemeral'", "dict: 'Ready'",
                                       "dict: 'ByHand'"]


def test_condition_types_and_reasons_come_from_api_conditions() -> None:
    found = {str(path.relative_to(PACKAGE)): names for path in sorted(PACKAGE.rglob("*.py")) if path != CONDITIONS
             for names in [literal_reasons(path.read_text(encoding="utf-8"))] if names}
    assert not found, f"condition types/reasons as literals (add a constant to api/conditions.py): {found}"


def test_every_condition_type_is_camel_case_and_named_once() -> None:
    from vllm_operator.api import conditions as cond

    types = cond.CONDITION_TYPES + cond.FEATURE_CONDITION_TYPES
    assert len(set(types)) == len(types)
    assert all(t[0].isupper() and t.isalnum() for t in types), types
    assert set(cond.METRICS_REASONS) <= set(cond.ALL_REASONS)
