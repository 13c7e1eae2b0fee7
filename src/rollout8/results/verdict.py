"""`rollout8 logs DIR [--json] [--job JOB]`: did int8 really run? A verdict per rollout worker of one job.

One job is judged (rollout8.results.ray_jobs says what a job is in Ray's logs): the newest in DIR, or the one
`--job` names; the others are ignored, and said to be.

Every rollout worker the judged job started must show FlashRL's patch: a WorkerDict process (verl's fused
actor/rollout worker) without FlashRL's config and load_weights patch lines is named and fails the verdict, and so
does a job whose driver log ends in a Python traceback (it crashed), or that started no rollout worker at all.

Files read: Ray's per-worker files (one process each, keyed by pid), the job's driver log where Ray forwards worker
lines with a `(WorkerDict pid=N, ip=A)` prefix (and collapses lines that differ only in numbers into `[repeated Nx
across cluster]`: a driver log alone cannot show every worker's patch line), and plain per-process files. FlashRL
logs with `%(asctime)s - %(name)s - %(levelname)s - %(message)s`; the run must use FLASHRL_LOGGING_LEVEL=DEBUG
(render sets it) for the load_weights and per-sync lines to be there.

The messages are FlashRL 1.0.3's own (flash_rl/__init__.py, flash_rl/vllm_patch.py,
flash_rl/flash_quantization.py):
  good, once per rollout rank: "flash_rl config detected.", "rank N flash_rl config: fn: int8",
        "Successfully patched the load_weights function of vllm"; per weight sync: "flash_rl quantization is called"
  bf16 entry (hybrid): "rank N flash_rl config: fn: bf16", "vllm load_weights patching skipped"
  bad: "Skipping the patching of vllm" (FLASHRL_CONFIG unset or vLLM missing at import),
       "flash_rl config not detected.", "Torch not compiled with CUDA enabled",
       "quantization is currently not supported in npu", "Error patching vllm LLM"
Exit 0 only if the judged job did not crash, at least one of its own rollout workers was found, and every rollout
worker runs FlashRL as configured (int8 patched, or a bf16 entry of a hybrid config) with at least one int8 rank.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import sync_timing
from .ray_jobs import (
    ACTOR_MARKER,
    ANSI,
    RAY_PREFIX,
    RayFile,
    choose,
    classify,
    find_jobs,
    read_lines,
    run_of,
    select,
    walk,
)

REPEATED = re.compile(r"\s*\[repeated (?P<n>\d+)x across cluster\]\s*$")
COMPRESSED = (".gz", ".tgz", ".bz2", ".xz", ".zst", ".lz4", ".zip")

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
    job: str | None = None  # the Ray job id of its worker file, or of the driver log that forwarded its lines
    owned: bool = True  # read from the judged job's own files (a shared plain file's processes can only fail it)
    forwarded: bool = False  # seen only through a driver log's `(Actor pid=N)` lines

    @property
    def is_rollout(self) -> bool:
        """A process of the job's rollout: every WorkerDict (verl's rollout worker) and async rollout server, and
        any process that logged FlashRL's rollout lines."""
        flashrl_seen = (self.rank is not None or self.detected or self.not_detected or self.load_weights_patched
                        or self.load_weights_skipped)
        return flashrl_seen or self.actor in ASYNC_SERVERS or self.actor in ROLLOUT_ACTORS

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
            # int8 is confirmed by a quantized weight sync, not by the patch line: a rank that patched vLLM and
            # ended before its first sync (exit, crash, lost) never rolled out in int8. (A rank seen only through
            # the driver log may have its sync lines folded into another's "[repeated Nx]": not judged here.)
            return "patched" if self.syncs > 0 or self.forwarded else "no-sync"
        if self.detected or self.rank is not None:
            return "incomplete"
        return "unconfirmed"  # a rollout worker without FlashRL's config line or its patch line

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
        if status == "unconfirmed" and self.forwarded:
            return ("no FlashRL config or patch line of its own in this driver log: Ray folds identical lines of "
                    "several workers into '[repeated Nx across cluster]', so a driver log cannot show that every "
                    "worker patched vLLM; judge the workers' own logs (every node's session_*/logs/worker-*), or "
                    "run with RAY_DEDUP_LOGS=0")
        if status == "unconfirmed":
            return ("a rollout worker of this job that never logged FlashRL's config or its 'Successfully patched "
                    "the load_weights function of vllm' line: FlashRL did not hook its vLLM engine (flash_rl not "
                    "imported there, or the engine never built: a crash first), its log is cut short, or "
                    "FLASHRL_LOGGING_LEVEL was not DEBUG")
        if status == "no-sync":
            return ("FlashRL patched its vLLM engine, then no quantized weight sync followed: the rank ended (exit, "
                    "crash, lost node) before its first weight sync, or its log is cut short; no int8 rollout is "
                    "confirmed")
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
    jobs: list[str] = field(default_factory=list)  # every job found, oldest first
    judged: str | None = None  # the job judged (None: no Ray job id in these logs, every file read as one run)
    chosen_by: str = ""  # "newest", "only", or "--job"
    ignored: list[str] = field(default_factory=list)  # the other jobs, not read
    notes: list[str] = field(default_factory=list)
    crash: dict | None = None  # {"file": ..., "cause": ...}: the judged job's driver died with a traceback
    compressed: list[str] = field(default_factory=list)  # files that could not be read as text
    unreadable: list[str] = field(default_factory=list)  # directories that could not be listed
    sync_lines: list[str] = field(default_factory=list)  # the judged job's weight-sync lines (results.sync_timing)

    def get(self, key: tuple, **init) -> Process:
        if key not in self.processes:
            self.processes[key] = Process(**init)
        return self.processes[key]


