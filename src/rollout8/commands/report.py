"""`rollout8 report`: arguments, output and exit code; the work is rollout8.results.report."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..fileutil import check_output, writing
from ..results.report import build
from . import count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN",
                        help="a run's log directory (searched recursively) or one log file (console or JSONL)")
    parser.add_argument("-o", "--out", type=Path, required=True, metavar="OUT_DIR", help="where to write the report")
    parser.add_argument("--label", action="append", default=[], metavar="NAME",
                        help="label of the n-th run (repeat, in order); default: its directory or file name")
    parser.add_argument("--mode", action="append", default=[], metavar="MODE", choices=("bf16", "int8", "hybrid"),
                        help="rollout mode of the n-th run (bf16, int8, hybrid); default: from its config files")
    parser.add_argument("--config", action="append", default=[], type=Path, metavar="FILE",
                        help="the n-th run's rendered manifest (render.json, rollout8-plan.json), FlashRL YAML or run "
                             "spec: its rollout mode (and a manifest's name as the label)")
    parser.add_argument("--baseline", metavar="LABEL",
                        help="the run speed-ups are measured against; default: the first bf16 run, else the first")
    parser.add_argument("--skip-first", type=count, default=1, metavar="N",
                        help="training steps left out of the step-time means (warm-up; default 1)")
    parser.add_argument("--title", default="rollout8: bf16 vs int8 rollout", help="page title")


def run(args: argparse.Namespace) -> int:
    inputs = {**{f"RUN {path}": path for path in args.runs}, **{f"--config {path}": path for path in args.config}}
    with writing(args.out):  # it may lie inside a run's log directory (nested_ok): logs are not artifacts
        check_output(args.out, inputs=inputs, directory=True, nested_ok=True, what="the report",
                     files=("report.html", "summary.json"))
        summary = build(args.runs, args.out, args.label, args.mode, args.baseline, args.skip_first, args.title,
                        args.config)
    for row in summary["runs"]:
        st = row["step_time"]
        sp = (st or {}).get("speedup")
        extra = f", step-time speed-up {sp['ratio']:.3f}x [{sp['low']:.3f}, {sp['high']:.3f}]" if sp else ""
        vals = [v for v in (row.get("val") or {}).values() if v]
        acc = f", final val {vals[0]['final']:.4g} (best {vals[0]['best']:.4g})" if vals else ""
        print(f"{row['label']} ({row['mode']}): {row['steps']} steps{acc}{extra}")
    for note in summary["notes"]:
        print(f"note: {note}")
    print(f"wrote {args.out / 'report.html'}")
    return 0

