"""A node of a group that holds several pipeline stages (TP 1 × PP on PCIe GPUs) names the GPU of the stage that ran
out of memory, as vLLM's worker on cuda:<local rank> does, and the operator's attribution finds that stage."""

from __future__ import annotations

from vllm_operator.api.v1alpha1 import parse_spec
from vllm_operator.planner.gpus import load_gpu_catalog
from vllm_operator.remediation import ladder
from vllm_operator.remediation.classifier import classify_text
from vllm_operator.sources import load_model_files
from vllm_operator_sim.startup import HiddenFacts, simulate_startup

MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def test_the_last_stage_of_a_tp1_node_names_its_own_gpu_and_is_attributed_to_it() -> None:
    gpu, files = load_gpu_catalog().get("L40S"), load_model_files(MODEL, offline=True)
    args = ["vllm", "serve", MODEL, "--tensor-parallel-size", "1", "--pipeline-parallel-size", "4", "--max-model-len",
            "8192", "--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "1", "--master-addr",
            "leader", "--master-port", "29501", "--headless"]
    # 6 GiB beside vLLM's budget on the last stage (3): node 1 (stages 2, 3) runs out at graph capture on its GPU 1
    outcome = simulate_startup(args, "vllm/vllm-openai:v0.33.0", gpu, HiddenFacts(last_stage_unprofiled_gib=6.0),
                               files, gpu_count=2)
    assert not outcome.starts
    failure = classify_text(outcome.message, exit_code=1)
    assert failure.device == "cuda:1"
    status = {"multiNode": {"nodes": 2, "gpusPerNode": 2, "tensorParallelSize": 1,
                            "stages": [{"layers": 20}, {"layers": 20}, {"layers": 20}, {"layers": 20}]}}
    current = ladder.current_from(parse_spec({"model": {"name": MODEL}, "gpu": {"maxNodes": 2}}), status,
                                  node_rank=1, device=failure.device)
    assert current.failed_stages == (3,)
