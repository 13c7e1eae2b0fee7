#!/usr/bin/env bash
# Build the CPU node wheelhouse (the air-gapped install set) and the rollout8 wheel on this machine.
#   OUT (default .cache/wheelhouse)   PY (default .venv/bin/python)
# Nodes install from it with `pip install --no-index --find-links DIR -r DIR/requirements.txt`, then
# `--no-deps -r DIR/requirements-nodeps.txt`.
# Versions come from versions.lock.yaml (ray, flash-llm-rl) and from the venv's CPU torch;
# the directory is keyed by the content of requirements.txt, so a re-run with the same pins is a no-op.
# Prints the wheelhouse directory on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-.cache/wheelhouse}
# torch: the CPU build the dev/test venv has (scripts/dev-env.sh pins it); the image pins its own torch from the lock.
TORCH_CPU=${TORCH_CPU:-$("$PY" -c "from importlib.metadata import version; print(version('torch').split('+')[0])")}
mkdir -p "$OUT"
req=$(mktemp)
"$PY" - "$TORCH_CPU" >"$req" <<'PYEOF'
import sys
import yaml
lock = yaml.safe_load(open("versions.lock.yaml"))["pypi"]
print(f"torch=={sys.argv[1]}")
print(f"ray[default]=={lock['ray']}")
for name in ("safetensors", "pyyaml", "pydantic", "numpy", "packaging"):
    print(name)
PYEOF
nodeps="flash-llm-rl==$("$PY" -c 'import yaml;print(yaml.safe_load(open("versions.lock.yaml"))["pypi"]["flash-llm-rl"])')"
key=$( (cat "$req"; echo "$nodeps") | sha256sum | cut -c1-12)
dir="$OUT/$key"
if [ ! -f "$dir/.complete" ]; then
  echo ">> wheelhouse $dir: downloading (cp311 manylinux, no index needed afterwards)" >&2
  rm -rf "$dir"; mkdir -p "$dir"
  "$PY" -m pip download -q -d "$dir" -r "$req" >&2
  "$PY" -m pip download -q -d "$dir" --no-deps "$nodeps" >&2
  cp "$req" "$dir/requirements.txt"
  echo "$nodeps" >"$dir/requirements-nodeps.txt"   # install with --no-deps (its wheel declares vllm, torch...)
  touch "$dir/.complete"
else
  echo ">> wheelhouse $dir already complete" >&2
fi
rm -f "$req"
# The bundle itself: always rebuilt (seconds); its name carries the version, its checksum the content.
rm -rf "$OUT/bundle"; mkdir -p "$OUT/bundle"
"$PY" -m pip wheel -q --no-deps -w "$OUT/bundle" . >&2
echo ">> bundle wheel: $(ls "$OUT"/bundle/*.whl)" >&2
echo "$dir"
