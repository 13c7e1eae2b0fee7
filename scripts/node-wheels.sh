#!/usr/bin/env bash
# The nodes' Python libraries (versions.lock.yaml's node_python: requests and what it imports) as pure-Python wheels
# on the controller, for preflight to install on a node whose Python has no `requests` (the community.docker modules
# need it). Wheels for any Python 3.7+ and any machine (py3-none-any), so one set serves openEuler's 3.9 on aarch64
# and Kylin's 3.7 alike. A re-run with the same pins downloads nothing.
#   OUT (default .cache/node-wheels)   PY (default .venv/bin/python)
# Prints the directory on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-.cache/node-wheels}
req=$(mktemp)
trap 'rm -f "$req"' EXIT
PYTHONPATH=src "$PY" -m rollout8 lock --node-python >"$req"
if [ -f "$OUT/.complete" ] && cmp -s "$req" "$OUT/requirements.txt"; then
  echo ">> node wheels $OUT already complete" >&2
else
  echo ">> node wheels $OUT: $(paste -sd' ' "$req")" >&2
  rm -rf "$OUT"; mkdir -p "$OUT"
  # the oldest node Python (3.7) and no machine: only py3-none-any wheels qualify
  "$PY" -m pip download -q --progress-bar off --no-deps --only-binary=:all: --python-version 3.7 \
    --implementation py --abi none --platform any -d "$OUT" -r "$req" 2>&1 \
    | { grep -v "^WARNING: Location '.*' is ignored" >&2 || true; }
  n=$(find "$OUT" -maxdepth 1 -name '*.whl' | wc -l)
  if [ "$n" -ne "$(wc -l <"$req")" ]; then
    echo "rollout8: node wheels: $n wheels for $(wc -l <"$req") pins in $OUT: pip's output is above" >&2
    exit 1
  fi
  cp "$req" "$OUT/requirements.txt"
  touch "$OUT/.complete"
fi
echo "$OUT"
