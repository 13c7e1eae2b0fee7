"""README.md's firewall rule against the ports the roles pin: every port Ray listens on between nodes is inside a
documented range, the inventory sample says the same numbers, and the simulated nodes' rule is made from the
README (virtual/sim_nodes.firewall_rules)."""

from __future__ import annotations

from pathlib import Path

import sim_nodes  # virtual/, on pytest's pythonpath
import yaml

REPO = Path(__file__).resolve().parents[2]

DEFAULTS = yaml.safe_load((REPO / "ansible/roles/rollout8_defaults/defaults/main.yml").read_text())
SAMPLE = yaml.safe_load((REPO / "ansible/inventory/sample/group_vars/all/network.yml").read_text())
# the dashboard and job API listen on the head's loopback only: nothing opens them
LOOPBACK_ONLY = {"rollout8_ray_dashboard_port"}


def ranges(ports: list[str]) -> list[tuple[int, int]]:
    out = []
    for p in ports:
        low, _, high = p.partition("-")
        out.append((int(low), int(high or low)))
    return out


def covered(port: int, documented: list[tuple[int, int]]) -> bool:
    return any(low <= port <= high for low, high in documented)


def test_every_pinned_ray_port_is_inside_the_readme_rule_and_the_sample_says_the_same():
    documented = ranges(sim_nodes.documented_ports())
    ports = {k: v for k, v in DEFAULTS.items() if k.startswith("rollout8_ray_") and k.endswith("_port")}
    assert len(ports) >= 10, sorted(ports)  # GCS, dashboard, client server, six per-node services, the worker range
    for key, value in ports.items():
        if key not in LOOPBACK_ONLY:
            assert covered(value, documented), f"{key}={value} is outside README.md's firewall rule {documented}"
        assert SAMPLE.get(key) == value, f"inventory sample: {key}={SAMPLE.get(key)}, the default is {value}"
    assert (DEFAULTS["rollout8_ray_min_worker_port"], DEFAULTS["rollout8_ray_max_worker_port"]) in documented


def test_the_readme_rule_opens_the_kernels_ephemeral_range_torch_and_gloo_use():
    # Linux's default net.ipv4.ip_local_port_range: verl's rendezvous and Gloo bind port 0, no knob pins them
    assert covered(32768, ranges(sim_nodes.documented_ports()))
    assert covered(60999, ranges(sim_nodes.documented_ports()))


def test_a_readme_without_the_rule_is_refused_naming_it(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no firewall here\n")
    try:
        sim_nodes.documented_ports(readme)
    except SystemExit as exc:
        assert "no firewall-cmd --add-port" in str(exc) and str(readme) in str(exc)
    else:
        raise AssertionError("a README without the rule was accepted")


def test_the_simulated_rule_drops_by_default_and_opens_the_documented_ports_from_the_subnet_only():
    rules = sim_nodes.firewall_rules("172.30.0.0/16", ["6379-6386", "10002-19999"])
    assert "policy drop;" in rules and "tcp dport 22 accept" in rules
    assert "ip saddr 172.30.0.0/16 tcp dport { 6379-6386, 10002-19999 } accept" in rules


def test_the_simulated_rule_takes_ssh_from_the_bastion_only_when_there_is_one():
    rules = sim_nodes.firewall_rules("172.30.0.0/16", ["6379-6386"], ssh_from="172.18.0.9")
    assert "\n    ip saddr 172.18.0.9 tcp dport 22 accept\n" in rules
    assert "\n    tcp dport 22 accept\n" not in rules
    assert "\n    tcp dport 22 accept\n" in sim_nodes.firewall_rules("172.30.0.0/16", ["6379-6386"])
