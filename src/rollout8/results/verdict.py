"""`rollout8 logs DIR [--json]`: did int8 really run? A verdict per rollout rank from Ray/verl/FlashRL logs.

Reads every file under DIR: Ray's per-worker files (session_*/logs/worker-<id>-<job>-<pid>.out/.err, one
process each, keyed by pid), the driver's output where Ray forwards worker lines with a
`(WorkerDict pid=N, ip=A)` prefix (and collapses repeats into `[repeated Nx across cluster]`), and plain
per-process files. FlashRL logs with `%(asctime)s - %(name)s - %(levelname)s - %(message)s`; the run must use
FLASHRL_LOGGING_LEVEL=DEBUG (render sets it) for the load_weights and per-sync lines to be there.

The messages are FlashRL 1.0.3's own (flash_rl/__init__.py, flash_rl/vllm_patch.py,
flash_rl/flash_quantization.py):
  good, once per rollout rank: "flash_rl config detected.", "rank N flash_rl config: fn: int8",
        "Successfully patched the load_weights function of vllm"; per weight sync: "flash_rl quantization is called"
  bf16 entry (hybrid): "rank N flash_rl config: fn: bf16", "vllm load_weights patching skipped"
  bad: "Skipping the patching of vllm" (FLASHRL_CONFIG unset or vLLM missing at import),
       "flash_rl config not detected.", "Torch not compiled with CUDA enabled",
       "quantization is currently not supported in npu", "Error patching vllm LLM"
Exit 0 only if at least one rollout rank was found and every rollout rank runs FlashRL as configured
(int8 patched, or a bf16 entry of a hybrid config) with at least one int8 rank.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import Rollout8Error

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RAY_PREFIX = re.compile(r"^\((?P<actor>[A-Za-z_][\w.:-]*)?\s*pid=(?P<pid>\d+)(?:,\s*ip=(?P<ip>[0-9A-Fa-f.:]+))?\)\s?")
REPEATED = re.compile(r"\s*\[repeated (?P<n>\d+)x across cluster\]\s*$")
WORKER_FILE = re.compile(r"^(?:python-core-)?worker-[0-9a-f]+-(?:[0-9a-f]+|ffffffff)-(?P<pid>\d+)\.(?:out|err|log)$")
SESSION_DIR = re.compile(r"^session_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}_\d+_\d+$")
COMPRESSED = (".gz", ".tgz", ".bz2", ".xz", ".zst", ".lz4", ".zip")
ACTOR_MARKER = re.compile(r"^:actor_name:(?P<actor>\S+)")

RANK_CONFIG = re.compile(r"rank (?P<rank>\d+) flash_rl config: (?P<key>[\w]+): (?P<value>.*)$")
USING_CONFIG = re.compile(r"Using config (?P<index>\d+) of (?P<count>\d+)")
GOOD = {
    "detected": "flash_rl config detected.",
    "load_weights_patched": "Successfully patched the load_weights function of vllm",
    "load_weights_skipped": "vllm load_weights patching skipped",
    "vllm_patched": "Successfully patched vllm",
}
SYNC = "flash_rl quantization is called"
NOT_DETECTED = "flash_rl config not detected."
SKIPPED = "Skipping the patching of vllm"
BAD = (
    "Torch not compiled with CUDA enabled",
    "Found no NVIDIA driver",  # the same trap on a CUDA build of torch without a GPU (FlashRL's torch.cuda calls)
    "quantization is currently not supported in npu",
    "Error patching vllm LLM",
    "flash_rl only supports vllm v1",
)
ROLLOUT_ACTORS = ("WorkerDict",)  # verl's hybrid actor/rollout workers (fused WorkerDict class)
# verl's async rollout servers (rollout.mode=async): their vLLM engine is an AsyncLLM, which FlashRL never hooks
ASYNC_SERVERS = ("vLLMHttpServer", "AsyncvLLMServer")
OK_STATUSES = ("patched", "bf16")


@dataclass
class Process:
    source: str
    pid: int | None = None
    ip: str | None = None
    actor: str | None = None
    rank: int | None = None
    fn: str | None = None
    config_index: int | None = None
    config_count: int | None = None
    detected: bool = False
    not_detected: bool = False
    skipped: bool = False
    load_weights_patched: bool = False
    load_weights_skipped: bool = False
    vllm_patched: bool = False
    syncs: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def is_rollout(self) -> bool:
        flashrl_seen = (self.rank is not None or self.detected or self.not_detected or self.load_weights_patched
                        or self.load_weights_skipped)
        return (flashrl_seen or self.actor in ASYNC_SERVERS
                or (self.actor in ROLLOUT_ACTORS and (self.skipped or bool(self.errors))))

    @property
    def status(self) -> str:
        if self.errors:
            return "error"
        if self.actor in ASYNC_SERVERS and not self.load_weights_patched:
            return "async"
        if self.not_detected or (self.skipped and not self.detected):
            return "no-config"
        if self.detected and self.fn == "bf16":
            return "bf16"
        if self.detected and self.load_weights_patched:
            return "patched"
        return "incomplete"

    @property
    def reason(self) -> str:
        status = self.status
        if status == "error":
            return self.errors[0]
        if status == "no-config":
            return ("FLASHRL_CONFIG was not in this worker's environment when flash_rl was imported "
                    "(export it before `ray start` or pass it in ray_kwargs.ray_init.runtime_env.env_vars)"
                    if self.skipped else "FlashRL's patch ran but FLASHRL_CONFIG was unset when vllm.LLM was built")
        if status == "async":
            return (f"verl's async rollout server ({self.actor}, rollout.mode=async): FlashRL hooks only vllm.LLM "
                    "(the sync rollout), so this engine ran bf16; set actor_rollout_ref.rollout.mode=sync")
        if status == "incomplete":
            return ("config detected but no 'patched the load_weights' line: the engine failed to start, the logs "
                    "are cut short, or FLASHRL_LOGGING_LEVEL was not DEBUG (that line is a DEBUG line)")
        if status == "bf16":
            return "bf16 entry of the FlashRL config (hybrid): rollouts in bf16 by design"
        return f"int8 patch active ({self.fn}), {self.syncs} quantized weight sync(s)"

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(status=self.status, reason=self.reason)
        return out


def _message(line: str) -> str:
    """The message part of a FlashRL log line ('... - name - LEVEL - message'), else the line."""
    parts = line.split(" - ", 3)
    if len(parts) == 4 and parts[2].strip() in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        return parts[3]
    return line


def _apply(proc: Process, line: str) -> None:
    message = _message(line).rstrip()
    match = RANK_CONFIG.search(message)
    if match:
        proc.rank = int(match["rank"])
        if match["key"] == "fn":
            proc.fn = match["value"].strip()
        return
    match = USING_CONFIG.search(message)
    if match:
        proc.config_index, proc.config_count = int(match["index"]), int(match["count"])
        return
    if message.endswith(SYNC):
        proc.syncs += 1
        return
    for attr, text in GOOD.items():
        if message.endswith(text):
            setattr(proc, attr, True)
            return
    if message.endswith(NOT_DETECTED):
        proc.not_detected = True
    elif message.endswith(SKIPPED):
        proc.skipped = True
    else:
        for bad in BAD:
            if bad in message:
                proc.errors.append(message.strip()[-300:])
                return


@dataclass
class Scan:
    processes: dict[tuple, Process] = field(default_factory=dict)
    unattributed_syncs: int = 0
    files: int = 0
    runs: list[str] = field(default_factory=list)  # every run found (session or collected job dir), oldest first
    judged: str | None = None  # the one judged, when there were several
    compressed: list[str] = field(default_factory=list)  # files that could not be read as text

    def get(self, key: tuple, **init) -> Process:
        if key not in self.processes:
            self.processes[key] = Process(**init)
        return self.processes[key]


def _run_of(path: Path, top: Path) -> str:
    """The run a file belongs to, when `top` holds several side by side: its first directory below top, if that
    is a Ray session (session_*, as in Ray's temp dir) or a job's collected logs (holding driver.log: the verify
    play's logs/<job>/); "" otherwise. Below that level nothing is split: one run's nodes have sessions of their
    own names, and one submission holds several Ray job ids (its supervisor's, its driver's)."""
    try:
        first = path.relative_to(top).parts[0]
    except (ValueError, IndexError):
        return ""
    if first == path.name or first == "session_latest":
        return ""
    if SESSION_DIR.match(first) or (top / first / "driver.log").is_file():
        return first
    return ""


def _pick_run(files: list[Path], top: Path, run: str | None, result: Scan) -> list[Path]:
    """Keep the files of one run: the newest (a later session, else the latest written), or the one `run` names
    (its directory name). Files outside any run (plain logs beside them) stay."""
    run_of = {path: _run_of(path, top) for path in files}
    runs: dict[str, float] = {}
    for path, key in run_of.items():
        if key and WORKER_FILE.match(path.name):
            runs[key] = max(runs.get(key, 0.0), path.stat().st_mtime)
    ordered = sorted(runs, key=lambda k: (k if SESSION_DIR.match(k) else "", runs[k]))
    result.runs = ordered
    if run is not None:
        chosen = [k for k in ordered if run == k or run in k]
        if not chosen:
            raise Rollout8Error(f"--job {run}: no such run in these logs (found: {', '.join(ordered) or 'none'})")
        key = chosen[-1]
    elif len(ordered) > 1:
        key = ordered[-1]
    else:
        return files
    result.judged = key
    return [p for p in files if run_of[p] in (key, "")]


def scan(directory: Path, job: str | None = None) -> Scan:
    result = Scan()
    files = sorted(p for p in directory.rglob("*") if p.is_file()) if directory.is_dir() else [directory]
    readable = []
    for path in files:
        if path.name.endswith(COMPRESSED):
            unpacked = path.with_name(path.name.split(".", 1)[0])
            if not unpacked.is_dir():  # an archive whose content sits beside it (the verify play's) is read there
                result.compressed.append(str(path))
            continue
        readable.append(path)
    files = _pick_run(readable, directory, job, result) if directory.is_dir() else readable
    worker_files = [p for p in files if WORKER_FILE.match(p.name)]
    worker_pids = set()
    for path in worker_files:
        pid = int(WORKER_FILE.match(path.name)["pid"])
        worker_pids.add(pid)
        proc = result.get(("worker", str(path.parent), pid), source=str(path.parent / f"worker-*-{pid}.*"), pid=pid)
        result.files += 1
        for raw in _lines(path):
            line = ANSI.sub("", raw)
            marker = ACTOR_MARKER.match(line)
            if marker:
                proc.actor = marker["actor"]
                continue
            _apply(proc, line)
    for path in files:
        if path in worker_files:
            continue
        result.files += 1
        for raw in _lines(path):
            line = ANSI.sub("", raw).rstrip("\n")
            prefix = RAY_PREFIX.match(line)
            if prefix:
                pid = int(prefix["pid"])
                if pid in worker_pids:
                    continue  # the same process's own worker file is read already
                rest = line[prefix.end():]
                repeated = REPEATED.search(rest)
                if repeated:
                    # Ray's de-duplication: N more occurrences from other processes, not attributable to a rank.
                    if _message(rest[:repeated.start()]).endswith(SYNC):
                        result.unattributed_syncs += int(repeated["n"])
                    continue
                proc = result.get(("ray", prefix["ip"] or "", pid, prefix["actor"]), source=str(path), pid=pid,
                                  ip=prefix["ip"], actor=(prefix["actor"] or "").split(".")[0] or None)
                _apply(proc, rest)
            else:
                _apply(result.get(("file", str(path)), source=str(path)), line)
    return result


def _lines(path: Path):
    try:
        with open(path, errors="replace") as fh:
            yield from fh
    except OSError as exc:
        raise Rollout8Error(f"{path}: cannot read ({exc})") from exc


def verdict(result: Scan) -> dict:
    rollout = [p for p in result.processes.values() if p.is_rollout]
    rollout.sort(key=lambda p: (p.rank is None, p.rank if p.rank is not None else 0, p.source, p.pid or 0))
    statuses = [p.status for p in rollout]
    ok = bool(rollout) and all(s in OK_STATUSES for s in statuses) and "patched" in statuses \
        and not result.compressed
    ranks = [p.to_dict() for p in rollout]
    by_rank: dict[int, list[int]] = {}
    for p in rollout:
        if p.rank is not None:
            by_rank.setdefault(p.rank, []).append(p.pid or 0)
    return {
        "ok": ok,
        "runs": result.runs,
        "judged": result.judged,
        "compressed": result.compressed,
        "duplicate_ranks": {rank: pids for rank, pids in sorted(by_rank.items()) if len(pids) > 1},
        "files": result.files,
        "rollout_ranks": len(rollout),
        "patched": sum(s == "patched" for s in statuses),
        "bf16": sum(s == "bf16" for s in statuses),
        "no_config": sum(s == "no-config" for s in statuses),
        "errors": sum(s == "error" for s in statuses),
        "incomplete": sum(s == "incomplete" for s in statuses),
        "async": sum(s == "async" for s in statuses),
        "quantized_syncs": sum(p.syncs for p in rollout) + result.unattributed_syncs,
        "unattributed_syncs": result.unattributed_syncs,
        "ranks": ranks,
        "other_processes": sum(1 for p in result.processes.values() if not p.is_rollout and p.skipped),
    }
