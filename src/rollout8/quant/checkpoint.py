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
from ..fileutil import special_kind
from ..yamlio import load_json

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors dtype string: BF16, F32, I8, ...
    shape: tuple[int, ...]
    file: Path


# bytes per element of each safetensors dtype, to check a tensor's byte range against its shape
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def read_header(path: Path) -> dict:
    """The JSON header of one .safetensors file (without the __metadata__ entry), checked against the file.

    The header's length field is bounded by the file's size before anything is read (a lying length of 10^12
    must not become a 1 TB read), and every tensor's byte range must lie in the file and match its shape."""
    if kind := special_kind(path):  # found without opening it: a named pipe would block the read forever
        raise ModelError(f"{path}: {kind}, not a safetensors file: copy the checkpoint again")
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ModelError(f"{path}: {size} bytes, too short for a safetensors file: truncated or not one; "
                                 "copy the checkpoint again")
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                raise ModelError(f"{path}: its header claims {length} bytes but the file has {size}: truncated or "
                                 "not a safetensors file; copy the checkpoint again")
            raw = fh.read(length)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    header = _json_object(raw, path, "its header is not a JSON object: not a safetensors file")
    header.pop("__metadata__", None)
    data = size - 8 - length
    for name, meta in header.items():
        try:
            dtype, shape, (begin, end) = meta["dtype"], [int(d) for d in meta["shape"]], meta["data_offsets"]
        except (TypeError, KeyError, ValueError) as exc:
            raise ModelError(f"{path}: tensor {name!r} has a malformed header entry: not a safetensors file") from exc
        if not (0 <= begin <= end <= data):
            raise ModelError(f"{path}: tensor {name!r} lies at bytes {begin}-{end} of a {data}-byte data section: "
                             "the file is truncated; copy the checkpoint again")
        count = 1
        for dim in shape:
            count *= dim
        if dtype in DTYPE_BYTES and count * DTYPE_BYTES[dtype] != end - begin:
            raise ModelError(f"{path}: tensor {name!r} ({dtype} {shape}) needs {count * DTYPE_BYTES[dtype]} bytes "
                             f"but its header gives it {end - begin}: a corrupt header")
    return header


def _json_object(raw: bytes, path: Path, problem: str) -> dict:
    """raw as a JSON object, or ModelError naming path and the problem (problem also for invalid JSON)."""
    try:
        data = load_json(raw.decode("utf-8"), source=path, error=ModelError)  # a key given twice: ModelError
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: {problem} ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelError(f"{path}: {problem}")
    return data


def read_json(path: Path, what: str = "JSON file") -> dict:
    """A JSON object from a model directory's file (config.json, an index, a description), or ModelError."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ModelError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    return _json_object(raw, path, f"not a JSON object; copy the model's {what} again")


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
            try:
                weight_map = load_json(index.read_text(encoding="utf-8"), source=index, error=ModelError)["weight_map"]
                files = sorted(set(weight_map.values()))
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise ModelError(f"{index}: not a safetensors index (JSON with a weight_map): {exc}") from exc
            missing = [f for f in files if not (self.dir / f).is_file()]
            if missing:
                raise ModelError(f"{index}: names shard(s) that are missing: {', '.join(missing[:3])}; copy the "
                                 "whole checkpoint")
            return [self.dir / f for f in files]
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
        return read_json(path, "config.json")

    def int8_weights(self) -> set[str]:
        """Names of the int8 linear weights (`*.weight` stored as I8): empty for an unquantized model."""
        return {n for n, t in self.tensors.items() if t.dtype == "I8" and n.endswith(".weight")}

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


def require_kind(directory: str | Path, int8: bool, flag: str) -> None:
    """Refuse a model directory of the other kind: `int8` wants int8 weights, otherwise none (flag names it)."""
    count = len(Checkpoint(directory).int8_weights())
    if int8 and not count:
        raise ModelError(f"{flag} {directory}: holds no int8 weights: give the W8A8 (int8) model here")
    if not int8 and count:
        raise ModelError(f"{flag} {directory}: a quantized model ({count} int8 weights): give the bf16 model here")
