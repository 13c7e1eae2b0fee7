"""The preflight role's rules across nodes, run on the controller: the all-pairs reachability plan and its verdict,
one MTU on the cluster interfaces, and the NPU driver and firmware versions (read from the installer's files, the
same on every node). Each takes Ansible's `hostvars` (in the tests, a dict of dicts) and the hosts to judge, and
returns data: the peers to probe, or one line per problem; the tasks only assert that none came back."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

# The driver's installer writes Version=... into its version files (driver and firmware).
VERSION = re.compile(r"Version=([0-9][0-9A-Za-z.]*)")


def rollout8_reach_peers(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str], me: str) -> dict:
    """What `me` connects to: every other host's cluster address and the ports its listener took (those it bound,
    those the job's own processes already held, and the one ephemeral port it found)."""
    peers = {}
    for host in hosts:
        if host == me:
            continue
        listener = hostvars[host]["rollout8_reach_listener"]
        ephemeral = listener.get("ephemeral")
        peers[host] = {"address": hostvars[host]["rollout8_node_ip"],
                       "ports": [*listener["bound"], *listener["held"], *([ephemeral] if ephemeral else [])]}
    return peers


def rollout8_unreachable(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str]) -> list[str]:
    """One line per node, peer and port that did not connect (a time-out is a firewall dropping it)."""
    out = []
    for host in hosts:
        for miss in (hostvars[host].get("rollout8_reach") or {}).get("missing") or []:
            reason = "dropped: a firewall" if miss["reason"] == "timed out" else miss["reason"]
            out.append(f"{host} cannot reach {miss['peer']} at {miss['address']} on TCP {miss['port']} ({reason})")
    return out


def rollout8_mtu_spread(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str]) -> list[str]:
    """'host: nic mtu N' for every node whose cluster interface's MTU the facts know, when they are not all one;
    [] when they are."""
    mtus = {}
    for host in hosts:
        values = hostvars[host]
        nic = values.get("rollout8_node_nic") or ""
        mtu = (values.get("ansible_" + nic.replace("-", "_")) or {}).get("mtu") if nic else None
        if mtu:
            mtus[host] = (int(mtu), f"{host}: {nic} mtu {mtu}")
    return [text for _, text in mtus.values()] if len({mtu for mtu, _ in mtus.values()}) > 1 else []


def rollout8_npu_version(content_b64: str) -> str:
    """The version a driver or firmware version file (slurp's base64 content) names, or 'unknown'."""
    text = base64.b64decode(content_b64 or "").decode("utf-8", "replace")
    match = VERSION.search(text)
    return match.group(1) if match else "unknown"


def rollout8_version_spread(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str],
                            fact: str = "rollout8_npu_versions", kinds: tuple[str, ...] = ("driver", "firmware"),
                            ) -> list[str]:
    """Per kind whose version differs across the hosts that have `fact`: 'driver versions (24.1.rc3 on a, b;
    24.1.rc2 on c)'."""
    out = []
    for kind in kinds:
        by: dict[str, list[str]] = {}
        for host in hosts:
            versions = hostvars[host].get(fact)
            if versions is not None:
                by.setdefault(str(versions[kind]), []).append(host)
        if len(by) > 1:
            out.append(f"{kind} versions (" + "; ".join(f"{v} on {', '.join(who)}" for v, who in by.items()) + ")")
    return out


class FilterModule:
    def filters(self):
        return {f.__name__: f for f in (rollout8_reach_peers, rollout8_unreachable, rollout8_mtu_spread,
                                        rollout8_npu_version, rollout8_version_spread)}