def scan(directory: Path, job: str | None = None) -> Scan:
    result = Scan()
    is_dir = directory.is_dir()
    files = walk(directory, result.unreadable) if is_dir else [directory]
    readable = []
    for path in files:
        if path.name.endswith(COMPRESSED):
            unpacked = path.with_name(path.name.split(".", 1)[0])
            if not unpacked.is_dir():  # an archive whose content sits beside it (the verify play's) is read there
                result.compressed.append(str(path))
            continue
        readable.append(path)
    infos = [classify(path, directory if is_dir else None) for path in readable]
    jobs, run_drivers = find_jobs(infos, directory if is_dir else None, result.notes)
    chosen, result.chosen_by = choose(jobs, job)
    result.jobs = [j.name for j in jobs]
    if chosen is not None:
        result.judged = chosen.name
        result.ignored = [j.name for j in jobs if j != chosen]
    # another job's process forwarded in a driver log read here is that job's, not one to judge from the driver
    worker_pids = {i.pid for i in infos if i.kind == "worker" and (chosen is None or i.run in (chosen.run, ""))}
    infos = select(infos, chosen, run_drivers, result.notes)
    if chosen is not None and is_dir:
        # only what is missing from the judged run (or beside every run) keeps it from a verdict
        runs = {chosen.run, ""}
        result.compressed = [c for c in result.compressed if run_of(Path(c), directory) in runs]
        result.unreadable = [u for u in result.unreadable if run_of(Path(u) / "x", directory) in runs]

    def own(info: RayFile) -> bool:
        if chosen is None:
            return True
        if info.kind == "worker":
            return bool(info.job) and info.job == chosen.ray_job
        return info.kind == "driver" and (info.job == chosen.ray_job and bool(chosen.ray_job)
                                          or info is run_drivers.get(chosen.run))

    for info in infos:
        if info.kind != "worker":
            continue
        proc = result.get(("worker", str(info.path.parent), info.pid),
                          source=str(info.path.parent / f"worker-*-{info.pid}.*"), pid=info.pid, job=info.job,
                          owned=own(info))
        result.files += 1
        for raw in read_lines(info.path):
            line = ANSI.sub("", raw)
            marker = ACTOR_MARKER.match(line)
            if marker:
                proc.actor = marker["actor"]
                continue
            if sync_timing.MARKER in line:
                if proc.owned:
                    result.sync_lines.append(line)
                continue
            _apply(proc, line)
    for info in infos:
        if info.kind == "worker":
            continue
        path = info.path
        result.files += 1
        if info.kind == "driver" and info.crash and result.crash is None and own(info):
            result.crash = info.crash
        for raw in read_lines(path):
            line = ANSI.sub("", raw).rstrip("\n")
            if sync_timing.MARKER in line:
                if own(info):
                    result.sync_lines.append(line)
                continue
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
                                  ip=prefix["ip"], actor=(prefix["actor"] or "").split(".")[0] or None,
                                  job=info.job, owned=own(info), forwarded=True)
                _apply(proc, rest)
            else:
                _apply(result.get(("file", str(path)), source=str(path), owned=own(info)), line)
    # A crash in a driver log read along (one that links to no job: maybe the judged job's, dead before its
    # workers started) fails the verdict too.
    if result.crash is None:
        result.crash = next((i.crash for i in infos if i.kind == "driver" and i.crash), None)
    return result


