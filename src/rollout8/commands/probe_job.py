"""`rollout8 probe-job`: arguments, output and exit code; the work is rollout8.node.probe_job.

Two modes: on the head, as the Ray job's entrypoint (`--plan`), it runs the probe on every node and prints the
verdict; on the controller (`--judge DRIVER_LOG`), it reads that verdict back with the one parser and prints one
JSON object (ok, line, nodes) for the verify role, exit 0 green, 1 red.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import Rollout8Error
from ..fileutil import atomic_write, check_output
from ..node.probe_job import VERDICT_PREFIX, judge_verdict, read_verdict, run_job
from ..runspec.plan import load_plan
from . import amount, positive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--plan", help="run the probe: the deployment plan JSON at its node path "
                                     "(<deploy.root>/rollout8-plan.json, written by `rollout8 plan`)")
    mode.add_argument("--judge", type=Path, metavar="DRIVER_LOG",
                      help="judge a finished probe job from its driver log (the verify role, on the controller)")
    parser.add_argument("--nodes", type=positive, default=None, help="number of nodes that must take part")
    parser.add_argument("--timeout", type=amount, default=600.0, help="seconds to wait for all node tasks")
    parser.add_argument("--json-out", default=None, help="also write the verdict JSON here")


def run(args: argparse.Namespace) -> int:
    if args.judge is not None:
        return judge(args.judge, args.nodes)
    if args.json_out:  # refused now, not after the job
        check_output(args.json_out, inputs={"--plan": args.plan}, flag="--json-out", what="the verdict")
    try:
        plan = load_plan(args.plan).to_json()  # the one Plan model: a plan of another schema is refused here
    except (OSError, ValueError) as exc:
        raise Rollout8Error(f"--plan {args.plan}: cannot read the plan ({exc}); run the artifacts play first") from exc
    verdict = run_job(plan, args.nodes, args.timeout)
    line = json.dumps(verdict, sort_keys=True)
    if args.json_out:
        atomic_write(args.json_out, line + "\n")
    print(VERDICT_PREFIX + line, flush=True)
    ok, summary = judge_verdict(verdict, args.nodes)
    print(f"probe-job: verdict {summary.removeprefix('probe job ')}", flush=True)
    return 0 if ok else 1


def judge(driver_log: Path, nodes: int | None) -> int:
    try:
        text = driver_log.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise Rollout8Error(f"--judge {driver_log}: cannot read the driver log ({exc.strerror or exc}); "
                            "collect the job's logs first (--tags verify)") from exc
    verdict = read_verdict(text)
    ok, line = judge_verdict(verdict, nodes)
    rows = []
    for address, node in sorted((verdict or {}).get("nodes", {}).items()):
        checks = ", ".join(f"{c.get('check')}={'ok' if c.get('ok') else 'FAIL'}" for c in node.get("checks", []))
        rows.append(f"{node.get('hostname', address)} ({address}): {'GREEN' if node.get('ok') else 'RED'} - {checks}")
    print(json.dumps({"ok": ok, "line": line, "nodes": rows}))
    return 0 if ok else 1
