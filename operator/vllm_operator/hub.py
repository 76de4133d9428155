"""The Hugging Face hub as a model source: the operator's resolver (`resolve_model_id`: a catalog id or a hub repo id,
never a local path) and the hub client both it and the CLI's loader (:mod:`vllm_operator.sources`) use.

Only ``config.json`` and ``model.safetensors.index.json`` are downloaded, through ``huggingface_hub`` and its cache
(``revision``, ``token``, ``cache_dir``, ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_OFFLINE`` are honoured);
``huggingface_hub`` is imported only when the hub is used. Every failure is a :class:`ModelSourceError` whose
message is one line saying what is wrong and how to fix it.

This module reads no path a user names (the files it reads are the hub cache's own) and must not import the
Kubernetes client; the handlers reach model sources only through here and :mod:`vllm_operator.modelfiles`
(import-linter checks that they never import :mod:`vllm_operator.sources`, the CLI's local-path loader).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

from .modelfiles import (
    CONFIG_FILE,
    INDEX_FILE,
    MAX_JSON_TEXT_BYTES,
    SINGLE_FILE,
    ModelFiles,
    ModelSourceError,
    _check_config,
    _parse_json,
    _total_size_from_index,
    catalog_matches,
    find_in_catalog,
)

__all__ = [
    "DEFAULT_ENDPOINT",
    "HubAccessDenied",
    "HubClient",
    "HubError",
    "HubNotCached",
    "HubRepoNotFound",
    "HubRevisionNotFound",
    "HubUnreachable",
    "HuggingFaceHubClient",
    "is_repo_id",
    "load_from_hub",
    "read_json_file",
    "resolve_model_id",
]

DEFAULT_ENDPOINT = "https://huggingface.co"

_TRUE = {"1", "ON", "YES", "TRUE"}
# 'org/name' (or a legacy single-name id such as 'gpt2'), as the hub accepts them.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*")
_LEGACY_REPO_ID = re.compile(r"[A-Za-z0-9][\w.\-]*")


def is_repo_id(ref: str) -> bool:
    """'org/name', or a legacy single-name id such as 'gpt2', as the hub accepts them."""
    return bool(_REPO_ID.fullmatch(ref) or _LEGACY_REPO_ID.fullmatch(ref))


def read_json_file(path: Path, what: str) -> Any:
    """A JSON file of at most MAX_JSON_TEXT_BYTES, parsed; any failure is a one-line ModelSourceError."""
    try:
        if path.stat().st_size > MAX_JSON_TEXT_BYTES:
            raise ModelSourceError(f"{what} {path} is larger than {MAX_JSON_TEXT_BYTES // 2**20} MiB; it is not a "
                                   "model's config.json or index")
        data = path.read_bytes()
    except OSError as e:
        raise ModelSourceError(
            f"cannot read {what} {path}: {e.strerror or e}; check the path and its permissions"
        ) from None
    return _parse_json(data, f"{what} {path}")


# ----------------------------------------------------------------------------------------------------------------
# The hub client


class HubError(Exception):
    """What a :class:`HubClient` raises; :func:`load_from_hub` turns it into a one-line ModelSourceError."""


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
        token: str | bool | None,
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
        token: str | bool | None,
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
        token: str | bool | None,
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
        token: str | bool | None,
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


def _token_advice(token: str | bool | None) -> str:
    """What to set so that a lookup has a token: the operator looks a service's model up with the service's own
    token (token False: none was given, and the operator's own is not used for tenants)."""
    if token is False:
        return ("give the VLLMService a token with spec.hfTokenSecretRef (the operator's own HF_TOKEN is not used "
                "for other namespaces' models)")
    return "set HF_TOKEN (spec.hfTokenSecretRef for a VLLMService) to a valid token"


def _hint(ref: str) -> str:
    matches = catalog_matches(ref)
    return f"; close catalog matches: {', '.join(matches)}" if matches else ""


def load_from_hub(
    repo_id: str,
    *,
    revision: str | None,
    token: str | bool | None,
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
                f"{DEFAULT_ENDPOINT}/{repo_id} and {_token_advice(token)} of an account that has access"
            ) from None
        status = f"HTTP {e.status}" if e.status else "access denied"
        detail = f", {e}" if str(e) and str(e) != f"HTTP {e.status}" else ""
        raise ModelSourceError(
            f"the {hub.describe()} refused access to '{repo_id}' ({status}{detail}): {_token_advice(token)} that "
            "can read this repository"
        ) from None
    except HubRepoNotFound:
        raise ModelSourceError(
            f"model '{repo_id}' is not a local path, not in the built-in catalog, and unknown on the "
            f"{hub.describe()} (if it is private, {_token_advice(token)}){_hint(repo_id)}"
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
        read_json_file(config_path, f"'{repo_id}' {CONFIG_FILE} from the hub, cached at"), where
    )
    commit = _commit_from_path(config_path) or revision
    cache_note = f"cached at {config_path.parent}"
    if index_path is not None:
        total, estimated = _total_size_from_index(
            read_json_file(index_path, f"'{repo_id}' {INDEX_FILE} from the hub, cached at"),
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
# The operator's resolver


def resolve_model_id(
    ref: str,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | Path | None = None,
    offline: bool | None = None,
    hub: HubClient | None = None,
) -> ModelFiles:
    """The operator's resolver: a catalog id or alias, else a Hugging Face repo id, never a local path.

    ``ref`` must already be a valid hub id (the CRD and ``validate_spec`` check it); anything else is refused here
    again before any file or the network is touched, so ``dev/zero`` or ``etc/passwd`` are hub ids, not files.
    """
    if not isinstance(ref, str) or not is_repo_id(ref) or ".." in ref:
        raise ModelSourceError(f"{ref!r:.80} is not a Hugging Face repo id (org/name) nor a catalog id; fix "
                               "spec.model.name")
    if revision is None:
        found = find_in_catalog(ref)
        if found is not None:
            return found
    if offline is None:
        offline = _env_flag("HF_HUB_OFFLINE")
    return load_from_hub(ref, revision=revision, token=token, cache_dir=cache_dir, offline=offline,
                          hub=hub if hub is not None else HuggingFaceHubClient())
