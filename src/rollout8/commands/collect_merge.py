"""`rollout8 collect-merge ARCHIVE DIR`: a node's log delta (the verify play's collection) appended to the
controller's copies in DIR; prints what was merged."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..results.collect import merge


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("archive", help="the node's delta archive (rollout8_log_delta's dest, fetched)")
    parser.add_argument("directory", help="the controller's copies of that node's logs")


def run(args: argparse.Namespace) -> int:
    files, written = merge(Path(args.archive), Path(args.directory))
    print(f"{files} log part(s), {written} bytes merged into {args.directory}")
    return 0
