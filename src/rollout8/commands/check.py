"""`rollout8 check`: arguments, output and exit code; the work is rollout8.runspec.check."""

from __future__ import annotations

import argparse
import json

from ..errors import CheckFailed, Rollout8Error
from ..runspec.check import rules, run_checks
from ..runspec.runspec import explain, load_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", help="run spec (configs/runs/*.yaml)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--explain", action="store_true", help="print the run spec field reference and the rules")
    parser.add_argument("--nic-in-inventory", action="store_true",
                        help="the inventory names a data NIC for every node (rollout8_cluster_nic or "
                             "rollout8_node_address; "
                             "ansible-playbook train.yml passes it then): a multi-node spec needs no "
                             "cluster.network.nic")
    parser.add_argument("--no-artifacts", action="store_true",
                        help="judge the spec before its model, profile and data exist: every rule that does not "
                             "read them (one line names the rules skipped)")


def run(args: argparse.Namespace) -> int:
    if args.explain:
        print("Run spec fields (configs/runs/*.yaml):\n" + explain() + "\n\nRules:\n"
              + rules())
        return 0
    if not args.spec:
        raise Rollout8Error("give a run spec (or --explain)")
    spec = load_spec(args.spec)
    findings = run_checks(spec, artifacts=not args.no_artifacts, nic_in_inventory=args.nic_in_inventory)
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warning" for f in findings)
    if args.json:
        print(json.dumps({"spec": str(args.spec), "ok": errors == 0, "errors": errors, "warnings": warnings,
                          "findings": [f.to_dict() for f in findings]}, indent=2))
    else:
        for finding in findings:
            print(finding.line())
        print(f"{args.spec}: {errors} error(s), {warnings} warning(s)")
    if errors:
        if args.json:
            return CheckFailed.exit_code
        raise CheckFailed(f"{args.spec}: refused ({errors} error(s) above)")
    return 0

