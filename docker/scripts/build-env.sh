# Sourced (never executed) by every RUN step of docker/Dockerfile that reaches the network.
# - CA bundle: the BuildKit secret `ca_bundle` (never written to a layer) becomes pip's/git's/requests' CA file.
# - Index build args that were left empty are unset, so pip keeps its defaults instead of an empty URL.
# - ROLLOUT8_ARCH: the target's architecture as the lock names it (aarch64 / x86_64), from the TARGETARCH build arg
#   the builder sets (BuildKit, podman); never from `uname -m`, which is the build machine's under emulation.
if [ -s /run/secrets/ca_bundle ]; then
  export PIP_CERT=/run/secrets/ca_bundle GIT_SSL_CAINFO=/run/secrets/ca_bundle
  export REQUESTS_CA_BUNDLE=/run/secrets/ca_bundle SSL_CERT_FILE=/run/secrets/ca_bundle
fi
for _var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST TORCH_INDEX_URL; do
  if [ -z "${!_var:-}" ]; then unset "$_var"; else export "${_var?}"; fi
done
unset _var
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if [ -n "${TARGETARCH:-}" ]; then
  case "$TARGETARCH" in
    arm64) export ROLLOUT8_ARCH=aarch64 ;;
    amd64) export ROLLOUT8_ARCH=x86_64 ;;
    *) echo "build-env: TARGETARCH=$TARGETARCH: the lock has aarch64 (arm64) and x86_64 (amd64) only" >&2; return 1 ;;
  esac
fi
