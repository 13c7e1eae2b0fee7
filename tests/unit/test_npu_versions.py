"""Preflight's driver and firmware check (issue 26, part 3): each node's versions read from the files the driver's
installer writes (Version=...), the driver new enough, and both the same on every node, else one line naming each
version and its nodes. Run as the role runs the task file: ansible-playbook on this machine, three hosts with
connection local, each reading its own fake version files (the files are the fake, the check is the role's). The rules
themselves (the version a file names, the spread across nodes) are unit tests in test_node_rules.py; these runs prove
the wiring."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
BIN = REPO / ".venv" / "bin"
HOSTS = ("node-a", "node-b", "node-c")


def check(tmp_path: Path, versions: dict[str, tuple[str, str | None]]) -> tuple[int, str]:
    """versions: host -> (driver, firmware or None for no firmware file)."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[cluster]\n" + "".join(f"{h} ansible_connection=local\n" for h in HOSTS))
    host_vars = tmp_path / "host_vars"
    host_vars.mkdir()
    # the role's defaults below the hosts' own values, as a role's defaults are
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text((ANSIBLE / "roles/preflight/defaults/main.yml").read_text())
    for host, (driver, firmware) in versions.items():
        d = tmp_path / host
        d.mkdir()
        (d / "driver.info").write_text(f"Version={driver}\nascendhal_version=7.35.23\n")
        if firmware is not None:
            (d / "firmware.info").write_text(f"Version={firmware}\nfirmware_version=1.0\n")
        (host_vars / f"{host}.yml").write_text(yaml.safe_dump({
            "rollout8_npu_driver_version_file": str(d / "driver.info"),
            "rollout8_npu_firmware_version_file": str(d / "firmware.info")}))
    book = tmp_path / "versions.yml"
    book.write_text(yaml.safe_dump([{
        "hosts": "cluster", "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable},
        "tasks": [{"name": "versions", "ansible.builtin.include_tasks":
                   str(ANSIBLE / "roles/preflight/tasks/npu_versions.yml")}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), PATH=f"{BIN}:{os.environ['PATH']}")
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(book)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def test_different_drivers_and_firmwares_are_refused_naming_each_version_and_its_nodes(tmp_path):
    rc, out = check(tmp_path, {"node-a": ("24.1.rc3", "7.5.0.3.220"), "node-b": ("24.1.rc3", None),
                               "node-c": ("24.1.rc2", "7.5.0.3.220")})
    assert rc != 0, out[-3000:]
    assert ("NPU driver versions (24.1.rc3 on node-a, node-b; 24.1.rc2 on node-c); firmware versions "
            "(7.5.0.3.220 on node-a, node-c; unknown on node-b) differ across nodes: install one driver and one "
            "firmware on every node") in out, out[-3000:]


def test_a_driver_older_than_the_minimum_is_refused_naming_the_node_and_file(tmp_path):
    rc, out = check(tmp_path, {"node-a": ("24.1.rc3", "1"), "node-b": ("23.0.3", "1"), "node-c": ("24.1.rc3", "1")})
    assert rc != 0, out[-3000:]
    assert "node-b: NPU driver 23.0.3 < 24.1 (" in out and "driver.info): upgrade the driver" in out, out[-3000:]
    assert "node-a: NPU driver" not in out
