"""The labels and annotations the operator puts on its children: part of the API (users select by them, the
rollout status reads them), so they live at the bottom layer; `render` writes them, `api.rollout` reads them."""

from __future__ import annotations

MANAGED_BY = "vllm-operator"
LABEL_SERVICE = "vllm-operator.dev/service"
ANNOTATION_SPEC_HASH = "vllm-operator.dev/spec-hash"
ANNOTATION_PLAN = "vllm-operator.dev/plan"
#: On vLLM pods: the vLLM release the plan was made for (the image tag's, or spec.vllmVersion for a digest/mirror tag).
ANNOTATION_VLLM_VERSION = "vllm-operator.dev/vllm-version"
