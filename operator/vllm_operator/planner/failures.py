"""The failure kinds: what the planner predicts a vLLM start would die of, and what the remediation classifier
reads back from a dead pod. One enum for both layers (the classifier imports it from here); its values are the
strings that reach status (`failureClass`), condition reasons (`PodFailed<Kind>`) and the CLI's JSON."""

from __future__ import annotations

from enum import StrEnum


class FailureKind(StrEnum):
    """Why a vLLM container died (or, predicted by the planner, would die)."""

    KV_CACHE_TOO_SMALL = "KVCacheTooSmall"
    """One request of max_model_len does not fit in the KV cache vLLM could allocate."""
    INSUFFICIENT_FREE_GPU_MEMORY = "InsufficientFreeGPUMemory"
    """Startup check: free GPU memory < total × gpu_memory_utilization (another process holds memory)."""
    NO_KV_CACHE_MEMORY = "NoKVCacheMemory"
    """Weights + activations + overheads leave nothing (≤ 0) for the KV cache."""
    WEIGHTS_DO_NOT_FIT = "WeightsDoNotFit"
    """CUDA OOM while loading the weights."""
    CUDA_OOM_STARTUP = "CUDAOOMStartup"
    """CUDA OOM after the weights loaded: memory profiling, KV-cache allocation, warm-up or CUDA-graph capture."""
    CUDA_OOM_SERVING = "CUDAOOMServing"
    """CUDA OOM after the server came up (the container had been Ready, or the log shows it serving)."""
    HOST_OOM_KILLED = "HostOOMKilled"
    """The kernel OOM killer ended the container (host / cgroup memory, not GPU memory)."""
    INVALID_PARALLELISM = "InvalidParallelism"
    """Tensor/pipeline parallel sizes do not fit the model's shapes or the GPUs present."""
    MAX_MODEL_LEN_TOO_LONG = "MaxModelLenTooLong"
    """--max-model-len exceeds the model's own context length (derived from config.json)."""
    PIPELINE_PARALLEL_UNSUPPORTED = "PipelineParallelUnsupported"
    """The model does not implement pipeline parallelism."""
    IMAGE_PULL = "ImagePull"
    """The container image cannot be pulled."""
    MODEL_NOT_FOUND = "ModelNotFound"
    """The model repository does not exist, is gated/private, or the local path is wrong."""
    INVALID_ARGUMENT = "InvalidArgument"
    """vLLM rejected a flag or its value (argparse, config validation)."""
    NETWORK = "Network"
    """NCCL, Gloo, ZMQ or a rendezvous failure on the network between ranks (issue 13): never a memory flag."""
    UNKNOWN = "Unknown"
    """None of the above; the summary carries the most informative error line."""
