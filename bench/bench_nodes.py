"""The cost of N nodes (issue 46 item 4): train.yml's node-facing plays that need no Docker daemon, timed on
N = 1, 4, 8, 16 light simulated nodes, each play group at N against N = 1.

A light node is a container of the simulated site's node image (virtual/sim_images.node_image) running sshd alone:
the login user with passwordless sudo, the node's Python, rsync, the README's firewall (virtual/sim_nodes
.firewall_rules: ssh from the bastion only, the job's ports from the nodes' subnet only), a shared directory (one
host directory every node mounts at cluster.shared_dir), and no Docker daemon. The nodes (rollout8-bench-n01..),
their bastion (rollout8-bench-bastion, the node image's sshd) and their network (rollout8-bench-nodes, a subnet
Docker picks) are this bench's own: the demo's cluster (rollout8-sim-*) is never touched. Each size gets new nodes,
bare as a machine comes (the previous size's are removed), reached only through the bastion with the inventory's
ssh settings (sim_nodes.write_inventory: head + N-1 workers; the data NIC is eth0, the nodes' one interface).

Timed per size, with `--tags preflight,artifacts` (plus the boilerplate every run has) and the documented escape
hatch `rollout8_preflight_skip: [docker, clock]` (docker: the one preflight check that needs a daemon; clock: the
nodes share this machine's clock; both reported as skipped by the play itself):
- the first converge: the contract and inventory validation and the plan (controller), the facts play (every node:
  sudo, addresses, one uid:gid), preflight (node state, disk, clock, the shared directory written and read back as
  the training container's user, Ray's ports, the all-pairs reachability of roles/preflight/tasks/reach.yml), and
  the artifacts (the tests' tiny model pair and data, sent by rsync to every node, sealed in the arrival ledger);
- the no-change re-run: the same command, whose artifacts play is the arrival check alone; it must change nothing
  on any node.
Two rounds per size (one in quick mode), each on new nodes; every group keeps its best round (other work on this
machine only adds).
Play and task wall times come from bench/callback/rollout8_play_times.py. Beside them, the CPU each run cost: the
controller's (ansible-playbook, its workers, ssh with its control masters and ProxyJump clients, rsync: reaped
descendants, this process being their subreaper) and the nodes' and bastion's (their cgroups). Wall time on a
machine shared with other work moves with that work; CPU seconds much less, and they say where a cluster's time
would go: the controller's part runs on its cores, each node's on its own. A failed play, or a re-run that changes
anything, is an error, not a number. Every run starts with no ssh connection open (its own ControlPath directory).

The run spec is the cluster tests' (virtual/sim_runs.prepare_run: configs/runs/tiny-cpu.yaml, the controller
sending the artifacts) with cluster.nnodes: N, cluster.shared_dir, and batch sizes that divide on 16 ranks.
ROLLOUT8_BENCH_QUICK=1: sizes 1 and 4, one re-run. Needs a Docker engine (no rows without one). Everything the bench
made is removed at the end, also after a failure.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "virtual"))
QUICK = os.environ.get("ROLLOUT8_BENCH_QUICK") == "1"
SIZES = (1, 4) if QUICK else (1, 4, 8, 16)
# rounds per size, each on new nodes: a first converge and a no-change re-run; each group keeps its best round
ROUNDS = 1 if QUICK else 2
PREFIX = "rollout8-bench"
NETWORK = f"{PREFIX}-nodes"
BASTION = f"{PREFIX}-bastion"
LABEL = "rollout8.bench=nodes"
SHARED_DIR = "/mnt/rollout8-shared"
NIC = "eth0"  # a light node's one interface: management and data network in one
TAGS = "preflight,artifacts"
# The documented escape hatch (inventory/sample/group_vars/all/preflight.yml): `docker info` and the runtime checks
# are the only preflight checks that need the node's Docker daemon, which a light node does not run. And the clock:
# the light nodes share this machine's clock, so the check has no skew to find, only the delay between a node's
# reading and the controller's, which on this loaded machine passed its bound at 8 nodes (4 s against 2 s + 1).
EXTRA_VARS = {"rollout8_preflight_skip": ["docker", "clock"]}
# sshd alone, with one host key (ed25519: what the bench's known_hosts reads; made in milliseconds, 16 nodes at once)
NODE_COMMAND = ("sh", "-c", "ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key && mkdir -p /run/sshd "
                "&& exec /usr/sbin/sshd -D -e -h /etc/ssh/ssh_host_ed25519_key")
# The bastion takes as many unauthenticated connections at once as the largest size has nodes (sshd's default start
# is 10): the simulated site's bastion (sim_nodes.BASTION_MAX_STARTUPS) is sized for its 3 nodes the same way.
BASTION_COMMAND = ("sh", "-c", "ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key && mkdir -p "
                   "/run/sshd && exec /usr/sbin/sshd -D -e -h /etc/ssh/ssh_host_ed25519_key "
                   f"-o MaxStartups={max(SIZES)}:30:100")

# Play groups: each a name and the train.yml plays (their names, as the playbooks spell them) it sums.
PLAY_GROUPS = {
    "validation": ("Validate the inventory's groups (controller only)",
                   "Validate every host's variables and the run spec, write the plan (controller only)"),
    "facts": ("Reach every node and record its cluster address",),
    "preflight": ("Preflight on every node",),
    "artifacts": ("Models, data, profile and FlashRL config at the same paths on every node",),
}
# Tasks timed on their own (named as in their role; the callback sees "role : name"): preflight's all-pairs
# reachability (every task of roles/preflight/tasks/reach.yml) and the artifacts' arrival check (the ledger and a
# stat per file, on every node).
TASK_GROUPS = {
    "reach": ("Preflight on every node", ("A listener on the job's ports",
                                          "Every node's address and listening ports, read once",
                                          "Connect to every other node on them", "Stop the listener",
                                          "Every node reaches every other on the job's ports",
                                          "The cluster interfaces have one MTU")),
    "arrival check": ("Models, data, profile and FlashRL config at the same paths on every node",
                      ("Which files this node already holds (its arrival ledger and a stat; no file is read)",)),
}


def node_names(n: int) -> list[str]:
    """The bench's node containers for size n, the head first."""
    return [f"{PREFIX}-n{i:02d}" for i in range(1, n + 1)]


