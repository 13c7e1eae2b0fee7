#!/usr/bin/env bash
# Image entrypoint: load the CANN environment (toolkit and nnal/atb, when present) and run the command.
# Also the exec wrapper: the roles run every `docker exec` command through it (rollout8_container_exec_prefix),
# since docker exec never runs an ENTRYPOINT. Without CANN (CPU images) this is a plain exec.
set -e
for env_file in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/nnal/atb/set_env.sh; do
  # shellcheck disable=SC1090
  if [ -f "$env_file" ]; then set +u; . "$env_file"; fi
done
exec "$@"
