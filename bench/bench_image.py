"""Image distribution (the image role) to the 3 simulated nodes: through the shared storage against a copy per node.

An image of ROLLOUT8_BENCH_IMAGE_GB (default 1; random bytes, so no layer compresses or repeats) is saved by
`scripts/image-save.sh` as `make image-save` does, then distributed by bench/image.yml (the image role alone) to
the nodes (each with its own Docker daemon, the bench's image removed first), twice, side by side:
1. per node: rollout8_image_via_shared_dir=false, the tarball sent to each node, loaded, removed;
2. shared: the tarball sent once to cluster.shared_dir (the simulated NFS) by the first node, loaded from there.
Bytes over the controller's link are what the nodes received on their network interface during the play (the
controller is the only sender); time is the play's wall time. Loads run one at a time (the three daemons share
this machine's disk: rollout8_image_load_throttle=1), in both runs. Then the shared run again: every node has the
image by id, so nothing is sent. A failed play, nodes with different image ids, or a re-run that sends anything is
an error, not a number. Needs a Docker engine (no rows without one). The cluster stays, without the image.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "virtual"))
IMAGE = "rollout8-bench/image:1"


def _image(work: Path, size: int) -> Path:
    """A one-layer image of `size` random bytes, saved by scripts/image-save.sh as an uncompressed tarball."""
    root = work / "rootfs.tar"
    with tarfile.open(root, "w") as tar:
        blob = work / "blob"
        with open(blob, "wb") as out:
            for _ in range(size // (16 << 20)):
                out.write(os.urandom(16 << 20))
        tar.add(blob, arcname="blob")
        blob.unlink()
    subprocess.run(["docker", "import", str(root), IMAGE], check=True, capture_output=True)
    root.unlink()
    tarball = work / "bench-image.tar"
    subprocess.run(["bash", str(REPO / "scripts" / "image-save.sh"), IMAGE, str(tarball), "docker"], check=True,
                   capture_output=True)
    return tarball


# the bytes a node received, where the controller's link is:
# every interface but loopback, summed: a node may have no default route (rollout8-sim-w2, as air-gapped nodes),
# and the data NIC is idle while the image goes
RX_BYTES = ("total=0; for f in /sys/class/net/*/statistics/rx_bytes; do case $f in */lo/*) continue;; esac; "
            "total=$((total + $(cat $f))); done; echo $total")


def _preflight(simcluster, work_dir: Path) -> None:
    """train.yml's preflight, untimed: a node whose Python lacks `requests` (rollout8-sim-w1, as a vendor's node)
    gets the controller's node wheels here, not inside the first timed image play (which would install them itself,
    through preflight's node check), so the per-node and shared plays time the same work."""
    spec = simcluster.prepare_run(REPO / ".cache" / "cluster" / "run")
    run = simcluster.run_playbook(simcluster.INVENTORY, spec, work_dir / "preflight", work_dir / "facts", "--tags",
                                  "preflight", timeout=1800)
    if run.rc != 0:
        raise RuntimeError(f"preflight before the image bench failed: {run.failure()}")


def _received(nodes: tuple[str, ...]) -> int:
    return sum(int(subprocess.run(["docker", "exec", n, "sh", "-c", RX_BYTES],
                                  capture_output=True, text=True, check=True).stdout) for n in nodes)


def image_play(args: dict, log: Path) -> tuple[float, int, str]:
    """bench/image.yml (the image role alone) on the simulated nodes with `args` (the shared directory added):
    (wall seconds, bytes the nodes received meanwhile, the play's output), its output kept in log. A failed play
    raises. bench_registry.py times its two paths with it too."""
    import simcluster

    nodes = simcluster.NODES
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}")
    args = {"rollout8_bench_shared_dir": simcluster.SHARED_DIR, **args}
    before = _received(nodes)
    start = time.monotonic()
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(simcluster.INVENTORY),
                           str(REPO / "bench" / "image.yml"), "-e", json.dumps(args)],
                          cwd=REPO / "ansible", env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - start
    received = _received(nodes) - before
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"bench/image.yml failed (rc {proc.returncode}); log in {log}")
    return seconds, received, proc.stdout


