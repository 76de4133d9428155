"""Read which command-line flags `vllm serve` accepts in each vLLM release, from the release's own argument parser.

    python scripts/vllm_flags.py --download 0.6.0 0.6.1 ... --work /tmp/vf   # fetch wheels, keep their vllm/*.py
    python scripts/vllm_flags.py --write DIR...     # regenerate catalog/vllm_flags_cli.yaml from unpacked sources
    python scripts/vllm_flags.py --check DIR...     # exit 1 when the checked-in table differs from the sources
    python scripts/vllm_flags.py --show DIR         # one release's flags, one a line

DIR is an unpacked wheel's root (DIR/vllm/...), named by its release (…/0.32.0). `--download` runs `pip download
--no-deps vllm==X`, unzips the wheel's `vllm/*.py` into WORK/src/X and deletes the wheel.

How a release builds its parser (read from the wheels, no vLLM import, no GPU): `vllm serve` is a subcommand whose
parser is passed to `make_arg_parser` (`vllm/scripts.py` up to 0.7, `entrypoints/cli/serve.py` after; the OpenAI
server module calls the same function), which adds the server's flags and calls `AsyncEngineArgs.add_cli_args`, which
calls `EngineArgs.add_cli_args`. This script starts at the serve subcommand, follows those calls (a class's
`add_cli_args`, inherited ones included, and module functions handed the parser), and collects every
`add_argument(...)`:
- option strings written out (`"--tensor-parallel-size", "-tp"`);
- option strings built in a loop over a config dataclass's fields (`for key, value in get_kwargs(cls).items():
  add_argument(f"--{key.replace('_', '-')}", **value)`, the frontend arguments from 0.10), with the extra option
  strings a class adds as `kwargs[field]["flags"] = [...]`;
- whether a flag takes a value: `action="store_true"` and friends take none, `BooleanOptionalAction` also makes
  `--no-<flag>`, `nargs` says how many; `**kwargs["field"]` of `get_kwargs(SomeConfig)` is read from the field's
  annotation, as `get_kwargs` does (a `bool` field is a `BooleanOptionalAction` where that release's `get_kwargs`
  says so, else `store_true`; `bool | str` takes an optional value).
`FlexibleArgumentParser.parse_args` also rewrites `-O3` into a long flag (which one depends on the release): that
rewrite is read from its source and recorded as an alias that takes its value joined.

The output lists, per flag, the spans of releases that have it (`[since, removed]`, `removed` the first checked
release without it). Pure standard library.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "operator" / "vllm_operator" / "catalog" / "vllm_flags_cli.yaml"

#: The parts of a release whose modules build the serve parser (relative to DIR/vllm); others are never followed.
_SCANNED = ("engine", "entrypoints", "config", "config.py", "scripts.py", "utils", "utils.py", "model_executor/"
            "model_loader/tensorizer.py")
_MAX_DEPTH = 12

#: What a flag takes after it: nothing, one word, an optional word, or one or more words.
TAKES = ("none", "one", "optional", "many")
_NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}


@dataclass
class Flag:
    takes: str = "one"
    aliases: set[str] = field(default_factory=set)


@dataclass
class Release:
    """One release's serve parser: long flag → what it takes, short/joined aliases → long flag."""

    flags: dict[str, Flag] = field(default_factory=dict)
    joined: dict[str, str] = field(default_factory=dict)  # "-O" → the flag `-O3` becomes
    #: --max-model-len takes `auto` / -1 (its type is `human_readable_int_or_auto`, from 0.14.0)
    auto_length: bool = False

    def add(self, options: list[str], takes: str, negatable: bool) -> None:
        longs = [o for o in options if o.startswith("--")]
        if not longs:
            return
        name = longs[0]
        entry = self.flags.setdefault(name, Flag(takes=takes))
        entry.takes = takes
        entry.aliases |= {o for o in options if o != name}
        if negatable:
            self.flags.setdefault("--no-" + name[2:], Flag(takes="none"))