def group_times(plays: list[dict], total: float) -> dict[str, float]:
    """Seconds per play group and timed task group (PLAY_GROUPS, TASK_GROUPS) from the callback's record, and the
    run's wall time as "total". A group none of whose plays or tasks ran is an error: a play renamed in the
    playbooks must be renamed here, not silently counted as zero."""
    out = {}
    for group, names in PLAY_GROUPS.items():
        found = [p["seconds"] for p in plays if p["play"] in names]
        if not found:
            raise ValueError(f"no play of group {group} ({'; '.join(names)}) in this run: renamed in the playbooks?")
        out[group] = sum(found)
    for group, (play, tasks) in TASK_GROUPS.items():
        found = [t["seconds"] for p in plays if p["play"] == play for t in p["tasks"]
                 if t["task"].split(" : ", 1)[-1] in tasks]
        if not found:
            raise ValueError(f"no task of group {group} in play {play!r}: renamed in the role?")
        out[group] = sum(found)
    out["total"] = total
    return out


def growth(times: dict[int, float]) -> dict[int, dict]:
    """How one group's seconds grow with the node count: for every size n, the ratio to the smallest size, the
    seconds per node (t/n), the seconds per node added since the smallest size, and whether it grew faster than
    the node count since the size before (t(n)/t(prev) > n/prev: superlinear between them)."""
    sizes = sorted(times)
    first = sizes[0]
    out = {}
    for i, n in enumerate(sizes):
        prev = sizes[i - 1] if i else None
        out[n] = {
            "seconds": times[n],
            "ratio": times[n] / times[first] if times[first] else math.inf,
            "per_node": times[n] / n,
            "per_added_node": (times[n] - times[first]) / (n - first) if n != first else None,
            "superlinear": prev is not None and times[prev] > 0 and times[n] / times[prev] > n / prev,
        }
    return out


