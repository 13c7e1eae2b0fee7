#!/usr/bin/env bash
# System packages the test suite needs on a fresh Debian machine (run as root, by .ci/run).
# Idempotent: a second run installs nothing new.
set -euo pipefail
need=()
# podman: builds docker/Dockerfile's bundle stages (BuildKit features) where docker.io has no buildx plugin.
# openssh-client: Ansible reaches the simulated nodes over ssh, as it reaches real ones.
# docker-registry, skopeo, openssl: the simulated site's registry on the controller (virtual/sim_registry.py).
for pkg in docker.io debootstrap iproute2 git make rsync openssh-client chromium podman docker-registry skopeo openssl; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo ">> apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
bash scripts/ensure-docker.sh
