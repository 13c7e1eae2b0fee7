#!/usr/bin/env bash
# Fill versions.lock.yaml's base_image.digest (`make base-digest`, on a connected machine): pull the lock's base image
# by name and write the registry's digest for it into the lock. From then on the build names the base as name@digest,
# and the builder refuses any image whose content does not match that digest (a moved tag, another mirror's copy).
#   scripts/base-digest.sh [ENGINE] [LOCK]
set -euo pipefail
engine=${1:-docker}
lock=${2:-versions.lock.yaml}
cli=(env PYTHONPATH=src "${PYTHON:-python3}" -m rollout8 lock --lock "$lock")
name=$("${cli[@]}" --json | "${PYTHON:-python3}" -c 'import json, sys; print(json.load(sys.stdin)["lock"]["base_image"]["name"])')
echo ">> $engine pull $name" >&2
"$engine" pull "$name" >&2
repo=${name%:*}
# RepoDigests holds REPO@sha256:... for each registry name the image was pulled as; podman prefixes docker.io/.
digest=$("$engine" image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$name" \
  | grep -E "(^|/)${repo##*/}@sha256:[0-9a-f]{64}$" | head -n1 | sed 's/.*@//')
[ -n "$digest" ] || { echo "base-digest: $engine reports no registry digest for $name" >&2; exit 1; }
"${cli[@]}" --set-base-digest "$digest"
