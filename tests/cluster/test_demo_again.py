"""`make demo`, `make demo-down`, `make demo` (issue 46 item 0): the demo repeats from new nodes, its run starting
anew, instead of being refused because the shared directory still held the first run's checkpoint at its last step.

Last of the cluster tier (conftest.pytest_collection_modifyitems): the tests before it reuse the cluster the
README's `make demo` left, and the new nodes' demo, which carries the cost (the image loaded by three daemons
again), does not race CI's engine venv for the disk. The sequence's first `make demo` is that README demo when its
run is still there, finished, on the shared directory (CI runs the README's `make demo` before `make test`): what
the trap needs is a demo run at its last step, and a warm demo again would only say so a second time. Without one
(a `make test` on its own) the test runs that first demo itself. Its last `make demo` leaves the cluster up, as
`make bench-ci` after the tests expects."""

from __future__ import annotations

import re
import subprocess

import pytest
import simcluster
import yaml
from conftest import REPO, docker_available, latest_checkpoint

STEPS = yaml.safe_load((REPO / "configs" / "runs" / "tiny-cpu.yaml").read_text())["verl"][
    "trainer.total_training_steps"]
NNODES = yaml.safe_load((REPO / "configs" / "runs" / "tiny-cpu.yaml").read_text())["cluster"]["nnodes"]


def make(target: str) -> str:
    proc = subprocess.run(["make", target], cwd=REPO, capture_output=True, text=True, timeout=3600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"make {target} failed (rc {proc.returncode}):\n{output[-6000:]}"
    return output


def sim_containers() -> list[str]:
    return subprocess.run(["docker", "ps", "-a", "--filter", "label=rollout8.sim=1", "--format", "{{.Names}}"],
                          capture_output=True, text=True, check=True).stdout.split()


def demo_run_at_its_last_step() -> bool:
    """The demo's run finished on the shared directory of a cluster that is up: a `make demo` ran to its end."""
    return bool(sim_containers()) and latest_checkpoint(simcluster.SHARED_HOST / simcluster.demo_runs()[0]) == STEPS


def test_demo_then_demo_down_then_demo_trains_anew_on_new_nodes():
    reason = docker_available()
    if reason:
        pytest.skip(reason)
    if not demo_run_at_its_last_step():
        first = make("demo")
        assert "verdict: int8 rollouts confirmed" in first, first[-4000:]
    assert demo_run_at_its_last_step(), "the first demo left no checkpoint at its last step: the sequence tests nothing"

    make("demo-down")
    assert sim_containers() == [], "make demo-down left containers behind"

    again = make("demo")
    assert "nothing to train" not in again, again[-4000:]
    assert "verdict: int8 rollouts confirmed" in again, again[-4000:]
    # every rank synced the weights once per step: the run trained all its steps here, not resumed at the last one
    syncs = re.findall(r"(\d+) rollout rank\(s\): (\d+) int8-patched.*?; (\d+) quantized sync\(s\)", again)
    assert syncs and syncs[-1] == (str(NNODES), str(NNODES), str(NNODES * STEPS)), syncs
