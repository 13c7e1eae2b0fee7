"""`rollout8 import SCRIPT.sh [-o SPEC.yaml] [--env NAME=VALUE]... [--env-file FILE] [--accept-dropped]`: a run
spec from a verl launch script, read and never run, in the environment given (nothing of rollout8's own); the work
is rollout8.runspec.importer (the mapping) and rollout8.runspec.shell_script (the reader).

Prints every line not carried (file:line: why), the placeholders to fill, and what the spec still renders
differently (rollout8's own additions apart). Exit 1 if any line was not carried, unless --accept-dropped; the spec
is written either way, so the user can see it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import CheckFailed, SpecError
from ..fileutil import atomic_write, check_output, writing
from ..runspec.importer import build_spec, differences, spec_name, spec_text
from ..runspec.runspec import parse_spec
from ..runspec.shell_script import RECIPE, read_env_file, read_script
from ..runspec.shell_words import NAME


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("script", help="the verl launch script (bash; read, never run)")
    parser.add_argument("-o", "--output", help="the run spec to write (default: print it)")
    parser.add_argument("--name", help="the run's name (default: from the output's or the script's file name)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable the script is read with, as exported (repeatable; $HOME and the rest are "
                             "unset unless given)")
    parser.add_argument("--env-file", metavar="FILE",
                        help="KEY=VALUE lines (`export ` and shell quoting allowed, # comments), read before --env")
    parser.add_argument("--accept-dropped", action="store_true",
                        help="exit 0 even if lines of the script were not carried (they are still listed)")


def report_dropped(reading, not_carried) -> int:
    failures = 0
    for item in reading.dropped + not_carried:
        print(f"{'noted' if item.harmless else 'not carried'}: {item.describe()}", file=sys.stderr)
        failures += not item.harmless
    for item in reading.unresolved:
        print(f"unresolved: {item.describe()}", file=sys.stderr)
    return failures


def environment(args: argparse.Namespace) -> dict[str, str]:
    """--env-file's variables, then --env's (the last wins)."""
    env = read_env_file(args.env_file) if args.env_file else {}
    for item in args.env:
        name, has_value, value = item.partition("=")
        if not has_value or not NAME.fullmatch(name):
            raise SpecError(f"--env {item}: give NAME=VALUE")
        env[name] = value
    return env


# Why a recipe trainer of verl at the pin cannot run under rollout8, beyond what holds for all of them (NO_RECIPE):
# read in verl 51d2104's recipe/ (docs/import-corpus.md, "Recipe trainers").
NO_RECIPE = "rollout8's image has no `recipe` package (verl's wheel at the pin leaves recipe/ out: it has no " \
            "__init__.py)"
RECIPE_TRAINERS = {
    "recipe.dapo.main_dapo": "RayDAPOTrainer.fit generates only through the async rollout manager "
                             "(rollout.mode=async), while FlashRL patches only the sync rollout",
    "recipe.one_step_off_policy.main_ppo": "it syncs weights into rollout workers of its own (its fsdp_workers.py), "
                                           "a path not proven with FlashRL",
    "recipe.r1_ascend.main_ppo": "it runs on its own patched copies of vLLM v0.9.1, vllm-ascend 8c7bc45 and "
                                 "MindSpeed f6688 (its README), not the lock's",
    "recipe.transfer_queue.main_ppo": "it needs the TransferQueue package (verl's `transferqueue` extra), which the "
                                      "lock does not carry",
}


def recipe_refusal(reason: str) -> str:
    """Why the recipe trainer named in `reason` ("... (python3 -m recipe.x.main_y)") cannot run under rollout8."""
    module = reason.rpartition(" ")[2].rstrip(")")
    extra = RECIPE_TRAINERS.get(module)
    return f"{NO_RECIPE}; and {extra}" if extra else NO_RECIPE


def not_a_launch(script: str, reading) -> str | None:
    """One line for a script that launches something else than the RL trainer (SFT, torchrun, only Ray)."""
    trainer = "launches the GRPO/PPO trainer `python3 -m verl.trainer.main_ppo`"
    if reading.launches:
        item = reading.launches[0]
        if item.reason.startswith(RECIPE):  # an RL launch, but of another trainer and config than verl's own
            return f"{script}: {item.reason} at {item.file}:{item.line}: rollout8 {trainer} with its ppo_trainer " \
                   f"config, not a recipe's: {recipe_refusal(item.reason)}"
        return f"{script}: {item.reason} at {item.file}:{item.line}, not an RL launch: rollout8 {trainer}"
    if reading.ray_helpers:
        seen = ", ".join(dict.fromkeys(item.reason for item in reading.ray_helpers))
        return f"{script}: only Ray cluster helpers ({seen}), no training command: rollout8 starts Ray itself " \
               f"(the ray role) and {trainer}"
    return None


def run(args: argparse.Namespace) -> int:
    reading = read_script(args.script, environment(args))
    if reading.command is None:
        refusal = not_a_launch(args.script, reading)
        if refusal:
            raise SpecError(refusal)
        report_dropped(reading, [])
        raise SpecError(f"{args.script}: no `python3 -m verl.trainer.main_ppo` command found (read: "
                        f"{', '.join(str(f) for f in reading.files)}); import the script that runs it")
    name = spec_name(args.name or Path(args.output or args.script).stem)
    imported = build_spec(reading, name)
    out = Path(args.output) if args.output else None
    base = out.absolute().parent if out else Path.cwd()
    spec = parse_spec(imported.raw, base, str(out or "<imported spec>"))
    text = spec_text(imported, Path(args.script))
    if out is None:
        sys.stdout.write(text)
    else:
        with writing(out):
            check_output(out, inputs={"SCRIPT": Path(args.script)}, what="the run spec")
            atomic_write(out, text)
        print(f"wrote {out}")
    failures = report_dropped(reading, imported.not_carried)
    diffs = differences(spec, reading)
    for diff in diffs:
        if not diff.ours:
            print(f"differs: {diff.line()}", file=sys.stderr)
    ours = sum(d.ours for d in diffs)
    if ours:
        print(f"{ours} setting(s) rollout8 makes itself: `rollout8 render SPEC --against {args.script} --verbose` "
              "lists them", file=sys.stderr)
    for line in imported.placeholders:
        print(f"placeholder: {line}", file=sys.stderr)
    if failures and not args.accept_dropped:
        raise CheckFailed(f"{args.script}: {failures} line(s) or setting(s) not carried (listed above); carry them "
                          "into the spec by hand, or pass --accept-dropped")
    return 0
