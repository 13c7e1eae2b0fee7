"""NPU acceptance: environment, loading, reload, logs, speed. Each test records one PASS/FAIL line (conftest).

The evaluation of every step is rollout8.node.accept_npu (tested on CPU in tests/unit/test_accept_npu.py); this file
only gathers the facts on the node and asserts the verdict.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
from pathlib import Path

from npu_support import record, rollout8

from rollout8.node import accept_npu
from rollout8.quant import quantmath
from rollout8.quant.checkpoint import Checkpoint


def gather_environment() -> accept_npu.EnvFacts:
    facts = accept_npu.EnvFacts()
    smi = shutil.which("npu-smi")
    if smi:
        proc = subprocess.run([smi, "info"], capture_output=True, text=True, timeout=120)
        if proc.returncode == 0:
            facts.npu_smi_text = proc.stdout
        else:
            facts.errors["npu-smi"] = f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"
    root = Path("/usr/local/Ascend")
    for path in accept_npu.cann_version_files(root):
        if path.is_file():
            version = accept_npu.read_version_file(path.read_text(errors="replace"))
            if version:
                facts.cann_version, facts.cann_source = version, str(path)
                break
    driver = root / "driver" / "version.info"
    if driver.is_file():
        facts.driver_version = accept_npu.read_version_file(driver.read_text(errors="replace"))
    try:
        import torch
        import torch_npu

        facts.torch_version, facts.torch_npu_version = torch.__version__, torch_npu.__version__
        facts.npu_device_count = torch.npu.device_count()
    except Exception as exc:  # noqa: BLE001 - reported as the failure
        facts.errors["torch_npu"] = f"{type(exc).__name__}: {exc}"
    try:
        importlib.import_module("vllm_ascend.vllm_ascend_C")
        facts.vllm_ascend_version = getattr(importlib.import_module("vllm_ascend"), "__version__", None)
    except Exception as exc:  # noqa: BLE001
        facts.vllm_ascend_c_error = f"{type(exc).__name__}: {exc}"
    return facts


def test_1_environment():
    from rollout8.lock import load_lock

    step = record(accept_npu.check_environment(gather_environment(), load_lock()))
    assert step.ok, step.line()


def _failed_step(run, label: str) -> str | None:
    s = run.step(label)
    return None if s.get("ok") else f"{label}: {s.get('error')}\n{s.get('traceback', '')}"


def test_2_loading(int8_run, models):
    start = int8_run.step("start")
    if not start.get("ok"):
        step = record(accept_npu.StepResult("loading", accept_npu.FAIL,
                                            f"vllm.LLM did not start: {start.get('error')}"))
        raise AssertionError(step.line() + "\n" + start.get("traceback", ""))
    gen = int8_run.step("gen0")
    step = record(accept_npu.check_loading(start, gen.get("texts", []), str(models.int8)))
    assert step.ok, step.line() + ("\n" + (_failed_step(int8_run, "gen0") or ""))


def test_3_reload(int8_run, models):
    """One FlashRL weight update, then generation, then the engine's int8 weights vs verify-quant's arithmetic.
    This is trap 6's open question: does the reload survive W8A8_DYNAMIC's transposed NZ-format weights?"""
    import torch

    problems = [p for p in (_failed_step(int8_run, s) for s in ("reload1", "gen1", "int8_after_reload")) if p]
    if problems:
        step = record(accept_npu.StepResult("reload", accept_npu.FAIL, problems[0].splitlines()[0]))
        raise AssertionError(step.line() + "\n" + "\n".join(problems))
    profile = torch.load(models.profile, map_location="cpu")
    wanted = [n for n in profile if profile[n]["type"] == torch.int8]
    expected_hf = dict(quantmath.apply_profile(Checkpoint(models.bf16).iter_tensors(wanted), profile))
    expected = accept_npu.expected_fused(expected_hf, models.num_layers)
    engine = torch.load(int8_run.out / "int8_after_reload.pt")
    step = record(accept_npu.check_reload(accept_npu.compare_engine_int8(engine, expected),
                                          generated_before=int8_run.step("gen0").get("texts", []),
                                          generated_after=int8_run.step("gen1").get("texts", []),
                                          formats=int8_run.step("int8_after_reload").get("formats")))
    assert step.ok, step.line()


def test_4_logs(int8_run):
    proc = rollout8("logs", str(int8_run.log))
    step = record(accept_npu.check_logs(proc.returncode, proc.stdout + proc.stderr))
    assert step.ok, step.line() + "\n" + proc.stdout[-3000:] + proc.stderr[-2000:]


def _speed(run, engine: str) -> accept_npu.SpeedRun | None:
    s = run.step("speed")
    if not s.get("ok"):
        return None
    return accept_npu.SpeedRun(engine, s["prompts"], s["tokens"], s["seconds"])


def test_5_speed(int8_run, bf16_run):
    step = record(accept_npu.check_speed(_speed(int8_run, "int8"), _speed(bf16_run, "bf16")))
    print("\n" + "\n".join(step.details))
    assert step.ok, step.line()
