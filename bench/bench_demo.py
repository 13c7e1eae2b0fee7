"""`make demo` itself: its first run against a warm re-run, and verl's step times with int8 vs bf16 rollouts.

1. The first `make demo` (virtual/simcluster.py demo) on fresh nodes, then the same command again (nothing
   changed: the plan's job already succeeded, the verdict is read again). With ROLLOUT8_BENCH_FRESH=1 the first
   run also starts from nothing cached: the project's images and .cache/wheelhouse, .cache/debootstrap are removed
   first (a full rebuild: about 15 minutes and a 3.4 GB download), which is the fresh-machine figure.
2. `make demo-compare`'s two runs, int8 (FlashRL) and bf16 rollouts of the same spec and seed on the same 3 nodes,
   one after the other, then a third, the int8 run with FlashRL's sync as upstream ran it (a full gc.collect() at
   every sync: patches/flash_rl/0006's escape hatch), the "before" of the int8 sync: mean step time, generation
   and actor update per step (steps after the first: warm-up), and the weight sync by part (the ranks'
   `rollout8: sync` lines: mean per sync and rank, first sync left out), with the sync timing's own estimated cost.
A failing run is an error, not a number. Needs a Docker engine (no rows without one). The cluster stays up.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "virtual"))
STEP_KEYS = (("timing_s/step", "step time"), ("timing_s/gen", "rollout (sync + generation)"),
             ("timing_s/generate_sequences", "generation"), ("timing_s/update_actor", "actor update"))


def _timed(args: list[str]) -> float:
    start = time.monotonic()
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "python"), str(REPO / "virtual" / "simcluster.py"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=5400)
    if proc.returncode != 0:
        raise RuntimeError(f"simcluster.py {' '.join(args)} failed (rc {proc.returncode}): {proc.stderr[-1500:]}")
    return time.monotonic() - start


def _fresh() -> None:
    images = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True,
                            text=True, check=True).stdout.split()
    mine = [i for i in images if i.startswith("rollout8/")]
    if mine:
        subprocess.run(["docker", "rmi", "-f", *mine], capture_output=True, check=False)
    for name in ("wheelhouse", "debootstrap"):
        shutil.rmtree(REPO / ".cache" / name, ignore_errors=True)


def _step_means(job: Path) -> dict[str, float]:
    text = (job / "driver.log").read_text(errors="replace")
    out = {}
    for key, _ in STEP_KEYS:
        values = [float(v) for v in re.findall(re.escape(key) + r":([0-9.]+)", text)]
        if len(values) < 2:
            raise RuntimeError(f"{job}: fewer than 2 steps of {key}")
        out[key] = sum(values[1:]) / len(values[1:])
    return out


def bench(work_dir: Path) -> list[dict]:
    import simcluster

    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        print("bench_demo: no running Docker engine (bash scripts/ensure-docker.sh): skipped")
        return []
    fresh = os.environ.get("ROLLOUT8_BENCH_FRESH") == "1"
    _timed(["down"])  # `make demo-down`'s own command: the demo on new nodes starts its run anew
    if fresh:
        _fresh()
    shutil.rmtree(simcluster.DEMO_WORK, ignore_errors=True)
    first = _timed(["demo"])
    again = _timed(["demo"])
    print(f"bench_demo: make demo {first:.0f} s first, {again:.0f} s warm re-run", flush=True)
    rows = [{"name": "make demo", "a_label": "first run" + (" (nothing cached)" if fresh else " (fresh nodes, "
             "images cached)"), "a": first, "b_label": "warm re-run", "b": again, "unit": "s",
             "note": "goals: first run <= 900 s on 2 cores from nothing cached, warm re-run <= 180 s"}]
    spec, work = simcluster.demo_spec(), simcluster.DEMO_WORK
    # each from step 0 under its own name: a relaunch of the demo's spec would resume from its checkpoints
    runs = [("int8", spec), ("bf16", simcluster.bf16_twin(spec, work)),
            ("int8-fullgc", simcluster.full_gc_twin(spec, work))]
    jobs = simcluster.run_jobs([(label, simcluster.from_scratch(path, work)) for label, path in runs],
                               "-e", "rollout8_relaunch=true")
    if isinstance(jobs, int):
        raise RuntimeError(f"a compare run failed (exit {jobs}): see {simcluster.DEMO_WORK / 'last-playbook.log'}")
    int8, bf16, before = (jobs[label][0] for label in ("int8", "bf16", "int8-fullgc"))
    a, b = _step_means(int8), _step_means(bf16)
    for key, label in STEP_KEYS:
        rows.append({"name": f"verl GRPO on 3 simulated nodes: {label} ({key}, mean of steps 2+)",
                     "a_label": "int8 rollouts", "a": a[key], "b_label": "bf16 rollouts", "b": b[key], "unit": "s",
                     "note": "CPU stand-in: vLLM's int8 matmuls here are torch ops, not NPU kernels"})
    rows += _sync_rows(int8, bf16, before)
    return rows


def _sync_rows(int8: Path, bf16: Path, before: Path) -> list[dict]:
    from rollout8.results import sync_timing

    means = {}
    for label, job in (("int8", int8), ("bf16", bf16), ("before", before)):
        means[label] = sync_timing.means(sync_timing.read(job / "driver.log"))
        if means[label] is None:
            raise RuntimeError(f"{job}: no `rollout8: sync` line after the first sync (worker logs collected?)")
    a, b = means["int8"], means["bf16"]
    note = f"mean per sync and rank over {a.syncs} int8 / {b.syncs} bf16 syncs; CPU stand-in (no NZ transpose)"
    rows = [{"name": f"weight sync on 3 simulated nodes: {sync_timing.LABELS[part]}", "a_label": "int8 rollouts",
             "a": a.parts[part], "b_label": "bf16 rollouts", "b": b.parts[part], "unit": "s", "note": note}
            for part in sync_timing.PARTS]
    rows.append({"name": "weight sync on 3 simulated nodes: total", "a_label": "int8 rollouts", "a": a.total,
                 "b_label": "bf16 rollouts", "b": b.total, "unit": "s", "note": "goal: int8 <= 1.1x bf16"})
    # before: the same int8 run with FlashRL's full gc.collect() at every sync, as upstream (patches/flash_rl/0006's
    # escape hatch ROLLOUT8_FLASHRL_FULL_GC=1), in the same bench run
    old = means["before"]
    rows.append({"name": "weight sync on 3 simulated nodes: total, before patch 0006 (upstream's collection)",
                 "a_label": "int8 rollouts", "a": old.total, "b_label": "bf16 rollouts", "b": b.total, "unit": "s",
                 "note": f"mean over {old.syncs} syncs; the row above is after"})
    rows.append({"name": "weight sync on 3 simulated nodes: int8 load into the engine, before vs after 0006",
                 "a_label": "before", "a": old.parts["load"], "b_label": "after", "b": a.parts["load"], "unit": "s",
                 "note": "FlashRL's full gc.collect() per sync, skipped when no parameter was replaced"})
    rows.append({"name": "weight sync timing: its own cost against the int8 sync it times", "a_label": "timing",
                 "a": a.overhead, "b_label": "int8 sync", "b": a.total, "unit": "s",
                 "note": "estimated: enter/leave events x their cost measured in the rank's process"})
    return rows
