"""Where a verl job stands, from its driver log: what the verify play prints while the job runs and after it.

verl's console logger prints one `step:N - key:value - ...` line per training step (rollout8.results.verl_logs),
and the validation before training at step 0, or at the resumed step when the trainer resumed from a checkpoint
(`trainer.resume_mode`). A training step is a line carrying `timing_s/step`; the steps this job trained are those.
When the job failed, the cause is the driver's last error line, and the node addresses it names.

A driver log that is not there is said to be missing, never read as "no step yet": `find_driver_log` names the
directory and the file it looked for (or the link that loops, the FIFO that is no file).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import Rollout8Error
from . import communicator, sync_timing
from .verl_logs import RunLog, path_problem, read_console

DRIVER_LOG = "driver.log"  # what the verify play keeps of a job: <work>/logs/<job id>/driver.log

STEP_TIME = "timing_s/step"
REWARD_KEYS = ("critic/score/mean", "critic/rewards/mean", "reward/mean")
_ERROR = re.compile(r"\b\w*(Error|Exception|Died)\b")
_IP = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")
# verl's RayPPOTrainer._load_checkpoint: "Setting global step to N" (and "Load from checkpoint folder: ...")
_RESUMED = re.compile(r"Setting global step to (\d+)")
_CKPT_FOLDER = re.compile(r"Load from checkpoint folder: (\S+)")


@dataclass
class Progress:
    trained: list[int] = field(default_factory=list)  # the training steps this job logged
    total: int | None = None
    reward: float | None = None
    step_time_s: float | None = None
    resumed_from: int | None = None  # the checkpoint step the trainer resumed from
    checkpoint: str | None = None
    cause: str | None = None  # the driver's last error line
    ips: list[str] = field(default_factory=list)  # node addresses in the driver's error lines
    # ranks that have not joined their communicator after communicator.AFTER_S (rollout8.results.communicator)
    communicator: list[str] = field(default_factory=list)
    joined: str = ""  # "8 of 8" once the ranks said so
    sync: str = ""  # the last weight sync's parts (rollout8.results.sync_timing.summary)

    @property
    def last_step(self) -> int | None:
        return self.trained[-1] if self.trained else None

    def to_json(self) -> dict:
        return {"trained": self.trained, "last_step": self.last_step, "total": self.total, "reward": self.reward,
                "step_time_s": self.step_time_s, "resumed_from": self.resumed_from, "checkpoint": self.checkpoint,
                "cause": self.cause, "ips": self.ips, "communicator": self.communicator, "joined": self.joined,
                "sync": self.sync}


def _ray_driver_logs(directory: Path) -> list[str]:
    """Ray's own driver logs (job-driver-<submission>.log) in a session's logs directory, or its logs/ below."""
    found = []
    for where in (directory, directory / "logs"):
        try:
            with os.scandir(where) as entries:
                found += sorted(str(Path(where) / e.name) for e in entries
                                if e.name.startswith("job-driver-") and e.name.endswith(".log"))
        except OSError:
            continue
    return found


def find_driver_log(path: Path) -> Path:
    """The driver log `path` stands for: the file itself, or a job directory's driver.log. Raises one line saying
    what is missing (the directory and the file looked for), or why it cannot be read: a symbolic link that loops
    or dangles, a directory, a FIFO (opening one would wait forever)."""
    problem = path_problem(path)
    if problem:
        raise Rollout8Error(problem)
    driver = path / DRIVER_LOG if path.is_dir() else path
    if driver is not path:
        if not os.path.lexists(driver):
            ray_logs = _ray_driver_logs(path)
            hint = (f"; Ray's own driver logs are here, pass one of them: {', '.join(ray_logs[:3])}" if ray_logs
                    else "; the verify play keeps it there (ansible-playbook train.yml --tags verify), or pass the "
                         "driver log file itself")
            raise Rollout8Error(f"{path}: no driver log: looked for {driver}, which does not exist{hint}")
        problem = path_problem(driver)
        if problem:
            raise Rollout8Error(f"{path}: no readable driver log: {problem}")
    if not driver.is_file():
        raise Rollout8Error(f"{driver}: not a regular file (a directory, a FIFO or a device): no driver log to read")
    return driver


def read_progress(driver_log: Path, total: int | None = None, *, now: float | None = None,
                  after_s: float = communicator.AFTER_S, npus_per_node: int | None = None,
                  nodes: list[str] | None = None) -> Progress:
    """The progress a driver log shows; a driver log that cannot be read raises (see find_driver_log). Ranks that
    have not joined their communicator `after_s` after the first waited are named (rollout8.results.communicator)."""
    driver_log = find_driver_log(Path(driver_log))
    run = RunLog(label="job", path=driver_log)
    progress = Progress(total=total)
    try:
        read_console(run, driver_log)
        marked: list[str] = []
        synced: list[str] = []
        errors = _read_errors(driver_log, progress, marked, synced)
    except OSError as exc:
        raise Rollout8Error(f"{driver_log}: cannot read ({exc.strerror or exc})") from exc
    progress.trained = sorted(s for s, m in run.steps.items() if STEP_TIME in m and s > 0)
    if progress.trained:
        last = run.steps[progress.trained[-1]]
        progress.step_time_s = last.get(STEP_TIME)
        progress.reward = next((last[k] for k in REWARD_KEYS if k in last), None)
    try:
        marked = communicator.with_worker_logs(marked, driver_log.parent)
        synced = communicator.with_worker_logs(synced, driver_log.parent, sync_timing.MARKER)
    except OSError as exc:
        raise Rollout8Error(f"{driver_log.parent}: cannot read a worker log ({exc.strerror or exc})") from exc
    progress.sync = sync_timing.summary(sync_timing.read_lines(synced))
    groups = communicator.read_groups(marked)
    if groups:
        progress.joined = ", ".join(f"{len(g.joined)} of {g.world}" for g in groups)
        progress.communicator = communicator.problems(groups, now, after_s, npus_per_node, nodes)
    if errors:
        progress.cause = errors[-1][:400]
        progress.ips = sorted({ip for line in errors for ip in _IP.findall(line)})
    return progress


def _read_errors(driver_log: Path, progress: Progress, marked: list[str], synced: list[str]) -> list[str]:
    """The driver's error lines; the resume step and checkpoint folder go to `progress` on the way, the ranks'
    communicator lines to `marked`, their weight-sync lines to `synced`."""
    errors: list[str] = []
    with open(driver_log, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if communicator.MARKER in line:
                marked.append(line)
                continue
            if sync_timing.MARKER in line:
                synced.append(line)
                continue
            if (m := _RESUMED.search(line)) is not None:
                progress.resumed_from = int(m.group(1))
            if (m := _CKPT_FOLDER.search(line)) is not None:
                progress.checkpoint = m.group(1)
            if is_error_line(line):
                errors.append(line.strip())
    return errors


def is_error_line(line: str) -> bool:
    """A line of the driver's that can be its cause: it names an error, and is no verl metrics line."""
    return _ERROR.search(line) is not None and "step:" not in line


def progress_line(job: str, state: str, p: Progress) -> str:
    """One line: `job J RUNNING: step 3 of 4, reward 0.31, step time 3.9 s (resumed from the step-2 checkpoint)`."""
    of = f" of {p.total}" if p.total else ""
    if p.last_step is None:
        where = "no training step logged yet"
    else:
        where = f"step {p.last_step}{of}"
        if p.reward is not None:
            where += f", reward {p.reward:.4g}"
        if p.step_time_s is not None:
            where += f", step time {p.step_time_s:.3g} s"
    if p.resumed_from:
        where += f" (resumed from the step-{p.resumed_from} checkpoint)"
    stuck = "".join(f"; {line}" for line in p.communicator)
    return f"job {job} {state}: {where}{stuck}"
