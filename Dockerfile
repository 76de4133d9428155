# syntax=docker/dockerfile:1
# The vllm-operator image: the operator and its runtime dependencies only. No vLLM, no torch, no dev tools:
# the operator plans and deploys vLLM; the vLLM image (spec.image) runs it.
#
#   docker build -t ghcr.io/vllm-operator/vllm-operator:0.1.0 .
#   docker run --rm ghcr.io/vllm-operator/vllm-operator:0.1.0 plan --model Qwen/Qwen2.5-7B-Instruct --gpu L4
#
# tests/chart/test_chart.py checks this file's shape (stages, user, entrypoint, what is installed).
ARG PYTHON_IMAGE=python:3.11-slim

# --- builder: the package as a wheel, plus wheels of its runtime dependencies ---------------------------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m pip install "build>=1.2"
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN python -m build --wheel --outdir /dist . \
 && python -m pip wheel --wheel-dir /wheels /dist/*.whl

# --- runtime -----------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="vllm-operator" \
      org.opencontainers.image.description="Kubernetes operator for vLLM: plans GPU memory flags, deploys, remediates" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/tmp/huggingface
# Only the wheels built above, offline: the package without extras (no [vllm], no [dev], no [sim]: the image runs
# the operator; `vllm-operator demo` needs the simulator's extra and says so in one line here).
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels vllm-operator \
 && groupadd --system --gid 10001 vllm-operator \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin vllm-operator
# A numeric user, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
# kopf's health endpoint (--liveness) and the operator's Prometheus metrics (--metrics-port).
EXPOSE 8080 9090
ENTRYPOINT ["vllm-operator"]
CMD ["run", "--all-namespaces"]
