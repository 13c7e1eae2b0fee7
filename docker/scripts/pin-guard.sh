#!/usr/bin/env bash
# pin-guard.sh NAME==VERSION...: fail if an installed distribution is not at the pinned version.
# Run after every install step of docker/Dockerfile, so a step that moves torch or torch_npu fails right there.
set -euo pipefail
bad=0
for spec in "$@"; do
  name=${spec%%==*} want=${spec#*==}
  got=$(python3 -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: print("(not installed)")' "$name")
  # An index may serve a local build of the pinned version (2.7.1+cpu for 2.7.1): that is the pin.
  if [ "${got%%+*}" != "$want" ]; then
    echo "pin-guard: $name is $got, the lock pins $want" >&2; bad=1
  fi
done
exit $bad
