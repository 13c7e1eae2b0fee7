"""Online int8 requantization on CPU: FlashRL 1.0.3's vs our patched one (patch 0004), GB/s and peak memory.

At every weight sync FlashRL turns each bf16 linear weight into int8: round(W * output_scale * input_scale),
clamped to [-128, 127]. The work reads the bf16 weight once, so a plain `copy_` of the same bf16 tensor is the
memory-bandwidth bound it is measured against. GB/s = bytes of the bf16 weight / seconds (median of REPEAT
rounds, the contenders interleaved within each round).

- FlashRL 1.0.3: `flash_rl.flash_quantization.linear_quantize` from the locked flash-llm-rl wheel (1.0.3)
  unpacked from the wheel cache (.cache/wheels or $ROLLOUT8_WHEEL_CACHE; else the installed copy of the same
  files) with patch 0001 only (as shipped it calls torch.cuda.current_device() and fails on CPU; the harness
  records that error in the row's note; 0001 changes only the device the scales go to, not the arithmetic).
- patched: the same file after `rollout8 patches apply --component flash_rl`, i.e. with 0004 (the int8
  expression in row blocks of 2**18 elements written into the int8 result).
- in-place: the same operations in the same order on one float32 buffer (`w.float().mul_().mul_().round_()
  .clamp_()`), a reference for how much of the gap to the copy bound is allocation of temporaries.
All outputs (and rollout8.quant.quantmath.apply_entry's, the arithmetic of profile/verify-quant) are checked
equal before any time is reported.
Peak extra memory: one call per side in a fresh process (bench/requant_probe.py: the RSS high-water mark of the
call above the RSS before it, the int8 result included), in MiB and as a multiple of the bf16 weight's size.
Goal (issue 16): patched at least 2x FlashRL's GB/s, and at most one weight-sized temporary.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path

# Qwen2.5-7B's q_proj (24.5 MiB of bf16) and gate_proj (130 MiB), Qwen2.5-32B's down_proj (270 MiB).
SHAPES = [("7B q_proj 3584x3584", 3584, 3584), ("7B gate_proj 18944x3584", 18944, 3584),
          ("32B down_proj 5120x27648", 5120, 27648)]
MIB = 2**20
REPEAT = 1 if os.environ.get("ROLLOUT8_BENCH_QUICK") == "1" else 5
WARMUP = 1


def _locked_flashrl_version() -> str:
    import yaml

    from rollout8.paths import lock_path

    return str(yaml.safe_load(lock_path().read_text())["pypi"]["flash-llm-rl"])


def _flashrl_tree(work_dir: Path) -> tuple[Path, str]:
    """A scratch directory holding flash_rl/ exactly as the locked wheel ships it, and where it came from."""
    from rollout8.paths import repo_root

    version = _locked_flashrl_version()
    target = work_dir / "site"
    target.mkdir()
    cache = os.environ.get("ROLLOUT8_WHEEL_CACHE") or (str(repo_root() / ".cache" / "wheels") if repo_root() else "")
    wheels = sorted(Path(cache).glob(f"flash_llm_rl-{version}-*.whl")) if cache else []
    if wheels:
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(target, [m for m in zf.namelist() if m.startswith("flash_rl/")])
        return target, wheels[0].name
    installed = importlib.metadata.version("flash-llm-rl")
    if installed != version:
        raise RuntimeError(f"flash-llm-rl {installed} installed, the lock pins {version}; put the {version} wheel "
                           f"into {cache or 'ROLLOUT8_WHEEL_CACHE'}")
    for file in importlib.metadata.files("flash-llm-rl"):  # the wheel's files, as pip installed them
        if file.parts[0] == "flash_rl" and file.suffix == ".py":
            dest = target / Path(*file.parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file.locate(), dest)
    return target, f"installed flash-llm-rl {version}"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gbps(contenders: dict, nbytes: int) -> dict[str, float]:
    """GB/s per contender, measured round-robin (a, b, c, a, b, c, ...) so that load from other processes on a
    shared machine hits all of them alike; median of REPEAT rounds."""
    for fn in contenders.values():
        for _ in range(WARMUP):
            fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(REPEAT):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: nbytes / statistics.median(ts) / 1e9 for name, ts in times.items()}


def _probe():
    return _load(Path(__file__).with_name("requant_probe.py"), "requant_probe")


def bench(work_dir: Path) -> list[dict]:
    import torch

    from rollout8.node import patches
    from rollout8.quant import quantmath

    site, origin = _flashrl_tree(work_dir)
    shipped = _load(site / "flash_rl" / "flash_quantization.py", "_flashrl_shipped_quantization")
    reference = work_dir / "reference"
    shutil.copytree(site, reference)
    [device_patch] = [p for p in patches.find_patches("flash_rl") if p.path.name.startswith("0001-")]
    patches.apply_patch(device_patch, reference)
    upstream = _load(reference / "flash_rl" / "flash_quantization.py", "_flashrl_upstream_quantization")
    subprocess.run([sys.executable, "-m", "rollout8", "patches", "apply", "--target", str(site),
                    "--component", "flash_rl"], check=True, capture_output=True, text=True)
    patched = _load(site / "flash_rl" / "flash_quantization.py", "_flashrl_patched_quantization")
    if not hasattr(patched, "int8_in_row_blocks"):
        raise RuntimeError("the patched flash_quantization.py has no int8_in_row_blocks: patch 0004 is missing")
    probe = _probe()

    rows = []
    gen = torch.Generator().manual_seed(0)
    for label, out_features, in_features in SHAPES:
        weight = torch.empty(out_features, in_features, dtype=torch.bfloat16).normal_(0.0, 0.02, generator=gen)
        entry = {
            "input_scale": torch.rand(1, in_features, generator=gen) + 0.5,  # SmoothQuant factor [1, in]
            "output_scale": 1.0 / (weight.float().abs().amax(dim=1, keepdim=True) / 127.0),  # 1/weight_scale
            "type": torch.int8,
        }
        name = "model.layers.0.self_attn.q_proj.weight"
        profile = {name: entry}
        try:
            shipped.linear_quantize(name, weight, profile)
            shipped_note = "FlashRL as shipped ran on CPU"
        except (RuntimeError, AssertionError) as exc:
            shipped_note = f"FlashRL as shipped fails on CPU: {str(exc).splitlines()[0]}"
        theirs = upstream.linear_quantize(name, weight, profile)

        def in_place(weight=weight, entry=entry):
            buf = weight.float().mul_(entry["output_scale"]).mul_(entry["input_scale"])
            return buf.round_().clamp_(min=-128, max=127).to(torch.int8)

        for other_label, other in (("patched FlashRL", patched.linear_quantize(name, weight, profile)),
                                   ("rollout8.quant.quantmath", quantmath.apply_entry(weight, entry)),
                                   ("the in-place chain", in_place())):
            if not torch.equal(theirs, other):
                raise AssertionError(f"{label}: FlashRL 1.0.3 and {other_label} disagree "
                                     f"({(theirs != other).sum().item()} entries)")
        del theirs
        dst = torch.empty_like(weight)
        nbytes = weight.numel() * weight.element_size()
        speed = _gbps({
            "copy": lambda: dst.copy_(weight),  # noqa: B023 - called before the loop moves on
            "flashrl": lambda: upstream.linear_quantize(name, weight, profile),  # noqa: B023
            "patched": lambda: patched.linear_quantize(name, weight, profile),  # noqa: B023
            "inplace": in_place,
        }, nbytes)
        peak = {side: probe.measure(tree, out_features, in_features)["extra_bytes"]
                for side, tree in (("flashrl", reference), ("patched", site))}
        times = {side: extra / nbytes for side, extra in peak.items()}
        memory = (f"peak extra memory of one call: patched {peak['patched'] / MIB:.0f} MiB "
                  f"({times['patched']:.2f}x the weight), FlashRL 1.0.3 {peak['flashrl'] / MIB:.0f} MiB "
                  f"({times['flashrl']:.2f}x)")
        rows += [
            {"name": f"requantize {label}: patched vs FlashRL 1.0.3", "a_label": "patched (0004)",
             "a": speed["patched"], "b_label": "FlashRL 1.0.3", "b": speed["flashrl"], "unit": "GB/s",
             "note": f"{label}: int8 outputs bit-identical; {memory}"},
            {"name": f"requantize {label}: peak extra memory", "a_label": "FlashRL 1.0.3",
             "a": peak["flashrl"] / MIB, "b_label": "patched (0004)", "b": peak["patched"] / MIB, "unit": "MiB",
             "note": "one call in a fresh process, RSS high-water mark above the RSS before it, int8 result "
                     "included (half the weight)"},
            {"name": f"requantize {label}: share of copy bandwidth", "a_label": "patched (0004)",
             "a": speed["patched"], "b_label": "bf16 copy", "b": speed["copy"], "unit": "GB/s"},
            {"name": f"requantize {label}: share of copy bandwidth", "a_label": "FlashRL 1.0.3",
             "a": speed["flashrl"], "b_label": "bf16 copy", "b": speed["copy"], "unit": "GB/s",
             "note": f"{shipped_note} (from {origin})"},
            {"name": f"requantize {label}: in-place chain", "a_label": "in-place float32 chain",
             "a": speed["inplace"], "b_label": "FlashRL 1.0.3", "b": speed["flashrl"], "unit": "GB/s",
             "note": "outputs equal; one float32 copy of the weight (2x its size)"},
        ]
    return rows
