"""The single console entry point: `rollout8 <command>`.

Each command lives in its own module, rollout8/commands/<command>.py (dashes become underscores), which defines
`add_arguments(parser)` and `run(args) -> int`.
Modules are imported only when their command runs, so `rollout8 lock` does not pay for torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import Rollout8Error

# command name -> one-line help (module: command_module(name)). Order is the order of `rollout8 --help`.
COMMANDS: dict[str, str] = {
    "lock": "print the version lock, or emit it as docker build args / env / markdown",
    "patches": "apply or check the bundle's patches on a source tree or site-packages",
    "make-test-model": "write a tiny Qwen2 bf16 model and its W8A8 twin (no hub access)",
    "make-test-data": "write a tiny GSM8K-shaped dataset in verl's parquet layout",
    "profile": "compute the FlashRL int8 profile, streaming both checkpoints layer by layer",
    "setup": "write the FlashRL config YAML (int8, bf16 or hybrid) with absolute paths",
    "check": "refuse a run spec that would fail or silently not run int8, before launch",
    "render": "render a run spec into the FlashRL YAML, env file and verl command line",
    "verify-quant": "apply a profile to bf16 weights and compare with the int8 checkpoint",
    "logs": "verdict per rollout rank from Ray/verl/FlashRL logs: did int8 really run?",
    "convert": "convert a compressed-tensors W8A8 model to the vllm-ascend W8A8_DYNAMIC layout",
    "report": "bf16 vs int8 report (HTML + PNG) from verl training logs",
    "progress": "where a verl job stands (step N of M, reward, step time, resume, cause) from its driver log",
    "plan": "the deployment plan for Ansible: artifacts to copy, node env, Ray job (JSON)",
    "smoke-job": "cluster smoke job: per-node proof that config, artifacts and patch are there",
    "doctor": "check this node before deployment (JSON report, fixed exit codes)",
}


def command_module(name: str) -> str:
    return "rollout8.commands." + name.replace("-", "_")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="rollout8",
        description="Deploy GRPO with int8 (FlashRL) rollouts on Ascend NPU clusters.",
    )
    parser.add_argument("--version", action="version", version=f"rollout8 {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = build_parser()
    if not argv or argv[0] not in COMMANDS:
        args = top.parse_args(argv)  # prints help/version or the error for an unknown command
        top.print_help()
        return 2
    name, rest = argv[0], argv[1:]
    module_name, help_text = command_module(name), COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            print(f"rollout8 {name}: not available in this build", file=sys.stderr)
            return 2
        print(f"rollout8 {name}: missing dependency '{exc.name}' (install rollout8 with the right extra)",
              file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog=f"rollout8 {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except Rollout8Error as exc:
        print(f"rollout8 {name}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"rollout8 {name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
