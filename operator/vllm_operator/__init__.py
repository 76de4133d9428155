"""vllm-operator: plan vLLM's GPU memory and keep vLLM pods out of memory trouble."""

__version__ = "0.1.0"
