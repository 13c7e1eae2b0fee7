"""`ansible-playbook train.yml` wall time on 1, 2 and 3 simulated nodes: the first converge from nodes that
`reset.yml` emptied and the no-change re-run (how the cost grows with the number of nodes).

The cluster comes up once (virtual/simcluster.py `up`: images and wheelhouse cached) and every node loads the
training image once, untimed: its distribution is bench_image.py's and bench_demo.py's. Before each size,
`reset.yml` removes what rollout8 deployed on every node (containers, deploy roots, Ray) and keeps the image, as
on a site whose nodes already hold it. A new node container would not do: `up` gives a replaced node a new disk,
and the image would be sent again inside the timing. Each size has an inventory of the head plus the first N-1
workers (through the bastion, as `up` writes it), and the tests' run spec (configs/runs/tiny-cpu.yaml with its own
deploy root) with `cluster.nnodes: N`. The job is the cluster probe job (bench_demo.py times the verl job).
A run that fails, or a re-run that changes anything, is an error, not a number. Needs a Docker engine (returns no
rows, with the reason printed, without one); about 3 minutes per size on 2 cores. The cluster is reset after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "virtual"))
SIZES = (1, 2) if os.environ.get("ROLLOUT8_BENCH_QUICK") == "1" else (1, 2, 3)


def _inventory(path: Path, nodes: list[str]) -> Path:
    """The simulated cluster's inventory (hosts.ini and its group_vars, as `up` writes it) with the head and the
    first N-1 workers, in path's directory."""
    import simcluster

    addresses = {node: simcluster.address(node) for node in nodes}
    return simcluster.write_inventory(path.parent, addresses, simcluster.SSH_DIR / "id_ed25519",
                                      bastion=simcluster.address(simcluster.BASTION))  # as `up` writes it


def _spec(base: Path, nnodes: int) -> Path:
    """The base spec with `cluster.nnodes: N`, written beside it so its relative paths keep pointing at the same
    artifacts."""
    spec = yaml.safe_load(base.read_text())
    spec["cluster"]["nnodes"] = nnodes
    # batch sizes that divide on 2, 4 and 6 ranks (the base spec's fit 3 nodes x 2 only; `rollout8 check` says so)
    spec["verl"]["data.train_batch_size"] = 12
    spec["verl"]["actor_rollout_ref.actor.ppo_mini_batch_size"] = 12
    out = base.parent / f"bench-{nnodes}-nodes.yaml"
    out.write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


def bench(work_dir: Path) -> list[dict]:
    import simcluster

    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        print("bench_cluster: no running Docker engine (bash scripts/ensure-docker.sh): skipped")
        return []
    import sim_demo

    base_spec = simcluster.prepare_run(REPO / ".cache" / "cluster" / "run")
    simcluster.up()
    image = sim_demo.image_args()  # the training image, built and saved (or found) before any timing
    if any("rollout8_image_tarball" in arg for arg in image):  # every node loads it once, untimed
        loaded = simcluster.run_playbook(simcluster.INVENTORY, base_spec, work_dir / "image", work_dir / "facts",
                                         *image, "--tags", "image", timeout=3600)
        if loaded.rc != 0:
            raise RuntimeError(f"loading the training image failed: {loaded.failure()}")
        image = sim_demo.image_args()
    rows, first = [], {}

    def reset(check: bool = True) -> None:
        run = simcluster.run_playbook(simcluster.INVENTORY, base_spec, work_dir / "reset", work_dir / "facts",
                                      "-e", "rollout8_reset_confirmed=true", playbook="reset.yml", timeout=900)
        if run.rc != 0 and check:
            raise RuntimeError(f"reset.yml failed (rc {run.rc}): {run.failure()}")

    try:
        for n in SIZES:
            reset()
            work = work_dir / f"{n}-nodes"
            work.mkdir()
            inventory = _inventory(work / "hosts.ini", list(simcluster.NODES[:n]))
            spec = _spec(base_spec, n)
            runs = []
            for attempt in ("first converge", "no-change re-run"):
                run = simcluster.run_playbook(inventory, spec, work, work / "facts", *image,
                                              "-e", "rollout8_job_kind=probe")
                if run.rc != 0:  # the scratch directory goes with the bench: the failure's lines go with the error
                    raise RuntimeError(f"{n} node(s), {attempt}: train.yml failed (rc {run.rc}): {run.failure()}")
                runs.append(run)
            changed = {host: r["changed"] for host, r in runs[1].recap().items() if r["changed"]}
            if changed:
                raise RuntimeError(f"{n} node(s): the re-run changed {changed}: not idempotent")
            first[n] = runs[0].seconds
            print(f"bench_cluster: {n} node(s): {runs[0].seconds:.0f} s first, {runs[1].seconds:.0f} s re-run",
                  flush=True)
            rows.append({"name": f"train.yml on {n} node(s), re-run vs first converge after reset.yml",
                         "a_label": "no-change re-run", "a": runs[1].seconds, "b_label": "first converge",
                         "b": runs[0].seconds, "unit": "s", "note": "goal <= 0.25x"})
    finally:
        reset(check=False)  # a failure above stays the error
    rows.append({"name": "first converge, growth with nodes", "a_label": f"{SIZES[-1]} nodes",
                 "a": first[SIZES[-1]], "b_label": "1 node", "b": first[1], "unit": "s",
                 "note": "goal <= 1.3x; Ansible runs per-node tasks in parallel, but the simulated nodes (and the "
                         "probe job's work on each) share this machine's cores: on real nodes it should grow less "
                         "(not measured here)"})
    return rows
