"""Artifact distribution (the artifacts role) against plain rsync of the same bytes to the same simulated nodes.

On the 3 simulated nodes (fresh containers), a model-shaped tree (a few large shards, small config files, a data
file; ROLLOUT8_BENCH_DIST_GB per node, default 2) is sent, one after the other:
1. by `rsync -rt` to every node at once (over ssh as the login user, `sudo rsync` on the node, as the role's
   rsync runs): the limit here;
2. by the artifacts role (bench/dist.yml: check the node's arrival ledger, one rsync per node of the plan's send
   tree, seal what arrived), to an empty deploy root: the first distribution;
3. by the same playbook again, nothing changed: the no-change re-check (a stat per file, nothing read or sent).
The source is read once before any timing (all three find it in the page cache); the controller's sha256 of the
tree, which `rollout8 plan` computes once per artifact version and caches, is timed apart (its own row).
A failing run, a re-check that changes anything, or a node whose copy differs is an error, not a number. Needs a
Docker engine (no rows without one). The cluster is removed after.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "virtual"))
DEPLOY_ROOT = "/var/lib/rollout8/bench-dist"
BASELINE_ROOT = "/var/lib/rollout8/bench-rsync"
BLOCK = 16 << 20


def _tree(root: Path, total: int) -> dict[str, Path]:
    """A bf16-model-like directory (4 shards, config files) and a data file; distinct bytes in every block."""
    model, data = root / "model", root / "data"
    model.mkdir(parents=True)
    data.mkdir()
    seed = os.urandom(BLOCK)
    counter = 0

    def write(path: Path, size: int) -> None:
        nonlocal counter
        with open(path, "wb") as out:
            while size > 0:
                counter += 1
                block = counter.to_bytes(8, "little") + seed[8:min(BLOCK, size)]
                out.write(block)
                size -= len(block)

    shard = int(total * 0.95) // 4
    for i in range(4):
        write(model / f"model-{i + 1:05d}-of-00004.safetensors", shard)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        write(model / name, 4096)
    write(data / "train.parquet", total - 4 * shard)
    return {"model": model, "data": data}


def _plan(plan_dir: Path, tree: dict[str, Path]) -> float:
    """arrival.json, the send tree and a minimal rollout8-plan.json, made by the functions `rollout8 plan` uses;
    returns the seconds the controller's sha256 of the tree took."""
    from rollout8.fileutil import sha256_file
    from rollout8.runspec.plan import arrival_list, write_send_tree

    start = time.monotonic()
    sums = {}
    for what, src in tree.items():
        files = sorted(p for p in src.rglob("*") if p.is_file())
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            sums.update(zip((f"{what}/{p.relative_to(src)}" for p in files), pool.map(sha256_file, files), strict=True))
    seconds = time.monotonic() - start
    copies = [{"what": what, "src": str(src), "dest": f"{DEPLOY_ROOT}/{what}", "kind": "dir"}
              for what, src in tree.items()]
    arrival = arrival_list(copies, sums, DEPLOY_ROOT)
    plan_dir.mkdir(parents=True)
    write_send_tree(plan_dir / "send", arrival)
    (plan_dir / "arrival.json").write_text(json.dumps(arrival, indent=1))
    (plan_dir / "rollout8-plan.json").write_text(json.dumps(
        {"name": "bench-dist", "deploy_root": DEPLOY_ROOT, "node_paths": {"plan": f"{DEPLOY_ROOT}/rollout8-plan.json"}},
        indent=1) + "\n")
    return seconds


def _rsync_all(nodes: tuple[str, ...], src: Path) -> float:
    """rsync -rt of the tree to every node at once (one stream each), as the artifacts role's rsync is run."""
    for node in nodes:
        subprocess.run(["docker", "exec", node, "mkdir", "-p", BASELINE_ROOT], check=True)
    import simcluster

    rsh, addresses = simcluster.rsync_over_inventory(simcluster.INVENTORY)  # the bastion, as Ansible goes
    start = time.monotonic()
    procs = [subprocess.Popen(["rsync", "-rt", "--chmod=D0755,F0644", f"--rsh={rsh}", "--rsync-path=sudo rsync",
                               f"{src}/", f"{addresses[node]}:{BASELINE_ROOT}/"]) for node in nodes]
    rcs = [p.wait(timeout=3600) for p in procs]
    seconds = time.monotonic() - start
    if any(rcs):
        raise RuntimeError(f"rsync baseline failed: exit codes {rcs}")
    return seconds


