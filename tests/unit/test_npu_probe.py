"""npu-smi as the training container's user (issue 43 item 5): preflight runs `npu-smi info` in a probe container
made with exactly the training container's user, groups, devices and driver mounts (the runtime role's vars, which
the training container uses too) and refuses a node where it fails, naming the node, the uid:gid and groups, npu-smi's
own message and the fix; the training container gets the driver's group (rollout8_npu_group). The rules are the
filters' (plain tests); the task file runs here as preflight runs it (connection local, fake docker and npu-smi)."""

from __future__ import annotations

import grp
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from rollout8_runtime import (
    rollout8_container_groups,
    rollout8_getent_gid,
    rollout8_npu_probe_argv,
    rollout8_npu_probe_verdict,
)

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
BIN = REPO / ".venv" / "bin"

# What npu-smi prints when the driver cannot be opened by the calling user (its dcmi library fails to initialize;
# the wording of issue reports, e.g. vllm-project/vllm-ascend#2698); exits non-zero.
REFUSAL = "DrvMngGetConsoleLogLevel failed. (g_conLogLevel=3)\ndcmi module initialize failed. ret is -8005\n"
TABLE = ("+------------------------------------------------------------------------------------------------+\n"
         "| npu-smi 24.1.rc3                 Version: 24.1.rc3                                             |\n"
         "+---------------------------+---------------+----------------------------------------------------+\n")


def getent(name: str, gid: str | None) -> dict:
    """A registered ansible.builtin.getent (database group, fail_key false) result."""
    return {"ansible_facts": {"getent_group": {name: None if gid is None else ["x", gid, ""]}}}


def test_the_driver_groups_gid_is_read_from_getent_and_absent_or_skipped_gives_none():
    assert rollout8_getent_gid(getent("HwHiAiUser", "1001"), "HwHiAiUser") == "1001"
    assert rollout8_getent_gid(getent("HwHiAiUser", None), "HwHiAiUser") == ""
    assert rollout8_getent_gid({"skipped": True, "changed": False}, "") == ""
    assert rollout8_getent_gid(None, "HwHiAiUser") == ""


def test_the_container_gets_each_devices_group_then_the_drivers_once():
    stats = [{"stat": {"exists": True, "gid": 1001}}, {"stat": {"exists": False}}, {"stat": {"exists": True, "gid": 5}}]
    assert rollout8_container_groups(stats, "1001") == ["1001", "5"]
    assert rollout8_container_groups([], "1001") == ["1001"]
    assert rollout8_container_groups([], "") == []


def test_the_probe_is_one_bounded_docker_run_with_the_containers_user_groups_devices_and_mounts():
    argv = rollout8_npu_probe_argv("img:1", "1000:1000", ["1001"], ["/dev/davinci0", "/dev/davinci_manager"],
                                   ["/usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro"], 60)
    assert argv == ["timeout", "-k", "10", "60", "docker", "run", "--rm", "--network", "none", "--user", "1000:1000",
                    "--group-add", "1001", "--device", "/dev/davinci0", "--device", "/dev/davinci_manager",
                    "-v", "/usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro", "img:1", "npu-smi", "info"]


def verdict(rc: int, out: str = "", err: str = "", user: str = "1000:1000", groups=("1001",), group="HwHiAiUser",
            gid="1001") -> dict:
    return rollout8_npu_probe_verdict({"rc": rc, "stdout": out, "stderr": err}, "node-a", user, list(groups), group,
                                      gid, 60)


def test_an_answer_passes_and_names_the_drivers_version():
    good = verdict(0, TABLE)
    assert good["problem"] == "" and good["driver"] == "24.1.rc3"
    assert good["summary"] == ("npu-smi answers as the training container's user 1000:1000 (groups 1001), NPU driver "
                               "24.1.rc3")
    assert verdict(0, "something else")["summary"].endswith("NPU driver version not shown")


def test_a_node_without_the_drivers_group_is_refused_in_one_line_naming_node_user_message_and_fix():
    line = verdict(1, REFUSAL, groups=(), gid="")["problem"]
    assert "\n" not in line
    assert line.startswith("node-a: npu-smi info fails in a probe container made as the training container is (user "
                           "1000:1000, groups none, its devices and driver mounts): DrvMngGetConsoleLogLevel failed")
    assert "ret is -8005. The node has no HwHiAiUser group (getent group HwHiAiUser finds none)" in line
    assert "set rollout8_npu_group to the group that owns /dev/davinci* here" in line


def test_the_group_given_and_still_refused_names_the_drivers_permissions():
    line = verdict(1, REFUSAL)["problem"]
    assert "(user 1000:1000, groups 1001, " in line
    assert "HwHiAiUser's gid 1001 was added and npu-smi still refuses: the driver's permissions (/dev/davinci*" in line
    assert 'rollout8_container_user: "0:0"' in line


def test_the_other_failures_say_what_else_it_is():
    assert "rollout8_npu_group is empty, so no driver group was added" in verdict(1, REFUSAL, group="", gid="")[
        "problem"]
    assert "It runs as root, so no group is missing" in verdict(1, REFUSAL, user="0:0", groups=())["problem"]
    assert "did not answer within 60 s" in verdict(124)["problem"]
    started = verdict(125, err="docker: Error response from daemon: error gathering device information while adding "
                              "custom device \"/dev/davinci0\": no such file or directory.")["problem"]
    assert 'custom device "/dev/davinci0": no such file or directory. The container did not start' in started
    assert "npu-smi is not there (or not executable) in the container" in verdict(127, err="exec: npu-smi: not found")[
        "problem"]


