"""`rollout8 report RUN_A RUN_B ... -o OUT_DIR`: bf16 vs int8 (vs hybrid) from verl's training logs.

Writes OUT_DIR/report.html (self-contained: the pictures are embedded), the same pictures as PNG files, and
OUT_DIR/summary.json. Metric names are verl's at the pinned commit (51d2104, same as v0.6.1 for these):
- validation: `val-core/<data_source>/<acc|reward>/mean@N` (ray_trainer._validate)
- training: `critic/rewards/mean`, `critic/score/mean`, `response_length/mean` (metric_utils.compute_data_metrics)
- time: `timing_s/step`, `timing_s/gen` (weight sync + generation), `timing_s/generate_sequences`
  (generation only, from the rollout worker), `perf/throughput` (tokens/s per device), `perf/time_per_step`
- rollout correction (TIS): `rollout_corr/*` (rollout_corr_helper), `training/rollout_probs_diff_*`
  (verl.utils.debug.metrics, logged when the rollout returns log-probs)
- weight sync by part: the ranks' `rollout8: sync` lines (rollout8.results.report_sync)
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import Rollout8Error
from ..fileutil import json_safe, staged_files
from . import report_sync
from .verl_logs import RunLog, load_run, mode_from_config, read_manifest

VAL_CORE = re.compile(r"^val-core/(?P<source>.+)/(?P<var>[^/]+)/mean@(?P<n>\d+)$")
VAL_LEGACY = re.compile(r"^val/test_score/(?P<source>.+)$")

STEP_TIME = ("timing_s/step", "perf/time_per_step")
GEN_TIME = ("timing_s/gen",)
GEN_ONLY = ("timing_s/generate_sequences",)
UPDATE_TIME = ("timing_s/update_actor",)
THROUGHPUT = ("perf/throughput",)
TRAIN_REWARD = ("critic/rewards/mean", "critic/score/mean")
RESP_LEN = ("response_length/mean",)
TIS_PREFERRED = (
    "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_eff_sample_size",
    "rollout_corr/rollout_is_ratio_fraction_high", "rollout_corr/rollout_is_ratio_fraction_low",
    "rollout_corr/rollout_is_seq_mean", "rollout_corr/rollout_is_seq_max",
    "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/rollout_is_veto_fraction",
    "rollout_corr/kl", "rollout_corr/ppl_ratio", "rollout_corr/log_ppl_abs_diff",
    "rollout_corr/training_ppl", "rollout_corr/rollout_ppl",
    "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max",
)
MAX_TIS_PANELS = 12
BOOTSTRAP_SAMPLES = 2000


# ---------------------------------------------------------------------------------------------- summary
@dataclass(frozen=True)
class Speedup:
    ratio: float  # baseline mean time / run mean time over the steps both have (>1: the run is faster)
    low: float  # 2.5th percentile of a paired bootstrap over those steps
    high: float
    steps: int


@dataclass(frozen=True)
class ValResult:
    """One validation metric of one run: its last and best value, and its value before training."""

    final: float
    final_step: int
    best: float
    best_step: int
    initial: float


@dataclass(frozen=True)
class TimedMetric:
    """A time metric of one run (step time, rollout time) over its timed steps, warm-up left out."""

    key: str  # the verl metric it was read from
    mean: float | None
    steps: int
    compared: bool = False  # measured against the baseline: summary.json then has `speedup` (null: no common step)
    speedup: Speedup | None = None

    def to_dict(self) -> dict:
        out: dict = {"key": self.key, "mean": self.mean, "steps": self.steps}
        if self.compared:
            out["speedup"] = asdict(self.speedup) if self.speedup else None
        return out


@dataclass(frozen=True)
class RunRow:
    """One run's row of the summary table (and of summary.json's `runs`)."""

    label: str
    mode: str
    path: str
    baseline: bool
    steps: int  # training steps logged (step >= 1)
    last_step: int | None
    val: dict[str, ValResult | None] | None  # per validation key; None when no run has one (no `val` in the JSON)
    step_time: TimedMetric | None
    gen_time: TimedMetric | None
    switch_time: float | None  # timing_s/gen - timing_s/generate_sequences: weight sync and engine switch
    update_time: float | None
    throughput: float | None
    response_length: float | None

    def to_dict(self) -> dict:
        """summary.json's row: the same keys, in the same order, as the report has always written."""
        out: dict = {"label": self.label, "mode": self.mode, "path": self.path, "baseline": self.baseline,
                     "steps": self.steps, "last_step": self.last_step}
        if self.val is not None:
            out["val"] = {k: asdict(v) if v else None for k, v in self.val.items()}
        out.update(step_time=self.step_time.to_dict() if self.step_time else None,
                   gen_time=self.gen_time.to_dict() if self.gen_time else None, switch_time=self.switch_time,
                   update_time=self.update_time, throughput=self.throughput, response_length=self.response_length)
        return out


