"""The verify role's lists of nodes, run on the controller: each node named with its cluster address (for
`rollout8 progress`, which names a node none of whose ranks reached the communicator), and the nodes whose raylet
is gone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def rollout8_node_addresses(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str]) -> list[str]:
    """'host=address' for each host (the host's name where its address is unknown)."""
    return [f"{host}={hostvars[host].get('rollout8_node_ip', host)}" for host in hosts]


def rollout8_dead_hosts(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str],
                        probe: str = "rollout8_raylet_now") -> list[str]:
    """'host (address)' for each host whose raylet check (`probe`, a registered command) did not succeed or did not
    run (the collect play could not reach it); just 'host' where its address is unknown."""
    dead = [host for host in hosts if (hostvars[host].get(probe) or {}).get("rc", 1) != 0]
    return [f"{host} ({hostvars[host]['rollout8_node_ip']})" if hostvars[host].get("rollout8_node_ip") else host
            for host in dead]


class FilterModule:
    def filters(self):
        return {"rollout8_node_addresses": rollout8_node_addresses, "rollout8_dead_hosts": rollout8_dead_hosts}
