"""`rollout8 patches`: arguments, output and exit code; the work is rollout8.node.patches."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import CheckFailed
from ..node.patches import ALL, COMPONENTS, DRIFTED, apply_patches, find_patches, patch_status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, help_text in (
        ("apply", "apply each patch once (a second run is a no-op); stops with nothing changed on drift"),
        ("check", "report applied / not applied / drifted per patch; exit 1 unless all are applied"),
    ):
        p = sub.add_parser(action, help=help_text, description=help_text)
        p.add_argument("--target", required=True, type=Path,
                       help="directory that contains verl/ or flash_rl/ (a source checkout or site-packages)")
        p.add_argument("--component", choices=[*COMPONENTS, ALL], default=ALL,
                       help="which patches (default all: the target must then contain both packages)")
    sub.add_parser("list", help="list the bundle's patches and the files they change")


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        for p in find_patches():
            print(f"{p.name}  ({', '.join(p.files)})  {p.summary}")
        return 0
    target = Path(args.target)
    if args.action == "apply":
        results = apply_patches(target, args.component)
        for r in results:
            print(r.line())
        fresh = sum(r.action == "applied now" for r in results)
        print(f"{fresh} applied now, {len(results) - fresh} already applied, in {target}")
        return 0
    results = patch_status(target, args.component)
    for r in results:
        print(r.line())
    bad = [r for r in results if not r.ok]
    if bad:
        drift = "; drifted ones need the patch redone first" if any(r.state == DRIFTED for r in bad) else ""
        raise CheckFailed(f"{len(bad)} of {len(results)} patches not applied in {target} "
                          f"(run `rollout8 patches apply --target {target} --component {args.component}`{drift})")
    print(f"all {len(results)} patches applied in {target}")
    return 0

