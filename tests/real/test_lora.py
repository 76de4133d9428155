"""Scenario 4: a LoRA adapter declared in spec.lora is loaded by the real process: a generated PEFT adapter (rank 8,
for the tiny model's attention projections), `/v1/models` lists it beside the base model, and a completion that
names it is answered by it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
import torch
from realkit import TINY, RealCluster, tiny_spec, until
from safetensors.torch import save_file

from kit.specs import vllmservice
from vllm_operator_sim.realvllm import tiny_llama_config

pytestmark = pytest.mark.timeout(900)
RANK = 8
ADAPTER = "sql"


def write_peft_adapter(directory: Path, rank: int = RANK) -> Path:
    """A PEFT LoRA adapter for the tiny Llama (what `peft.LoraModel.save_pretrained` writes): adapter_config.json and
    adapter_model.safetensors with lora_A (rank × in) and lora_B (out × rank) for q/k/v/o of every layer."""
    config = tiny_llama_config()
    hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = hidden // heads
    shapes = {"q_proj": (hidden, hidden), "k_proj": (hidden, kv_heads * head_dim),
              "v_proj": (hidden, kv_heads * head_dim), "o_proj": (hidden, hidden)}
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (fan_in, fan_out) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) * 0.01
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()},
              str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": TINY, "r": rank,
        "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": sorted(shapes), "modules_to_save": None, "use_rslora": False, "use_dora": False}))
    return directory


def test_a_lora_adapter_in_the_spec_is_loaded_listed_and_served_by_the_real_process(
        real: RealCluster, tmp_path: Path) -> None:
    adapter = write_peft_adapter(tmp_path / "sql-adapter")
    spec = tiny_spec(lora={"maxLoras": 1, "maxRank": RANK, "adapters": [{"name": ADAPTER, "source": str(adapter)}]})
    real.cluster.apply(vllmservice(spec, name="lora"))
    try:
        real.wait_ready("lora")
        [pod] = real.ready_pods("lora")
        args = pod["spec"]["containers"][0]["args"]
        assert "--enable-lora" in args and f"{ADAPTER}={adapter}" in args, args
        proxy = real.proxy("lora")
        try:
            until(proxy.endpoints, 30, "the Service has an endpoint")
            models = requests.get(f"{proxy.url}/v1/models", timeout=30).json()["data"]
            listed = {m["id"]: m for m in models}
            assert set(listed) == {TINY, ADAPTER}, models
            assert listed[ADAPTER].get("parent") == TINY and listed[ADAPTER].get("root") == str(adapter), models
            answer = requests.post(f"{proxy.url}/v1/completions", timeout=120, json={
                "model": ADAPTER, "prompt": [1, 5, 7, 9], "max_tokens": 4, "temperature": 0}).json()
            assert answer["model"] == ADAPTER and answer["usage"]["completion_tokens"] == 4, answer
            unknown = requests.post(f"{proxy.url}/v1/completions", timeout=60, json={
                "model": "no-such-adapter", "prompt": [1, 5], "max_tokens": 1})
            assert unknown.status_code == 404, unknown.text  # vLLM checks the name: the adapter's was recognised
        finally:
            proxy.close()
        log = real.pod_log(pod["metadata"]["name"])
        assert ADAPTER in log, log[-2000:]
    finally:
        real.delete("lora")
