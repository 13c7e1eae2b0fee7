#!/usr/bin/python
"""What a node holds of the plan's files, without re-reading them; and the one digest of what just arrived.

The node keeps a ledger (JSON, `ledger`): for every file that arrived, its size, its mtime in nanoseconds and the
sha256 computed once at arrival. Two modes:

`copies` is the plan's arrival list (arrival.json): copies, each with its `files` (path, size, sha256).

- `check`: for each file, a stat and a ledger lookup. The file is current when it exists with the expected size,
  the mtime the ledger recorded, and the ledger's digest is the expected one. No file is read. Returns `send` (the
  copies with at least one stale file), `stale` (those files' paths) and `current` (a count).
- `seal`: after a transfer, reads each file of `copies` once (in parallel: hashlib releases the GIL), compares it with
  the expected sha256 and records the current ones in the ledger (one atomic rename). A file whose digest differs
  is removed, so the next run sends it again, and the task fails naming it.

With `plan` and `plan_b64` (its content, base64), the plan file goes last: `check` reports whether the node's
differs (`plan_stale`; a small file, read), `seal` writes it (atomically) only once every file of `copies` proved
current, so its presence on a node means that everything it lists arrived.

A file changed on the node in place keeping both size and mtime is not detected by `check` (the price of not
re-reading); the smoke job re-hashes every file anyway, and `rehash: true` seals every file again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule

CHUNK = 8 << 20


def _load(ledger: str) -> dict:
    try:
        with open(ledger) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _current(entry: dict, recorded: dict) -> bool:
    try:
        stat = os.stat(entry["path"])
    except OSError:
        return False
    seen = recorded.get(entry["path"])
    return (seen is not None and stat.st_size == int(entry["size"]) == seen.get("size")
            and stat.st_mtime_ns == seen.get("mtime_ns") and seen.get("sha256") == entry["sha256"])


def _digest(path: str) -> tuple[str, int, int]:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        stat = os.fstat(handle.fileno())
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest(), stat.st_size, stat.st_mtime_ns


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def _write(path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".arrival-", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "ledger": {"type": "path", "required": True},
            "copies": {"type": "list", "elements": "dict", "required": True},
            "mode": {"type": "str", "choices": ["check", "seal"], "default": "check"},
            "plan": {"type": "path"},
            "plan_b64": {"type": "str"},
            "threads": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    ledger, copies, mode = module.params["ledger"], module.params["copies"], module.params["mode"]
    files = [entry for copy in copies for entry in copy["files"]]
    plan = module.params["plan"]
    plan_content = base64.b64decode(module.params["plan_b64"] or "").decode()
    plan_stale = bool(plan) and _read(plan) != plan_content
    recorded = _load(ledger)
    if mode == "check":
        stale = [entry["path"] for entry in files if not _current(entry, recorded)]
        send = [copy for copy in copies if any(entry["path"] in stale for entry in copy["files"])]
        module.exit_json(changed=False, send=send, stale=stale, current=len(files) - len(stale), files=len(files),
                         plan_stale=plan_stale)

    present = [entry for entry in files if os.path.isfile(entry["path"])]
    missing = [entry["path"] for entry in files if not os.path.isfile(entry["path"])]
    threads = module.params["threads"] or min(len(present), os.cpu_count() or 1) or 1
    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(lambda entry: _digest(entry["path"]), present))
    bad = []
    for entry, (sha, size, mtime_ns) in zip(present, results, strict=True):
        if sha != entry["sha256"] or size != int(entry["size"]):
            bad.append(f"{entry['path']} (sha256 {sha[:12]}, {size} bytes; the controller's is "
                       f"{entry['sha256'][:12]}, {entry['size']} bytes)")
            recorded.pop(entry["path"], None)
            if not module.check_mode:
                os.unlink(entry["path"])
        else:
            recorded[entry["path"]] = {"size": size, "mtime_ns": mtime_ns, "sha256": sha}
    if not module.check_mode and present:
        _write(ledger, json.dumps(recorded, indent=1, sort_keys=True))
    if bad or missing:
        module.fail_json(msg="; ".join(
            ([f"arrived different from the controller's copy, removed (a re-run sends it again): {', '.join(bad)}"]
             if bad else [])
            + ([f"did not arrive: {', '.join(missing)}"] if missing else [])),
            sealed=len(present) - len(bad))
    if plan_stale and not module.check_mode:
        _write(plan, plan_content)
    module.exit_json(changed=bool(present) or plan_stale, sealed=len(present), bytes=sum(r[1] for r in results),
                     plan_written=plan_stale)


if __name__ == "__main__":
    main()