class _Module:
    def __init__(self, name: str, tree: ast.Module) -> None:
        self.name = name
        self.tree = tree
        self.defs: dict[str, ast.FunctionDef | ast.ClassDef] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name → (module, name there)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                self.defs[node.name] = node
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module, alias.name)
            elif isinstance(node, ast.ImportFrom) and node.level:
                base = name.split(".")[: -node.level] if not name.endswith("__init__") else name.split(".")[:-1]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (target, alias.name)


class Source:
    """The parsed modules of one release (only the parts that build the serve parser)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: dict[str, _Module] = {}
        base = root / "vllm"
        for part in _SCANNED:
            path = base / part
            files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.is_file() else []
            for file in files:
                name = ".".join(file.relative_to(root).with_suffix("").parts)
                name = name[: -len(".__init__")] if name.endswith(".__init__") else name
                try:
                    tree = ast.parse(file.read_text(encoding="utf-8", errors="replace"))
                except SyntaxError:
                    continue
                self.modules[name] = _Module(name, tree)

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[_Module, ast.FunctionDef | ast.ClassDef] | None:
        """The definition `name` means in `module`, following `from x import y` re-exports."""
        mod = self.modules.get(module)
        if mod is None or depth > 6:
            return None
        if name in mod.defs:
            return mod, mod.defs[name]
        if name in mod.imports:
            target, there = mod.imports[name]
            return self.resolve(target, there, depth + 1)
        return None

    def find_class(self, module: _Module, name: str) -> tuple[_Module, ast.ClassDef] | None:
        found = self.resolve(module.name, name)
        if found and isinstance(found[1], ast.ClassDef):
            return found[0], found[1]
        return None

    def fields(self, module: _Module, cls: ast.ClassDef, depth: int = 0) -> dict[str, str]:
        """A config dataclass's fields (bases first, as `dataclasses.fields` orders them) → annotation source."""
        out: dict[str, str] = {}
        if depth > 8:
            return out
        for base in cls.bases:
            base_name = _dotted(base)
            found = self.find_class(module, base_name.rsplit(".", 1)[-1]) if base_name else None
            if found:
                out.update(self.fields(found[0], found[1], depth + 1))
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                annotation = ast.unparse(stmt.annotation)
                if "ClassVar" in annotation or "InitVar" in annotation:
                    continue
                out[stmt.target.id] = annotation
        return out

    def method(self, module: _Module, cls: ast.ClassDef, name: str,
               depth: int = 0) -> tuple[_Module, ast.ClassDef, ast.FunctionDef] | None:
        """`cls.name` as Python finds it: the class's own, else the first base that has it."""
        for stmt in cls.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
                return module, cls, stmt
        if depth > 8:
            return None
        for base in cls.bases:
            base_name = _dotted(base)
            found = self.find_class(module, base_name.rsplit(".", 1)[-1]) if base_name else None
            if found:
                hit = self.method(found[0], found[1], name, depth + 1)
                if hit:
                    return hit
        return None


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _annotation_takes(annotation: str, boolean_optional: bool) -> tuple[str, bool]:
    """What a `get_kwargs` field takes, from its annotation: (takes, makes --no-<flag>)."""
    words = set(re.findall(r"[A-Za-z_]+", annotation))
    if "bool" in words:
        if "str" in words:
            return "optional", False
        return "none", boolean_optional
    if words & {"list", "List", "tuple", "Tuple", "set", "Set"} and not words & {"dict", "Dict"}:
        return "many", False
    return "one", False


def _kwargs_key(node: ast.expr) -> tuple[str, str] | None:
    """`kwargs["field"]["key"]` → ("field", "key")."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and \
            isinstance(node.value, ast.Subscript) and isinstance(node.value.slice, ast.Constant):
        return str(node.value.slice.value), str(node.slice.value)
    return None


def _call_takes(call: ast.Call) -> tuple[str, bool]:
    """What an add_argument call's flag takes, from its keywords: (takes, makes --no-<flag>)."""
    takes, negatable = "one", False
    for kw in call.keywords:
        if kw.arg == "action":
            if isinstance(kw.value, ast.Constant) and kw.value.value in _NO_VALUE_ACTIONS:
                takes = "none"
            elif _dotted(kw.value).endswith("BooleanOptionalAction"):
                takes, negatable = "none", True
        elif kw.arg == "nargs" and isinstance(kw.value, ast.Constant):
            if kw.value.value == "?":
                takes = "optional"
            elif kw.value.value in ("+", "*") or isinstance(kw.value.value, int) and kw.value.value > 1:
                takes = "many"
            elif kw.value.value == 0:
                takes = "none"
    return takes, negatable


