"""FlashRL weight-sync (reload) time in a real vLLM engine: our patched reload vs upstream's host allocation.

One engine process in the engine venv (scripts/engine-env.sh) serves a larger fixture pair (preset
$ROLLOUT8_BENCH_RELOAD_PRESET, default bench-0.5b: Qwen2.5-0.5B's shape) as int8 through FlashRL, built with
`rollout8 make-test-model`, `profile` and `setup`. It then syncs the bf16 weights (held in memory) through
model.load_weights ROUNDS times per contender, the contenders interleaved:

- patched: patches/flash_rl as shipped (reload buffers on the parameters' device);
- upstream allocation: the same process with ROLLOUT8_FLASHRL_HOST_RELOAD=1, the patch's escape hatch that
  restores upstream's device-less torch.empty (host memory);
- upstream collection: ROLLOUT8_FLASHRL_FULL_GC=1, patch 0006's escape hatch: FlashRL's full gc.collect() at
  every sync (its own row).
The stock wheel itself cannot be timed here: its quantizer calls torch.cuda.current_device() and the first sync
fails on a machine without CUDA (stack-facts trap 4; the engine tier shows it).

On a CPU both contenders allocate in the same memory, so a ratio near 1 is the expected CPU result: what the
patch saves on an accelerator (a device -> host -> device round trip of the whole model per sync) does not exist
here. The row is there to catch a regression of the patched path and to be rerun on an NPU host.
Skipped (empty list and a printed reason) when the engine venv is absent.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENGINE_VENV = Path(os.environ.get("ENGINE_VENV", REPO / ".cache" / "engine-venv"))
PRESET = os.environ.get("ROLLOUT8_BENCH_RELOAD_PRESET",
                        "tiny-engine" if os.environ.get("ROLLOUT8_BENCH_QUICK") == "1" else "bench-0.5b")
ROUNDS = int(os.environ.get("ROLLOUT8_BENCH_RELOAD_ROUNDS",
                            "1" if os.environ.get("ROLLOUT8_BENCH_QUICK") == "1" else "6"))
HOST_RELOAD = "ROLLOUT8_FLASHRL_HOST_RELOAD"
FULL_GC = "ROLLOUT8_FLASHRL_FULL_GC"


def _rollout8(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "rollout8", *args], check=True, timeout=3600)


def bench(work_dir: Path) -> list[dict]:
    engine_python = ENGINE_VENV / "bin" / "python"
    if not engine_python.is_file():
        print(f"bench_reload: skipped: no engine venv at {ENGINE_VENV} (build it with scripts/engine-env.sh or "
              "`make test-engine`)")
        return []
    pair_dir = Path(os.environ.get("ROLLOUT8_BENCH_RELOAD_PAIR", REPO / ".cache" / "bench-pairs" / PRESET))
    _rollout8("make-test-model", "-o", str(pair_dir), "--preset", PRESET, "--seed", "0")
    profile = work_dir / "profile.pt"
    _rollout8("profile", "-m", str(pair_dir / "bf16"), "-q", str(pair_dir / "int8"), "-o", str(profile), "--quiet")
    config = work_dir / "flashrl.yaml"
    _rollout8("setup", "--fn", "int8", "-m", str(pair_dir / "int8"), "-p", str(profile), "-o", str(config))

    steps = ["time-reload:warmup"]
    for i in range(ROUNDS):  # interleaved, and the order rotates each round so none always goes first
        groups = [[f"setenv:{HOST_RELOAD}=0", f"setenv:{FULL_GC}=0", f"time-reload:patched{i}"],
                  [f"setenv:{HOST_RELOAD}=1", f"setenv:{FULL_GC}=0", f"time-reload:host{i}"],
                  [f"setenv:{HOST_RELOAD}=0", f"setenv:{FULL_GC}=1", f"time-reload:fullgc{i}"]]
        for group in groups[i % 3:] + groups[:i % 3]:
            steps += group
    out = work_dir / "engine"
    out.mkdir()
    spec = {"out": str(out), "model": str(pair_dir / "bf16"), "steps": steps}
    (out / "spec.json").write_text(json.dumps(spec))
    # The engine tier's own environment and worker (the bench runs the same engine the tests run).
    probe = (f"import sys, json; sys.path.insert(0, {str(REPO / 'virtual' / 'engine')!r}); "
             "from engine_platform import engine_env; from pathlib import Path; "
             f"print(json.dumps(engine_env(flashrl_config=Path({str(config)!r}), "
             f"log_file=Path({str(out / 'f.log')!r}))))")
    env = json.loads(subprocess.run([str(engine_python), "-c", probe], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    proc = subprocess.run([str(engine_python), str(REPO / "virtual" / "engine" / "engine_worker.py"),
                           str(out / "spec.json")], env=env, capture_output=True, text=True, timeout=3600)
    results_file = out / "results.json"
    if not results_file.is_file():
        raise RuntimeError(f"engine exited {proc.returncode} before recording: "
                           f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    steps_done = json.loads(results_file.read_text())["steps"]
    failed = {k: v["error"] for k, v in steps_done.items() if not v.get("ok")}
    if failed:
        raise RuntimeError(f"reload steps failed: {failed}")
    patched = [steps_done[f"patched{i}"]["seconds"] for i in range(ROUNDS)]
    host = [steps_done[f"host{i}"]["seconds"] for i in range(ROUNDS)]
    start = steps_done["start"]
    fullgc = [steps_done[f"fullgc{i}"]["seconds"] for i in range(ROUNDS)]
    print(f"bench_reload: per-sync seconds, patched {patched}, upstream allocation {host}, "
          f"upstream collection {fullgc}")
    note = (f"{PRESET} pair, int8 engine on {start['param_devices']}, median of {ROUNDS} interleaved syncs; "
            "on a CPU both allocate in host memory, so ~1x is expected (the saving exists on an accelerator)")
    return [{"name": f"FlashRL weight sync (reload), {PRESET}", "a_label": "patched (param device)",
             "a": statistics.median(patched), "b_label": "upstream allocation (host)",
             "b": statistics.median(host), "unit": "s", "note": note},
            {"name": f"FlashRL weight sync (reload), {PRESET}: the full gc.collect() per sync (patch 0006)",
             "a_label": "patched (collect only if a parameter was replaced)", "a": statistics.median(patched),
             "b_label": "upstream (collect every sync)", "b": statistics.median(fullgc), "unit": "s",
             "note": f"median of {ROUNDS} interleaved syncs in one engine process (vLLM, torch loaded)"}]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(bench(Path(tmp)), indent=2))
