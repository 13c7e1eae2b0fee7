#!/usr/bin/env bash
# install-torch.sh: the stack's dependencies (layer `stack` of the hashed lock, --require-hashes --no-deps), then torch
# and torch_npu at the lock's pins (--no-deps). On x86_64, torch and torchvision come from the CPU torch index
# (TORCH_INDEX_URL; PyPI's x86_64 builds are CUDA builds), torchvision at the version the aarch64 layer file holds
# (the PyPI-only x86_64 file leaves it out). Sourced environment: build-env.sh (ROLLOUT8_ARCH from TARGETARCH).
set -euo pipefail
: "${TORCH_VERSION:?build arg missing: build with make image}" "${TORCH_NPU_VERSION:?build arg missing}"
: "${ROLLOUT8_ARCH:?ROLLOUT8_ARCH unset: TARGETARCH is empty (build with BuildKit or podman: make image)}"
req=/opt/rollout8/requirements
python3 -m pip install --require-hashes --no-deps -r "$req/stack-$ROLLOUT8_ARCH.txt"
pins=("torch==$TORCH_VERSION" "torch-npu==$TORCH_NPU_VERSION")
index=()
if [ "$ROLLOUT8_ARCH" = x86_64 ]; then
  index=(--extra-index-url "${TORCH_INDEX_URL:?TORCH_INDEX_URL is empty}")
  vision=$(grep -oE '^torchvision==[^ ;\\]+' "$req/stack-aarch64.txt") \
    || { echo "install-torch: no torchvision in $req/stack-aarch64.txt" >&2; exit 1; }
  pins+=("$vision")
fi
python3 -m pip install --no-deps "${index[@]}" "${pins[@]}"
bash /usr/local/lib/rollout8/pin-guard.sh "torch==$TORCH_VERSION" "torch-npu==$TORCH_NPU_VERSION"
