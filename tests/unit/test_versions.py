"""planner.versions: reading vLLM versions (strings, image tags) and the rules each release applies."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from vllm_operator.api.v1alpha1 import DEFAULT_IMAGE
from vllm_operator.planner.versions import (
    NEWEST_KNOWN_VERSION,
    VersionError,
    VersionProfile,
    batch_defaults,
    era_rows,
    eras,
    parse_version,
    profile_for,
    uses_v2_runner,
    version_from_image,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.11.0", (0, 11, 0)),
        ("v0.8.5.post1", (0, 8, 5)),
        ("0.11.0+582e4e37.nv25.11", (0, 11, 0)),
        ("0.10", (0, 10, 0)),
        ("  v0.19.1  ", (0, 19, 1)),
        ("0.6.4.post1", (0, 6, 4)),
    ],
)
def test_parse_version(text: str, expected: tuple[int, int, int]) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize("text", ["", "latest", "banana", "v"])
def test_parse_version_rejects_non_versions(text: str) -> None:
    with pytest.raises(VersionError, match="version"):
        parse_version(text)


def test_version_error_is_a_value_error() -> None:
    assert issubclass(VersionError, ValueError)


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("vllm/vllm-openai:v0.11.0", "0.11.0"),
        ("vllm/vllm-openai:0.9.2", "0.9.2"),
        ("docker.io/vllm/vllm-openai:v0.8.5.post1", "0.8.5"),
        ("registry.example.com:5000/ml/vllm-openai:v0.10.1", "0.10.1"),
        ("vllm/vllm-openai:v0.11.0@sha256:" + "a" * 64, "0.11.0"),
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai", None),
        ("registry.example.com:5000/vllm-openai", None),
        ("vllm/vllm-openai@sha256:" + "0123456789abcdef" * 4, None),
        ("vllm/vllm-openai:nightly", None),
    ],
)
def test_version_from_image(image: str, expected: str | None) -> None:
    assert version_from_image(image) == expected


def test_ngc_container_tag_is_not_a_vllm_version() -> None:
    assert version_from_image("nvcr.io/nvidia/vllm:25.11-py3") is None


# --- eras ---------------------------------------------------------------------------------------------------


def test_v0_era() -> None:
    profile = profile_for("0.6.3")
    assert profile.engine == "V0"
    assert profile.tokens_definition == "blocks"
    assert profile.kv_error_style == "v0"
    assert not profile.free_memory_check
    assert profile.default_utilization == 0.90
    assert profile.version == "0.6.3"


def test_v0_6_4_counted_other_processes() -> None:
    assert profile_for("0.6.4").others_memory_counted
    assert not profile_for("0.6.5").others_memory_counted


def test_v1_from_0_8() -> None:
    profile = profile_for("0.8.0")
    assert profile.engine == "V1"
    assert profile.others_memory_counted  # before #18974
    assert not profile.free_memory_check
    assert not profile.cudagraph_subtracted


def test_free_memory_check_from_0_9_1() -> None:
    assert not profile_for("0.9.0").free_memory_check
    profile = profile_for("0.9.1")
    assert profile.free_memory_check
    assert not profile.others_memory_counted
    assert profile.free_check_style == "no_device"
    assert profile_for("0.12.0").free_check_style == "no_device"
    assert profile_for("0.15.0").free_check_style == "device"  # #30868, Dec 2025 (v0.13/v0.14)


def test_kv_error_wording_eras() -> None:
    assert profile_for("0.6.5").kv_error_style == "v0"
    assert profile_for("0.7.0").kv_error_style == "v1_gb"
    assert profile_for("0.10.0").kv_error_style.startswith("v1_typo")
    assert profile_for("0.20.5").kv_error_style.startswith("v1_typo")
    assert profile_for("0.26.0").kv_error_style == "v1_current"


def test_v0_21_raises_default_util_and_subtracts_cuda_graphs() -> None:
    before, after = profile_for("0.20.9"), profile_for("0.21.0")
    assert (before.default_utilization, before.cudagraph_subtracted) == (0.90, False)
    assert (after.default_utilization, after.cudagraph_subtracted) == (0.92, True)
    assert before.tokens_definition == "blocks_per_group"
    assert after.tokens_definition == "concurrency"


def test_none_means_the_newest_known_release() -> None:
    profile = profile_for(None)
    assert profile.version == NEWEST_KNOWN_VERSION
    assert profile == profile_for(NEWEST_KNOWN_VERSION)
    assert profile.cudagraph_subtracted
    assert profile.default_utilization == 0.92


def test_future_release_uses_the_newest_rules() -> None:
    assert profile_for("1.2.0").cudagraph_subtracted
    assert profile_for("1.2.0").version == "1.2.0"


def test_release_before_the_first_era_uses_the_oldest_rules() -> None:
    assert profile_for("0.2.0").engine == "V0"


def test_version_tuple() -> None:
    assert profile_for("v0.8.5.post1").version_tuple == (0, 8, 5)


def test_bad_version_raises() -> None:
    with pytest.raises(VersionError):
        profile_for("nightly")


# --- batch defaults (EngineArgs.get_batch_defaults) ----------------------------------------------------------


def _defaults(version: str, gib: float, a100: bool = False, mml: int = 8192, chunked: bool = True) -> tuple[int, int]:
    d = batch_defaults(profile_for(version), gpu_memory_gib=gib, is_a100=a100, max_model_len=mml,
                       chunked_prefill=chunked)
    return d.max_num_seqs, d.max_num_batched_tokens


def test_h100_gets_1024_sequences_and_8192_tokens() -> None:
    assert _defaults("0.19.0", 79.19) == (1024, 8192)
    assert _defaults("0.26.0", 139.75) == (1024, 8192)


def test_a100_80gb_carve_out() -> None:
    assert _defaults("0.19.0", 79.35, a100=True) == (256, 2048)
    assert _defaults("0.8.0", 79.35, a100=True) == (1024, 8192)  # before the carve-out


def test_small_gpus_get_256_and_2048() -> None:
    assert _defaults("0.19.0", 21.84) == (256, 2048)  # L4
    assert _defaults("0.19.0", 44.42) == (256, 2048)  # L40S


def test_batched_tokens_never_exceed_seqs_times_len() -> None:
    assert _defaults("0.19.0", 79.19, mml=4) == (1024, 4096)
    assert _defaults("0.19.0", 79.19, mml=1) == (1024, 1024)


def test_chunked_prefill_off_batches_a_whole_request() -> None:
    assert _defaults("0.19.0", 79.19, mml=32768, chunked=False) == (1024, 32768)


def test_v0_defaults() -> None:
    assert _defaults("0.6.5", 79.19, mml=4096) == (256, 4096)
    assert _defaults("0.6.5", 79.19, mml=1024) == (256, 2048)
    assert _defaults("0.6.5", 23.58, mml=20000) == (256, 20000)
    assert _defaults("0.6.5", 79.19, mml=131072) == (256, 512)  # chunked prefill auto-enabled above 32k


def test_batch_defaults_say_why() -> None:
    d = batch_defaults(profile_for("0.19.0"), gpu_memory_gib=79.19, is_a100=False, max_model_len=8192)
    assert "1024" in d.reason and "8192" in d.reason


# --- the version table as people edit it (0.27-0.33 rules) -------------------------------------------------------

_TABLE = resources.files("vllm_operator.catalog").joinpath("vllm_versions.yaml").read_text()
_RESOLVED_ONLY = {"note", "version", "runner"}


def test_the_table_is_written_by_hand_without_anchors() -> None:
    assert "&id" not in _TABLE and "*id" not in _TABLE


def test_the_first_era_states_every_rule_and_every_era_has_every_field() -> None:
    fields = set(VersionProfile.model_fields) - _RESOLVED_ONLY
    first = yaml.safe_load(_TABLE)["eras"][0]
    assert fields <= set(first), sorted(fields - set(first))
    for era in eras():
        dumped = era.model_dump()
        assert fields <= set(dumped)


def test_every_later_era_cites_its_source() -> None:
    blocks = _TABLE.split("\n- since: ")[2:]  # the eras after the first, as written
    assert len(blocks) == len(eras()) - 1
    for block in blocks:
        assert "\n  # " in block, f"era {block.splitlines()[0]} has no source comment"


def test_estimates_name_real_fields() -> None:
    for era in eras():
        assert set(era.estimates) <= set(VersionProfile.model_fields), era.since


def test_eras_out_of_order_are_an_error() -> None:
    text = 'eras:\n- since: "0.2.0"\n  engine: V1\n- since: "0.1.0"\n  engine: V0\n'
    with pytest.raises(VersionError, match="release order"):
        era_rows(text)


def test_a_later_era_inherits_what_it_does_not_state() -> None:
    rows = era_rows('eras:\n- since: "0.1.0"\n  engine: V0\n  note: a\n- since: "0.2.0"\n  note: b\n')
    assert rows[1] == {"since": "0.2.0", "engine": "V0", "note": "b"}


def test_default_image_and_newest_known_release_are_one_value() -> None:
    assert DEFAULT_IMAGE == "vllm/vllm-openai:v0.33.0"
    assert version_from_image(DEFAULT_IMAGE) == NEWEST_KNOWN_VERSION == "0.33.0"
    assert parse_version(eras()[-1].since) <= parse_version(NEWEST_KNOWN_VERSION)
    assert profile_for(None).since == "0.33.0"


def test_a_release_newer_than_the_newest_known_gets_the_newest_rules() -> None:
    assert profile_for("0.40.1").since == eras()[-1].since
    assert profile_for("0.40.1").version == "0.40.1"


@pytest.mark.parametrize(("version", "field", "value"), [
    ("0.25.1", "swa_inflight_batches", 1), ("0.26.0", "swa_inflight_batches", 2),
    ("0.26.0", "profiler", "increase"), ("0.27.0", "profiler", "consumed"), ("0.27.1", "profiler", "consumed"),
    ("0.26.0", "v2_sampler_state_counted", False), ("0.27.0", "v2_sampler_state_counted", True),
    ("0.27.0", "tokens_log", "two_lines"), ("0.28.0", "tokens_log", "one_line"),
    ("0.28.0", "v2_cudagraph_estimate", False), ("0.29.0", "v2_cudagraph_estimate", True),
    ("0.28.0", "kv_check_reserves_block", False), ("0.29.0", "kv_check_reserves_block", True),
    ("0.29.0", "yarn_factor_applied", True), ("0.30.0", "yarn_factor_applied", False),
    ("0.30.0", "allocator_slack_gib", 0.0), ("0.31.0", "allocator_slack_gib", 0.0),
    ("0.26.0", "v2_sampler_bytes", 0.0), ("0.32.0", "v2_sampler_bytes", 0.0), ("0.33.0", "v2_sampler_bytes", 12.0),
    ("0.21.0", "v2_runner_default", "none"), ("0.22.0", "v2_runner_default", "qwen3_dense"),
    ("0.24.0", "v2_runner_default", "listed"), ("0.25.0", "v2_runner_default", "dense"),
    ("0.29.0", "v2_runner_default", "all"), ("0.33.0", "batch_defaults", "v1_160_gb10"),
    ("0.33.0", "default_utilization", 0.92),
    ("0.27.1", "cudagraph_capture_max_cc10", 512), ("0.28.0", "cudagraph_capture_max_cc10", 1024),
    ("0.31.0", "external_weights_budget", False), ("0.32.0", "external_weights_budget", True),
    ("0.21.0", "cudagraph_scale", 0.65),
])
def test_release_rules(version: str, field: str, value: object) -> None:
    assert getattr(profile_for(version), field) == value


_LLAMA = ("LlamaForCausalLM",)
_QWEN3 = ("Qwen3ForCausalLM",)
_QWEN2 = ("Qwen2ForCausalLM",)
_MIXTRAL = ("MixtralForCausalLM",)
_DSV2 = ("DeepseekV2ForCausalLM",)


@pytest.mark.parametrize(("version", "archs", "moe", "quantized", "state", "v2"), [
    ("0.21.0", _QWEN3, False, False, False, False),   # nobody by default
    ("0.22.0", _QWEN3, False, False, False, True),    # dense Qwen3
    ("0.22.0", _QWEN3, False, True, False, False),    # … not quantized
    ("0.22.0", _LLAMA, False, False, False, False),
    ("0.24.0", _LLAMA, False, False, False, True),    # the listed archs
    ("0.24.0", _DSV2, True, False, False, True),
    ("0.24.0", _QWEN2, False, False, False, False),
    ("0.25.0", _QWEN2, False, False, False, True),    # every dense model
    ("0.25.0", _MIXTRAL, True, False, False, False),  # MoE not listed
    ("0.25.0", _DSV2, True, False, False, True),
    ("0.28.0", ("Qwen3NextForCausalLM",), True, False, True, False),  # hybrids stay on V1
    ("0.28.0", ("Qwen3_5ForCausalLM",), False, False, True, False),
    ("0.29.0", _MIXTRAL, True, False, False, True),   # every model
    ("0.29.0", ("Qwen3NextForCausalLM",), True, False, True, True),
])
def test_model_runner_rule_per_release(version: str, archs: tuple[str, ...], moe: bool, quantized: bool,
                                       state: bool, v2: bool) -> None:
    assert uses_v2_runner(profile_for(version), architectures=archs, is_moe=moe, quantized=quantized,
                          state_layers=state) is v2


def test_gpus_of_160_gib_and_more_get_16384_tokens_from_0_28() -> None:
    assert _defaults("0.27.0", 178.35) == (1024, 8192)
    assert _defaults("0.28.0", 178.35) == (1024, 16384)
    assert _defaults("0.28.0", 139.75) == (1024, 8192)  # H200: 70-160 GiB unchanged


def test_gb10_drops_to_256_and_2048_in_0_33() -> None:
    def gb10(version: str) -> tuple[int, int]:
        d = batch_defaults(profile_for(version), gpu_memory_gib=119.7, is_a100=False, max_model_len=8192,
                           compute_capability="12.1")
        return d.max_num_seqs, d.max_num_batched_tokens

    assert gb10("0.32.0") == (1024, 8192)
    assert gb10("0.33.0") == (256, 2048)


@pytest.mark.parametrize(("flag", "first"), [
    ("max_num_queued_reqs", "0.29.0"), ("max_num_queued_tokens", "0.29.0"),
    ("prefix_cache_retention_interval", "0.29.0"), ("device_memory_utilization", "0.31.0"),
    ("max_num_active_seqs", "0.31.0"),
])
def test_flags_added_in_0_29_to_0_31(flag: str, first: str) -> None:
    from vllm_operator.render.flags import flag_table

    table = flag_table()
    before = f"0.{parse_version(first)[1] - 1}.0"
    assert table.supports(flag, first) and table.supports(flag, NEWEST_KNOWN_VERSION)
    assert not table.supports(flag, before)
    assert f"before vLLM {first}" in table.unsupported_reason(flag, before)