# ----------------------------------------------------------------------------- the task file, as preflight runs it
FAKE_DOCKER = """#!/bin/sh
# stand-in for docker: records each call; `image inspect` answers as the image's presence says; `run` is npu-smi
# in the container: the driver's refusal unless the gid named in {gate} is among the groups added
echo "$*" >> {log}
if [ "$1" = image ]; then
  [ -e {gate}.image ] && {{ echo sha256:abc; exit 0; }}; echo "Error: No such image" >&2; exit 1
fi
want=$(cat {gate}); prev=""
for arg in "$@"; do
  if [ "$prev" = --group-add ] && [ "$arg" = "$want" ]; then printf '%s' '{table}'; exit 0; fi
  prev=$arg
done
printf '%s' '{refusal}'; exit 1
"""


def run_probe(tmp_path: Path, group: str, gid_allowed: str, image: bool = True) -> tuple[subprocess.CompletedProcess,
                                                                                         Path]:
    fakes = tmp_path / "bin"
    fakes.mkdir(parents=True, exist_ok=True)
    log, gate = tmp_path / "docker.log", tmp_path / "gate"
    gate.write_text(gid_allowed)
    if image:
        Path(f"{gate}.image").touch()
    (fakes / "docker").write_text(FAKE_DOCKER.format(log=log, gate=gate, table=TABLE, refusal=REFUSAL))
    for name in ("docker", "npu-smi", "hccn_tool"):
        if name != "docker":
            (fakes / name).write_text("#!/bin/sh\nexit 0\n")
        (fakes / name).chmod(0o755)
    book = tmp_path / "probe.yml"
    book.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "environment": {"PATH": f"{fakes}:/usr/bin:/bin"},
        "vars": {"rollout8_plan": {"accelerator": "npu", "npus_per_node": 0, "image": "rollout8:probe-test"},
                 "rollout8_container_user": "1000:1000", "rollout8_container_npu_common_devices": [],
                 "rollout8_npu_group": group, "ansible_python_interpreter": sys.executable},
        "tasks": [
            {"name": "probe", "ansible.builtin.include_role": {"name": "runtime", "tasks_from": "npu_probe"}},
            {"name": "show", "ansible.builtin.copy": {"content": "{{ rollout8_npu_probe | default({}) | to_json }}",
                                                      "dest": str(tmp_path / "probe.json")}},
        ]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), ANSIBLE_LIBRARY=str(ANSIBLE / "library"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"), ANSIBLE_NOCOLOR="1",
               PATH=f"{BIN}:{os.environ['PATH']}")
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(book)], cwd=ANSIBLE, env=env,
                          capture_output=True, text=True, timeout=300)
    return proc, log


def one_line(text: str) -> str:
    """Ansible's output on one line, as written (its yaml callback folds long messages and doubles quotes)."""
    return " ".join(text.split()).replace("''", "'")


def test_the_task_file_refuses_without_the_group_and_passes_with_it_and_the_docker_run_is_the_containers(tmp_path):
    mine = grp.getgrgid(os.getgid())
    missing, _ = run_probe(tmp_path / "a", "rollout8-no-such-group", str(mine.gr_gid))
    out = one_line(missing.stdout)
    assert missing.returncode != 0, out[-3000:]
    assert ("localhost: npu-smi info fails in a probe container made as the training container is (user 1000:1000, "
            "groups none, its devices and driver mounts): DrvMngGetConsoleLogLevel failed") in out, out[-3000:]
    assert "The node has no rollout8-no-such-group group" in out, out[-3000:]

    given, log = run_probe(tmp_path / "b", mine.gr_name, str(mine.gr_gid))
    assert given.returncode == 0, one_line(given.stdout)[-3000:]
    probe = json.loads((tmp_path / "b" / "probe.json").read_text())
    assert probe["problem"] == "" and probe["driver"] == "24.1.rc3", probe
    run = log.read_text().splitlines()[-1]
    assert run.startswith(f"run --rm --network none --user 1000:1000 --group-add {mine.gr_gid} -v "), run
    assert f"{tmp_path / 'b' / 'bin' / 'npu-smi'}:/usr/local/bin/npu-smi:ro" in run, run
    assert run.endswith("rollout8:probe-test npu-smi info"), run

    refused, _ = run_probe(tmp_path / "c", mine.gr_name, "99999")  # the group given, the driver still refusing
    assert refused.returncode != 0
    assert f"{mine.gr_name}'s gid {mine.gr_gid} was added and npu-smi still refuses" in one_line(refused.stdout)


def test_without_the_image_the_probe_waits_for_the_image_play(tmp_path):
    proc, log = run_probe(tmp_path, "rollout8-no-such-group", "0", image=False)
    out = one_line(proc.stdout)
    assert proc.returncode == 0, out[-3000:]
    assert "the training image rollout8:probe-test is not on this node yet" in out, out[-3000:]
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["image"]
    assert json.loads((tmp_path / "probe.json").read_text()) == {}