class Site(NamedTuple):
    """What the model of bare nodes -> first step reads (docs/benchmarks.md, "The cost of N nodes"). (A NamedTuple:
    bench/run.py loads this file without registering it in sys.modules, which a dataclass needs.)"""

    plays_fixed_s: float  # the node-facing plays' fixed part (this bench's fit)
    plays_per_node_s: float  # their part per node (this bench's fit: an upper bound, the nodes share 2 cores here)
    image_gb: float  # the training image's tarball (or the layers a pull fetches)
    load_gb_s: float  # one node's `docker load` (bench_image's rows)
    link_gb_s: float  # the controller's link (the tarball sent once)
    store_gb_s: float  # what the shared storage (or the registry) serves to all nodes at once
    start_s: float  # Ray, launch and the first step (the simulated cluster's; not measured on NPUs)
    load_throttle: int = 0  # rollout8_image_load_throttle: at most this many loads at once (0: all)
    prepare_s_per_gb: float = 0.0  # the controller's step before the play: `make image-save`, or the push


def first_step_model(n: int, site: Site) -> dict:
    """Seconds from bare nodes to the first training step on n nodes, by term, when the image is sent once (to the
    shared storage, or pushed to a registry) and every node loads (pulls) it, at most load_throttle at once: each
    wave of loads takes the longer of one node's load and the storage serving the wave's nodes at once. Returns
    {"terms": {name: seconds}, "total": seconds, "dominant": name}."""
    wave = n if site.load_throttle <= 0 else min(site.load_throttle, n)
    waves = math.ceil(n / wave)
    node_s = site.image_gb / site.load_gb_s
    store_s = wave * site.image_gb / site.store_gb_s
    load = ("loads: the storage serving every node's copy" if store_s > node_s else "loads: one node's load")
    terms = {
        "node-facing plays": site.plays_fixed_s + site.plays_per_node_s * n,
        "image saved (or pushed) once": site.image_gb * site.prepare_s_per_gb,
        "image sent once": site.image_gb / site.link_gb_s,
        load: waves * max(node_s, store_s),
        "Ray, launch, first step": site.start_s,
    }
    return {"terms": terms, "total": sum(terms.values()), "dominant": max(terms, key=terms.get)}


def fit(times: dict[int, float]) -> tuple[float, float]:
    """Least-squares line t = fixed + per_node * n through the measured sizes: (fixed, per_node)."""
    xs, ys = list(times), list(times.values())
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return mean_y - slope * mean_x, slope


# ---------------------------------------------------------------------------------------------- the light site


def _docker(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], input=stdin, text=True, capture_output=True, check=check, timeout=120)


def _remove(names: list[str]) -> None:
    if names:
        _docker("rm", "-f", *names, check=False)


def _down() -> None:
    """The bench's containers and network, by their names (what an interrupted bench left included)."""
    _remove([BASTION, *node_names(max(SIZES))])
    _docker("network", "rm", NETWORK, check=False)


def _address(name: str) -> str:
    out = _docker("inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{NETWORK}").IPAddress}}}}', name)
    if not out.stdout.strip():
        raise RuntimeError(f"{name} has no address on {NETWORK}")
    return out.stdout.strip()


def _scan(ip: str, via: tuple[str, ...] = (), attempts: int = 40) -> str:
    """The host key of sshd at ip (bounded: attempts x 0.25 s), read from here or from the bastion (via)."""
    for _ in range(attempts):
        scan = subprocess.run([*via, "ssh-keyscan", "-T", "2", "-t", "ed25519", ip], capture_output=True, text=True,
                              timeout=30)
        if scan.stdout.strip():
            return scan.stdout.strip()
        time.sleep(0.25)
    raise RuntimeError(f"sshd at {ip} does not answer after {attempts // 4} s")


