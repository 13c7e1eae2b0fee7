"""Online int8 requantization on CPU, in GB/s: FlashRL (patched) vs rollout8.quant.quantmath vs a plain copy.

At every weight sync FlashRL turns each bf16 linear weight into int8: round(W * output_scale * input_scale),
clamped to [-128, 127]. The work reads the bf16 weight once, so a plain `copy_` of the same bf16 tensor is the
memory-bandwidth bound it is measured against. GB/s = bytes of the bf16 weight / seconds (median of REPEAT
rounds, the contenders interleaved within each round).

- FlashRL: `flash_rl.flash_quantization.linear_quantize` from the locked flash-llm-rl wheel (1.0.3) unpacked from
  the wheel cache (.cache/wheels or $ROLLOUT8_WHEEL_CACHE; else the installed copy of the same files), patched
  in a scratch directory with
  `rollout8 patches apply --component flash_rl` (as shipped it calls torch.cuda.current_device() and fails on
  CPU; the harness records that error in the row's note).
- rollout8: `rollout8.quant.quantmath.apply_entry`, the same arithmetic used by profile/verify-quant.
- in-place: the same operations in the same order on one float32 buffer (`w.float().mul_().mul_().round_()
  .clamp_()`), a reference for how much of the gap to the copy bound is allocation of temporaries.
All outputs are checked equal before any time is reported.
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

# Qwen2.5-7B's q_proj: 3584 x 3584 bf16 (24.5 MiB); a second, larger MLP shape.
SHAPES = [("q_proj 3584x3584", 3584, 3584), ("gate_proj 18944x3584", 18944, 3584)]
REPEAT = 5
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


def bench(work_dir: Path) -> list[dict]:
    import torch

    from rollout8.quant import quantmath

    site, origin = _flashrl_tree(work_dir)
    shipped = _load(site / "flash_rl" / "flash_quantization.py", "_flashrl_shipped_quantization")
    subprocess.run([sys.executable, "-m", "rollout8", "patches", "apply", "--target", str(site),
                    "--component", "flash_rl"], check=True, capture_output=True, text=True)
    patched = _load(site / "flash_rl" / "flash_quantization.py", "_flashrl_patched_quantization")

    rows = []
    gen = torch.Generator().manual_seed(0)
    for label, out_features, in_features in SHAPES:
        weight = (torch.randn(out_features, in_features, generator=gen) * 0.02).to(torch.bfloat16)
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
        ours = quantmath.apply_entry(weight, entry)
        theirs = patched.linear_quantize(name, weight, profile)
        def in_place(weight=weight, entry=entry):
            buf = weight.float().mul_(entry["output_scale"]).mul_(entry["input_scale"])
            return buf.round_().clamp_(min=-128, max=127).to(torch.int8)

        for other_label, other in (("patched FlashRL", theirs), ("the in-place chain", in_place())):
            if not torch.equal(ours, other):
                raise AssertionError(f"{label}: rollout8.quant.quantmath and {other_label} disagree "
                                     f"({(ours != other).sum().item()} entries)")
        dst = torch.empty_like(weight)
        nbytes = weight.numel() * weight.element_size()
        speed = _gbps({
            "copy": lambda: dst.copy_(weight),  # noqa: B023 - called before the loop moves on
            "flashrl": lambda: patched.linear_quantize(name, weight, profile),  # noqa: B023
            "rollout8": lambda: quantmath.apply_entry(weight, entry),  # noqa: B023
            "inplace": in_place,
        }, nbytes)
        copy, flashrl, rollout8, inplace = speed["copy"], speed["flashrl"], speed["rollout8"], speed["inplace"]
        rows += [
            {"name": f"int8 requant {label}", "a_label": "FlashRL (patched)", "a": flashrl,
             "b_label": "bf16 copy", "b": copy, "unit": "GB/s", "note": f"{shipped_note} (from {origin})"},
            {"name": f"int8 requant {label}", "a_label": "rollout8.quant.quantmath", "a": rollout8,
             "b_label": "bf16 copy", "b": copy, "unit": "GB/s"},
            {"name": f"int8 requant {label}", "a_label": "rollout8.quant.quantmath", "a": rollout8,
             "b_label": "FlashRL (patched)", "b": flashrl, "unit": "GB/s", "note": "outputs equal"},
            {"name": f"int8 requant {label}", "a_label": "in-place float32 chain", "a": inplace,
             "b_label": "FlashRL (patched)", "b": flashrl, "unit": "GB/s", "note": "outputs equal; headroom"},
        ]
    return rows
