"""The suite's entry on a node: `python -m rollout8.node.accept_npu` (scripts/accept-npu.sh, `make accept-npu`)
decides whether the suite can run here before pytest runs the steps in tests/npu: exit 0 on an NPU node (1 when
the CANN environment did not reach this process), else the plain reason and exit 3."""

from __future__ import annotations

import sys
from pathlib import Path

NEEDS_NPU = ("the NPU acceptance suite needs an Ascend NPU node (driver, CANN {cann}, torch_npu, vllm-ascend): "
             "{why}. Run it on the first real node before any training: `make accept-npu`")


def npu_absent_reason(*, dev: Path = Path("/dev"), which=None, find_spec=None) -> str | None:
    """Why this machine cannot run the suite (None when it can): no /dev/davinci*, no npu-smi, no torch_npu
    or no vllm_ascend. Cheap: imports nothing heavy."""
    import importlib.util
    import shutil

    which = which or shutil.which
    find_spec = find_spec or importlib.util.find_spec
    if not (dev / "davinci_manager").exists() and not any(dev.glob("davinci[0-9]*")):
        return f"no Ascend device nodes ({dev}/davinci*)"
    if which("npu-smi") is None:
        return "npu-smi is not on PATH"
    for module in ("torch_npu", "vllm_ascend"):
        if find_spec(module) is None:
            return f"python module {module} is not installed"
    return None


def main() -> int:
    """`python -m rollout8.node.accept_npu`: exit 0 on an NPU node, else print why not (plainly) and exit 3."""
    from ..cann_env import cann_env, judge_cann_env

    seen = cann_env()
    cann_ok, cann_line = judge_cann_env(seen, "npu")
    why = npu_absent_reason()
    if seen["installed"] or why is None:  # a machine with neither CANN nor an NPU hears only the plain reason
        print(f"accept-npu: {'' if cann_ok else 'FAIL '}{cann_line}", file=sys.stderr)
    if why is None:
        return 0 if cann_ok else 1
    try:
        from ...lock import load_lock

        cann = load_lock().cann.version
    except Exception:  # noqa: BLE001 - the message stays useful without the lock
        cann = "as pinned"
    print("accept-npu: " + NEEDS_NPU.format(cann=cann, why=why), file=sys.stderr)
    return 3
