"""The weight-sync part of `rollout8 report` (rollout8.results.report): per run, the mean of each part of a sync
from the ranks' `rollout8: sync` lines (rollout8.results.sync_timing), a table, a stacked picture of the step
(generation, sync by part, actor update, the rest) and the part whose mean differs most from the baseline's."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from . import communicator, sync_timing
from .verl_logs import RunLog, _walk


def run_syncs(path: Path) -> list[sync_timing.SyncRecord]:
    """The sync lines of a run: a log file (and the worker logs collected beside it) or every file under a run's
    directory (bounded as the metrics' walk)."""
    if path.is_file():
        return sync_timing.read(path)
    lines: list[str] = []
    for file in _walk(path):
        try:
            lines += communicator.marked_lines(file, sync_timing.MARKER)
        except OSError:
            continue
    return sync_timing.read_lines(lines)


def sync_section(runs: list[RunLog], syncs: dict[str, sync_timing.Means | None], baseline: RunLog,
                 notes: list[str]) -> tuple[str, list[str]]:
    """The weight-sync table (HTML) and the sentences naming the largest difference to the baseline."""
    if not any(syncs.values()):
        notes.append("weight sync: no run has `rollout8: sync` lines (an image without rollout8's sync timing, "
                     "ROLLOUT8_SYNC_TIMING=0, or only the first sync)")
        return "", []
    head = ["run", "quant", "syncs"] + [sync_timing.LABELS[p] for p in sync_timing.PARTS] + [
        "total (s)", "MB sent", "MB loaded", "timing overhead (s)"]
    body = []
    for run in runs:
        m = syncs.get(run.label)
        if m is None:
            notes.append(f"weight sync: {run.label} has no sync after the first")
            continue
        cells = [html.escape(run.label), html.escape(m.quant), str(m.syncs)]
        cells += [f"{m.parts[p]:.4g}" for p in sync_timing.PARTS]
        cells += [f"{m.total:.4g}", f"{m.bytes / 1e6:.4g}", f"{m.loaded_bytes / 1e6:.4g}", f"{m.overhead:.2g}"]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    findings = []
    base = syncs.get(baseline.label)
    for run in runs:
        m = syncs.get(run.label)
        if run is baseline or m is None or base is None:
            continue
        part, diff = sync_timing.largest_difference(m, base)
        ratio = f", sync total {m.total / base.total:.3g}x" if base.total > 0 else ""
        findings.append(f"{run.label} vs {baseline.label}: the largest difference is {sync_timing.LABELS[part]} "
                        f"({diff:+.3g} s per sync{ratio})")
    table = (f"<h2>Weight sync by part</h2><table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>"
             f"{''.join(body)}</table>" + "".join(f"<p><b>{html.escape(f)}</b></p>" for f in findings)
             + "<p><small>Mean seconds per sync and rollout rank, each rank's first sync(s) left out (the engine's "
             "warm-up), from the ranks' `rollout8: sync` lines.</small></p>")
    return table, findings


def draw_step_parts(path: Path, runs: list[RunLog], syncs: dict[str, sync_timing.Means | None], skip_first: int,
                    step_means: dict[str, tuple[float | None, float | None, float | None]]) -> bool:
    """One horizontal stacked bar per run: mean generation, each sync part, actor update and the rest of a step.
    `step_means`: per run label, the mean step time, generation time and actor update time (report.py's)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    bars = []
    for run in runs:
        m = syncs.get(run.label)
        step, gen, update = step_means.get(run.label, (None, None, None))
        if m is None or step is None:
            continue
        segments = [("generation", gen or 0.0)] + [(f"sync: {p}", m.parts[p]) for p in sync_timing.PARTS] + [
            ("actor update", update or 0.0)]
        segments.append(("rest of the step", max(step - sum(v for _, v in segments), 0.0)))
        bars.append((f"{run.label} ({run.mode or '?'})", segments))
    if not bars:
        return False
    fig = Figure(figsize=(10, 1.2 + 0.8 * len(bars)), dpi=100, layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    colors = [colormaps["tab10"](i % 10) for i in range(len(bars[0][1]))]
    for y, (_label, segments) in enumerate(bars):
        left = 0.0
        for (name, value), color in zip(segments, colors, strict=True):
            ax.barh(y, value, left=left, color=color, label=name if y == 0 else None)
            left += value
    ax.set_yticks(range(len(bars)), [label for label, _ in bars])
    ax.set_xlabel(f"seconds per step (mean, first {skip_first} step(s) left out)")
    ax.set_title("Where a step's time goes: generation, weight sync by part, actor update", fontsize=10)
    ax.legend(fontsize=7, ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(bars) < 3 else -0.2))
    fig.savefig(path)
    return True


@dataclass
class Section:
    syncs: dict  # run label -> sync_timing.Means | None
    table: str  # HTML, empty when no run has sync lines
    findings: list[str]

    def summary(self) -> dict:
        """summary.json's `sync` (means per run) and `sync_findings`."""
        return {"sync": {label: m.to_json() if m else None for label, m in self.syncs.items()},
                "sync_findings": self.findings}


def section(runs: list[RunLog], run_paths: list[Path], baseline: RunLog, notes: list[str],
            skip_first: int) -> Section:
    syncs = {run.label: sync_timing.means(run_syncs(path), skip_first)
             for run, path in zip(runs, run_paths, strict=True)}
    table, findings = sync_section(runs, syncs, baseline, notes)
    return Section(syncs, table, findings)


def picture(stage: Path, runs: list[RunLog], rows: list, sync: Section, skip_first: int) -> list[tuple[str, Path]]:
    """The stacked picture, from the summary rows' means (report.RunRow: step time, rollout time and its sync
    share, actor update)."""
    step_means = {}
    for row in rows:
        step = row.step_time.mean if row.step_time else None
        gen = row.gen_time.mean if row.gen_time else None
        generation = gen - row.switch_time if gen is not None and row.switch_time is not None else None
        step_means[row.label] = (step, generation, row.update_time)
    path = stage / "sync.png"
    if sync.table and draw_step_parts(path, runs, sync.syncs, skip_first, step_means):
        return [("Step time by part: generation, weight sync by part, actor update", path)]
    return []
