"""`rollout8 probe-job`: arguments, output and exit code; the work is rollout8.node.probe_job."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import Rollout8Error
from ..node.probe_job import VERDICT_PREFIX, run_job
from ..runspec.plan import load_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, help="the deployment plan JSON at its node path "
                                                      "(<deploy.root>/rollout8-plan.json, written by `rollout8 plan`)")
    parser.add_argument("--nodes", type=int, default=None, help="number of nodes that must take part")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for all node tasks")
    parser.add_argument("--json-out", default=None, help="also write the verdict JSON here")


def run(args: argparse.Namespace) -> int:
    try:
        plan = load_plan(args.plan).to_json()  # the one Plan model: a plan of another schema is refused here
    except (OSError, ValueError) as exc:
        raise Rollout8Error(f"--plan {args.plan}: cannot read the plan ({exc}); run the artifacts play first") from exc
    verdict = run_job(plan, args.nodes, args.timeout)
    line = json.dumps(verdict, sort_keys=True)
    if args.json_out:
        Path(args.json_out).write_text(line + "\n")
    print(VERDICT_PREFIX + line, flush=True)
    red = [v["hostname"] for v in verdict["nodes"].values() if not v["ok"]]
    summary = f"GREEN on all {len(verdict['nodes'])} nodes" if not red else f"RED on {', '.join(red)}"
    print(f"probe-job: verdict {summary}", flush=True)
    return 0 if verdict["ok"] else 1

