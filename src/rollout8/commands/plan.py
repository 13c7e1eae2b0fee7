"""`rollout8 plan`: arguments, output and exit code; the work is rollout8.runspec.plan and rollout8.runspec.proof.

The Ansible plan role's one command on the controller: the FlashRL profile if it is missing (--profile missing),
`check`'s rules, the plan, then the full verify-quant of the artifacts (--verify-quant, kept per set of artifacts).
stdout is one JSON object (plan, job_id, copies, files, profile_written, verify_quant, checkpoint_dir and
checkpoint_bytes_needed: what preflight wants free where the checkpoints land); a refusal is one line on
stderr and a non-zero exit, with nothing copied anywhere. `--no-artifacts` is a preview before the model, profile
and data exist: check's rules that read no file, then the node paths, copies, mounts and checkpoint sizing (0 bytes
while the model is not here) as JSON, nothing written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..errors import Rollout8Error
from ..fileutil import check_output, writing
from ..runspec.check import ARTIFACT_RULES
from ..runspec.plan import (
    ARRIVAL_FILE,
    CACHE_FILE,
    PLAN_FILE,
    PROFILE_CHECK_CACHE,
    SEND_TREE,
    SIZING_FIELDS,
    build_plan,
    load_plan,
)
from ..runspec.proof import ensure_profile, verify_artifacts
from ..runspec.render import FLASHRL_FILE, LAUNCH_FILE
from ..runspec.runspec import load_spec
from . import spec_inputs

# what the plan writes in its directory (besides the kept verify-quant reports)
PLAN_OUTPUTS = (PLAN_FILE, FLASHRL_FILE, LAUNCH_FILE, ARRIVAL_FILE, SEND_TREE, CACHE_FILE, PROFILE_CHECK_CACHE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path, help="the run spec (configs/runs/*.yaml)")
    parser.add_argument("-o", "--output", type=Path, help="directory for the plan and FlashRL YAML (required but "
                        "with --no-artifacts)")
    parser.add_argument("--node-cli", default=os.environ.get("ROLLOUT8_NODE_CLI", "rollout8"),
                        help="the rollout8 command on the nodes (used in the probe job's entrypoint)")
    parser.add_argument("--no-check", action="store_true",
                        help="plan even if `rollout8 check` finds errors (to reproduce a trap on purpose); "
                             "also skips --verify-quant")
    parser.add_argument("--no-artifacts", action="store_true",
                        help="plan before the model, profile and data exist: check's rules that read no file, then "
                             "the node paths, copies and mounts on stdout; nothing is written (a plan the nodes "
                             "take needs the files: their checksums are the job's identity)")
    parser.add_argument("--profile", choices=("missing", "never"), default="never",
                        help="missing: compute the FlashRL profile first when the spec's profile file does not exist "
                             "(default never: a missing profile is refused)")
    parser.add_argument("--nic-in-inventory", action="store_true",
                        help="the inventory names a data NIC for every node (rollout8_cluster_nic or "
                             "rollout8_node_address; "
                             "ansible-playbook train.yml passes it then): a multi-node spec needs no "
                             "cluster.network.nic")
    parser.add_argument("--artifacts-from", type=Path, metavar="HEAD_PLAN",
                        help="deploy.shared_storage on a controller without the models: the rollout8-plan.json the "
                             "head made of this spec where the models are (train.yml's head plan, in the training "
                             "container); its checksums and parameter count are taken and no model file is read "
                             "here. The job id must come out the same as the head's")
    parser.add_argument("--verify-quant", action="store_true",
                        help="then verify every int8 weight against the bf16 weights and the profile (once per set "
                             "of artifacts: the report is kept in the output directory under their checksums)")


def _progress(what: str):
    step = {"next": 0.0}

    def report(done: int, total: int) -> None:  # on stderr: stdout is the one JSON object
        if done / max(total, 1) >= step["next"] or done == total:
            print(f"plan: {what} {done}/{total}", file=sys.stderr, flush=True)
            step["next"] = done / max(total, 1) + 0.1

    return report


def preview(args: argparse.Namespace) -> int:
    """plan --no-artifacts: what the plan would be, on stdout, with nothing written."""
    for flag, given in (("--verify-quant", args.verify_quant), ("--profile missing", args.profile == "missing")):
        if given:
            raise Rollout8Error(f"plan --no-artifacts: {flag} reads the artifacts; drop one of the two")
    plan = build_plan(args.spec, None, args.node_cli, check=not args.no_check, artifacts=False,
                      nic_in_inventory=args.nic_in_inventory)
    skipped = list(ARTIFACT_RULES) + ["the artifacts' checksums (the job id)"]
    print(f"plan {args.spec}: preview, nothing written; skipped (they read the artifacts): {', '.join(skipped)}",
          file=sys.stderr)
    print(json.dumps({"preview": True, "skipped": skipped, "job_id": None, "node_paths": plan.node_paths,
                      "copies": [c.model_dump() for c in plan.copies], "mounts": plan.mounts,
                      "checkpoint_dir": plan.checkpoint_dir, "image": plan.image,
                      **{key: getattr(plan, key) for key in SIZING_FIELDS},
                      # the whole plan but its job id (train.yml's plays read it until the head's plan comes)
                      "plan": plan.to_json()}, indent=2))
    return 0


def from_head(args: argparse.Namespace) -> int:
    """plan --artifacts-from HEAD_PLAN: the plan written as `plan` writes it, its checksums and parameter count the
    head's (deploy.shared_storage: the head read the models, the controller reads none)."""
    for flag, given in (("--verify-quant", args.verify_quant), ("--profile missing", args.profile == "missing"),
                        ("--no-artifacts", args.no_artifacts)):
        if given:
            raise Rollout8Error(f"plan --artifacts-from: {flag} ran on the head already (or reads the artifacts "
                                "here); drop one of the two")
    if args.output is None:
        raise Rollout8Error("plan --artifacts-from: give the plan's directory (-o DIR)")
    facts = load_plan(args.artifacts_from)
    spec = load_spec(args.spec)
    with writing(args.output):
        check_output(args.output, directory=True, inputs={"SPEC": args.spec, "HEAD_PLAN": args.artifacts_from},
                     what="the plan", files=PLAN_OUTPUTS)
        plan = build_plan(args.spec, args.output, args.node_cli, check=not args.no_check,
                          nic_in_inventory=args.nic_in_inventory, facts=facts)
    print(json.dumps({"plan": str(args.output / PLAN_FILE), "job_id": plan.job_id, "copies": len(plan.copies),
                      "files": len(plan.sha256), "profile_written": None, "verify_quant": None,
                      "artifacts_from": str(args.artifacts_from), "checkpoint_dir": plan.checkpoint_dir,
                      "checkpoint_bytes_needed": plan.checkpoint_bytes_needed, "name": spec.name}))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.no_artifacts and args.artifacts_from is None:
        return preview(args)
    if args.artifacts_from is not None:
        return from_head(args)
    if args.output is None:
        raise Rollout8Error("plan: give the plan's directory (-o DIR), or --no-artifacts for a preview")
    spec = load_spec(args.spec)
    with writing(args.output):
        check_output(args.output, directory=True, inputs=spec_inputs(spec, args.spec), what="the plan",
                     files=PLAN_OUTPUTS)
        written = None
        if args.profile == "missing":
            written = ensure_profile(spec, progress=_progress("profile, layer"))
        plan = build_plan(args.spec, args.output, args.node_cli, check=not args.no_check,
                          nic_in_inventory=args.nic_in_inventory)
        verified = None
        if args.verify_quant and plan.flashrl and not args.no_check:
            report, cached = verify_artifacts(spec, plan.sha256, args.output,
                                              progress=_progress("verify-quant, tensor"))
            verified = {"report": str(report), "cached": cached}
    print(json.dumps({"plan": str(args.output / PLAN_FILE), "job_id": plan.job_id, "copies": len(plan.copies),
                      "files": len(plan.sha256), "profile_written": str(written) if written else None,
                      "verify_quant": verified, "checkpoint_dir": plan.checkpoint_dir,
                      "checkpoint_bytes_needed": plan.checkpoint_bytes_needed}))
    return 0
