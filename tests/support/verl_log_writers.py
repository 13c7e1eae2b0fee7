"""Write training logs in verl's formats, for the report tests.

Two ways, checked against each other in test_report.py:
- `verl_loggers()`: verl's own LocalLogger (console) and FileLogger (JSONL) classes, loaded by file path from a verl
  source tree (verl/__init__.py imports ray, so the package itself is not imported): $ROLLOUT8_VERL_SRC, an
  installed `verl`, else the verl 0.6.1 wheel from the shared wheel cache (upstream_wheels.py), whose
  verl/utils/tracking.py, verl/utils/logger/aggregate_logger.py and verl/trainer/ppo/metric_utils.py are
  byte-identical to those at the verl pin 51d2104.
- `ConsoleWriter` / `JsonlWriter`: the same formats written by hand from verl's code at the pin (51d2104, identical in
  v0.6.1): console `"step:{step}" + "".join(f" - {k}:{pprint.pformat(v)}" for numeric v)`, JSONL
  `json.dumps({"step": step, "data": data})` per line.
"""

from __future__ import annotations

import importlib.util
import json
import numbers
import os
import pprint
from pathlib import Path


def console_line(data: dict, step: int) -> str:
    parts = [f"step:{step}"] + [f"{k}:{pprint.pformat(v)}" for k, v in data.items() if isinstance(v, numbers.Number)]
    return " - ".join(parts)


class ConsoleWriter:
    def __init__(self, path: Path, prefix: str = ""):
        self.fh = open(path, "a", encoding="utf-8")
        self.prefix = prefix

    def log(self, data: dict, step: int) -> None:
        self.fh.write(self.prefix + console_line(data, step) + "\n")

    def write_raw(self, text: str) -> None:
        self.fh.write(text)

    def close(self) -> None:
        self.fh.close()


class JsonlWriter:
    def __init__(self, path: Path):
        self.fh = open(path, "w", encoding="utf-8")  # FileLogger opens with "w"

    def log(self, data: dict, step: int) -> None:
        self.fh.write(json.dumps({"step": step, "data": data}) + "\n")

    def write_raw(self, text: str) -> None:
        self.fh.write(text)

    def close(self) -> None:
        self.fh.close()


def _is_verl_tree(root: Path) -> bool:
    return (root / "verl" / "utils" / "tracking.py").is_file() and (
        root / "verl" / "utils" / "logger" / "aggregate_logger.py").is_file()


def verl_source(scratch: Path) -> tuple[Path | None, str]:
    """(a directory containing verl/, or None) and why not."""
    candidates = []
    if os.environ.get("ROLLOUT8_VERL_SRC"):
        candidates.append(Path(os.environ["ROLLOUT8_VERL_SRC"]))
    spec = importlib.util.find_spec("verl")  # does not execute verl/__init__.py
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent.parent)
    for root in candidates:
        if _is_verl_tree(root):
            return root, ""
    import upstream_wheels as uw

    try:
        whl = uw.wheel("verl", uw.VERL_STAND_IN_VERSION)
    except RuntimeError as exc:
        return None, str(exc).splitlines()[0]
    root = uw.unpack(whl, scratch, "verl")
    return (root, "") if _is_verl_tree(root) else (None, f"{whl.name} has no verl/utils/tracking.py")


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verl_loggers(root: Path):
    """verl's (LocalLogger, FileLogger) classes from the source tree at `root`."""
    aggregate = _load(root / "verl" / "utils" / "logger" / "aggregate_logger.py", "_verl_aggregate_logger")
    tracking = _load(root / "verl" / "utils" / "tracking.py", "_verl_tracking")
    return aggregate.LocalLogger, tracking.FileLogger


def train_metrics(step: int, step_time: float, reward: float, with_tis: bool = True,
                  with_throughput: bool = True) -> dict:
    """A training step's metrics with verl's key names (values are made up, shapes are verl's)."""
    gen = 0.6 * step_time
    data = {
        "training/global_step": step,
        "training/epoch": 0,
        "critic/score/mean": reward,
        "critic/rewards/mean": reward,
        "critic/advantages/mean": 0.0,
        "response_length/mean": 200.0 + step,
        "response_length/clip_ratio": 0.0,
        "prompt_length/mean": 100.0,
        "actor/pg_loss": -0.001 * step,
        "actor/grad_norm": 0.25,
        "timing_s/gen": gen,
        "timing_s/generate_sequences": gen - 0.5,
        "timing_s/generation_timing/max": gen - 0.4,
        "timing_s/old_log_prob": 0.1 * step_time,
        "timing_s/update_actor": 0.25 * step_time,
        "timing_s/step": step_time,
        "timing_per_token_ms/gen": 0.01,
        "perf/total_num_tokens": 12000,
        "perf/time_per_step": step_time,
    }
    if with_throughput:
        data["perf/throughput"] = 12000 / (step_time * 8)
    if with_tis:
        data.update({
            "rollout_corr/rollout_is_mean": 1.0 + 0.001 * step,
            "rollout_corr/rollout_is_eff_sample_size": 0.97,
            "rollout_corr/rollout_is_ratio_fraction_high": 0.01,
            "rollout_corr/kl": 0.002,
            "rollout_corr/ppl_ratio": 1.001,
            "training/rollout_probs_diff_valid": 1,
            "training/rollout_probs_diff_mean": 0.003,
        })
    return data


def val_metrics(acc: float) -> dict:
    return {
        "val-core/openai/gsm8k/reward/mean@1": acc,
        "val-aux/openai/gsm8k/reward/std@1": 0.3,
    }
