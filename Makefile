# Every target works on a fresh machine: it makes .venv and installs what it needs.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# the vLLM release `make test-vllm` checks the rendered args against: planner.versions.NEWEST_KNOWN_VERSION
VLLM_CONTRACT_VERSION ?= 0.33.0

.PHONY: demo test test-unit test-vllm lint typecheck contracts crds docs bench clean

# The first run installs the project and its dev tools into .venv (about 2 minutes); pip says what it fetches.
$(STAMP): pyproject.toml
	@echo ">>> Installing vllm-operator with its [dev,sim] extras into $(VENV) (pytest, ruff, mypy, the simulated"
	@echo ">>> cluster's kmock/aiohttp/jsonschema/cel-python, ...): about 2 minutes the first time, then never again"
	@echo ">>> until pyproject.toml changes."
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --progress-bar on --upgrade pip
	$(BIN)/pip install --progress-bar on -e '.[dev,sim]'
	touch $(STAMP)
	@echo ">>> Installed into $(VENV)."

demo: $(STAMP)
	$(BIN)/vllm-operator demo

# The full run (CI's, and what a pull request must pass): lint, contracts, then every test directory.
test: $(STAMP) lint contracts
	$(BIN)/pytest -q

# The edit loop: lint, contracts and the unit tests (pure core, CLI, chart rendering; no operator process).
test-unit: $(STAMP) lint contracts
	$(BIN)/pytest -q tests/unit

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

# docs/install.md is generated from README.md's "Install on a cluster" section; the console samples in README.md and
# docs/ are re-run and rewritten (scripts/doc_samples.py; tests/e2e/test_doc_samples.py fails when one is stale).
docs: $(STAMP)
	$(BIN)/python scripts/doc_samples.py
	$(BIN)/python scripts/install_doc.py

bench: $(STAMP)
	$(BIN)/python benchmarks/planner_accuracy.py
	$(BIN)/python benchmarks/planner_speed.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
