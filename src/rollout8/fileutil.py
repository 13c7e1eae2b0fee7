"""The file operations every layer shares: one sha256 of a file, one atomic write, one atomic directory publish.

- `sha256_file(path, progress=None)`: streams the file (installers and model shards are GBs), optionally reporting
  bytes done; `sha256_bytes(data)` (bytes, or text as UTF-8) and `sha256_json(obj)` (canonical JSON, sorted keys)
  are the other two digests: nothing else in the package calls hashlib;
- `atomic_write(path, data, mode=0o644)`: a temporary file beside `path`, then one rename: a reader (or a re-run
  after a crash) sees the old file or the complete new one; the temporary is removed on failure;
- `staged_dir(out)`: build a directory under a temporary name beside `out`, then publish it. The old `out`
  stays in place until the new one is complete: it is renamed aside, the new one renamed in, and only then removed.
  A failure anywhere before the swap leaves the old directory exactly as it was;
- `check_output(path, inputs=..., kind=..., force=...)`: refuse an output path before any work starts (a directory,
  one of the inputs or a path inside an input directory, an unwritable parent, an existing file of another kind).

Temporaries are named `.<target name>.<pid>.<random>` beside their target: one whose process is gone is stale,
and the next write of that target removes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import Rollout8Error

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


def sha256_bytes(data: bytes | str) -> str:
    """Hex sha256 of bytes, or of text encoded as UTF-8."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def sha256_json(obj: Any, *, compact: bool = False, default: Callable[[Any], Any] | None = None) -> str:
    """Hex sha256 of obj's canonical JSON: sorted keys, json's default separators (`, ` and `: `), or none with
    compact; `default` as json.dumps takes it. Digests already stored (plan identities, caches, the lock digest)
    depend on these exact bytes: a new caller picks its form once and keeps it."""
    separators = (",", ":") if compact else None
    return sha256_bytes(json.dumps(obj, sort_keys=True, separators=separators, default=default))


def atomic_write(path: str | Path, data: str | bytes | Callable[[Path], object], mode: int = 0o644) -> Path:
    """Write `data` to `path` through a temporary sibling and one rename; returns `path`.

    `data` is text, bytes, or a callable that writes the temporary file itself (e.g. torch.save, pyarrow).
    The parent directory is created. On any failure the temporary file is removed and `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path)
    fd, tmp_name = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent)
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


def atomic_symlink(link: Path, target: str) -> Path:
    """Point `link` at `target` through a temporary sibling and one rename (never absent, never half-made)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f"{_tmp_prefix(link)}link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)
    return link


def _publish(tmp: Path, out: Path) -> None:
    """Swap `tmp` in as `out`, keeping the old `out` until the new one is in place."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=_tmp_prefix(out), suffix=".old", dir=out.parent))
    os.rmdir(old)
    os.replace(out, old)  # the old directory, intact, under a temporary name
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)  # put the old one back: never neither
        raise
    shutil.rmtree(old, ignore_errors=True)


def _stage(out: Path) -> Path:
    """A new empty temporary directory beside OUT (its parent created), after removing a killed run's."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    return Path(tempfile.mkdtemp(prefix=_tmp_prefix(out), suffix=".partial", dir=out.parent))


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """Yield an empty temporary directory beside OUT; on normal exit it replaces OUT (world-readable)."""
    tmp = _stage(out)
    try:
        yield tmp
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        _publish(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def staged_files(out: Path, last: str = "report.html") -> Iterator[Path]:
    """Yield a temporary directory beside OUT; on normal exit its files are moved into OUT (created if needed),
    `last` last; files of OUT that the stage does not hold stay. On failure OUT is untouched."""
    out = Path(out)
    tmp = _stage(out)
    try:
        yield tmp
        out.mkdir(exist_ok=True)
        names = sorted(p.name for p in tmp.iterdir())
        for name in sorted(names, key=lambda n: n == last):
            (tmp / name).chmod(0o644)
            os.replace(tmp / name, out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class OutputError(Rollout8Error):
    """An output path that would fail late or overwrite an input: refused before any work starts."""


def _tmp_prefix(target: Path) -> str:
    return f".{target.name}.{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(target: Path) -> list[Path]:
    """Remove the temporaries a killed run left beside target (their process is gone); returns what was removed."""
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.(\d+)\.")
    removed = []
    try:
        siblings = list(target.parent.iterdir())
    except OSError:
        return removed
    for item in siblings:
        match = pattern.match(item.name)
        if match and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))):
            if item.is_dir() and not item.is_symlink():
                shutil.rmtree(item, ignore_errors=True)
            else:
                item.unlink(missing_ok=True)
            removed.append(item)
    return removed


def check_output(path: str | Path, *, inputs: dict[str, str | Path] | None = None,
                 kind: tuple[str, Callable[[Path], bool]] | None = None, force: bool = False,
                 directory: bool = False, flag: str = "-o", nested_ok: bool = False) -> Path:
    """Refuse, before any work, an output that would fail late or destroy an input; returns it absolute.

    inputs: what the command reads, by the name to show ({"-m": model_dir, ...}); the output may be none of them
    and lie in none of the input directories. kind: (what the output is, a test that an existing file is one): an
    existing file that fails it is refused unless force. The parent is created if missing, then must be writable.
    nested_ok: the output may lie inside an input directory (a report written into the logs it reads)."""
    out = Path(path).expanduser().absolute()
    shown = f"{flag} {path}"
    for label, value in (inputs or {}).items():
        if value is None:
            continue
        source = Path(value).expanduser().absolute()
        if _same(out, source):
            raise OutputError(f"{shown}: is the input {label} ({value}): writing it would destroy the input; "
                              "name another output")
        if source.is_dir() and not nested_ok and _inside(out, source):
            raise OutputError(f"{shown}: lies inside the input directory {label} ({value}): writing there changes "
                              "an input; name a path outside it")
    if out.is_dir() and not directory:
        raise OutputError(f"{shown}: is a directory; name a file (for example {out / 'out'}{_suffix(kind)})")
    if out.exists() and not out.is_dir() and directory:
        raise OutputError(f"{shown}: exists and is a file, not a directory; name another path")
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{shown}: cannot create its directory {parent} ({exc.strerror or exc}); "
                          "name a path under a writable directory") from exc
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{shown}: its directory {parent} is not writable; name a path under a writable one")
    if kind and out.is_file() and not force:
        name, test = kind
        if not _safe_test(test, out):
            raise OutputError(f"{shown}: exists and is not {name}; it would be replaced: name another path, or "
                              "pass --force to replace it")
    return out


def _same(a: Path, b: Path) -> bool:
    try:
        return a == b or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _inside(path: Path, directory: Path) -> bool:
    real = Path(os.path.realpath(path))
    return real != Path(os.path.realpath(directory)) and Path(os.path.realpath(directory)) in real.parents


def _suffix(kind) -> str:
    return {"a FlashRL profile": ".pt", "a FlashRL config": ".yaml", "a JSON report": ".json"}.get(
        kind[0] if kind else "", "")


def _safe_test(test: Callable[[Path], bool], path: Path) -> bool:
    try:
        return bool(test(path))
    except Exception:  # a file the test cannot even read is not of the kind
        return False
