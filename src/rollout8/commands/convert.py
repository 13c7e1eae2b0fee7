"""`rollout8 convert`: arguments, output and exit code; the work is rollout8.quant.convert."""

from __future__ import annotations

import argparse

from ..fileutil import check_output, writing
from ..quant.convert import convert_to_ascend
from ..quant.layout import ASCEND, FLOAT, W8A8_DYNAMIC


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--to", required=True, choices=[ASCEND],
                        help="target layout: ascend = vllm-ascend 7e16b4a W8A8_DYNAMIC (quant_model_description.json)")
    parser.add_argument("int8_dir", metavar="INT8_DIR", help="compressed-tensors W8A8 checkpoint directory")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="where to write the converted model (created)")
    parser.add_argument("--round-scales", action="store_true",
                        help="accept float32 scales that the model dtype cannot represent exactly (lossy; recompute "
                             "the profile from the converted model)")
    parser.add_argument("--no-verify", action="store_true", help="skip the lossless check after writing")
    parser.add_argument("--force", action="store_true", help="replace an existing OUT_DIR")


def run(args) -> int:
    with writing(args.out_dir):
        check_output(args.out_dir, inputs={"INT8_DIR": args.int8_dir}, directory=True, flag="OUT_DIR",
                     what="the converted model", replaces=True)
        result = convert_to_ascend(args.int8_dir, args.out_dir, round_scales=args.round_scales,
                                   verify=not args.no_verify, force=args.force,
                                   progress=lambda msg: print(f"convert: {msg}", flush=True))
    if result.skipped:
        return 0
    print(f"convert: wrote {result.out_dir}: {len(result.quantized)} linears as {W8A8_DYNAMIC}, "
          f"{len(result.floats)} tensors as {FLOAT}"
          + (", dequantized weights verified identical to the source" if result.verified else ", not verified"))
    if result.rounded_scales:
        print(f"convert: warning: {result.rounded_scales} scales rounded to the model dtype "
              f"(max relative change {result.max_scale_rel_change:.2e})")
    print(f"convert: load it with vllm.LLM(model=..., quantization=\"{ASCEND}\"); `rollout8 setup` adds that to "
          f"the FlashRL config")
    return 0

