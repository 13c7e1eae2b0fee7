"""Read the metrics of one verl training run from whatever its loggers left behind.

verl's `Tracking` (verl/utils/tracking.py) writes the same `metrics` dict, once per step, to each backend in
`trainer.logger`:
- console: `LocalLogger` prints `concat_dict_to_str(data, step)`, i.e. `step:N - key:pformat(value) - ...` for the
  numeric values only. Under Ray the line carries a prefix such as `(TaskRunner pid=123) `. With numpy 2,
  `pformat(np.float64(x))` is `np.float64(x)`.
- file: `FileLogger` writes one JSON object per call, `{"step": N, "data": {...}}`, to
  `$VERL_FILE_LOGGER_PATH` or `$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl`. It opens the file with "w"
  and never flushes explicitly, so a restarted run overwrites it and a killed one may end mid-line.
- tensorboard: `add_scalar(key, value, step)` into `events.out.tfevents.*` (read by rollout8.tfevents).

The initial validation is logged at step 0 (or at the resumed step), the training steps from 1. A restarted
run logs some steps again: for each (step, key) the value read last wins, and the report says which steps.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import Rollout8Error
from ..yamlio import read_yaml
from . import tfevents

CONSOLE_SUFFIXES = {".log", ".txt", ".out", ".err", ".stdout", ".stderr"}
MAX_FILES = 5000  # bound the directory walk

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# `step:N` not preceded by a word char or '/', so `training/global_step:3` is not a line start.
_CONSOLE = re.compile(r"(?<![\w/])step:(-?\d+)((?: - .*)?)$")
_WRAPPED = re.compile(r"^[A-Za-z_][\w.]*\((.*)\)$")  # np.float64(0.5), np.int64(3), torch-free numpy reprs
_RAY_DEDUP = re.compile(r" \[repeated \d+x across cluster\]$")  # Ray's log deduplication suffix
_FLASHRL_FN = re.compile(r"flash_rl config: fn: (\w+)")


@dataclass
class RunLog:
    """The metrics of one run: step -> {metric key -> value}, plus what was read and what looked wrong."""

    label: str
    path: Path
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mode: str | None = None
    mode_source: str = ""
    relogged_steps: set[int] = field(default_factory=set)
    flashrl_fns: set[str] = field(default_factory=set)

    def put(self, step: int, key: str, value: float) -> None:
        metrics = self.steps.setdefault(step, {})
        old = metrics.get(key)
        if old is not None and not _same(old, value):
            self.relogged_steps.add(step)
        metrics[key] = value

    def keys(self) -> set[str]:
        return {key for metrics in self.steps.values() for key in metrics}

    def series(self, key: str) -> tuple[list[int], list[float]]:
        xs = sorted(step for step, metrics in self.steps.items() if key in metrics)
        return xs, [self.steps[s][key] for s in xs]

    @property
    def last_step(self) -> int | None:
        return max(self.steps) if self.steps else None


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def parse_value(text: str) -> float | None:
    """A value as verl's console logger prints it (pprint.pformat of a numbers.Number), or None."""
    text = text.strip()
    wrapped = _WRAPPED.match(text)
    if wrapped:
        text = wrapped.group(1).strip()
    if text in ("True", "np.True_"):
        return 1.0
    if text in ("False", "np.False_"):
        return 0.0
    try:
        return float(text)
    except ValueError:
        return None


def parse_console_line(line: str) -> tuple[int, dict[str, float], list[str]] | None:
    """(step, metrics, unparsed items) for a verl console metrics line, or None if the line is something else."""
    match = _CONSOLE.search(_RAY_DEDUP.sub("", _ANSI.sub("", line.rstrip("\r\n"))))
    if not match:
        return None
    step = int(match.group(1))
    metrics: dict[str, float] = {}
    bad: list[str] = []
    rest = match.group(2)
    for item in rest[3:].split(" - ") if rest else []:
        key, sep, raw = item.rpartition(":")
        value = parse_value(raw) if sep and key else None
        if value is None:
            bad.append(item)
        else:
            metrics[key.strip()] = value
    return step, metrics, bad


def _has_console_metrics(path: Path) -> bool:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return any("step:" in line and parse_console_line(line) for line in fh)


