"""The node-side code on an aarch64 node, as an Atlas node's Kunpeng 920 runs it (issue 43, item 3, its first part).

An emulated arm64 Debian bullseye node (Python 3.9, as openEuler 22.03's; sim_images.old_base_image("arm64"): the old
node's base, built by scripts/make-base-image.sh under QEMU on an x86_64 host), in which the emulated aarch64 Python:
- compiles and imports every module of ansible/library/ with the controller's Ansible module_utils (which AnsiballZ
  ships with each module), and imports every module of rollout8.node (the keeper's with PyYAML's pure-Python code);
- runs rollout8_node_state as Ansible does (a JSON file of ANSIBLE_MODULE_ARGS), which reports machine aarch64,
  Python 3.9 and no requests; then unpacks the lock's node wheels with the node's own `python3 -m zipfile -e`, as
  preflight does, and runs it again: requests, urllib3, charset-normalizer and the rest import on aarch64.

Emulation takes minutes (the image's first build most of them), so `make test` skips it and `make arm64-check` runs
it (ROLLOUT8_TEST_ARM64=1), printing how long the build and each step took.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import sim_images  # virtual/, on pytest's pythonpath
import yaml

import ansible
from rollout8.lock import load_lock

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NODE = f"rollout8-test-arm64-{uuid.uuid4().hex[:6]}"
# The controller's Ansible (its module_utils) and PyYAML, pure Python, mounted read-only: the first is what AnsiballZ
# would bring, the second what the training image brings the keeper. PyYAML's compiled part is x86_64 and CPython
# 3.11's: the node's Python passes it by and takes the pure-Python loader.
CONTROLLER = "/opt/controller"
PYTHONPATH = f"/repo/src:{CONTROLLER}"


def docker(*args: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


def timed(what: str, started: float) -> None:
    print(f"\n>> arm64: {what} in {time.monotonic() - started:.1f} s", file=sys.stderr)


@pytest.fixture(scope="module")
def node():
    if os.environ.get("ROLLOUT8_TEST_ARM64") != "1":
        pytest.skip("the emulated aarch64 node takes minutes (QEMU): `make arm64-check` runs it "
                    "(ROLLOUT8_TEST_ARM64=1)")
    if shutil.which("docker") is None or docker("info", check=False, timeout=60).returncode != 0:
        pytest.skip("no Docker engine (scripts/ensure-docker.sh starts one)")
    # asked for explicitly: no emulation is a failure with the fix, not a skip
    assert Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists(), (
        "no aarch64 emulation on this machine: as root, apt-get install qemu-user-static binfmt-support (and "
        "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc where it is not mounted)")
    started = time.monotonic()
    image = sim_images.old_base_image("arm64")
    timed(f"base image {image}", started)
    started = time.monotonic()
    docker("run", "-d", "--platform", "linux/arm64", "--name", NODE, "--label", "rollout8.test=1",
           "-e", "PYTHONDONTWRITEBYTECODE=1", "-v", f"{REPO}:/repo:ro",
           "-v", f"{Path(ansible.__file__).parent}:{CONTROLLER}/ansible:ro",
           "-v", f"{Path(yaml.__file__).parent}:{CONTROLLER}/yaml:ro", image, "sleep", "3600")
    try:
        assert docker("exec", NODE, "uname", "-m").stdout.strip() == "aarch64"
        timed("node started", started)
        yield NODE
    finally:
        docker("rm", "-f", NODE, check=False)


def node_python(node: str, code: str, *, pythonpath: str = PYTHONPATH) -> dict:
    """The JSON that code (run by the node's /usr/bin/python3) prints as its last line."""
    proc = docker("exec", "-e", f"PYTHONPATH={pythonpath}", node, "/usr/bin/python3", "-c", code)
    return json.loads(proc.stdout.strip().splitlines()[-1])


IMPORT_ALL = """
import glob, importlib, importlib.util, json, os, pkgutil, platform, sys
failed, done = {}, []
for path in sorted(glob.glob("/repo/ansible/library/*.py")):
    name = os.path.basename(path)[:-3]
    try:
        with open(path) as handle:
            compile(handle.read(), path, "exec")
        spec = importlib.util.spec_from_file_location(name, path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        done.append(name)
    except BaseException as error:
        failed[name] = "%s: %s" % (type(error).__name__, error)
import rollout8.node
for found in pkgutil.walk_packages(rollout8.node.__path__, "rollout8.node."):
    if found.name.endswith(".__main__"):
        continue
    try:
        importlib.import_module(found.name)
        done.append(found.name)
    except BaseException as error:
        failed[found.name] = "%s: %s" % (type(error).__name__, error)
print(json.dumps({"machine": platform.machine(), "python": platform.python_version(), "done": done,
                  "failed": failed}))
"""


def test_every_node_module_and_the_node_package_import_on_aarch64_python_3_9(node):
    started = time.monotonic()
    found = node_python(node, IMPORT_ALL)
    timed(f"{len(found['done'])} modules compiled and imported", started)
    assert (found["machine"], found["python"][:4]) == ("aarch64", "3.9."), found
    assert found["failed"] == {}, found["failed"]
    library = {path.stem for path in (REPO / "ansible" / "library").glob("*.py")}
    assert library <= set(found["done"]) and "rollout8.node.keeper" in found["done"], found["done"]


def run_module(node: str, name: str, args: dict, pythonpath: str = CONTROLLER) -> dict:
    """ansible/library/<name> run by the node's Python as Ansible runs it: given a file of ANSIBLE_MODULE_ARGS."""
    written = f"/tmp/{name}-args.json"
    docker("exec", node, "/usr/bin/python3", "-c", f"import sys; open({written!r}, 'w').write(sys.argv[1])",
           json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = docker("exec", "-e", f"PYTHONPATH={pythonpath}", node, "/usr/bin/python3",
                  f"/repo/ansible/library/{name}.py", written, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_node_state_reports_aarch64_and_the_node_wheels_import_there(node):
    started = time.monotonic()
    state = run_module(node, "rollout8_node_state", {"path": "/var/lib/rollout8/runs/arm64", "docker": True})
    timed("rollout8_node_state", started)
    assert state["machine"] == "aarch64" and state["python_version"].startswith("3.9."), state
    assert state["python"] == "/usr/bin/python3" and state["requests"] == "", state
    assert state["existing"] == "/var/lib" and state["free_bytes"] > 0 and state["rsync"] == "/usr/bin/rsync", state
    # no Docker on this node: its runtime reading says so instead of failing
    assert state["changed"] is False and (state["docker_init_name"], state["docker_init"]) == ("", ""), state

    # preflight's install of the node wheels (roles/preflight/tasks/node.yml): each unpacked by the node's Python
    started = time.monotonic()
    out = subprocess.run(["bash", "scripts/node-wheels.sh"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PY=sys.executable))
    assert out.returncode == 0, out.stderr
    wheels = REPO / out.stdout.strip().splitlines()[-1]
    pylib = "/opt/rollout8/node-python"
    for wheel in sorted(wheels.glob("*.whl")):
        docker("exec", node, "/usr/bin/python3", "-m", "zipfile", "-e", f"/repo/{wheel.relative_to(REPO)}", pylib)
    state = run_module(node, "rollout8_node_state", {"path": "/"}, pythonpath=f"{pylib}:{CONTROLLER}")
    pins = load_lock(REPO / "versions.lock.yaml").node_python
    assert state["requests"] == pins["requests"], state
    imported = node_python(node, "import json, charset_normalizer, certifi, idna, requests, urllib3; print(json.dumps("
                           "{m.__name__: m.__version__ for m in (charset_normalizer, idna, requests, urllib3)}))",
                           pythonpath=pylib)
    assert imported == {name.replace("-", "_"): pins[name] for name in
                        ("charset-normalizer", "idna", "requests", "urllib3")}, imported
    timed("node wheels unpacked and imported", started)
