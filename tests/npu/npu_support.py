"""The parent side of the NPU acceptance suite: engine processes (npu_worker.py), the CLI, the step registry.

A module of its own (not conftest.py), so test modules import it by a name no other test directory uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import engine_runs  # the engine harness (virtual/engine): one way to start an engine process and read it back

from rollout8.node.accept_npu import STEPS, StepResult

HERE = Path(__file__).resolve().parent

ENGINE_TIMEOUT_S = int(os.environ.get("ROLLOUT8_ENGINE_TIMEOUT", "1800"))
# The int8 engine's steps: generate, one FlashRL weight update, generate, read the int8 weights back, timing.
INT8_STEPS = ["generate:gen0", "reload:reload1", "generate:gen1", "dump-int8:int8_after_reload", "speed:speed"]
STEP_ORDER = STEPS
RESULTS: dict[str, StepResult] = {}  # step -> its PASS/FAIL line, printed at the end of the session


def record(step: StepResult) -> StepResult:
    RESULTS[step.step] = step
    return step


def rollout8(*args: str) -> subprocess.CompletedProcess:
    """The real CLI, as a user runs it, in this interpreter (the image's)."""
    return engine_runs.rollout8(*args, check=False, python=sys.executable, timeout=3600)


def rollout8_ok(*args: str) -> str:
    proc = rollout8(*args)
    if proc.returncode != 0:
        raise AssertionError(f"rollout8 {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


class EngineRun(engine_runs.EngineRun):
    """The engine tier's record of one engine process (OUT/results.json, its tensors, FlashRL's log), read so that
    a step the worker never reached is a failed step: the suite still prints its FAIL line."""

    @property
    def steps(self) -> dict:
        return self.results["steps"] if (self.out / "results.json").is_file() else {}

    def step(self, label: str) -> dict:
        return self.steps.get(label, {"ok": False, "error": f"step {label!r} did not run; engine output tail:\n"
                                                              f"{self.stdout[-2000:]}"})


def run_engine(out: Path, *, model: Path, flashrl_config: Path, steps: list[str], **spec_fields) -> EngineRun:
    """npu_worker.py as a fresh engine process, started by the engine tier's one launcher (one rollout rank's
    environment); a worker that recorded nothing gives failed steps, not an error."""
    run = engine_runs.run_engine(out, model=model, flashrl_config=flashrl_config, steps=steps,
                                 worker=HERE / "npu_worker.py", timeout=ENGINE_TIMEOUT_S, require_results=False,
                                 **spec_fields)
    return EngineRun(run.out, run.log, run.stdout)
