"""rollout8.fileutil: the one sha256 of a file, atomic write and directory publish every layer uses."""

from __future__ import annotations

import hashlib
import os

import pytest

from rollout8 import fileutil
from rollout8.fileutil import atomic_write, sha256_file, staged_dir


def _tree(path):
    return {p.relative_to(path).as_posix(): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


def _old_dir(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "a.txt").write_text("old a")
    (out / "sub").mkdir()
    (out / "sub" / "b.txt").write_text("old b")
    return out


def test_staged_dir_replaces_the_directory_in_one_step(tmp_path):
    out = _old_dir(tmp_path)
    with staged_dir(out) as tmp:
        (tmp / "new.txt").write_text("new")
    assert _tree(out) == {"new.txt": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"], "no temporary or old directory left behind"


def test_staged_dir_keeps_the_old_directory_when_building_fails(tmp_path):
    out = _old_dir(tmp_path)
    with pytest.raises(RuntimeError), staged_dir(out) as tmp:
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("disk full")
    assert _tree(out) == {"a.txt": "old a", "sub/b.txt": "old b"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_staged_dir_keeps_the_old_directory_when_publishing_fails_half_way(tmp_path, monkeypatch):
    """The rename of the new directory into place fails (after the old one was moved aside): the old one is back."""
    out = _old_dir(tmp_path)
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(src).endswith(".partial") and os.fspath(dst) == os.fspath(out):
            raise OSError("simulated failure while publishing")
        return real_replace(src, dst)

    monkeypatch.setattr(fileutil.os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated"), staged_dir(out) as tmp:
        (tmp / "new.txt").write_text("new")
    assert _tree(out) == {"a.txt": "old a", "sub/b.txt": "old b"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "profile.pt"
    target.write_bytes(b"old")

    def broken(path):
        path.write_bytes(b"partial")
        raise ValueError("serializer failed")

    with pytest.raises(ValueError):
        atomic_write(target, broken)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["profile.pt"]
    atomic_write(target, "new text", mode=0o600)
    assert target.read_text() == "new text" and (target.stat().st_mode & 0o777) == 0o600


def test_sha256_file_streams_and_reports_progress(tmp_path):
    data = os.urandom(fileutil.CHUNK * 2 + 123)
    path = tmp_path / "blob"
    path.write_bytes(data)
    seen = []
    digest = sha256_file(path, progress=lambda done, total: seen.append((done, total)))
    assert digest == hashlib.sha256(data).hexdigest()
    assert seen == [(fileutil.CHUNK, len(data)), (2 * fileutil.CHUNK, len(data)), (len(data), len(data))]
