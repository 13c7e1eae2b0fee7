"""ansible/library/rollout8_hccn.py: the NPU network judged on what hccn_tool prints, and npu-smi/hccn_tool found
when no path is configured.

The samples below are written by hand in the form Huawei's hccn_tool documentation shows for each query (this
machine cannot reach the documentation nor an Atlas node): `hccn_tool -i 0 -link -g` prints `link status: UP`,
`-net_health -g` prints `net health status: Success`, `-ip -g` prints `ipaddr:...` and `netmask:...`, and
`-ping -g address X` prints `device 0 PING X`, one `recv seq=N,time=...ms` line per answer and a summary
`3 packets transmitted, 3 received, 0.00% packet loss`. The parsers are tested on them and on the variants a node
gives when something is wrong (a link DOWN, a health other than Success, no address, a partial or total loss, no
summary at all); the whole module then runs as Ansible runs it (a subprocess given ANSIBLE_MODULE_ARGS) against a
fake hccn_tool that prints those samples, exit code 0 included where the answer is bad.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

MODULE_PATH = Path(__file__).resolve().parents[2] / "ansible" / "library" / "rollout8_hccn.py"
_spec = importlib.util.spec_from_file_location("rollout8_hccn_under_test", MODULE_PATH)
hccn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hccn)

LINK_UP = "link status: UP\n"
LINK_DOWN = "link status: DOWN\n"
HEALTH_OK = "net health status: Success\n"
HEALTH_INIT = "net health status: Init\n"
IP_OK = "ipaddr:192.168.100.{n}\nnetmask:255.255.255.0\n"
PING_OK = ("device {d} PING {a}\n"
           "recv seq=0,time=0.123000ms\n"
           "recv seq=1,time=0.098000ms\n"
           "recv seq=2,time=0.101000ms\n"
           "3 packets transmitted, 3 received, 0.00% packet loss\n")
PING_PARTIAL = ("device {d} PING {a}\n"
                "recv seq=0,time=0.123000ms\n"
                "recv time out seq=1\n"
                "recv time out seq=2\n"
                "3 packets transmitted, 1 received, 66.67% packet loss\n")
PING_NONE = ("device {d} PING {a}\n"
             "recv time out seq=0\n"
             "recv time out seq=1\n"
             "recv time out seq=2\n"
             "3 packets transmitted, 0 received, 100.00% packet loss\n")
PING_NO_SUMMARY = "device {d} PING {a}\nrecv seq=0,time=0.123000ms\n"
# `hccn_tool -i N -tls -g`, as Huawei's HCCL troubleshooting page shows it (the switch: 0 disabled, 1 enabled)
TLS = "dev_id:{d}, tls switch[{on}](0:disable, 1:enable), tls alarm time threshold[60]days\n"


def test_link_health_and_address_are_read_from_the_documented_lines():
    assert hccn.parse_link(LINK_UP) == "UP"
    assert hccn.parse_link(LINK_DOWN) == "DOWN"
    assert hccn.parse_link("") == "" and hccn.parse_link("command not support\n") == ""
    assert hccn.parse_health(HEALTH_OK) == "Success"
    assert hccn.parse_health(HEALTH_INIT) == "Init"
    assert hccn.parse_health("net health status: Detect ip set\n") == "Detect ip set"
    assert hccn.parse_ip(IP_OK.format(n=101)) == ("192.168.100.101", "255.255.255.0")
    assert hccn.parse_ip("ipaddr:\nnetmask:\n") == ("", "")


def test_a_substring_is_not_a_verdict():
    """The old check passed a link when 'UP' was anywhere in the output and a health when 'Success' was."""
    assert hccn.device_problems({"link": "UPDATING", "health": "Success", "ip": "192.168.100.101"}) == [
        "link status UPDATING, want UP"]
    assert hccn.device_problems({"link": hccn.parse_link("link status: DOWN (UP 3 s ago)\n"),
                                 "health": hccn.parse_health("net health status: Not Success\n"), "ip": ""}) == [
        "link status DOWN, want UP", "net health status Not Success, want Success",
        "no IP address (hccn_tool -ip -g gave no ipaddr)"]
    assert hccn.device_problems({"link": "UP", "health": "Success", "ip": "192.168.100.101"}) == []


@pytest.mark.parametrize("text, summary, problem", [
    (PING_OK, {"sent": 3, "received": 3, "loss_percent": 0.0}, ""),
    (PING_PARTIAL, {"sent": 3, "received": 1, "loss_percent": 66.67}, "1 of 3 packets received, 66.67% packet loss"),
    (PING_NONE, {"sent": 3, "received": 0, "loss_percent": 100.0}, "0 of 3 packets received, 100.00% packet loss"),
    (PING_NO_SUMMARY, None, "no ping summary (packets transmitted/received) (exit 0: device 0 PING 192.168.100.201)"),
    ("3 packets transmitted, 2 received, 0.00% packet loss\n", {"sent": 3, "received": 2, "loss_percent": 0.0},
     "2 of 3 packets received, 0.00% packet loss"),
    ("0 packets transmitted, 0 received, 0.00% packet loss\n", {"sent": 0, "received": 0, "loss_percent": 0.0},
     "no packet sent"),
])
def test_a_ping_is_judged_on_its_summary_even_when_the_tool_exits_0(text, summary, problem):
    text = text.format(d=0, a="192.168.100.201")
    assert hccn.parse_ping(text) == summary
    ping = {"rc": 0, "summary": hccn.parse_ping(text), "first_line": hccn.first_line(text)}
    assert hccn.ping_problem(ping) == problem


def test_a_ping_that_exits_non_zero_fails_even_with_every_packet_back():
    ping = {"rc": 1, "summary": hccn.parse_ping(PING_OK.format(d=0, a="x")), "first_line": ""}
    assert hccn.ping_problem(ping) == "hccn_tool exited 1 although every packet came back"


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_a_tool_is_found_on_path_first_then_in_the_drivers_directories(tmp_path):
    on_path, driver, other = tmp_path / "path", tmp_path / "driver", tmp_path / "other"
    executable(driver / "hccn_tool")
    dirs = (str(other), str(driver))
    assert hccn.find_tool("hccn_tool", "", str(on_path), dirs) == (str(driver / "hccn_tool"), "")
    executable(on_path / "hccn_tool")
    assert hccn.find_tool("hccn_tool", "", str(on_path), dirs) == (str(on_path / "hccn_tool"), "")
    assert hccn.find_tool("hccn_tool", "", "", dirs) == (str(driver / "hccn_tool"), "")


def test_a_tool_not_executable_or_nowhere_is_not_found_and_the_failure_says_where_it_looked(tmp_path):
    on_path, driver = tmp_path / "path", tmp_path / "driver"
    driver.mkdir()
    (driver / "npu-smi").write_text("#!/bin/sh\n")  # there, but not executable
    (on_path / "npu-smi").mkdir(parents=True)  # a directory of that name
    path, problem = hccn.find_tool("npu-smi", "", str(on_path), (str(driver), "/nonexistent"))
    assert path == ""
    assert problem == (f"npu-smi not found on PATH ({on_path}) nor in {driver}, /nonexistent; install the Ascend NPU "
                       "driver, or set rollout8_npu_smi to its path")


def test_a_configured_path_is_taken_as_it_is(tmp_path):
    tool = executable(tmp_path / "opt" / "hccn_tool")
    executable(tmp_path / "path" / "hccn_tool")
    assert hccn.find_tool("hccn_tool", str(tool), str(tmp_path / "path")) == (str(tool), "")
    path, problem = hccn.find_tool("hccn_tool", str(tmp_path / "missing"), str(tmp_path / "path"))
    assert path == "" and problem.startswith(f"rollout8_hccn_tool={tmp_path / 'missing'} is not an executable file")


def test_the_known_directories_are_the_drivers():
    assert hccn.KNOWN_DIRS == ("/usr/local/bin", "/usr/local/sbin", "/usr/local/Ascend/driver/tools", "/usr/bin",
                               "/usr/sbin")


# The module as Ansible runs it, against a fake hccn_tool printing the canned answers of `answers/<device>/<query>`
# (`link`, `net_health`, `ip`, `ping-<address>`) and exiting with `<file>.rc` when there is one (0 otherwise).
FAKE_HCCN_TOOL = """#!/bin/sh
if [ "$3" = "-ping" ]; then f="{answers}/$2/ping-$6"; else f="{answers}/$2/${{3#-}}"; fi
[ -f "$f" ] || {{ echo "no answer for $*" >&2; exit 2; }}
cat "$f"
if [ -f "$f.rc" ]; then exit "$(cat "$f.rc")"; fi
exit 0
"""


def node(tmp_path: Path, devices: int = 2, last: int = 101) -> Path:
    """A node whose devices all answer well: link UP, Success, 192.168.100.<last+i>, and every ping of the peer's
    192.168.100.(201+i) comes back."""
    answers = tmp_path / "answers"
    for device in range(devices):
        d = answers / str(device)
        d.mkdir(parents=True)
        (d / "link").write_text(LINK_UP)
        (d / "net_health").write_text(HEALTH_OK)
        (d / "ip").write_text(IP_OK.format(n=last + device))
        (d / "tls").write_text(TLS.format(d=device, on=0))
        (d / f"ping-192.168.100.{201 + device}").write_text(PING_OK.format(d=device, a=f"192.168.100.{201 + device}"))
    executable(tmp_path / "bin" / "hccn_tool", FAKE_HCCN_TOOL.format(answers=answers))
    executable(tmp_path / "bin" / "npu-smi")
    return answers


def run(tmp_path: Path, path: str | None = None, **params) -> tuple[int, dict]:
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
    env = dict(os.environ, PATH=path if path is not None else f"{tmp_path / 'bin'}:/usr/bin:/bin")
    proc = subprocess.run([sys.executable, str(MODULE_PATH), str(args)], capture_output=True, text=True, timeout=120,
                          env=env)
    return proc.returncode, json.loads(proc.stdout)


def test_a_healthy_node_gives_its_devices_addresses_and_every_rails_ping(tmp_path):
    node(tmp_path)
    rc, out = run(tmp_path, npu_smi="", devices=2, checks=["local"], node="node-a")
    assert rc == 0 and out["changed"] is False, out
    assert out["npu_smi"] == str(tmp_path / "bin" / "npu-smi") and out["hccn_tool"] == str(tmp_path / "bin/hccn_tool")
    assert out["ips"] == ["192.168.100.101", "192.168.100.102"]
    assert out["devices"][1] == {"device": 1, "link": "UP", "health": "Success", "ip": "192.168.100.102",
                                 "netmask": "255.255.255.0", "tls": "disabled"}
    assert out["tls"] == ["disabled", "disabled"]
    rc, out = run(tmp_path, devices=2, checks=["ping"], node="node-a",
                  peers={"node-b": ["192.168.100.201", "192.168.100.202"]}, _ansible_check_mode=True)
    assert rc == 0 and out["changed"] is False, out
    assert out["pings"][1] == {"device": 1, "pings": [{"peer": "node-b", "address": "192.168.100.202", "rc": 0,
                                                       "sent": 3, "received": 3, "loss_percent": 0.0}]}


def test_the_tls_switch_is_read_and_a_driver_without_the_query_leaves_it_unknown(tmp_path):
    assert hccn.parse_tls(TLS.format(d=3, on=1)) == "enabled" and hccn.parse_tls(TLS.format(d=3, on=0)) == "disabled"
    assert hccn.parse_tls("") == "" and hccn.parse_tls("tls alarm time threshold[60]days\n") == ""
    answers = node(tmp_path)
    (answers / "1" / "tls").unlink()  # the fake exits 2 for a query it has no answer for, as an old driver would
    rc, out = run(tmp_path, devices=2, checks=["local"], node="node-a")
    assert rc == 0 and out["tls"] == ["disabled", ""], out


def test_mixed_tls_states_are_refused_naming_every_node_and_device_in_each_state():
    assert hccn.tls_mixed({"a": ["disabled"] * 8, "b": ["disabled"] * 8}) == ""
    assert hccn.tls_mixed({"a": ["enabled", "", "enabled"], "b": ["", "enabled"]}) == ""  # unknowns left out
    said = hccn.tls_mixed({"node-b": ["disabled", "disabled", "disabled", "enabled", "disabled"],
                           "node-a": ["disabled"] * 5})
    assert said == ("NPU TLS switch (hccn_tool -i N -tls -g) differs between devices: enabled on node-b device 3; "
                    "disabled on node-a devices 0-4, node-b devices 0-2, 4. HCCL cannot link a TLS-enabled device "
                    "with a disabled one: every ping passes and the link setup hangs. Set one state on every device "
                    "of every node, e.g. on each node: for i in $(seq 0 7); do hccn_tool -i $i -tls -s enable 0; "
                    "done")


def test_a_link_down_with_exit_0_fails_naming_the_node_and_the_rail(tmp_path):
    answers = node(tmp_path)
    (answers / "1" / "link").write_text(LINK_DOWN)
    (answers / "1" / "ip").write_text("ipaddr:\nnetmask:\n")
    rc, out = run(tmp_path, devices=2, checks=["local"], node="node-a")
    assert rc != 0 and out["failed"]
    assert out["msg"] == ("node-a: NPU network (hccn_tool): device 1 (rail 1): link status DOWN, want UP, no IP "
                          "address (hccn_tool -ip -g gave no ipaddr)")
    assert out["devices"][0]["link"] == "UP" and out["devices"][1]["link"] == "DOWN"


def test_a_device_the_tool_cannot_answer_for_fails_with_the_tools_words(tmp_path):
    answers = node(tmp_path)
    (answers / "0" / "net_health").write_text("Command execute failed\n")
    (answers / "0" / "net_health.rc").write_text("255")
    rc, out = run(tmp_path, devices=2, checks=["local"], node="node-a")
    assert rc != 0 and out["msg"] == ("node-a: NPU network (hccn_tool): device 0 (rail 0): hccn_tool -i 0 "
                                      "-net_health -g exited 255: Command execute failed")


def test_a_partial_loss_on_one_rail_fails_naming_the_rail_the_peer_and_the_loss_even_with_exit_0(tmp_path):
    answers = node(tmp_path)
    (answers / "1" / "ping-192.168.100.202").write_text(PING_PARTIAL.format(d=1, a="192.168.100.202"))
    rc, out = run(tmp_path, devices=2, checks=["ping"], node="node-a",
                  peers={"node-b": ["192.168.100.201", "192.168.100.202"]})
    assert rc != 0
    assert out["msg"] == ("node-a: NPU cross-node ping (hccn_tool): device 1 (rail 1): ping of 192.168.100.202 "
                          "(device 1 of node-b): 1 of 3 packets received, 66.67% packet loss")
    assert "\n" not in out["msg"]
    assert out["pings"][0]["pings"][0]["received"] == 3 and out["pings"][1]["pings"][0]["loss_percent"] == 66.67


def test_a_ping_without_summary_or_a_peer_without_an_address_fails(tmp_path):
    answers = node(tmp_path)
    (answers / "0" / "ping-192.168.100.201").write_text(PING_NO_SUMMARY.format(d=0, a="192.168.100.201"))
    rc, out = run(tmp_path, devices=2, checks=["ping"], node="node-a", peers={"node-b": ["192.168.100.201"]})
    assert rc != 0
    assert out["msg"] == ("node-a: NPU cross-node ping (hccn_tool): device 0 (rail 0): ping of 192.168.100.201 "
                          "(device 0 of node-b): no ping summary (packets transmitted/received) (exit 0: device 0 PING "
                          "192.168.100.201); device 1 (rail 1): peer node-b reported no address for device 1")


def test_npu_smi_nowhere_fails_naming_the_node_the_directories_and_the_knob(tmp_path):
    node(tmp_path)
    (tmp_path / "bin" / "npu-smi").unlink()
    if any(Path(d, "npu-smi").exists() for d in hccn.KNOWN_DIRS):
        pytest.skip("this machine has an npu-smi in the driver's directories")
    rc, out = run(tmp_path, npu_smi="", hccn_tool=str(tmp_path / "bin" / "hccn_tool"), node="node-a")
    assert rc != 0
    assert out["msg"] == (f"node-a: npu-smi not found on PATH ({tmp_path / 'bin'}:/usr/bin:/bin) nor in "
                          "/usr/local/bin, /usr/local/sbin, /usr/local/Ascend/driver/tools, /usr/bin, /usr/sbin; "
                          "install the Ascend NPU driver, or set rollout8_npu_smi to its path")


# The preflight role's npu.yml as ansible-playbook runs it: two nodes on this machine (connection local), each with
# its own fake hccn_tool; node-a names its tools, node-b has them found on PATH.
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
ANSIBLE = MODULE_PATH.parents[1]


def two_nodes(tmp_path: Path) -> dict[str, Path]:
    answers = {}
    for name, mine, theirs in (("node-a", 101, 201), ("node-b", 201, 101)):
        root = tmp_path / name
        answers[name] = node(root, last=mine)
        for device in range(2):  # node() answers pings of .201+i: this node pings the other one's addresses
            for ping in (answers[name] / str(device)).glob("ping-*"):
                ping.unlink()
            address = f"192.168.100.{theirs + device}"
            (answers[name] / str(device) / f"ping-{address}").write_text(PING_OK.format(d=device, a=address))
    (tmp_path / "version.info").write_text("Version=24.1.rc3\n")
    # no training image on these nodes yet: npu.yml's probe of npu-smi as the container's user waits for the image play
    docker = tmp_path / "node-b" / "bin" / "docker"
    docker.write_text("#!/bin/sh\necho 'Error: No such image' >&2\nexit 1\n")
    docker.chmod(0o755)
    a = tmp_path / "node-a" / "bin"
    (tmp_path / "hosts.ini").write_text(
        f"[head]\nnode-a rollout8_hccn_tool={a}/hccn_tool rollout8_npu_smi={a}/npu-smi\n[workers]\nnode-b\n"
        f"[cluster:children]\nhead\nworkers\n[cluster:vars]\nansible_connection=local\n"
        f"ansible_python_interpreter={sys.executable}\n")
    (tmp_path / "play.yml").write_text(
        "- hosts: cluster\n  gather_facts: false\n  vars:\n"
        "    rollout8_plan: {accelerator: npu, npus_per_node: 2, image: 'rollout8:not-here'}\n"
        f"    rollout8_npu_driver_version_file: {tmp_path}/version.info\n  tasks:\n"
        "    - ansible.builtin.include_role: {name: preflight, tasks_from: npu}\n"
        "    - ansible.builtin.debug: {msg: \"ips {{ rollout8_npu_ips | join(',') }}\"}\n")
    return answers


def play(tmp_path: Path) -> tuple[int, str]:
    env = dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"), ANSIBLE_NOCOLOR="1",
               PATH=f"{tmp_path / 'node-b' / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin")
    proc = subprocess.run([str(PLAYBOOK), "-i", str(tmp_path / "hosts.ini"), str(tmp_path / "play.yml")], cwd=ANSIBLE,
                          env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook is not in this venv (make venv)")
def test_npu_yml_checks_every_device_and_pings_every_rail_of_the_other_node(tmp_path):
    answers = two_nodes(tmp_path)
    rc, out = play(tmp_path)
    assert rc == 0, out[-3000:]
    assert "ips 192.168.100.101,192.168.100.102" in out and "ips 192.168.100.201,192.168.100.202" in out
    (answers["node-b"] / "1" / "tls").write_text(TLS.format(d=1, on=1))
    rc, out = play(tmp_path)
    assert rc != 0 and ("differs between devices: enabled on node-b device 1; disabled on node-a devices 0-1, "
                        "node-b device 0.") in out, out[-3000:]
    assert "TASK [preflight : Cross-node ping" not in out  # refused before the pings
    (answers["node-b"] / "1" / "tls").write_text(TLS.format(d=1, on=0))
    (answers["node-b"] / "1" / "ping-192.168.100.102").write_text(PING_NONE.format(d=1, a="192.168.100.102"))
    rc, out = play(tmp_path)
    assert rc != 0
    assert ("node-b: NPU cross-node ping (hccn_tool): device 1 (rail 1): ping of 192.168.100.102 (device 1 of node-a): "
            "0 of 3 packets received, 100.00% packet loss") in out, out[-3000:]
