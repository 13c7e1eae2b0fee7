#!/usr/bin/env bash
# fetch-source.sh NAME URL COMMIT [full]: put repository URL at COMMIT into /src/NAME and prove it.
# "full" clones the whole history (vLLM: setuptools-scm derives its version from tags); otherwise only the
# pinned commit is fetched, with a full clone as the fallback for servers that refuse fetching by commit id.
set -euo pipefail
name=$1 url=$2 commit=$3 mode=${4:-shallow}
if ! [[ $commit =~ ^[0-9a-f]{40}$ ]]; then
  echo "fetch-source: $name: '$commit' is not a full 40-hex commit id (fix versions.lock.yaml, git.$name.commit)" >&2
  exit 1
fi
dest=${SRC_ROOT:-/src}/$name
rm -rf "$dest"
if [ "$mode" = full ]; then
  git clone --quiet "$url" "$dest"
  git -C "$dest" checkout --quiet --detach "$commit"
else
  git init --quiet "$dest"
  git -C "$dest" remote add origin "$url"
  if ! git -C "$dest" fetch --quiet --depth 1 origin "$commit"; then
    echo "fetch-source: $name: server refused a fetch by commit id, cloning in full" >&2
    rm -rf "$dest"; git clone --quiet "$url" "$dest"
  fi
  git -C "$dest" checkout --quiet --detach "${commit}"
fi
head=$(git -C "$dest" rev-parse HEAD)
if [ "$head" != "$commit" ]; then
  echo "fetch-source: $name: HEAD is $head, the lock pins $commit" >&2
  exit 1
fi
echo "fetch-source: $name at $head (verified)"
