"""vLLM's flags in the VLLMService API: their spellings, the flag maps status stores, the values vLLM accepts for
the typed flags, and which flags the operator manages.

One flag, one set of spellings, translated here and nowhere else:

==================================================  ====================  ==========================
where                                               spelling              from the snake_case name
==================================================  ====================  ==========================
vLLM's `dest`, the planner, the renderer, catalogs  `max_model_len`       (the name)
`spec.flags`, `status.plan.flags` (the API)         `maxModelLen`         `flag_key`; back: `flag_name`
vLLM's command line                                 `--max-model-len`     `vllm_cli_flag`; back: `cli_flag_name`
its negation (BooleanOptionalAction)                `--no-enable-...`     `vllm_cli_negation`
what vLLM also reads as the same flag               `--max_model_len`     `canonical_cli_flag`
==================================================  ====================  ==========================

The rules hold for every flag `vllm serve` has had since 0.6 (catalog/vllm_flags_cli.yaml, generated from vLLM's
own parsers): tests/unit/test_api_flags.py translates each of them both ways."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, PlainValidator, WithJsonSchema, WrapSerializer
from pydantic_core import PydanticCustomError

from .schema import MAX_CONTEXT_TOKENS, MAX_MODEL_LEN_AUTO

#: The value of one vLLM flag: a bool, a number or a string.
FlagValue = bool | int | float | str | list[str]  # lists: nargs options (--lora-modules)

_SNAKE_PART = re.compile(r"_([a-z0-9])")
_CAMEL_HUMP = re.compile(r"([A-Z])")


def flag_key(name: str) -> str:
    """The API (camelCase) key of a vLLM flag given by its snake_case name: `max_model_len` -> `maxModelLen`.

    The same spelling as `spec.flags` uses (pydantic's `to_camel`), so `status.plan.flags.maxModelLen` and
    `spec.flags.maxModelLen` name one flag. Already camelCase names are returned unchanged."""
    return _SNAKE_PART.sub(lambda m: m.group(1).upper(), name)


def flag_name(key: str) -> str:
    """vLLM's snake_case name of a flag given by its API key: `maxModelLen` -> `max_model_len`.

    The inverse of `flag_key` for snake_case names made of lowercase words; snake_case input is returned
    unchanged, so a status written by an older operator (snake_case keys) reads the same."""
    return _CAMEL_HUMP.sub(lambda m: "_" + m.group(1).lower(), key)


def vllm_cli_flag(name: str) -> str:
    """vLLM's command-line spelling of a snake_case option: `max_model_len` -> `--max-model-len`."""
    return "--" + name.replace("_", "-")


def vllm_cli_negation(name: str) -> str:
    """The negated command-line flag of a boolean option (argparse's BooleanOptionalAction):
    `enable_prefix_caching` -> `--no-enable-prefix-caching`."""
    return "--no-" + name.replace("_", "-")


def cli_flag_name(flag: str) -> str:
    """The snake_case name of a long command-line flag, as vLLM's parser reads it (with or without a value, dashes
    or underscores): `--max-model-len`, `--max_model_len=4096` -> `max_model_len`."""
    return flag.removeprefix("--").split("=", 1)[0].replace("-", "_")


def canonical_cli_flag(option: str) -> str:
    """A long option as vLLM spells it in its help (`--max_model_len` -> `--max-model-len`: vLLM's parser takes both);
    short options and values are returned unchanged."""
    return "--" + option[2:].replace("_", "-") if option.startswith("--") else option


def flags_from_api(flags: Any) -> Any:
    """A flag map as stored in status (camelCase keys) keyed by vLLM's snake_case names; anything else as is.

    The one reader of raw status flag maps (`status.plan.flags`, `status.remediation.profile`, a history
    entry's `flagsBefore`/`flagsAfter`/`profileBefore`): code that reads a status dict without parsing it
    into the models below goes through this."""
    if not isinstance(flags, Mapping):
        return flags
    return {flag_name(str(key)): value for key, value in flags.items()}


def _flags_to_api(flags: dict[str, FlagValue], handler: Any, info: Any) -> Any:
    if info.by_alias:
        flags = {flag_key(key): value for key, value in flags.items()}
    return handler(flags)


#: vLLM flags keyed by vLLM's snake_case name (`max_model_len`) in Python, e.g. a plan or a remediation
#: profile; the API (status) spells the keys in camelCase (`maxModelLen`), as `spec.flags` does. Both
#: spellings are read.
FlagMap = Annotated[
    dict[str, FlagValue],
    BeforeValidator(flags_from_api),
    WrapSerializer(_flags_to_api),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]

#: vLLM's `--quantization` methods (vLLM 0.11). Also the values of `quant_method` in a config.json.
Quantization = Literal[
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "gptq_marlin_24",
    "gptq_bitblas",
    "bitblas",
    "fp8",
    "ptpc_fp8",
    "fbgemm_fp8",
    "modelopt",
    "modelopt_fp4",
    "compressed-tensors",
    "bitsandbytes",
    "gguf",
    "hqq",
    "experts_int8",
    "moe_wna16",
    "torchao",
    "quark",
    "auto-round",
    "inc",
    "rtn",
    "mxfp4",
    "petit_nvfp4",
    "tpu_int8",
    "ipex",
]
QUANTIZATION_METHODS: tuple[str, ...] = get_args(Quantization)

KVCacheDType = Literal["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"]
ModelDType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
BlockSize = Literal[1, 8, 16, 32, 64, 128]
MaxLoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]