class _Walker:
    def __init__(self, source: Source) -> None:
        self.source = source
        self.release = Release()
        self.seen: set[tuple[str, str, str]] = set()

    def kwargs_uses_boolean_optional(self, module: _Module) -> bool:
        """Whether this release's get_kwargs turns a bool field into --flag/--no-flag."""
        for mod_name in (module.name, "vllm.engine.arg_utils"):
            mod = self.source.modules.get(mod_name)
            if mod is None:
                continue
            for name in ("_compute_kwargs", "get_kwargs"):
                node = mod.defs.get(name)
                if node is not None and "BooleanOptionalAction" in ast.unparse(node):
                    return True
        return False

    def visit(self, module: _Module, func: ast.FunctionDef, *, cls: tuple[_Module, ast.ClassDef] | None,
              receivers: set[str] | None, depth: int) -> None:
        key = (module.name, cls[1].name if cls else "", func.name)
        if key in self.seen or depth > _MAX_DEPTH:
            return
        self.seen.add(key)
        kwargs_of = self._kwargs_vars(module, func, cls)
        extra_flags = self._extra_flags(cls) if cls is not None else {}
        boolean_optional = self.kwargs_uses_boolean_optional(module)
        for node in ast.walk(func):
            if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and \
                    isinstance(node.iter.func, ast.Attribute) and node.iter.func.attr == "items" and \
                    isinstance(node.iter.func.value, ast.Name) and node.iter.func.value.id in kwargs_of:
                self._loop(node, kwargs_of[node.iter.func.value.id], extra_flags, boolean_optional)
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            if isinstance(fn, ast.Attribute) and fn.attr == "add_argument":
                if receivers is not None and not (isinstance(fn.value, ast.Name) and fn.value.id in receivers):
                    continue
                self._add(node, module, kwargs_of, boolean_optional)
            elif isinstance(fn, ast.Attribute) and fn.attr == "add_cli_args":
                self._follow_method(module, fn.value, cls, depth)
            elif isinstance(fn, ast.Name) and any(
                    isinstance(a, ast.Name) and (a.id in receivers if receivers is not None else "parser" in a.id)
                    for a in node.args):
                found = self.source.resolve(module.name, fn.id)
                if found and isinstance(found[1], ast.FunctionDef):
                    self.visit(found[0], found[1], cls=None, receivers=None, depth=depth + 1)

    def _kwargs_vars(self, module: _Module, func: ast.FunctionDef,
                     cls: tuple[_Module, ast.ClassDef] | None) -> dict[str, tuple[_Module, ast.ClassDef]]:
        """Local names bound to a config class's argparse kwargs: `x = get_kwargs(SomeConfig)`, `get_kwargs(cls)`,
        and what a helper makes of them (`x = cls._customize_cli_kwargs(x)`)."""
        kwargs_of: dict[str, tuple[_Module, ast.ClassDef]] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and isinstance(node.value, ast.Call):
                callee = _dotted(node.value.func).rsplit(".", 1)[-1]
                args = node.value.args
                if callee in ("get_kwargs", "_compute_kwargs") and args:
                    target = self._class_arg(module, args[0], cls)
                    if target:
                        kwargs_of[node.targets[0].id] = target
                elif args and isinstance(args[0], ast.Name) and args[0].id in kwargs_of:
                    kwargs_of[node.targets[0].id] = kwargs_of[args[0].id]
        return kwargs_of

    def _class_arg(self, module: _Module, node: ast.expr,
                   cls: tuple[_Module, ast.ClassDef] | None) -> tuple[_Module, ast.ClassDef] | None:
        if isinstance(node, ast.Name) and node.id == "cls" and cls is not None:
            return cls
        name = _dotted(node)
        return self.source.find_class(module, name.rsplit(".", 1)[-1]) if name else None

    def _extra_flags(self, cls: tuple[_Module, ast.ClassDef]) -> dict[tuple[str, str], list[str]]:
        """`kwargs["field"]["flags"] = ["-x"]` in the class (or a base): extra option strings of a looped field."""
        out: dict[tuple[str, str], list[str]] = {}
        for node in ast.walk(cls[1]):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) and \
                        target.slice.value == "flags" and isinstance(target.value, ast.Subscript) and \
                        isinstance(target.value.slice, ast.Constant) and isinstance(node.value, ast.List):
                    out[(cls[1].name, str(target.value.slice.value))] = [
                        e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return out

    def _customized(self, target: tuple[_Module, ast.ClassDef], name: str, takes: str,
                    negatable: bool) -> tuple[str, bool]:
        """What a class's own kwargs edits (`del kwargs["f"]["nargs"]`, `kwargs["f"]["action"] = ...`) make of a
        field's flag; read from every method of the class and its bases."""
        for node in ast.walk(target[1]):
            if isinstance(node, ast.Delete):
                for t in node.targets:
                    if _kwargs_key(t) == (name, "nargs"):
                        takes = "one"
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                key = _kwargs_key(node.targets[0])
                if key is None or key[0] != name:
                    continue
                fake = ast.Call(func=ast.Name("x"), args=[], keywords=[ast.keyword(arg=key[1], value=node.value)])
                if key[1] in ("nargs", "action"):
                    new_takes, new_neg = _call_takes(fake)
                    if key[1] == "nargs" or new_takes == "none":
                        takes, negatable = new_takes, new_neg
        return takes, negatable

    def _loop(self, loop: ast.For, target: tuple[_Module, ast.ClassDef],
              extra: dict[tuple[str, str], list[str]], boolean_optional: bool) -> None:
        """`for key, value in kwargs.items(): group.add_argument(f"--{key...}", **value)`: one flag per field."""
        builds_flag = any(isinstance(n, ast.JoinedStr) and ast.unparse(n).startswith("f'--") or
                          isinstance(n, ast.JoinedStr) and ast.unparse(n).startswith('f"--')
                          for n in ast.walk(loop))
        if not builds_flag:
            return
        for name, annotation in self.source.fields(*target).items():
            takes, negatable = _annotation_takes(annotation, boolean_optional)
            takes, negatable = self._customized(target, name, takes, negatable)
            options = [*extra.get((target[1].name, name), []), "--" + name.replace("_", "-")]
            options.sort(key=lambda o: not o.startswith("--"))
            self.release.add(options, takes, negatable)

    def _add(self, call: ast.Call, module: _Module, kwargs_of: dict[str, tuple[_Module, ast.ClassDef]],
             boolean_optional: bool) -> None:
        options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                   and a.value.startswith("-")]
        if not options:
            return
        takes, negatable = _call_takes(call)
        explicit = any(k.arg in ("action", "nargs") for k in call.keywords)
        for kw in call.keywords:
            if kw.arg is not None or explicit:
                continue
            # **kwargs["field"], or **{**kwargs["field"], "default": None}
            spread = [kw.value] if not isinstance(kw.value, ast.Dict) else \
                [v for k, v in zip(kw.value.keys, kw.value.values, strict=True) if k is None]
            for value in spread:
                if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) \
                        and isinstance(value.slice, ast.Constant) and value.value.id in kwargs_of:
                    target = kwargs_of[value.value.id]
                    name = str(value.slice.value)
                    annotation = self.source.fields(*target).get(name)
                    if annotation is not None:
                        takes, negatable = _annotation_takes(annotation, boolean_optional)
                        takes, negatable = self._customized(target, name, takes, negatable)
        options.sort(key=lambda o: not o.startswith("--"))
        self.release.add(options, takes, negatable)

    def _follow_method(self, module: _Module, owner: ast.expr, cls: tuple[_Module, ast.ClassDef] | None,
                       depth: int) -> None:
        if isinstance(owner, ast.Call) and _dotted(owner.func) == "super" and cls is not None:
            for base in cls[1].bases:
                found = self.source.find_class(cls[0], _dotted(base).rsplit(".", 1)[-1])
                if found:
                    hit = self.source.method(found[0], found[1], "add_cli_args")
                    if hit:
                        self.visit(hit[0], hit[2], cls=cls, receivers=None, depth=depth + 1)
                        return
            return
        target = cls if isinstance(owner, ast.Name) and owner.id == "cls" else \
            self.source.find_class(module, _dotted(owner).rsplit(".", 1)[-1]) if _dotted(owner) else None
        if target is None:
            return
        hit = self.source.method(target[0], target[1], "add_cli_args")
        if hit:
            self.visit(hit[0], hit[2], cls=target, receivers=None, depth=depth + 1)


