#!/usr/bin/env bash
# install-cann.sh DIR: install the CANN toolkit, 910b kernels and nnal from DIR (docker/cann/, bind-mounted),
# each verified against the sha256 of versions.lock.yaml (build args CANN_<KIND>_<ARCH>_FILE / _SHA256).
# An empty sha256 slot is refused unless ALLOW_UNVERIFIED_CANN=1. ASCEND_HOME (default /usr/local/Ascend) is where
# the toolkit's installer puts set_env.sh, which the nnal installer needs.
set -euo pipefail
dir=$1
ascend_home=${ASCEND_HOME:-/usr/local/Ascend}
# The target's architecture is the TARGETARCH build arg (set by the builder), not the build machine's `uname -m`.
case "${TARGETARCH:-}" in
  arm64) arch=AARCH64 ;;
  amd64) arch=X86_64 ;;
  "") echo "install-cann: TARGETARCH is empty: build with BuildKit or podman (make image), which set it" >&2; exit 1 ;;
  *) echo "install-cann: unsupported architecture $TARGETARCH (arm64 or amd64)" >&2; exit 1 ;;
esac
work=$(mktemp -d)
for kind in TOOLKIT KERNELS NNAL; do
  file_var=CANN_${kind}_${arch}_FILE sha_var=CANN_${kind}_${arch}_SHA256
  file=${!file_var:-} want=${!sha_var:-}
  [ -n "$file" ] || { echo "install-cann: build arg $file_var is empty: build with 'make image' (args from the lock)" >&2; exit 1; }
  if [ ! -f "$dir/$file" ]; then
    echo "install-cann: $file not found in docker/cann/ (see docker/cann/README.md), or build on a ready CANN image" \
         "with BASE_IMAGE=<image>" >&2
    exit 1
  fi
  got=$(sha256sum "$dir/$file" | cut -d' ' -f1)
  if [ -z "$want" ]; then
    if [ "${ALLOW_UNVERIFIED_CANN:-0}" != 1 ]; then
      echo "install-cann: no sha256 for $file in versions.lock.yaml (cann.installers); it is $got." \
           "Check it against the vendor's published value and put it in the lock, or build with ALLOW_UNVERIFIED_CANN=1" >&2
      exit 1
    fi
    echo "install-cann: WARNING: $file NOT verified (ALLOW_UNVERIFIED_CANN=1); sha256 $got" >&2
  elif [ "$got" != "$want" ]; then
    echo "install-cann: $file has sha256 $got, the lock says $want: wrong or corrupt download" >&2
    exit 1
  fi
  cp "$dir/$file" "$work/$file"
  if [ "$kind" = NNAL ]; then
    # nnal's installer needs the toolkit's environment.
    # shellcheck disable=SC1091
    set +u; . "$ascend_home/ascend-toolkit/set_env.sh"; set -u
  fi
  echo "install-cann: installing $file"
  bash "$work/$file" --quiet --install --install-for-all
  rm -f "$work/$file"
done
rm -rf "$work"
