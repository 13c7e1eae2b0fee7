"""Verify's incremental collection of the nodes' Ray logs (issue 28, part 4): the node module
(ansible/library/rollout8_log_delta.py, run as Ansible runs it: this venv's python with a file of module arguments)
packs only what each log gained since the controller's copy, and `rollout8 collect-merge` appends it there. Each
round is checked byte for byte against the node's files, and what was packed is what was new."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from rollout8.errors import Rollout8Error
from rollout8.results.collect import merge

MODULE = Path(__file__).resolve().parents[2] / "ansible" / "library" / "rollout8_log_delta.py"


def pack(tmp_path: Path, session: Path, have: dict, since: float) -> dict:
    args = tmp_path / "args.json"
    dest = tmp_path / "delta.tar.gz"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"root": str(session), "since": since, "have": have,
                                                        "dest": str(dest)}}))
    proc = subprocess.run([sys.executable, str(MODULE), str(args)], capture_output=True, text=True, timeout=120)
    out = json.loads(proc.stdout)
    assert proc.returncode == 0, out
    return out


def sizes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def contents(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_each_collection_sends_what_the_logs_gained_and_the_copies_equal_the_nodes(tmp_path):
    session = tmp_path / "session_latest"
    logs = session / "logs"
    logs.mkdir(parents=True)
    old = logs / "worker-earlier-job.err"
    old.write_bytes(b"an earlier job\n" * 100)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    since = time.time() - 60
    worker, raylet = logs / "worker-abc-02000000-7.err", logs / "raylet.out"
    worker.write_bytes(b"step:1 - x\n" * 100_000)
    raylet.write_bytes(b"raylet line\n" * 1000)
    copies = tmp_path / "controller" / "node-a"
    copies.mkdir(parents=True)

    first = pack(tmp_path, session, sizes(copies), since)
    assert first["bytes"] == worker.stat().st_size + raylet.stat().st_size and first["files"] == 2
    assert merge(tmp_path / "delta.tar.gz", copies) == (2, first["bytes"])
    assert contents(copies) == {f"logs/{p.name}": p.read_bytes() for p in (worker, raylet)}  # not the earlier job's

    with open(worker, "ab") as fh:
        fh.write(b"step:2 - y\n" * 10_000)  # 110 000 new bytes
    raylet.write_bytes(b"rotated\n")  # smaller than the copy: sent whole
    second = pack(tmp_path, session, sizes(copies), since)
    assert second["bytes"] == 110_000 + len(b"rotated\n") and second["files"] == 2
    assert second["total"] == worker.stat().st_size + raylet.stat().st_size
    merge(tmp_path / "delta.tar.gz", copies)
    assert contents(copies) == {f"logs/{p.name}": p.read_bytes() for p in (worker, raylet)}

    third = pack(tmp_path, session, sizes(copies), since)
    assert (third["bytes"], third["files"]) == (0, 0)


def test_a_copy_that_is_not_the_prefix_the_node_was_told_of_is_refused(tmp_path):
    session = tmp_path / "session_latest"
    (session / "logs").mkdir(parents=True)
    (session / "logs" / "worker.err").write_bytes(b"0123456789")
    copies = tmp_path / "copies"
    (copies / "logs").mkdir(parents=True)
    (copies / "logs" / "worker.err").write_bytes(b"01234")
    pack(tmp_path, session, {"logs/worker.err": 5}, 0)
    (copies / "logs" / "worker.err").write_bytes(b"012")  # changed on the controller since it said 5
    with pytest.raises(Rollout8Error, match="has 3 bytes, the node sent the part from byte 5"):
        merge(tmp_path / "delta.tar.gz", copies)


def test_a_member_outside_the_directory_is_refused(tmp_path):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in (("../escape", b"x"), (".rollout8-delta.json", b'{"../escape": 0}')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(Rollout8Error, match="is not a log part of this collection"):
        merge(archive, tmp_path / "copies")
    assert not (tmp_path / "escape").exists()


def load_module():
    spec = importlib.util.spec_from_file_location("rollout8_log_delta", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("spool", [1 << 30, 1024], ids=["in-memory", "staged-on-disk"])
def test_a_log_truncated_between_listing_and_packing_leaves_a_whole_archive(tmp_path, monkeypatch, spool):
    """Seen in CI: a worker's log shrank while verify packed it and the pack failed ("unexpected end of data"),
    failing verify. Here the listing still gives the old sizes while the files are already shorter."""
    module = load_module()
    monkeypatch.setattr(module, "SPOOL_IN_MEMORY", spool, raising=False)
    session = tmp_path / "session_latest"
    logs = session / "logs"
    logs.mkdir(parents=True)
    shrunk, short, steady = logs / "worker.err", logs / "rotated.out", logs / "raylet.out"
    for path in (shrunk, short, steady):
        path.write_bytes(b"x" * 10_000)
    listed = module.candidates(str(session), "logs", 0)
    shrunk.write_bytes(b"y" * 3_000)  # shorter than listed, longer than the controller's copy
    short.write_bytes(b"z" * 10)  # shorter than the controller's copy: left for next time
    monkeypatch.setattr(module, "candidates", lambda root, subdir, since: listed)
    copies = tmp_path / "copies"
    (copies / "logs").mkdir(parents=True)
    (copies / "logs" / "worker.err").write_bytes(b"y" * 1_000)
    (copies / "logs" / "rotated.out").write_bytes(b"z" * 100)
    dest = tmp_path / "delta.tar.gz"
    result = module.pack(str(session), "logs", 0, sizes(copies), str(dest))
    assert (result["files"], result["bytes"]) == (2, 2_000 + 10_000)
    merge(dest, copies)
    assert (copies / "logs" / "worker.err").read_bytes() == shrunk.read_bytes()
    assert (copies / "logs" / "raylet.out").read_bytes() == steady.read_bytes()
    assert (copies / "logs" / "rotated.out").read_bytes() == b"z" * 100  # untouched this time
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copies", "delta.tar.gz", "session_latest"]  # no leftovers
    nxt = pack(tmp_path, session, sizes(copies), 0)
    assert (nxt["files"], nxt["bytes"]) == (1, 10)  # the rotated log, whole
