"""`rollout8 setup`: arguments, output and exit code; the work is rollout8.runspec.flashrl_config."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import SpecError
from ..fileutil import check_output, special_kind, writing
from ..quant.checkpoint import require_kind
from ..runspec.flashrl_config import (
    CONFIG_KIND,
    build_config,
    config_for_spec,
    detect_layout,
    mix_summary,
    write_config,
)
from . import positive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", help="take everything from this run spec (FlashRL entries use node paths)")
    parser.add_argument("--local-paths", action="store_true",
                        help="with --spec: use the spec's local paths instead of the node paths")
    parser.add_argument("--fn", choices=["int8", "bf16", "hybrid"], default="int8", help="what to write (default int8)")
    parser.add_argument("-m", "--model", help="the int8 (W8A8) model directory")
    parser.add_argument("-p", "--profile", help="the FlashRL profile (default: <model>/profile.pt)")
    parser.add_argument("-b", "--bf16-model", help="the bf16 model for bf16 entries (default: verl's model path)")
    parser.add_argument("--mix", default="1:1", help="hybrid: INT8:BF16 entry counts (default 1:1)")
    parser.add_argument("--no-path-check", action="store_true",
                        help="do not require the paths to exist here (they are paths on the nodes)")
    parser.add_argument("--tp", type=positive, default=None, help="show the per-rank mix for this tensor parallel size")
    parser.add_argument("--world-size", type=positive, default=None, help="rollout world size for the per-rank mix")
    parser.add_argument("-o", "--output", required=True, help="where to write the FlashRL YAML")
    parser.add_argument("--force", action="store_true", help="replace an existing -o file that is not a FlashRL config")


def _parse_mix(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise SpecError(f"--mix {text!r}: expected INT8:BF16, e.g. 3:1") from None
    return a, b


def run(args: argparse.Namespace) -> int:
    inputs: dict = {}
    if args.spec:
        from ..runspec.runspec import load_spec
        from . import spec_inputs

        spec = load_spec(args.spec)
        inputs = spec_inputs(spec, args.spec, label="--spec")  # its local artifacts, whatever paths the config names
        config = config_for_spec(spec, node_paths=not args.local_paths)
        tp = args.tp or int(spec.verl.get("actor_rollout_ref.rollout.tensor_model_parallel_size", 1))
        world = args.world_size or spec.cluster.nnodes * spec.cluster.npus_per_node
    else:
        def absolute(value: str | None) -> str | None:
            return None if value is None else str(Path(value).expanduser().absolute())

        model, bf16 = absolute(args.model), absolute(args.bf16_model)
        profile = absolute(args.profile) or (str(Path(model) / "profile.pt") if model else None)
        if not args.no_path_check:
            needed = [("--bf16-model", bf16)]
            if args.fn != "bf16":
                needed += [("--model", model), ("--profile", profile)]
            for label, value in needed:
                if value is not None and (kind := special_kind(value)):
                    raise SpecError(f"{label} {value}: {kind}, not a {label.lstrip('-').replace('-', ' ')}: name "
                                    "the file or directory itself")
                if value is not None and not Path(value).exists():
                    raise SpecError(f"{label} {value}: does not exist (pass --no-path-check for node-only paths)")
        if not args.no_path_check and args.fn != "bf16" and model and Path(model).is_dir():
            require_kind(model, int8=True, flag="-m")
        layout = detect_layout(Path(model)) if model and Path(model).is_dir() else "compressed-tensors"
        config = build_config(args.fn, int8_model=model, profile=profile, bf16_model=bf16,
                              mix=_parse_mix(args.mix), layout=layout)
        tp, world = args.tp or 1, args.world_size
    inputs.update({"-m": args.model, "-p": args.profile, "-b": args.bf16_model})
    for entry in config.get("configs", []):  # what the config points at is an input too (the profile, the models)
        for key in ("profile", "model"):
            if isinstance(entry.get(key), str):
                inputs.setdefault(f"the config's {key}", entry[key])
    with writing(args.output):
        check_output(args.output, inputs=inputs, kind=CONFIG_KIND, force=args.force, what="the FlashRL config")
        path = write_config(config, Path(args.output))
    print(f"wrote {path} ({len(config['configs'])} entr{'y' if len(config['configs']) == 1 else 'ies'}); "
          f"export FLASHRL_CONFIG={path}")
    if world:
        mix = mix_summary(config, world, tp)
        print(f"per DP rollout worker (world {world}, TP {tp}): "
              + ", ".join(f"{fn} x{count}" for fn, count in sorted(mix.items())))
    return 0