def _site(work: Path, image: str) -> tuple[Path, str, str]:
    """The network, the bastion, the login key and the shared directory: (key, bastion's address, subnet)."""
    _docker("network", "create", "--label", LABEL, NETWORK)
    _docker("run", "-d", "--name", BASTION, "--hostname", BASTION, "--network", NETWORK, "--label", LABEL, "--init",
            image, *BASTION_COMMAND)
    ssh = work / "ssh"
    ssh.mkdir(parents=True)
    key = ssh / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rollout8-bench", "-f", str(key)],
                   check=True, capture_output=True)
    shared = work / "shared"
    shared.mkdir()
    from sim_images import NODE_UID

    os.chown(shared, NODE_UID, NODE_UID)  # the export belongs to the training container's user, as the demo's
    subnet = _docker("network", "inspect", "-f", "{{(index .IPAM.Config 0).Subnet}}", NETWORK).stdout.strip()
    return key, _address(BASTION), subnet


def _nodes_up(names: list[str], image: str, work: Path, key: Path, bastion: str, subnet: str) -> Path:
    """New light nodes (the README's firewall loaded, the login key authorized), their host keys known; returns
    the inventory (head + workers, through the bastion)."""
    import sim_nodes

    for name in names:
        _docker("run", "-d", "--name", name, "--hostname", name, "--network", NETWORK, "--label", LABEL, "--init",
                "--shm-size", "512m", "--cap-add", "NET_ADMIN", "-v", f"{work / 'shared'}:{SHARED_DIR}",
                image, *NODE_COMMAND)
    rules = sim_nodes.firewall_rules(subnet, sim_nodes.documented_ports(), ssh_from=bastion)
    public = key.with_suffix(".pub").read_text()
    for name in (BASTION, *names):
        sim_nodes.authorize(name, public)
    for name in names:
        _docker("exec", "-i", name, "sh", "-c", "cat > /etc/nftables.conf && nft -f /etc/nftables.conf", stdin=rules)
    addresses = {name: _address(name) for name in names}
    known = [_scan(bastion)] + [_scan(ip, via=("docker", "exec", BASTION)) for ip in addresses.values()]
    (key.parent / "known_hosts").write_text("\n".join(known) + "\n")
    inventory = sim_nodes.write_inventory(work / f"inventory-{len(names)}", addresses, key, bastion=bastion)
    cluster_vars = inventory.parent / "group_vars" / "cluster.yml"
    values = yaml.safe_load(cluster_vars.read_text())
    values["rollout8_cluster_nic"] = NIC
    cluster_vars.write_text(f"# virtual/inventory/group_vars/cluster.yml with the light nodes' NIC ({__name__})\n"
                            + yaml.safe_dump(values, sort_keys=False))
    return inventory


def _spec(base: Path, n: int) -> Path:
    """The tests' run spec with cluster.nnodes n, the shared directory, and batch sizes that divide on 1 to 16
    ranks; one file for every size (one plan directory: the plan's caches serve every size)."""
    spec = yaml.safe_load(base.read_text())
    spec["name"] = "tiny-cpu-nodes"
    spec["deploy"]["root"] = "/var/lib/rollout8/runs/tiny-cpu-nodes"
    spec["verl"]["trainer.experiment_name"] = spec["name"]
    spec["cluster"]["nnodes"] = n
    spec["cluster"]["shared_dir"] = SHARED_DIR
    for key in ("data.train_batch_size", "data.val_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"):
        spec["verl"][key] = 16
    out = base.parent / "bench-nodes.yaml"
    out.write_text(f"# Generated by bench/bench_nodes.py from {base.name}\n" + yaml.safe_dump(spec, sort_keys=False))
    return out


@contextlib.contextmanager
def _environment(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _close_masters(directory: Path) -> None:
    """End the ssh control masters a run left (ControlPersist), by their sockets in the run's own directory."""
    for sock in directory.glob("*"):
        subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={sock}", "bench-node"], capture_output=True,
                       timeout=20)


