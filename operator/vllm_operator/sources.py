"""Where a model's architecture comes from: a local directory or file, the built-in catalog, or the Hugging Face hub.

The planner needs two files of a model repository: ``config.json`` (layers, heads, KV heads, head_dim, dtype,
quantization, ...) and ``model.safetensors.index.json`` (``metadata.total_size``, the checkpoint's tensor bytes).
:func:`load_model_files` resolves a reference to those two files, in this order:

1. an existing path: a model directory (``config.json`` plus, optionally, ``model.safetensors.index.json`` or
   un-indexed ``*.safetensors`` files), or the path of a ``config.json`` (the index is looked up beside it);
2. the built-in catalog (``vllm_operator/catalog/models/*.json``), by model id (case-insensitive) or alias;
3. the Hugging Face hub: only ``config.json`` and ``model.safetensors.index.json`` are downloaded, through
   ``huggingface_hub`` and its cache (``revision``, ``token``, ``cache_dir``, ``HF_ENDPOINT``, ``HF_TOKEN``,
   ``HF_HUB_OFFLINE`` are honoured).

Every failure is a :class:`ModelSourceError` whose message is one line saying what is wrong and how to fix it; the
CLI prints it and the operator puts it into the resource's status condition.

This module must not import the Kubernetes client. ``huggingface_hub`` is imported only when the hub is used.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CONFIG_FILE",
    "INDEX_FILE",
    "SINGLE_FILE",
    "HubAccessDenied",
    "HubClient",
    "HubError",
    "HubNotCached",
    "HubRepoNotFound",
    "HubRevisionNotFound",
    "HubUnreachable",
    "HuggingFaceHubClient",
    "ModelFiles",
    "ModelSourceError",
    "catalog_matches",
    "find_in_catalog",
    "list_catalog",
    "load_model_files",
    "model_files_from_inline",
]

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

DEFAULT_ENDPOINT = "https://huggingface.co"

# Where multimodal / wrapper configs keep the language model's fields.
_NESTED_TEXT_KEYS = ("text_config", "llm_config", "language_config")
# transformers' attribute_map synonyms for the two fields every planner needs.
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")

_TRUE = {"1", "ON", "YES", "TRUE"}
# 'org/name' (or a legacy single-name id such as 'gpt2'), as the hub accepts them.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*")
_LEGACY_REPO_ID = re.compile(r"[A-Za-z0-9][\w.\-]*")


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


def _read_json_file(path: Path, what: str) -> Any:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelSourceError(
            f"cannot read {what} {path}: {e.strerror or e}; check the path and its permissions"
        ) from None
    return _parse_json(data, f"{what} {path}")


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
# (1) Local paths


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
    if name.count("__") == 1:  # org__name, the layout of shared/data/models and the catalog file names
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

    config = _check_config(_read_json_file(config_path, "config file"), str(config_path))
    model_id, revision = _model_id_for_dir(directory)
    name_or_path = config.get("_name_or_path")
    if "/" not in model_id and isinstance(name_or_path, str) and _REPO_ID.fullmatch(name_or_path):
        model_id = name_or_path  # e.g. a plain directory whose config.json was saved from 'org/name'

    index_path = directory / INDEX_FILE
    total: int | None = None
    estimated = False
    note = ""
    if index_path.is_file():
        total, estimated = _total_size_from_index(_read_json_file(index_path, "index file"), str(index_path))
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


# ----------------------------------------------------------------------------------------------------------------
# (3) The Hugging Face hub


class HubError(Exception):
    """What a :class:`HubClient` raises; :func:`load_model_files` turns it into a one-line ModelSourceError."""


class HubRepoNotFound(HubError):
    """The repository does not exist (or is private and the token cannot see it)."""


class HubAccessDenied(HubError):
    """HTTP 401/403. ``gated`` when the hub says the repo is gated (licence to accept)."""

    def __init__(self, status: int | None, gated: bool, detail: str = "") -> None:
        super().__init__(detail or f"HTTP {status}")
        self.status = status
        self.gated = gated


class HubRevisionNotFound(HubError):
    """The repository exists but the revision does not."""


class HubUnreachable(HubError):
    """Network failure, hub outage, or an endpoint that does not speak the hub protocol."""


class HubNotCached(HubError):
    """Offline mode is on and the file is not in the local cache."""


class HubClient(Protocol):
    """The two hub operations this module needs; :class:`HuggingFaceHubClient` is the real one.

    Implementations raise :class:`HubError` subclasses; they return None for a file the repository does not have.
    """

    def download(
        self,
        repo_id: str,
        filename: str,
        *,
        revision: str | None,
        token: str | None,
        cache_dir: str | Path | None,
        offline: bool,
    ) -> Path | None:
        """Local (cached) path of ``filename`` in the repo, or None when the repo has no such file."""
        ...

    def file_size(
        self,
        repo_id: str,
        filename: str,
        *,
        revision: str | None,
        token: str | None,
        offline: bool,
    ) -> int | None:
        """Size in bytes of ``filename`` from the hub's file metadata, or None when unknown or absent."""
        ...

    def describe(self) -> str:
        """Where this client reads from, for messages ('Hugging Face hub at https://...')."""
        ...


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


