# Every target works on a fresh machine: it makes .venv and installs what it needs.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# the vLLM release `make test-vllm` checks the rendered args against: planner.versions.NEWEST_KNOWN_VERSION
VLLM_CONTRACT_VERSION ?= 0.33.0

.PHONY: demo test test-vllm lint typecheck contracts crds docs bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,sim]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/vllm-operator demo

test: $(STAMP) lint contracts
	$(BIN)/pytest -q

# The contract with vLLM itself: rendered args through `vllm serve`'s own parser (CPU build of vLLM, ~4 min, ~6 GB;
# not part of `make test`).
test-vllm:
	$(PY) -m venv .venv-vllm
	.venv-vllm/bin/pip install -q vllm==$(VLLM_CONTRACT_VERSION) pytest
	.venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	.venv-vllm/bin/pip install -q -e .
	VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python -m pytest -q -p no:cacheprovider -o addopts="" tests/contract

# .pre-commit-config.yaml runs the same commands.
lint: $(STAMP)
	$(BIN)/ruff check operator tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/python scripts/install_doc.py --check
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml

contracts: $(STAMP)
	$(BIN)/lint-imports

crds: $(STAMP)
	$(BIN)/python -m vllm_operator.api.crd --write crds/
	cp crds/vllmservices.vllm-operator.dev.yaml charts/vllm-operator/crds/

# docs/install.md is generated from README.md's "Install on a cluster" section.
docs:
	$(PY) scripts/install_doc.py

bench: $(STAMP)
	$(BIN)/python benchmarks/planner_accuracy.py
	$(BIN)/python benchmarks/planner_speed.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
