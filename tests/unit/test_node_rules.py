"""The rules over every node's results (ansible/plugins/filter: rollout8_preflight, rollout8_reset, rollout8_runtime,
rollout8_verify) on plain dicts, shaped as the node modules and facts give them: the all-pairs reachability plan
and verdict, one MTU, the NPU versions, reset's account of the deploy root, the NPU tool mounts, verify's node
lists. The playbook runs that prove their wiring: test_npu_versions.py, test_reset_marker.py,
test_runtime_npu_mounts.py and the cluster tier."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rollout8_preflight import (
    rollout8_checkpoint_space,
    rollout8_clock_skew,
    rollout8_mtu_spread,
    rollout8_npu_version,
    rollout8_port_range_problem,
    rollout8_reach_peers,
    rollout8_reach_table,
    rollout8_runtime_problems,
    rollout8_unreachable,
    rollout8_version_spread,
)
from rollout8_reset import rollout8_reset_summary
from rollout8_runtime import rollout8_mount_label, rollout8_npu_mounts
from rollout8_verify import rollout8_dead_hosts, rollout8_node_addresses

HOSTS = ["a", "b", "c"]


# ------------------------------------------------------------------------------------------------ reachability
def listeners() -> dict[str, dict]:
    return {"a": {"rollout8_node_ip": "10.0.0.1",
                  "rollout8_reach_listener": {"bound": [6379, 8265], "held": [], "ephemeral": 41000}},
            "b": {"rollout8_node_ip": "10.0.0.2",
                  "rollout8_reach_listener": {"bound": [6379], "held": [8265], "ephemeral": None}},
            "c": {"rollout8_node_ip": "10.0.0.3",
                  "rollout8_reach_listener": {"bound": [], "held": [6379, 8265], "ephemeral": 42000}}}


def test_each_node_probes_every_other_on_the_ports_its_listener_took():
    table = rollout8_reach_table(listeners(), HOSTS)
    assert rollout8_reach_peers(table, "b") == {
        "a": {"address": "10.0.0.1", "ports": [6379, 8265, 41000]},
        "c": {"address": "10.0.0.3", "ports": [6379, 8265, 42000]}}
    assert set(rollout8_reach_peers(table, "a")) == {"b", "c"}
    assert rollout8_reach_peers(table, "a")["b"]["ports"] == [6379, 8265]  # no ephemeral port found


class CountingHostvars(dict):
    """hostvars that count their lookups (Ansible renders a host's variables at each one)."""

    lookups = 0

    def __getitem__(self, host):
        CountingHostvars.lookups += 1
        return super().__getitem__(host)


def test_the_reach_plan_reads_each_node_once_not_once_per_pair():
    hosts = [f"n{i}" for i in range(64)]
    hostvars = CountingHostvars({h: {"rollout8_node_ip": f"10.0.0.{i}", "rollout8_reach_listener": {
        "bound": [6379], "held": [], "ephemeral": None}} for i, h in enumerate(hosts)})
    CountingHostvars.lookups = 0
    table = rollout8_reach_table(hostvars, hosts)  # the play's one run_once task
    peers = {h: rollout8_reach_peers(table, h) for h in hosts}  # each node's connect task
    assert CountingHostvars.lookups == len(hosts)
    assert all(len(p) == 63 and h not in p for h, p in peers.items())


def test_clock_skew_is_the_distance_of_the_reading_from_the_controllers_interval():
    assert rollout8_clock_skew(1005, 1000.2, 1009.7) == 0  # read while the controller waited 9.5 s for the others
    assert rollout8_clock_skew(1015, 1000.2, 1009.7) == 5  # ahead of the controller's clock by more than the wait
    assert rollout8_clock_skew(990, 1000.2, 1009.7) == -10  # behind it
    assert rollout8_clock_skew(1000, 1000.2, 1000.4) == 0  # whole seconds: a reading truncated below `before`


def test_every_pair_and_port_that_did_not_connect_is_one_line_naming_both_nodes():
    hostvars = {"a": {"rollout8_reach": {"missing": [
                    {"peer": "c", "address": "10.0.0.3", "port": 6379, "reason": "timed out"},
                    {"peer": "b", "address": "10.0.0.2", "port": 41000, "reason": "connection refused"}]}},
                "b": {"rollout8_reach": {"missing": []}},
                "c": {}}  # the probe did not run there: nothing to say of it
    assert rollout8_unreachable(hostvars, HOSTS) == [
        "a cannot reach c at 10.0.0.3 on TCP 6379 (dropped: a firewall)",
        "a cannot reach b at 10.0.0.2 on TCP 41000 (connection refused)"]
    assert rollout8_unreachable({"a": {"rollout8_reach": {"missing": []}}}, ["a"]) == []


def test_the_cluster_interfaces_mtus_differ_names_each_or_nothing_when_one():
    def node(nic, mtu):
        return {"rollout8_node_nic": nic, f"ansible_{nic.replace('-', '_')}": {"mtu": mtu}}

    same = {"a": node("eth0", 1500), "b": node("ens-1", 1500), "c": {"rollout8_node_nic": ""}}
    assert rollout8_mtu_spread(same, HOSTS) == []
    jumbo = {**same, "c": node("eth0", 9000)}
    assert rollout8_mtu_spread(jumbo, HOSTS) == ["a: eth0 mtu 1500", "b: ens-1 mtu 1500", "c: eth0 mtu 9000"]
    assert rollout8_mtu_spread({**jumbo, "c": {"rollout8_node_nic": "eth0"}}, HOSTS) == []  # no facts for c's NIC


# ------------------------------------------------------------------------------------------------ NPU versions
def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("content,version", [
    (b64("Version=24.1.rc3\nascendhal_version=7.35.23\n"), "24.1.rc3"),
    (b64("firmware_version=1.0\nVersion=7.5.0.3.220\n"), "7.5.0.3.220"),
    (b64("Version=\n"), "unknown"),
    ("", "unknown"),  # the firmware file is missing: slurp failed, no content
])
def test_the_version_a_driver_file_names_or_unknown(content, version):
    assert rollout8_npu_version(content) == version


def test_drivers_and_firmwares_that_differ_name_each_version_and_its_nodes():
    hostvars = {"a": {"rollout8_npu_versions": {"driver": "24.1.rc3", "firmware": "7.5.0.3.220"}},
                "b": {"rollout8_npu_versions": {"driver": "24.1.rc3", "firmware": "unknown"}},
                "c": {"rollout8_npu_versions": {"driver": "24.1.rc2", "firmware": "7.5.0.3.220"}},
                "d": {}}  # its versions were not read: not counted
    assert rollout8_version_spread(hostvars, [*HOSTS, "d"]) == [
        "driver versions (24.1.rc3 on a, b; 24.1.rc2 on c)", "firmware versions (7.5.0.3.220 on a, c; unknown on b)"]
    one = {h: {"rollout8_npu_versions": {"driver": "24.1.rc3", "firmware": "7"}} for h in HOSTS}
    assert rollout8_version_spread(one, HOSTS) == []


# -------------------------------------------------------------------------------------- room for checkpoints
GIB = 1024**3
PLAN = {"checkpoint_dir": "/mnt/rollout8-shared/run/0123456789ab/checkpoints", "shared_dir": "/mnt/rollout8-shared",
        "model_parameters": 7_615_616_512, "max_actor_ckpt_to_keep": 2, "checkpoint_saves_kept": 2,
        "checkpoint_bytes_per_save": 7_615_616_512 * 14, "checkpoint_share": 1,
        "checkpoint_bytes_needed": 2 * 7_615_616_512 * 14}


def df(free_gib: float, existing: str = "/mnt/rollout8-shared") -> dict:
    return {"free_bytes": 500 * GIB, "checkpoint_path": PLAN["checkpoint_dir"], "checkpoint_existing": existing,
            "checkpoint_free_bytes": int(free_gib * GIB)}


def test_checkpoints_that_do_not_fit_where_they_land_are_refused_in_one_line():
    line = rollout8_checkpoint_space(df(150), PLAN, "node-a")
    assert line.startswith("node-a: only 150.0 GiB free on /mnt/rollout8-shared (holds "
                           "/mnt/rollout8-shared/run/0123456789ab/checkpoints, the checkpoint directory on "
                           "cluster.shared_dir), need 198.6 GiB for verl's checkpoints: "
                           "trainer.max_actor_ckpt_to_keep 2 x 99.3 GiB a save for the model's 7.62B parameters"), line
    assert "lower trainer.max_actor_ckpt_to_keep" in line and "rollout8_preflight_skip: [disk]" in line
    assert "\n" not in line
    assert rollout8_checkpoint_space(df(198.5), PLAN, "node-a")  # 0.09 GiB short is short
    assert rollout8_checkpoint_space(df(199), PLAN, "node-a") == ""


def test_checkpoint_space_says_when_the_shared_dir_is_not_mounted_and_when_every_save_is_kept():
    line = rollout8_checkpoint_space(df(10, existing="/mnt"), PLAN, "node-b")
    assert "/mnt/rollout8-shared itself is not there: is the shared filesystem mounted?" in line
    every = {**PLAN, "max_actor_ckpt_to_keep": None, "checkpoint_saves_kept": 5,
             "checkpoint_bytes_needed": 5 * PLAN["checkpoint_bytes_per_save"]}
    assert "5 save(s), every one kept (trainer.max_actor_ckpt_to_keep unset) x 99.3 GiB a save" in \
        rollout8_checkpoint_space(df(10), every, "node-b")
    short = {**PLAN, "max_actor_ckpt_to_keep": 5, "checkpoint_saves_kept": 2}  # a run of 2 saves keeps both
    assert "2 save(s) the run makes, trainer.max_actor_ckpt_to_keep 5 x" in \
        rollout8_checkpoint_space(df(10), short, "n")
    local = {**PLAN, "checkpoint_dir": None, "shared_dir": None, "checkpoint_share": 2,
             "checkpoint_bytes_needed": PLAN["checkpoint_bytes_per_save"]}
    line = rollout8_checkpoint_space(df(10, existing="/opt/rollout8"), local, "node-c")
    assert "/opt/rollout8 (no cluster.shared_dir: verl's relative checkpoint directory in the training container" \
        in line and "this node's share of 2 nodes" in line and "need 99.3 GiB" in line


@pytest.mark.parametrize("plan", [{**PLAN, "checkpoint_bytes_needed": 0},  # no saves, or the model's size unknown
                                  {"checkpoint_dir": None}])  # a plan without the sizing
def test_nothing_needed_or_nothing_measured_is_not_judged(plan):
    assert rollout8_checkpoint_space(df(0), plan, "a") == ""
    assert rollout8_checkpoint_space({"free_bytes": 0}, PLAN, "a") == ""  # the node was not asked


def test_the_node_module_measures_the_checkpoint_filesystem_in_the_same_call(tmp_path):
    module = Path(__file__).resolve().parents[2] / "ansible" / "library" / "rollout8_node_state.py"

    def run(**params) -> dict:
        args = tmp_path / "args.json"
        args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
        proc = subprocess.run([sys.executable, str(module), str(args)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout)

    (tmp_path / "shared").mkdir()
    out = run(path=str(tmp_path / "root" / "run"), checkpoint_path=str(tmp_path / "shared" / "run" / "k" / "ckpt"))
    assert out["existing"] == str(tmp_path) and out["checkpoint_existing"] == str(tmp_path / "shared")
    vfs = os.statvfs(tmp_path / "shared")  # (other writers on this disk move it a little meanwhile)
    assert abs(out["checkpoint_free_bytes"] - vfs.f_bavail * vfs.f_frsize) < GIB
    assert out["checkpoint_device"] == os.stat(tmp_path / "shared").st_dev and out["changed"] is False
    assert "checkpoint_free_bytes" not in run(path=str(tmp_path))  # not asked: not measured
    assert out["machine"] == os.uname().machine  # preflight's summary names it (aarch64 on a Kunpeng node)


# ---------------------------------------------------------------------------------------------------- reset
def test_reset_accounts_for_the_deploy_root_on_every_node():
    hostvars = {"a": {"rollout8_reset_root": {"removed": True}}, "b": {"rollout8_reset_root": {"removed": False}},
                "c": {"rollout8_reset_root": {"refused": "has no .rollout8-deploy-root"}}, "d": {}}
    assert rollout8_reset_summary(hostvars, [*HOSTS, "d"], "/opt/run") == (
        "deploy root /opt/run: removed on a; not there on b, d; LEFT IN PLACE on c (not made by rollout8, or a path "
        "reset never removes: the lines above say why)")
    assert rollout8_reset_summary({"a": {"rollout8_reset_root": {"removed": True}}}, ["a"], "/r") == \
        "deploy root /r: removed on a"


# ------------------------------------------------------------------------------------------- NPU tool mounts
def test_npu_tools_are_mounted_from_where_the_node_has_them_and_the_rest_as_configured():
    targets = {"/usr/local/bin/npu-smi": "npu_smi", "/usr/local/Ascend/driver/tools/hccn_tool": "hccn_tool"}
    mounts = ["/usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro",
              "/usr/local/Ascend/driver/tools/hccn_tool:/usr/local/Ascend/driver/tools/hccn_tool:ro",
              "/usr/local/Ascend/driver:/usr/local/Ascend/driver:ro", "/etc/ascend_install.info"]
    found = {"npu_smi": "/usr/bin/npu-smi", "hccn_tool": "", "changed": False}
    assert rollout8_npu_mounts(mounts, targets, found) == [
        "/usr/bin/npu-smi:/usr/local/bin/npu-smi:ro", *mounts[1:]]
    assert rollout8_npu_mounts(mounts, targets, None) == mounts  # the tools were not looked for


# ---------------------------------------------------------------------------------------------- verify's lists
def test_verify_names_each_node_with_its_address_and_the_nodes_whose_raylet_is_gone():
    hostvars = {"a": {"rollout8_node_ip": "10.0.0.1", "rollout8_raylet_now": {"rc": 0}},
                "b": {"rollout8_node_ip": "10.0.0.2", "rollout8_raylet_now": {"rc": 1}},
                "c": {}}  # unreachable: no address cached, no raylet check
    assert rollout8_node_addresses(hostvars, HOSTS) == ["a=10.0.0.1", "b=10.0.0.2", "c=c"]
    assert rollout8_dead_hosts(hostvars, HOSTS) == ["b (10.0.0.2)", "c"]


# ------------------------------------------------------------------------------------------------ HCCL host ports
EPHEMERAL = "32768\t60999"  # /proc/sys/net/ipv4/ip_local_port_range as the kernel prints it


def test_hccl_host_ports_inside_the_ephemeral_range_are_refused_naming_both_ranges_and_the_fixes():
    problem = rollout8_port_range_problem({"HCCL_HOST_SOCKET_PORT_RANGE": "60000-60050"}, EPHEMERAL, "", "node-a")
    assert problem == (
        "node-a: HCCL_HOST_SOCKET_PORT_RANGE 60000-60050 (cluster.network.hccl_host_socket_port_range) overlaps this "
        "node's ephemeral port range 32768-60999 (net.ipv4.ip_local_port_range), and 51 of its ports are not reserved "
        "(net.ipv4.ip_local_reserved_ports: none): any outgoing connection can take one and HCCL's bind then fails "
        "at random. Move the range outside 32768-60999 (e.g. 61000-61050), or reserve it on every node: sysctl -w "
        "net.ipv4.ip_local_reserved_ports=60000-60050 (and in /etc/sysctl.d/ to keep it after a reboot).")
    # a part reserved: the rest still counts; a partial overlap at the top of the range too
    partly = rollout8_port_range_problem({"HCCL_HOST_SOCKET_PORT_RANGE": "60000-60050"}, EPHEMERAL, "60000-60039",
                                         "node-a")
    assert "11 of its ports are not reserved (net.ipv4.ip_local_reserved_ports: 60000-60039)" in partly
    assert "1 of its ports" in rollout8_port_range_problem({"HCCL_HOST_SOCKET_PORT_RANGE": "60999-61050"},
                                                           EPHEMERAL, "", "node-a")


def test_hccl_host_ports_outside_reserved_or_unset_pass():
    for env, ephemeral, reserved in (({"HCCL_HOST_SOCKET_PORT_RANGE": "61000-61050"}, EPHEMERAL, ""),
                                     ({"HCCL_HOST_SOCKET_PORT_RANGE": "60000-60050"}, EPHEMERAL, "60000-60050"),
                                     ({"HCCL_HOST_SOCKET_PORT_RANGE": "60000-60050"}, EPHEMERAL,
                                      "50000,59000-60010,60011-60050"),
                                     ({"HCCL_HOST_SOCKET_PORT_RANGE": "60000-60050"}, "1024 20000", ""),
                                     ({}, EPHEMERAL, ""),
                                     ({"HCCL_HOST_SOCKET_PORT_RANGE": "60000-60050"}, "", "")):  # not read
        assert rollout8_port_range_problem(env, ephemeral, reserved, "node-a") == "", (env, ephemeral, reserved)
    # an ephemeral range that ends near the top: the suggestion is below it
    below = rollout8_port_range_problem({"HCCL_HOST_SOCKET_PORT_RANGE": "60000-60050"}, "40000 65500", "", "n")
    assert "(e.g. 39949-39999)" in below


PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
ANSIBLE = Path(__file__).resolve().parents[2] / "ansible"


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook is not in this venv (make venv)")
def test_preflight_reads_this_machines_ephemeral_range_and_refuses_a_range_inside_it(tmp_path):
    """preflight's hccl_ports.yml as ansible-playbook runs it, on this machine's own /proc/sys/net/ipv4 (the
    range inside is chosen from what the kernel says, so the test holds whatever this machine's range is)."""
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    reserved = Path("/proc/sys/net/ipv4/ip_local_reserved_ports").read_text().strip()
    if reserved:
        pytest.skip(f"this machine reserves ports ({reserved}): the refusal depends on which")
    outside = f"{high + 1}-{high + 51}" if high + 51 <= 65535 else f"{low - 51}-{low - 1}"
    results = {}
    for name, port_range in (("inside", f"{high - 50}-{high}"), ("outside", outside)):
        play = tmp_path / f"{name}.yml"
        play.write_text(
            "- hosts: localhost\n  gather_facts: false\n  vars:\n"
            f"    rollout8_plan: {{env: {{HCCL_HOST_SOCKET_PORT_RANGE: '{port_range}'}}}}\n  tasks:\n"
            "    - ansible.builtin.include_role: {name: preflight, tasks_from: hccl_ports}\n")
        env = dict(os.environ, ANSIBLE_NOCOLOR="1", PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin")
        proc = subprocess.run([str(PLAYBOOK), "-i", "localhost,", "-c", "local", "-e",
                               f"ansible_python_interpreter={sys.executable}", str(play)], cwd=ANSIBLE, env=env,
                              capture_output=True, text=True, timeout=300)
        out = " ".join((proc.stdout + proc.stderr).split())
        results[name] = (proc.returncode, out.replace("''", "'"))  # the YAML callback doubles a quote
    rc, out = results["inside"]
    said = (f"localhost: HCCL_HOST_SOCKET_PORT_RANGE {high - 50}-{high} (cluster.network.hccl_host_socket_port_range)"
            f" overlaps this node's ephemeral port range {low}-{high}")
    assert rc != 0 and said in out, out[-3000:]
    rc, out = results["outside"]
    assert rc == 0, out[-3000:]


# ------------------------------------------------------------------------------------------------ container runtime
RUNTIME_OK = {"docker_init_name": "docker-init", "docker_init": "/usr/bin/docker-init", "docker_selinux": False,
              "selinux": "Disabled"}


def test_a_docker_without_its_init_binary_is_refused_naming_the_node_and_the_fix():
    said = rollout8_runtime_problems({**RUNTIME_OK, "docker_init": ""}, "", "node-a")
    assert said.startswith("node-a: Docker's init binary docker-init is not installed (not on PATH nor in Docker's "
                           "libexec directories): the training container runs with --init"), said
    assert "set the daemon's init-path in /etc/docker/daemon.json." in said


def test_selinux_enforcing_is_refused_until_the_mount_label_is_chosen():
    enforcing = {**RUNTIME_OK, "selinux": "Enforcing", "docker_selinux": True}
    said = rollout8_runtime_problems(enforcing, "", "node-b")
    assert said.startswith("node-b: SELinux is enforcing and Docker labels containers (selinux-enabled): the "
                           "training container's bind mounts (deploy root, logs, its home, Ray's directory) are denied "
                           "without a label. Set rollout8_container_mount_label: z"), said
    assert "Docker does not label containers now" in rollout8_runtime_problems({**enforcing, "docker_selinux": False},
                                                                                 "", "node-b")
    for label in ("z", "none"):
        assert rollout8_runtime_problems(enforcing, label, "node-b") == ""
    both = rollout8_runtime_problems({**enforcing, "docker_init": ""}, "", "node-c")
    assert both.count("node-c: ") == 1 and "docker-init is not installed" in both and "SELinux is enforcing" in both


def test_a_permissive_or_disabled_selinux_and_an_unasked_node_pass():
    for df in (RUNTIME_OK, {**RUNTIME_OK, "selinux": "Permissive"}, {"free_bytes": 1}):
        assert rollout8_runtime_problems(df, "", "node-a") == "", df


def test_the_z_label_goes_on_the_node_directories_mode_kept():
    mounts = ["/var/lib/run:/var/lib/run", "/opt/rollout8/logs:/opt/rollout8/logs:ro"]
    assert rollout8_mount_label(mounts, "z") == ["/var/lib/run:/var/lib/run:z",
                                                 "/opt/rollout8/logs:/opt/rollout8/logs:ro,z"]
    assert rollout8_mount_label(mounts, "") == mounts == rollout8_mount_label(mounts, "none")


def test_the_node_module_reads_docker_init_docker_selinux_and_getenforce(tmp_path):
    """rollout8_node_state with docker: true against a fake docker (its `info` answer) and a fake getenforce."""
    module = Path(__file__).resolve().parents[2] / "ansible" / "library" / "rollout8_node_state.py"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def tool(name: str, text: str) -> None:
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)

    def run() -> dict:
        args = tmp_path / "args.json"
        args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"path": str(tmp_path), "docker": True}}))
        env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin")
        proc = subprocess.run([sys.executable, str(module), str(args)], capture_output=True, text=True, timeout=60,
                              env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout)

    tool("docker", '#!/bin/sh\necho \'"rollout8-test-init" ["name=seccomp,profile=default","name=selinux"]\'\n')
    tool("getenforce", "#!/bin/sh\necho Enforcing\n")
    out = run()
    assert out["docker_init_name"] == "rollout8-test-init" and out["docker_init"] == ""  # nowhere
    assert out["docker_selinux"] is True and out["selinux"] == "Enforcing"
    tool("rollout8-test-init", "#!/bin/sh\n")
    tool("getenforce", "#!/bin/sh\necho Permissive\n")
    out = run()
    assert out["docker_init"] == str(bin_dir / "rollout8-test-init") and out["selinux"] == "Permissive"
    tool("docker", "#!/bin/sh\nexit 1\n")  # no engine: nothing read, nothing refused for it
    assert run()["docker_init_name"] == ""