def _length_or_auto(value: Any) -> int | Literal["auto"]:
    """`maxModelLen`: a whole number in [16, MAX_CONTEXT_TOKENS] or `auto`, one error for anything else (a union
    would report one per branch)."""
    if value == MAX_MODEL_LEN_AUTO:
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError("int_or_auto", "must be a whole number or auto")
    if value < 16:
        raise PydanticCustomError("greater_than_equal", "must be greater than or equal to 16")
    if value > MAX_CONTEXT_TOKENS:
        raise PydanticCustomError("less_than_equal", f"must be less than or equal to {MAX_CONTEXT_TOKENS}")
    return value


#: `spec.flags.maxModelLen`: tokens, or `auto`. In the CRD an int-or-string whose bounds apply to the number and
#: whose pattern to the string (JSON Schema applies each only to its own type).
MaxModelLen = Annotated[
    int | Literal["auto"],
    PlainValidator(_length_or_auto),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True,
                    "minimum": 16, "maximum": MAX_CONTEXT_TOKENS, "pattern": "^auto$"}),
]


#: vLLM options the operator sets itself from other spec fields (not pinnable through `flags`).
OPERATOR_OWNED_FLAGS: dict[str, str] = {
    "model": "spec.model.name",
    "revision": "spec.model.revision",
    "served_model_name": "spec.model.servedName",
    "port": "spec.service.port",
    "max_loras": "spec.lora.maxLoras",
    "lora_modules": "spec.lora.adapters",
    "host": "",  # the operator binds all interfaces so probes and the Service reach vLLM
}

#: vLLM's short aliases for long options.
VLLM_SHORT_FLAGS: dict[str, str] = {
    "tp": "tensor_parallel_size",
    "pp": "pipeline_parallel_size",
    "dp": "data_parallel_size",
    "q": "quantization",
}


def managed_flag_of(arg: str, pinnable: Collection[str]) -> str | None:
    """The snake_case vLLM option an extra argument sets, when the operator manages it (one of `pinnable`, the
    snake_case names of `spec.flags`, or OPERATOR_OWNED_FLAGS); else None."""
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit() or arg[1:2] == ".":
        return None  # a value (including a negative number), not an option
    if not arg.startswith("--"):
        return VLLM_SHORT_FLAGS.get(arg[1:].split("=", 1)[0])
    name = cli_flag_name(arg)
    if name in pinnable or name in OPERATOR_OWNED_FLAGS:
        return name
    negated = name.removeprefix("no_")
    if negated != name and negated in pinnable:
        return negated
    return None
