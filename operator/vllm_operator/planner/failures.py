"""The failure classes the planner predicts and the remediation ladder reads back from pods. One enum for both."""

from __future__ import annotations

from enum import StrEnum


class FailureKind(StrEnum):
    KV_CACHE_TOO_SMALL = "KVCacheTooSmall"
    INSUFFICIENT_FREE_GPU_MEMORY = "InsufficientFreeGPUMemory"
    NO_KV_CACHE_MEMORY = "NoKVCacheMemory"
    WEIGHTS_DO_NOT_FIT = "WeightsDoNotFit"
    CUDA_OOM_STARTUP = "CUDAOOMStartup"
    CUDA_OOM_SERVING = "CUDAOOMServing"
    HOST_OOM_KILLED = "HostOOMKilled"
    INVALID_PARALLELISM = "InvalidParallelism"
    MAX_MODEL_LEN_TOO_LONG = "MaxModelLenTooLong"
    PIPELINE_PARALLEL_UNSUPPORTED = "PipelineParallelUnsupported"
    IMAGE_PULL = "ImagePull"
    MODEL_NOT_FOUND = "ModelNotFound"
    INVALID_ARGUMENT = "InvalidArgument"
    NETWORK = "Network"  # NCCL/Gloo/ZMQ/rendezvous between the nodes of a multi-node group (issue 13)
    UNKNOWN = "Unknown"
