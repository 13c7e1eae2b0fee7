"""Peak memory and wall time of a command, measured in a fresh process; the extra peak of one call.

`getrusage(RUSAGE_CHILDREN).ru_maxrss` is the largest RSS among all children a process has waited for, so each
measurement runs the command under a small watcher interpreter of its own (which imports nothing heavy); the
watcher reports the command's peak RSS, wall time and exit code as one JSON line.

`extra_peak(fn)` is for one call inside a process (torch allocations are invisible to tracemalloc): it resets
the process's RSS high-water mark, calls fn, and reports how far the high-water mark rose above the RSS at the
call. Linux only (/proc/self/clear_refs, VmHWM).
"""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_WATCHER = """
import json, resource, subprocess, sys, time
start = time.monotonic()
rc = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL if {quiet} else None)
wall = time.monotonic() - start
peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print("PEAK_MEMORY " + json.dumps({{"rc": rc, "wall_s": wall, "peak_rss_bytes": peak_kib * 1024}}), flush=True)
"""


@dataclass(frozen=True)
class Measurement:
    returncode: int
    wall_s: float
    peak_rss_bytes: int
    output: str

    @property
    def peak_rss_mib(self) -> float:
        return self.peak_rss_bytes / 2**20


def measure(cmd: list[str], env: dict | None = None, timeout: float = 1800, quiet: bool = True) -> Measurement:
    """Run `cmd` in a fresh child and return its peak RSS (Linux: ru_maxrss, KiB) and wall time."""
    watcher = [sys.executable, "-c", _WATCHER.format(quiet=quiet), *cmd]
    proc = subprocess.run(watcher, env=env, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("PEAK_MEMORY "):
            data = json.loads(line[len("PEAK_MEMORY "):])
            return Measurement(data["rc"], data["wall_s"], data["peak_rss_bytes"], proc.stdout + proc.stderr)
    raise RuntimeError(f"watcher failed (exit {proc.returncode}): {proc.stderr[-2000:]}")


def _status_bytes(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB$", Path("/proc/self/status").read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field} (extra_peak needs Linux)")
    return int(match.group(1)) * 1024


def extra_peak(fn):
    """(fn(), extra bytes): the highest RSS during the call minus the RSS just before it, what the result still
    holds included. Memory that malloc kept from earlier frees is handed back first (malloc_trim) where glibc
    has it, but a process that did much before may still reuse some unseen: call this in a fresh process."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS (VmHWM) to the current RSS
    before = _status_bytes("VmRSS")
    result = fn()
    return result, _status_bytes("VmHWM") - before
