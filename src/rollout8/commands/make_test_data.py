"""`rollout8 make-test-data`: arguments, output and exit code; the work is rollout8.runspec.testdata."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..fileutil import check_output, writing
from ..runspec.testdata import make_dataset
from . import bounded_count

MAX_ROWS = 1_000_000  # a test dataset: rows past this are a typo (10^20 ran until killed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", required=True, type=Path, help="directory for train.parquet and val.parquet")
    parser.add_argument("--train", type=bounded_count(MAX_ROWS), default=12,
                        help=f"training rows (default 12, at most {MAX_ROWS})")
    parser.add_argument("--val", type=bounded_count(MAX_ROWS), default=6,
                        help=f"validation rows (default 6, at most {MAX_ROWS})")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    with writing(args.output):
        check_output(args.output, directory=True, what="the dataset")
        written = make_dataset(args.output, args.train, args.val, args.seed)
    for split, path in written.items():
        print(f"{split}: {path}")
    return 0

