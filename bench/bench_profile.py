"""FlashRL's profiler vs rollout8's on the ~0.5B fixture (Qwen2.5-0.5B's shape): peak memory and wall time.

Each side runs as a fresh subprocess under its own watcher (rollout8.peak_memory: ru_maxrss of the child), one
after the other on the same files, page cache warm for both (the pair is read once before timing):
- a: `flashrl profile -m BF16 -q INT8 -o out.pt --fn int8` (FLASHRL_CONFIG unset, HF_HUB_OFFLINE=1), which loads
  both models fully with transformers;
- b: `rollout8 profile -m BF16 -q INT8 -o out.pt`, which streams the safetensors one decoder layer at a time.
Both outputs are compared key by key (dtypes, shapes, values); the benchmark fails if they differ.
Goal (issue 3): at least 10x less peak memory and at least 2x faster.

The pair is built once with `rollout8 make-test-model --preset bench-0.5b` and cached in .cache/testmodels
(ROLLOUT8_TESTMODEL_CACHE overrides the directory), keyed by the builder's source.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRESET = "tiny" if os.environ.get("ROLLOUT8_BENCH_QUICK") == "1" else "bench-0.5b"


def _warm(pair) -> None:
    for d in (pair.bf16, pair.int8):
        for f in sorted(d.glob("*.safetensors")):
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass


def bench(work_dir: Path) -> list[dict]:
    import torch

    from rollout8.peak_memory import measure
    from rollout8.quant.profile import flashrl_profile_command, profile_differences
    from rollout8.quant.testmodels import cached_pair

    cache = Path(os.environ.get("ROLLOUT8_TESTMODEL_CACHE") or REPO / ".cache" / "testmodels")
    if str(cache) == "0":
        cache = work_dir / "models"
    print(f"bench_profile: building/reusing the {PRESET} pair in {cache}", file=sys.stderr, flush=True)
    pair = cached_pair(cache, preset=PRESET)
    _warm(pair)
    theirs_out, ours_out = work_dir / "flashrl.pt", work_dir / "rollout8.pt"
    cmd, env = flashrl_profile_command(pair.bf16, pair.int8, theirs_out)
    theirs = measure(cmd, env=env)
    if theirs.returncode:
        raise RuntimeError(f"flashrl profile failed ({theirs.returncode}): {theirs.output[-2000:]}")
    ours = measure([sys.executable, "-m", "rollout8", "profile", "-m", str(pair.bf16), "-q", str(pair.int8),
                    "-o", str(ours_out), "--quiet"])
    if ours.returncode:
        raise RuntimeError(f"rollout8 profile failed ({ours.returncode}): {ours.output[-2000:]}")
    diffs = profile_differences(torch.load(ours_out), torch.load(theirs_out), rtol=1e-6, atol=1e-7)
    if diffs:
        raise RuntimeError(f"profiles differ in {len(diffs)} places, first: {diffs[:3]}")
    params = pair.shape.num_parameters()
    note = f"{PRESET} ({params / 1e6:.0f}M parameters), outputs equal; fresh subprocess each"
    return [
        {"name": "profile peak RSS", "a_label": "flashrl profile", "a": theirs.peak_rss_mib,
         "b_label": "rollout8 profile", "b": ours.peak_rss_mib, "unit": "MiB", "note": note},
        {"name": "profile wall time", "a_label": "flashrl profile", "a": theirs.wall_s,
         "b_label": "rollout8 profile", "b": ours.wall_s, "unit": "s", "note": note},
    ]
