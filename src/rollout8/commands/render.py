"""`rollout8 render`: arguments, output and exit code; the work is rollout8.runspec.render."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import SpecError
from ..fileutil import check_output, writing
from ..runspec.render import ENV_FILE, FLASHRL_FILE, LAUNCH_FILE, MANIFEST_FILE, render, write_outputs
from ..runspec.runspec import load_spec
from . import spec_inputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="run spec (configs/runs/*.yaml)")
    parser.add_argument("-o", "--output", help="output directory")
    parser.add_argument("--no-check", action="store_true", help="render even if `rollout8 check` finds errors")
    parser.add_argument("--against", metavar="SCRIPT", help="write nothing: print what differs between the spec's "
                        "overrides and environment and those of a verl launch script (read, never run); exit 1 if "
                        "anything does. What render adds by design is listed with --verbose, never a difference")
    parser.add_argument("--verbose", action="store_true", help="with --against: list rollout8's own settings too")


def run(args: argparse.Namespace) -> int:
    if args.against is not None:
        return against(args)
    if args.output is None:
        raise SpecError(f"{args.spec}: give -o DIR (the output directory), or --against SCRIPT to compare")
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



def against(args: argparse.Namespace) -> int:
    """Order-insensitive, in the values hydra reads; one line per difference."""
    from ..runspec.importer import differences
    from ..runspec.shell_script import read_script

    if args.output is not None:
        raise SpecError("--against compares and writes nothing: leave out -o")
    spec = load_spec(args.spec)
    reading = read_script(args.against)
    if reading.command is None:
        raise SpecError(f"{args.against}: no `python3 -m verl.trainer.main_ppo` command found; give the script "
                        "that runs it")
    found = differences(spec, reading)
    real = [d for d in found if not d.ours]
    for diff in found:
        if not diff.ours or args.verbose:
            print(("set by rollout8: " if diff.ours else "") + diff.line())
    ours = len(found) - len(real)
    print(f"{args.spec} against {args.against}: {len(real)} difference(s); {ours} setting(s) rollout8 makes itself"
          + ("" if args.verbose or not ours else " (--verbose lists them)"), file=sys.stderr)
    return 1 if real else 0