class HuggingFaceHubClient:
    """:class:`HubClient` over ``huggingface_hub`` (``hf_hub_download`` / ``get_hf_file_metadata``).

    ``HF_ENDPOINT`` is read at call time (``huggingface_hub`` reads it once, at import), so tests and callers can
    point it at a mirror. The token defaults to huggingface_hub's own resolution (``HF_TOKEN``, then
    ``HUGGING_FACE_HUB_TOKEN``, then the stored login). Downloads land in the usual hub cache (or ``cache_dir``),
    so a second load revalidates with a HEAD request and downloads nothing.
    """

    def __init__(self, endpoint: str | None = None) -> None:
        self._endpoint = endpoint.rstrip("/") if endpoint else None

    @property
    def endpoint(self) -> str:
        return self._endpoint or _endpoint()

    def describe(self) -> str:
        return f"Hugging Face hub at {self.endpoint}"

    def download(
        self,
        repo_id: str,
        filename: str,
        *,
        revision: str | None,
        token: str | None,
        cache_dir: str | Path | None,
        offline: bool,
    ) -> Path | None:
        import huggingface_hub
        from huggingface_hub.utils.tqdm import silent_tqdm

        if not offline and not self._resolvable():
            # no route to the hub at all (air-gapped, no DNS): use the cache instead of retrying for ~20 s
            try:
                path = huggingface_hub.hf_hub_download(
                    repo_id, filename, revision=revision, token=token, cache_dir=cache_dir, local_files_only=True,
                    endpoint=self.endpoint, tqdm_class=cast(Any, silent_tqdm))
            except Exception:
                raise HubUnreachable(f"cannot resolve {urlsplit(self.endpoint).hostname}") from None
            return Path(path)
        try:
            path = huggingface_hub.hf_hub_download(
                repo_id,
                filename,
                revision=revision,
                token=token,
                cache_dir=cache_dir,
                local_files_only=offline,
                endpoint=self.endpoint,
                tqdm_class=cast(Any, silent_tqdm),
            )
        except Exception as e:  # translated below; anything unrecognised is re-raised
            if offline and self._cached_as_missing(repo_id, filename, revision, cache_dir):
                return None
            return self._translate(e, offline=offline)
        return Path(path)

    def _resolvable(self) -> bool:
        """Whether the hub's host name resolves (a failed lookup answers at once; the hub client would retry)."""
        host = urlsplit(self.endpoint).hostname
        if not host:
            return False
        try:
            socket.getaddrinfo(host, None)
        except OSError:
            return False
        return True

    def file_size(
        self,
        repo_id: str,
        filename: str,
        *,
        revision: str | None,
        token: str | None,
        offline: bool,
    ) -> int | None:
        if offline:
            return None
        import huggingface_hub

        url = huggingface_hub.hf_hub_url(repo_id, filename, revision=revision, endpoint=self.endpoint)
        try:
            meta = huggingface_hub.get_hf_file_metadata(url, token=token, endpoint=self.endpoint)
        except Exception as e:
            return self._translate(e, offline=offline)
        return meta.size

    @staticmethod
    def _cached_as_missing(
        repo_id: str, filename: str, revision: str | None, cache_dir: str | Path | None
    ) -> bool:
        import huggingface_hub

        try:
            found = huggingface_hub.try_to_load_from_cache(
                repo_id, filename, cache_dir=cache_dir, revision=revision
            )
        except Exception:
            return False
        return found is huggingface_hub._CACHED_NO_EXIST

    @staticmethod
    def _translate(error: Exception, *, offline: bool) -> None:
        """Return None for 'no such file'; raise the matching HubError otherwise."""
        import httpx2
        from huggingface_hub import errors

        if isinstance(error, errors.RemoteEntryNotFoundError):
            return None
        if isinstance(error, errors.GatedRepoError):
            raise HubAccessDenied(error.response.status_code, gated=True) from error
        if isinstance(error, errors.RepositoryNotFoundError):
            raise HubRepoNotFound(f"HTTP {error.response.status_code}") from error
        if isinstance(error, errors.RevisionNotFoundError):
            raise HubRevisionNotFound(str(error.response.status_code)) from error
        if isinstance(error, errors.DisabledRepoError):
            raise HubAccessDenied(
                error.response.status_code, gated=False, detail="access to this repo is disabled"
            ) from error
        if isinstance(error, errors.HfHubHTTPError):
            status = error.response.status_code
            if status in (401, 403):
                raise HubAccessDenied(status, gated=False) from error
            raise HubUnreachable(f"HTTP {status}") from error
        if isinstance(error, errors.LocalEntryNotFoundError | errors.OfflineModeIsEnabled):
            if offline:
                raise HubNotCached(str(error)) from error
            cause = error.__cause__ or error
            raise HubUnreachable(_short(cause)) from error
        if isinstance(error, errors.FileMetadataError):
            raise HubUnreachable(
                "the endpoint's replies lack the hub's X-Repo-Commit/ETag headers"
            ) from error
        if isinstance(error, errors.HFValidationError):
            raise HubRepoNotFound(f"invalid repo id: {_short(error)}") from error
        if isinstance(error, httpx2.HTTPError | OSError):
            raise HubUnreachable(_short(error)) from error
        raise error


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, HubError | ModelSourceError):
        return text
    return f"{type(error).__name__}: {text}"[:200]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in _TRUE