#: Where `vllm serve` hands its parser to make_arg_parser, newest layout first.
_SERVE_MODULES = ("vllm.entrypoints.cli.serve", "vllm.scripts")


def read_release(root: Path) -> Release:
    """The flags `vllm serve MODEL ...` accepts in the release unpacked at `root`."""
    source = Source(root)
    walker = _Walker(source)
    for name in _SERVE_MODULES:
        module = source.modules.get(name)
        if module is None:
            continue
        for func in _functions(module.tree):
            for node in ast.walk(func):
                if isinstance(node, ast.Call) and _dotted(node.func).endswith("make_arg_parser") and node.args \
                        and isinstance(node.args[0], ast.Name):
                    receivers = {node.args[0].id}
                    walker.visit(module, func, cls=None, receivers=receivers, depth=0)
        if walker.release.flags:
            break
    joined = _joined_aliases(source)
    for alias, target in joined.items():
        if not target.startswith("--"):  # `-O3` → `-O 3`: the long flag -O is an alias of
            target = next((name for name, flag in walker.release.flags.items() if alias in flag.aliases), "")
        if target:
            walker.release.joined[alias] = target
    walker.release.auto_length = any(
        "human_readable_int_or_auto" in module.defs for module in source.modules.values())
    return walker.release


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            yield node