def _playbook(inventory: Path, plan_dir: Path, log: Path) -> tuple[float, str]:
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks",
               PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}")
    start = time.monotonic()
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory),
                           str(REPO / "bench" / "dist.yml"), "-e", f"rollout8_plan_dir={plan_dir}"],
                          cwd=REPO / "ansible", env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - start
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"bench/dist.yml failed (rc {proc.returncode}); log in {log}")
    # where the time went (profile_tasks' summary: the slowest tasks first)
    summary = proc.stdout.rsplit("=" * 20, 1)[-1].strip().splitlines()[:6]
    print(f"bench_dist: {log.stem}: {seconds:.1f} s; slowest tasks:\n  " + "\n  ".join(summary), flush=True)
    return seconds, proc.stdout


def bench(work_dir: Path) -> list[dict]:
    import simcluster

    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        print("bench_dist: no running Docker engine (bash scripts/ensure-docker.sh): skipped")
        return []
    if shutil.which("rsync") is None:
        raise RuntimeError("rsync is not installed on this machine (apt-get install rsync)")
    default_gb = "0.05" if os.environ.get("ROLLOUT8_BENCH_QUICK") == "1" else "2"
    size = int(float(os.environ.get("ROLLOUT8_BENCH_DIST_GB", default_gb)) * 1e9)
    simcluster.need_disk(str(work_dir), size * (1 + 2 * len(simcluster.NODES)) / 1e9 + 2, "bench_dist")
    tree = _tree(work_dir / "src", size)
    digest_s = _plan(work_dir / "plan", tree)  # also reads the tree once: every run below finds it cached
    nodes = simcluster.NODES
    rows = []
    try:
        simcluster.down()
        simcluster.up()
        baseline = _rsync_all(nodes, work_dir / "src")  # the whole tree, one rsync per node
        for node in nodes:  # the baseline's copies go before the role's arrive (same disk, same free space)
            subprocess.run(["docker", "exec", node, "rm", "-rf", BASELINE_ROOT], check=True)
        first, _ = _playbook(simcluster.INVENTORY, work_dir / "plan", work_dir / "first.log")
        again, out = _playbook(simcluster.INVENTORY, work_dir / "plan", work_dir / "again.log")
        recap = simcluster.Run(0, out, again).recap()
        changed = {host: r["changed"] for host, r in recap.items() if r["changed"]}
        if changed or len(recap) != len(nodes):
            raise RuntimeError(f"the no-change re-check changed {changed or recap}; log in {work_dir / 'again.log'}")
        ledger_file = f"{DEPLOY_ROOT}/.rollout8-arrival.json"
        ledger = json.loads(subprocess.run(["docker", "exec", nodes[-1], "cat", ledger_file], check=True,
                                           capture_output=True, text=True).stdout)
        files = sum(len(c["files"]) for c in json.loads((work_dir / "plan" / "arrival.json").read_text())["copies"])
        if len(ledger) != files:
            raise RuntimeError(f"{nodes[-1]}'s arrival ledger lists {len(ledger)} files, the plan {files}")
    finally:
        simcluster.down()
    gb = f"{size / 1e9:.1f} GB x {len(nodes)} nodes"
    print(f"bench_dist: {gb}: rsync {baseline:.1f} s, first distribution {first:.1f} s, re-check {again:.1f} s, "
          f"controller sha256 {digest_s:.1f} s", flush=True)
    rows.append({"name": f"artifact distribution, {gb}", "a_label": "artifacts role (first)", "a": first,
                 "b_label": "rsync -rt", "b": baseline, "unit": "s",
                 "note": "goal <= 1.3x; the role's extra: ansible-playbook, the ledger check and the seal (what "
                         "rsync wrote and verified is recorded unread)"})
    rows.append({"name": f"no-change re-check, {gb}", "a_label": "re-check", "a": again,
                 "b_label": "first distribution", "b": first, "unit": "s",
                 "note": "goal <= 0.1x; a stat per file, nothing read or sent: the re-check's seconds do not grow "
                         "with the bytes, the first distribution's do"})
    rows.append({"name": f"controller sha256 of the tree ({size / 1e9:.1f} GB, once per artifact version)",
                 "a_label": "sha256 (all cores)", "a": digest_s, "b_label": "rsync -rt to the nodes", "b": baseline,
                 "unit": "s", "note": "`rollout8 plan` caches it by path, size and mtime: later runs read nothing"})
    return rows
