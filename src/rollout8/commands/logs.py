"""`rollout8 logs`: arguments, output and exit code; the work is rollout8.results.verdict."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import CheckFailed, Rollout8Error
from ..results.verdict import scan, verdict
from . import count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="a Ray session dir, a directory of collected logs, or one log file")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.add_argument("--job", metavar="RUN", help="with the logs of several runs (Ray sessions, or jobs collected "
                        "by the verify play): judge this one, by its directory name; default: the newest")
    parser.add_argument("--min-syncs", type=count, default=0,
                        help="also require at least this many quantized syncs on every int8 rank")
    parser.add_argument("--steps", type=count, default=None,
                        help="the run's training steps: require exactly one quantized sync per step on every "
                             "int8 rank (verl's sync rollout loads the actor's weights once per step)")


def _host_dir(root: Path, source: str) -> str:
    """' in HOST' for a worker log collected under ROOT/HOST/... (the verify play's layout), else ''."""
    try:
        parts = Path(source).relative_to(root).parts
    except ValueError:
        return ""
    if len(parts) > 1 and (root / parts[0] / "driver.log").is_file():  # ROOT holds several jobs' logs
        parts = parts[1:]
    return f" in {parts[0]}" if "logs" in parts[1:-1] else ""


def run(args: argparse.Namespace) -> int:
    path = Path(args.directory)
    if not path.exists():
        raise Rollout8Error(f"{path}: no such file or directory")
    report = verdict(scan(path, args.job))
    for r in report["ranks"]:
        if r["status"] != "patched":
            continue
        if r["syncs"] < args.min_syncs:
            report["ok"] = False
            r["reason"] += f" (fewer than --min-syncs {args.min_syncs})"
        if args.steps is not None and r["syncs"] != args.steps:
            report["ok"] = False
            r["reason"] += f" (expected one per training step: {args.steps})"
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        if report["judged"]:
            line = f"judging {report['judged']}"
            others = [r for r in report["runs"] if r != report["judged"]]
            if others:
                line += (" (the newest)" if not args.job else "") + \
                    f"; also in {path}: {', '.join(others)} (pick one with --job)"
            print(line)
        for r in report["ranks"]:
            who = f"rank {r['rank']}" if r["rank"] is not None else "rank ?"
            where = f"pid {r['pid']}" + (f" on {r['ip']}" if r["ip"] else _host_dir(path, r["source"])) \
                if r["pid"] else r["source"]
            print(f"{who:>9} ({where}): {r['status']}: {r['reason']}")
        if not report["ranks"]:
            print(f"no rollout rank found in {report['files']} file(s): are these the workers' logs, with "
                  "FLASHRL_LOGGING_LEVEL=DEBUG?")
        print(f"{report['rollout_ranks']} rollout rank(s): {report['patched']} int8-patched, {report['bf16']} bf16 by "
              f"config, {report['no_config']} never saw the config, {report['errors']} failed, "
              f"{report['incomplete']} incomplete"
              + (f", {report['async']} async rollout server(s)" if report["async"] else "")
              + f"; {report['quantized_syncs']} quantized sync(s)"
              + (f" ({report['unattributed_syncs']} from Ray's repeated-line summaries)"
                 if report["unattributed_syncs"] else ""))
        for rank, pids in report["duplicate_ranks"].items():
            print(f"note: rank {rank} is reported by {len(pids)} processes (pids {', '.join(map(str, pids))}): a "
                  "restarted worker, or logs of two runs in one directory; each is judged on its own")
        if report["compressed"]:
            print(f"{len(report['compressed'])} compressed log file(s) not read, e.g. {report['compressed'][0]}: "
                  "unpack them (tar -xzf / gunzip) and run again")
        print("verdict: " + ("int8 rollouts confirmed" if report["ok"] else "NOT confirmed"))
    if not report["ok"]:
        if args.json:
            return CheckFailed.exit_code
        raise CheckFailed(f"{path}: int8 rollout not confirmed on every rollout rank")
    return 0

