"""ansible/library/rollout8_ray_api.py reads a running job's last training step from the tail of Ray's driver log
file on the head (issue 28, part 4: a poll of a multi-gigabyte log costs what its tail costs), widening the window
until a step line is found, and says when there is no such file (the caller then asks Ray's job API)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

MODULE = Path(__file__).resolve().parents[2] / "ansible" / "library" / "rollout8_ray_api.py"
spec = importlib.util.spec_from_file_location("rollout8_ray_api", MODULE)
ray_api = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ray_api)

JOB = "rollout8-x-0123456789ab-verl-20261205000000"


def driver_log(tmp_path: Path, text: bytes) -> Path:
    logs = tmp_path / "session_2026-12-05_00-00-00_000000_1" / "logs"
    logs.mkdir(parents=True)
    path = logs / f"job-driver-{JOB}.log"
    path.write_bytes(text)
    return path


def test_the_last_step_is_read_from_the_tail_and_the_window_widens_past_other_output(tmp_path):
    steps = b"".join(b"step:%d - critic/score/mean:0.1 - timing_s/step:3.2\n" % n for n in range(1, 8))
    driver_log(tmp_path, steps + b"vLLM says something long\n" * 100_000)  # 2.4 MB after the last step
    assert ray_api.tail_step(str(tmp_path), JOB) == 7


def test_no_step_yet_and_no_file_are_told_apart(tmp_path):
    assert ray_api.tail_step(str(tmp_path), JOB) is False
    driver_log(tmp_path, b"loading the model\n")
    assert ray_api.tail_step(str(tmp_path), JOB) is None