def _joined_aliases(source: Source) -> dict[str, str]:
    """`-O3` → the long flag FlexibleArgumentParser.parse_args rewrites it into (absent: argparse's own -O)."""
    out: dict[str, str] = {}
    for module in source.modules.values():
        cls = module.defs.get("FlexibleArgumentParser")
        if not isinstance(cls, ast.ClassDef):
            continue
        text = ast.unparse(cls)
        match = re.search(r"startswith\('-O'\)(.{0,600})", text, re.S)
        if match:
            target = re.search(r"'(--[a-z][a-z0-9-]*)'", match.group(1))
            out["-O"] = target.group(1) if target else "-O"
    return out


# ---- the table ------------------------------------------------------------------------------------------------


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def build_table(releases: dict[str, Release]) -> dict[str, object]:
    """{flag: {takes, spans}} and {alias: [{to, spans}]} over the releases, in release order."""
    order = sorted(releases, key=version_key)
    flags: dict[str, dict[str, object]] = {}
    aliases: dict[str, list[dict[str, object]]] = {}
    names = sorted({f for r in releases.values() for f in r.flags})
    for name in names:
        present = [name in releases[v].flags for v in order]
        # what a flag takes can change between releases (0.8.0's --enable-chunked-prefill takes an optional
        # True/False, 0.8.5's none): then `takes` lists [since, takes] from the first release that has it
        changes: list[list[str]] = []
        for v in order:
            if name in releases[v].flags and (not changes or changes[-1][1] != releases[v].flags[name].takes):
                changes.append([v, releases[v].flags[name].takes])
        flags[name] = {"takes": changes[0][1] if len(changes) == 1 else changes, "spans": _spans(order, present)}
    alias_targets: dict[str, set[str]] = {}
    for r in releases.values():
        for name, flag in r.flags.items():
            for alias in flag.aliases:
                alias_targets.setdefault(alias, set()).add(name)
        for alias, target in r.joined.items():
            alias_targets.setdefault(alias, set()).add(target)
    for alias in sorted(alias_targets):
        rows = []
        for target in sorted(alias_targets[alias]):
            present = [(alias in releases[v].flags.get(target, Flag()).aliases) or releases[v].joined.get(alias) ==
                       target for v in order]
            row: dict[str, object] = {"to": target, "spans": _spans(order, present)}
            if any(releases[v].joined.get(alias) == target for v in order):
                row["joined"] = True
            rows.append(row)
        aliases[alias] = rows
    auto = [releases[v].auto_length for v in order]
    values = {"--max-model-len auto": _spans(order, auto)} if any(auto) else {}
    return {"releases": order, "flags": flags, "aliases": aliases, "values": values}


