"""Which ranks of a job have not joined their communicator, from the `rollout8: communicator` lines every rank logs
(rollout8.node.communicator) in its Ray worker log (worker-*.err, collected per node by the verify play), which Ray
also forwards into the driver log, prefixed `(WorkerDict pid=N, ip=A)`. The driver log alone is not enough: Ray
folds lines that differ only in words with digits (rank=1, rank=2, rollout8-sim-w1...) into one "[repeated Nx across
cluster]", and prints forwarded lines out of order; so lines are read from both, deduplicated and ordered by their t.

A group is the ranks that share a master address and world size. Once some rank of it has waited longer than
`after_s` and not every rank has joined, the group is stuck and one line names it: the ranks that never arrived, the
node that is short of them and the devices it lacks (with the per-node rank count), the ranks that wait and what for,
and a rank whose wait failed with its error. Before `after_s` a wait is a start, not a problem.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "rollout8: communicator"  # rollout8.node.communicator.MARKER (that module runs in the image, not here)
AFTER_S = 180.0
_RAY_PREFIX = re.compile(r"\(\w+ pid=\d+, ip=([^)\s]+)\)")
WAITING = ("waiting", "still-waiting")


@dataclass
class RankState:
    rank: int
    node: str
    device: str
    state: str
    since: float  # when it started waiting (its first line's t)
    t: float  # its last line's t
    ip: str = ""
    error: str = ""


@dataclass
class Group:
    master: str
    world: int
    backend: str = "-"
    ranks: dict[int, RankState] = field(default_factory=dict)

    @property
    def joined(self) -> list[int]:
        return sorted(r for r, s in self.ranks.items() if s.state == "joined")

    @property
    def all_joined(self) -> bool:
        return len(self.joined) >= self.world


def parse_line(line: str) -> dict[str, str] | None:
    if MARKER not in line:
        return None
    head, _, rest = line.partition(MARKER)
    rest, _, error = rest.partition(" error=")
    fields = dict(tok.split("=", 1) for tok in rest.split() if "=" in tok)
    if error:
        fields["error"] = error.strip()
    prefix = _RAY_PREFIX.search(head)
    if prefix:
        fields["ip"] = prefix.group(1)
    return fields if {"state", "rank", "world"} <= fields.keys() else None


def _t(fields: dict[str, str]) -> float:
    try:
        return float(fields.get("t", "0"))
    except ValueError:
        return 0.0


def read_groups(lines) -> list[Group]:
    parsed = [f for f in map(parse_line, lines) if f is not None and f["rank"].isdigit() and f["world"].isdigit()]
    seen: set[tuple] = set()
    groups: dict[tuple[str, int], Group] = {}
    order = {"waiting": 0, "still-waiting": 1, "joined": 2, "failed": 2}
    for f in sorted(parsed, key=lambda f: (_t(f), order.get(f["state"], 1))):
        key = (f.get("master"), f["world"], f["rank"], f["state"], f.get("t"))
        if key in seen:  # the same line from the worker log and the driver log
            continue
        seen.add(key)
        t = _t(f)
        group = groups.setdefault((f.get("master", "-"), int(f["world"])),
                                  Group(f.get("master", "-"), int(f["world"]), f.get("backend", "-")))
        rank = int(f["rank"])
        old = group.ranks.get(rank)
        since = t if old is None or f["state"] == "waiting" else old.since
        group.ranks[rank] = RankState(rank, f.get("node", "?"), f.get("device", "-"), f["state"], since, t,
                                      f.get("ip", old.ip if old else ""), f.get("error", ""))
    return list(groups.values())


def _ranges(numbers: list[int]) -> str:
    out, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out)


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _node_label(state: RankState) -> str:
    return f"{state.node} ({state.ip})" if state.ip and state.ip != state.node else state.node


def problems(groups: list[Group], now: float | None = None, after_s: float = AFTER_S,
             npus_per_node: int | None = None, nodes: list[str] | None = None) -> list[str]:
    """One line per stuck group (see the module's docstring); none while every wait is younger than `after_s`.
    `nodes`: the cluster's nodes as `name` or `name=address`, to name one of which no rank arrived."""
    now = time.time() if now is None else now
    lines = []
    for g in groups:
        if g.all_joined:
            continue
        failed = [s for s in g.ranks.values() if s.state == "failed"]
        waiting = [s for s in g.ranks.values() if s.state in WAITING]
        oldest = min((s.since for s in waiting), default=None)
        if not failed and (oldest is None or now - oldest < after_s):
            continue
        missing = sorted(set(range(g.world)) - set(g.ranks))
        per_node: dict[str, list[RankState]] = {}
        for s in g.ranks.values():
            per_node.setdefault(_node_label(s), []).append(s)
        parts = []
        if missing:
            parts.append(f"rank{'s' if len(missing) > 1 else ''} {_ranges(missing)} of {g.world} never reached it")
            short = []
            if npus_per_node:
                for label, states in sorted(per_node.items()):
                    if len(states) < npus_per_node:
                        devices = {s.device for s in states}
                        lacking = [str(d) for d in range(npus_per_node) if str(d) not in devices]
                        lacks = f": device{'s' if len(lacking) > 1 else ''} {', '.join(lacking)}" \
                            if all(d.isdigit() for d in devices) and lacking else ""
                        short.append(f"{label} is short of {npus_per_node - len(states)}{lacks}")
                silent = len(missing) - sum(npus_per_node - len(s) for s in per_node.values() if len(s) < npus_per_node)
                seen = {s.node for s in g.ranks.values()} | {s.ip for s in g.ranks.values()}
                absent = [f"{n.split('=')[0]} ({n.split('=')[1]})" if "=" in n else n for n in (nodes or [])
                          if not set(n.split("=", 1)) & seen]
                if silent > 0:
                    short.append((f"{', '.join(absent)} sent nothing" if absent else
                                  f"{silent} rank{'s' if silent > 1 else ''} on a node that sent nothing")
                                 + " (is its Ray node in the cluster? `ray status` on the head)")
            arrived = ", ".join(f"{label} {len(states)} rank{'s' if len(states) > 1 else ''}"
                                for label, states in sorted(per_node.items()))
            parts.append("; ".join(short) if short else f"arrived: {arrived}")
        for s in sorted(failed, key=lambda s: s.rank):
            parts.append(f"rank {s.rank} ({_node_label(s)}, device {s.device}) failed after "
                         f"{_duration(s.t - s.since)}: {s.error or 'no error text'}")
        if waiting and oldest is not None:
            parts.append(f"{len(waiting)} rank{'s' if len(waiting) > 1 else ''} "
                         f"({', '.join(sorted({_node_label(s) for s in waiting}))}) "
                         f"{'have' if len(waiting) > 1 else 'has'} waited {_duration(now - oldest)} for all "
                         f"{g.world} to connect to {g.master} ({g.backend})")
        lines.append(f"communicator not complete ({len(g.joined)} of {g.world} ranks joined): " + "; ".join(parts))
    return lines


def marked_lines(path: Path, marker: str = MARKER) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return [line for line in fh if marker in line]


def worker_logs(job_dir: Path) -> list[Path]:
    """The Ray worker logs the verify play collected per node: <job dir>/<node>/logs/worker-*.err."""
    return sorted(job_dir.glob("*/logs/worker-*.err"))


def with_worker_logs(driver_lines: list[str], job_dir: Path, marker: str = MARKER) -> list[str]:
    """A driver log's marked lines and those of the worker logs collected beside it (see the module's docstring)."""
    lines = list(driver_lines)
    for log in worker_logs(job_dir):
        lines += marked_lines(log, marker)
    return lines


def read(path: Path) -> list[Group]:
    """The groups of a driver log and of the worker logs collected beside it."""
    return read_groups(with_worker_logs(marked_lines(path), Path(path).parent))
