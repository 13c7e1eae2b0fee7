"""Activation of rollout8's FlashRL fixes. `rollout8.activate`, imported by the patched `verl/__init__.py` right after
`import flash_rl`, calls activate() once per process; importing this module itself does nothing.

What activate() does:
- on a machine with torch_npu: imports `torch_npu.contrib.transfer_to_npu` unless already imported, so that
  FlashRL's `torch.cuda.*` calls (looked up at call time, at LLM construction and on each weight sync) reach
  the NPU. ROLLOUT8_TRANSFER_TO_NPU=0 turns this off;
- checks FLASHRL_CONFIG when it is set: it must be an absolute path to an existing file (or one of FlashRL's
  profile-free names such as `bf16`), and the `model`/`profile` paths inside it must be absolute and exist.
  Otherwise FlashRL would take the value for a Hugging Face hub path and try to download it (stack-facts
  trap 2); we raise ActivationError naming the variable and the fix instead;
- wraps torch.distributed.init_process_group so that every rank says when it waits for its communicator and when
  it joined (rollout8.node.communicator; `communicator=yes|no-torch|disabled` in the line);
- arms the per-part timing of every weight sync (rollout8.node.sync_timing; `sync_timing=yes|disabled`);
- logs one line starting with MARKER, which `rollout8 logs` greps. Its fields are space-free key=value tokens:
  `rollout8: flash_rl activation: config=<path|unset|bf16...> fn=<fn,fn|-> vllm_hooked=<yes|no|no-vllm|no-flash_rl>
  transfer_to_npu=<imported|already-imported|not-installed|disabled|failed>
  communicator=<yes|no-torch|disabled> sync_timing=<yes|disabled> pid=N`, then, for a failed
  transfer_to_npu, ` reason=...` (free text, last). Level INFO, WARNING when something is off.

It never fails on a CPU machine because of a missing NPU stack: torch and torch_npu are looked up, not required.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys

from ..errors import Rollout8Error
from . import communicator, sync_timing

MARKER = "rollout8: flash_rl activation"
TRANSFER_MODULE = "torch_npu.contrib.transfer_to_npu"
# FLASHRL_CONFIG values FlashRL resolves to built-in configs instead of a file (flash_rl/vllm_patch.py).
PROFILE_FREE_CONFIGS = ("bf16", "fp8", "fp8_vllm", "fp8_fast", "fp8_vllm_fast")
# fns whose config entries name no profile file
_NO_PROFILE_FNS = ("bf16", "fp8", "fp8_vllm", "fp8_fast", "fp8_vllm_fast")

logger = logging.getLogger("rollout8.activate")


class ActivationError(Rollout8Error):
    """FLASHRL_CONFIG (or a path in it) would make FlashRL fall back to a hub download."""


def check_flashrl_config(value: str | None) -> tuple[str, str]:
    """Validate a FLASHRL_CONFIG value; returns (config, fns) for the log line. Raises ActivationError if unusable."""
    if value is None:
        return "unset", "-"
    raw = value.strip()
    if raw in PROFILE_FREE_CONFIGS:
        return raw, raw
    if not os.path.isabs(raw):
        raise ActivationError(f"FLASHRL_CONFIG={raw} is not an absolute path: FlashRL would treat it as a "
                              "Hugging Face hub path and try to download it. Set it to the absolute path of the "
                              "config file on every node (export it before `ray start`).")
    if not os.path.isfile(raw):
        raise ActivationError(f"FLASHRL_CONFIG={raw} does not exist on this node: FlashRL would treat it as a "
                              "Hugging Face hub path and try to download it. Copy the config to the same path on "
                              "every node (or fix the path) before starting Ray.")
    from ..yamlio import read_yaml

    try:  # strict: a key given twice (FlashRL would keep the last, silently) or not a string is refused
        data = read_yaml(raw, what="FlashRL config", error=ActivationError)
    except (OSError, ActivationError) as exc:
        raise ActivationError(f"FLASHRL_CONFIG={raw} is not readable YAML: {exc}") from exc
    entries = data.get("configs") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ActivationError(f"FLASHRL_CONFIG={raw} has no `configs:` list of entries (write it with "
                              "`rollout8 setup`)")
    for i, entry in enumerate(entries):
        fn = str(entry.get("fn", "int8"))
        checks = [("model", os.path.isdir, "directory")]
        if fn not in _NO_PROFILE_FNS:
            checks.append(("profile", os.path.isfile, "file"))
        for key, exists, kind in checks:
            path = entry.get(key)
            if path is None:
                continue
            path = str(path).strip()
            if not os.path.isabs(path) or not exists(path):
                raise ActivationError(f"FLASHRL_CONFIG={raw}: configs[{i}].{key}={path!r} is not an absolute path "
                                      f"to an existing {kind} on this node: FlashRL would try a hub download. "
                                      "Put the artifacts at the same absolute path on every node.")
    return raw, ",".join(str(e.get("fn", "int8")) for e in entries)


def activate_transfer_to_npu() -> tuple[str, str]:
    """Import transfer_to_npu where torch_npu is installed. Returns (state, reason); never raises."""
    if os.environ.get("ROLLOUT8_TRANSFER_TO_NPU", "1") == "0":
        return "disabled", ""
    if TRANSFER_MODULE in sys.modules:
        return "already-imported", ""
    try:
        if importlib.util.find_spec("torch_npu") is None:
            return "not-installed", ""
        importlib.import_module(TRANSFER_MODULE)
    except Exception as exc:  # a broken NPU stack must not take verl's import down with it; the log line says so
        return "failed", f"{type(exc).__name__}: {exc}"
    return "imported", ""


def flashrl_hooked() -> str:
    """Whether `import flash_rl` hooked vLLM's LLM in this process (it only does with FLASHRL_CONFIG set)."""
    if "flash_rl" not in sys.modules:
        return "no-flash_rl"
    vllm = sys.modules.get("vllm")
    if vllm is None:
        return "no-vllm"
    llm = getattr(vllm, "LLM", None)
    return "yes" if llm is not None and hasattr(llm, "beforeflashrl__init__") else "no"


def _emit(level: int, message: str) -> None:
    # Own stderr handler, not propagated: the line must appear whatever FLASHRL_LOGGING_LEVEL or verl's logging
    # config say, and exactly once (flash_rl adds a handler to the root logger).
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.INFO)
    logger.log(level, message)


def activate() -> dict[str, str]:
    """Run the activation steps and log the one line; returns its fields (for tests and `rollout8 doctor`)."""
    transfer, reason = activate_transfer_to_npu()
    try:
        config, fns = check_flashrl_config(os.environ.get("FLASHRL_CONFIG"))
    except ActivationError as exc:
        _emit(logging.ERROR, f"{MARKER}: config=invalid pid={os.getpid()} reason={exc}")
        raise
    fields = {"config": config, "fn": fns, "vllm_hooked": flashrl_hooked(), "transfer_to_npu": transfer,
              "communicator": communicator.watch(),
              "sync_timing": sync_timing.install(), "pid": str(os.getpid())}
    if reason:
        fields["reason"] = reason
    bad = transfer == "failed" or (config != "unset" and fields["vllm_hooked"] != "yes")
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    _emit(logging.WARNING if bad else logging.INFO, f"{MARKER}: {text}")
    return fields

