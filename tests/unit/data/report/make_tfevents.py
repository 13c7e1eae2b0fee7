"""Regenerate tensorboard/events.out.tfevents.* with torch's SummaryWriter, as verl's _TensorboardAdapter does.

Needs torch and the `tensorboard` package (not in the CPU test venv):
    python tests/unit/data/report/make_tfevents.py
"""

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

HERE = Path(__file__).resolve().parent / "tensorboard"
for old in HERE.glob("events.out.tfevents.*"):
    old.unlink()
writer = SummaryWriter(str(HERE), filename_suffix=".fixture")
for step in range(1, 4):
    data = {"critic/rewards/mean": 0.5 + 0.1 * step, "timing_s/step": 10.0 + step, "perf/throughput": 150.0}
    if step == 3:
        data["val-core/openai/gsm8k/reward/mean@1"] = 0.75
    for key, value in data.items():
        writer.add_scalar(key, value, step)
writer.close()
