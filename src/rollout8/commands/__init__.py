"""The command line's edge: one module per `rollout8 <command>` (dashes become underscores), each with
`add_arguments(parser)` and `run(args) -> int`: argument parsing, printing and exit codes only; the work is in
the library layers. No library module imports from here.
"""

import argparse
import math
from pathlib import Path

from ..models import INT64_MAX


def count(text: str) -> int:
    """argparse type: an integer, 0 or more (and within 64 bits)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: must be 0 or more")
    if value > INT64_MAX:
        raise argparse.ArgumentTypeError(f"{value}: more than 64 bits hold")
    return value


def positive(text: str) -> int:
    """argparse type: an integer, 1 or more (a size, a count of nodes or ranks)."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be 1 or more")
    return value


def bounded_count(high: int):
    """argparse type: an integer from 1 to high (a count whose work grows with it: rows written, examples)."""
    def parse(text: str) -> int:
        value = positive(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{value}: at most {high}")
        return value
    parse.__name__ = f"an integer from 1 to {high}"
    return parse


def amount(text: str) -> float:
    """argparse type: a finite number, 0 or more (NaN would make every comparison pass)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number, 0 or more")
    return value


def absolute_path(text: str) -> Path:
    """argparse type: an absolute path (a relative one would be taken from wherever the command runs)."""
    path = Path(text)
    if not path.is_absolute():
        raise argparse.ArgumentTypeError(f"{text!r} is relative: give an absolute path")
    return path


def spec_inputs(spec, spec_path: str | Path, label: str = "SPEC") -> dict[str, Path | None]:
    """Every input artifact of a run spec, by the name an output refusal shows it under: the spec, the version lock,
    the models, the profile and the data files (the local paths `rollout8 plan` reads and checksums). No output of a
    command that reads the spec may be, or lie inside, any of them (overlap.refuse_output_inside_inputs)."""
    from ..paths import lock_path

    inputs: dict[str, Path | None] = {label: Path(spec_path), "lock": lock_path()}
    for what in ("bf16", "int8", "profile", "train", "val", "reward"):
        inputs[f"{'model' if what in ('bf16', 'int8', 'profile') else 'data'}.{what}"] = spec.local_path(what)
    return inputs
