# A CPU stand-in for the `stack` stage of docker/Dockerfile, for tests/docker/test_image_build.py only.
# The real stack (CANN, torch_npu, vLLM-Ascend) cannot be built on a CI machine; what the `patched` and `bundle`
# stages need from it can: python3, git, and the real verl and flash-llm-rl packages in site-packages.
# - flash-llm-rl at the lock's pin, from PyPI, --no-deps (as in the stack), plus torch (CPU) and transformers,
#   which `flashrl cleanup` imports;
# - verl 0.6.1 from PyPI, --no-deps: its verl/__init__.py is byte-identical to the pinned commit's
#   (patches/verl/0001-import-flash-rl.patch says how that was checked);
# - FlashRL's auto patch written by FlashRL's own setup_flashrl_env() (what `flashrl setup` and source builds do),
#   so the bundle's `flashrl cleanup` step has something to undo. (flash-llm-rl 1.0.3 ends that function with
#   `return subparser`, an undefined name, after writing the file: hence the NameError tolerated below.)
ARG BASE
FROM ${BASE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG FLASH_LLM_RL_VERSION
ARG TRANSFORMERS_VERSION
ARG PIP_INDEX_URL
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*
COPY wheels /tmp/wheels
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca_bundle,required=false \
    export PIP_CERT=/run/secrets/ca_bundle PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    && python3 -m pip install /tmp/wheels/torch-*.whl "transformers==${TRANSFORMERS_VERSION}" pyyaml pydantic packaging \
    && python3 -m pip install --no-deps "flash-llm-rl==${FLASH_LLM_RL_VERSION}" "verl==0.6.1" \
    && rm -rf /tmp/wheels \
    && python3 -c 'from flash_rl.commands import setup_flashrl_env as s; exec("try: s()\nexcept NameError: pass")' \
    && grep -q "^try: import flash_rl" "$(python3 -c 'import site; print(site.getsitepackages()[0])')/usercustomize.py"
