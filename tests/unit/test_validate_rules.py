"""The validate role's rules (ansible/plugins/filter/rollout8_validate.py) on plain dicts: every refusal of a
host's variables that once needed an ansible-playbook run, called as the role calls it (hostvars, the hosts, the
contract read from the roles). tests/unit/test_playbook_input.py keeps a few playbook runs that prove the wiring."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from rollout8_validate import (
    knob_errors,
    rollout8_closest,
    rollout8_cluster_errors,
    rollout8_container_ids_spread,
    rollout8_contract,
    rollout8_host_name_errors,
    rollout8_knob_errors,
    rollout8_name_errors,
    rollout8_nic_conflicts,
    rollout8_nic_unnamed,
    rollout8_per_host,
)

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "ansible" / "roles"
VALIDATE = yaml.safe_load((ROLES / "validate" / "vars" / "main.yml").read_text())
PORTS, POSITIVE = VALIDATE["rollout8_variable_ports"], VALIDATE["rollout8_variable_positive"]
HOSTS = ["node-a", "node-b", "node-c"]


@pytest.fixture(scope="module")
def contract() -> dict:
    return rollout8_contract(str(ROLES), VALIDATE["rollout8_contract_roles"], VALIDATE["rollout8_computed_facts"])


def inventory(**per_host: dict) -> dict[str, dict]:
    """hostvars of node-a..c, each at its own ansible_host (as the inventory gives it), plus what is given."""
    return {host: {"ansible_host": f"127.0.0.{10 + i}", "ansible_port": 9, **per_host.get(host.replace("-", "_"), {})}
            for i, host in enumerate(HOSTS)}


# ------------------------------------------------------------------------------------------------- the contract
def test_the_contract_holds_every_roles_knobs_and_where_each_computed_name_comes_from(contract):
    assert {"rollout8_ray_port", "rollout8_verify_quant", "rollout8_reset_remove_artifacts"} <= set(contract["options"])
    assert contract["computed"]["rollout8_head_ip"] == "roles/rollout8_defaults/vars/main.yml"
    assert contract["computed"]["rollout8_node_ip"].startswith("playbooks/boilerplate.yml")
    assert not set(contract["options"]) & set(contract["computed"])


def test_every_default_of_every_role_passes_the_knob_rules(contract):
    """A role default is a value too: typed and in range (the rule applies to what a host sets; this proves the
    defaults would pass it)."""
    defaults = {}
    for role in ROLES.iterdir():
        path = role / "defaults" / "main.yml"
        if path.is_file():
            defaults.update(yaml.safe_load(path.read_text()) or {})
    assert knob_errors(defaults, contract["options"], PORTS, POSITIVE) == []


# ---------------------------------------------------------------------------------------- names that are no knob
def test_a_typo_on_one_worker_is_refused_naming_that_worker_and_the_closest_knob(contract):
    errors = rollout8_name_errors(inventory(node_c={"rollout8_ray_prot": 6380}), HOSTS, contract)
    assert errors == ["node-c: rollout8_ray_prot is not a rollout8 knob (did you mean rollout8_ray_port?)"]


def test_a_computed_name_or_a_name_like_no_knob_is_refused_naming_its_hosts(contract):
    everywhere = {"rollout8_head_ip": "10.0.0.1", "rollout8_zzz": 1}  # group_vars/all, -e: every host
    hostvars = inventory(node_a={**everywhere, "rollout8_node_ip": "10.0.0.1"}, node_b=everywhere, node_c=everywhere)
    assert rollout8_name_errors(hostvars, HOSTS, contract) == [
        "rollout8_head_ip is not a knob: the roles compute it (roles/rollout8_defaults/vars/main.yml)",
        "rollout8_zzz is not a rollout8 knob (none is close; the knobs: roles/*/defaults/main.yml)",
        "node-a: rollout8_node_ip is not a knob: the roles compute it (playbooks/boilerplate.yml, from "
        "rollout8_node_address or the NIC)"]


def test_cached_facts_knobs_and_the_contract_fact_are_no_refusal(contract):
    """rollout8_node_ip cached by an earlier run (a fact), the contract the role set, a knob, an Ansible variable."""
    cached = {"rollout8_node_ip": "10.0.0.1", "ansible_facts": {"rollout8_node_ip": "10.0.0.1"},
              "rollout8_contract": contract, "rollout8_ray_port": 6379, "ansible_user": "ops"}
    assert rollout8_name_errors(inventory(node_a=cached, node_b=cached, node_c=cached), HOSTS, contract) == []


def test_closest_compares_names_without_the_shared_prefix():
    assert rollout8_closest("rollout8_ray_prot", ["rollout8_ray_port", "rollout8_ray_wait_delay"]) == \
        "rollout8_ray_port"
    assert rollout8_closest("rollout8_zzz", ["rollout8_ray_port"]) == ""


def test_per_host_names_the_hosts_unless_every_host_has_it():
    assert rollout8_per_host({"a": ["x"], "b": ["x", "y", "y"]}, ["a", "b"]) == ["x", "b: y"]
    assert rollout8_per_host({"a": ["x"], "b": []}, ["a", "b", "c"]) == ["a: x"]


# ------------------------------------------------------------------------------------ types, choices and ranges
# Values as `-e k=v` gives them (strings), or as -e JSON / YAML gives them.
@pytest.mark.parametrize("values,expected", [
    # the two: a misspelled bool silently skipped the int8 verification, a misspelled choice went on
    ({"rollout8_verify_quant": "flase"}, 'rollout8_verify_quant="flase" is not true or false'),
    ({"rollout8_job_wait_until": "frist_step"},
     "value of rollout8_job_wait_until must be one of: auto, first_step, end, got: frist_step"),
    ({"rollout8_job_kind": "smoke"}, "value of rollout8_job_kind must be one of: verl, probe, got: smoke"),
    ({"rollout8_runtime": "host"}, "value of rollout8_runtime must be one of: docker, got: host"),
    ({"rollout8_ray_port": "abc"}, 'rollout8_ray_port="abc" is not an integer'),
    ({"rollout8_ray_dashboard_port": "70000"}, "rollout8_ray_dashboard_port=70000 is out of range (1-65535)"),
    ({"rollout8_preflight_min_disk_gb": "lots"}, 'rollout8_preflight_min_disk_gb="lots" is not a number'),
    ({"rollout8_preflight_skip": "disk"}, 'rollout8_preflight_skip="disk" is not a list (YAML [a, b]; with -e, '
     "JSON: -e '{\"rollout8_preflight_skip\": [...]}')"),
    ({"rollout8_preflight_skip": ["dsik"]},
     "value of rollout8_preflight_skip must be one or more of: clock, disk, docker, npu, ports, reach, shared, shm. "
     "Got no match for: dsik"),
    ({"rollout8_verify_follow": "maybe"}, 'rollout8_verify_follow="maybe" is not true or false'),
    ({"rollout8_job_start_timeout_s": "0"}, "rollout8_job_start_timeout_s=0 is out of range (1 or more)"),
    ({"rollout8_ray_num_cpus": -2}, "rollout8_ray_num_cpus=-2 is out of range (0 or more)"),
    # the one number rule (issue 45): what -e @vars.json gives as easily as a typo
    ({"rollout8_preflight_min_disk_gb": float("inf")}, "rollout8_preflight_min_disk_gb=inf is not a finite number"),
    ({"rollout8_preflight_min_shm_gb": float("nan")}, "rollout8_preflight_min_shm_gb=nan is not a finite number"),
    ({"rollout8_ray_object_store_bytes": 10**30}, "rollout8_ray_object_store_bytes=1000000000000000000000000000000 "
     "is out of range (more than 64 bits hold"),
    ({"rollout8_job_timeout_s": "99999999999999999999999"}, "rollout8_job_timeout_s=99999999999999999999999 is out "
     "of range (more than 64 bits hold"),
    ({"rollout8_job_submit_retries": True}, "rollout8_job_submit_retries=true is not a number (a boolean)"),
], ids=["bool-typo", "choice-typo", "kind-old-name", "runtime", "port-word", "port-range", "disk-gb-word",
        "skip-string", "skip-unknown", "bool-word", "timeout-zero", "cpus-negative", "float-infinite", "float-nan",
        "int-past-64-bits", "int-text-past-64-bits", "int-given-a-bool"])
def test_knob_of_the_wrong_type_or_value_is_refused_naming_it(contract, values, expected):
    errors = knob_errors(values, contract["options"], PORTS, POSITIVE)
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_a_right_value_given_as_a_string_passes(contract):
    given = {"rollout8_verify_quant": "false", "rollout8_ray_port": "6380", "rollout8_preflight_skip": ["disk"],
             "rollout8_job_start_timeout_s": "1", "rollout8_ray_num_cpus": 0}
    assert knob_errors(given, contract["options"], PORTS, POSITIVE) == []


def test_a_mistyped_knob_is_not_judged_again_for_its_range(contract):
    """Ansible's type error says it all: 'abc' is not also 'out of range'."""
    errors = knob_errors({"rollout8_ray_port": "abc", "rollout8_ray_dashboard_port": "0"}, contract["options"],
                         PORTS, POSITIVE)
    assert errors == ['rollout8_ray_port="abc" is not an integer',
                      "rollout8_ray_dashboard_port=0 is out of range (1-65535)"]


