"""The file operations every layer shares: one sha256 of a file, one atomic write, one atomic directory publish.

- `sha256_file(path, progress=None)`: streams the file (installers and model shards are GBs), optionally reporting
  bytes done; `sha256_bytes(data)` (bytes, or text as UTF-8) and `sha256_json(obj)` (canonical JSON, sorted keys)
  are the other two digests: nothing else in the package calls hashlib;
- `atomic_write(path, data, mode=0o644)`: a temporary file beside `path`, then one rename: a reader (or a re-run
  after a crash) sees the old file or the complete new one; the temporary is removed on failure;
- `staged_dir(out)`: build a directory under a temporary name beside `out`, then publish it. The old `out`
  stays in place until the new one is complete: it is renamed aside, the new one renamed in, and only then removed.
  A failure anywhere before the swap leaves the old directory exactly as it was;
- `check_output(path, inputs=..., kind=..., force=...)`: applies the one rule of every command that writes
  (rollout8.overlap: no output equal to or inside an input, by path and by inode), then refuses what would fail
  late (a directory for a file, an unwritable directory, an existing file of another kind);
- `write_failure(exc, target)`: the one way a failed write becomes a message: `cannot write PATH: no space left on
  device; ...` (read-only file system, permission denied, quota, ...), naming the output, never an input, never "a
  bug"; atomic_write, staged_dir and staged_files raise it, and `writing(output)`, around a command's work, also
  removes what a failed run created for its output.

Temporaries are named `.<target name>.<pid>.<random>` beside their target: one whose process is gone is stale,
and the next write of that target removes it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import CheckFailed, Rollout8Error, WriteError
from .overlap import OutputError, _real, refuse_output_inside_inputs

CHUNK = 4 * 1024 * 1024


def mode_kind(mode: int) -> str | None:
    """What a file of this st_mode is when it is not a regular file ("a directory", "a named pipe", "a socket",
    "a device"), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return ("a directory" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file")


def special_kind(path: str | Path) -> str | None:
    """What an existing path is when it is neither a regular file nor a directory (mode_kind), found without
    opening it (a named pipe would block a read forever, a device never end); None for a regular file, a directory
    or a path that does not exist."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISDIR(mode) else mode_kind(mode)


def sha256_file(path: str | Path, progress: Callable[[int, int], None] | None = None) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks; `progress(done_bytes, total_bytes)` after each block. A path
    that is not a regular file is refused (OSError naming it) before it is opened."""
    if kind := special_kind(path):
        raise OSError(errno.EINVAL, f"{kind}, not a regular file: name the file itself", str(path))
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
    The parent directory is created. On any failure the temporary file is removed and `path` is untouched; a failed
    write (no space, read-only, ...) is raised as the WriteError naming `path`.
    """
    path = Path(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path)
        fd, tmp_name = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent)
        tmp = Path(tmp_name)
        if callable(data):
            os.close(fd)
            data(tmp)
        else:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        failure = write_failure(exc, path, *([tmp] if tmp else []))  # while the temporary still holds its space
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if failure is not None:
            raise failure from exc
        raise
    return path


def atomic_symlink(link: Path, target: str) -> Path:
    """Point `link` at `target` through a temporary sibling and one rename (never absent, never half-made)."""
    tmp = link.with_name(f"{_tmp_prefix(link)}link")
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)
    except Exception as exc:
        failure = write_failure(exc, link, tmp)
        tmp.unlink(missing_ok=True)
        if failure is not None:
            raise failure from exc
        raise
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
    """Yield an empty temporary directory beside OUT; on normal exit it replaces OUT (world-readable). A failed
    write, in the body or while publishing, is raised as the WriteError naming OUT."""
    out = Path(out)
    tmp: Path | None = None
    try:
        tmp = _stage(out)
        yield tmp
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        _publish(tmp, out)
    except BaseException as exc:
        _reraise_as_write_failure(exc, out, tmp)
        raise
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def staged_files(out: Path, last: str = "report.html") -> Iterator[Path]:
    """Yield a temporary directory beside OUT; on normal exit its files are moved into OUT (created if needed),
    `last` last; files of OUT that the stage does not hold stay. On failure OUT is untouched; a failed write is
    raised as the WriteError naming OUT."""
    out = Path(out)
    tmp: Path | None = None
    try:
        tmp = _stage(out)
        yield tmp
        out.mkdir(exist_ok=True)
        names = sorted(p.name for p in tmp.iterdir())
        for name in sorted(names, key=lambda n: n == last):
            (tmp / name).chmod(0o644)
            os.replace(tmp / name, out / name)
    except BaseException as exc:
        _reraise_as_write_failure(exc, out, tmp)
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _reraise_as_write_failure(exc: BaseException, out: Path, tmp: Path | None) -> None:
    """Raise the WriteError naming OUT if exc is a failed write of it (judged before the stage is removed)."""
    failure = write_failure(exc, out, *([tmp] if tmp else []))
    if failure is not None:
        raise failure from exc


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


def check_output(path: str | Path, *, inputs: Mapping[str, str | Path | None] | None = None,
                 kind: tuple[str, Callable[[Path], bool]] | None = None, force: bool = False,
                 directory: bool = False, flag: str = "-o", nested_ok: bool = False, what: str | None = None,
                 replaces: bool = False, files: Iterable[str] = ()) -> Path:
    """Refuse, before any work, an output that would destroy an input or fail late; returns it absolute.

    inputs, what, replaces, files, nested_ok: refuse_output_inside_inputs (the one rule). kind: (what the output
    is, a test that an existing file is one): an existing file that fails it is refused unless force. The parent is
    created if missing, then it (or an existing output directory) must be writable: WriteError naming the cause."""
    out = Path(path).expanduser().absolute()
    shown = f"{flag} {path}"
    refuse_output_inside_inputs(path, inputs or {}, what or (kind[0] if kind else "the output"), flag=flag,
                                replaces=replaces, files=files, nested_ok=nested_ok)
    if out.is_dir() and not directory:
        raise OutputError(f"{shown}: is a directory; name a file (for example {out / 'out'}{_suffix(kind)})")
    if out.exists() and not out.is_dir() and directory:
        raise OutputError(f"{shown}: exists and is a file, not a directory; name another path")
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in _WRITE_CAUSES:
            raise _write_error(out, exc.errno) from exc
        raise OutputError(f"{shown}: cannot create its directory {parent} ({exc.strerror or exc}); "
                          "name a path under a writable directory") from exc
    where = out if directory and out.is_dir() else parent
    if not os.access(where, os.W_OK | os.X_OK):
        raise _write_error(out, errno.EROFS if _read_only(where) else errno.EACCES)
    if kind and out.is_file() and not force:
        name, test = kind
        if not _safe_test(test, out):
            raise OutputError(f"{shown}: exists and is not {name}; it would be replaced: name another path, or "
                              "pass --force to replace it")
    return out


def _suffix(kind) -> str:
    return {"a FlashRL profile": ".pt", "a FlashRL config": ".yaml", "a JSON report": ".json"}.get(
        kind[0] if kind else "", "")


def _safe_test(test: Callable[[Path], bool], path: Path) -> bool:
    try:
        return bool(test(path))
    except Exception:  # a file the test cannot even read is not of the kind
        return False


# ------------------------------------------------------------------ the one way a failed write becomes a message
# errno of a failed write -> (the cause, what to do), as the message says them
_WRITE_CAUSES = {
    errno.ENOSPC: ("no space left on device", "free space there, or name an output on another filesystem"),
    errno.EDQUOT: ("disk quota exceeded", "free space within the quota, or name an output elsewhere"),
    errno.EFBIG: ("file too large for that filesystem", "name an output on another filesystem"),
    errno.EROFS: ("read-only file system", "name an output on a writable filesystem"),
    errno.EACCES: ("permission denied", "make its directory writable for this user, or name another output"),
    errno.EPERM: ("operation not permitted", "make its directory writable for this user, or name another output"),
}
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # only a write fails so
_DENIED = (errno.EROFS, errno.EACCES, errno.EPERM)  # a read can fail so too: confirmed on the output's filesystem
_ERRNO_IN_TEXT = re.compile(r"(?:os error|errno)\s*(\d+)", re.IGNORECASE)  # Rust's io::Error, Arrow's Status
NEARLY_FULL = 1 << 20  # bytes free below which a write that failed without an errno failed for space


def write_failure(exc: BaseException, target: str | Path, *ours: Path) -> WriteError | None:
    """The WriteError naming `target` when exc is a failure to write it, else None (an input's error, a bug, ^C).

    ours: other paths the write made (its temporary). Libraries report a failed write each their own way (an
    OSError; safetensors and pyarrow: the errno in the text; torch: a RuntimeError with no errno at all), so the
    cause is the errno when there is one, confirmed on the output's filesystem when a read could fail the same way,
    and read off that filesystem (full, read-only, not writable) when there is none: call this before the partial
    output is removed, the space it holds is part of the evidence."""
    if not isinstance(exc, Exception) or isinstance(exc, Rollout8Error):
        return None
    target = Path(target)
    chain = _chain(exc)
    oserror = next((e for e in chain if isinstance(e, OSError) and e.errno), None)
    if oserror is not None and isinstance(oserror.filename, (str, bytes, os.PathLike)):
        named = [Path(os.fsdecode(n)) for n in (oserror.filename, oserror.filename2) if n is not None]
        if any(_related(n, mine) for n in named for mine in (target, *ours)):
            return _write_error(target, oserror.errno, oserror.strerror)
        return _write_error(named[0], oserror.errno) if oserror.errno in _FULL else None  # another file (a cache)
    code = oserror.errno if oserror is not None else _errno_in_text(chain)
    seen = _filesystem_cause(target)
    if code in _FULL:
        return _write_error(target, code)
    if code in _DENIED or code is None:
        return _write_error(target, seen) if seen is not None else None
    return _write_error(target, code, oserror.strerror) if oserror is not None else None


def failed_write_cause(exc: BaseException) -> str | None:
    """The cause when exc carries an errno only a write fails with (no space, quota, too large, read-only), else
    None: the CLI edge's last resort for an error no command mapped, so that it never blames an input."""
    code = next((e.errno for e in _chain(exc) if isinstance(e, OSError) and e.errno), None) or _errno_in_text(
        _chain(exc))
    return _WRITE_CAUSES[code][0] if code in (*_FULL, errno.EROFS) else None


def _write_error(path: Path | str, code: int, strerror: str | None = None) -> WriteError:
    cause, hint = _WRITE_CAUSES.get(code) or ((strerror or os.strerror(code)).lower(),
                                              "check that path, or name another output")
    return WriteError(path, cause, hint)


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and what it was raised from or during (a library's error wrapping the OSError), outermost first."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain and len(chain) < 16:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _errno_in_text(chain: list[BaseException]) -> int | None:
    for exc in chain:
        text = str(exc)
        if match := _ERRNO_IN_TEXT.search(text):
            return int(match.group(1))
        for code in _WRITE_CAUSES:
            if os.strerror(code).lower() in text.lower():
                return code
    return None


def _related(path: Path, mine: Path) -> bool:
    """path is mine, inside it, one of its parents (the mkdir of its directory) or one of its temporaries."""
    a, b = _real(path), _real(mine)
    temporary = a.parent == b.parent and a.name.startswith(f".{b.name}.")
    return a == b or b in a.parents or a in b.parents or temporary


def existing_ancestor(path: Path) -> Path:
    """path, or its nearest ancestor that exists (where a write would land, whose filesystem is judged)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(existing_ancestor(path)).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _filesystem_cause(target: Path) -> int | None:
    """Why nothing can be written at target, seen on its filesystem: EROFS, ENOSPC, EACCES, or None."""
    where = existing_ancestor(target)
    if not where.is_dir():
        where = where.parent
    try:
        st = os.statvfs(where)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return errno.EROFS
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    if free < NEARLY_FULL or (st.f_files and not st.f_favail):
        return errno.ENOSPC
    if not os.access(where, os.W_OK | os.X_OK):
        return errno.EACCES
    return None


@contextmanager
def writing(output: str | Path) -> Iterator[Path]:
    """Around a command's work once its output is named (before check_output creates its directory): a failure to
    write becomes the WriteError naming the path and the cause (write_failure), and a failed run leaves nothing it
    created for the output: the output, or the first of its parents that did not exist, is removed. Not after a
    failed check: its report is the output (verify-quant --json)."""
    out = Path(output).expanduser().absolute()
    created = next((p for p in [*reversed(out.parents), out] if not p.exists() and not p.is_symlink()), None)
    try:
        yield out
    except BaseException as exc:
        failure = write_failure(exc, out)
        if created is not None and not (isinstance(exc, CheckFailed) and exc.keeps_output):
            if created.is_dir() and not created.is_symlink():
                shutil.rmtree(created, ignore_errors=True)
            elif created.is_symlink() or created.exists():
                created.unlink(missing_ok=True)
        if failure is not None:
            raise failure from exc
        raise


def json_safe(obj):
    """obj with every NaN or infinite float replaced by None (JSON has neither), through dicts and lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_safe(v) for v in obj]
    return obj
