"""Which job a log directory holds, told from what Ray's logs carry: the layout `rollout8 logs` judges one job of.

Ray files every worker process's output as worker-<worker id>-<Ray job id>-<pid>.out/.err (the job id `ffffffff`
for a worker started before it had a job: then its `:job_id:` line says), and each driver's as
python-core-driver-<Ray job id>..._<pid>.log; a Ray session (session_<date>_<time>_<us>_<pid>) holds every job
since `ray start`, and the verify play keeps one submission's logs as <submission>/driver.log plus
<host>/logs/worker-*.

A job is one Ray job id within one run (a session directory, or a submission's collected directory holding
driver.log; "" when the directory given is one of them). The Ray job of the job manager (the one whose processes
are JobSupervisor actors) is nobody's training job. A submission's driver.log names its own job: the Ray job of
the processes whose lines it forwards (`(WorkerDict pid=N, ip=A)`); other Ray jobs beside it were collected with
it, not started by it. Jobs are ordered by run (the time in its name: the session's start, the submission id's UTC
timestamp; else its files' newest mtime), then by Ray job id, which Ray counts up within a session.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path

from ..errors import Rollout8Error
from .verl_logs import is_driver_log

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RAY_PREFIX = re.compile(r"^\((?P<actor>[A-Za-z_][\w.:-]*)?\s*pid=(?P<pid>\d+)(?:,\s*ip=(?P<ip>[0-9A-Fa-f.:]+))?\)\s?")
WORKER_FILE = re.compile(r"^(?:python-core-)?worker-[0-9a-f]+-(?P<job>[0-9a-f]+)-(?P<pid>\d+)\.(?:out|err|log)$")
CORE_DRIVER_FILE = re.compile(r"^python-core-driver-(?P<job>[0-9a-f]{8})[0-9a-f]*_(?P<pid>\d+)\.log$")
SESSION_DIR = re.compile(r"^session_(?P<time>\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})_(?P<us>\d+)_\d+$")
SUBMISSION_TIME = re.compile(r"-(?P<time>\d{14})$")  # the launch role's <plan job id>-<kind>-<UTC %Y%m%d%H%M%S>
ACTOR_MARKER = re.compile(r"^:actor_name:(?P<actor>\S+)")
JOB_MARKER = re.compile(r"^:job_id:(?P<job>[0-9a-f]+)\s*$")
NIL_JOB = "ffffffff"  # a worker Ray started before it had a job
JOB_MANAGER_ACTORS = ("JobSupervisor",)  # Ray's job manager runs them in a Ray job of its own
# The driver's own (unprefixed) lines: a Python traceback there is the driver dying; hydra says so first for verl.
TRACEBACK = ("Traceback (most recent call last):", "Error executing job with overrides")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)(?:\([\w.]*\))?(?::|$)")
FORWARDED = re.compile(r"^\([^()]*\)\s")  # (WorkerDict pid=1, ip=A), (raylet), (autoscaler +2s): not the driver's


@dataclass(frozen=True)
class Job:
    run: str  # the session or collected submission directory below DIR, "" for DIR itself
    ray_job: str  # the Ray job id; "" for a submission whose driver.log is all there is of it

    @property
    def name(self) -> str:
        if not self.ray_job:
            return self.run
        return f"{self.run}:{self.ray_job}" if self.run else self.ray_job


@dataclass
class RayFile:
    path: Path
    run: str
    kind: str  # worker, core-driver, driver, other
    job: str | None = None  # Ray job id (a driver log: the job whose processes it forwards, if any)
    pid: int | None = None
    actor: str | None = None
    crash: dict | None = None  # a driver log that ends the driver with a traceback


def run_of(path: Path, top: Path) -> str:
    """The run a file belongs to, when `top` holds several side by side: its first directory below top, if that
    is a Ray session (session_*, as in Ray's temp dir) or a job's collected logs (holding driver.log: the verify
    play's logs/<job>/); "" otherwise. Below that level runs are not split: one run's nodes have sessions of their
    own names; its Ray jobs are told apart by their ids."""
    try:
        first = path.relative_to(top).parts[0]
    except (ValueError, IndexError):
        return ""
    if first == path.name or first == "session_latest":
        return ""
    if SESSION_DIR.match(first) or (top / first / "driver.log").is_file():
        return first
    return ""


def walk(top: Path, unreadable: list[str]) -> list[Path]:
    """Every regular file under `top`, sorted; symbolic links to directories are not followed (no loop can hang
    the walk), a link to a file is read as the file, one that loops or dangles is skipped. A directory that cannot
    be listed goes to `unreadable` (what it holds is unknown: no verdict can pass over it)."""
    files = []

    def onerror(exc: OSError) -> None:
        unreadable.append(str(exc.filename or top))

    for dirpath, dirnames, filenames in os.walk(top, onerror=onerror, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_file():  # False for a FIFO, a socket, a loop: nothing to wait on
                files.append(path)
    return files


def _head(path: Path, lines: int = 40) -> tuple[str | None, str | None]:
    """(Ray job id, actor name) from the markers Ray writes at the top of a worker's file."""
    job = actor = None
    try:
        with open(path, errors="replace") as fh:
            for raw in islice(fh, lines):
                line = ANSI.sub("", raw)
                if job is None and (m := JOB_MARKER.match(line)):
                    job = m["job"]
                elif actor is None and (m := ACTOR_MARKER.match(line)):
                    actor = m["actor"]
                if job and actor:
                    break
    except OSError:
        pass
    return job, actor


def classify(path: Path, top: Path | None) -> RayFile:
    run = run_of(path, top) if top is not None else ""
    if m := WORKER_FILE.match(path.name):
        marker_job, actor = _head(path)
        job = m["job"] if m["job"] != NIL_JOB else marker_job
        return RayFile(path, run, "worker", job=job, pid=int(m["pid"]), actor=actor)
    if m := CORE_DRIVER_FILE.match(path.name):
        return RayFile(path, run, "core-driver", job=m["job"], pid=int(m["pid"]))
    if is_driver_log(path):
        return RayFile(path, run, "driver")
    return RayFile(path, run, "other")


def read_driver(info: RayFile) -> Counter:
    """The pids a driver log forwards lines of (how often each), and whether the driver itself died with a
    traceback (info.crash: the exception line after the last one)."""
    pids: Counter = Counter()
    in_traceback = False
    cause = None
    crashed = False
    for raw in read_lines(info.path):
        line = ANSI.sub("", raw).rstrip("\n")
        prefix = RAY_PREFIX.match(line)
        if prefix:
            pids[int(prefix["pid"])] += 1
            continue
        if FORWARDED.match(line):
            continue
        if line.startswith(TRACEBACK):
            crashed = in_traceback = True
            continue
        if in_traceback and EXCEPTION_LINE.match(line):
            cause = line.strip()[:300]
    if crashed:
        info.crash = {"file": str(info.path), "cause": cause or "a Python traceback"}
    return pids


def job_number(ray_job: str) -> int:
    """Ray's job ids count up from 1, printed as 4 little-endian bytes (01000000, 02000000, ..., 00010000)."""
    try:
        return int.from_bytes(bytes.fromhex(ray_job), "little")
    except ValueError:
        return -1


def run_time(run: str, infos: list[RayFile]) -> float:
    """When a run started: the time in its name (a session's local start time; a submission id's UTC timestamp),
    else the newest mtime of its Ray files."""
    if m := SESSION_DIR.match(run):
        try:
            return datetime.strptime(m["time"], "%Y-%m-%d_%H-%M-%S").timestamp() + int(m["us"][:6] or 0) / 1e6
        except (ValueError, OverflowError):
            pass
    if m := SUBMISSION_TIME.search(run):
        try:
            return datetime.strptime(m["time"], "%Y%m%d%H%M%S").replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            pass
    times = []
    for info in infos:
        if info.run == run and info.kind != "other":
            try:
                times.append(info.path.stat().st_mtime)
            except OSError:
                pass
    return max(times, default=0.0)


def find_jobs(infos: list[RayFile], top: Path | None, notes: list[str]) -> tuple[list[Job], dict[str, RayFile]]:
    """Every job in these logs, oldest first, and each run's own driver.log (the submission's, when collected)."""
    actors: dict[tuple[str, str], set[str]] = {}
    by_pid: dict[tuple[str, int], str] = {}
    for info in infos:
        if info.kind in ("worker", "core-driver") and info.job and info.job != NIL_JOB:
            actors.setdefault((info.run, info.job), set()).update([info.actor] if info.actor else [])
            if info.kind == "worker":
                by_pid[(info.run, info.pid)] = info.job
    managers = {key for key, names in actors.items() if names & set(JOB_MANAGER_ACTORS)}
    # Link each driver log to the Ray job whose processes it forwards.
    for info in infos:
        if info.kind == "driver":
            counts = Counter()
            for pid, n in read_driver(info).items():
                job = by_pid.get((info.run, pid))
                if job and (info.run, job) not in managers:
                    counts[job] += n
            if counts:
                info.job = max(counts, key=lambda j: (counts[j], job_number(j)))
    candidates = {Job(*key) for key in actors if key not in managers}
    run_drivers: dict[str, RayFile] = {}
    if top is not None:
        for info in infos:
            if info.kind == "driver" and info.path == (top / info.run if info.run else top) / "driver.log":
                run_drivers[info.run] = info
    for run, driver in run_drivers.items():
        if driver.job:  # a submission's driver.log says which Ray job is this submission's
            others = sorted((j for j in candidates if j.run == run and j.ray_job != driver.job),
                            key=lambda j: job_number(j.ray_job))
            if others:
                where = f"{run}/driver.log" if run else "driver.log"
                notes.append(f"Ray job(s) {', '.join(j.ray_job for j in others)} beside {where}: not the job it ran "
                             f"(its lines come from Ray job {driver.job}), not read")
                candidates -= set(others)
        elif run and not any(j.run == run for j in candidates):
            candidates.add(Job(run, ""))  # a submission with nothing of it but its driver log
    times = {run: run_time(run, infos) for run in {j.run for j in candidates}}
    jobs = sorted(candidates, key=lambda j: (times[j.run], j.run, job_number(j.ray_job)))
    return jobs, run_drivers


def choose(jobs: list[Job], wanted: str | None) -> tuple[Job | None, str]:
    """The job to judge and why ("only", "newest", "--job"): the newest, or the one `wanted` names (its full name,
    its Ray job id, its run directory or a part of that name)."""
    if wanted is None:
        if not jobs:
            return None, ""
        return jobs[-1], "only" if len(jobs) == 1 else "newest"
    exact = [j for j in jobs if j.name == wanted]
    matches = exact or [j for j in jobs if j.ray_job == wanted] or [j for j in jobs if j.run == wanted] \
        or [j for j in jobs if j.run and wanted in j.run]
    if not matches:
        found = ", ".join(j.name for j in jobs) or "none"
        raise Rollout8Error(f"--job {wanted}: no such job in these logs (found: {found})")
    if len({j.run for j in matches}) > 1:
        raise Rollout8Error(f"--job {wanted}: names several jobs ({', '.join(j.name for j in matches)}): "
                            "give one of these names")
    return matches[-1], "--job"  # a run named: its newest job


def select(infos: list[RayFile], chosen: Job | None, run_drivers: dict[str, RayFile],
           notes: list[str]) -> list[RayFile]:
    """The files to read for the judged job: its own, and the plain files beside them (a run's raylet.out, logs
    outside any run), which the verdict reads but never lets pass the job. Files of other runs and of other Ray
    jobs are left out; so is a driver log that links to no job when the judged job has a driver log of its own."""
    if chosen is None:
        return infos
    run_driver = run_drivers.get(chosen.run)
    linked = [i for i in infos if i.kind == "driver" and i.run == chosen.run and i.job == chosen.ray_job
              and chosen.ray_job]
    kept, unlinked_left = [], []
    for info in infos:
        if info.run not in (chosen.run, ""):
            continue
        if info.kind in ("worker", "core-driver"):
            if info.job and info.job != NIL_JOB:
                if info.run == chosen.run and info.job == chosen.ray_job:
                    kept.append(info)
                continue
            kept.append(info)  # a worker with no job yet: read along (it cannot pass the job)
        elif info.kind == "driver":
            if info.job:
                if any(info is mine for mine in linked):
                    kept.append(info)
            elif info is run_driver or not linked:
                kept.append(info)  # the submission's own driver.log, or maybe the judged job's (it links to none)
            else:
                unlinked_left.append(info)
        else:
            kept.append(info)
    if unlinked_left:
        notes.append(f"{len(unlinked_left)} driver log(s) forwarding no process of any job here, not read "
                     f"(the judged job has its own): {', '.join(i.path.name for i in unlinked_left[:3])}")
    return kept


def read_lines(path: Path):
    """The lines of a log file (undecodable bytes replaced); a file that cannot be read is one error line."""
    try:
        with open(path, errors="replace") as fh:
            yield from fh
    except OSError as exc:
        raise Rollout8Error(f"{path}: cannot read ({exc})") from exc
