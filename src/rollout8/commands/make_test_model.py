"""`rollout8 make-test-model`: arguments, output and exit code; the work is rollout8.quant.testmodels."""

from __future__ import annotations

import argparse
import dataclasses

from ..fileutil import OutputError, check_output, writing
from ..quant.testmodels import PRESETS, ModelShape, make_pair, resolve_shape


def _parse_override(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD=VALUE, e.g. num_hidden_layers=4")
    key, value = text.split("=", 1)
    types = {f.name: f.type for f in dataclasses.fields(ModelShape)}
    if key not in types:
        raise argparse.ArgumentTypeError(f"unknown shape field {key!r}; valid: {', '.join(sorted(types))}")
    if types[key] in ("bool", bool):
        if value.lower() not in ("true", "false", "1", "0"):
            raise argparse.ArgumentTypeError(f"{key}: expected true or false, got {value!r}")
        return key, value.lower() in ("true", "1")
    try:
        return key, int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key}: expected an integer, got {value!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", required=True, help="directory; bf16/ and int8/ are written inside it")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model shape (default: tiny)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    parser.add_argument("--force", action="store_true",
                        help="replace an -o directory that make-test-model did not write")
    parser.add_argument("--set", dest="overrides", action="append", type=_parse_override, default=[],
                        metavar="FIELD=VALUE",
                        help="override a shape field, e.g. --set num_hidden_layers=4 (repeatable); fields: "
                             + ", ".join(f.name for f in dataclasses.fields(ModelShape)))


def run(args) -> int:
    with writing(args.output):
        out = check_output(args.output, directory=True)
        if out.is_dir() and any(out.iterdir()) and not (out / "testmodel.json").is_file() and not args.force:
            raise OutputError(f"-o {args.output}: exists and was not written by make-test-model (it replaces the whole "
                              "directory): name another path, or pass --force")
        overrides = dict(args.overrides)
        shape = resolve_shape(args.preset, overrides)
        print(f"building {args.preset} ({shape.num_parameters() / 1e6:.1f}M parameters, "
              f"{shape.num_hidden_layers} layers) in {args.output}", flush=True)
        pair = make_pair(args.output, preset=args.preset, seed=args.seed,
                         progress=lambda msg: print(f"  {msg}", flush=True), **overrides)
        print(f"bf16: {pair.bf16}\nint8: {pair.int8}")
        return 0

