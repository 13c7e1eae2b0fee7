"""Read safetensors checkpoints tensor by tensor, without loading a whole model.

Only headers are parsed up front (names, dtypes, shapes); a tensor's bytes are read when asked for.
This is what lets `profile`, `verify-quant`, `convert` and `check` work on 32B models with a few GB of RAM.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors dtype string: BF16, F32, I8, ...
    shape: tuple[int, ...]
    file: Path


def read_header(path: Path) -> dict:
    """The JSON header of one .safetensors file (without the __metadata__ entry)."""
    try:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
    except (OSError, struct.error, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: not a readable safetensors file ({exc})") from exc
    header.pop("__metadata__", None)
    return header


class Checkpoint:
    """A model directory: config.json plus one or more safetensors shards."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        if not self.dir.is_dir():
            raise ModelError(f"{self.dir}: model directory does not exist")
        self.tensors: dict[str, TensorInfo] = {}
        for shard in self._shards():
            for name, meta in read_header(shard).items():
                self.tensors[name] = TensorInfo(name, meta["dtype"], tuple(meta["shape"]), shard)
        if not self.tensors:
            raise ModelError(f"{self.dir}: no tensors found in its safetensors files")

    def _shards(self) -> list[Path]:
        index = self.dir / INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            return [self.dir / f for f in sorted(set(weight_map.values()))]
        single = self.dir / SINGLE_FILE
        if single.is_file():
            return [single]
        shards = sorted(self.dir.glob("*.safetensors"))
        if not shards:
            raise ModelError(f"{self.dir}: no *.safetensors files (only safetensors checkpoints are supported)")
        return shards

    @property
    def config(self) -> dict:
        path = self.dir / "config.json"
        if not path.is_file():
            raise ModelError(f"{self.dir}: config.json is missing")
        return json.loads(path.read_text())

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def names(self) -> list[str]:
        return list(self.tensors)

    def get(self, name: str):
        """Load one tensor (torch) from its shard; only that tensor's bytes are read."""
        from safetensors import safe_open

        info = self.tensors.get(name)
        if info is None:
            raise ModelError(f"{self.dir}: tensor {name!r} not found")
        with safe_open(str(info.file), framework="pt") as fh:
            return fh.get_tensor(name)

    def iter_tensors(self, names: list[str] | None = None) -> Iterator[tuple[str, object]]:
        """Yield (name, tensor) shard by shard, opening each shard once."""
        from safetensors import safe_open

        wanted = set(self.tensors if names is None else names)
        by_file: dict[Path, list[str]] = {}
        for name in self.tensors:
            if name in wanted:
                by_file.setdefault(self.tensors[name].file, []).append(name)
        for shard, shard_names in by_file.items():
            with safe_open(str(shard), framework="pt") as fh:
                for name in shard_names:
                    yield name, fh.get_tensor(name)
