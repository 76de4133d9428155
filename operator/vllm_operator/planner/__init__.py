"""The memory planner: pure functions from a model, a GPU and a vLLM release to vLLM flags and a predicted startup.

Imports no Kubernetes client (checked by import-linter, see pyproject.toml).
"""

from ..api.v1alpha1 import PinnedFlags
from .arch import ArchError, ModelArch, arch_from_config
from .failures import FailureKind
from .memory import (
    EngineFlags,
    GPUFacts,
    PredictedFailure,
    StartupPrediction,
    predict_startup,
)
from .plan import (
    Constraints,
    Option,
    Plan,
    PlanRequest,
    Workload,
    flags_to_args,
    plan,
    with_vllm_defaults,
)
from .versions import NEWEST_KNOWN_VERSION, VersionError, profile_for, version_from_image

__all__ = [
    "ArchError", "Constraints", "EngineFlags", "FailureKind", "GPUFacts", "ModelArch",
    "NEWEST_KNOWN_VERSION", "Option", "PinnedFlags", "Plan", "PlanRequest", "PredictedFailure", "StartupPrediction",
    "VersionError", "Workload", "arch_from_config", "flags_to_args", "plan", "predict_startup", "profile_for",
    "version_from_image", "with_vllm_defaults",
]