def _spans(order: list[str], present: list[bool]) -> list[list[str | None]]:
    spans: list[list[str | None]] = []
    for i, here in enumerate(present):
        if here and (i == 0 or not present[i - 1]):
            spans.append([order[i], None])
        elif not here and i > 0 and present[i - 1]:
            spans[-1][1] = order[i]
    return spans


_HEADER = """\
# Every flag `vllm serve` accepts, per vLLM release, read from each release's own argument parser in its wheel.
# GENERATED by scripts/vllm_flags.py (see its docstring for how); do not edit: regenerate with
#   python scripts/vllm_flags.py --download VERSIONS... --work DIR && python scripts/vllm_flags.py --write DIR/src/*
# releases: the wheels read. flags: takes none | one | optional | many words (or [since, takes] where that changed);
# spans: [since, removed], `removed` the first release read without it (null: still there in the newest). aliases: short forms; `joined`: the value may
# follow without a space (-O3), rewritten by vLLM's FlexibleArgumentParser.
"""


def dump_table(table: dict[str, object]) -> str:
    """The table as YAML, one flag a line (written by hand: the project's YAML loader reads it back)."""
    lines = [_HEADER.rstrip("\n")]
    releases = table["releases"]
    assert isinstance(releases, list)
    lines.append("releases: [" + ", ".join(f'"{v}"' for v in releases) + "]")
    lines.append("flags:")
    flags = table["flags"]
    assert isinstance(flags, dict)
    for name, row in flags.items():
        takes = row["takes"]
        takes_text = takes if isinstance(takes, str) else \
            "[" + ", ".join(f'["{since}", {what}]' for since, what in takes) + "]"
        lines.append(f'  "{name}": {{takes: {takes_text}, spans: {_spans_text(row["spans"])}}}')
    lines.append("aliases:")
    aliases = table["aliases"]
    assert isinstance(aliases, dict)
    for alias, rows in aliases.items():
        parts = []
        for row in rows:
            joined = ", joined: true" if row.get("joined") else ""
            parts.append(f'{{to: "{row["to"]}", spans: {_spans_text(row["spans"])}{joined}}}')
        lines.append(f'  "{alias}": [' + ", ".join(parts) + "]")
    lines.append("# values a flag takes only in some releases (`--max-model-len auto`, also -1: auto-fit the context)")
    lines.append("values:")
    values = table["values"]
    assert isinstance(values, dict)
    for name, spans in values.items():
        lines.append(f'  "{name}": {_spans_text(spans)}')
    return "\n".join(lines) + "\n"


def _spans_text(spans: Iterable[list[str | None]]) -> str:
    return "[" + ", ".join(f'["{a}", {"null" if b is None else chr(34) + b + chr(34)}]' for a, b in spans) + "]"


