"""The simulated cluster's nodes: three containers on one user-defined Docker network, and Ansible against them.

What this module owns: the node containers (rollout8-sim-head, -w1, -w2) of the node image and their network,
made idempotently by `up` and removed by `down`; the simulated shared filesystem (one host directory every node
mounts at the same path); the inventories in virtual/inventory*; and `run_playbook`, ansible-playbook from .venv
against them, as `make demo`, the cluster tests and the benchmarks run it (`Run`: exit code, output, wall time,
PLAY RECAP).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sim_images import REPO, docker_ok, node_image, sh, wheelhouse

NETWORK = "rollout8-sim"
NODES = ("rollout8-sim-head", "rollout8-sim-w1", "rollout8-sim-w2")
LABEL = "rollout8.sim=1"
HERE = REPO / "virtual"
INVENTORY = HERE / "inventory" / "hosts.ini"
DOCKER_INVENTORY = HERE / "inventory-docker" / "hosts.ini"
ANSIBLE_DIR = REPO / "ansible"
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@dataclass
class Run:
    """One ansible-playbook run: exit code, output, wall time."""

    rc: int
    output: str
    seconds: float

    def recap(self) -> dict[str, dict[str, int]]:
        tail = self.output.rsplit("PLAY RECAP", 1)[-1]
        return {m[0]: {"ok": int(m[1]), "changed": int(m[2]), "unreachable": int(m[3]), "failed": int(m[4])}
                for m in RECAP.findall(tail)}


def run_playbook(inventory: Path, spec: Path, work: Path, facts: Path, wheel: Path, *args: str,
                 playbook: str = "train.yml", timeout: int = 900, stream: bool = False) -> Run:
    """ansible-playbook from .venv against the simulated cluster, as `make demo` runs it (bounded by timeout).

    With stream=True its output is also printed line by line as it comes (the demo's progress)."""
    env = dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(facts), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_NOCOLOR="1", PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}")
    cmd = [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), playbook,
           "-e", f"rollout8_run_spec={spec}", "-e", f"rollout8_work_dir={work}",
           "-e", f"rollout8_bundle_wheel={wheel}", *args]
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    if stream:
        proc = subprocess.Popen(cmd, cwd=ANSIBLE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        timer = threading.Timer(timeout, proc.kill)  # bounded like the captured run below
        timer.start()
        lines = []
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                lines.append(line)
            rc = proc.wait()
        finally:
            timer.cancel()
        run = Run(rc, "".join(lines), time.monotonic() - start)
    else:
        proc = subprocess.run(cmd, cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=timeout)
        run = Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)
    (work / "last-playbook.log").write_text(run.output)
    return run


# The simulated shared filesystem (an NFS mount on a real cluster): one host directory every node mounts at the
# same path, for cluster.shared_dir (verl's checkpoints, resumed after a node failure).
SHARED_HOST = REPO / ".cache" / "cluster" / "shared"
SHARED_DIR = "/mnt/rollout8-shared"


def up() -> str:
    """The network and the node containers of the current node image, idempotently: a container of the same
    image and mount is started if stopped and otherwise left alone; any other is replaced. Returns the image."""
    image = node_image(wheelhouse())
    SHARED_HOST.mkdir(parents=True, exist_ok=True)
    mount = f"{SHARED_HOST}:{SHARED_DIR}"
    if not docker_ok("network", "inspect", NETWORK):
        sh("docker", "network", "create", "--label", LABEL, NETWORK, capture=True)
    for name in NODES:
        state = sh("docker", "inspect", "-f", "{{.State.Running}} {{.Config.Image}} {{range .Mounts}}{{.Source}}:"
                   "{{.Destination}}{{end}}", name, check=False, capture=True)
        fields = state.stdout.split()
        if state.returncode == 0 and fields[1:] == [image, mount]:
            if fields[0] != "true":
                sh("docker", "start", name, capture=True)
            continue
        sh("docker", "rm", "-f", name, check=False, capture=True)
        sh("docker", "run", "-d", "--name", name, "--hostname", name, "--network", NETWORK, "--label", LABEL,
           "--init", "--shm-size", "512m", "-v", mount, image, "sleep", "infinity", capture=True)
    print(f">> simulated cluster up: {', '.join(NODES)} (inventory {INVENTORY.relative_to(REPO)})", file=sys.stderr)
    return image


def down() -> None:
    """Remove the node containers and the network (images, wheelhouse and the shared directory stay)."""
    for name in NODES:
        sh("docker", "rm", "-f", name, check=False, capture=True)
    sh("docker", "network", "rm", NETWORK, check=False, capture=True)
    print(">> simulated cluster removed", file=sys.stderr)
