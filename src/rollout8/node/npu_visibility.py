"""Do the NPUs stay visible where verl runs? Ray renumbers or hides them unless told not to.

Ray treats the `NPU` resource as Ascend accelerators: a worker that holds NPUs gets ASCEND_RT_VISIBLE_DEVICES set
to its ids, and a process that holds none (Ray 2.46's job supervisor, whose child is the `ray job submit`
entrypoint: verl's driver) gets it set to the empty string, so `torch.npu.is_available()` is False there (ray
#59063; the supervisor sets CUDA's no-set flag only, fixed after 2.46 by ray PR #59163). What protects a run is
RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1 in the environment of `ray start` on every node: every worker
inherits it and Ray then leaves the variable alone
(`NPUAcceleratorManager.set_current_process_visible_accelerator_ids`).

Asked by the probe job in its driver (the job entrypoint) and in a Ray worker holding the node's NPUs. On a CPU
node (the simulated cluster) the same custom `NPU` resource makes Ray behave exactly this way, so the judgment
reads the environment Ray gave the process; where torch_npu is installed it asks torch.npu as well.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

NOSET = "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"
VISIBLE = "ASCEND_RT_VISIBLE_DEVICES"
FIX = f"export {NOSET}=1 on every node before `ray start` (rollout8 render does; a hand-started Ray lacks it)"


def _ask_torch_npu() -> dict:
    try:
        import torch
        import torch_npu  # noqa: F401
    except ImportError:
        return {"npu_available": None, "npu_count": None}
    except Exception as exc:  # a torch_npu that does not load (CANN mismatch) is a finding, not a crash
        return {"npu_available": False, "npu_count": 0, "npu_error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"npu_available": bool(torch.npu.is_available()), "npu_count": int(torch.npu.device_count())}


def npu_visibility(environ: Mapping[str, str] | None = None, ask: Callable[[], dict] = _ask_torch_npu) -> dict:
    """What this process sees: the no-set flag, ASCEND_RT_VISIBLE_DEVICES (None if unset) and torch.npu's answer
    (None where torch_npu is not installed)."""
    environ = os.environ if environ is None else environ
    return {"noset": environ.get(NOSET), "visible": environ.get(VISIBLE), **ask()}


def judge_npu_visibility(seen: dict, where: str, accelerator: str) -> tuple[bool, str]:
    """(ok, one line) for one process; `where` names it ('the `ray job submit` entrypoint', 'a Ray worker ...')."""
    visible = seen.get("visible")
    if visible == "":
        return False, (f"ASCEND_RT_VISIBLE_DEVICES='' in {where}: Ray hid every NPU from it (ray #59063: Ray 2.46's "
                       f"job supervisor sets the no-set flag for CUDA only); {FIX}")
    if not seen.get("noset"):
        got = "unset" if visible is None else f"ASCEND_RT_VISIBLE_DEVICES={visible} (set by Ray)"
        return False, f"{NOSET} is not in the environment of {where} ({got}): Ray renumbers the NPUs; {FIX}"
    available = seen.get("npu_available")
    if available is None:
        if accelerator == "npu":
            return False, f"torch_npu is not importable in {where}: an NPU run needs the rollout8 image"
        return True, (f"{NOSET}=1 and ASCEND_RT_VISIBLE_DEVICES "
                      f"{'not set' if visible is None else '=' + visible} in {where} (CPU node: no torch_npu, "
                      f"judged from the environment Ray gave it)")
    if not available:
        why = seen.get("npu_error") or "torch.npu.is_available() is False"
        return False, f"{why} in {where} although Ray left ASCEND_RT_VISIBLE_DEVICES alone: check the driver (npu-smi)"
    return True, f"torch.npu.is_available() in {where}: {seen.get('npu_count')} NPU(s), {NOSET}=1"
