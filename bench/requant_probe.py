"""The extra peak memory of one call of FlashRL's int8 requantizer, each measurement in a fresh process.

    python bench/requant_probe.py SITE ROWS COLS

loads SITE/flash_rl/flash_quantization.py (a copy of the flash-llm-rl wheel's file, patched or not), builds a
bf16 weight [ROWS, COLS] with an int8 profile entry of the shapes FlashRL's profile has (output_scale [ROWS, 1],
input_scale [1, COLS]), calls linear_quantize once on a tiny weight (kernels, thread pool), then measures one
call on the real one with rollout8.peak_memory.extra_peak, and prints one line
`REQUANT_PEAK {"extra_bytes": ..., "weight_bytes": ..., "file": ...}`. The int8 result is alive when the peak is
read, so extra_bytes counts it (half the weight's bytes) with the temporaries.

`measure(site, rows, cols)` runs it in a subprocess. Used by bench/bench_quantizer.py (the benchmark row) and
tests/unit/test_flashrl_requant.py (the bound the patch promises), so both read the same measurement.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

NAME = "model.layers.0.mlp.gate_proj.weight"


def _entry(torch, rows: int, cols: int, gen) -> tuple:
    weight = torch.empty(rows, cols, dtype=torch.bfloat16).normal_(0.0, 0.02, generator=gen)
    entry = {"input_scale": torch.rand(1, cols, generator=gen) + 0.5,
             "output_scale": 1.0 / (weight.abs().amax(dim=1, keepdim=True).float() / 127.0), "type": torch.int8}
    return weight, {NAME: entry}


def main(argv: list[str]) -> int:
    import torch

    from rollout8.peak_memory import extra_peak

    site, rows, cols = Path(argv[0]), int(argv[1]), int(argv[2])
    path = site / "flash_rl" / "flash_quantization.py"
    spec = importlib.util.spec_from_file_location("flashrl_quantization_under_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gen = torch.Generator().manual_seed(0)
    module.linear_quantize(NAME, *_entry(torch, 64, 64, gen))  # warm-up: nothing of it is measured
    weight, profile = _entry(torch, rows, cols, gen)
    result, extra = extra_peak(lambda: module.linear_quantize(NAME, weight, profile))
    assert result.dtype == torch.int8 and result.shape == weight.shape
    print("REQUANT_PEAK " + json.dumps({"extra_bytes": extra, "weight_bytes": weight.numel() * weight.element_size(),
                                        "file": str(module.__file__)}), flush=True)
    return 0


def measure(site: Path, rows: int, cols: int, timeout: float = 600) -> dict:
    """{"extra_bytes", "weight_bytes", "file"} of one linear_quantize call on a [rows, cols] bf16 weight."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(site), str(rows), str(cols)],
                          capture_output=True, text=True, timeout=timeout, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("REQUANT_PEAK "):
            return json.loads(line.removeprefix("REQUANT_PEAK "))
    raise RuntimeError(f"requant_probe.py {site} {rows} {cols} failed (exit {done.returncode}): {done.stderr[-2000:]}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
