"""`rollout8 doctor`: arguments, output and exit code; the work is rollout8.node.doctor."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from ..errors import Rollout8Error
from ..node.doctor import FAIL, SKIP, WARN, run_checks
from . import absolute_path, amount, count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--accelerator", choices=["npu", "cpu"], default="npu")
    parser.add_argument("--npus", type=count, default=8, help="NPUs this node must show (default 8)")
    parser.add_argument("--root", type=absolute_path, default=Path("/var/lib/rollout8"),
                        help="where the bundle puts models and artifacts (deploy.root)")
    parser.add_argument("--min-disk-gib", type=amount, default=50.0)
    parser.add_argument("--min-shm-gib", type=amount, default=1.0)
    parser.add_argument("--skip", action="append", default=[], metavar="CHECK",
                        help="report CHECK (a name from the first column, e.g. version:ray) as skipped: "
                             "the explicit escape hatch, shown in the report; repeatable")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of a table")


def run(args: argparse.Namespace) -> int:
    results = run_checks(args.accelerator, args.npus, args.root, args.min_disk_gib, args.min_shm_gib)
    unknown = set(args.skip) - {r.check for r in results}
    if unknown:
        raise Rollout8Error(f"--skip {', '.join(sorted(unknown))}: no such check "
                            f"(checks: {', '.join(r.check for r in results)})")
    for r in results:
        if r.check in args.skip:
            r.status, r.detail, r.fix = SKIP, f"skipped by --skip (was: {r.status}: {r.detail})", ""
    failed = [r for r in results if r.status == FAIL]
    if args.json:
        print(json.dumps({"ok": not failed, "results": [asdict(r) for r in results]}, indent=2))
    else:
        for r in results:
            line = f"{r.status.upper():5} {r.check:22} {r.detail}"
            if r.fix and r.status in (FAIL, WARN):
                line += f"\n      -> {r.fix}"
            print(line)
        print(f"doctor: {len(failed)} failure(s)" if failed else "doctor: node ready")
    return 1 if failed else 0

