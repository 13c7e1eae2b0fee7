"""The hashed Python lock: every package the image installs that is not a mission pin, per architecture.

versions.lock.yaml pins the mission's components (torch, torch_npu, ray, flash-llm-rl, pytest, the git sources).
Everything else they need is resolved once, on a connected machine, by `make python-lock` (uv pip compile
--generate-hashes, Python 3.10, aarch64 and x86_64), into docker/requirements/<layer>-<arch>.txt, which the image
installs with `pip install --require-hashes --no-deps`. Nothing is resolved at build time.

One file per layer, so that a change reaches only the build steps after the one that reads it (cache follows
change): a layer is resolved under its parent layers' versions (which its file leaves out: they are installed
already) and under the pins it or its parents name. Bumping ray rewrites `verl` and the layers below it, never
`stack`. Each file's header records the sha256 of its inputs, so `rollout8 lock --check` tells a stale file from
a current one without a resolver or a network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import LockError
from .fileutil import sha256_json
from .lock import ARCHES, INSTALLER_KINDS, Lock, normalize
from .yamlio import read_text

PLATFORMS = {"aarch64": "aarch64-manylinux_2_35", "x86_64": "x86_64-manylinux_2_35"}  # Ubuntu 22.04: glibc 2.35


@dataclass(frozen=True)
class Layer:
    name: str
    parent: str | None
    stage: str  # the Dockerfile stage that installs it (documentation and the cache test)


# Runtime chain: cann -> stack -> verl -> bundle. `build` (stack-build stage) and `bundle-build` (the rollout8
# wheel's build) hang off it and are never installed in a runtime stage.
LAYERS = (
    Layer("cann", None, "cann-base"),
    Layer("stack", "cann", "stack"),
    Layer("build", "stack", "stack-build"),
    Layer("verl", "stack", "stack"),
    Layer("bundle-build", "verl", "bundle-build"),
    Layer("bundle", "verl", "bundle"),
)
BY_NAME = {layer.name: layer for layer in LAYERS}
# Taken from the lock's torch index on x86_64 (PyPI's x86_64 builds are CUDA builds and pull CUDA wheels), so
# not in the PyPI-only x86_64 files: the x86_64 torch step installs these by the version the aarch64 file holds.
TORCH_INDEX_ONLY = ("torchvision",)
CUDA_ONLY = re.compile(r"^(nvidia-.*|triton|cuda-.*)$")
HEADER_INPUTS = "# inputs sha256: "
REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def _text(path: Path) -> str:
    """A file of the hashed Python lock: UTF-8, or a LockError naming it (never a bare UnicodeDecodeError)."""
    return read_text(path, what="Python lock file", error=LockError)


def requirements_dir(lock_file: Path) -> Path:
    return lock_file.resolve().parent / "docker" / "requirements"


def pinned_names(lock: Lock) -> set[str]:
    """Every distribution name that is a mission pin (installed by exact version or built from a git commit)."""
    return {normalize(n) for n in [*lock.pypi, *lock.git, "torch-npu", "megatron-core", "vllm-ascend"]}


def chain(name: str) -> list[Layer]:
    """The layer and its ancestors, root first."""
    out: list[Layer] = []
    layer: Layer | None = BY_NAME[name]
    while layer is not None:
        out.insert(0, layer)
        layer = BY_NAME[layer.parent] if layer.parent else None
    return out


def layer_input(lock: Lock, folder: Path, name: str) -> str:
    """The layer's requirement lines: its .in file, plus (layer verl) the lock's unpinned_deps."""
    text = _text(folder / f"{name}.in")
    if name == "verl":
        text += "".join(f"{req}\n" for owner in sorted(lock.unpinned_deps) for req in lock.unpinned_deps[owner])
    return text


def requirement_names(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        match = REQ_NAME.match(line)
        if match:
            names.add(normalize(match.group(1)))
    return names


def pins_for(lock: Lock, folder: Path, name: str) -> dict[str, str]:
    """The mission pins a layer resolves under: those it or an ancestor names (name -> version)."""
    named = set().union(*(requirement_names(layer_input(lock, folder, x.name)) for x in chain(name)))
    return {normalize(n): v for n, v in sorted(lock.pypi.items()) if normalize(n) in named}


def resolve_as(folder: Path) -> str:
    return _text(folder / "resolve-as.txt")


def inputs_digest(lock: Lock, folder: Path, name: str, arch: str) -> str:
    """sha256 of everything a layer's file is computed from: its input, its pins, its parent's inputs."""
    layer = BY_NAME[name]
    parent = inputs_digest(lock, folder, layer.parent, arch) if layer.parent else ""
    data = {"layer": name, "arch": arch, "python": lock.python, "platform": PLATFORMS[arch], "parent": parent,
            "input": layer_input(lock, folder, name), "pins": pins_for(lock, folder, name),
            "resolve_as": resolve_as(folder), "torch_index_only": TORCH_INDEX_ONLY}
    return sha256_json(data)


def layer_file(folder: Path, name: str, arch: str) -> Path:
    return folder / f"{name}-{arch}.txt"


@dataclass(frozen=True)
class Entry:
    name: str  # normalized
    version: str
    hashes: tuple[str, ...]
    line: int = field(default=0, compare=False)  # where its name==version line is in the file (1-based)


def parse_layer(path: Path) -> list[Entry]:
    """name==version entries of a layer file with their --hash values (continuation lines joined), each with the
    number of the line its name==version is on."""
    out, logical, start = [], "", 0
    for number, raw in enumerate([*_text(path).splitlines(), ""], 1):
        if not logical:
            start = number
        if raw.endswith("\\"):
            logical += raw[:-1] + " "
            continue
        line, logical = logical + raw, ""
        if line.lstrip().startswith("#") or not line.strip():
            continue
        match = LINE.match(line.strip())
        if not match:
            raise LockError(f"{path}: not a name==version line: {line.strip()[:80]!r}")
        hashes = tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
        out.append(Entry(normalize(match.group(1)), match.group(2), hashes, start))
    return out


def content_digest(path: Path) -> str:
    """sha256 of a layer file's entries (names, versions, hashes; comments and layout do not count)."""
    return sha256_json([[e.name, e.version, sorted(e.hashes)] for e in parse_layer(path)], compact=True)


