#!/usr/bin/env bash
# `make accept-npu`: the NPU acceptance suite (tests/npu) on this node, one PASS/FAIL line per step.
# Refuses up front, with the reason and a non-zero exit (3), on a machine without an Ascend NPU.
#   ACCEPT_PYTHON  the interpreter with torch_npu, vllm, vllm-ascend, flash_rl and rollout8
#                  (default: .venv/bin/python in a checkout, else python3 as in the image)
#   ROLLOUT8_ACCEPT_*  models and work directory, see tests/npu/conftest.py
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${ACCEPT_PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then ACCEPT_PYTHON=.venv/bin/python; else ACCEPT_PYTHON=python3; fi
fi
# The work directory first: the suite runs as the training container's user, and a directory that user cannot
# write (the image's /opt/rollout8 is root's) would fail every step after the NPU gate. (No HOME and no
# ROLLOUT8_ACCEPT_WORK: the suite's own default, from the user's passwd entry, is judged by it.)
work=${ROLLOUT8_ACCEPT_WORK:-${HOME:+$HOME/.cache/rollout8/accept}}
if [ -n "$work" ] && { ! mkdir -p "$work" 2>/dev/null || ! [ -w "$work" ] || ! [ -x "$work" ]; }; then
  echo "accept-npu: the work directory $work cannot be written by uid $(id -u) (gid $(id -g)), the user the suite" \
    "runs as: set ROLLOUT8_ACCEPT_WORK (Ansible: rollout8_accept_work) to a directory that user owns, for example" \
    "under its home (${HOME:-unset})" >&2
  exit 2
fi
"$ACCEPT_PYTHON" -m rollout8.node.accept_npu || exit $?
# What the suite imports (its helpers, tests/npu, and the engine harness, virtual/engine): pytest's `pythonpath` in a
# checkout, this in the image, whose /opt/rollout8 has no pyproject.toml.
export PYTHONPATH="$PWD/tests/npu:$PWD/virtual/engine${PYTHONPATH:+:$PYTHONPATH}"
exec "$ACCEPT_PYTHON" -m pytest tests/npu -m npu -v -rA -p no:cacheprovider "$@"
