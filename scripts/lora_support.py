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

Whether the LM head gets an adapter slot (`lm_head:`, `--yaml`): vLLM wraps the logits processor with
`LogitsProcessorWithLoRA` when a module whose name contains `lm_head` is a LoRA target
(`LoRAModelManager._create_lora_modules`), and that wrapper refuses vocabularies above a release's limit
(`create_lora_weights`). The targets are the class's `supported_lora_modules` list up to 0.7.x, and from 0.8.0
(`lora/utils.py::get_supported_lora_modules`) every linear layer plus the keys of `embedding_modules`: so the head
is wrapped when the registered class (or the first base class that sets the attribute, as Python looks it up)
lists "lm_head" there. Before 0.12.0 a class whose `__init__` adds `lora_config.lora_extra_vocab_size` to the
logits processor's vocabulary (`unpadded_vocab_size += ...`) compares the vocabulary plus that size: "extra".
Only text-generation architectures are tabled: a multimodal or pooling class builds its language model as a
submodule, whose own `embedding_modules` vLLM also reads from 0.10 on (every module's attribute), which a class
attribute cannot show.

Pure standard library; the catalog file it feeds is edited by hand around its output (the refusal texts, the
vocabulary limits and the rank choices have their own sources in the file's comments).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_MARKERS = ("supported_lora_modules", "supports_lora")


class _Class:
    def __init__(self, module: str, node: ast.ClassDef) -> None:
        self.module = module
        self.name = node.name
        self.bases = [_base_name(b) for b in node.bases]
        self.declares_modules, self.flagged = _marked(node)
        self.attrs = _class_attrs(node)
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        #: None: no __init__ of its own; else whether it widens the vocabulary by lora_extra_vocab_size
        self.extra_vocab: bool | None = None if init is None else any(
            isinstance(n, ast.Attribute) and n.attr == "lora_extra_vocab_size" for n in ast.walk(init))


_HEAD_ATTRS = ("embedding_modules", "supported_lora_modules")


def _class_attrs(node: ast.ClassDef) -> dict[str, ast.expr]:
    """The class-level assignments of the attributes that decide whether the LM head is a LoRA target."""
    out: dict[str, ast.expr] = {}
    for stmt in node.body:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and target.id in _HEAD_ATTRS:
                out[target.id] = value
    return out


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


def _mro(name: str, module: str, classes: dict[str, list[_Class]],
         seen: frozenset[str] = frozenset()) -> Iterable[_Class]:
    """The class and its bases depth-first, left to right (Python's MRO for the single-inheritance chains and
    mixins of vLLM's model classes); a base not defined in the models package ends its branch."""
    if name in seen or name not in classes:
        return
    candidates = classes[name]
    cls = ([c for c in candidates if c.module == module] or candidates)[0]
    yield cls
    for base in cls.bases:
        yield from _mro(base, cls.module, classes, seen | {name})


def _names_head(value: ast.expr, classes: dict[str, list[_Class]], attr: str, module: str) -> bool:
    """Whether an attribute's value lists "lm_head" (a literal, or `OtherClass.attr` resolved by name)."""
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
        return _attr_names_head(value.value.id, module, classes, value.attr)
    return any(isinstance(n, ast.Constant) and n.value == "lm_head" for n in ast.walk(value))


def _attr_names_head(name: str, module: str, classes: dict[str, list[_Class]], attr: str) -> bool:
    owner = next((c for c in _mro(name, module, classes) if attr in c.attrs), None)
    return owner is not None and _names_head(owner.attrs[attr], classes, attr, owner.module)


def _head(name: str, module: str, classes: dict[str, list[_Class]], all_linear: bool, extra_vocab: bool) -> str:
    """"no", "yes" (the LM head is a LoRA target) or "extra" (a target whose vocabulary is widened by
    lora_extra_vocab_size) for the registered class `name`."""
    attr = "embedding_modules" if all_linear else "supported_lora_modules"
    if not _attr_names_head(name, module, classes, attr):
        return "no"
    init = next((c for c in _mro(name, module, classes) if c.extra_vocab is not None), None)
    return "extra" if extra_vocab and init is not None and init.extra_vocab else "yes"


def _text_generation(models_dir: Path) -> set[str]:
    """Architectures of the text-generation registry dict (`_TEXT_GENERATION_MODELS`, `_GENERATION_MODELS` in
    0.5.x)."""
    out: set[str] = set()
    for name in ("__init__.py", "registry.py"):
        path = models_dir / name
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                    and any(isinstance(t, ast.Name) and t.id in ("_TEXT_GENERATION_MODELS", "_GENERATION_MODELS")
                            for t in node.targets)):
                out |= {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return out


def _source_has(root: Path, relative: str, text: str) -> bool:
    return any(path.is_file() and text in path.read_text(encoding="utf-8", errors="replace")
               for path in (root / "vllm").glob(relative))


def release_heads(root: Path) -> dict[str, tuple[str, str]]:
    """Text-generation architecture → ("no" | "yes" | "extra", class) for the release at `root`: whether LoRA
    wraps its LM head (see the module docstring)."""
    models_dir = root / "vllm" / "model_executor" / "models"
    classes = _classes(models_dir)
    all_linear = _source_has(root, "lora/utils.py", "def get_supported_lora_modules")
    extra_vocab = _source_has(root, "config.py", "lora_extra_vocab_size") or _source_has(
        root, "config/lora.py", "lora_extra_vocab_size")
    text = _text_generation(models_dir)
    return {arch: (_head(cls, module, classes, all_linear, extra_vocab), cls)
            for arch, (module, cls) in sorted(_registry(models_dir).items()) if arch in text}


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


Run = tuple[Any, str, str, str]  # (answer, first checked release, last checked release, model class)


def ranges(by_release: Mapping[str, Mapping[str, tuple[Any, str]]]) -> dict[str, list[Run]]:
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


def heads_to_yaml(table: dict[str, list[Run]]) -> Iterable[str]:
    """One line per text-generation architecture: [no|yes|extra, first, last] runs (is the LM head a LoRA target)."""
    for arch, runs in table.items():
        cells = [f'["{answer}", "{first}", "{last}"]' for answer, first, last, _ in runs]
        yield f"  {arch}: [{', '.join(cells)}]"


def main(argv: list[str]) -> int:
    as_yaml = "--yaml" in argv
    dirs = [Path(a) for a in argv if a != "--yaml"]
    by_release = {d.name: release_support(d) for d in dirs}
    if as_yaml:
        print("checked: [" + ", ".join(f'"{r}"' for r in sorted(by_release, key=_key)) + "]")
        print("architectures:")
        print("\n".join(to_yaml(ranges(by_release))))
        print("lm_head:")
        print("\n".join(heads_to_yaml(ranges({d.name: release_heads(d) for d in dirs}))))
        return 0
    for release, answers in sorted(by_release.items(), key=lambda kv: _key(kv[0])):
        yes = sum(ok for ok, _ in answers.values())
        print(f"{release}: {len(answers)} architectures registered, {yes} with LoRA")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
