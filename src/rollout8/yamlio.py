"""The one strict reader of the YAML (and JSON) files the product reads: run specs, the version lock, FlashRL configs.

Plain `yaml.safe_load` keeps the last of a key given twice, silently, and takes `1:`, `on:` or `? [a]` for keys of
other types; a file in another encoding fails with a traceback. Here each of those is refused in one line that
names the file and the line:

    versions.lock.yaml:12: key 'torch' is given twice (first at line 8): keep one
    spec.yaml:3: key 1 is not a string (int): quote it ('1')
    spec.yaml: not UTF-8 text (byte 7); save it as UTF-8
    spec.yaml:4: not valid YAML: expected ',' or ']', but got '<stream end>' (column 1)

- `load_yaml(text, source=..., error=...)`: parse text; `source` is what the messages name (a path);
- `read_text(path, what=..., error=..., max_bytes=None)`: a text file the product reads (bounded, UTF-8): a byte
  that is not UTF-8 is refused naming the file, never as a bare UnicodeDecodeError. OSError (missing, unreadable) is
  left to the caller, which knows what the file is for;
- `read_yaml(path, what=..., error=..., max_bytes=None)`: `read_text`, then `load_yaml`;
- `load_json(data, source=..., error=...)`: JSON that refuses a key given twice in one object.

`error` is the caller's exception type (SpecError, LockError, ...): one line, a non-zero exit at the CLI edge.
Merge keys (`<<: *anchor`) keep YAML's meaning: an explicit key overrides a merged one.

Bounded: the document is composed first and judged before anything is built from it. A value that contains
itself (`&a [*a]`), nesting deeper than MAX_DEPTH, or aliases that expand to more than MAX_ITEMS values (a few
lines of nested `*alias` lists reach billions) are refused naming the line, in time linear in the file. A path that
is not a regular file (a named pipe would block the read forever, a device never end) is refused before it is
opened.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from .errors import Rollout8Error, SpecError
from .fileutil import mode_kind

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(Exception):
    """A key refused while constructing (line is 1-based)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping and a key that is not a string."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[str, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        line = key_node.start_mark.line + 1
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            fix = f"quote it ('{key_node.value}')" if isinstance(key_node, yaml.ScalarNode) else "keys are names"
            raise _Refused(line, f"key {key!r} is not a string ({type(key).__name__}): {fix}")
        if key in seen:
            raise _Refused(line, f"key {key!r} is given twice (first at line {seen[key]}): keep one")
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

# What a file the product reads may hold once its aliases are expanded, and how deep: a run spec, the lock or a
# FlashRL config holds hundreds of values, a few levels deep.
MAX_ITEMS = 100_000
MAX_DEPTH = 64


def _bound(root: yaml.Node) -> None:
    """_Refused for a value containing itself, nesting deeper than MAX_DEPTH or more than MAX_ITEMS values once
    expanded (aliases included). Each node is measured once (aliases share their node), so the walk is linear in
    the file; its own depth is bounded, since a node deeper than MAX_DEPTH is refused before its children."""
    measured: dict[int, tuple[int, int]] = {}  # node -> (values once expanded, levels below it)
    on_path: set[int] = set()

    def measure(node: yaml.Node, depth: int) -> tuple[int, int]:
        key = id(node)
        line = node.start_mark.line + 1
        if key in on_path:
            raise _Refused(line, "a value that contains itself (an alias inside its own anchor): write it out")
        if key not in measured:
            total, height = 1, 0
            if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
                if depth >= MAX_DEPTH:
                    raise _Refused(line, f"nested more than {MAX_DEPTH} levels deep: not a file this tool reads")
                on_path.add(key)
                children = node.value if isinstance(node, yaml.SequenceNode) else \
                    [part for pair in node.value for part in pair]
                for child in children:
                    size, below = measure(child, depth + 1)
                    total, height = total + size, max(height, below + 1)
                    if total > MAX_ITEMS:
                        raise _Refused(line, f"its aliases (*name) expand to more than {MAX_ITEMS:,} values: not a "
                                             "file this tool reads (a few nested aliases reach billions)")
                on_path.discard(key)
            measured[key] = (total, height)
        total, height = measured[key]
        if depth + height > MAX_DEPTH:  # (an alias placed deeper than its anchor)
            raise _Refused(line, f"nested more than {MAX_DEPTH} levels deep once its aliases are expanded: not a "
                                 "file this tool reads")
        return total, height

    measure(root, 0)


def load_yaml(text: str, *, source: str | Path, error: type[Rollout8Error] = SpecError) -> Any:
    """Parse YAML text strictly; `error` in one line naming source and line on any problem."""
    loader = None
    try:
        loader = _StrictLoader(text)  # the reader checks the characters here already
        node = loader.get_single_node()
        if node is None:
            return None
        _bound(node)
        return loader.construct_document(node)
    except RecursionError:  # the composer's own recursion, on nesting far past MAX_DEPTH
        raise error(f"{source}: nested too deep to read: not a file this tool reads") from None
    except _Refused as exc:
        raise error(f"{source}:{exc.line}: {exc.message}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "syntax error"
        where = f":{mark.line + 1}" if mark is not None else ""
        column = f" (column {mark.column + 1})" if mark is not None else ""
        raise error(f"{source}{where}: not valid YAML: {problem}{column}") from None
    except yaml.reader.ReaderError as exc:  # a control character: a binary file, or text in another encoding
        line = text.count("\n", 0, max(exc.position, 0)) + 1
        raise error(f"{source}:{line}: not YAML text: {exc.reason} (character #x{exc.character:04x})") from None
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") \
            from None
    finally:
        if loader is not None:
            loader.dispose()


def read_text(path: str | Path, *, what: str = "text file", error: type[Rollout8Error] = SpecError,
              max_bytes: int | None = None) -> str:
    """A UTF-8 text file (a leading byte order mark dropped), at most max_bytes; `error` naming the file for another
    encoding or a file far too large. OSError propagates."""
    path = Path(path)
    info = path.stat()
    if kind := mode_kind(info.st_mode):  # a named pipe would block the read forever, a device never end
        raise error(f"{path}: {kind}, not a {what}: name the file itself")
    if max_bytes is not None:
        size = info.st_size
        if size > max_bytes:
            raise error(f"{path}: {size} bytes, far more than a {what} (at most {max_bytes}); wrong file?")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}); save the {what} as UTF-8") from None


def read_yaml(path: str | Path, *, what: str = "YAML file", error: type[Rollout8Error] = SpecError,
              max_bytes: int | None = None) -> Any:
    """Read and parse a YAML file strictly: at most max_bytes, UTF-8, then `load_yaml`. OSError propagates."""
    text = read_text(path, what=what, error=error, max_bytes=max_bytes)
    return load_yaml(text, source=Path(path), error=error)


def load_json(data: str | bytes, *, source: str | Path, error: type[Rollout8Error] = SpecError) -> Any:
    """Parse JSON, refusing a key given twice in one object (json keeps the last, silently). Invalid JSON raises
    json.JSONDecodeError (a ValueError) as json.loads does: callers word that themselves."""

    def unique(pairs: list[tuple[str, Any]]) -> dict:
        out: dict = {}
        for key, value in pairs:
            if key in out:
                raise error(f"{source}: key {key!r} is given twice in one object: keep one")
            out[key] = value
        return out

    return json.loads(data, object_pairs_hook=unique)
