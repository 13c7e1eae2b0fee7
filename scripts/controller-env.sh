#!/usr/bin/env bash
# The controller's environment as a jump host has it (README, "On a real cluster"): Python, ansible-core and the
# rollout8 CLI (editable: the checkout's code), no torch. `make demo` drives the simulated cluster from it.
set -euo pipefail
VENV=${VENV:-.cache/controller-venv}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo ">> creating the controller environment $VENV with $($PYTHON --version) (no torch)"
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q -e ".[controller]"
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "$VENV: torch is importable, a jump host's controller has none" >&2
  exit 1
fi
echo ">> $VENV ready"
