"""The one rule of every command that writes: no output equal to or inside an input.

`refuse_output_inside_inputs(output, inputs, what)` refuses, before anything is written, an output that is an input
artifact (models, profile, data, the spec, the lock) or lies inside one, or (replaces) holds one: compared by path
(symlinks and `..` resolved) and by device and inode of every existing ancestor, so a bind mount or a hard link
that reaches an input under another path is the input. fileutil.check_output applies it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from .errors import Rollout8Error


class OutputError(Rollout8Error):
    """An output path that would fail late or overwrite an input: refused before any work starts."""


def refuse_output_inside_inputs(output: str | Path, inputs: Mapping[str, str | Path | None], what: str, *,
                                flag: str = "-o", replaces: bool = False, files: Iterable[str] = (),
                                nested_ok: bool = False) -> Path:
    """Refuse, before anything is written, an output that would change an input; returns the output resolved.

    inputs: every input artifact of the command by the name to show ({"model.bf16": path, ...}; None skipped):
    models, profile, data files, the spec, the lock. what: what is written ("the plan", "the profile"). Paths are
    compared resolved (symlinks and `..`) and by device and inode of every existing ancestor, so another spelling
    of an input, the same directory reached through a bind mount, or a hard link of an input file, is the input.
    Refused, in one line naming the output, the input and what to do: the output is an input or lies inside one
    (nested_ok: it may lie inside an input directory, as a report inside the logs it reads); replaces (the output
    directory is replaced whole): an input lies inside it; files (the names written inside the output directory):
    one of them is, or holds, an input.
    """
    out = _real(output)
    shown = f"{flag} {output}"
    out_chain = _identities(out)  # (dev, inode) of the output (when it exists) and of every existing ancestor
    out_id = _identity(out)
    for label, value in inputs.items():
        if value is None:
            continue
        source = _real(value)
        source_id = _identity(source)
        source_chain = _identities(source)  # the input and its existing ancestors
        if out == source or (out_id is not None and out_id == source_id):
            raise OutputError(f"{shown}: is the input {label} ({value}){_alias(out, source)}; writing {what} there "
                              "would destroy it: name another path")
        # (from here on the output is not the input, by name or by inode)
        inside = source in out.parents or (source_id is not None and source_id in out_chain)
        if inside and not (nested_ok and source.is_dir()):
            kind = "directory " if source.is_dir() else ""
            raise OutputError(f"{shown}: lies inside the input {kind}{label} ({value}){_alias(out, source)}; "
                              f"writing {what} there would change an input: name a path outside it")
        if replaces and (out in source.parents or (out_id is not None and out_id in source_chain)):
            raise OutputError(f"{shown}: holds the input {label} ({value}); {what} replaces the whole directory, "
                              "which would delete it: name another path")
        for name in files:
            target = out / name
            target_id = _identity(target)
            if target == source or target in source.parents or (target_id is not None and target_id in source_chain):
                raise OutputError(f"{shown}: {what} writes {name} there, over the input {label} ({value}): "
                                  "name another directory")
    return out


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(Path(path).expanduser()))


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of an existing path: the same file or directory reached by a bind mount or a hard link."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _identities(path: Path) -> set[tuple[int, int]]:
    """(device, inode) of path (when it exists) and of each of its existing ancestors."""
    found = set()
    for each in (path, *path.parents):
        if (ident := _identity(each)) is not None:
            found.add(ident)
    return found


def _alias(out: Path, source: Path) -> str:
    """Said when the output reaches the input by another name (a bind mount or a hard link)."""
    if out == source or source in out.parents:
        return ""
    return " by another name (a bind mount or a hard link reaches it)"
