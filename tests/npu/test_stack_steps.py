"""NPU acceptance: the steps around the engine (cann-pairing, ray-npu, weight-sync, hccl). Each records one
PASS/FAIL/SKIP line (conftest). The judging is rollout8.node.accept_npu (tested on CPU in
tests/unit/test_accept_npu.py); this file gathers the facts on the node and asserts the verdict.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
from npu_support import record

from rollout8.node import accept_npu

HERE = Path(__file__).resolve().parent


def _judge(step: accept_npu.StepResult) -> None:
    record(step)
    if step.status == accept_npu.SKIP:
        pytest.skip(step.line())
    assert step.ok, step.line()


def _cann_version() -> str | None:
    for path in accept_npu.cann_version_files(Path("/usr/local/Ascend")):
        if path.is_file():
            version = accept_npu.read_version_file(path.read_text(errors="replace"))
            if version:
                return version
    return None


def test_6_cann_pairing():
    """`import torch_npu` in a fresh process: an undefined symbol there is a CANN / torch_npu mismatch."""
    from rollout8.lock import load_lock

    proc = subprocess.run([sys.executable, "-c", accept_npu.IMPORT_PROBE], capture_output=True, text=True,
                          timeout=600)
    try:
        version = importlib.metadata.version("torch_npu")
    except importlib.metadata.PackageNotFoundError:
        version = None
    probe = accept_npu.ImportProbe(proc.returncode, proc.stdout + proc.stderr, version, _cann_version())
    _judge(accept_npu.check_cann_pairing(probe, load_lock()))


def _job_api_up(address: str) -> bool:
    try:
        with urllib.request.urlopen(address.rstrip("/") + "/api/version", timeout=10) as response:
            return response.status == 200
    except OSError:
        return False


def test_7_ray_npu():
    """torch.npu.is_available() in a `ray job submit` entrypoint and in a task with resources={"NPU": 1}."""
    address = accept_npu.ray_job_address(os.environ)
    ray_cli = Path(sys.executable).with_name("ray")
    ray_cli = str(ray_cli) if ray_cli.is_file() else shutil.which("ray")
    if ray_cli is None:
        _judge(accept_npu.check_ray_npu(returncode=None, output=f"no `ray` command beside {sys.executable} or on "
                                                                 f"PATH: the image's Ray is missing"))
    if not _job_api_up(address):
        _judge(accept_npu.check_ray_npu(returncode=None, output="", skip=accept_npu.NO_RAY.format(address=address)))
    proc = subprocess.run([ray_cli, "job", "submit", "--address", address, "--working-dir", str(HERE), "--",
                           sys.executable, "ray_npu_probe.py"], capture_output=True, text=True, timeout=900)
    _judge(accept_npu.check_ray_npu(returncode=proc.returncode, output=proc.stdout + proc.stderr))


def test_8_weight_sync(request, work):
    """One FlashRL weight sync of the 7B-shaped model, in seconds and GB/s, post-load step measured apart."""
    from rollout8.quant.testmodels import PRESETS

    preset = os.environ.get("ROLLOUT8_ACCEPT_SYNC_PRESET", "bench-7b")
    if not os.environ.get("ROLLOUT8_ACCEPT_BF16") and not (work / f"pair-{preset}").is_dir():
        problem = accept_npu.room_problem(shutil.disk_usage(work).free,
                                          accept_npu.generated_pair_bytes(PRESETS[preset]), work)
        if problem:
            _judge(accept_npu.check_weight_sync(None, model=f"pair-{preset}", error=problem))
    sync_models, sync_run = request.getfixturevalue("sync_models"), request.getfixturevalue("sync_run")
    start, sync = sync_run.step("start"), sync_run.step("sync2")
    model = sync_models.bf16.name if os.environ.get("ROLLOUT8_ACCEPT_BF16") else sync_models.bf16.parent.name
    timing, error = None, None
    if not start.get("ok"):
        error = f"vllm.LLM did not start: {start.get('error')}"
    elif not sync.get("ok"):
        error = f"sync: {sync.get('error')}"
    else:
        timing = accept_npu.SyncTiming(sync["seconds"], sync.get("post_load_seconds"), sync["bytes"],
                                       sync["parameters"], sync.get("parts"))
    step = accept_npu.check_weight_sync(timing, model=model, error=error,
                                        min_gbps=accept_npu.min_sync_gbps(os.environ))
    first = sync_run.step("sync1")
    if first.get("ok"):
        step.details.append(f"first sync (one-off allocations included): {first['seconds']:.1f} s")
    _judge(step)


def _largest_weight() -> tuple[str, tuple[int, int]]:
    bf16 = os.environ.get("ROLLOUT8_ACCEPT_BF16")
    if bf16:
        return accept_npu.largest_weight(json.loads((Path(bf16) / "config.json").read_text()))
    from rollout8.quant.testmodels import PRESETS

    preset = os.environ.get("ROLLOUT8_ACCEPT_SYNC_PRESET", "bench-7b")
    return accept_npu.largest_weight(dataclasses.asdict(PRESETS[preset]))


def test_9_hccl():
    """With two nodes: an HCCL broadcast and all-reduce of a tensor as large as the model's largest weight."""
    plan, problem = accept_npu.hccl_plan(os.environ)
    name, shape = _largest_weight()
    if plan is None:
        _judge(accept_npu.check_hccl(None, None, tensor=name, shape=shape, problem=problem))
    timeout = int(os.environ.get("HCCL_CONNECT_TIMEOUT", "600")) + 900
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "hccl.json"
        try:
            subprocess.run([sys.executable, str(HERE / "hccl_probe.py"), str(out), plan.master, str(plan.port),
                            str(plan.rank), str(plan.world), str(shape[0]), str(shape[1])], timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        probe = json.loads(out.read_text()) if out.is_file() else None
    _judge(accept_npu.check_hccl(plan, probe, tensor=name, shape=shape))
