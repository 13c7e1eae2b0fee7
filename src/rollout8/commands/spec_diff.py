"""`rollout8 spec-diff OLD NEW`: the keys changed between two versions of a run spec and whether the run's
checkpoints resume under them (the launch role's running-job guard prints its line)."""

from __future__ import annotations

import argparse
import json

from ..runspec.spec_diff import MISSING, diff, summary
from ..yamlio import read_yaml


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", help="the earlier version of the run spec (YAML)")
    parser.add_argument("new", help="the run spec as it is now (YAML)")
    parser.add_argument("--json", action="store_true", help="print the changes as JSON")


def run(args: argparse.Namespace) -> int:
    changes = diff(read_yaml(args.old, what="run spec"), read_yaml(args.new, what="run spec"))
    line = summary(changes)
    if args.json:
        shown = [{"key": c.key, "old": None if c.old is MISSING else c.old, "new": None if c.new is MISSING else c.new,
                  "resumes": c.resumes} for c in changes]
        print(json.dumps({"changes": shown, "keys": [c.key for c in changes],
                          "resumes": all(c.resumes for c in changes), "line": line}, default=str))
    else:
        print(line)
    return 0
