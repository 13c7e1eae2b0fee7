"""The NPU acceptance suite: what a user runs on the first real Ascend node before any training.

Every test here is marked `npu`. Without an NPU (no /dev/davinci*, no npu-smi, no torch_npu or vllm_ascend)
each is skipped with that reason; `make accept-npu` refuses up front with a plain message instead.

Models (environment variables; all optional):
  ROLLOUT8_ACCEPT_BF16 / ROLLOUT8_ACCEPT_INT8  a real bf16 model and its W8A8 twin (compressed-tensors, converted
                                               here with `rollout8 convert --to ascend`, or already ascend)
  ROLLOUT8_ACCEPT_PROFILE                       their FlashRL profile (computed with `rollout8 profile` if unset)
  ROLLOUT8_ACCEPT_PRESET                        without the two above: a generated pair (default bench-0.5b, the
                                               Qwen2.5-0.5B shape with random weights; no hub access)
  ROLLOUT8_ACCEPT_WORK                          where models, configs and engine outputs go
                                               (default ~/.cache/rollout8/accept)
Every step's PASS/FAIL line is printed at the end of the run (and written to WORK/acceptance.txt).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollout8.npu_accept import NEEDS_NPU, StepResult, format_report, npu_absent_reason

HERE = Path(__file__).resolve().parent
ENGINE_TIMEOUT_S = int(os.environ.get("ROLLOUT8_ENGINE_TIMEOUT", "1800"))
RESULTS: dict[str, StepResult] = {}


def _cann_pin() -> str:
    try:
        from rollout8.lock import load_lock

        return load_lock().cann.version
    except Exception:  # noqa: BLE001 - only decorates the skip message
        return "as pinned"


def pytest_collection_modifyitems(config, items):
    why = npu_absent_reason()
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.npu)
            if why:
                item.add_marker(pytest.mark.skip(reason=NEEDS_NPU.format(cann=_cann_pin(), why=why)))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not RESULTS:
        return
    ordered = [RESULTS[s] for s in ("environment", "loading", "reload", "logs", "speed") if s in RESULTS]
    text = format_report(ordered)
    terminalreporter.section("NPU acceptance")
    for r in ordered:
        terminalreporter.write_line(r.line())
        for d in r.details if r.step == "speed" else []:
            terminalreporter.write_line("    " + d)
    terminalreporter.write_line(text.splitlines()[-1])
    work = os.environ.get("ROLLOUT8_ACCEPT_WORK_RESOLVED")
    if work:
        Path(work, "acceptance.txt").write_text(text + "\n")


def record(step: StepResult) -> StepResult:
    RESULTS[step.step] = step
    return step


def rollout8(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rollout8", *args], capture_output=True, text=True, timeout=3600)


def rollout8_ok(*args: str) -> str:
    proc = rollout8(*args)
    if proc.returncode != 0:
        raise AssertionError(f"rollout8 {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


@dataclass
class AcceptModels:
    bf16: Path
    int8: Path  # ascend layout
    profile: Path
    num_layers: int


@pytest.fixture(scope="session")
def work() -> Path:
    root = Path(os.environ.get("ROLLOUT8_ACCEPT_WORK", Path.home() / ".cache" / "rollout8" / "accept"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ["ROLLOUT8_ACCEPT_WORK_RESOLVED"] = str(root)
    return root


@pytest.fixture(scope="session")
def models(work) -> AcceptModels:
    from rollout8.quant_layout import ASCEND, detect_layout

    bf16, int8 = os.environ.get("ROLLOUT8_ACCEPT_BF16"), os.environ.get("ROLLOUT8_ACCEPT_INT8")
    if bool(bf16) != bool(int8):
        pytest.fail("set both ROLLOUT8_ACCEPT_BF16 and ROLLOUT8_ACCEPT_INT8, or neither")
    if not bf16:
        preset = os.environ.get("ROLLOUT8_ACCEPT_PRESET", "bench-0.5b")
        rollout8_ok("make-test-model", "-o", str(work / f"pair-{preset}"), "--preset", preset)
        bf16, int8 = str(work / f"pair-{preset}" / "bf16"), str(work / f"pair-{preset}" / "int8")
    bf16_dir, int8_dir = Path(bf16).resolve(), Path(int8).resolve()
    if detect_layout(int8_dir) != ASCEND:
        converted = work / f"{int8_dir.name}-ascend"
        rollout8_ok("convert", "--to", "ascend", str(int8_dir), str(converted))
        int8_dir = converted
    profile = os.environ.get("ROLLOUT8_ACCEPT_PROFILE")
    if profile:
        profile_path = Path(profile).resolve()
    else:
        profile_path = work / f"{int8_dir.name}.profile.pt"
        if not profile_path.is_file():
            rollout8_ok("profile", "-m", str(bf16_dir), "-q", str(int8_dir), "-o", str(profile_path), "--quiet")
    layers = json.loads((bf16_dir / "config.json").read_text())["num_hidden_layers"]
    return AcceptModels(bf16_dir, int8_dir, profile_path, layers)


@dataclass
class EngineRun:
    out: Path
    log: Path
    stdout: str

    @property
    def steps(self) -> dict:
        path = self.out / "results.json"
        return json.loads(path.read_text())["steps"] if path.is_file() else {}

    def step(self, label: str) -> dict:
        return self.steps.get(label, {"ok": False, "error": f"step {label!r} did not run; engine output tail:\n"
                                                              f"{self.stdout[-2000:]}"})


def run_engine(out: Path, *, model: Path, flashrl_config: Path, steps: list[str], **spec_fields) -> EngineRun:
    sys.path.insert(0, str(HERE.parent / "engine"))
    from engine_platform import engine_env

    out.mkdir(parents=True, exist_ok=True)
    log = out / "flashrl.log"
    log.unlink(missing_ok=True)
    spec = {"out": str(out), "model": str(model), "steps": steps, **spec_fields}
    (out / "spec.json").write_text(json.dumps(spec, indent=2))
    env = engine_env(rank=0, world_size=1, flashrl_config=flashrl_config, log_file=log)
    proc = subprocess.run([sys.executable, str(HERE / "npu_worker.py"), str(out / "spec.json")], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=ENGINE_TIMEOUT_S)
    (out / "engine.out").write_text(proc.stdout)
    return EngineRun(out, log, proc.stdout)


@pytest.fixture(scope="session")
def int8_config(models, work) -> Path:
    out = work / "flashrl-int8.yaml"
    rollout8_ok("setup", "--fn", "int8", "-m", str(models.int8), "-p", str(models.profile), "-o", str(out))
    return out


@pytest.fixture(scope="session")
def bf16_config(models, work) -> Path:
    out = work / "flashrl-bf16.yaml"
    rollout8_ok("setup", "--fn", "bf16", "-b", str(models.bf16), "-o", str(out))
    return out


INT8_STEPS = ["generate:gen0", "reload:reload1", "generate:gen1", "dump-int8:int8_after_reload", "speed:speed"]


@pytest.fixture(scope="session")
def int8_run(models, int8_config, work) -> EngineRun:
    return run_engine(work / "engine-int8", model=models.bf16, flashrl_config=int8_config, steps=INT8_STEPS)


@pytest.fixture(scope="session")
def bf16_run(models, bf16_config, work) -> EngineRun:
    return run_engine(work / "engine-bf16", model=models.bf16, flashrl_config=bf16_config, steps=["speed:speed"])