def content_digests(folder: Path) -> dict[str, str]:
    """The lock's python_lock record of every layer file in folder (make python-lock writes it)."""
    return {f"{layer.name}-{arch}": content_digest(layer_file(folder, layer.name, arch))
            for layer in LAYERS for arch in ARCHES if layer_file(folder, layer.name, arch).is_file()}


def recorded_digest(path: Path) -> str | None:
    for line in _text(path).splitlines():
        if line.startswith(HEADER_INPUTS):
            return line[len(HEADER_INPUTS):].strip()
    return None


def status(lock: Lock, lock_file: Path) -> tuple[list[str], list[str]]:
    """(problems, notes) of the hashed Python lock next to lock_file. Problems: a layer file absent, stale (its
    inputs changed since it was generated), not what versions.lock.yaml records of it (python_lock: a hash edited
    by hand), an entry without a hash, or a mission pin inside it."""
    folder = requirements_dir(lock_file)
    if not folder.is_dir():
        return [], [f"python lock: {folder} not here (an installed bundle): checked in the checkout"]
    problems, notes = [], []
    pinned = pinned_names(lock)
    for layer in LAYERS:
        for arch in ARCHES:
            path = layer_file(folder, layer.name, arch)
            if not path.is_file():
                problems.append(f"python lock: {path.name} missing: run `make python-lock` on a connected machine")
                continue
            if recorded_digest(path) != inputs_digest(lock, folder, layer.name, arch):
                problems.append(f"python lock: {path.name} is stale (its inputs changed): run `make python-lock`")
            key = f"{layer.name}-{arch}"
            if key not in lock.python_lock:
                problems.append(f"python lock: {path.name} is not recorded in versions.lock.yaml (python_lock.{key}): "
                                "the image tag would not cover its bytes; run `make python-lock`")
            elif lock.python_lock[key] != content_digest(path):
                problems.append(f"python lock: {path.name} holds other names, versions or hashes than "
                                f"versions.lock.yaml records (python_lock.{key}): edited by hand? run "
                                "`make python-lock` to regenerate it (never edit a hash: the image would keep its tag "
                                "for other bytes)")
            for entry in parse_layer(path):
                if not entry.hashes:
                    problems.append(f"python lock: {path.name}: {entry.name}=={entry.version} has no hash")
                if entry.name in pinned:
                    problems.append(f"python lock: {path.name}: {entry.name} is a mission pin (versions.lock.yaml)")
    return problems, notes


def unpinned_report(lock: Lock, lock_file: Path) -> tuple[list[str], list[str]]:
    """(problems, still unpinned) for `rollout8 lock --check`. Problems fail the check (the hashed Python lock absent,
    stale or holding an unhashed entry); the rest is what still floats by the user's choice or lack of a file: an
    empty base image digest, empty CANN sha256 slots, the mission pins that go in by exact version without a hash."""
    problems, notes = status(lock, lock_file)
    floating = list(notes)
    if not lock.base_image.digest:
        floating.append(f"base_image.digest: empty, {lock.base_image.name} is taken as the registry serves it "
                        "(make base-digest)")
    empty = [f"{k}.{a}" for k in INSTALLER_KINDS for a in ARCHES if not lock.cann.installers[k][a].sha256]
    if empty:
        floating.append(f"cann.installers sha256 empty: {', '.join(empty)} (the build refuses them unless "
                        "ALLOW_UNVERIFIED_CANN=1)")
    floating.append("mission pins by exact version, no hash: " + ", ".join(f"{n}=={v}" for n, v in lock.pypi.items())
                    + "; x86_64 torch and torchvision from indexes.torch_x86_64")
    return problems, floating
