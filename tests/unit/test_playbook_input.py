"""Bad input to the playbooks is refused on the controller, naming it, before any node is touched.

Runs the real ansible-playbook (from .venv) on train.yml with an inventory of loopback hosts on a port nothing
listens on (127.0.0.10-12, port 9, discard): a run that got past the controller's checks would try them and be
refused at once, so "no node was touched" is visible in the output (no fact gathering, no preflight task), and
no test sends traffic off this machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

pytestmark = pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook is not in this venv (make venv)")

INVENTORY = """[head]
node-a ansible_host=127.0.0.10 ansible_port=9
[workers]
node-b ansible_host=127.0.0.11 ansible_port=9
node-c ansible_host=127.0.0.12 ansible_port=9
[cluster:children]
head
workers
"""


def play(tmp_path: Path, *args: str, inventory: str | None = INVENTORY, group_vars: str = "",
         host_vars: dict[str, str] | None = None, path: str | None = None,
         playbook: str = "train.yml") -> tuple[int, str]:
    """`playbook` against tmp_path/inventory/hosts.ini (written from `inventory` unless None), with group_vars/all.yml
    and host_vars/<host>.yml as given."""
    inv = tmp_path / "inventory" / "hosts.ini"
    if inventory is not None:
        inv.parent.mkdir(parents=True, exist_ok=True)
        inv.write_text(inventory)
        if group_vars:
            (inv.parent / "group_vars").mkdir(exist_ok=True)
            (inv.parent / "group_vars" / "all.yml").write_text(group_vars)
    for host, text in (host_vars or {}).items():
        (inv.parent / "host_vars").mkdir(exist_ok=True)
        (inv.parent / "host_vars" / f"{host}.yml").write_text(text)
    env = dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"), ANSIBLE_NOCOLOR="1")
    if path is not None:
        env["PATH"] = path
    proc = subprocess.run([str(PLAYBOOK), "-i", str(inv), playbook, "-e", f"rollout8_run_spec={tmp_path}/run.yaml",
                           "-e", f"rollout8_work_dir={tmp_path}/work", *args], cwd=ANSIBLE, env=env,
                          capture_output=True, text=True, timeout=300)
    out = " ".join((proc.stdout + proc.stderr).split())
    return proc.returncode, out


def assert_refused_before_any_node(rc: int, out: str, *expected: str) -> None:
    assert rc != 0, out[-3000:]
    for text in expected:
        assert text in out, out[-3000:]
    assert "Gathering Facts" not in out and "TASK [preflight" not in out, out[-3000:]


def test_missing_inventory_fails_the_run(tmp_path):
    rc, out = play(tmp_path, inventory=None)
    assert rc != 0, out[-2000:]
    assert str(tmp_path / "inventory" / "hosts.ini") in out


def test_inventory_that_does_not_parse_fails_the_run(tmp_path):
    rc, out = play(tmp_path, inventory="[head\nnode-a ansible_host=127.0.0.10 ansible_port=9\n[workers]\n")
    assert rc != 0, out[-2000:]
    assert "hosts.ini" in out
    assert "PLAY RECAP" not in out


FIX = "fix it where it is set (group_vars, host_vars or -e) and run again. Nothing was changed."


# The rules themselves are unit tests (test_validate_rules.py: every type, choice, range, name and host rule on
# dicts); these runs prove the wiring: each source of a value (-e, group_vars, host_vars) reaches them, and a
# refusal stops the run on the controller.
def test_knobs_of_the_wrong_type_or_value_from_every_source_are_refused_in_one_line(tmp_path):
    """-e (every host's: no host named), group_vars/all and one worker's host_vars, in one refusal."""
    rc, out = play(tmp_path, "-e", "rollout8_verify_quant=flase", "-e", "rollout8_ray_dashboard_port=70000",
                   group_vars="rollout8_ray_num_cpus: -2\n", host_vars={"node-b": "rollout8_ray_port: abc\n"})
    assert_refused_before_any_node(
        rc, out, 'rollout8_verify_quant="flase" is not true or false; rollout8_ray_dashboard_port=70000 is out of '
        'range (1-65535); rollout8_ray_num_cpus=-2 is out of range (0 or more); node-b: rollout8_ray_port="abc" is '
        "not an integer: " + FIX)
    assert "node-a:" not in out and "node-c:" not in out, out[-3000:]


def test_values_from_an_extra_vars_file_and_host_names_are_judged_before_any_node(tmp_path):
    """-e @vars.json gives infinity and integers past 64 bits as easily as a typo (JSON's 1e999); an inventory host
    name with shell metacharacters or '..' becomes a file name on the controller."""
    (tmp_path / "vars.json").write_text('{"rollout8_preflight_min_disk_gb": 1e999, '
                                        '"rollout8_ray_object_store_bytes": 100000000000000000000000}')
    rc, out = play(tmp_path, "-e", f"@{tmp_path}/vars.json")
    assert_refused_before_any_node(
        rc, out, "rollout8_preflight_min_disk_gb=inf is not a finite number",
        "rollout8_ray_object_store_bytes=100000000000000000000000 is out of range (more than 64 bits hold")
    rc, out = play(tmp_path, inventory=INVENTORY.replace("node-c ", "node-c;touch..x "))
    assert_refused_before_any_node(rc, out, 'inventory host name "node-c;touch..x" is not a host name')


def test_computed_value_or_a_name_like_no_knob_is_refused(tmp_path):
    rc, out = play(tmp_path, "-e", "rollout8_zzz=1", group_vars="rollout8_head_ip: 10.0.0.1\n",
                   host_vars={"node-a": "rollout8_node_ip: 10.0.0.1\n"})
    assert_refused_before_any_node(
        rc, out, "rollout8_head_ip is not a knob: the roles compute it (roles/rollout8_defaults/vars/main.yml)",
        "node-a: rollout8_node_ip is not a knob: the roles compute it (playbooks/boilerplate.yml",
        "rollout8_zzz is not a rollout8 knob (none is close; the knobs: roles/*/defaults/main.yml)")
    assert "node-b: rollout8_head_ip" not in out, "a group_vars/all value names every host"


@pytest.mark.parametrize("playbook", ["train.yml", "reset.yml"])
def test_inventory_without_the_cluster_group_is_refused_in_one_line(tmp_path, playbook):
    """Every play targets `cluster` (or its head): without the group they all matched no host and the run went on
    to fail on an undefined variable (train.yml) or ended ok having done nothing (reset.yml)."""
    rc, out = play(tmp_path, "-e", "rollout8_reset_confirmed=true", playbook=playbook,
                   inventory=INVENTORY.split("[cluster:children]")[0])
    assert_refused_before_any_node(
        rc, out, "The inventory has no [cluster] group: it must hold the head and the workers, no other host "
        "([cluster:children] head, workers; see inventory/sample/hosts.ini). Nothing was changed.")
    assert "undefined" not in out and "TASK [reset" not in out, out[-3000:]


CLUSTER_FIX = ": fix it where it is set (group_vars, host_vars or -e) and run again. Nothing was changed."


def test_hosts_that_collide_are_refused_naming_them(tmp_path):
    """One node listed twice (same ansible_host and port), one cluster address given to two nodes, the dashboard
    on the Ray port, two NICs in one: all in one line. Two nodes behind one address on different ssh ports are
    not one machine."""
    inventory = INVENTORY.replace("node-c ansible_host=127.0.0.12", "node-c ansible_host=127.0.0.11").replace(
        "[cluster:children]", "node-d ansible_host=127.0.0.11 ansible_port=10\n[cluster:children]")
    rc, out = play(tmp_path, inventory=inventory, group_vars="rollout8_ray_dashboard_port: 6379\n",
                   host_vars={"node-a": "rollout8_node_address: 10.9.9.9\n",
                              "node-d": "rollout8_node_address: 10.9.9.9\nrollout8_cluster_nic: eth0,eth1\n"})
    assert_refused_before_any_node(
        rc, out, "rollout8_ray_dashboard_port=6379 is rollout8_ray_port too (each Ray port needs its own number)",
        'node-d: rollout8_cluster_nic="eth0,eth1" is not one interface name',
        "node-a and node-d have the same rollout8_node_address 10.9.9.9 (each node needs its own)",
        "node-b and node-c are one machine (ansible_host 127.0.0.11 port 9; list each node once)" + CLUSTER_FIX)
    assert "node-d are one machine" not in out and "node-d: rollout8_ray_dashboard_port" not in out, out[-3000:]


def test_the_sample_inventory_passes_and_a_typo_on_one_of_its_workers_does_not(tmp_path):
    """inventory/sample copied as the README says (its addresses made loopback hosts nothing answers on): every
    host check passes (the run stops at the missing run spec); a typo'd knob in one worker's host_vars is refused."""
    import shutil

    shutil.copytree(ANSIBLE / "inventory" / "sample", tmp_path / "inventory")
    hosts = tmp_path / "inventory" / "hosts.ini"
    hosts.write_text(hosts.read_text().replace("ansible_host=10.0.0.1", "ansible_port=9 ansible_host=127.0.0.1"))
    missing_spec = f"rollout8_run_spec={tmp_path}/run.yaml does not exist on the controller"
    rc, out = play(tmp_path, inventory=None)
    assert_refused_before_any_node(rc, out, missing_spec)
    rc, out = play(tmp_path, inventory=None, host_vars={"node3": "rollout8_preflight_min_shm: 8\n"})
    assert_refused_before_any_node(rc, out, "node3: rollout8_preflight_min_shm is not a rollout8 knob "
                                   "(did you mean rollout8_preflight_min_shm_gb?)")
    assert missing_spec not in out


def test_the_simulated_cluster_inventory_passes_the_host_checks(tmp_path):
    """The simulated cluster's inventory as `make demo` writes it (virtual/sim_nodes.py, here with loopback
    addresses) and runs it (its -e values); a bad -e value names no host (it is every host's)."""
    import simcluster

    addresses = {name: f"127.0.0.{20 + i}" for i, name in enumerate(simcluster.NODES)}
    simcluster.write_inventory(tmp_path / "inventory", addresses, tmp_path / "id_ed25519")
    sim = ("-e", "rollout8_image=rollout8/sim-train:x", "-e", f"rollout8_image_tarball={tmp_path}/x.tar",
           "-e", "rollout8_image_load_throttle=2", "-e", "rollout8_job_kind=verl", "-e", "rollout8_verify_follow=true")
    rc, out = play(tmp_path, *sim, inventory=None)
    assert_refused_before_any_node(rc, out, f"rollout8_run_spec={tmp_path}/run.yaml does not exist on the controller")
    rc, out = play(tmp_path, *sim, "-e", "rollout8_cluster_nic=eth0,eth1", inventory=None)
    assert_refused_before_any_node(rc, out, 'rollout8_cluster_nic="eth0,eth1" is not one interface name')
    assert "rollout8-sim-w2: rollout8_cluster_nic" not in out, out[-3000:]


def test_controller_without_rsync_is_refused_before_any_node(tmp_path):
    """The artifacts and the image go to the nodes with rsync: a controller without it is told so up front."""
    (tmp_path / "run.yaml").write_text("name: x\n")
    rc, out = play(tmp_path, path=str(PLAYBOOK.parent))  # the venv's bin only: no rsync on PATH
    assert_refused_before_any_node(rc, out, "rsync is not installed on the controller")


def test_artifacts_that_fail_the_full_verify_quant_are_refused_before_any_node(model_pair, tmp_path):
    """A profile with one entry off (not among the layers `rollout8 check` samples): the plan's full verify-quant
    on the controller refuses it, naming the tensor, and nothing reaches a node; once fixed, the passing report is
    kept (keyed by the artifacts' checksums) and the next run does not verify again."""
    import shutil

    import torch
    import yaml

    from rollout8.quant.profile import write_profile

    shutil.copytree(model_pair.bf16, tmp_path / "bf16")
    shutil.copytree(model_pair.int8, tmp_path / "int8")
    write_profile(tmp_path / "bf16", tmp_path / "int8", tmp_path / "profile.pt")
    profile = torch.load(tmp_path / "profile.pt", weights_only=True)
    int8 = [n for n, e in profile.items() if e["type"] == torch.int8]
    victim = int8[1]  # the sample takes int8[0], then every len//4-th entry
    profile[victim]["input_scale"] = profile[victim]["input_scale"] * 3
    torch.save(profile, tmp_path / "profile.pt")
    (tmp_path / "data").mkdir()
    for name in ("train", "val"):
        (tmp_path / "data" / f"{name}.parquet").write_bytes(b"PAR1")
    spec = {"name": "t", "model": {"bf16": "bf16", "int8": "int8", "profile": "profile.pt"},
            "rollout": {"quantization": "int8"}, "cluster": {"nnodes": 2, "npus_per_node": 1, "accelerator": "cpu"},
            "data": {"train": "data/train.parquet", "val": "data/val.parquet"},
            "verl": {"data.train_batch_size": 2, "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1, "actor_rollout_ref.rollout.n": 2,
                     "actor_rollout_ref.rollout.tensor_model_parallel_size": 1}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    # the spec names no data NIC for its two nodes: refused unless the inventory names one for every node (the
    # plan role passes --nic-in-inventory then: the README's step 3)
    rc, out = play(tmp_path, "-e", "rollout8_job_kind=probe")
    assert_refused_before_any_node(rc, out, "cluster.network.nic: unset with cluster.nnodes 2",
                                   "rollout8_cluster_nic for every node in the inventory")
    rc, out = play(tmp_path, "-e", "rollout8_job_kind=probe", group_vars="rollout8_cluster_nic: eth0\n")
    assert "cluster.network.nic: unset" not in out
    assert_refused_before_any_node(rc, out, "verify-quant refuses the artifacts", victim,
                                   "nothing was copied to any node")
    assert not list((tmp_path / "work").rglob("verify-quant-*.json")), "a failed verification was cached"

    write_profile(tmp_path / "bf16", tmp_path / "int8", tmp_path / "profile.pt")  # fixed
    seen = []
    for _ in range(2):  # verified, then found kept (the report is not written again)
        # (the controller's plays pass; then the nodes, which nothing answers for, are unreachable)
        _, out = play(tmp_path, "-e", "rollout8_job_kind=probe", "--tags", "never",
                      group_vars="rollout8_cluster_nic: eth0\n")
        assert "verify-quant refuses" not in out and "TASK [plan : The plan fits the inventory" in out, out[-3000:]
        reports = list((tmp_path / "work").rglob("verify-quant-*.json"))
        assert len(reports) == 1, reports
        seen.append(reports[0].stat().st_mtime_ns)
    assert seen[0] == seen[1], "the kept report was verified and written again"
