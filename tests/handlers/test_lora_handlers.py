"""spec.lora refused end to end: the operator's kopf handlers against the emulated API server over real HTTP.

A VLLMService asking for LoRA where the image's vLLM release would refuse it (the model's class does not implement
SupportsLoRA in that release; a `--max-lora-rank` the release does not accept) gets `Degraded=True/InvalidSpec`
naming the field and vLLM's reason, one Warning Event saying the same, and no Deployment: no pod is rolled out to
crash on it. Fixing the spec (the field removed, an image that accepts it) deploys. The refusals come from
catalog/lora_support.yaml, read from the released wheels (scripts/lora_support.py).
"""

from __future__ import annotations

from typing import Any

from kit.inprocess import Cluster, condition, container, flag_value, harness_fixture  # noqa: F401 (`harness`)

GPT_OSS = "openai/gpt-oss-20b"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
H100 = "NVIDIA-H100-80GB-HBM3"
ADAPTERS = {"adapters": [{"name": "sql", "source": "my-org/sql-lora"}]}


def _deployment_writes(h: Cluster) -> list[Any]:
    return [w for w in h.writes() if w.resource == "deployments"]


def _assert_invalid_without_deployment(h: Cluster, name: str, *fragments: str) -> str:
    """InvalidSpec in the Degraded condition and in one Warning Event, each naming every fragment; nothing rolled
    out once the operator has finished with the object. Returns the condition's message."""
    obj = h.wait_condition(name, "Degraded", "True", "InvalidSpec")
    message = condition(obj, "Degraded")["message"]  # type: ignore[index]
    assert all(f in message for f in fragments), message
    event = h.wait_events(name, "InvalidSpec")[0]
    assert event["type"] == "Warning"
    assert all(f in event["message"] for f in fragments), event["message"]
    h.wait_settled(name)
    assert h.deployment(name) is None
    assert _deployment_writes(h) == []  # not created, then deleted: never written at all
    assert len(h.events(name, "InvalidSpec")) == 1
    return str(message)


def test_lora_on_a_release_that_refuses_the_architecture_is_an_invalid_spec(harness: Cluster) -> None:
    h = harness
    h.add_node("gpu-1", H100)
    h.create("oss", {"model": {"name": GPT_OSS}, "image": "vllm/vllm-openai:v0.10.2", "lora": ADAPTERS})
    _assert_invalid_without_deployment(h, "oss", "spec.lora", "GptOssForCausalLM",
                                       "ValueError: GptOssForCausalLM does not support LoRA yet.",
                                       "vLLM 0.10.2 does not serve GptOssForCausalLM with LoRA")
    # the same model without LoRA is served: it was the LoRA that stopped it
    h.patch_spec("oss", {"lora": None})
    args = container(h.wait_deployment("oss"))["args"]
    assert "--enable-lora" not in args


def test_pinned_enable_lora_on_a_refusing_release_names_the_flag(harness: Cluster) -> None:
    h = harness
    h.add_node("gpu-1", H100)
    h.create("oss", {"model": {"name": GPT_OSS}, "image": "vllm/vllm-openai:v0.10.2",
                     "flags": {"enableLora": True}})
    _assert_invalid_without_deployment(h, "oss", "spec.flags.enableLora",
                                       "ValueError: GptOssForCausalLM does not support LoRA yet.")


def test_a_rank_the_release_does_not_accept_is_an_invalid_spec(harness: Cluster) -> None:
    h = harness
    h.add_node("gpu-1", H100)
    # rank 1 is in the CRD's enum (vLLM 0.11.1+ accepts it), but not in 0.11.0's choices
    h.create("llama", {"model": {"name": LLAMA_8B}, "image": "vllm/vllm-openai:v0.11.0",
                       "lora": {**ADAPTERS, "maxRank": 1}})
    _assert_invalid_without_deployment(h, "llama", "spec.lora.maxRank",
                                       "vLLM 0.11.0 accepts --max-lora-rank 8, 16, 32, 64, 128, 256, 320, 512, not 1")
    # the first release that accepts it deploys with the rank as asked
    h.patch_spec("llama", {"image": "vllm/vllm-openai:v0.11.1"})
    args = container(h.wait_deployment("llama"))["args"]
    assert flag_value(args, "--max-lora-rank") == "1" and "--enable-lora" in args
    obj = h.wait_condition("llama", "PlanFeasible", "True")
    assert condition(obj, "Degraded")["reason"] != "InvalidSpec"  # type: ignore[index]


def test_a_pinned_rank_the_release_does_not_accept_names_the_flag(harness: Cluster) -> None:
    h = harness
    h.add_node("gpu-1", H100)
    h.create("llama", {"model": {"name": LLAMA_8B}, "image": "vllm/vllm-openai:v0.7.3",
                       "flags": {"enableLora": True, "maxLoraRank": 512}})
    _assert_invalid_without_deployment(h, "llama", "spec.flags.maxLoraRank",
                                       "vLLM 0.7.3 accepts --max-lora-rank 8, 16, 32, 64, 128, 256, not 512")


def test_lora_on_an_lm_head_above_the_releases_vocabulary_limit_is_an_invalid_spec(harness: Cluster) -> None:
    from vllm_operator.modelfiles import find_in_catalog

    files = find_in_catalog(LLAMA_8B)
    assert files is not None
    config = {**files.config, "vocab_size": 262144}  # a Llama whose LM head (a LoRA target) is above 258,048
    h = harness
    h.add_node("gpu-1", H100)
    h.create("big-vocab", {"model": {"name": "my-org/llama-262k-vocab", "config": config},
                           "image": "vllm/vllm-openai:v0.33.0", "lora": ADAPTERS})
    _assert_invalid_without_deployment(h, "big-vocab", "spec.lora", "LlamaForCausalLM", "262144",
                                       "ValueError: When using LoRA, vocab size must be <= 258048")
    h.patch_spec("big-vocab", {"lora": None})
    assert "--enable-lora" not in container(h.wait_deployment("big-vocab"))["args"]