def _first_key(run: RunLog, candidates: tuple[str, ...]) -> str | None:
    keys = run.keys()
    return next((k for k in candidates if k in keys), None)


def val_keys(runs: list[RunLog]) -> list[str]:
    """The main validation metric per data source: val-core .../mean@N with the largest N (acc over reward)."""
    best: dict[str, tuple[int, int, str]] = {}
    for run in runs:
        for key in run.keys():
            match = VAL_CORE.match(key)
            if match:
                rank = (1 if match["var"] == "acc" else 0, int(match["n"]))
                source = match["source"]
            elif VAL_LEGACY.match(key):
                rank, source = (-1, 0), VAL_LEGACY.match(key)["source"]
            else:
                continue
            if source not in best or (rank[0], rank[1]) > best[source][:2]:
                best[source] = (rank[0], rank[1], key)
    return [best[s][2] for s in sorted(best)]


def _mean(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _timed_steps(run: RunLog, key: str, skip_first: int) -> dict[int, float]:
    xs, ys = run.series(key)
    first = min((x for x in xs if x >= 1), default=None)
    return {x: y for x, y in zip(xs, ys, strict=True)
            if x >= 1 and math.isfinite(y) and (first is None or x >= first + skip_first or len(xs) <= skip_first)}


def speedup(base: dict[int, float], other: dict[int, float], seed: int = 0) -> Speedup | None:
    common = sorted(set(base) & set(other))
    if len(common) < 1:
        return None
    import random

    b = [base[s] for s in common]
    o = [other[s] for s in common]
    if sum(o) <= 0:
        return None
    ratio = sum(b) / sum(o)
    rng = random.Random(seed)
    samples = []
    for _ in range(BOOTSTRAP_SAMPLES if len(common) > 1 else 0):
        idx = [rng.randrange(len(common)) for _ in common]
        so = sum(o[i] for i in idx)
        if so > 0:
            samples.append(sum(b[i] for i in idx) / so)
    samples.sort()
    if samples:
        low, high = samples[int(0.025 * (len(samples) - 1))], samples[int(0.975 * (len(samples) - 1))]
    else:
        low = high = ratio
    return Speedup(ratio, low, high, len(common))


def _val_result(run: RunLog, vkey: str) -> ValResult | None:
    xs, ys = run.series(vkey)
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
    if not pairs:
        return None
    best = max(pairs, key=lambda p: p[1])
    return ValResult(final=pairs[-1][1], final_step=pairs[-1][0], best=best[1], best_step=best[0],
                     initial=pairs[0][1])


def _timed_metric(run: RunLog, candidates: tuple[str, ...], baseline: RunLog, base_key: str | None,
                  skip_first: int) -> TimedMetric | None:
    key = _first_key(run, candidates)
    if key is None:
        return None
    timed = _timed_steps(run, key, skip_first)
    compared = bool(base_key) and run is not baseline
    sp = speedup(_timed_steps(baseline, base_key, skip_first), timed) if compared else None
    return TimedMetric(key, _mean(list(timed.values())), len(timed), compared, sp)


def _mean_of(run: RunLog, candidates: tuple[str, ...], skip_first: int) -> float | None:
    key = _first_key(run, candidates)
    return _mean(list(_timed_steps(run, key, skip_first).values())) if key else None


def summarize(runs: list[RunLog], baseline: RunLog, skip_first: int) -> tuple[list[RunRow], list[str]]:
    rows: list[RunRow] = []
    notes: list[str] = []
    vkeys = val_keys(runs)
    base_step_key = _first_key(baseline, STEP_TIME)
    base_gen_key = _first_key(baseline, GEN_TIME)
    longest = max((r.last_step or 0) for r in runs)
    for run in runs:
        if run.last_step is not None and run.last_step < longest:
            notes.append(f"{run.label}: stops at step {run.last_step} while the longest run reaches {longest} "
                         "(interrupted?); its means cover the steps it has")
        gen_key, only_key = _first_key(run, GEN_TIME), _first_key(run, GEN_ONLY)
        switch_time = None
        if gen_key and only_key:
            gen, only = _timed_steps(run, gen_key, skip_first), _timed_steps(run, only_key, skip_first)
            switch_time = _mean([gen[s] - only[s] for s in gen if s in only])
        key = _first_key(run, RESP_LEN)
        rows.append(RunRow(
            label=run.label, mode=run.mode or "unknown", path=str(run.path), baseline=run is baseline,
            steps=len([s for s in run.steps if s >= 1]), last_step=run.last_step,
            val={vkey: _val_result(run, vkey) for vkey in vkeys} if vkeys else None,
            step_time=_timed_metric(run, STEP_TIME, baseline, base_step_key, skip_first),
            gen_time=_timed_metric(run, GEN_TIME, baseline, base_gen_key, skip_first),
            switch_time=switch_time, update_time=_mean_of(run, UPDATE_TIME, skip_first),
            throughput=_mean_of(run, THROUGHPUT, skip_first),
            response_length=_mean(run.series(key)[1]) if key else None))
    return rows, notes


# ---------------------------------------------------------------------------------------------- pictures
@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    keys: tuple[str, ...]  # first present key per run
    dashed: tuple[str, ...] = ()  # a second series per run, dashed (e.g. generation only)


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def draw(path: Path, title: str, panels: list[Panel], runs: list[RunLog], notes: list[str]) -> bool:
    """One PNG with a column of panels, every run on the same axes. Returns False if no panel had data."""
    from matplotlib.figure import Figure

    drawable = []
    missing_by_run: dict[str, list[str]] = {}
    for panel in panels:
        have = [r for r in runs if _first_key(r, panel.keys)]
        wanted = " or ".join(f"`{k}`" for k in panel.keys)
        if not have:
            notes.append(f"{title}: no run has {wanted}; panel left out")
            continue
        for run in runs:
            if run not in have:
                missing_by_run.setdefault(run.label, []).append(wanted)
        drawable.append(panel)
    for label, missing in missing_by_run.items():
        notes.append(f"{title}: {label} has no {', '.join(missing)}")
    if not drawable:
        return False
    cols = 1 if len(drawable) == 1 else 2 if len(drawable) <= 4 else 3
    rows = math.ceil(len(drawable) / cols)
    fig = Figure(figsize=(6.4 * cols, 3.2 * rows), dpi=100, layout="constrained")
    fig.suptitle(title)
    colors = _colors(len(runs))
    for i, panel in enumerate(drawable):
        ax = fig.add_subplot(rows, cols, i + 1)
        for run, color in zip(runs, colors, strict=True):
            key = _first_key(run, panel.keys)
            if key:
                xs, ys = run.series(key)
                ys = [y if math.isfinite(y) else math.nan for y in ys]  # an inf would wreck the shared y axis
                ax.plot(xs, ys, color=color, marker="o" if len(xs) < 30 else None, markersize=3,
                        label=f"{run.label} ({run.mode or '?'})")
            dkey = _first_key(run, panel.dashed) if panel.dashed else None
            if dkey:
                xs, ys = run.series(dkey)
                ax.plot(xs, ys, color=color, linestyle="--", linewidth=1, label=f"{run.label}: {dkey.split('/')[-1]}")
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.savefig(path)
    return True


def figures(runs: list[RunLog], out: Path, notes: list[str]) -> list[tuple[str, Path]]:
    vkeys = val_keys(runs)
    sets: list[tuple[str, str, list[Panel]]] = [
        ("accuracy", "Accuracy: validation and training reward",
         [Panel(f"validation: {k}", "score", (k,)) for k in vkeys]
         + [Panel("training reward (critic/rewards/mean)", "reward", TRAIN_REWARD)]),
        ("response_length", "Response length", [Panel("response_length/mean", "tokens", RESP_LEN)]),
        ("time", "Step time and its rollout part",
         [Panel("step time (timing_s/step)", "seconds", STEP_TIME),
          Panel("rollout: timing_s/gen (sync + generation), dashed: generate_sequences", "seconds",
                GEN_TIME, GEN_ONLY),
          Panel("actor update (timing_s/update_actor)", "seconds", UPDATE_TIME)]),
        ("throughput", "Throughput", [Panel("perf/throughput", "tokens/s per device", THROUGHPUT)]),
    ]
    if not vkeys:
        notes.append("validation: no run has `val-core/<data_source>/<acc|reward>/mean@N` (validation off, "
                     "or trainer.test_freq larger than the run)")
    tis_keys = sorted({k for r in runs for k in r.keys()
                       if k.startswith("rollout_corr/") or k.startswith("training/rollout_probs_diff")},
                      key=lambda k: (TIS_PREFERRED.index(k) if k in TIS_PREFERRED else len(TIS_PREFERRED), k))
    tis_keys = [k for k in tis_keys if not k.endswith("_valid")][:MAX_TIS_PANELS]
    if tis_keys:
        sets.append(("rollout_correction", "Rollout correction (TIS): trainer vs rollout policy",
                     [Panel(k, "", (k,)) for k in tis_keys]))
    else:
        notes.append("rollout correction: no run has `rollout_corr/*` or `training/rollout_probs_diff_*` "
                     "(set actor_rollout_ref.rollout.calculate_log_probs=True and algorithm.rollout_correction.*)")
    written = []
    for name, title, panels in sets:
        path = out / f"{name}.png"
        if draw(path, title, panels, runs, notes):
            written.append((title, path))
    return written


# ---------------------------------------------------------------------------------------------- page
def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return html.escape(str(value))


def _speedup_cell(cell: TimedMetric | None) -> str:
    if not cell or cell.mean is None:
        return "&ndash;"
    text = f"{cell.mean:.4g} s"
    sp = cell.speedup
    if sp:
        change = (1 / sp.ratio - 1) * 100
        text += (f"<br><b>{sp.ratio:.3f}x</b> [{sp.low:.3f}, {sp.high:.3f}]"
                 f"<br><small>{change:+.1f}% time, {sp.steps} paired steps</small>")
    return text


def render_html(title: str, runs: list[RunLog], rows: list[RunRow], notes: list[str],
                pictures: list[tuple[str, Path]], skip_first: int, sync_table: str = "") -> str:
    vkeys = val_keys(runs)
    head = ["run", "mode", "steps (last)"]
    for key in vkeys:
        head += [f"final {html.escape(key)}", "best (step)"]
    head += ["mean step time, speed-up", "mean rollout time (timing_s/gen), speed-up",
             "of which weight sync and engine switch (s)", "actor update (timing_s/update_actor, s)",
             "tokens/s/device", "mean response length"]
    body = []
    base_row = next(r for r in rows if r.baseline)
    for row in rows:
        cells = [html.escape(row.label) + (" <small>(baseline)</small>" if row.baseline else ""),
                 html.escape(row.mode), f"{row.steps} ({_fmt(row.last_step)})"]
        for key in vkeys:
            val = (row.val or {}).get(key)
            base = (base_row.val or {}).get(key)
            delta = (f" <small>({val.final - base.final:+.4f})</small>"
                     if val and base and row is not base_row else "")
            cells += [_fmt(val.final) + delta if val else "&ndash;",
                      f"{_fmt(val.best)} ({val.best_step})" if val else "&ndash;"]
        cells += [_speedup_cell(row.step_time), _speedup_cell(row.gen_time), _fmt(row.switch_time),
                  _fmt(row.update_time), _fmt(row.throughput), _fmt(row.response_length)]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    imgs = []
    for caption, path in pictures:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        imgs.append(f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(caption)}">'
                    f'<figcaption>{html.escape(caption)} &middot; <a href="{html.escape(path.name)}">'
                    f"{html.escape(path.name)}</a></figcaption></figure>")
    sources = "".join(
        f"<li><b>{html.escape(r.label)}</b> ({html.escape(r.mode or 'mode unknown')}"
        f"{', from ' + html.escape(r.mode_source) if r.mode_source else ''}): "
        f"{html.escape('; '.join(r.files) or 'no metrics found')}</li>" for r in runs)
    note_items = "".join(f"<li>{html.escape(n)}</li>" for n in notes) or "<li>none</li>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1400px; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #bbb; padding: 4px 8px; vertical-align: top; }}