def _play(tarball: Path, shared: bool, log: Path) -> tuple[float, int, str]:
    import simcluster

    nodes = simcluster.NODES
    seconds, received, output = image_play({"rollout8_image": IMAGE, "rollout8_image_tarball": str(tarball),
                                            "rollout8_image_load_throttle": 1,
                                            "rollout8_image_via_shared_dir": shared}, log)
    ids = {n: subprocess.run(["docker", "exec", n, "docker", "image", "inspect", "-f", "{{.Id}}", IMAGE],
                             capture_output=True, text=True, check=True).stdout.strip() for n in nodes}
    if len(set(ids.values())) != 1:
        raise RuntimeError(f"the nodes hold different images: {ids}")
    print(f"bench_image: {log.stem}: {seconds:.1f} s, {received / 1e9:.2f} GB received by the nodes", flush=True)
    return seconds, received, output


def _empty_daemons() -> None:
    import simcluster

    for node in simcluster.NODES:
        subprocess.run(["docker", "exec", node, "docker", "rmi", "-f", IMAGE], capture_output=True)


def bench(work_dir: Path) -> list[dict]:
    import simcluster

    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        print("bench_image: no running Docker engine (bash scripts/ensure-docker.sh): skipped")
        return []
    default_gb = "0.05" if os.environ.get("ROLLOUT8_BENCH_QUICK") == "1" else "1"
    size = int(float(os.environ.get("ROLLOUT8_BENCH_IMAGE_GB", default_gb)) * 1e9)
    nodes = simcluster.NODES
    # the tarball, the shared copy, each daemon's layers and one load's unpacked copy
    simcluster.need_disk(str(work_dir), size * (3 + len(nodes)) / 1e9 + 2, "bench_image")
    work_dir.mkdir(parents=True, exist_ok=True)
    tarball = _image(work_dir, size)
    rows = []
    try:
        simcluster.up()  # the nodes as they are (the demo's training image stays loaded): only the bench's image goes
        _preflight(simcluster, work_dir)
        _empty_daemons()
        per_node, per_node_bytes, _ = _play(tarball, False, work_dir / "per-node.log")
        _empty_daemons()
        shared, shared_bytes, _ = _play(tarball, True, work_dir / "shared.log")
        again, again_bytes, out = _play(tarball, True, work_dir / "again.log")
        changed = {h: r["changed"] for h, r in simcluster.Run(0, out, again).recap().items() if r["changed"]}
        if changed or again_bytes > max(0.01 * size, 10e6):  # ssh and Ansible's modules: about 2 MB whatever the size
            raise RuntimeError(f"the re-run changed {changed} and sent {again_bytes} bytes; "
                               f"log {work_dir / 'again.log'}")
    finally:
        _empty_daemons()
        subprocess.run(["docker", "rmi", "-f", IMAGE], capture_output=True)
    gb = f"{size / 1e9:.1f} GB image, {len(nodes)} nodes"
    rows.append({"name": f"image distribution, bytes over the controller's link ({gb})",
                 "a_label": "through the shared storage", "a": shared_bytes / 1e9,
                 "b_label": "a copy per node", "b": per_node_bytes / 1e9, "unit": "GB",
                 "note": "goal 1/N: the tarball crosses the controller's link once, whatever the node count"})
    rows.append({"name": f"image distribution, time ({gb}, loads one at a time)",
                 "a_label": "through the shared storage", "a": shared, "b_label": "a copy per node", "b": per_node,
                 "unit": "s", "note": "one machine, one disk: the copies and loads share it; on a cluster the "
                                      "per-node copies share the controller's link instead"})
    rows.append({"name": f"image distribution, re-run with the image on every node ({gb})",
                 "a_label": "re-run", "a": again, "b_label": "first (shared)", "b": shared, "unit": "s",
                 "note": f"{again_bytes / 1e6:.1f} MB received (ssh and Ansible's modules): nothing sent"})
    return rows