def test_knob_errors_name_the_host_that_has_them_and_none_when_every_host_does(contract):
    before = copy.deepcopy(contract)
    hostvars = inventory(node_a={"rollout8_verify_quant": "flase"}, node_b={"rollout8_verify_quant": "flase",
                                                                             "rollout8_ray_port": "abc"},
                         node_c={"rollout8_verify_quant": "flase"})
    assert rollout8_knob_errors(hostvars, HOSTS, contract, PORTS, POSITIVE) == [
        'rollout8_verify_quant="flase" is not true or false', 'node-b: rollout8_ray_port="abc" is not an integer']
    assert contract == before, "checking one host changed the contract every other host is checked against"


# ----------------------------------------------------------------------------------------- the hosts together
def test_hosts_of_the_sample_shape_fit_together(contract):
    assert rollout8_cluster_errors(inventory(), HOSTS, contract, PORTS) == []


def test_hosts_that_collide_are_refused_naming_them(contract):
    """One node listed twice (same ansible_host and port), one cluster address given to two nodes, the dashboard
    on the Ray port, two NICs in one. Two nodes behind one address on different ssh ports are not one machine."""
    hosts = [*HOSTS, "node-d"]
    hostvars = inventory(node_a={"rollout8_node_address": "10.9.9.9"}, node_c={"ansible_host": "127.0.0.11"})
    hostvars["node-d"] = {"ansible_host": "127.0.0.11", "ansible_port": 10, "rollout8_node_address": "10.9.9.9",
                          "rollout8_cluster_nic": "eth0,eth1"}
    for values in hostvars.values():
        values["rollout8_ray_dashboard_port"] = 6379
    assert rollout8_cluster_errors(hostvars, hosts, contract, PORTS) == [
        "rollout8_ray_dashboard_port=6379 is rollout8_ray_port too (each Ray port needs its own number)",
        'node-d: rollout8_cluster_nic="eth0,eth1" is not one interface name (one NIC, as `ip -br link` names it '
        'before any "@": up to 15 letters, digits, ".", "_", "-")',
        "node-a and node-d have the same rollout8_node_address 10.9.9.9 (each node needs its own)",
        "node-b and node-c are one machine (ansible_host 127.0.0.11 port 9; list each node once)"]


