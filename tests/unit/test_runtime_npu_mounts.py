"""The training container mounts npu-smi and hccn_tool from where the node has them (issue 26, part 7): the
runtime role finds them as preflight does (node module rollout8_hccn: PATH, then the driver's directories) and maps
them onto the paths the image expects; Docker would make an empty directory of a source that is not there. Run as
the role's task and vars run them: ansible-playbook on this machine (connection local), fake tools on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
BIN = REPO / ".venv" / "bin"


def resolved_mounts(tmp_path: Path, path_dir: Path) -> list[str]:
    book = tmp_path / "mounts.yml"
    book.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars_files": [str(ANSIBLE / "roles/rollout8_defaults/defaults/main.yml"),
                       str(ANSIBLE / "roles/runtime/defaults/main.yml"), str(ANSIBLE / "roles/runtime/vars/main.yml")],
        "vars": {"rollout8_plan": {"accelerator": "npu", "npus_per_node": 8},
                 "ansible_python_interpreter": sys.executable},
        "tasks": [
            {"name": "find", "rollout8_hccn": {"npu_smi": "{{ rollout8_npu_smi }}",
                                              "hccn_tool": "{{ rollout8_hccn_tool }}", "node": "node-a"},
             "environment": {"PATH": f"{path_dir}:/usr/bin:/bin"}, "register": "rollout8_runtime_npu_tools"},
            {"name": "show", "ansible.builtin.copy": {
                "content": "{{ rollout8_container_npu_mounts_resolved | to_json }}",
                "dest": str(tmp_path / "mounts.json")}},
        ]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), ANSIBLE_LIBRARY=str(ANSIBLE / "library"),
               PATH=f"{BIN}:{os.environ['PATH']}")
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(book)], cwd=ANSIBLE, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads((tmp_path / "mounts.json").read_text())


def fake_tool(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / name
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    return tool


def test_tools_found_elsewhere_are_mounted_at_the_images_paths_and_the_rest_as_configured(tmp_path):
    npu_smi = fake_tool(tmp_path / "usr-bin", "npu-smi")  # e.g. openEuler's driver package: /usr/bin/npu-smi
    hccn = fake_tool(tmp_path / "usr-bin", "hccn_tool")
    mounts = resolved_mounts(tmp_path, tmp_path / "usr-bin")
    defaults = yaml.safe_load((ANSIBLE / "roles/runtime/defaults/main.yml").read_text())
    defaults = defaults["rollout8_container_npu_mounts"]
    assert f"{npu_smi}:/usr/local/bin/npu-smi:ro" in mounts
    assert f"{hccn}:/usr/local/Ascend/driver/tools/hccn_tool:ro" in mounts
    assert "/usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro" not in mounts
    # every other driver mount as configured, in its place
    others = [m for m in defaults if "npu-smi" not in m and "hccn_tool" not in m]
    assert [m for m in mounts if "npu-smi" not in m and "hccn_tool" not in m] == others
    assert len(mounts) == len(defaults)
