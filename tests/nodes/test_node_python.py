"""The node-side code on a node as old as the vendors' (issue: nodes as they come from the vendor).

`ansible/library/` runs with the node's own Python, not ours: openEuler 22.03 ships 3.9, Kylin V10 3.7. Every module
is parsed as Python 3.7 (tests/unit/test_role_contracts.py) and linted for it (`make lint-node`); here they run, as
Ansible runs them, on a Debian bullseye node (Python 3.9, as debootstrap makes it: no `requests`), reached by the
real ansible-playbook of .venv through the Docker connection:
- rollout8_node_state reports that Python and no `requests`; without node wheels on the controller, preflight's node
  check refuses it in one line naming the node, its Python and the fixes, before anything is sent; with them
  (`make node-wheels`), it installs requests into rollout8's own directory and the Docker modules run;
- rollout8_deploy_root makes a deploy root with its marker (a re-run changes nothing);
- rollout8_arrival checks, seals (reading the file once, in its thread pool) and then finds the file current;
- rollout8_ray_api asks a Ray dashboard that is not there and says so instead of failing;
- rollout8_port_probe listens, is reached on its ports (a pinned one and the kernel's pick) and stops;
- a host kept waiting after its clock was read (as a node waits for another's install) is not taken for a skewed clock;
- verify's driver-log fetch sends only what the head's driver log gained since the last verify (a 1 GiB growth
  sends 1 GiB, then 100 bytes of growth send 100 bytes), and the controller's copy equals the head's byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from rollout8.lock import load_lock

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
# The oldest Debian the mirror still carries: Python 3.9, as on openEuler 22.03. No python3-requests: debootstrap's
# minimal system, as a vendor's node may come.
IMAGE = "rollout8/bullseye-python:1"
NODE = f"rollout8-test-py39-{uuid.uuid4().hex[:6]}"


def docker(*args: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


@pytest.fixture(scope="module")
def node():
    if shutil.which("docker") is None or docker("info", check=False, timeout=60).returncode != 0:
        pytest.skip("no Docker engine (scripts/ensure-docker.sh starts one)")
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        subprocess.run(["bash", "scripts/make-base-image.sh"], cwd=REPO, check=True, timeout=1200,
                       env={**os.environ, "SUITE": "bullseye", "PACKAGES": "python3", "IMAGE": IMAGE})
    # this machine's Docker socket: the Docker modules on the node have a daemon to talk to
    docker("run", "-d", "--name", NODE, "--label", "rollout8.test=1", "-v", "/var/run/docker.sock:/var/run/docker.sock",
           IMAGE, "sleep", "3600")
    try:
        yield NODE
    finally:
        docker("rm", "-f", NODE, check=False)


def play(tmp_path: Path, node: str, tasks: list[dict], name: str) -> subprocess.CompletedProcess:
    """The tasks in one play on the node, from ansible/ as users run it (its ansible.cfg: library, roles)."""
    book = tmp_path / f"{name}.yml"
    book.write_text(yaml.safe_dump([{"name": name, "hosts": node, "gather_facts": False, "tasks": tasks}]))
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"{node} ansible_connection=community.docker.docker "
                         "ansible_python_interpreter=/usr/bin/python3\n")
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"),
               PATH=f"{PLAYBOOK.parent}:{os.environ['PATH']}")
    return subprocess.run([str(PLAYBOOK), "-i", str(inventory), str(book)], cwd=ANSIBLE, capture_output=True,
                          text=True, env=env, timeout=600)


def results(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    """Each task's result on the node, by task name without its role's prefix (the json callback's output)."""
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    return {task["task"]["name"].split(" : ", 1)[-1]: next(iter(task["hosts"].values()))
            for p in out["plays"] for task in p["tasks"] if task["hosts"]}


def preflight_node(tmp_path: Path, node: str, wheels: Path) -> subprocess.CompletedProcess:
    """preflight's node check, as train.yml runs it (the role's tasks file, with a plan's deploy root), the
    controller's node wheels in `wheels`."""
    return play(tmp_path, node, [
        {"name": "preflight node", "ansible.builtin.include_role": {"name": "preflight", "tasks_from": "node"},
         "vars": {"rollout8_plan": {"deploy_root": "/var/lib/rollout8/runs/py39"},
                  "rollout8_node_wheels_dir": str(wheels)}}], "preflight")


STATE = ("Free space near the deploy root and the checkpoints, /dev/shm, the clock, rsync and the node's Python "
         "(one call, reads only)")
CHECK = "The node's Python can run the Docker modules (it has the requests library)"
PYLIB = "/opt/rollout8/node-python"


def test_preflight_refuses_a_node_python_without_requests_and_no_node_wheels_in_one_line(node, tmp_path):
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    proc = preflight_node(tmp_path, node, empty)
    assert proc.returncode != 0, proc.stdout[-2000:]
    found = results(proc)
    state = found[STATE]
    assert state["python_version"].startswith("3.9.") and state["requests"] == "", state
    refusal = found[CHECK]["msg"]
    assert "\n" not in refusal.strip()
    assert refusal.startswith(f"{node}: Python {state['python_version']} (/usr/bin/python3) has no `requests`"), refusal
    assert f"the controller has no node wheels to install ({empty} is empty): run `make node-wheels`" in refusal
    assert "apt-get install python3-requests" in refusal and refusal.endswith("Nothing was changed.")
    assert docker("exec", node, "test", "-e", PYLIB, check=False).returncode != 0


def test_preflight_installs_requests_from_the_node_wheels_and_the_docker_modules_run(node, tmp_path):
    """The lock's node_python wheels (scripts/node-wheels.sh, from PyPI) go into rollout8's directory on the node,
    not the system's; a Docker module run with the roles' environment then talks to a Docker daemon (this machine's,
    its socket mounted into the node), one without it fails for want of requests. A second preflight changes
    nothing."""
    out = subprocess.run(["bash", "scripts/node-wheels.sh"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OUT=str(tmp_path / "wheels"), PY=sys.executable))
    assert out.returncode == 0, out.stderr
    wheels = tmp_path / "wheels"
    proc = preflight_node(tmp_path, node, wheels)
    assert proc.returncode == 0, proc.stdout[-4000:]
    found = results(proc)
    assert found[STATE]["requests"] == "", found[STATE]
    pins = load_lock(REPO / "versions.lock.yaml").node_python
    assert found["The node's Python with them"]["requests"] == pins["requests"], found["The node's Python with them"]
    said = found["What was installed"]["msg"]
    assert said.startswith(f"{node}: Python 3.9."), said
    assert all(f"{name.replace('-', '_')} {version}" in said for name, version in pins.items()), said
    assert f"into {PYLIB} for the Docker modules" in said, said
    # the system's Python is as it was
    assert docker("exec", node, "python3", "-c", "import requests", check=False).returncode != 0

    again = results(preflight_node(tmp_path, node, wheels))
    assert again[STATE]["requests"] == pins["requests"] and again[CHECK]["msg"] == "All assertions passed"
    assert again["Unpack them into rollout8_node_pylib (the node's own zipfile; each once)"].get("skipped") is True

    env = "{{ rollout8_node_python_env }}"
    ran = play(tmp_path, node, [
        {"name": "defaults", "ansible.builtin.include_role": {"name": "rollout8_defaults", "public": True}},
        {"name": "with", "environment": env, "community.docker.docker_host_info": {}},
        {"name": "without", "community.docker.docker_host_info": {}, "ignore_errors": True},
    ], "docker")
    found = results(ran)
    assert found["with"].get("failed") is not True and found["with"]["host_info"]["ServerVersion"], found["with"]
    assert found["without"].get("failed") is True and "requests" in found["without"]["msg"], found["without"]


def test_a_host_kept_waiting_after_its_clock_was_read_is_not_refused_for_clock_skew(node, tmp_path):
    """preflight reads every node's clock in one task, then nodes wait for each other (a node installing the node
    wheels keeps the others at the next task). The skew is taken as the clock is read (node.yml), so a wait longer
    than the allowed skew before the check (clock.yml) is no skew: refused, it stopped the demo's other nodes once a
    bullseye node joined it."""
    out = subprocess.run(["bash", "scripts/node-wheels.sh"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OUT=str(tmp_path / "wheels"), PY=sys.executable))
    assert out.returncode == 0, out.stderr
    proc = play(tmp_path, node, [
        {"name": "preflight node", "ansible.builtin.include_role": {"name": "preflight", "tasks_from": "node"},
         "vars": {"rollout8_plan": {"deploy_root": "/var/lib/rollout8/runs/py39"},
                  "rollout8_node_wheels_dir": str(tmp_path / "wheels")}},
        {"name": "kept waiting", "ansible.builtin.pause": {"seconds": 5}},
        {"name": "preflight clock", "ansible.builtin.include_role": {"name": "preflight", "tasks_from": "clock"},
         "vars": {"rollout8_preflight_max_clock_skew_s": 1}},
    ], "clock")
    assert proc.returncode == 0, proc.stdout[-3000:]
    found = results(proc)
    assert abs(int(found["The node's clock against the controller's, as it was read"]["ansible_facts"]
                   ["rollout8_clock_skew_s"])) <= 2, found
    assert found["Clock skew against the controller (the node's clock was read with its free space)"]["msg"] \
        == "All assertions passed"


def test_every_node_module_runs_on_python_3_9(node, tmp_path):
    root = "/var/lib/rollout8/runs/py39"
    launch = b"#!/bin/bash\necho launch\n"
    (tmp_path / "launch.sh").write_bytes(launch)
    copies = [{"what": "launch", "src": str(tmp_path / "launch.sh"), "dest": f"{root}/launch.sh", "kind": "file",
               "files": [{"path": f"{root}/launch.sh", "size": len(launch), "mtime_ns": 0,
                          "sha256": hashlib.sha256(launch).hexdigest()}]}]
    ledger = f"{root}/.rollout8-arrival.json"
    proc = play(tmp_path, node, [
        {"name": "root", "rollout8_deploy_root": {"path": root, "run": "py39", "state": "present"}},
        {"name": "root again", "rollout8_deploy_root": {"path": root, "run": "py39", "state": "present"}},
        {"name": "check", "rollout8_arrival": {"ledger": ledger, "copies": copies, "mode": "check"}},
        {"name": "send", "ansible.builtin.copy": {"src": str(tmp_path / "launch.sh"), "dest": f"{root}/launch.sh",
                                                 "mode": "0755"}},
        {"name": "seal", "rollout8_arrival": {"ledger": ledger, "copies": copies, "mode": "seal",
                                              "stale": [f"{root}/launch.sh"]}},
        {"name": "check again", "rollout8_arrival": {"ledger": ledger, "copies": copies, "mode": "check"}},
        {"name": "ray", "rollout8_ray_api": {"url": "http://127.0.0.1:9", "what": "nodes", "timeout": 5}},
        {"name": "python", "rollout8_node_state": {"path": root}},
        {"name": "listen", "rollout8_port_probe": {"mode": "listen", "ports": [6380], "seconds": 60},
         "register": "listen"},
        {"name": "connect", "rollout8_port_probe": {
            "mode": "connect", "timeout": 2,
            "peers": {"self": {"address": "127.0.0.1", "ports": ["{{ listen.bound[0] }}", "{{ listen.ephemeral }}"]}}}},
        {"name": "stop", "rollout8_port_probe": {"mode": "stop"}},
    ], "modules")
    assert proc.returncode == 0, proc.stdout[-4000:]
    found = results(proc)
    assert found["python"]["python_version"].startswith("3.9."), found["python"]
    assert (found["root"]["changed"], found["root"]["created"], found["root"]["marked"]) == (True, True, True)
    assert found["root again"]["changed"] is False
    assert [c["what"] for c in found["check"]["send"]] == ["launch"] and found["check"]["current"] == 0
    assert found["seal"].get("failed") is not True, found["seal"]
    assert found["check again"]["send"] == [] and found["check again"]["current"] == 1, found["check again"]
    assert found["ray"]["reachable"] is False and found["ray"].get("failed") is not True, found["ray"]
    assert found["listen"]["bound"] == [6380] and found["connect"]["missing"] == [], found["connect"]
    assert found["stop"]["stopped"] is True, found["stop"]


def test_verify_fetches_only_what_the_driver_log_gained_since_the_last_verify(node, tmp_path):
    """Issue 28, part 4. Measured: the bytes cut on the head and fetched, as the play reports them (the size of the
    part file the fetch copied), checked against the controller's copy: it grows by exactly that much and equals the
    head's log byte for byte after each verify."""
    job = "rollout8-growing-0123456789ab-verl-20261205000000"
    log = f"/opt/rollout8/ray/session_2026-12-05_00-00-00_000000_1/logs/job-driver-{job}.log"
    docker("exec", node, "sh", "-c", f"mkdir -p {os.path.dirname(log)} /opt/rollout8/logs && "
                                     f"yes 'step:1 - a driver line' | head -c 1048576 > {log}")
    logs = tmp_path / "logs" / job

    def verify() -> int:
        proc = play(tmp_path, node, [{"name": "driver log", "ansible.builtin.include_role": {
            "name": "verify", "tasks_from": "driver_log"},
            "vars": {"rollout8_job_id": job, "rollout8_job_logs": str(logs)}}], "driver")
        assert proc.returncode == 0, proc.stdout[-3000:]
        said = results(proc)["How much was sent"]["msg"]
        head = docker("exec", node, "sha256sum", log).stdout.split()[0]
        assert hashlib.sha256((logs / "driver.log").read_bytes()).hexdigest() == head
        assert not (logs / "driver.part").exists()
        assert docker("exec", node, "ls", "/opt/rollout8/logs").stdout.split() == []
        return int(said.split(" new bytes sent")[0].split()[-1])

    assert verify() == 1 << 20
    docker("exec", node, "sh", "-c", f"yes 'step:2 - another driver line' | head -c {1 << 30} >> {log}", timeout=600)
    assert verify() == 1 << 30
    assert (logs / "driver.log").stat().st_size == (1 << 30) + (1 << 20)
    docker("exec", node, "sh", "-c", f"head -c 100 /dev/zero | tr '\\0' x >> {log}")
    assert verify() == 100
    assert verify() == 0
