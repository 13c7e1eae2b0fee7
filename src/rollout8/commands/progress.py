"""`rollout8 progress`: where a verl job stands, from its collected driver log (the verify play's progress line)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..node import keeper
from ..results.communicator import AFTER_S
from ..results.progress import find_driver_log, progress_line, read_progress
from . import amount, count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="a job's collected logs (its driver.log), or the driver log itself")
    parser.add_argument("--steps", type=count, default=None, help="the run's total training steps")
    parser.add_argument("--state", default="", help="the job's Ray state, printed in the line (RUNNING, ...)")
    parser.add_argument("--json", action="store_true", help="print the progress as JSON")
    parser.add_argument("--attempts", type=count, default=None, help="the automatic resumes allowed (the line "
                        "says 'automatic resume 1 of N' when the job directory holds the keeper's record)")
    parser.add_argument("--npus-per-node", type=count, default=None,
                        help="ranks per node: names the node short of a rank that has not joined its communicator")
    parser.add_argument("--nodes", default="", help="the cluster's nodes, comma-separated NAME or NAME=ADDRESS (its "
                        "Ray address): names a node none of whose ranks arrived")
    parser.add_argument("--communicator-after", type=amount, default=AFTER_S, metavar="SECONDS",
                        help="a rank still waiting for its communicator after this long is reported "
                        f"(default {AFTER_S:g})")


def run(args: argparse.Namespace) -> int:
    path = Path(args.directory)
    driver = find_driver_log(path)  # one line saying what is missing, never "no step yet" for no log
    progress = read_progress(driver, args.steps, after_s=args.communicator_after, npus_per_node=args.npus_per_node,
                             nodes=[n for n in args.nodes.split(",") if n])
    job = path.name if path.is_dir() else path.parent.name
    # the head's keeper-status.json, which the verify play keeps beside the driver log (automatic resume)
    resumes = keeper.read_json((path if path.is_dir() else path.parent) / keeper.STATUS)
    line = progress_line(job, args.state or "?", progress)
    said = keeper.summary(resumes, args.attempts or "?")
    line += f"; {said}" if said else ""
    if args.json:
        print(json.dumps({"job": job, "state": args.state, **progress.to_json(), "line": line,
                          "attempts": (resumes or {}).get("attempts", []),
                          "resume": (resumes or {}).get("state", ""), "resume_line": said}))
    else:
        print(line)
        if progress.sync:
            print(progress.sync)
        if progress.cause and args.state not in ("RUNNING", "SUCCEEDED"):
            print(f"cause: {progress.cause}")
    return 0
