"""The file operations every layer shares: one sha256 of a file, one atomic write, one atomic directory publish.

- `sha256_file(path, progress=None)`: streams the file (installers and model shards are GBs), optionally reporting
  bytes done;
- `atomic_write(path, data, mode=0o644)`: a temporary file beside `path`, then one rename: a reader (or a re-run
  after a crash) sees the old file or the complete new one; the temporary is removed on failure;
- `staged_dir(out, prefix)`: build a directory under a temporary name beside `out`, then publish it. The old `out`
  stays in place until the new one is complete: it is renamed aside, the new one renamed in, and only then removed.
  A failure anywhere before the swap leaves the old directory exactly as it was.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

CHUNK = 4 * 1024 * 1024


def sha256_file(path: str | Path, progress: Callable[[int, int], None] | None = None) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks; `progress(done_bytes, total_bytes)` after each block."""
    digest = hashlib.sha256()
    total = os.stat(path).st_size if progress else 0
    done = 0
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
            if progress:
                done += len(block)
                progress(done, total)
    return digest.hexdigest()


def atomic_write(path: str | Path, data: str | bytes | Callable[[Path], object], mode: int = 0o644) -> Path:
    """Write `data` to `path` through a temporary sibling and one rename; returns `path`.

    `data` is text, bytes, or a callable that writes the temporary file itself (e.g. torch.save, pyarrow).
    The parent directory is created. On any failure the temporary file is removed and `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        if callable(data):
            os.close(fd)
            data(tmp)
        else:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _publish(tmp: Path, out: Path) -> None:
    """Swap `tmp` in as `out`, keeping the old `out` until the new one is in place."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rmdir(old)
    os.replace(out, old)  # the old directory, intact, under a temporary name
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)  # put the old one back: never neither
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_dir(out: Path, prefix: str) -> Iterator[Path]:
    """Yield an empty temporary directory beside OUT; on normal exit it replaces OUT (world-readable)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
    try:
        yield tmp
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        _publish(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