# A container's CPU time so far (ns), from its own cgroup: cgroup v1's cpuacct, else v2's cpu.stat.
CPU_USAGE = ("cat /sys/fs/cgroup/cpuacct/cpuacct.usage 2>/dev/null || "
             "awk '/^usage_usec/ {printf \"%d\\n\", $2 * 1000}' /sys/fs/cgroup/cpu.stat")
PR_SET_CHILD_SUBREAPER = 36


def _containers_cpu(names: list[str]) -> float:
    """CPU seconds the containers have used so far (read in parallel, each bounded)."""
    procs = [subprocess.Popen(["docker", "exec", name, "sh", "-c", CPU_USAGE], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for name in names]
    total = 0
    for name, proc in zip(names, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        if proc.returncode != 0 or not out.strip().isdigit():
            raise RuntimeError(f"{name}: its CPU time is not readable ({err.strip() or out.strip()})")
        total += int(out)
    return total / 1e9


def _subreaper(on: bool) -> None:
    """This process as the child subreaper (Linux): the ssh control masters a run forks off (ControlPersist) and
    their ProxyJump clients are its descendants still, so their CPU counts in RUSAGE_CHILDREN once reaped."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def _reap(seconds: float = 10.0) -> None:
    """Wait for the orphaned descendants (the closed control masters) to end, bounded; each reaped one's CPU then
    counts in RUSAGE_CHILDREN."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.1)


def _controller_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(inventory: Path, spec: Path, work: Path, label: str, nodes: list[str], *args: str):
    """One ansible-playbook run against the light nodes, timed play by play, with the CPU it cost the controller
    (ansible-playbook, its workers, ssh and rsync, reaped) and the nodes and bastion (their cgroups); a failure
    raises. Returns (run, plays, {"controller cpu": s, "nodes cpu": s})."""
    import sim_nodes

    times = work / f"{label}.times.json"
    control = work / f"cp-{label}"
    control.mkdir(parents=True)
    containers = [BASTION, *nodes]
    nodes_before = _containers_cpu(containers)
    _reap(0)
    before = _controller_cpu()
    with _environment(ANSIBLE_CALLBACK_PLUGINS=f"{REPO / 'ansible' / 'plugins' / 'callback'}:"
                                               f"{REPO / 'bench' / 'callback'}",
                      ANSIBLE_CALLBACKS_ENABLED="rollout8_play_times", ROLLOUT8_PLAY_TIMES=str(times),
                      ANSIBLE_SSH_CONTROL_PATH_DIR=str(control)):
        try:
            run = sim_nodes.run_playbook(inventory, spec, work / "ansible", work / "facts",
                                         "-e", json.dumps(EXTRA_VARS), *args, timeout=1800)
        finally:
            _close_masters(control)
            _reap()
    cpu = {"controller cpu": _controller_cpu() - before, "nodes cpu": _containers_cpu(containers) - nodes_before}
    (work / f"{label}.log").write_text(run.output)
    if run.rc != 0:
        raise RuntimeError(f"{label}: train.yml failed (rc {run.rc}): {run.failure()}")
    return run, json.loads(times.read_text()), cpu


def bench(work_dir: Path) -> list[dict]:
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        print("bench_nodes: no running Docker engine (bash scripts/ensure-docker.sh): skipped")
        return []
    import sim_images
    import sim_runs

    image = sim_images.node_image()
    base = sim_runs.prepare_run(REPO / ".cache" / "bench-nodes" / "run")
    first: dict[str, dict[int, float]] = {}
    again: dict[str, dict[int, float]] = {}

    def keep(into: dict[str, dict[int, float]], n: int, times: dict[str, float]) -> None:
        for group, seconds in times.items():  # each group's best round: other work on the machine only adds
            into.setdefault(group, {})[n] = min(seconds, into.get(group, {}).get(n, math.inf))

    _down()
    _subreaper(True)
    try:
        key, bastion, subnet = _site(work_dir, image)
        for n in SIZES:
            for r in range(ROUNDS):
                names = node_names(n)
                inventory = _nodes_up(names, image, work_dir, key, bastion, subnet)
                spec = _spec(base, n)
                if n == SIZES[0] and r == 0:  # the plan's FlashRL profile and verify-quant, made once, untimed
                    _timed(inventory, spec, work_dir, "warm-up", names, "--tags", "always")
                run, plays, cpu = _timed(inventory, spec, work_dir, f"{n}-{r}-first", names, "--tags", TAGS)
                keep(first, n, group_times(plays, run.seconds) | cpu)
                rerun, plays, cpu = _timed(inventory, spec, work_dir, f"{n}-{r}-rerun", names, "--tags", TAGS)
                changed = {host: v["changed"] for host, v in rerun.recap().items() if v["changed"]}
                if changed:
                    raise RuntimeError(f"{n} node(s): the re-run changed {changed}: not idempotent")
                if not set(names) <= set(rerun.recap()):
                    raise RuntimeError(f"{n} node(s): the re-run's recap names only {sorted(rerun.recap())}")
                keep(again, n, group_times(plays, rerun.seconds) | cpu)
                print(f"bench_nodes: {n} node(s), round {r + 1}: first {run.seconds:.1f} s, re-run "
                      f"{rerun.seconds:.1f} s (load average {os.getloadavg()[0]:.1f})", flush=True)
                _remove(names)  # the next round and size start from bare nodes
            print(f"bench_nodes: {n} node(s), best: " + ", ".join(f"{g} {first[g][n]:.1f}" for g in first)
                  + "; re-run: " + ", ".join(f"{g} {again[g][n]:.1f}" for g in again), flush=True)
    finally:
        _down()
        _reap(5)
        _subreaper(False)
    return rows(first, again)


# (run, group, label, smallest size it runs at): reach.yml runs only with two nodes or more
ROW_GROUPS = (
    ("first", "validation", "contract and inventory validation, plan (controller)", 1),
    ("first", "facts", "facts play (sudo, addresses, uid:gid on every node)", 1),
    ("first", "preflight", "preflight play", 1),
    ("first", "reach", "preflight's all-pairs reachability", 2),
    ("first", "artifacts", "artifacts play, first (rsync and seal)", 1),
    ("first", "total", "first converge, whole run", 1),
    ("first", "controller cpu", "first converge, controller CPU (ansible-playbook, workers, ssh, rsync)", 1),
    ("first", "nodes cpu", "first converge, CPU of the nodes and the bastion", 1),
    ("again", "arrival check", "re-run: arrival check", 1),
    ("again", "total", "no-change re-run, whole run", 1),
    ("again", "controller cpu", "no-change re-run, controller CPU", 1),
    ("again", "nodes cpu", "no-change re-run, CPU of the nodes and the bastion", 1),
)


def rows(first: dict[str, dict[int, float]], again: dict[str, dict[int, float]]) -> list[dict]:
    """One row per group and size above the smallest it runs at: its seconds there against at that smallest size;
    the note says the seconds per node and whether it grew faster than the node count (growth)."""
    out = []
    for which, group, label, smallest in ROW_GROUPS:
        times = {n: t for n, t in (first if which == "first" else again)[group].items() if n >= smallest}
        sizes = sorted(times)
        if len(sizes) < 2:
            continue
        for n, g in growth(times).items():
            if n == sizes[0]:
                continue
            note = (f"{label}: {g['per_node']:.2f} s per node at {n}, {g['per_added_node']:+.2f} s per node added "
                    f"since {sizes[0]}")
            if g["superlinear"]:
                note += " (SUPERLINEAR: grew faster than the node count since the size before)"
            out.append({"name": f"{label}, {n} nodes vs {sizes[0]}", "a_label": f"{n} nodes", "a": g["seconds"],
                        "b_label": f"{sizes[0]} node{'s' if sizes[0] > 1 else ''}", "b": times[sizes[0]],
                        "unit": "CPU s" if "cpu" in group else "s", "note": note})
    return out
