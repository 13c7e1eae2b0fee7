"""Publish a directory all at once: build it under a temporary name beside its target, then one rename.

A reader (or a re-run after a crash) sees the old directory or the complete new one, never a half-written one;
on failure the temporary directory is removed and the target is left as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_dir(out: Path, prefix: str) -> Iterator[Path]:
    """Yield an empty temporary directory beside OUT; on normal exit it replaces OUT (world-readable)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
    try:
        yield tmp
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
