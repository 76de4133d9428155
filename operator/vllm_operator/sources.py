"""The CLI's model loader: a local directory or file, the built-in catalog, or the Hugging Face hub.

Local paths are a CLI feature only. The operator never reads its own file system on a user's behalf: its handlers
resolve a model through :func:`vllm_operator.hub.resolve_model_id` (a catalog id or a hub repo id) or
:mod:`vllm_operator.modelfiles` (inline JSON, a ConfigMap), and import-linter forbids the handlers, the reconcile
core and the simulator to import this module.

The planner needs two files of a model repository: ``config.json`` (layers, heads, KV heads, head_dim, dtype,
quantization, ...) and ``model.safetensors.index.json`` (``metadata.total_size``, the checkpoint's tensor bytes).
:func:`load_model_files` resolves a reference to those two files, in this order:

1. an existing path: a model directory (``config.json`` plus, optionally, ``model.safetensors.index.json`` or
   un-indexed ``*.safetensors`` files), or the path of a ``config.json`` (the index is looked up beside it);
2. the built-in catalog (``vllm_operator/catalog/models/*.json``), by model id (case-insensitive) or alias;
3. the Hugging Face hub (:mod:`vllm_operator.hub`).

Every failure is a :class:`ModelSourceError` whose message is one line saying what is wrong and how to fix it.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

from .hub import HubClient, HuggingFaceHubClient, _env_flag, _hint, is_repo_id, load_from_hub, read_json_file
from .modelfiles import (
    CONFIG_FILE,
    INDEX_FILE,
    ModelFiles,
    ModelSourceError,
    _check_config,
    _total_size_from_index,
    find_in_catalog,
)

__all__ = ["load_model_files"]

# ----------------------------------------------------------------------------------------------------------------
# Local paths


def _safetensors_payload(path: Path) -> int:
    """Tensor bytes of a .safetensors file: its size minus the 8-byte length and the JSON header."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            head = f.read(8)
        if len(head) == 8:
            (header_len,) = struct.unpack("<Q", head)
            if 8 + header_len <= size:
                return int(size - 8 - header_len)
    except OSError:
        pass
    return size


def _unindexed_safetensors(directory: Path) -> list[Path]:
    files = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    # Mistral repos hold both consolidated.safetensors (mistral format) and model-*.safetensors (HF format).
    hf = [p for p in files if p.name.startswith("model")]
    return hf or files


def _model_id_for_dir(directory: Path) -> tuple[str, str | None]:
    """A readable model id for a local directory, and the revision when it is a hub cache snapshot."""
    parts = directory.parts
    # ~/.cache/huggingface/hub/models--org--name/snapshots/<commit>
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--") :].replace("--", "/"), parts[-1]
    name = directory.name
    if name.count("__") == 1:  # org__name, the layout of benchmarks/data/models and the catalog file names
        return name.replace("__", "/"), None
    return name, None


def _load_local(path: Path) -> ModelFiles:
    if path.is_dir():
        directory, config_path = path, path / CONFIG_FILE
        if not config_path.is_file():
            raise ModelSourceError(
                f"directory {path} has no {CONFIG_FILE}; point at a Hugging Face model directory "
                f"(holding {CONFIG_FILE} and {INDEX_FILE}) or at a {CONFIG_FILE} file"
            )
        where = f"local directory {directory}"
    elif path.name == INDEX_FILE:
        directory, config_path = path.parent, path.parent / CONFIG_FILE
        if not config_path.is_file():
            raise ModelSourceError(
                f"{path} has no {CONFIG_FILE} beside it; put the model's {CONFIG_FILE} there"
            )
        where = f"local directory {directory}"
    else:
        directory, config_path = path.parent, path
        where = f"local file {config_path}"

    config = _check_config(read_json_file(config_path, "config file"), str(config_path))
    model_id, revision = _model_id_for_dir(directory)
    name_or_path = config.get("_name_or_path")
    if "/" not in model_id and isinstance(name_or_path, str) and "/" in name_or_path and is_repo_id(name_or_path):
        model_id = name_or_path  # e.g. a plain directory whose config.json was saved from 'org/name'

    index_path = directory / INDEX_FILE
    total: int | None = None
    estimated = False
    note = ""
    if index_path.is_file():
        total, estimated = _total_size_from_index(read_json_file(index_path, "index file"), str(index_path))
        note = f" with {INDEX_FILE}"
        if total is None:
            note += " (no metadata.total_size)"
    else:
        shards = _unindexed_safetensors(directory)
        if shards:
            total = sum(_safetensors_payload(p) for p in shards)
            names = shards[0].name if len(shards) == 1 else f"{len(shards)} *.safetensors files"
            note = f"; total_size = tensor bytes of {names} (file size minus safetensors header)"
        else:
            note = f"; no {INDEX_FILE} or *.safetensors beside it, so the checkpoint size is unknown"
    return ModelFiles(
        model_id=model_id,
        config=config,
        total_size=total,
        total_size_estimated=estimated,
        source=f"{where}{note}",
        revision=revision,
    )


def _looks_like_path(ref: str) -> bool:
    return (
        ref.startswith(("/", "./", "../", "~", "\\"))
        or ref in (".", "..")
        or ref.endswith(".json")
        or bool(re.match(r"^[A-Za-z]:[\\/]", ref))
        or ref.count("/") > 1
    )



# ----------------------------------------------------------------------------------------------------------------
# The CLI's entry point


def load_model_files(
    ref: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | Path | None = None,
    offline: bool | None = None,
    hub: HubClient | None = None,
) -> ModelFiles:
    """Resolve ``ref`` to a model's config.json and checkpoint size.

    ``ref`` is a local path (directory or config.json), a catalog model id or alias, or a Hugging Face repo id.
    A pinned ``revision`` skips the catalog (whose rows are not tied to a revision) and reads the hub.
    ``offline`` defaults to the ``HF_HUB_OFFLINE`` environment variable: then only the local hub cache is read.
    Raises :class:`ModelSourceError` (one line) when nothing usable is found.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise ModelSourceError(
            "no model given; name a Hugging Face repo id, a catalog alias or a local directory"
        )
    ref = ref.strip()

    path = Path(ref).expanduser()
    if path.exists():
        return _load_local(path)
    if _looks_like_path(ref):
        raise ModelSourceError(
            f"path {ref} does not exist; give an existing model directory or config.json, or a Hugging Face repo id "
            "(org/name)"
        )

    if revision is None:
        found = find_in_catalog(ref)
        if found is not None:
            return found

    if offline is None:
        offline = _env_flag("HF_HUB_OFFLINE")
    if not is_repo_id(ref):
        raise ModelSourceError(
            f"'{ref}' is neither a local path, a catalog alias, nor a Hugging Face repo id{_hint(ref)}"
        )
    return load_from_hub(
        ref,
        revision=revision,
        token=token,
        cache_dir=cache_dir,
        offline=offline,
        hub=hub if hub is not None else HuggingFaceHubClient(),
    )