def read_dirs(dirs: Iterable[str]) -> dict[str, Release]:
    out: dict[str, Release] = {}
    for d in dirs:
        path = Path(d)
        version = path.name
        if not re.fullmatch(r"\d+\.\d+\.\d+", version):
            raise SystemExit(f"{d}: name the directory by its release (x.y.z; post and 4-part releases are skipped)")
        release = read_release(path)
        if not release.flags:
            raise SystemExit(f"{d}: no serve parser found (is it an unpacked vLLM wheel?)")
        out[version] = release
    return out


def download(versions: Iterable[str], work: Path) -> None:
    """pip download each release's wheel, keep its vllm/*.py under WORK/src/VERSION, delete the wheel."""
    for version in versions:
        dest = work / "src" / version
        if (dest / "vllm").is_dir():
            continue
        wheels = work / "wheels" / version
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"vllm=={version}", "-d",
                        str(wheels)], check=True)
        for wheel in wheels.glob("*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.namelist():
                    if member.startswith("vllm/") and member.endswith(".py"):
                        archive.extract(member, dest)
        shutil.rmtree(wheels)
        print(f"{version}: {dest}")


def real_release() -> Release:
    """The serve parser of the vLLM installed in this interpreter, read from the parser object itself (for the
    cross-check of the static reading: `--real` prints it as `--show` does). Needs vLLM importable."""
    import importlib

    serve = importlib.import_module("vllm.entrypoints.cli.serve")
    utils = importlib.import_module("vllm.utils.argparse_utils")
    top = utils.FlexibleArgumentParser(prog="vllm")
    sub = top.add_subparsers()
    parser = serve.ServeSubcommand().subparser_init(sub)
    release = Release()
    for action in parser._actions:
        options = sorted(action.option_strings, key=lambda o: not o.startswith("--"))
        if not options or isinstance(action, argparse._HelpAction):
            continue
        if action.nargs == 0:
            takes = "none"
        elif action.nargs == "?":
            takes = "optional"
        elif action.nargs in ("+", "*") or isinstance(action.nargs, int) and action.nargs > 1:
            takes = "many"
        else:
            takes = "one"
        negated = [o for o in options if o.startswith("--no-")]
        plain = [o for o in options if not o.startswith("--no-")]
        release.add(plain, takes, negatable=False)
        for name in negated:
            release.flags.setdefault(name, Flag(takes="none"))
    release.joined = {"-O": "--optimization-level"} if "startswith(\"-O\")" in _source_of(utils) else {}
    return release


def _source_of(module: object) -> str:
    import inspect

    return inspect.getsource(module)  # type: ignore[arg-type]


def _show(release: Release) -> None:
    for name, flag in sorted(release.flags.items()):
        print(name, flag.takes, " ".join(sorted(flag.aliases)))
    for alias, target in release.joined.items():
        print(f"{alias}<value> → {target}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the checked-in table")
    mode.add_argument("--check", action="store_true", help="exit 1 when the checked-in table differs")
    mode.add_argument("--show", action="store_true", help="print one release's flags")
    mode.add_argument("--download", action="store_true", help="fetch the releases named (versions, not DIRs)")
    mode.add_argument("--real", action="store_true",
                      help="print the installed vLLM's own serve parser as --show does (the cross-check)")
    parser.add_argument("--work", default="/tmp/vllm-flags", help="where --download keeps the sources")
    parser.add_argument("--table", default=str(TABLE))
    parser.add_argument("items", nargs="*", help="DIRs (unpacked wheels) or, with --download, versions")
    args = parser.parse_args(argv)
    if args.real:
        _show(real_release())
        return 0
    if args.download:
        download(args.items, Path(args.work))
        return 0
    releases = read_dirs(args.items)
    if args.show:
        for release in releases.values():
            _show(release)
        return 0
    text = dump_table(build_table(releases))
    table = Path(args.table)
    if args.write:
        table.write_text(text)
        print(f"wrote {table} ({len(releases)} releases)")
        return 0
    current = table.read_text() if table.exists() else ""
    if current != text:
        print(f"{table} differs from what these {len(releases)} releases' parsers say; run with --write",
              file=sys.stderr)
        return 1
    print(f"{table} agrees with {len(releases)} releases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