def test_ports_nic_names_and_container_users_are_refused_host_by_host(contract):
    hostvars = inventory(node_a={"rollout8_cluster_nic": "eth0 eth1"},
                         node_b={"rollout8_ray_port": 10101, "rollout8_cluster_nic": "enp189s0f0np0x12"},
                         node_c={"rollout8_cluster_nic": "bond0.100", "rollout8_ray_min_worker_port": 7000,
                                 "rollout8_ray_max_worker_port": 6999, "rollout8_container_user": "deploy"})
    errors = rollout8_cluster_errors(hostvars, HOSTS, contract, PORTS)
    assert errors == [
        'node-a: rollout8_cluster_nic="eth0 eth1" is not one interface name (one NIC, as `ip -br link` names it '
        'before any "@": up to 15 letters, digits, ".", "_", "-")',
        "node-b: rollout8_ray_port=10101 is in the Ray worker port range 10002-19999 (rollout8_ray_min_worker_port-"
        "rollout8_ray_max_worker_port: move one or the other)",
        'node-b: rollout8_cluster_nic="enp189s0f0np0x12" is not one interface name (one NIC, as `ip -br link` '  # 16
        'names it before any "@": up to 15 letters, digits, ".", "_", "-")',
        "node-c: rollout8_ray_min_worker_port=7000 is above rollout8_ray_max_worker_port=6999",
        'node-c: rollout8_container_user="deploy" is not uid:gid (two numbers, as `id -u` and `id -g` print them; '
        "leave it empty for the login user)",
        "rollout8_ray_port differs between hosts (6379 on node-a, node-c; 10101 on node-b; a worker joins the head "
        "at its own value: set one for the cluster, in group_vars)"]


