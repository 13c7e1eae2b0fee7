# rollout8 front door. `make help` lists every target; each `##` comment is its one-line help.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ROLLOUT8 := $(VENV)/bin/rollout8
LOCK := versions.lock.yaml
PYTEST_ARGS ?=

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_.-]+:.*## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# ---------------------------------------------------------------- environment
$(VENV)/.installed: pyproject.toml scripts/dev-env.sh
	VENV=$(VENV) PYTHON=$(PYTHON) bash scripts/dev-env.sh
	@touch $@

.PHONY: venv
venv: $(VENV)/.installed ## create the CPU development/test environment in .venv

# ---------------------------------------------------------------- quality
.PHONY: lint
lint: venv ## ruff, yamllint, hadolint (and ansible-lint once ansible/ has content)
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/yamllint -s .
	$(VENV)/bin/hadolint --config docker/.hadolint.yaml docker/Dockerfile*

.PHONY: test
test: venv ## run the whole test suite on this machine (CPU; starts Docker if needed)
	bash scripts/run-tests.sh $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: venv ## fast tests only (no Docker, no cluster, no engine)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

.PHONY: patches-check
patches-check: venv ## patches apply once to the pinned upstream files (PyPI wheels) and the patched FlashRL works on CPU
	$(PY) -m pytest tests/unit/test_patches.py tests/unit/test_flashrl_patched.py tests/unit/test_activate.py $(PYTEST_ARGS)

.PHONY: accept-npu
accept-npu: ## on the first real Ascend node, before training: NPU env, int8 load, reload, logs, speed (PASS/FAIL)
	bash scripts/accept-npu.sh $(PYTEST_ARGS)

BENCH_ARGS ?=
.PHONY: bench
bench: venv ## side-by-side benchmarks (ratios; JSON in bench/results/); BENCH_ARGS="--only quantizer"
	$(PY) bench/run.py $(BENCH_ARGS)