def read_console(run: RunLog, path: Path, metrics: bool = True) -> int:
    """Add the console metrics lines of one text file to `run`; returns how many lines were found.

    FlashRL's `flash_rl config: fn: <fn>` lines are collected too (for the rollout mode); metrics=False reads
    only those.
    """
    found = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if "step:" not in line or not metrics:
                fn = _FLASHRL_FN.search(line) if "flash_rl" in line else None
                if fn:
                    run.flashrl_fns.add(fn.group(1))
                continue
            parsed = parse_console_line(line)
            if parsed is None:
                continue
            step, metrics, bad = parsed
            found += 1
            for key, value in metrics.items():
                run.put(step, key, value)
            if bad:
                shown = ", ".join(repr(b[:60]) for b in bad[:3])
                run.notes.append(f"{path.name}:{lineno}: step {step}: could not read {shown} "
                                 "(line cut short by an interrupted run?); the rest of the line is used")
    return found


def read_jsonl(run: RunLog, path: Path) -> int:
    """Add the records of a verl FileLogger JSONL file to `run`; returns how many records were read."""
    found = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.readlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            where = "last line" if lineno == len(lines) else f"line {lineno}"
            run.notes.append(f"{path.name}: {where} is not complete JSON (file cut short by an interrupted run?); "
                             "skipped")
            continue
        if not isinstance(record, dict) or not isinstance(record.get("data"), dict) or "step" not in record:
            continue
        try:
            step = int(record["step"])
        except (TypeError, ValueError, OverflowError):  # OverflowError: a step of Infinity (JSON allows it)
            continue
        found += 1
        for key, value in record["data"].items():
            if isinstance(value, bool):
                value = float(value)
            if isinstance(value, int | float):
                run.put(step, key, float(value))
    return found


def read_tensorboard(run: RunLog, path: Path) -> int:
    scalars, note = tfevents.read_scalars(path)
    for step, tag, value in scalars:
        run.put(step, tag, value)
    if note:
        run.notes.append(f"{path.name}: {note}")
    return len(scalars)


def _is_jsonl_logger(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.strip():
                    record = json.loads(line)
                    return isinstance(record, dict) and "step" in record and isinstance(record.get("data"), dict)
    except (OSError, json.JSONDecodeError):
        return False
    return False


def _walk(root: Path) -> list[Path]:
    """The regular files under root, sorted (a named pipe, socket or device is skipped: a read would block on it)."""
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if not (Path(dirpath) / name).is_file():
                continue
            files.append(Path(dirpath) / name)
            if len(files) >= MAX_FILES:
                return files
    return files


def _mode_from_yaml(path: Path) -> tuple[str, str] | None:
    """(mode, why) from a FlashRL config (`configs: [{fn: ...}]`) or a rollout8 run spec (`rollout.quantization`)."""
    # Strict like every other read of these files: the two kinds that say something here are rollout8's own (the
    # FlashRL config `rollout8 setup`/`render` wrote, a run spec), which the product refuses with a key given twice,
    # so a copy that has one did not run as read; verl's own YAML in a log tree (hydra's .hydra/*.yaml, written by
    # OmegaConf: UTF-8, string keys, no duplicates) reads the same, and a file that fails is skipped as a file that
    # is not YAML always was (it cannot hold a mode then).
    try:
        data = read_yaml(path, what="YAML file", max_bytes=1_000_000)
    except (OSError, Rollout8Error):
        return None
    if not isinstance(data, dict):
        return None
    configs = data.get("configs")
    if isinstance(configs, list) and configs and all(isinstance(c, dict) and "fn" in c for c in configs):
        return mode_from_fns({str(c["fn"]) for c in configs}), f"FlashRL config {path.name}"
    rollout = data.get("rollout")
    if isinstance(rollout, dict) and isinstance(rollout.get("quantization"), str):
        return rollout["quantization"], f"run spec {path.name} (rollout.quantization)"
    return None


MANIFESTS = ("render.json", "rollout8-plan.json")  # `rollout8 render` and `rollout8 plan` outputs


def read_manifest(path: Path) -> dict | None:
    """A rollout8 render/plan manifest ({"schema": 1, "name": ..., "quantization": ...}), or None."""
    try:
        if path.stat().st_size > 5_000_000:
            return None
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, json.JSONDecodeError):
        return None
    if isinstance(data, dict) and "schema" in data and isinstance(data.get("quantization"), str):
        return data
    return None


def mode_from_config(path: Path) -> tuple[str, str] | None:
    """(mode, why) from a rendered manifest, a FlashRL config or a run spec; None if `path` is none of them."""
    if path.suffix == ".json":
        data = read_manifest(path)
        return (data["quantization"], f"rendered manifest {path.name}") if data else None
    if path.suffix in (".yaml", ".yml"):
        return _mode_from_yaml(path)
    return None


