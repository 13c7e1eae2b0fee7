"""`rollout8 verify-quant`: arguments, output and exit code; the work is rollout8.quant.verify."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import CheckFailed
from ..fileutil import atomic_write, check_output, writing
from ..quant.verify import DEFAULT_MAX_LSB, format_table, verify
from . import count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", required=True, help="the bf16 model directory")
    parser.add_argument("-q", "--quantized", required=True, help="the int8 (W8A8) model directory")
    parser.add_argument("-p", "--profile", required=True, help="the FlashRL profile (.pt)")
    parser.add_argument("--json", dest="json_out", help="also write the report as JSON to this file ('-' = stdout)")
    parser.add_argument("--max-lsb", type=count, default=DEFAULT_MAX_LSB,
                        help=f"largest allowed int8 difference in LSB (default {DEFAULT_MAX_LSB})")
    parser.add_argument("--force", action="store_true", help="replace an existing --json file that is not JSON")


def _is_json_report(path: Path) -> bool:
    return path.stat().st_size < 50_000_000 and isinstance(json.loads(path.read_text(encoding="utf-8")), dict)


def run(args) -> int:
    if not args.json_out or args.json_out == "-":
        return _verify(args)
    with writing(args.json_out):
        check_output(args.json_out, inputs={"-m": args.model, "-q": args.quantized, "-p": args.profile},
                     kind=("a JSON report", _is_json_report), force=args.force, flag="--json", what="the report")
        return _verify(args)


def _verify(args) -> int:
    step = {"next": 0.0}

    def progress(done: int, total: int) -> None:  # on stderr, so stdout stays the table / JSON
        if done / total >= step["next"] or done == total:
            print(f"verify-quant: {done}/{total} tensors", file=sys.stderr, flush=True)
            step["next"] = done / total + 0.1

    report = verify(args.model, args.quantized, args.profile, max_lsb=args.max_lsb, progress=progress)
    if args.json_out != "-":
        print(format_table(report))
    if args.json_out:
        text = json.dumps(report.to_dict(), indent=2) + "\n"
        if args.json_out == "-":
            sys.stdout.write(text)
        else:
            atomic_write(args.json_out, text)
    if not report.passed:
        failed = report.failures
        names = ", ".join(f"{r.name} ({r.message})" for r in failed[:3])
        raise CheckFailed(f"{len(failed)} tensor(s) fail: {names}" + (" ..." if len(failed) > 3 else ""))
    return 0

