"""`rollout8 logs`: arguments, output and exit code; the work is rollout8.results.verdict."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import CheckFailed, Rollout8Error
from ..results.verdict import scan, verdict, who
from ..results.verl_logs import path_problem
from . import count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="a Ray session dir, a directory of collected logs, or one log file")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.add_argument("--job", metavar="JOB", help="with the logs of several jobs (Ray jobs of one session, Ray "
                        "sessions, or submissions collected by the verify play): judge this one, by the name the "
                        "output gives it (RUN:RAYJOB), its Ray job id or its run directory; default: the newest")
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


def _which_job(report: dict, path: Path) -> str | None:
    """`judging job J (...)`: which job, why that one, and what was ignored; None without Ray job ids."""
    if not report["judged"]:
        return None
    ignored = report["ignored"]
    if report["chosen_by"] == "--job":
        why = "named with --job"
    elif report["chosen_by"] == "newest":
        why = f"the newest of {len(report['jobs'])} jobs in {path}"
    else:
        why = f"the only job in {path}"
    line = f"judging job {report['judged']} ({why})"
    if ignored:
        shown = ", ".join(ignored[-5:]) + (f" and {len(ignored) - 5} more" if len(ignored) > 5 else "")
        kind = "older " if report["chosen_by"] == "newest" else ""
        line += f"; {len(ignored)} {kind}job(s) ignored: {shown} (judge one with --job)"
    return line


def _failure(report: dict, path: Path) -> str:
    """The one error line of a red verdict: the job, and what failed it (the crash, the workers named)."""
    job = f"job {report['judged']}" if report["judged"] else str(path)
    if report["crash"]:
        return (f"{job} crashed: {Path(report['crash']['file']).name}: {report['crash']['cause']}; "
                "int8 rollouts not confirmed")
    if not report["ranks"]:
        return f"{job}: no rollout worker found: int8 rollouts not confirmed"
    bad = [r for r in report["ranks"] if r["status"] not in ("patched", "bf16") or "expected one" in r["reason"]
           or "--min-syncs" in r["reason"]]
    if bad:
        shown = ", ".join(f"{who(r)} {r['status']}" for r in bad[:6]) + (" ..." if len(bad) > 6 else "")
        return f"{job}: int8 rollout not confirmed on {len(bad)} of {len(report['ranks'])} rollout worker(s): {shown}"
    return f"{job}: int8 rollout not confirmed on every rollout worker"


def run(args: argparse.Namespace) -> int:
    path = Path(args.directory)
    problem = path_problem(path)
    if problem:
        raise Rollout8Error(problem)
    if not path.is_dir() and not path.is_file():
        raise Rollout8Error(f"{path}: not a directory or a regular file (a FIFO, a device?): nothing to read")
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
        line = _which_job(report, path)
        if line:
            print(line)
        for note in report["notes"]:
            print(f"note: {note}")
        for r in report["ranks"]:
            rank = f"rank {r['rank']}" if r["rank"] is not None else "rank ?"
            where = f"pid {r['pid']}" + (f" on {r['ip']}" if r["ip"] else _host_dir(path, r["source"])) \
                if r["pid"] else r["source"]
            print(f"{rank:>9} ({where}): {r['status']}: {r['reason']}")
        if not report["ranks"]:
            what = f"job {report['judged']}" if report["judged"] else f"{report['files']} file(s)"
            print(f"no rollout rank found in {what}: did it start its rollout workers (a crash first?); are these "
                  "the workers' logs, with FLASHRL_LOGGING_LEVEL=DEBUG?")
        print(f"{report['rollout_ranks']} rollout rank(s): {report['patched']} int8-patched, {report['bf16']} bf16 by "
              f"config, {report['no_config']} never saw the config, {report['errors']} failed, "
              f"{report['incomplete']} incomplete"
              + (f", {report['unconfirmed']} without FlashRL's patch line" if report["unconfirmed"] else "")
              + (f", {report['no_sync']} patched but never synced" if report["no_sync"] else "")
              + (f", {report['async']} async rollout server(s)" if report["async"] else "")
              + f"; {report['quantized_syncs']} quantized sync(s)"
              + (f" ({report['unattributed_syncs']} from Ray's repeated-line summaries)"
                 if report["unattributed_syncs"] else ""))
        for rank, pids in report["duplicate_ranks"].items():
            print(f"note: rank {rank} is reported by {len(pids)} processes (pids {', '.join(map(str, pids))}): a "
                  "restarted worker, or logs of two runs in one directory; each is judged on its own")
        if report["sync"]:
            print(report["sync"])
        if report["crash"]:
            print(f"the job crashed: {report['crash']['file']}: {report['crash']['cause']}")
        if report["compressed"]:
            print(f"{len(report['compressed'])} compressed log file(s) not read, e.g. {report['compressed'][0]}: "
                  "unpack them (tar -xzf / gunzip) and run again")
        if report["unreadable"]:
            print(f"{len(report['unreadable'])} director(y/ies) could not be listed, e.g. {report['unreadable'][0]}: "
                  "what they hold is not judged")
        print("verdict: " + ("int8 rollouts confirmed" if report["ok"] else "NOT confirmed"))
    if not report["ok"]:
        if args.json:
            return CheckFailed.exit_code
        raise CheckFailed(_failure(report, path))
    return 0