def _commit_from_path(path: Path) -> str | None:
    parts = path.parts
    if len(parts) >= 3 and parts[-3] == "snapshots":
        return parts[-2]
    return None


def _hint(ref: str) -> str:
    matches = catalog_matches(ref)
    return f"; close catalog matches: {', '.join(matches)}" if matches else ""


def _load_from_hub(
    repo_id: str,
    *,
    revision: str | None,
    token: str | None,
    cache_dir: str | Path | None,
    offline: bool,
    hub: HubClient,
) -> ModelFiles:
    at = f" at revision '{revision}'" if revision else ""
    try:
        config_path = hub.download(
            repo_id, CONFIG_FILE, revision=revision, token=token, cache_dir=cache_dir, offline=offline
        )
        if config_path is None:
            raise ModelSourceError(
                f"'{repo_id}' on the {hub.describe()}{at} has no {CONFIG_FILE} (GGUF-only or not a transformers "
                f"model?); use a repository with {CONFIG_FILE}, or a local directory holding one"
            )
        index_uncached = False
        try:
            index_path = hub.download(
                repo_id, INDEX_FILE, revision=revision, token=token, cache_dir=cache_dir, offline=offline
            )
        except HubNotCached:  # offline, config.json cached but the index never fetched: size unknown
            index_path, index_uncached = None, True
        single_size = None
        if index_path is None and not index_uncached:
            single_size = hub.file_size(repo_id, SINGLE_FILE, revision=revision, token=token, offline=offline)
    except HubAccessDenied as e:
        if e.gated:
            raise ModelSourceError(
                f"'{repo_id}' is a gated repository on the {hub.describe()}: accept its licence at "
                f"{DEFAULT_ENDPOINT}/{repo_id} and set HF_TOKEN to a token of an account that has access"
            ) from None
        status = f"HTTP {e.status}" if e.status else "access denied"
        detail = f", {e}" if str(e) and str(e) != f"HTTP {e.status}" else ""
        raise ModelSourceError(
            f"the {hub.describe()} refused access to '{repo_id}' ({status}{detail}): set HF_TOKEN to a valid token "
            "that can read this repository"
        ) from None
    except HubRepoNotFound:
        raise ModelSourceError(
            f"model '{repo_id}' is not a local path, not in the built-in catalog, and unknown on the "
            f"{hub.describe()} (if it is private, set HF_TOKEN){_hint(repo_id)}"
        ) from None
    except HubRevisionNotFound:
        raise ModelSourceError(
            f"revision '{revision}' of '{repo_id}' does not exist on the {hub.describe()}; use an existing branch, "
            "tag or commit, or leave the revision unset for 'main'"
        ) from None
    except HubNotCached:
        raise ModelSourceError(
            f"model '{repo_id}'{at} is not in the built-in catalog nor in the local Hugging Face cache, and offline "
            f"mode is on (HF_HUB_OFFLINE); unset HF_HUB_OFFLINE, download it first, or give a local directory"
            f"{_hint(repo_id)}"
        ) from None
    except HubUnreachable as e:
        raise ModelSourceError(
            f"cannot fetch '{repo_id}' from the {hub.describe()} ({_short(e)}) and it is not cached; check the "
            "network, proxy and HF_ENDPOINT, or use a catalog id or a local directory"
            f"{_hint(repo_id)}"
        ) from None

    where = f"'{repo_id}' {CONFIG_FILE} from the {hub.describe()}"
    config = _check_config(
        _read_json_file(config_path, f"'{repo_id}' {CONFIG_FILE} from the hub, cached at"), where
    )
    commit = _commit_from_path(config_path) or revision
    cache_note = f"cached at {config_path.parent}"
    if index_path is not None:
        total, estimated = _total_size_from_index(
            _read_json_file(index_path, f"'{repo_id}' {INDEX_FILE} from the hub, cached at"),
            f"'{repo_id}' {INDEX_FILE}",
        )
        note = ""
    elif single_size is not None:
        total, estimated = single_size, False
        note = f"; no {INDEX_FILE}: total_size = size of {SINGLE_FILE} (includes its small JSON header)"
    elif index_uncached:
        total, estimated = None, False
        note = f"; offline and {INDEX_FILE} is not in the cache, so the checkpoint size is unknown"
    else:
        total, estimated = None, False
        note = f"; no {INDEX_FILE} and no {SINGLE_FILE} size known, so the checkpoint size is unknown"
    return ModelFiles(
        model_id=repo_id,
        config=config,
        total_size=total,
        total_size_estimated=estimated,
        source=f"{hub.describe()} ({cache_note}){note}",
        revision=commit,
    )


# ----------------------------------------------------------------------------------------------------------------
# Public entry points


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
    if not (_REPO_ID.fullmatch(ref) or _LEGACY_REPO_ID.fullmatch(ref)):
        raise ModelSourceError(
            f"'{ref}' is neither a local path, a catalog alias, nor a Hugging Face repo id{_hint(ref)}"
        )
    return _load_from_hub(
        ref,
        revision=revision,
        token=token,
        cache_dir=cache_dir,
        offline=offline,
        hub=hub if hub is not None else HuggingFaceHubClient(),
    )


def model_files_from_inline(
    config: Mapping[str, Any] | str,
    index: Mapping[str, Any] | str | None,
    model_id: str,
) -> ModelFiles:
    """ModelFiles from a config.json (and optional index) carried inline, e.g. in a Kubernetes resource or ConfigMap.

    ``config`` / ``index`` may be parsed objects or the JSON text of the files.
    """
    what = f"inline config for '{model_id}'"
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
