#!/usr/bin/env bash
# Create the CPU development/test environment (the same one CI uses).
# torch is the CPU build: an unpinned torch would pull a multi-GB CUDA build from PyPI.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_CPU_VERSION=${TORCH_CPU_VERSION:-2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  echo ">> creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip "$@"; }
echo ">> installing torch==$TORCH_CPU_VERSION (CPU build) and the test dependencies"
# PyPI's Linux x86_64 torch wheel is a CUDA build (GBs): point TORCH_INDEX_URL at a CPU wheel index
# (e.g. PyTorch's /whl/cpu or your mirror of it) to get the small one. Machines of the CI kind have it on disk.
pip install -q "torch==$TORCH_CPU_VERSION" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
pip install -q -e ".[test,lint]"
# flash-llm-rl declares torch, transformers, vllm, huggingface_hub unpinned: never let it resolve them.
pip install -q --no-deps "flash-llm-rl==$("$VENV/bin/python" -c 'import yaml;print(yaml.safe_load(open("versions.lock.yaml"))["pypi"]["flash-llm-rl"])')"
echo ">> $VENV ready"
