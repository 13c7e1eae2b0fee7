"""`rollout8 doctor`: is this node ready? Run it by hand before a deployment, or let Ansible's preflight run it.

Each check gives ok / warn / fail / skip with one line of detail and, when not ok, what to do.
The JSON report (`--json`) is the contract for automation; the exit code is fixed:
0 = no failure (warnings allowed), 1 = at least one failure, 2 = the doctor itself could not run.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"

# Python distributions whose installed version must equal the lock's pin on a node (name in the lock's `pypi`).
LOCKED_DISTRIBUTIONS = ("torch", "torch_npu", "flash-llm-rl", "ray")
NPU_ONLY = ("torch_npu",)


@dataclass
class Result:
    check: str
    status: str
    detail: str
    fix: str = ""


def _gib(n_bytes: float) -> float:
    return n_bytes / 2**30


def check_python(expected: str) -> Result:
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if have == expected:
        return Result("python", OK, f"Python {have}")
    return Result("python", WARN, f"Python {have}, the image pins {expected}",
                  "fine for the CPU tools; training nodes should run the rollout8 image")


def check_versions(pins: dict[str, str], accelerator: str) -> list[Result]:
    results = []
    for dist in LOCKED_DISTRIBUTIONS:
        want = pins.get(dist)
        if want is None:
            continue
        name = f"version:{dist}"
        try:
            have = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            if accelerator == "cpu" and dist in NPU_ONLY:
                results.append(Result(name, SKIP, f"{dist} not installed (accelerator cpu)"))
            else:
                results.append(Result(name, FAIL, f"{dist} is not installed (lock: {want})",
                                      f"install {dist}=={want} or run inside the rollout8 image"))
            continue
        base = have.split("+", 1)[0]
        if base == want:
            results.append(Result(name, OK, f"{dist} {have}"))
        elif accelerator == "cpu":
            results.append(Result(name, WARN, f"{dist} {have}, lock says {want}",
                                  "acceptable on CPU test nodes only"))
        else:
            results.append(Result(name, FAIL, f"{dist} {have}, lock says {want}",
                                  f"install {dist}=={want} or run inside the rollout8 image"))
    return results


def check_flashrl_auto_patch() -> Result:
    """FlashRL's auto patch (usercustomize.py) must be off: the manual patch in verl/__init__.py is the one we use."""
    active = []
    for directory in {*site.getsitepackages(), site.getusersitepackages()}:
        path = Path(directory) / "usercustomize.py"
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            stripped = line.strip()
            if "import flash_rl" in stripped and not stripped.startswith("#"):
                active.append(str(path))
    if active:
        return Result("flashrl-auto-patch", FAIL, f"FlashRL's auto patch is active in {', '.join(active)}",
                      "run `flashrl cleanup` (the bundle uses the manual patch in verl/__init__.py)")
    return Result("flashrl-auto-patch", OK, "FlashRL's auto patch (usercustomize.py) is not active")


def check_flashrl_config() -> Result:
    value = os.environ.get("FLASHRL_CONFIG")
    if value is None:
        return Result("FLASHRL_CONFIG", WARN, "not set in this shell",
                      "fine before deployment; Ray workers get it from the rendered env file")
    path = Path(value)
    if not path.is_absolute():
        return Result("FLASHRL_CONFIG", FAIL, f"{value!r} is not an absolute path (FlashRL would treat it as a hub id)",
                      "point FLASHRL_CONFIG at the absolute path of the rendered flashrl.yaml")
    if not path.is_file():
        return Result("FLASHRL_CONFIG", FAIL, f"{value} does not exist on this node",
                      "distribute the rendered flashrl.yaml to the same path on every node")
    return Result("FLASHRL_CONFIG", OK, value)


def check_disk(path: Path, min_gib: float) -> Result:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = _gib(shutil.disk_usage(probe).free)
    name = f"disk:{path}"
    if free < min_gib:
        return Result(name, FAIL, f"{free:.1f} GiB free at {probe}, need {min_gib:g}",
                      "free space or point deploy.root elsewhere (--min-disk-gib to change the bound)")
    return Result(name, OK, f"{free:.1f} GiB free at {probe}")


def check_shm(min_gib: float) -> Result:
    shm = Path("/dev/shm")
    if not shm.exists():
        return Result("shm", FAIL, "/dev/shm does not exist", "mount a tmpfs on /dev/shm")
    size = _gib(shutil.disk_usage(shm).total)
    if size < min_gib:
        return Result("shm", FAIL, f"/dev/shm is {size:.1f} GiB, need {min_gib:g}",
                      "Ray's object store and vLLM use it: run containers with --shm-size or --ipc=host")
    return Result("shm", OK, f"/dev/shm {size:.1f} GiB")


def check_npus(expected: int) -> Result:
    if shutil.which("npu-smi") is None:
        return Result("npu-smi", FAIL, "npu-smi not found",
                      "install the Ascend driver, or mount /usr/local/bin/npu-smi")
    try:
        out = subprocess.run(["npu-smi", "info", "-l"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Result("npu-smi", FAIL, f"npu-smi info failed: {exc}", "check the driver with `npu-smi info`")
    count = sum(1 for line in out.splitlines() if line.strip().startswith("NPU ID"))
    if count < expected:
        return Result("npu-smi", FAIL, f"{count} NPUs visible, run spec wants {expected}",
                      "check `npu-smi info`, the container's --device flags, and ASCEND_RT_VISIBLE_DEVICES")
    return Result("npu-smi", OK, f"{count} NPUs visible")


def run_checks(accelerator: str, npus: int, root: Path, min_disk_gib: float, min_shm_gib: float) -> list[Result]:
    from ..lock import load_lock

    lock = load_lock()
    results = [check_python(str(lock.python))]
    results += check_versions(dict(lock.pypi), accelerator)
    results.append(check_flashrl_auto_patch())
    results.append(check_flashrl_config())
    results.append(check_disk(root, min_disk_gib))
    results.append(check_shm(min_shm_gib))
    if accelerator == "npu":
        results.append(check_npus(npus))
    else:
        results.append(Result("npu-smi", SKIP, "accelerator cpu: NPU checks skipped"))
    return results
