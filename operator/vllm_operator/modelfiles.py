"""A model's files as the planner needs them, from the sources that read no file system and no network: the
built-in catalog and JSON carried inline (spec.model.config, a ConfigMap's data).

Pure (the reconcile core imports it): no Kubernetes client, no `huggingface_hub`, no file outside the package's own
catalog. Local paths and the Hugging Face hub live in `vllm_operator.sources` (the CLI and the operator's shell).
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CONFIG_FILE",
    "INDEX_FILE",
    "MAX_JSON_TEXT_BYTES",
    "SINGLE_FILE",
    "ModelFiles",
    "ModelSourceError",
    "catalog_matches",
    "find_in_catalog",
    "list_catalog",
    "model_files_from_inline",
]

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
#: The largest config.json / index text parsed from a ConfigMap or inline (a real config.json is < 20 KiB; an
#: index of a 1000-shard checkpoint is < 2 MiB).
MAX_JSON_TEXT_BYTES = 4 * 1024 * 1024

# Where multimodal / wrapper configs keep the language model's fields.
_NESTED_TEXT_KEYS = ("text_config", "llm_config", "language_config")
# transformers' attribute_map synonyms for the two fields every planner needs.
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")


class ModelSourceError(ValueError):
    """A model reference could not be resolved to usable files. The message is a single line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class ModelFiles(BaseModel):
    """A model's ``config.json`` and checkpoint size, and where they came from."""

    model_config = ConfigDict(protected_namespaces=())

    model_id: str
    config: dict[str, Any]
    total_size: int | None = Field(
        default=None, description="Checkpoint tensor bytes (metadata.total_size); None when unknown."
    )
    total_size_estimated: bool = Field(
        default=False,
        description="True when total_size was computed (e.g. from the parameter count), not read.",
    )
    source: str = Field(
        description="Where the files came from, for people: 'local directory /x', 'built-in catalog', ..."
    )
    revision: str | None = Field(
        default=None, description="Hub commit (or the requested revision) when from the hub."
    )
    aliases: tuple[str, ...] = Field(default=(), description="Catalog short names (catalog rows only).")
    provenance: str | None = Field(default=None, description="Catalog rows: where the values come from.")


# ----------------------------------------------------------------------------------------------------------------
# Validation of the two files


def _parse_json(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelSourceError(
            f"{what} is not valid JSON (line {e.lineno} column {e.colno}: {e.msg}); fix or re-download the file"
        ) from None
    except UnicodeDecodeError:
        raise ModelSourceError(f"{what} is not UTF-8 text; fix or re-download the file") from None


def _has_any(config: Mapping[str, Any], keys: tuple[str, ...]) -> bool:
    if any(isinstance(config.get(k), int) and not isinstance(config.get(k), bool) for k in keys):
        return True
    for nested in _NESTED_TEXT_KEYS:
        sub = config.get(nested)
        if isinstance(sub, Mapping) and _has_any(sub, keys):
            return True
    return False


def _check_config(config: Any, where: str) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise ModelSourceError(
            f"{where}: config.json must be a JSON object, got {type(config).__name__}; use the model's config.json"
        )
    missing = [
        name
        for name, keys in (("num_hidden_layers", _LAYER_KEYS), ("hidden_size", _HIDDEN_KEYS))
        if not _has_any(config, keys)
    ]
    if missing:
        raise ModelSourceError(
            f"{where}: config.json has no {' / '.join(missing)} (looked at the top level and in "
            f"{', '.join(_NESTED_TEXT_KEYS)}); it does not describe a transformer the planner can size — "
            "use the model's own config.json"
        )
    return dict(config)


def _total_size_from_index(index: Any, where: str) -> tuple[int | None, bool]:
    """(metadata.total_size, estimated) from a parsed model.safetensors.index.json."""
    if not isinstance(index, Mapping):
        raise ModelSourceError(
            f"{where}: model.safetensors.index.json must be a JSON object; fix or re-download the file"
        )
    metadata = index.get("metadata")
    if metadata is None:
        return None, False
    if not isinstance(metadata, Mapping):
        raise ModelSourceError(
            f"{where}: model.safetensors.index.json 'metadata' must be an object; fix the file"
        )
    total = metadata.get("total_size")
    if total is None:
        return None, False
    if isinstance(total, str) and total.strip().isdigit():  # some exporters write the number as a string
        total = int(total.strip())
    if isinstance(total, float) and total.is_integer():
        total = int(total)
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
        raise ModelSourceError(
            f"{where}: model.safetensors.index.json metadata.total_size must be a positive integer "
            f"(got {total!r}); fix or re-download the file"
        )
    return total, bool(metadata.get("estimated", False))


# ----------------------------------------------------------------------------------------------------------------
# (2) The built-in catalog


@dataclass(frozen=True)
class _CatalogRow:
    model_id: str
    aliases: tuple[str, ...]
    config: dict[str, Any]
    total_size: int
    total_size_estimated: bool
    provenance: str


def _parse_catalog_row(name: str, text: str) -> _CatalogRow:
    raw = _parse_json(text, f"catalog file {name}")
    if not isinstance(raw, Mapping):
        raise ModelSourceError(f"catalog file {name} must hold a JSON object")
    model_id = raw.get("model_id")
    if not isinstance(model_id, str) or "/" not in model_id:
        raise ModelSourceError(f"catalog file {name}: model_id must be 'org/name'")
    aliases = raw.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a == a.lower() for a in aliases):
        raise ModelSourceError(f"catalog file {name}: aliases must be a list of lowercase strings")
    total, estimated = raw.get("total_size"), raw.get("total_size_estimated", False)
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
        raise ModelSourceError(f"catalog file {name}: total_size must be a positive integer")
    config = _check_config(raw.get("config"), f"catalog file {name}")
    return _CatalogRow(
        model_id=model_id,
        aliases=tuple(aliases),
        config=config,
        total_size=total,
        total_size_estimated=bool(estimated),
        provenance=str(raw.get("source", "")),
    )


