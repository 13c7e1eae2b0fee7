"""`rollout8 render`: arguments, output and exit code; the work is rollout8.runspec.render."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..fileutil import check_output, writing
from ..runspec.render import ENV_FILE, FLASHRL_FILE, LAUNCH_FILE, MANIFEST_FILE, render, write_outputs
from ..runspec.runspec import load_spec
from . import spec_inputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="run spec (configs/runs/*.yaml)")
    parser.add_argument("-o", "--output", required=True, help="output directory")
    parser.add_argument("--no-check", action="store_true", help="render even if `rollout8 check` finds errors")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    if not args.no_check:
        from ..runspec.check import run_checks

        errors = [f for f in run_checks(spec) if f.level == "error"]
        if errors:
            from ..errors import CheckFailed

            for finding in errors:
                print(finding.line())
            raise CheckFailed(f"{args.spec}: {len(errors)} error(s); fix them or pass --no-check")
    with writing(args.output):
        check_output(args.output, directory=True, inputs=spec_inputs(spec, args.spec), what="the rendered files",
                     files=(ENV_FILE, LAUNCH_FILE, FLASHRL_FILE, MANIFEST_FILE))
        written = write_outputs(render(spec), Path(args.output))
    for name in written:
        print(f"wrote {Path(args.output) / name}")
    return 0

