"""The preflight role's rules across nodes, run on the controller: the all-pairs reachability plan and its verdict,
one MTU on the cluster interfaces, and the NPU driver and firmware versions (read from the installer's files, the
same on every node). Each takes Ansible's `hostvars` (in the tests, a dict of dicts) and the hosts to judge, and
returns data: the peers to probe, or one line per problem; the tasks only assert that none came back. One rule is
per node: room for verl's checkpoints where they land (the node's rollout8_node_state result against the plan), and
HCCL's host port range outside the node's ephemeral ports unless they are reserved."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

# The driver's installer writes Version=... into its version files (driver and firmware).
VERSION = re.compile(r"Version=([0-9][0-9A-Za-z.]*)")


def rollout8_reach_table(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str]) -> dict:
    """Every host's cluster address and the ports its listener took (those it bound, those the job's own processes
    already held, and the one ephemeral port it found): read once for the play (run_once), one hostvars lookup per
    host. Each host's peers are then the other rows (rollout8_reach_peers): read per host from hostvars instead, the
    controller made N x N lookups, each of which renders that host's variables (measured: 1.3 s at 16 hosts, 14 s at
    64, quadratic)."""
    table = {}
    for host in hosts:
        values = hostvars[host]
        listener = values["rollout8_reach_listener"]
        ephemeral = listener.get("ephemeral")
        table[host] = {"address": values["rollout8_node_ip"],
                       "ports": [*listener["bound"], *listener["held"], *([ephemeral] if ephemeral else [])]}
    return table


def rollout8_reach_peers(table: Mapping[str, dict], me: str) -> dict:
    """What `me` connects to: every other host of the table (rollout8_reach_table)."""
    return {host: peer for host, peer in table.items() if host != me}


def rollout8_clock_skew(node_time: float, before: float, after: float) -> int:
    """Whole seconds by which a node's clock reading (its time.time(), whole seconds) lies outside the interval the
    controller's clock spanned while the node read it: `before`, taken once before any node read its clock, to
    `after`, as the controller takes this node's reading in; 0 inside it. The wait between the two grows with the
    node count (every node finishes the task before any goes on, forks run in waves, a busy controller takes results
    in one by one) and is no skew: taken against `after` alone, it refused nodes of one clock at 8 nodes."""
    node, before, after = float(node_time), float(before), float(after)
    if node > after:
        return int(node - after)
    if node < before:
        return int(node - before)
    return 0


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


GIB = 1024**3


def rollout8_checkpoint_space(df: Mapping[str, Any], plan: Mapping[str, Any], host: str) -> str:
    """One line when the filesystem where verl's checkpoints land on `host` has less free space than the plan's
    checkpoint_bytes_needed (rollout8.runspec.checkpoint_size: the saves kept x the model's bytes a save), naming
    the node, the path, free and needed GiB, where the need comes from and the ways out; "" when it fits, when the
    plan needs nothing (no saves, the model's size unknown, a plan without the sizing) or the node was not asked
    (df without checkpoint_free_bytes). df is the node module's result (rollout8_node_state, checkpoint_path)."""
    needed = int(plan.get("checkpoint_bytes_needed") or 0)
    if needed <= 0 or df.get("checkpoint_free_bytes") is None:
        return ""
    free = int(df["checkpoint_free_bytes"])
    if free >= needed:
        return ""
    shared, existing = plan.get("checkpoint_dir"), str(df.get("checkpoint_existing") or "")
    mount = str(plan.get("shared_dir") or "")
    where = (f"{existing} (holds {shared}, the checkpoint directory on cluster.shared_dir"
             + ("" if existing == mount or existing.startswith(mount.rstrip("/") + "/") else
                f"; {mount} itself is not there: is the shared filesystem mounted?") + ")" if shared
             else f"{existing} (no cluster.shared_dir: verl's relative checkpoint directory in the training "
                  "container, on this node's own disk)")
    keep = plan.get("max_actor_ckpt_to_keep")
    saves = int(plan.get("checkpoint_saves_kept") or 0)
    kept = (f"trainer.max_actor_ckpt_to_keep {keep}" if keep is not None and saves == keep else
            f"{saves} save(s) the run makes, trainer.max_actor_ckpt_to_keep {keep}" if keep is not None else
            f"{saves} save(s), every one kept (trainer.max_actor_ckpt_to_keep unset)")
    params = plan.get("model_parameters") or 0
    share = int(plan.get("checkpoint_share") or 1)
    per_save = int(plan.get("checkpoint_bytes_per_save") or 0)
    size = (f"{per_save / GIB:.1f} GiB a save for the model's {params / 1e9:.2f}B parameters (fp32 weights, Adam "
            "state, bf16 HF weights)" + (f", this node's share of {share} nodes" if share > 1 else ""))
    return (f"{host}: only {free / GIB:.1f} GiB free on {where}, need {needed / GIB:.1f} GiB for verl's "
            f"checkpoints: {kept} x {size}. Free space there or mount a larger filesystem (cluster.shared_dir), "
            "lower trainer.max_actor_ckpt_to_keep in the run spec's verl: block, or skip the check on purpose "
            "(rollout8_preflight_skip: [disk]).")


def _port_spans(text: str) -> list[tuple[int, int]]:
    """`32768\t60999` (ip_local_port_range) or `60000-60050,61000` (ip_local_reserved_ports) -> [(low, high)]."""
    text = str(text or "").strip()
    if re.fullmatch(r"\d+\s+\d+", text):
        low, high = (int(x) for x in text.split())
        return [(low, high)]
    spans = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            spans.append((int(low), int(high or low)))
    return spans


def _span_text(spans: list[tuple[int, int]]) -> str:
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans) or "none"


def rollout8_port_range_problem(env: Mapping[str, Any], ephemeral: str, reserved: str, host: str) -> str:
    """One line when HCCL_HOST_SOCKET_PORT_RANGE (the plan's env, from cluster.network.hccl_host_socket_port_range)
    has ports inside the node's ephemeral range (net.ipv4.ip_local_port_range: the ports the kernel hands to any
    outgoing connection) that net.ipv4.ip_local_reserved_ports does not reserve: a connection that took one makes
    HCCL's bind fail at random. Names both ranges and the two fixes; "" when the range is unset, outside, or
    reserved, and when the node's ranges could not be read (ephemeral empty)."""
    wanted = _port_spans(str((env or {}).get("HCCL_HOST_SOCKET_PORT_RANGE") or ""))
    eph = _port_spans(ephemeral)
    if not wanted or not eph:
        return ""
    (low, high), (elow, ehigh) = wanted[0], eph[0]
    held = _port_spans(reserved)
    # the ports of the overlap (an empty range when the two are apart) that no reservation holds
    free = sum(not any(a <= port <= b for a, b in held) for port in range(max(low, elow), min(high, ehigh) + 1))
    if not free:
        return ""
    size = high - low
    above = (f"{ehigh + 1}-{ehigh + 1 + size}" if ehigh + 1 + size <= 65535 else
             f"{max(1024, elow - 1 - size)}-{elow - 1}")
    return (f"{host}: HCCL_HOST_SOCKET_PORT_RANGE {low}-{high} (cluster.network.hccl_host_socket_port_range) overlaps "
            f"this node's ephemeral port range {elow}-{ehigh} (net.ipv4.ip_local_port_range), and "
            f"{free} of its ports are not reserved (net.ipv4.ip_local_reserved_ports: {_span_text(held)}): any "
            f"outgoing connection can take one and HCCL's bind then fails at random. Move the range outside "
            f"{elow}-{ehigh} (e.g. {above}), or reserve it on every node: sysctl -w "
            f"net.ipv4.ip_local_reserved_ports={low}-{high} (and in /etc/sysctl.d/ to keep it after a reboot).")


def rollout8_runtime_problems(df: Mapping[str, Any], mount_label: str, host: str) -> str:
    """One line naming what in the node's container runtime would stop the training container, from the node
    module's docker_runtime reading (df): Docker's init binary missing (the container runs with --init), or SELinux
    enforcing while rollout8_container_mount_label does not say how the bind mounts are labelled; "" when neither
    (or when the node was not asked: no docker_init_name)."""
    problems = []
    name = str(df.get("docker_init_name") or "")
    if name and not df.get("docker_init"):
        problems.append(
            f"Docker's init binary {name} is not installed (not on PATH nor in Docker's libexec directories): the "
            "training container runs with --init, which reaps Ray's processes, and would not start. Install it "
            "(tini as docker-init: some distribution packages of Docker 18.09/20.10 leave it out), or set the "
            "daemon's init-path in /etc/docker/daemon.json")
    if str(df.get("selinux") or "") == "Enforcing" and not mount_label:
        labels = ("Docker labels containers (selinux-enabled): the training container's bind mounts (deploy root, "
                  "logs, its home, Ray's directory) are denied without a label" if df.get("docker_selinux") else
                  "Docker does not label containers now (no selinux-enabled in its security options), which a change "
                  "of its daemon.json would undo")
        problems.append(
            f"SELinux is enforcing and {labels}. Set rollout8_container_mount_label: z (Docker relabels the node's "
            "own directories it mounts; the shared directory on NFS is not relabelled: it needs setsebool -P "
            "virt_use_nfs 1), or none to mount them unlabelled on purpose")
    return f"{host}: " + "; ".join(problems) + "." if problems else ""


class FilterModule:
    def filters(self):
        return {f.__name__: f for f in (rollout8_reach_table, rollout8_reach_peers, rollout8_clock_skew,
                                        rollout8_unreachable, rollout8_mtu_spread, rollout8_npu_version,
                                        rollout8_version_spread, rollout8_checkpoint_space,
                                        rollout8_port_range_problem, rollout8_runtime_problems)}