th {{ background: #eee; }} img {{ max-width: 100%; }} figure {{ margin: 1em 0; }}
.notes li {{ color: #8a4b00; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<h2>Summary</h2>
<table><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>
{"".join(body)}
</table>
<p><small>Speed-up = baseline mean time / run mean time over the training steps both runs logged (&gt;1: faster),
first {skip_first} step(s) left out as warm-up; in brackets a 95% paired bootstrap interval over those steps.
In brackets after a final accuracy: the difference to the baseline's.
timing_s/gen includes the weight sync into the rollout engine and the engine's wake-up/sleep; generate_sequences
is generation alone; the column after it is their difference.</small></p>
{sync_table}
<h2>Notes</h2><ul class="notes">{note_items}</ul>
<h2>Pictures</h2>
{"".join(imgs)}
<h2>Sources</h2><ul>{sources}</ul>
<div id="status" data-images="{len(imgs)}"></div>
<script>
window.addEventListener("load", function () {{
  var imgs = document.getElementsByTagName("img"), ok = 0;
  for (var i = 0; i < imgs.length; i++) {{ if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++; }}
  document.getElementById("status").textContent = "images-loaded:" + ok + "/" + imgs.length;
}});
</script>
</body></html>
"""


# ---------------------------------------------------------------------------------------------- command
def build(run_paths: list[Path], out: Path, labels: list[str] | None = None, modes: list[str] | None = None,
          baseline_label: str | None = None, skip_first: int = 1,
          title: str = "rollout8: bf16 vs int8 rollout", configs: list[Path] | None = None) -> dict:
    """Read the runs, write report.html, the PNGs and summary.json into `out`; return the summary."""
    labels, modes, configs = labels or [], modes or [], configs or []
    for option, values in (("--label", labels), ("--mode", modes), ("--config", configs)):
        if len(values) > len(run_paths):
            raise Rollout8Error(f"{len(values)} {option} values for {len(run_paths)} runs: give at most one per run")
    runs = []
    for i, path in enumerate(run_paths):
        if not path.exists():
            raise Rollout8Error(f"run {path}: no such file or directory")
        label = labels[i] if i < len(labels) else None
        config_mode = None
        if i < len(configs):
            config_mode = mode_from_config(configs[i]) if configs[i].is_file() else None
            if config_mode is None:
                raise Rollout8Error(f"--config {configs[i]}: not a rollout8 render/plan manifest, FlashRL config or "
                                    "run spec (or missing)")
            manifest = read_manifest(configs[i]) if configs[i].suffix == ".json" else None
            if label is None and manifest and isinstance(manifest.get("name"), str):
                label = manifest["name"]
        run = load_run(path, label)
        if config_mode:
            run.mode, run.mode_source = config_mode
        if i < len(modes):
            run.mode, run.mode_source = modes[i], "--mode"
        if not run.steps:
            raise Rollout8Error(
                f"run {path}: no verl metrics found (looked for console lines 'step:N - key:value' in "
                f"{'/'.join(sorted(s.lstrip('.') for s in ('.log', '.txt', '.out', '.err')))} files, the JSONL file "
                "logger and tensorboard event files): pass the directory holding that run's training logs")
        runs.append(run)
    seen: dict[str, int] = {}
    for run in runs:  # distinct labels, or the legend and table are ambiguous
        if run.label in seen:
            seen[run.label] += 1
            run.label = f"{run.label}#{seen[run.label]}"
        else:
            seen[run.label] = 1
    if baseline_label:
        matches = [r for r in runs if r.label == baseline_label]
        if not matches:
            raise Rollout8Error(f"--baseline {baseline_label}: no run has that label "
                                f"(labels: {', '.join(r.label for r in runs)})")
        baseline = matches[0]
    else:
        baseline = next((r for r in runs if r.mode == "bf16"), runs[0])
    notes = [f"{r.label}: {n}" for r in runs for n in r.notes]
    for run in runs:
        if run.mode is None:
            notes.append(f"{run.label}: rollout mode unknown (no FlashRL config, run spec or FlashRL log line "
                         "found); pass --mode")
    rows, summary_notes = summarize(runs, baseline, skip_first)
    notes += summary_notes
    sync = report_sync.section(runs, run_paths, baseline, notes, skip_first)
    # Everything is written beside OUT first and moved in only once complete (report.html last): a failure
    # half-way leaves OUT as it was, never PNGs without their page.
    with staged_files(out) as stage:
        pictures = figures(runs, stage, notes)
        pictures += report_sync.picture(stage, runs, rows, sync, skip_first)
        page = render_html(title, runs, rows, notes, pictures, skip_first, sync.table)
        summary = {"title": title, "baseline": baseline.label, "skip_first": skip_first,
                   "runs": [row.to_dict() for row in rows], **sync.summary(),
                   "notes": notes, "pictures": [p.name for _, p in pictures]}
        (stage / "summary.json").write_text(json.dumps(json_safe(summary), indent=2), encoding="utf-8")
        (stage / "report.html").write_text(page, encoding="utf-8")
    return summary

