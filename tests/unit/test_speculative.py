"""Speculative decoding (`--speculative-config`): parsing as vLLM reads it, the draft's memory with hand-checked numbers,
the startup arithmetic with a draft, the flag per release, the CRD field and the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from vllm_operator.api.v1alpha1 import PinnedFlags, SpeculativeConfig, parse_spec
from vllm_operator.cli import main
from vllm_operator.planner.arch import LayerKind, ModelArch
from vllm_operator.planner.memory import (
    EngineFlags,
    GPUFacts,
    StartupPrediction,
    activation_bytes,
    predict_startup,
    profile_for_model,
    speculative_memory,
    v2_sampler_entry_bytes,
)
from vllm_operator.planner.speculative import (
    Speculation,
    SpeculativeConfigError,
    draft_memory,
    parse_speculative_config,
    with_draft_arch,
)
from vllm_operator.planner.versions import profile_for
from vllm_operator.reconcile import catalog_speculation
from vllm_operator.render.manifests import render_args, unsupported_pinned

LoadArch = Callable[[str], ModelArch]
GiB = 2**30
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_1B = "meta-llama/Llama-3.2-1B-Instruct"
# Llama-3.1-8B's decoder layer in bf16: attention 4096·(4096+1024+1024+4096) + MLP 3·4096·14336 parameters, × 2 bytes
LAYER_BYTES = (4096 * 10240 + 3 * 4096 * 14336) * 2  # 436,207,616


def spec(text: str, arch: ModelArch | None = None) -> Speculation:
    parsed = parse_speculative_config(text)
    return parsed if arch is None else parsed.model_copy(update={"draft_arch": arch})


def predict(arch: ModelArch, speculative: Speculation | None = None, **flags: Any) -> StartupPrediction:
    flags.setdefault("max_model_len", 8192)
    flags.setdefault("max_num_seqs", 256)
    flags.setdefault("max_num_batched_tokens", 8192)
    return predict_startup(arch, EngineFlags(speculative=speculative, **flags), GPUFacts(total_gib=79.19),
                           profile_for("0.33.0"))


# --- parsing, as vLLM reads the flag (config/speculative.py) -------------------------------------------------------


def test_parse_keeps_vllm_keys_and_renders_compact_json() -> None:
    parsed = parse_speculative_config('{"method": "eagle3", "model": "org/head", "num_speculative_tokens": 3, '
                                      '"draft_tensor_parallel_size": 1}')
    assert (parsed.kind, parsed.num_speculative_tokens, parsed.model) == ("eagle3", 3, "org/head")
    assert json.loads(parsed.to_json()) == {"method": "eagle3", "model": "org/head", "num_speculative_tokens": 3,
                                            "draft_tensor_parallel_size": 1}
    assert " " not in parsed.to_json()


def test_parse_infers_the_method_from_the_draft_name_as_vllm_does() -> None:
    assert parse_speculative_config('{"model": "yuhuili/EAGLE3-LLaMA3.1-8B", "num_speculative_tokens": 2}').method \
        == "eagle3"
    assert parse_speculative_config('{"model": "yuhuili/EAGLE-LLaMA3-8B", "num_speculative_tokens": 2}').method \
        == "eagle"
    assert parse_speculative_config(f'{{"model": "{LLAMA_1B}", "num_speculative_tokens": 2}}').method \
        == "draft_model"


def test_model_specific_mtp_names_are_mtp() -> None:
    parsed = parse_speculative_config('{"method": "deepseek_mtp"}')
    assert parsed.kind == "mtp" and parsed.method == "deepseek_mtp"  # passed on as written


def test_keys_without_memory_effect_are_passed_on() -> None:
    parsed = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5}')
    assert json.loads(parsed.to_json())["prompt_lookup_max"] == 5


@pytest.mark.parametrize(("text", "words"), [
    ("{not json", "is not JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"method": "medusa2", "num_speculative_tokens": 2}', "'medusa2' is not one the planner models"),
    ('{"method": "ngram"}', "needs num_speculative_tokens"),
    ('{"method": "eagle", "num_speculative_tokens": 2}', "needs the draft's model id"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "typo_key": 1}', "unknown to this planner: typo_key"),
])
def test_bad_configs_are_named_not_ignored(text: str, words: str) -> None:
    with pytest.raises(SpeculativeConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_speculative_config(text)


def test_mtp_tokens_default_to_the_checkpoints_mtp_layers(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B).model_copy(update={"mtp_layers": 3})
    assert parse_speculative_config('{"method": "mtp"}').tokens(arch) == 3
    assert parse_speculative_config('{"method": "mtp", "num_speculative_tokens": 1}').tokens(arch) == 1


def test_config_json_mtp_fields_are_read(load_arch: LoadArch) -> None:
    from vllm_operator.modelfiles import find_in_catalog
    from vllm_operator.planner.arch import arch_from_config

    files = find_in_catalog(LLAMA_8B)
    assert files is not None
    assert arch_from_config(files.config, model_id="x").mtp_layers == 0
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        assert arch_from_config({**files.config, key: 2}, model_id="x").mtp_layers == 2
    assert arch_from_config({**files.config, "num_nextn_predict_layers": "2"}, model_id="x").mtp_layers == 0


# --- the draft's memory, hand-checked ------------------------------------------------------------------------------


def _draft(text: str, arch: ModelArch, **kw: Any) -> Any:
    args: dict[str, Any] = {"body_bytes": 32 * LAYER_BYTES, "dtype_bytes": 2, "tp": 1, "max_num_batched_tokens": 8192,
                            "draft_weights_bytes": None, "draft_kv_per_token": None, "target_kv_per_token": 4096}
    args.update(kw)
    return draft_memory(parse_speculative_config(text), arch, **args)


def _uniform(arch: ModelArch) -> ModelArch:
    return arch.model_copy(update={"layer_param_counts": (1,) * arch.num_layers})


def test_ngram_adds_no_weights_or_kv_only_k_plus_one_sampler_rows(load_arch: LoadArch) -> None:
    d = _draft('{"method": "ngram", "num_speculative_tokens": 4}', load_arch(LLAMA_8B))
    assert (d.weights_bytes, d.kv_layers, d.sampler_rows_factor, d.estimated) == (0, 0, 5, False)


def test_mtp_layers_are_a_decoder_layer_plus_eh_proj_each_sharing_the_lm_head(load_arch: LoadArch) -> None:
    arch = _uniform(load_arch(LLAMA_8B)).model_copy(update={"mtp_layers": 2})
    d = _draft('{"method": "mtp", "num_speculative_tokens": 2}', arch)
    # 2 × (436,207,616 layer + 2·4096·4096·2 eh_proj) + 8192·4096·2 hidden-state buffer = 1 GiB exactly
    assert d.weights_bytes == 2 * (LAYER_BYTES + 67_108_864) + 67_108_864 == GiB
    assert (d.kv_layers, d.sampler_rows_factor, d.estimated) == (2, 3, False)


def test_mtp_on_a_model_without_mtp_layers_says_vllm_will_refuse(load_arch: LoadArch) -> None:
    d = _draft('{"method": "mtp", "num_speculative_tokens": 1}', _uniform(load_arch(LLAMA_8B)))
    assert d.kv_layers == 1 and "declares no MTP layers" in d.note


def test_eagle3_head_without_its_config_is_a_conservative_estimate(load_arch: LoadArch) -> None:
    d = _draft('{"method": "eagle3", "model": "org/head", "num_speculative_tokens": 3}', _uniform(load_arch(LLAMA_8B)))
    layer, fc = LAYER_BYTES, 3 * 4096 * 4096 * 2          # one decoder layer; fc 3·hidden → hidden
    head, buffers = 128_256 * 4096 * 2, 8192 * 4096 * 2 * 3  # own LM head at the target's vocab; 3 aux hidden states
    assert d.weights_bytes == layer + fc + head + buffers == 1_788_870_656
    assert (d.kv_layers, d.sampler_rows_factor, d.estimated) == (1, 4, True)


def test_eagle_head_shares_the_lm_head_and_halves_with_tp(load_arch: LoadArch) -> None:
    d = _draft('{"method": "eagle", "model": "org/head", "num_speculative_tokens": 3}', _uniform(load_arch(LLAMA_8B)),
               tp=2)
    assert d.weights_bytes == LAYER_BYTES // 2 + 2 * 4096 * 4096 * 2 + 8192 * 4096 * 2


def test_draft_model_with_its_config_adds_its_weights_and_kv_in_target_pages(load_arch: LoadArch) -> None:
    d = _draft(f'{{"method": "draft_model", "model": "{LLAMA_1B}", "num_speculative_tokens": 4}}',
               load_arch(LLAMA_8B), draft_weights_bytes=2_000_000_000, draft_kv_per_token=32_768)
    # Llama-3.2-1B: 16 layers · 2 · 8 KV heads · 64 · 2 bytes = 32,768 B/token = 8 layers of Llama-8B's 4,096
    assert (d.weights_bytes, d.kv_layers, d.estimated) == (2_000_000_000 + 8192 * 4096 * 2, 8, False)


def test_kv_per_token_grows_by_the_draft_layers(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    assert predict(arch).kv_bytes_per_token == 131_072  # 2·32·8·128·2
    eagle = spec('{"method": "eagle3", "model": "org/head", "num_speculative_tokens": 3}')
    assert predict(arch, eagle).kv_bytes_per_token == 131_072 + 4_096
    draft = spec(f'{{"method": "draft_model", "model": "{LLAMA_1B}", "num_speculative_tokens": 4}}',
                 load_arch(LLAMA_1B))
    assert predict(arch, draft).kv_bytes_per_token == 131_072 + 32_768
    assert predict(arch, spec('{"method": "ngram", "num_speculative_tokens": 4}')).kv_bytes_per_token == 131_072


def test_draft_weights_come_out_of_the_kv_budget(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    draft = spec(f'{{"method": "draft_model", "model": "{LLAMA_1B}", "num_speculative_tokens": 4}}',
                 load_arch(LLAMA_1B))
    flags = EngineFlags(max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=8192, speculative=draft)
    profile = profile_for_model(profile_for("0.33.0"), arch)
    extra = speculative_memory(arch, flags, profile)
    assert extra is not None
    # Llama-3.2-1B's ~1.24 B parameters in bf16 (tied embedding), plus the 64 MiB hidden-state buffer
    assert 2.3 * GiB < extra.weights_bytes < 2.5 * GiB
    plain, with_draft = predict(arch), predict(arch, draft)
    assert with_draft.memory.weights_gib == pytest.approx(plain.memory.weights_gib + extra.weights_bytes / GiB,
                                                          abs=0.011)
    assert with_draft.memory.kv_cache_gib < plain.memory.kv_cache_gib - extra.weights_bytes / GiB + 0.02


def test_sampler_is_booked_for_k_plus_one_rows(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    profile = profile_for_model(profile_for("0.33.0"), arch)
    base = EngineFlags(max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=2048)
    ngram = base.model_copy(update={"speculative": spec('{"method": "ngram", "num_speculative_tokens": 4}')})
    plain = activation_bytes(arch, base, profile, last_stage=True)
    spec_act = activation_bytes(arch, ngram, profile, last_stage=True)
    # the sampler dominates at 2048 batched tokens: rows 256 → min(256 · 5, 2048) = 1280
    per_entry = v2_sampler_entry_bytes(arch, base, profile)
    assert spec_act - plain == pytest.approx(per_entry * (1280 - 256) * 128_256, abs=2)
    # capped by max_num_batched_tokens: k = 15 → 256 · 16 = 4096 rows, capped at 2048
    many = base.model_copy(update={"speculative": spec('{"method": "ngram", "num_speculative_tokens": 15}')})
    assert activation_bytes(arch, many, profile, last_stage=True) - plain == pytest.approx(
        per_entry * (2048 - 256) * 128_256, abs=2)
    assert activation_bytes(arch, ngram, profile, last_stage=False) == activation_bytes(arch, base, profile,
                                                                                       last_stage=False)


def test_estimates_are_marked(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    unread = predict(arch, spec('{"method": "eagle3", "model": "org/head", "num_speculative_tokens": 3}'))
    assert {"activation_gib", "weights_gib", "kv_cache_gib"} <= set(unread.memory.estimated)
    read = predict(arch, spec(f'{{"method": "draft_model", "model": "{LLAMA_1B}", "num_speculative_tokens": 4}}',
                              load_arch(LLAMA_1B)))
    assert "weights_gib" not in read.memory.estimated and "activation_gib" in read.memory.estimated


def test_hybrid_mtp_layer_is_full_attention(load_arch: LoadArch) -> None:
    arch = load_arch(LLAMA_8B)
    kinds = (LayerKind.SLIDING, LayerKind.FULL) * 16
    hybrid = arch.model_copy(update={"layer_kinds": kinds, "sliding_window": 4096, "mtp_layers": 1})
    plain, mtp = predict(hybrid), predict(hybrid, spec('{"method": "mtp"}'))
    assert mtp.kv_bytes_per_token == plain.kv_bytes_per_token + 4_096


# --- the flag per release, the API field, the CLI ------------------------------------------------------------------


def test_flag_exists_from_0_8_2() -> None:
    value = spec('{"method": "ngram", "num_speculative_tokens": 4}').to_json()
    assert unsupported_pinned({"speculative_config": value}, "0.8.1")
    assert unsupported_pinned({"speculative_config": value}, "0.8.2") == []
    args, dropped = render_args({"speculative_config": value}, "0.33.0", ("speculative_config",))
    assert args == ["--speculative-config", value] and dropped == []


def test_spec_flags_render_vllm_json_and_reach_the_planner_with_a_catalog_draft() -> None:
    doc = {"model": {"name": LLAMA_8B}, "flags": {"speculativeConfig": {
        "method": "draft_model", "model": LLAMA_1B, "numSpeculativeTokens": 4}}}
    flags = parse_spec(doc).flags
    value = flags.to_vllm()["speculative_config"]
    assert json.loads(value) == {"method": "draft_model", "num_speculative_tokens": 4, "model": LLAMA_1B}
    speculation = catalog_speculation(flags)
    assert speculation is not None and speculation.draft_arch is not None
    assert speculation.draft_arch.num_layers == 16
    assert speculation.to_json() == value  # rendered back as the same JSON
    unknown = catalog_speculation(PinnedFlags(speculative_config=SpeculativeConfig(
        method="eagle", model="org/x", num_speculative_tokens=2)))
    assert unknown is not None and unknown.draft_arch is None
    assert catalog_speculation(PinnedFlags()) is None


def test_with_draft_arch_ignores_an_unreadable_config() -> None:
    parsed = spec('{"method": "eagle", "model": "org/x", "num_speculative_tokens": 2}')
    assert with_draft_arch(parsed, {"model_type": "llama"}).draft_arch is None


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_check_parses_a_pasted_speculative_config(capsys: pytest.CaptureFixture[str]) -> None:
    config = f'{{"method":"draft_model","model":"{LLAMA_1B}","num_speculative_tokens":4}}'
    code, out, _ = _run(capsys, "check", "--gpu", "H100", "-o", "json", "--", "vllm", "serve", LLAMA_8B,
                        "--max-model-len", "32768", "--speculative-config", config)
    assert code == 0
    doc = json.loads(out)
    assert doc["kv_bytes_per_token"] == 131_072 + 32_768
    assert doc["args"][doc["args"].index("--speculative-config") + 1] == config
    assert doc["args"].count("--speculative-config") == 1
    assert any("speculative decoding (draft_model, k=4)" in reason for reason in doc["reasons"])


def test_check_names_a_bad_speculative_config(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "check", "--gpu", "H100", "--", "vllm", "serve", LLAMA_8B,
                          "--speculative-config", '{"method": "ngram"}')
    assert code == 2 and out == "" and "needs num_speculative_tokens" in err and len(err.strip().splitlines()) == 1


def test_plan_manifest_pins_the_speculative_config(capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    code, out, _ = _run(capsys, "plan", "--model", LLAMA_8B, "--gpu", "H100", "--speculative-config",
                        '{"method": "eagle3", "model": "org/head", "num_speculative_tokens": 3}', "-o", "manifest")
    assert code == 0
    manifest = yaml.safe_load(out)
    assert manifest["spec"]["flags"]["speculativeConfig"] == {"method": "eagle3", "model": "org/head",
                                                              "numSpeculativeTokens": 3}
    assert parse_spec(manifest["spec"]).flags.speculative_config is not None


def test_planner_leaves_sampler_rows_for_k_plus_one_tokens(load_arch: LoadArch) -> None:
    from vllm_operator.planner import PlanRequest, plan
    from vllm_operator.planner.gpus import load_gpu_catalog

    gpu = load_gpu_catalog().get("L4")
    config = '{"method": "eagle3", "model": "org/head", "num_speculative_tokens": 3}'
    pinned = PinnedFlags(speculative_config=SpeculativeConfig.model_validate(json.loads(config)))
    result = plan(PlanRequest(arch=load_arch(LLAMA_8B), gpu=gpu, pinned=pinned, vllm_version="0.33.0"))
    assert result.fits
    assert result.flags["speculative_config"] == parse_speculative_config(config).to_json()
    assert "speculative_config" in result.pinned
