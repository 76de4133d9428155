"""vLLM's flags in one home (api/flags.py): the spelling rules hold for every flag vLLM's parsers have had
(catalog/vllm_flags_cli.yaml, generated from them), the API's keys are those rules, and the modules that spell
flags (the planner, the renderer, the CLI) spell them through it."""

from __future__ import annotations

from importlib import resources
from typing import Any

import pytest
import yaml

from vllm_operator.api.flags import (
    OPERATOR_OWNED_FLAGS,
    VLLM_SHORT_FLAGS,
    canonical_cli_flag,
    cli_flag_name,
    flag_key,
    flag_name,
    flags_from_api,
    managed_flag_of,
    vllm_cli_flag,
    vllm_cli_negation,
)
from vllm_operator.api.v1alpha1 import PinnedFlags
from vllm_operator.planner.plan import flags_to_args
from vllm_operator.render.flags import flag_table


def _catalog(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(resources.files("vllm_operator.catalog").joinpath(name).read_text())
    return data


CLI = _catalog("vllm_flags_cli.yaml")
LONG_FLAGS = sorted(f for f in CLI["flags"] if not f.startswith("--no-"))


def test_the_catalog_has_vllms_flags() -> None:
    assert len(LONG_FLAGS) > 300 and "--max-model-len" in LONG_FLAGS


@pytest.mark.parametrize("flag", LONG_FLAGS)
def test_every_vllm_flag_translates_both_ways(flag: str) -> None:
    name = cli_flag_name(flag)
    assert vllm_cli_flag(name) == flag
    assert flag_name(flag_key(name)) == name
    assert canonical_cli_flag("--" + name) == flag  # vLLM reads --max_model_len as --max-model-len
    assert cli_flag_name(f"{flag}=1") == name


def test_max_model_len_in_each_spelling() -> None:
    assert flag_key("max_model_len") == "maxModelLen"
    assert flag_name("maxModelLen") == flag_name("max_model_len") == "max_model_len"
    assert vllm_cli_flag("max_model_len") == "--max-model-len"
    assert cli_flag_name("--max_model_len=4096") == cli_flag_name("--max-model-len") == "max_model_len"
    assert canonical_cli_flag("--max_model_len") == "--max-model-len"
    assert canonical_cli_flag("-tp") == "-tp" and canonical_cli_flag("4096") == "4096"
    assert flags_from_api({"maxModelLen": 4096, "max_num_seqs": 8}) == {"max_model_len": 4096, "max_num_seqs": 8}


def test_negations_are_vllms() -> None:
    for flag in CLI["flags"]:
        if flag.startswith("--no-") and "--" + flag[5:] in CLI["flags"]:
            assert vllm_cli_negation(cli_flag_name("--" + flag[5:])) == flag
    for name in flag_table().negatable:
        assert vllm_cli_negation(name) in CLI["flags"]


@pytest.mark.parametrize("name", list(PinnedFlags.model_fields))
def test_every_pinnable_flag_is_a_vllm_flag_and_its_api_key_is_the_rule(name: str) -> None:
    assert PinnedFlags.model_fields[name].alias == flag_key(name)
    assert vllm_cli_flag(name) in CLI["flags"]
    assert PinnedFlags.field_path(cli_flag_name(vllm_cli_flag(name))) == \
        f"spec.flags.{flag_key(name)}"


def test_managed_and_short_flags_are_vllms() -> None:
    for name in OPERATOR_OWNED_FLAGS:
        assert vllm_cli_flag(name) in CLI["flags"]
    for short, name in VLLM_SHORT_FLAGS.items():
        targets = {row["to"] for row in CLI["aliases"]["-" + short]}
        assert vllm_cli_flag(name) in targets


def test_the_renderers_flag_table_speaks_vllms_names() -> None:
    # its rows are vLLM's snake_case names; two are not flags of their own (an alias, and `--max-model-len auto`)
    aliases = {cli_flag_name(alias) for alias in CLI["aliases"] if alias.startswith("--")}
    odd = {name for name in flag_table().flags if vllm_cli_flag(name) not in CLI["flags"]}
    assert odd - aliases == {"max_model_len_auto"}


@pytest.mark.parametrize(("arg", "managed"), [
    ("--max-model-len", "max_model_len"), ("--max_model_len=4096", "max_model_len"), ("-tp", "tensor_parallel_size"),
    ("--no-enable-prefix-caching", "enable_prefix_caching"), ("--port=9000", "port"), ("--served-model-name", "served_model_name"),
    ("-1", None), ("-.5", None), ("4096", None), ("--disable-log-stats", None), ("-O3", None),
])
def test_managed_flag_of(arg: str, managed: str | None) -> None:
    assert managed_flag_of(arg, PinnedFlags.model_fields) == managed


def test_the_planners_args_use_the_spellings() -> None:
    assert flags_to_args({"max_model_len": 4096, "enable_prefix_caching": False, "enforce_eager": True,
                          "lora_modules": ("a=/m/a",)}) == [
        "--max-model-len", "4096", "--no-enable-prefix-caching", "--enforce-eager", "--lora-modules", "a=/m/a"]
