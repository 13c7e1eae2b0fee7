#!/usr/bin/env bash
# Start a Docker engine if none answers (CI machines and fresh dev machines run none by default).
# Bounded wait: 60 s.
set -euo pipefail
if docker info >/dev/null 2>&1; then exit 0; fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "ensure-docker: no dockerd; install it with: apt-get install -y docker.io" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-docker: the Docker engine is not running and starting it needs root" >&2
  exit 1
fi
echo ">> starting dockerd (log: /var/log/dockerd-rollout8.log)"
nohup dockerd >/var/log/dockerd-rollout8.log 2>&1 &
for _ in $(seq 1 60); do
  docker info >/dev/null 2>&1 && { echo ">> docker is up"; exit 0; }
  sleep 1
done
echo "ensure-docker: dockerd did not answer within 60 s; see /var/log/dockerd-rollout8.log" >&2
exit 1
