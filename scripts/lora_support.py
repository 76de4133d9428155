"""Read which model architectures a vLLM release serves with `--enable-lora`, from the release's own source.

    python scripts/lora_support.py DIR...        # DIR: an unpacked wheel's root (DIR/vllm/...), named by its release
    python scripts/lora_support.py --yaml DIR... # the `architectures:` block of catalog/lora_support.yaml

How a release decides (read from the wheels): the model registry (`_MODELS` dicts of `vllm/model_executor/models/
__init__.py` up to 0.5.x, `registry.py` after) maps an architecture name to `(module, class)`; LoRA is allowed when
that class implements the `SupportsLoRA` interface (`interfaces.py`, `supports_lora()`: from 0.5.4 on, a
runtime-checkable protocol that needs the `supports_lora = True` flag the interface's MRO carries), or, in releases
without the interface (0.5.0), when it declares `supported_lora_modules` (`loader.py`
`_get_model_initialization_kwargs`). This script parses the sources with `ast` (no vLLM import, no GPU): a class
supports LoRA when it or a base class (resolved by name, same module first) inherits `SupportsLoRA` or sets
`supports_lora = True` in its body — or, without the interface, assigns a non-empty `supported_lora_modules`.

Pure standard library; the catalog file it feeds is edited by hand around its output (the refusal texts and the
rank choices have their own sources in the file's comments).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

_MARKERS = ("supported_lora_modules", "supports_lora")


class _Class:
    def __init__(self, module: str, node: ast.ClassDef) -> None:
        self.module = module
        self.name = node.name
        self.bases = [_base_name(b) for b in node.bases]
        self.declares_modules, self.flagged = _marked(node)


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _marked(node: ast.ClassDef) -> tuple[bool, bool]:
    """Whether the class body assigns a non-empty `supported_lora_modules`, and `supports_lora = True`."""
    declares = flagged = False
    for stmt in node.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        if "supported_lora_modules" in names and not (isinstance(value, ast.List) and not value.elts):
            declares = True
        if "supports_lora" in names and isinstance(value, ast.Constant) and value.value is True:
            flagged = True
    return declares, flagged


def _classes(models_dir: Path) -> dict[str, list[_Class]]:
    out: dict[str, list[_Class]] = {}
    for path in sorted(models_dir.rglob("*.py")):
        module = ".".join(path.relative_to(models_dir).with_suffix("").parts)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(_Class(module, node))
    return out


def _registry(models_dir: Path) -> dict[str, tuple[str, str]]:
    """Every `"Arch": ("module", "Class")` entry of a dict literal in the registry modules."""
    out: dict[str, tuple[str, str]] = {}
    for name in ("__init__.py", "registry.py"):
        path = models_dir / name
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Dict):
                continue
            for key, value in zip(node.keys, node.values, strict=True):
                if (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Tuple)
                        and len(value.elts) >= 2
                        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts[:2])):
                    module, cls = (e.value for e in value.elts[:2])  # type: ignore[attr-defined]
                    out.setdefault(key.value, (module, cls))
    return out


def _supports(name: str, module: str, classes: dict[str, list[_Class]], interface: bool,
              seen: frozenset[str] = frozenset()) -> bool:
    if name == "SupportsLoRA":
        return interface
    if name in seen or name not in classes:
        return False
    candidates = classes[name]
    own = [c for c in candidates if c.module == module] or candidates
    cls = own[0]
    if cls.flagged if interface else cls.declares_modules:
        return True
    return any(_supports(base, cls.module, classes, interface, seen | {name}) for base in cls.bases)


def _has_interface(models_dir: Path) -> bool:
    path = models_dir / "interfaces.py"
    if not path.is_file():
        return False
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(n, ast.ClassDef) and n.name == "SupportsLoRA" for n in ast.walk(tree))


def release_support(root: Path) -> dict[str, tuple[bool, str]]:
    """Architecture name → (supports LoRA, the model class the registry maps it to), for the release at `root`."""
    models_dir = root / "vllm" / "model_executor" / "models"
    classes = _classes(models_dir)
    interface = _has_interface(models_dir)
    return {arch: (_supports(cls, module, classes, interface), cls)
            for arch, (module, cls) in sorted(_registry(models_dir).items())}


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


Run = tuple[bool, str, str, str]  # (supported, first checked release, last checked release, model class)


def ranges(by_release: dict[str, dict[str, tuple[bool, str]]]) -> dict[str, list[Run]]:
    """Per architecture: runs of checked releases with the same answer, with the class of the run's last release."""
    releases = sorted(by_release, key=_key)
    out: dict[str, list[Run]] = {}
    for arch in sorted({a for answers in by_release.values() for a in answers}):
        runs: list[Run] = []
        for release in releases:
            entry = by_release[release].get(arch)
            if entry is None:  # not registered in that release: ends a run
                runs.append((False, "", "", ""))
                continue
            answer, cls = entry
            if runs and runs[-1][1] and runs[-1][0] == answer:
                runs[-1] = (answer, runs[-1][1], release, cls)
            else:
                runs.append((answer, release, release, cls))
        out[arch] = [r for r in runs if r[1]]
    return out


def to_yaml(table: dict[str, list[Run]]) -> Iterable[str]:
    """One line per architecture: [yes|no, first, last] runs; a refusing run names the class when it differs."""
    for arch, runs in table.items():
        cells = []
        for ok, first, last, cls in runs:
            named = f', "{cls}"' if not ok and cls != arch else ""
            cells.append(f'["{"yes" if ok else "no"}", "{first}", "{last}"{named}]')
        yield f"  {arch}: [{', '.join(cells)}]"


def main(argv: list[str]) -> int:
    as_yaml = "--yaml" in argv
    dirs = [Path(a) for a in argv if a != "--yaml"]
    by_release = {d.name: release_support(d) for d in dirs}
    if as_yaml:
        print("checked: [" + ", ".join(f'"{r}"' for r in sorted(by_release, key=_key)) + "]")
        print("architectures:")
        print("\n".join(to_yaml(ranges(by_release))))
        return 0
    for release, answers in sorted(by_release.items(), key=lambda kv: _key(kv[0])):
        yes = sum(ok for ok, _ in answers.values())
        print(f"{release}: {len(answers)} architectures registered, {yes} with LoRA")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