def is_driver_log(path: Path) -> bool:
    """A job's driver log: the verify play's <job>/driver.log, or Ray's session_*/logs/job-driver-<id>.log."""
    return path.name == "driver.log" or (path.name.startswith("job-driver-") and path.suffix == ".log")


def path_problem(path: Path) -> str | None:
    """One line saying why `path` cannot be opened (a missing file, a symbolic link that loops or points at
    nothing, a directory one cannot enter), or None when it is there. Never follows a loop: one stat call."""
    try:
        os.stat(path)
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{path}: a symbolic link loop (the link leads back to itself): nothing to read there"
        if os.path.islink(path):
            return f"{path}: a symbolic link to {os.readlink(path)}, which does not exist"
        if exc.errno == errno.ENOENT:
            return f"{path}: no such file or directory"
        return f"{path}: {exc.strerror or exc}"


def _is_ray_worker_log(path: Path) -> bool:
    return path.name.startswith(("worker-", "python-core-worker-")) and path.suffix in (".out", ".err", ".log")


def mode_from_fns(fns: set[str]) -> str:
    if len(fns) == 1:
        return next(iter(fns))
    return "hybrid (" + "+".join(sorted(fns)) + ")"


def load_run(path: Path, label: str | None = None) -> RunLog:
    """Read every verl log of one run: a directory (searched recursively) or a single log file."""
    path = Path(path)
    run = RunLog(label=label or (path.stem if path.is_file() else path.name) or str(path), path=path)
    candidates = [path] if path.is_file() else _walk(path)
    if len(candidates) >= MAX_FILES:
        run.notes.append(f"only the first {MAX_FILES} files under {path} were looked at")
    # Oldest first, so that for a step logged in two files (a restarted run) the newer file wins.
    candidates.sort(key=lambda p: (p.stat().st_mtime, str(p)))
    # Collected Ray session logs hold every job since `ray start` (an earlier run, the probe job...); the job's
    # driver log holds only this job's TaskRunner output. If there is one, metrics come from it, not the workers.
    drivers = [f for f in candidates if is_driver_log(f) and _has_console_metrics(f)]
    skipped_workers = 0
    modes: list[tuple[str, str]] = []
    for file in candidates:
        name = file.name
        count = 0
        if drivers and _is_ray_worker_log(file):
            skipped_workers += 1
            read_console(run, file, metrics=False)  # FlashRL's per-rank lines are only there
            continue
        if name in MANIFESTS:
            found = mode_from_config(file)
            if found:
                modes.insert(0, found)  # the rendered manifest is the most direct statement of the mode
            continue
        if name.startswith("events.out.tfevents"):
            count = read_tensorboard(run, file)
            kind = "tensorboard"
        elif file.suffix == ".jsonl" and _is_jsonl_logger(file):
            count = read_jsonl(run, file)
            kind = "jsonl"
        elif file.suffix in (".yaml", ".yml"):
            found = _mode_from_yaml(file)
            if found:
                modes.append(found)
            continue
        elif file.suffix in CONSOLE_SUFFIXES or file == path:
            count = read_console(run, file)
            kind = "console"
        else:
            continue
        if count:
            run.files.append(f"{file.relative_to(path) if file != path else file.name} ({kind}, {count} records)")
    if skipped_workers:
        run.notes.append(f"metrics read from the Ray job driver log ({', '.join(f.name for f in drivers)}); "
                         f"{skipped_workers} Ray worker log file(s) used only for FlashRL lines (they may hold "
                         "other jobs' output)")
    if run.relogged_steps:
        steps = sorted(run.relogged_steps)
        shown = ", ".join(map(str, steps[:12])) + (" ..." if len(steps) > 12 else "")
        run.notes.append(f"steps logged more than once with different values (restarted run?): {shown}; "
                         "the values read last are used")
    if modes:
        run.mode, run.mode_source = modes[0]
        if len({m for m, _ in modes}) > 1:
            run.notes.append("config files disagree on the rollout mode: "
                             + "; ".join(f"{m} from {why}" for m, why in modes) + f"; using {modes[0][0]}")
    elif run.flashrl_fns:
        run.mode, run.mode_source = mode_from_fns(run.flashrl_fns), "FlashRL log lines"
    return run