@pytest.mark.parametrize("nic", [".", "..", "a/b", ""])
def test_a_nic_name_that_is_a_path_is_refused_and_an_empty_one_means_none(contract, nic):
    errors = rollout8_cluster_errors(inventory(node_a={"rollout8_cluster_nic": nic}), HOSTS, contract, PORTS)
    assert errors == ([] if nic == "" else [f'node-a: rollout8_cluster_nic="{nic}" is not one interface name (one '
                                            'NIC, as `ip -br link` names it before any "@": up to 15 letters, '
                                            'digits, ".", "_", "-")'])


def test_a_data_nic_named_differently_in_the_spec_and_the_inventory_names_the_host():
    hostvars = inventory(node_b={"rollout8_cluster_nic": " ens1 "}, node_c={"rollout8_cluster_nic": "eth0"})
    assert rollout8_nic_conflicts(hostvars, HOSTS, "eth0") == ["rollout8_cluster_nic=ens1 on node-b"]
    assert rollout8_nic_conflicts(hostvars, HOSTS, "") == []


def test_the_inventory_names_a_data_nic_for_every_node_or_the_nodes_without_one_are_named():
    assert rollout8_nic_unnamed(inventory(), HOSTS) == HOSTS  # nothing named: plan gets no --nic-in-inventory
    named = inventory(node_a={"rollout8_cluster_nic": "data0"}, node_b={"rollout8_cluster_nic": "enp189s0f0"},
                      node_c={"rollout8_node_address": "10.0.0.3"})  # a node's address names its NIC too
    assert rollout8_nic_unnamed(named, HOSTS) == []
    named["node-c"]["rollout8_node_address"] = " "
    assert rollout8_nic_unnamed(named, HOSTS) == ["node-c"]


def test_one_uid_gid_for_the_training_containers_or_both_ids_and_their_nodes_are_named():
    same = inventory(**{h: {"rollout8_node_login_ids": "1000:1000"} for h in ("node_a", "node_b", "node_c")})
    assert rollout8_container_ids_spread(same, HOSTS) == ""
    other = copy.deepcopy(same)
    other["node-b"]["rollout8_node_login_ids"] = "1001:1001"
    line = rollout8_container_ids_spread(other, HOSTS)
    assert "1000:1000 on node-a, node-c; 1001:1001 on node-b" in line
    assert "the login user's ids" in line and 'rollout8_container_user: "1000:1000"' in line
    assert "\n" not in line and line.endswith("Nothing was changed.")
    # the fix: one rollout8_container_user for the cluster, whatever the login users' ids
    fixed = copy.deepcopy(other)
    for values in fixed.values():
        values["rollout8_container_user"] = "1000:1000"
    assert rollout8_container_ids_spread(fixed, HOSTS) == ""
    # set on one node only, it is that node's id against the others' login ids
    partly = copy.deepcopy(same)
    partly["node-c"]["rollout8_container_user"] = "0:0"
    assert "0:0 on node-c" in rollout8_container_ids_spread(partly, HOSTS)
    assert "rollout8_container_user on some" in rollout8_container_ids_spread(partly, HOSTS)


def test_a_node_whose_ids_were_never_gathered_is_not_compared():
    hosts = inventory(node_a={"rollout8_node_login_ids": "1000:1000"}, node_b={"rollout8_node_login_ids": "1000:1000"})
    assert rollout8_container_ids_spread(hosts, HOSTS) == ""  # node-c outside --limit and not in the fact cache


@pytest.mark.parametrize("name", ["node;rm -rf ~", "../etc", "a/b", "node..1", "$(id)", "-e", "", "node 1"])
def test_a_host_name_that_is_not_a_name_is_refused_before_it_becomes_a_path(name):
    errors = rollout8_host_name_errors(["head", name])
    assert len(errors) == 1 and json.dumps(name) in errors[0] and "is not a host name" in errors[0], errors


def test_host_names_of_the_sample_and_simulated_inventories_pass():
    assert rollout8_host_name_errors(["rollout8-sim-head", "node-01.dc1.example", "atlas_07", "10.0.0.5"]) == []


def test_a_knob_whose_aliases_expand_past_any_size_is_refused_before_it_is_copied(contract):
    """A billion laughs in group_vars: YAML shares the lists (cheap to load); the validator's copy expands them."""
    bomb = ["x"] * 9
    for _ in range(8):
        bomb = [bomb] * 9
    errors = knob_errors({"rollout8_preflight_skip": bomb}, contract["options"], PORTS, POSITIVE)
    assert len(errors) == 1 and errors[0].startswith("rollout8_preflight_skip holds more than 10000 values"), errors
