"""`rollout8 profile`: arguments, output and exit code; the work is rollout8.quant.profile."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from ..errors import ModelError
from ..fileutil import check_output, writing
from ..quant.checkpoint import require_kind
from ..quant.profile import PROFILE_KIND, flashrl_profile_command, write_profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", required=True, help="the bf16 model directory (safetensors)")
    parser.add_argument("-q", "--quantized", required=True, help="the W8A8 compressed-tensors model directory")
    parser.add_argument("-o", "--output", required=True, help="where to write the profile (.pt)")
    parser.add_argument("--engine", choices=("rollout8", "flashrl"), default="rollout8",
                        help="rollout8: stream layer by layer (default); flashrl: run FlashRL's own profiler, "
                             "which loads both models fully")
    parser.add_argument("--quiet", action="store_true", help="no per-layer progress lines")
    parser.add_argument("--force", action="store_true", help="replace an existing -o file that is not a profile")


def run(args) -> int:
    for flag, path in (("-m", args.model), ("-q", args.quantized)):
        if not Path(path).is_dir():
            raise ModelError(f"{flag} {path}: model directory does not exist")
    require_kind(args.model, int8=False, flag="-m")
    require_kind(args.quantized, int8=True, flag="-q")
    with writing(args.output):
        check_output(args.output, inputs={"-m": args.model, "-q": args.quantized}, kind=PROFILE_KIND,
                     force=args.force, what="the profile")
        return _compute(args)


def _compute(args) -> int:
    """Write the profile with the chosen engine; its exit code."""
    start = time.monotonic()
    if args.engine == "flashrl":
        cmd, env = flashrl_profile_command(args.model, args.quantized, args.output)
        print("running FlashRL's profiler (loads both models fully)", flush=True)
        rc = subprocess.call(cmd, env=env)
        if rc != 0:
            print(f"rollout8 profile: flashrl profile failed with exit code {rc}", file=sys.stderr)
            return rc
    else:
        def progress(done: int, total: int) -> None:
            if not args.quiet:
                print(f"layer {done}/{total} ({time.monotonic() - start:.1f}s)", flush=True)

        profile = write_profile(args.model, args.quantized, args.output, progress=progress)
        print(f"{len(profile)} entries", flush=True)
    print(f"profile written to {args.output} in {time.monotonic() - start:.1f}s")
    return 0