@lru_cache(maxsize=1)
def _catalog() -> tuple[tuple[_CatalogRow, ...], dict[str, _CatalogRow]]:
    """All catalog rows, and a lookup from lower-cased model id / alias to row. Read once."""
    folder = resources.files("vllm_operator.catalog").joinpath("models")
    rows: list[_CatalogRow] = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json") and entry.is_file():
            rows.append(_parse_catalog_row(entry.name, entry.read_text(encoding="utf-8")))
    lookup: dict[str, _CatalogRow] = {}
    for row in rows:
        for key in (row.model_id.lower(), *row.aliases):
            other = lookup.get(key)
            if other is not None and other is not row:
                raise ModelSourceError(
                    f"built-in catalog: '{key}' names both {other.model_id} and {row.model_id}; make it unique"
                )
            lookup[key] = row
    rows.sort(key=lambda r: r.model_id.lower())
    return tuple(rows), lookup


def _row_to_files(row: _CatalogRow) -> ModelFiles:
    return ModelFiles(
        model_id=row.model_id,
        config=copy.deepcopy(row.config),
        total_size=row.total_size,
        total_size_estimated=row.total_size_estimated,
        source="built-in catalog",
        revision=None,
        aliases=row.aliases,
        provenance=row.provenance,
    )


def find_in_catalog(ref: str) -> ModelFiles | None:
    """The catalog row whose model id (case-insensitive) or alias is ``ref``, or None."""
    row = _catalog()[1].get(ref.strip().lower())
    return _row_to_files(row) if row is not None else None


def list_catalog() -> list[ModelFiles]:
    """Every catalog row, sorted by model id."""
    return [_row_to_files(row) for row in _catalog()[0]]


_NAME_NOISE = re.compile(r"(^meta-)|(-(instruct|chat|it|hf|base))+$")


def _name_variants(text: str) -> set[str]:
    text = text.strip().lower().replace("_", "-").replace(" ", "-")
    name = text.rsplit("/", 1)[-1]
    return {text, name, _NAME_NOISE.sub("", name)}


def catalog_matches(ref: str, n: int = 3) -> list[str]:
    """Up to ``n`` catalog model ids that look like ``ref`` (for 'did you mean' hints), best first."""
    rows, _ = _catalog()
    wanted = _name_variants(ref)
    scored: list[tuple[float, str]] = []
    for row in rows:
        keys = _name_variants(row.model_id) | set(row.aliases)
        score = max(difflib.SequenceMatcher(None, w, k).ratio() for w in wanted for k in keys)
        if score >= 0.6:
            scored.append((score, row.model_id))
    scored.sort(key=lambda item: (-item[0], item[1].lower()))
    return [model_id for _, model_id in scored[:n]]




def model_files_from_inline(
    config: Mapping[str, Any] | str,
    index: Mapping[str, Any] | str | None,
    model_id: str,
) -> ModelFiles:
    """ModelFiles from a config.json (and optional index) carried inline, e.g. in a Kubernetes resource or ConfigMap.

    ``config`` / ``index`` may be parsed objects or the JSON text of the files.
    """
    what = f"inline config for '{model_id}'"
    for text, name in ((config, "config"), (index, "index")):
        if isinstance(text, str | bytes) and len(text) > MAX_JSON_TEXT_BYTES:
            raise ModelSourceError(f"the inline {name} for '{model_id}' is larger than "
                                   f"{MAX_JSON_TEXT_BYTES // 2**20} MiB; give the model's own files")
    parsed_config = _parse_json(config, what) if isinstance(config, str) else config
    checked = _check_config(copy.deepcopy(parsed_config), what)
    total: int | None = None
    estimated = False
    if index is not None:
        parsed_index = (
            _parse_json(index, f"inline index for '{model_id}'") if isinstance(index, str) else index
        )
        total, estimated = _total_size_from_index(parsed_index, f"inline index for '{model_id}'")
    return ModelFiles(
        model_id=model_id,
        config=checked,
        total_size=total,
        total_size_estimated=estimated,
        source="inline config"
        + ("" if index is not None else f" (no {INDEX_FILE}: checkpoint size unknown)"),
        revision=None,
    )
