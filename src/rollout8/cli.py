"""The single console entry point: `rollout8 <command>`.

Each command lives in its own module, rollout8/commands/<command>.py (dashes become underscores), which defines
`add_arguments(parser)` and `run(args) -> int`.
Modules are imported only when their command runs, so `rollout8 lock` does not pay for torch.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
import traceback

from .errors import Rollout8Error
from .fileutil import failed_write_cause

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
    "import": "write a run spec from a verl launch script (bash, read and never run)",
    "verify-quant": "apply a profile to bf16 weights and compare with the int8 checkpoint",
    "logs": "verdict per rollout rank from Ray/verl/FlashRL logs: did int8 really run?",
    "convert": "convert a compressed-tensors W8A8 model to the vllm-ascend W8A8_DYNAMIC layout",
    "report": "bf16 vs int8 report (HTML + PNG) from verl training logs",
    "progress": "where a verl job stands (step N of M, reward, step time, resume, cause) from its driver log",
    "spec-diff": "the keys changed between two versions of a run spec, and whether its checkpoints resume",
    "collect-merge": "append a node's log delta (verify's incremental collection) to the controller's copies",
    "plan": "the deployment plan for Ansible: artifacts to copy, node env, Ray job (JSON)",
    "probe-job": "cluster probe job: per-node proof that config, artifacts and patch are there",
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
    parser.add_argument("--debug", action="store_true", help="on an error, show the Python traceback too")
    args = parser.parse_args(rest)
    debug = args.debug or os.environ.get("ROLLOUT8_DEBUG") == "1"
    # SIGTERM unwinds like ^C: every cleanup runs and temporaries are removed
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    _received.clear()
    try:
        return int(module.run(args) or 0)
    except Rollout8Error as exc:
        if debug:
            traceback.print_exc()
        print(f"rollout8 {name}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (KeyboardInterrupt, Terminated):
        return _stopped(name)
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # the error edge: one line, never a traceback (unless --debug)
        if _received:  # a signal raised inside a library that wrapped it in its own exception
            return _stopped(name)
        if debug:
            traceback.print_exc()
        print(f"rollout8 {name}: error: {describe(exc)}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Terminated(BaseException):
    """SIGTERM, raised where the process is, so every `finally` and cleanup runs (KeyboardInterrupt's twin)."""


_received: set[int] = set()


def _on_signal(signum, frame) -> None:
    _received.add(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _stopped(name: str) -> int:
    """The line and exit code of a command stopped by SIGTERM (143) or ^C (130), its cleanups done."""
    terminated = signal.SIGTERM in _received
    print(f"rollout8 {name}: {'terminated' if terminated else 'interrupted'}; nothing half-written was left",
          file=sys.stderr)
    return 143 if terminated else 130


# errno -> what to do about it
_OS_HINTS = {errno.ENOENT: "check the path", errno.EACCES: "check its permissions (or run as its owner)",
             errno.EPERM: "check its permissions (or run as its owner)", errno.EISDIR: "name a file, not a directory",
             errno.ENOTDIR: "a parent of it is a file, not a directory", errno.ENOSPC: "free disk space and re-run",
             errno.EROFS: "it is on a read-only filesystem: write elsewhere", errno.EEXIST: "remove it or name another",
             errno.ENAMETOOLONG: "use a shorter path"}


def describe(exc: BaseException) -> str:
    """One line for an error no command turned into a Rollout8Error: what, where (when known), what to do."""
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        hint = _OS_HINTS.get(exc.errno or 0, "check the path and re-run")
        return f"{where}{exc.strerror or exc}; {hint}"
    if isinstance(exc, MemoryError):
        return "out of memory: an input is much larger than it should be, or this machine has too little RAM"
    if isinstance(exc, UnicodeDecodeError):
        return f"an input file is not UTF-8 text ({exc.reason} at byte {exc.start}); give the text file it expects"
    kind = type(exc).__name__
    module = type(exc).__module__.split(".")[0]
    if cause := failed_write_cause(exc):  # a library's failed write (safetensors, pyarrow): never the input's fault
        return f"a write failed: {cause} ({kind}: {exc}); free space, or name an output on a writable filesystem"
    if kind == "JSONDecodeError":
        return f"an input is not valid JSON ({exc}); check the file named in the command"
    if module == "yaml":
        mark = getattr(exc, "problem_mark", None)
        where = f"{mark.name}:{mark.line + 1}: " if mark is not None else ""
        return f"{where}not valid YAML ({getattr(exc, 'problem', None) or exc}); fix the file"
    if kind in ("UnpicklingError", "SafetensorError", "HeaderTooLarge") or module == "safetensors":
        return f"an input is not the file it should be ({kind}: {exc}); check the paths given"
    return f"unexpected {kind}: {exc} (a bug in rollout8: re-run with --debug and report the traceback)"


if __name__ == "__main__":
    sys.exit(main())
