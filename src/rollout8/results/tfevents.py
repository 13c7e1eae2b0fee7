"""Scalars from TensorBoard event files, without tensorflow, tensorboard or protobuf installed.

An event file is a sequence of TFRecords (u64 length, u32 crc, payload, u32 crc), each payload an `Event`
protobuf. We decode only what verl's `_TensorboardAdapter` writes through `SummaryWriter.add_scalar`:
Event.step (field 2) and Event.summary (field 5) -> Summary.value (field 1) -> Value.tag (1) with either
simple_value (2, float32) or a scalar tensor (8: TensorProto float_val 5, double_val 6, tensor_content 4).
CRCs are not verified; a record cut short by an interrupted writer ends the read and is reported.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

_DT_FLOAT, _DT_DOUBLE = 1, 2


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("varint runs past the end of the message")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) for each field of a protobuf message (value: int or bytes)."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _tensor_scalar(buf: bytes) -> float | None:
    dtype = None
    content = b""
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 0:
            dtype = value
        elif number == 5:  # float_val: packed (wire 2) or single (wire 5)
            return struct.unpack_from("<f", value)[0]
        elif number == 6:  # double_val
            return struct.unpack_from("<d", value)[0]
        elif number == 4 and wire == 2:
            content = value
    if content and dtype == _DT_FLOAT and len(content) >= 4:
        return struct.unpack_from("<f", content)[0]
    if content and dtype == _DT_DOUBLE and len(content) >= 8:
        return struct.unpack_from("<d", content)[0]
    return None


def _summary_values(buf: bytes) -> Iterator[tuple[str, float]]:
    for number, wire, value in _fields(buf):
        if number != 1 or wire != 2:
            continue
        tag, scalar = None, None
        for vnum, vwire, vval in _fields(value):
            if vnum == 1 and vwire == 2:
                tag = vval.decode("utf-8", "replace")
            elif vnum == 2 and vwire == 5:
                scalar = struct.unpack("<f", vval)[0]
            elif vnum == 8 and vwire == 2:
                scalar = _tensor_scalar(vval)
        if tag is not None and scalar is not None:
            yield tag, scalar


def read_scalars(path: Path) -> tuple[list[tuple[int, str, float]], str | None]:
    """All (step, tag, value) scalars of one event file, in file order, and a note if the file ends mid-record."""
    out: list[tuple[int, str, float]] = []
    note = None
    with open(path, "rb") as fh:
        while True:
            header = fh.read(12)
            if not header:
                break
            if len(header) < 12:
                note = "ends inside a record header (writer interrupted); the part before it is used"
                break
            (length,) = struct.unpack("<Q", header[:8])
            payload = fh.read(length)
            trailer = fh.read(4)
            if len(payload) < length or len(trailer) < 4:
                note = "ends inside a record (writer interrupted); the part before it is used"
                break
            step = 0
            summary = None
            try:
                for number, wire, value in _fields(payload):
                    if number == 2 and wire == 0:
                        step = value if value < 1 << 63 else value - (1 << 64)
                    elif number == 5 and wire == 2:
                        summary = value
                if summary is not None:
                    out.extend((step, tag, val) for tag, val in _summary_values(summary))
            except (ValueError, struct.error) as exc:
                note = f"a corrupt record was skipped ({exc})"
    return out, note
