"""Is the CANN environment loaded in this process? torch_npu and vLLM-Ascend need what CANN's set_env.sh scripts
export (ASCEND_TOOLKIT_HOME, ASCEND_OPP_PATH, the toolkit's LD_LIBRARY_PATH). The image sources them in its
entrypoint, `/usr/local/bin/rollout8-entrypoint`; a bare `docker exec` never runs the entrypoint, so every
command the roles start in the training container goes through it (rollout8_container_exec_prefix). Asked by the
probe job in the driver and in a Ray worker on every node, and by the acceptance suite before its first step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

SET_ENV_SCRIPTS = ("/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/nnal/atb/set_env.sh")
REQUIRED = ("ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")
ENTRYPOINT = "/usr/local/bin/rollout8-entrypoint"


def cann_env(environ: Mapping[str, str] | None = None,
             exists: Callable[[str], bool] = os.path.exists) -> dict:
    """What this process sees: whether CANN is installed here (its set_env.sh) and the variables it exports."""
    environ = os.environ if environ is None else environ
    return {"installed": exists(SET_ENV_SCRIPTS[0]),
            "vars": {k: environ.get(k) for k in REQUIRED},
            "ld_library_path_has_toolkit": "ascend-toolkit" in environ.get("LD_LIBRARY_PATH", "")}


def judge_cann_env(report: dict, accelerator: str) -> tuple[bool, str]:
    """(ok, one line). CANN installed: its variables must be set. Not installed: fine on a CPU run only."""
    missing = [k for k, v in report["vars"].items() if not v]
    if not report["installed"]:
        if accelerator == "cpu":
            return True, "no CANN toolkit in this runtime (CPU run)"
        return False, f"no CANN toolkit ({SET_ENV_SCRIPTS[0]} absent): an NPU run needs the rollout8 image"
    if missing or not report["ld_library_path_has_toolkit"]:
        return False, (f"CANN is installed but its environment is not loaded in this process "
                       f"({', '.join(missing) or 'LD_LIBRARY_PATH without the toolkit'} unset): start it through "
                       f"{ENTRYPOINT} (what the roles prefix every docker exec with)")
    return True, "CANN environment loaded: " + ", ".join(f"{k}={v}" for k, v in report["vars"].items())
