"""vllm_operator.sources: local paths, the catalog, the Hugging Face hub (a fake one on 127.0.0.1), and errors.

No test touches the internet: HF_ENDPOINT points at a tiny http.server that answers the hub's
``/{repo}/resolve/{revision}/{filename}`` endpoint with the headers huggingface_hub needs (X-Repo-Commit, ETag,
Content-Length) and the hub's error codes (X-Error-Code: RepoNotFound / GatedRepo / EntryNotFound /
RevisionNotFound).
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from vllm_operator import hub, sources
from vllm_operator.hub import HubAccessDenied, HubRepoNotFound, HubUnreachable
from vllm_operator.modelfiles import (
    ModelFiles,
    ModelSourceError,
    find_in_catalog,
    list_catalog,
    model_files_from_inline,
)
from vllm_operator.sources import load_model_files

LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
INDEX = {
    "metadata": {"total_size": 2_471_628_800},
    "weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"},
}


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and text.strip() == text and text
    return text


# ------------------------------------------------------------------------------------------------ local paths


def write_model_dir(path: Path, config: Any = LLAMA_CONFIG, index: Any = INDEX) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if index is not None:
        (path / "model.safetensors.index.json").write_text(
            index if isinstance(index, str) else json.dumps(index)
        )
    return path


def write_safetensors(path: Path, payload: int) -> None:
    header = json.dumps(
        {"w": {"dtype": "BF16", "shape": [payload // 2], "data_offsets": [0, payload]}}
    ).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * payload)


def test_local_directory(tmp_path: Path) -> None:
    d = write_model_dir(tmp_path / "my-llama")
    files = load_model_files(str(d))
    assert isinstance(files, ModelFiles)
    assert files.config == LLAMA_CONFIG
    assert files.total_size == 2_471_628_800 and files.total_size_estimated is False
    assert files.source.startswith(f"local directory {d}")
    assert files.model_id == "my-llama" and files.revision is None


def test_local_directory_named_like_the_shared_data_set(tmp_path: Path) -> None:
    d = write_model_dir(
        tmp_path / "acme__Tiny-1B", index={"metadata": {"total_size": 123456789, "estimated": True}}
    )
    files = load_model_files(str(d))
    assert files.model_id == "acme/Tiny-1B"
    assert files.total_size == 123456789 and files.total_size_estimated is True


def test_local_hub_cache_snapshot_dir_gives_repo_id_and_commit(tmp_path: Path) -> None:
    commit = "a" * 40
    d = write_model_dir(tmp_path / "models--acme--Tiny-1B" / "snapshots" / commit)
    files = load_model_files(str(d))
    assert (files.model_id, files.revision) == ("acme/Tiny-1B", commit)


def test_local_config_path_finds_the_index_beside_it(tmp_path: Path) -> None:
    d = write_model_dir(tmp_path / "m")
    files = load_model_files(str(d / "config.json"))
    assert files.total_size == 2_471_628_800
    assert files.source.startswith(f"local file {d / 'config.json'}")
    # ... and the index path finds the config beside it.
    assert load_model_files(str(d / "model.safetensors.index.json")).config == LLAMA_CONFIG


def test_local_config_path_without_index(tmp_path: Path) -> None:
    d = write_model_dir(tmp_path / "m", index=None)
    files = load_model_files(str(d / "config.json"))
    assert files.total_size is None and "unknown" in files.source


def test_local_single_safetensors_file_gives_tensor_bytes(tmp_path: Path) -> None:
    d = write_model_dir(tmp_path / "m", index=None)
    write_safetensors(d / "model.safetensors", 4096)
    files = load_model_files(str(d))
    assert files.total_size == 4096  # header excluded
    assert "model.safetensors" in files.source


def test_local_unindexed_shards_are_summed(tmp_path: Path) -> None:
    d = write_model_dir(tmp_path / "m", index=None)
    write_safetensors(d / "model-00001-of-00002.safetensors", 1000)
    write_safetensors(d / "model-00002-of-00002.safetensors", 24)
    write_safetensors(d / "consolidated.safetensors", 1024)  # Mistral's other format: not counted twice
    assert load_model_files(str(d)).total_size == 1024


def test_local_multimodal_config_with_text_config(tmp_path: Path) -> None:
    config = {
        "architectures": ["X"],
        "model_type": "x",
        "text_config": {"num_hidden_layers": 4, "hidden_size": 64},
    }
    d = write_model_dir(tmp_path / "mm", config=config)
    assert load_model_files(str(d)).config == config


def test_local_directory_without_config(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match="has no config.json") as e:
        load_model_files(str(tmp_path / "empty"))
    one_line(e.value)


def test_missing_path_is_an_error_not_a_hub_lookup(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="does not exist") as e:
        load_model_files(str(tmp_path / "nope"), hub=ExplodingHub())
    one_line(e.value)
    with pytest.raises(ModelSourceError, match="does not exist"):
        load_model_files("./models/config.json", hub=ExplodingHub())


def test_malformed_config_json(tmp_path: Path) -> None:
    d = write_model_dir(tmp_path / "bad", config='{"hidden_size": 4096,\n "num_hidden_layers": }')
    with pytest.raises(ModelSourceError, match=r"not valid JSON \(line 2 column") as e:
        load_model_files(str(d))
    one_line(e.value)


def test_malformed_index_json(tmp_path: Path) -> None:
    d = write_model_dir(tmp_path / "bad", index="{nope")
    with pytest.raises(ModelSourceError, match="index file .* is not valid JSON"):
        load_model_files(str(d))
    d = write_model_dir(tmp_path / "bad2", index={"metadata": {"total_size": -5}})
    with pytest.raises(ModelSourceError, match="total_size must be a positive integer"):
        load_model_files(str(d))


@pytest.mark.parametrize(
    "config",
    [
        {"architectures": ["X"], "hidden_size": 64},
        {"architectures": ["X"], "num_hidden_layers": 2},
        {"architectures": ["X"], "text_config": {"hidden_size": 64}},
        [1, 2, 3],
    ],
)
def test_config_without_architecture_fields(tmp_path: Path, config: Any) -> None:
    d = write_model_dir(tmp_path / "m", config=config)
    with pytest.raises(ModelSourceError) as e:
        load_model_files(str(d))
    text = one_line(e.value)
    assert "num_hidden_layers" in text or "hidden_size" in text or "JSON object" in text


# ------------------------------------------------------------------------------------------------ catalog


def test_catalog_by_id_case_insensitive_and_by_alias() -> None:
    by_id = load_model_files("meta-llama/Llama-3.1-8B-Instruct", hub=ExplodingHub())
    assert by_id.source == "built-in catalog" and by_id.total_size == 16060522496
    assert by_id.aliases and by_id.provenance
    assert load_model_files("META-LLAMA/llama-3.1-8b-instruct", hub=ExplodingHub()).model_id == by_id.model_id
    assert load_model_files("llama-3.1-8b", hub=ExplodingHub()).model_id == by_id.model_id
    assert load_model_files("  qwen2.5-7b ", hub=ExplodingHub()).model_id == "Qwen/Qwen2.5-7B-Instruct"
    # The data set's two spellings of one RedHatAI repo resolve to the same row.
    a = load_model_files("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", hub=ExplodingHub())
    b = load_model_files("RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic", hub=ExplodingHub())
    assert a == b


def test_catalog_rows_are_copies() -> None:
    files = find_in_catalog("qwen3-8b")
    assert files is not None
    files.config["num_hidden_layers"] = 1
    again = find_in_catalog("qwen3-8b")
    assert again is not None and again.config["num_hidden_layers"] == 36


def test_list_catalog() -> None:
    rows = list_catalog()
    assert len(rows) >= 50
    assert all(r.source == "built-in catalog" and r.total_size for r in rows)


def test_local_directory_wins_over_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_model_dir(tmp_path / "qwen3-8b")
    monkeypatch.chdir(tmp_path)
    assert load_model_files("qwen3-8b").source.startswith("local directory")


def test_inline_config() -> None:
    files = model_files_from_inline(LLAMA_CONFIG, INDEX, "acme/tiny")
    assert (files.model_id, files.total_size, files.source) == ("acme/tiny", 2_471_628_800, "inline config")
    text = model_files_from_inline(json.dumps(LLAMA_CONFIG), json.dumps(INDEX), "acme/tiny")
    assert text == files
    no_index = model_files_from_inline(LLAMA_CONFIG, None, "acme/tiny")
    assert no_index.total_size is None and no_index.source.startswith("inline config")
    with pytest.raises(ModelSourceError, match="inline config for 'acme/tiny' is not valid JSON"):
        model_files_from_inline("{", None, "acme/tiny")
    with pytest.raises(ModelSourceError, match="num_hidden_layers"):
        model_files_from_inline({"hidden_size": 8}, None, "acme/tiny")


def test_empty_and_invalid_refs() -> None:
    with pytest.raises(ModelSourceError, match="no model given"):
        load_model_files("  ")
    with pytest.raises(ModelSourceError, match="close catalog matches: .*Llama-3.1-8B-Instruct") as e:
        load_model_files("llama 3.1 8b instruct", hub=ExplodingHub())
    one_line(e.value)


# ------------------------------------------------------------------------------------------------ fake hub


class ExplodingHub:
    """A HubClient that fails the test if it is used."""

    def describe(self) -> str:
        return "exploding hub"

    def download(self, *args: Any, **kwargs: Any) -> Path | None:
        raise AssertionError("the hub must not be asked")

    def file_size(self, *args: Any, **kwargs: Any) -> int | None:
        raise AssertionError("the hub must not be asked")


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False
    token: str | None = None  # private: this bearer token is required
    sizes: dict[str, int] = field(default_factory=dict)  # files known only by size (HEAD only)


class FakeHub:
    """Answers /{org}/{name}/resolve/{revision}/{filename} like huggingface.co does."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.hits: Counter[tuple[str, str]] = Counter()
        self.auth: list[str | None] = []
        self.omit_hub_headers = False
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                hub.handle(self, body=False)

            def do_GET(self) -> None:
                hub.handle(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def gets(self) -> int:
        return sum(n for (method, _), n in self.hits.items() if method == "GET")

    def total(self) -> int:
        return sum(self.hits.values())

    def handle(self, req: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = unquote(req.path.split("?", 1)[0])
        self.hits[(req.command, path)] += 1
        self.auth.append(req.headers.get("authorization"))
        parts = path.strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self.reply(req, 404, {"X-Error-Code": "RepoNotFound"}, b"Not Found", body)
        repo_id, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        repo = self.repos.get(repo_id)
        if repo is None:
            return self.reply(
                req,
                404,
                {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
                b"",
                body,
            )
        if repo.gated:
            msg = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
            return self.reply(req, 401, {"X-Error-Code": "GatedRepo", "X-Error-Message": msg}, b"", body)
        if repo.token is not None and req.headers.get("authorization") != f"Bearer {repo.token}":
            return self.reply(req, 401, {"X-Error-Message": "Unauthorized"}, b"", body)
        if revision not in ("main", repo.commit):
            return self.reply(
                req, 404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id"}, b"", body
            )
        commit = {"X-Repo-Commit": repo.commit}
        if filename in repo.sizes:
            return self.reply(
                req, 200, {**commit, "ETag": '"sz"', "Content-Length": str(repo.sizes[filename])}, b"", False
            )
        data = repo.files.get(filename)
        if data is None:
            return self.reply(
                req,
                404,
                {**commit, "X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"},
                b"",
                body,
            )
        headers = {"Content-Type": "application/json", "Content-Length": str(len(data))}
        if not self.omit_hub_headers:
            headers.update(commit)
            headers["ETag"] = '"' + hashlib.sha1(data).hexdigest() + '"'
        self.reply(req, 200, headers, data, body)

    @staticmethod
    def reply(
        req: BaseHTTPRequestHandler, status: int, headers: dict[str, str], data: bytes, body: bool
    ) -> None:
        req.send_response(status)
        headers.setdefault("Content-Length", str(len(data)))
        for k, v in headers.items():
            req.send_header(k, v)
        req.end_headers()
        if body and data:
            req.wfile.write(data)


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    import huggingface_hub.constants

    hub = FakeHub()
    hub.thread.start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    try:
        yield hub
    finally:
        hub.server.shutdown()
        hub.server.server_close()
        hub.thread.join(timeout=5)


def add_repo(
    hub: FakeHub, repo_id: str, config: Any = LLAMA_CONFIG, index: Any = INDEX, **kw: Any
) -> FakeRepo:
    files = {"config.json": json.dumps(config).encode() if not isinstance(config, bytes) else config}
    if index is not None:
        files["model.safetensors.index.json"] = json.dumps(index).encode()
    repo = FakeRepo(files=files, **kw)
    hub.repos[repo_id] = repo
    return repo


def test_hub_download_and_cache(fake_hub: FakeHub, tmp_path: Path) -> None:
    repo = add_repo(fake_hub, "acme/tiny-llama")
    cache = tmp_path / "hf-cache"
    files = load_model_files("acme/tiny-llama", cache_dir=cache)
    assert files.model_id == "acme/tiny-llama"
    assert files.config == LLAMA_CONFIG
    assert (files.total_size, files.total_size_estimated) == (2_471_628_800, False)
    assert files.revision == repo.commit
    assert files.source.startswith(f"Hugging Face hub at {fake_hub.url} (cached at {cache}")
    assert fake_hub.gets() == 2  # config.json and the index, nothing else
    assert {p for (_, p) in fake_hub.hits} == {
        "/acme/tiny-llama/resolve/main/config.json",
        "/acme/tiny-llama/resolve/main/model.safetensors.index.json",
    }

    # Second load: served from the cache (the hub only revalidates with HEAD; nothing is downloaded again).
    again = load_model_files("acme/tiny-llama", cache_dir=cache)
    assert again == files
    assert fake_hub.gets() == 2

    # Offline: no request at all.
    before = fake_hub.total()
    assert load_model_files("acme/tiny-llama", cache_dir=cache, offline=True) == files
    assert fake_hub.total() == before

    # Pinned to the commit: the cached snapshot is used without asking the hub.
    pinned = load_model_files("acme/tiny-llama", cache_dir=cache, revision=repo.commit)
    assert pinned.config == LLAMA_CONFIG and pinned.revision == repo.commit
    assert fake_hub.total() == before


def test_hub_offline_from_environment(
    fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_repo(fake_hub, "acme/tiny-llama")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match="offline mode is on") as e:
        load_model_files("acme/tiny-llama", cache_dir=tmp_path)
    one_line(e.value)
    assert fake_hub.total() == 0


def test_hub_offline_with_config_cached_but_not_the_index(fake_hub: FakeHub, tmp_path: Path) -> None:
    import huggingface_hub

    add_repo(fake_hub, "acme/tiny-llama")
    huggingface_hub.hf_hub_download(
        "acme/tiny-llama", "config.json", cache_dir=tmp_path, endpoint=fake_hub.url
    )
    files = load_model_files("acme/tiny-llama", cache_dir=tmp_path, offline=True)
    assert files.config == LLAMA_CONFIG and files.total_size is None
    assert "not in the cache" in files.source


def test_hub_without_index_uses_model_safetensors_size(fake_hub: FakeHub, tmp_path: Path) -> None:
    add_repo(fake_hub, "acme/single", index=None, sizes={"model.safetensors": 988_065_536 + 20_000})
    files = load_model_files("acme/single", cache_dir=tmp_path)
    assert files.total_size == 988_085_536 and files.total_size_estimated is False
    assert "no model.safetensors.index.json" in files.source
    # A missing index is remembered by the cache, so offline loads work too (size unknown then).
    offline = load_model_files("acme/single", cache_dir=tmp_path, offline=True)
    assert offline.config == LLAMA_CONFIG and offline.total_size is None


def test_hub_without_index_or_weights(fake_hub: FakeHub, tmp_path: Path) -> None:
    add_repo(fake_hub, "acme/bare", index=None)
    files = load_model_files("acme/bare", cache_dir=tmp_path)
    assert files.total_size is None and "unknown" in files.source


def test_hub_repo_without_config(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.repos["acme/gguf-only"] = FakeRepo(files={"model.gguf": b"GGUF"})
    with pytest.raises(ModelSourceError, match="has no config.json") as e:
        load_model_files("acme/gguf-only", cache_dir=tmp_path)
    one_line(e.value)


def test_hub_404_unknown_repo_lists_close_catalog_matches(fake_hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError) as e:
        load_model_files("meta-llama/Llama-3.1-8B-Instrukt", cache_dir=tmp_path)
    text = one_line(e.value)
    assert "unknown on the Hugging Face hub" in text and "not in the built-in catalog" in text
    assert "close catalog matches: meta-llama/Llama-3.1-8B-Instruct" in text


def test_hub_401_gated_repo_says_set_hf_token(fake_hub: FakeHub, tmp_path: Path) -> None:
    add_repo(fake_hub, "acme/gated", gated=True)
    with pytest.raises(ModelSourceError, match="gated") as e:
        load_model_files("acme/gated", cache_dir=tmp_path)
    text = one_line(e.value)
    assert "set HF_TOKEN" in text


def test_hub_private_repo_token_from_argument_and_environment(
    fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_repo(fake_hub, "acme/private", token="hf_good")
    with pytest.raises(ModelSourceError, match=r"refused access .*HTTP 401.*set HF_TOKEN") as e:
        load_model_files("acme/private", cache_dir=tmp_path / "a", token="hf_wrong")
    one_line(e.value)
    assert load_model_files("acme/private", cache_dir=tmp_path / "b", token="hf_good").config == LLAMA_CONFIG
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    assert load_model_files("acme/private", cache_dir=tmp_path / "c").config == LLAMA_CONFIG
    assert fake_hub.auth[-1] == "Bearer hf_good"


def test_hub_unknown_revision(fake_hub: FakeHub, tmp_path: Path) -> None:
    add_repo(fake_hub, "acme/tiny-llama")
    with pytest.raises(ModelSourceError, match="revision 'v9' of 'acme/tiny-llama' does not exist") as e:
        load_model_files("acme/tiny-llama", revision="v9", cache_dir=tmp_path)
    one_line(e.value)


def test_pinned_revision_skips_the_catalog(fake_hub: FakeHub, tmp_path: Path) -> None:
    add_repo(fake_hub, "Qwen/Qwen3-8B", config={**LLAMA_CONFIG, "num_hidden_layers": 3})
    files = load_model_files("Qwen/Qwen3-8B", revision="main", cache_dir=tmp_path)
    assert files.source.startswith("Hugging Face hub") and files.config["num_hidden_layers"] == 3
    assert load_model_files("Qwen/Qwen3-8B").source == "built-in catalog"


def test_hub_malformed_files(fake_hub: FakeHub, tmp_path: Path) -> None:
    add_repo(fake_hub, "acme/broken", config=b"{not json")
    with pytest.raises(ModelSourceError, match="not valid JSON") as e:
        load_model_files("acme/broken", cache_dir=tmp_path)
    one_line(e.value)
    add_repo(fake_hub, "acme/not-a-transformer", config={"architectures": ["X"], "vocab_size": 5})
    with pytest.raises(ModelSourceError, match="num_hidden_layers / hidden_size"):
        load_model_files("acme/not-a-transformer", cache_dir=tmp_path)


def test_endpoint_that_is_not_a_hub(fake_hub: FakeHub, tmp_path: Path) -> None:
    add_repo(fake_hub, "acme/tiny-llama")
    fake_hub.omit_hub_headers = True
    with pytest.raises(ModelSourceError, match="cannot fetch 'acme/tiny-llama'.*X-Repo-Commit") as e:
        load_model_files("acme/tiny-llama", cache_dir=tmp_path)
    one_line(e.value)


def test_network_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    import huggingface_hub.constants
    import huggingface_hub.utils._http as hf_http

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_http.time, "sleep", lambda _s: None)  # huggingface_hub retries with back-off
    with pytest.raises(
        ModelSourceError, match=r"cannot fetch 'acme/x' from the Hugging Face hub at http://127\.0\.0\.1"
    ) as e:
        load_model_files("acme/x", cache_dir=tmp_path)
    assert "check the network" in one_line(e.value)


# ------------------------------------------------------------------------------------------------ injected client


@dataclass
class ScriptedHub:
    """A HubClient protocol object (for callers that cannot or need not use HTTP)."""

    error: Exception | None = None
    root: Path | None = None
    calls: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return "scripted hub"

    def download(
        self,
        repo_id: str,
        filename: str,
        *,
        revision: str | None,
        token: str | None,
        cache_dir: Any,
        offline: bool,
    ) -> Path | None:
        self.calls.append(filename)
        if self.error is not None:
            raise self.error
        assert self.root is not None
        path = self.root / filename
        return path if path.exists() else None

    def file_size(
        self, repo_id: str, filename: str, *, revision: str | None, token: str | None, offline: bool
    ) -> int | None:
        return None


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (HubAccessDenied(403, gated=True), "gated repository on the scripted hub"),
        (HubAccessDenied(403, gated=False), r"refused access to 'acme/x' \(HTTP 403\)"),
        (HubRepoNotFound("HTTP 404"), "unknown on the scripted hub"),
        (
            HubUnreachable("ConnectError: boom\nsecond line"),
            r"cannot fetch 'acme/x' from the scripted hub \(ConnectError: boom second line\)",
        ),
    ],
)
def test_injected_hub_client_errors(error: Exception, expected: str) -> None:
    with pytest.raises(ModelSourceError, match=expected) as e:
        load_model_files("acme/x", hub=ScriptedHub(error=error))
    one_line(e.value)


def test_injected_hub_client_files(tmp_path: Path) -> None:
    write_model_dir(tmp_path)
    hub = ScriptedHub(root=tmp_path)
    files = load_model_files("acme/x", hub=hub)
    assert files.total_size == 2_471_628_800 and files.source.startswith("scripted hub")
    assert hub.calls == ["config.json", "model.safetensors.index.json"]


def test_model_sources_do_not_import_kubernetes() -> None:
    for module in (sources, hub):
        text = Path(module.__file__ or "").read_text()
        assert "import kubernetes" not in text and "from kubernetes" not in text, module


@pytest.mark.parametrize("ref", ["./model", "/etc", "../x/y", "a/b/c", "org/../name", "", "org/name\n"])
def test_the_operators_resolver_refuses_paths_before_touching_anything(tmp_path: Path, ref: str) -> None:
    """hub.resolve_model_id (the handlers' resolver) takes a catalog id or a hub repo id, never a path."""
    scripted = ScriptedHub(root=tmp_path)
    with pytest.raises(ModelSourceError, match="spec.model.name"):
        hub.resolve_model_id(ref, hub=scripted)
    assert scripted.calls == []


def test_the_operators_resolver_reads_an_existing_directory_name_as_a_hub_id(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A repo id that is also a local directory (relative to the working directory) goes to the hub, not to disk."""
    write_model_dir(tmp_path / "acme" / "x", config={**LLAMA_CONFIG, "hidden_size": 1024})
    monkeypatch.chdir(tmp_path)
    hub_root = tmp_path / "hub"
    write_model_dir(hub_root)
    scripted = ScriptedHub(root=hub_root)
    files = hub.resolve_model_id("acme/x", hub=scripted)
    assert files.source.startswith("scripted hub") and files.config["hidden_size"] == 2048
    local = load_model_files("acme/x", hub=scripted)  # the CLI's loader does read the directory
    assert local.source.startswith("local directory") and local.config["hidden_size"] == 1024
