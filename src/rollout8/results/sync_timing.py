"""The weight syncs' parts, read from the lines every rollout rank writes (rollout8.node.sync_timing, which runs in
the image): `rollout8 progress`/`logs` show the last sync, `rollout8 report` and `make bench` the mean per part.

Lines come from the driver log and from the worker logs collected beside it (Ray folds lines that differ only in
digits in the driver log, so one rank's line can stand for several there); the same sync of the same rank read
twice counts once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import communicator

MARKER = "rollout8: sync n="  # rollout8.node.sync_timing.MARKER, followed by the sync's number
PARTS = ("gather", "requant", "load", "postload", "switch")  # rollout8.node.sync_timing.PARTS, in the line's order
LABELS = {"gather": "gather from the trainer", "requant": "requantize", "load": "load into the engine",
          "postload": "post-load processing", "switch": "engine switch"}


@dataclass(frozen=True)
class SyncRecord:
    n: int
    rank: str
    node: str
    quant: str
    parts: dict
    total: float
    bytes: int
    loaded_bytes: int
    tensors: int
    overhead: float
    t: float

    def as_dict(self) -> dict:
        return {"n": self.n, "rank": self.rank, "node": self.node, "quant": self.quant, "parts": self.parts,
                "total": self.total, "bytes": self.bytes, "loaded_bytes": self.loaded_bytes,
                "tensors": self.tensors, "overhead": self.overhead, "t": self.t}


def parse_line(line: str) -> dict | None:
    record = parse(line)
    return None if record is None else record.as_dict()


def parse(line: str) -> SyncRecord | None:
    if MARKER not in line:
        return None
    text = "n=" + line.split(MARKER, 1)[1]
    fields = dict(token.split("=", 1) for token in text.split() if "=" in token)
    try:
        return SyncRecord(
            n=int(fields["n"]), rank=fields.get("rank", "-"), node=fields.get("node", "-"),
            quant=fields.get("quant", "-"), parts={p: float(fields.get(f"{p}_s", 0.0)) for p in PARTS},
            total=float(fields["total_s"]), bytes=int(fields.get("bytes", 0)),
            loaded_bytes=int(fields.get("loaded_bytes", 0)), tensors=int(fields.get("tensors", 0)),
            overhead=float(fields.get("overhead_s", 0.0)), t=float(fields.get("t", 0.0)))
    except (KeyError, ValueError):
        return None  # a line cut by a crash or a log rotation: not a sync


def read_lines(lines) -> list[SyncRecord]:
    seen: dict[tuple, SyncRecord] = {}
    for line in lines:
        record = parse(line)
        if record is not None:
            seen.setdefault((record.rank, record.node, record.n, record.t), record)
    return sorted(seen.values(), key=lambda r: (r.t, r.n, r.rank))


def read(driver_log: Path) -> list[SyncRecord]:
    """The syncs of a driver log and of the worker logs collected beside it."""
    driver_log = Path(driver_log)
    lines = communicator.marked_lines(driver_log, MARKER) if driver_log.is_file() else []
    return read_lines(communicator.with_worker_logs(lines, driver_log.parent, MARKER))


def last_sync(records: list[SyncRecord]) -> list[SyncRecord]:
    """Each rank's latest sync."""
    latest: dict[tuple, SyncRecord] = {}
    for record in records:
        key = (record.rank, record.node)
        if key not in latest or (record.n, record.t) > (latest[key].n, latest[key].t):
            latest[key] = record
    return sorted(latest.values(), key=lambda r: (_rank_key(r.rank), r.node))


def _rank_key(rank: str) -> tuple:
    return (0, int(rank), "") if rank.isdigit() else (1, 0, rank)


def _parts_text(parts: dict) -> str:
    return ", ".join(f"{p} {parts[p]:.3g}" for p in PARTS if parts[p] > 0 or p != "requant")


def summary(records: list[SyncRecord]) -> str:
    """`last weight sync (n=3, int8, 3 ranks): 1.29 s = gather 0.41, requant 0.21, load 0.3, postload 0.35,
    switch 0; slowest rank 2 (node) 1.4 s`; empty without syncs."""
    latest = last_sync(records)
    if not latest:
        return ""
    mean = {p: sum(r.parts[p] for r in latest) / len(latest) for p in PARTS}
    total = sum(r.total for r in latest) / len(latest)
    quants = ",".join(sorted({r.quant for r in latest}))
    numbers = sorted({r.n for r in latest})
    n = str(numbers[0]) if len(numbers) == 1 else f"{numbers[0]}-{numbers[-1]}"
    slowest = max(latest, key=lambda r: r.total)
    text = (f"last weight sync (n={n}, {quants}, {len(latest)} rank{'s' if len(latest) > 1 else ''}): "
            f"{total:.3g} s = {_parts_text(mean)}")
    if len(latest) > 1:
        text += f"; slowest rank {slowest.rank} ({slowest.node}) {slowest.total:.3g} s"
    return text


@dataclass(frozen=True)
class Means:
    quant: str
    syncs: int  # the (rank, sync) lines averaged
    parts: dict
    total: float
    bytes: float
    loaded_bytes: float
    overhead: float

    def to_json(self) -> dict:
        return {"quant": self.quant, "syncs": self.syncs, "parts_s": self.parts, "total_s": self.total,
                "bytes": self.bytes, "loaded_bytes": self.loaded_bytes, "overhead_s": self.overhead}


def means(records: list[SyncRecord], skip_first: int = 1) -> Means | None:
    """Mean seconds per sync and rank, per part, without each rank's first `skip_first` syncs (the first carries
    the engine's warm-up); None without syncs after those."""
    kept = [r for r in records if r.n > skip_first]
    if not kept:
        return None

    def mean(values) -> float:
        values = list(values)
        return sum(values) / len(values)

    return Means(quant=",".join(sorted({r.quant for r in kept})), syncs=len(kept),
                 parts={p: mean(r.parts[p] for r in kept) for p in PARTS}, total=mean(r.total for r in kept),
                 bytes=mean(r.bytes for r in kept), loaded_bytes=mean(r.loaded_bytes for r in kept),
                 overhead=mean(r.overhead for r in kept))


def largest_difference(a: Means, b: Means) -> tuple[str, float]:
    """The part whose mean differs most between two runs (a minus b), and that difference in seconds."""
    part = max(PARTS, key=lambda p: abs(a.parts[p] - b.parts[p]))
    return part, a.parts[part] - b.parts[part]
