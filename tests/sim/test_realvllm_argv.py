"""realvllm.real_argv: the rendered `vllm serve` command line becomes the real process's argv, changed only where
realvllm.MAPPED says (the real tier, tests/real, runs it against vLLM itself)."""

from __future__ import annotations

import pytest

from vllm_operator_sim.realvllm import MAPPED, SERVE_SHIM, real_argv, tiny_llama_config

RENDERED = ["vllm", "serve", "acme/tiny", "--host", "0.0.0.0", "--port", "8000", "--served-model-name", "acme/tiny",
            "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.92", "--max-model-len", "4096"]


def test_only_the_mapped_parts_of_the_rendered_command_line_change() -> None:
    argv = real_argv(RENDERED, model_dir="/m/tiny", port=41234, python="/venv/bin/python")
    assert argv == ["/venv/bin/python", "-c", SERVE_SHIM, "serve", "/m/tiny", "--host", "127.0.0.1", "--port",
                    "41234", "--served-model-name", "acme/tiny", "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.92", "--max-model-len", "4096",
                    "--load-format", "dummy", "--skip-tokenizer-init"]


def test_multi_node_ranks_meet_on_loopback() -> None:
    rendered = ["vllm", "serve", "m", "--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "1",
                "--master-addr", "group-0.group.default", "--master-port", "29501", "--headless"]
    argv = real_argv(rendered, model_dir="/d", port=5, python="py")
    assert argv[argv.index("--master-addr") + 1] == "127.0.0.1"
    assert argv[argv.index("--node-rank") + 1] == "1" and "--headless" in argv
    assert argv[argv.index("--master-port") + 1] == "29501"  # kept unless the runner maps it
    mapped = real_argv(rendered, model_dir="/d", port=5, python="py", master_port=40123)
    assert mapped[mapped.index("--master-port") + 1] == "40123"
    assert [a for a in mapped if a != "40123"] == [a for a in argv if a != "29501"]  # nothing else changed


def test_the_served_name_stays_the_rendered_model_and_host_and_port_are_added_when_absent() -> None:
    argv = real_argv(["vllm", "serve", "org/model", "--max-num-seqs", "8"], model_dir="/d", port=5, python="py")
    assert argv[argv.index("--served-model-name") + 1] == "org/model"
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "5"
    assert argv[argv.index("--max-num-seqs") + 1] == "8"


@pytest.mark.parametrize("command", [
    ["python3", "-c", "print(1)"],
    ["vllm", "serve", "--model", "x"],
    ["vllm", "serve", "x", "--load-format", "safetensors"],
])
def test_a_command_line_that_is_not_a_plain_vllm_serve_is_refused(command: list[str]) -> None:
    with pytest.raises(ValueError):
        real_argv(command, model_dir="/d", port=1)


def test_every_rewrite_is_listed_with_a_reason_and_the_tiny_model_has_cpu_kernels() -> None:
    assert all(rendered and len(why) > 20 for rendered, why in MAPPED)
    config = tiny_llama_config()
    assert config["hidden_size"] // config["num_attention_heads"] == 64  # the CPU kernels refuse head_dim 16
