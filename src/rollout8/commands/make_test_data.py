"""`rollout8 make-test-data`: arguments, output and exit code; the work is rollout8.runspec.testdata."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import Rollout8Error
from ..fileutil import check_output, writing
from ..runspec.testdata import make_dataset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", required=True, type=Path, help="directory for train.parquet and val.parquet")
    parser.add_argument("--train", type=int, default=12, help="training rows (default 12)")
    parser.add_argument("--val", type=int, default=6, help="validation rows (default 6)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    if args.train < 1 or args.val < 1:
        raise Rollout8Error("--train and --val must be at least 1")
    with writing(args.output):
        check_output(args.output, directory=True, what="the dataset")
        written = make_dataset(args.output, args.train, args.val, args.seed)
    for split, path in written.items():
        print(f"{split}: {path}")
    return 0

