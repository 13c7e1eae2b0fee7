#!/usr/bin/python
"""What a node holds of the plan's files, without re-reading them; and the one digest of what just arrived.

The node keeps a ledger (JSON, `ledger`): for every file that arrived, its size, its mtime in nanoseconds and the
sha256 computed once at arrival. Two modes:

`copies` is the plan's arrival list (arrival.json): copies, each with its `files` (path, size, sha256).

- `check`: for each file, a stat and a ledger lookup. The file is current when it exists with the expected size,
  the mtime the ledger recorded, and the ledger's digest is the expected one. No file is read. Returns `send` (the
  copies with at least one stale file), `stale` (those files' paths) and `current` (a count).
  With copies to send, it also makes their destination directories (rsync makes only the last one).
- `seal`: after a transfer, records in the ledger (one atomic rename) the files of `copies` that check found
  `stale` (every file without it) and any other file rsync wrote. A file rsync sent
  (`rsync_output`: its itemized output, whose `<f... name` lines list what it wrote, names relative to
  `rsync_root`, the deploy root) was
  verified by rsync's end-to-end whole-file checksum as it was written; when its size and mtime are also those of
  the controller's file when the plan step took its sha256 (`mtime_ns` in arrival.json; rsync -t keeps
  nanoseconds), that sha256 is recorded without reading the file again. Every other file (already there, so
  rsync skipped it, or with another mtime) is read once, in parallel (hashlib releases the GIL), and compared
  with the controller's sha256. A file whose digest differs is removed, so the next run sends it again, and the
  task fails naming it.

With `plan` and `plan_b64` (its content, base64), the plan file goes last: `check` reports whether the node's
differs (`plan_stale`; a small file, read), `seal` writes it (atomically) only once every file of `copies` proved
current, so its presence on a node means that everything it lists arrived.

A file changed on the node in place keeping both size and mtime is not detected by `check` (the price of not
re-reading); the probe job re-hashes every file anyway, and `rehash: true` seals every file again.
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


def _rsync_sent(root: str, output: str) -> set[str]:
    """The node paths rsync wrote, from its itemized output (`<f` lines: a file sent, whole or by delta)."""
    return {f"{root.rstrip('/')}/{line.split(' ', 1)[1]}" for line in output.splitlines()
            if line.startswith("<f") and " " in line}


def _as_sent(entry: dict) -> bool:
    """The node's file has the size and mtime the controller's had when the plan step took its sha256."""
    try:
        stat = os.stat(entry["path"])
    except OSError:
        return False
    return ("mtime_ns" in entry and stat.st_size == int(entry["size"])
            and stat.st_mtime_ns == int(entry["mtime_ns"]))


def _digest(path: str) -> tuple[str, int, int]:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        stat = os.fstat(handle.fileno())
        for block in iter(lambda: handle.read(CHUNK), b""):
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
            "stale": {"type": "list", "elements": "str"},
            "rsync_root": {"type": "str", "default": ""},
            "rsync_output": {"type": "str", "default": ""},
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
        stale_set = set(stale)
        send = [copy for copy in copies if any(entry["path"] in stale_set for entry in copy["files"])]
        dirs = sorted({copy["dest"] if copy["kind"] == "dir" else os.path.dirname(copy["dest"]) for copy in send}
                      | ({os.path.dirname(ledger)} if send else set()))
        made = [d for d in dirs if not os.path.isdir(d)]
        if not module.check_mode:
            for directory in made:
                os.makedirs(directory, mode=0o755, exist_ok=True)
        module.exit_json(changed=bool(made), send=send, stale=stale, current=len(files) - len(stale),
                         files=len(files), plan_stale=plan_stale, made=made)

    sent = _rsync_sent(module.params["rsync_root"], module.params["rsync_output"])

    # what to record: the files check found stale (all, without `stale`) and whatever rsync wrote besides (one
    # rsync sends the whole tree: a file of a current copy whose controller mtime moved is written again)
    stale = None if module.params["stale"] is None else set(module.params["stale"])
    files = [entry for entry in files if stale is None or entry["path"] in stale or entry["path"] in sent]
    present = [entry for entry in files if os.path.isfile(entry["path"])]
    missing = [entry["path"] for entry in files if not os.path.isfile(entry["path"])]
    trusted = [entry for entry in present if entry["path"] in sent and _as_sent(entry)]
    trusted_paths = {entry["path"] for entry in trusted}
    read = [entry for entry in present if entry["path"] not in trusted_paths]
    threads = module.params["threads"] or min(len(read), os.cpu_count() or 1) or 1
    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(lambda entry: _digest(entry["path"]), read))
    for entry in trusted:
        recorded[entry["path"]] = {"size": int(entry["size"]), "mtime_ns": int(entry["mtime_ns"]),
                                   "sha256": entry["sha256"]}
    bad = []
    for entry, (sha, size, mtime_ns) in zip(read, results):
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
    module.exit_json(changed=bool(present) or plan_stale, sealed=len(present), verified_by_rsync=len(trusted),
                     read=len(read), bytes_read=sum(r[1] for r in results), plan_written=plan_stale)


if __name__ == "__main__":
    main()
