"""Session fixtures of the cluster tier: one simulated cluster, converged once, shared by every test."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ANSIBLE_DIR = REPO / "ansible"
sys.path.insert(0, str(HERE))

import simcluster  # noqa: E402

RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def docker_available() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True)
    return None if probe.returncode == 0 else "no running Docker engine (bash scripts/ensure-docker.sh)"


@dataclass
class Run:
    rc: int
    output: str
    seconds: float

    def recap(self) -> dict[str, dict[str, int]]:
        tail = self.output.rsplit("PLAY RECAP", 1)[-1]
        return {m[0]: {"ok": int(m[1]), "changed": int(m[2]), "unreachable": int(m[3]), "failed": int(m[4])}
                for m in RECAP.findall(tail)}


@dataclass
class Cluster:
    spec: Path
    work: Path
    facts: Path
    wheel: Path

    def playbook(self, *args: str, playbook: str = "train.yml", timeout: int = 900) -> Run:
        env = dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(self.facts), ANSIBLE_FORCE_COLOR="0",
                   ANSIBLE_NOCOLOR="1", PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}")
        cmd = [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(simcluster.INVENTORY), playbook,
               "-e", f"rollout8_run_spec={self.spec}", "-e", f"rollout8_work_dir={self.work}",
               "-e", f"rollout8_bundle_wheel={self.wheel}", *args]
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=timeout)
        run = Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)
        (self.work / "last-playbook.log").write_text(run.output)
        return run

    def node(self, name: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "exec", name, *cmd], capture_output=True, text=True, check=check)


@pytest.fixture(scope="session")
def sim_cluster() -> Cluster:
    reason = docker_available()
    if reason:
        pytest.skip(reason)
    simcluster.up()
    root = REPO / ".cache" / "cluster"
    spec = simcluster.prepare_run(root / "run")
    work = root / "test-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    facts = work / "facts"
    return Cluster(spec=spec, work=work, facts=facts, wheel=simcluster.bundle_wheel())


@pytest.fixture(scope="session")
def converged(sim_cluster: Cluster) -> Run:
    """The first converge of the session (the cluster may come fresh or from an earlier session)."""
    return sim_cluster.playbook()
