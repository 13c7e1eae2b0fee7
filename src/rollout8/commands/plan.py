"""`rollout8 plan`: arguments, output and exit code; the work is rollout8.runspec.plan."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..fileutil import check_output
from ..runspec.plan import PLAN_FILE, build_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path, help="the run spec (configs/runs/*.yaml)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="directory for the plan and FlashRL YAML")
    parser.add_argument("--node-cli", default=os.environ.get("ROLLOUT8_NODE_CLI", "rollout8"),
                        help="the rollout8 command on the nodes (used in the probe job's entrypoint)")
    parser.add_argument("--no-check", action="store_true",
                        help="plan even if `rollout8 check` finds errors (to reproduce a trap on purpose)")


def run(args: argparse.Namespace) -> int:
    check_output(args.output, directory=True, inputs={"(the spec)": args.spec})
    plan = build_plan(args.spec, args.output, args.node_cli, check=not args.no_check)
    print(json.dumps({"plan": str(args.output / PLAN_FILE), "job_id": plan.job_id,
                      "copies": len(plan.copies), "files": len(plan.sha256)}))
    return 0