def who(p: dict) -> str:
    """A rollout process as the user finds it: `rank 1 (pid 1458 on 10.0.0.2)`, `pid 1682`, or its file."""
    rank = f"rank {p['rank']} " if p.get("rank") is not None else ""
    if p.get("pid"):
        return f"{rank}(pid {p['pid']}" + (f" on {p['ip']}" if p.get("ip") else "") + ")"
    return f"{rank}({p['source']})"


def verdict(result: Scan) -> dict:
    syncs = sync_timing.read_lines(result.sync_lines)
    rollout = [p for p in result.processes.values() if p.is_rollout]
    rollout.sort(key=lambda p: (p.rank is None, p.rank if p.rank is not None else 0, p.source, p.pid or 0))
    statuses = [p.status for p in rollout]
    # Green needs one int8-patched worker of the judged job itself: processes of files read along (plain files
    # beside the runs, a driver log that forwards none of its processes) can only fail it.
    own_patched = any(p.status == "patched" and p.owned for p in rollout)
    ok = bool(rollout) and all(s in OK_STATUSES for s in statuses) and own_patched \
        and not result.compressed and not result.unreadable and result.crash is None
    ranks = [p.to_dict() for p in rollout]
    by_rank: dict[int, list[int]] = {}
    for p in rollout:
        if p.rank is not None:
            by_rank.setdefault(p.rank, []).append(p.pid or 0)
    return {
        "ok": ok,
        "judged": result.judged,
        "chosen_by": result.chosen_by,
        "jobs": result.jobs,
        "ignored": result.ignored,
        "crash": result.crash,
        "notes": result.notes,
        "compressed": result.compressed,
        "unreadable": result.unreadable,
        "duplicate_ranks": {rank: pids for rank, pids in sorted(by_rank.items()) if len(pids) > 1},
        "files": result.files,
        "rollout_ranks": len(rollout),
        "patched": sum(s == "patched" for s in statuses),
        "bf16": sum(s == "bf16" for s in statuses),
        "no_config": sum(s == "no-config" for s in statuses),
        "errors": sum(s == "error" for s in statuses),
        "incomplete": sum(s == "incomplete" for s in statuses),
        "unconfirmed": sum(s == "unconfirmed" for s in statuses),
        "no_sync": sum(s == "no-sync" for s in statuses),
        "async": sum(s == "async" for s in statuses),
        "quantized_syncs": sum(p.syncs for p in rollout) + result.unattributed_syncs,
        "unattributed_syncs": result.unattributed_syncs,
        "ranks": ranks,
        "other_processes": sum(1 for p in result.processes.values() if not p.is_rollout and p.skipped),
        "sync": sync_timing.summary(syncs),
        "sync_last": [r.as_dict() for r in sync_timing.last_sync(syncs)],
    }
