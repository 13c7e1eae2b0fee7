"""The runtime role's NPU driver mounts, run on the controller: npu-smi and hccn_tool mounted from where this node
has them (found by the node module rollout8_hccn: PATH, then the driver's directories) at the paths the image
expects; Docker would make an empty directory of a source that is not there. And the SELinux label of the mounts
of the node's own directories (rollout8_container_mount_label). And the NPU access of a non-root container user:
its supplementary groups (the devices' and the driver's group, rollout8_npu_group) and the verdict of preflight's
probe container, which runs `npu-smi info` with the training container's user, groups, devices and driver mounts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def rollout8_npu_mounts(mounts: list[str], targets: Mapping[str, str], found: Mapping[str, str] | None) -> list[str]:
    """`mounts` (source:target[:mode]) with the source of each target named in `targets` (target -> tool key)
    replaced by where the node has that tool (`found`: tool key -> path); every other mount, and a tool the node
    was not found to have, as configured."""
    out = []
    for mount in mounts:
        source, *rest = mount.split(":")
        tool = (found or {}).get(targets.get(rest[0], ""), "") if rest else ""
        out.append(":".join([tool, *rest]) if tool else mount)
    return out


def rollout8_mount_label(mounts: list[str], label: str) -> list[str]:
    """`mounts` (source:target[:mode]) with Docker's shared SELinux label `z` added to each when label is "z" (a
    mode kept: `ro` becomes `ro,z`); as they are for "" and "none". The role passes only the node's own
    directories: the shared directory (NFS: not relabelled) and the NPU driver's files never get it."""
    if label != "z":
        return list(mounts)
    out = []
    for mount in mounts:
        parts = mount.split(":")
        out.append(":".join(parts[:2] + [",".join(parts[2:3] + ["z"])]) if len(parts) > 2 else f"{mount}:z")
    return out


def rollout8_getent_gid(entry: Mapping[str, Any] | None, name: str) -> str:
    """The gid of group `name` from a registered ansible.builtin.getent (database group, fail_key false) result: ""
    when the node has no such group, or when the task was skipped (the name empty)."""
    record = (((entry or {}).get("ansible_facts") or {}).get("getent_group") or {}).get(name) if name else None
    if isinstance(record, list) and record and isinstance(record[0], list):  # a name listed twice: the first
        record = record[0]
    return str(record[1]) if isinstance(record, list) and len(record) > 1 and str(record[1]).isdigit() else ""


def rollout8_container_groups(device_stats: list[Mapping[str, Any]] | None, gid: str) -> list[str]:
    """A non-root training container's supplementary groups on an NPU node: the group of every NPU device the node
    has (a registered stat loop's results), then the driver's group (`gid`, rollout8_getent_gid), once each."""
    out: list[str] = []
    for stat in (result.get("stat") or {} for result in device_stats or []):
        if stat.get("exists") and stat.get("gid") is not None and str(stat["gid"]) not in out:
            out.append(str(stat["gid"]))
    return out + ([str(gid)] if gid and str(gid) not in out else [])


def rollout8_npu_probe_argv(image: str, user: str, groups: list[str], devices: list[str], volumes: list[str],
                            timeout_s: int) -> list[str]:
    """`docker run` of the probe container: `npu-smi info` in the training image, through its entrypoint as the
    training container runs, with that container's user, groups, devices and driver mounts; removed when it ends,
    no network, bounded by `timeout` (the docker client killed 10 s after, should it not stop)."""
    argv = ["timeout", "-k", "10", str(int(timeout_s)), "docker", "run", "--rm", "--network", "none", "--user", user]
    for gid in groups:
        argv += ["--group-add", str(gid)]
    for device in devices:
        argv += ["--device", device]
    for volume in volumes:
        argv += ["-v", volume]
    return argv + [image, "npu-smi", "info"]


# npu-smi info's first table row: `| npu-smi 24.1.rc3        Version: 24.1.rc3        |` (the driver's version)
NPU_SMI_VERSION = re.compile(r"\bVersion:\s*([0-9][0-9A-Za-z.]*[0-9A-Za-z])")


def npu_smi_message(result: Mapping[str, Any], limit: int = 300) -> str:
    """What the probe printed, on one line (stderr, then stdout: npu-smi prints its refusal on stdout), else the
    command module's own message (the command could not be run)."""
    text = "\n".join(str(result.get(key) or "") for key in ("stderr", "stdout")).strip() or str(result.get("msg") or "")
    parts = [part.strip().rstrip(".") for part in text.splitlines()]
    line = "; ".join(part for part in parts if part and not set(part) <= set("+-="))  # no table rules
    return (line[:limit] + "...") if len(line) > limit else (line or "no message")


def rollout8_npu_probe_verdict(result: Mapping[str, Any], host: str, user: str, groups: list[str], group: str,
                               gid: str, timeout_s: int = 60) -> dict:
    """The verdict on preflight's probe container (`npu-smi info` as the training container's user, a registered
    command result): {"problem": one line naming the node, the uid:gid and groups used, npu-smi's own message and
    the fix, or "" when it answered; "driver": the driver's version npu-smi shows ("" when none); "summary": what
    the preflight summary says of it}. The fix depends on what the container was given: no driver group on the
    node (rollout8_npu_group), the group given and npu-smi still refusing (the driver's permissions), or root."""
    rc = int(result.get("rc", 1) if result.get("rc") is not None else 1)
    groups = [str(g) for g in groups or []]
    shown = ", ".join(groups) or "none"
    if rc == 0:
        match = NPU_SMI_VERSION.search(str(result.get("stdout") or ""))
        driver = match.group(1) if match else ""
        return {"problem": "", "driver": driver,
                "summary": f"npu-smi answers as the training container's user {user} (groups {shown}), NPU driver "
                           + (driver or "version not shown")}
    said = npu_smi_message(result)
    head = (f"{host}: npu-smi info fails in a probe container made as the training container is (user {user}, "
            f"groups {shown}, its devices and driver mounts): {said}. ")
    root = user.split(":")[0].strip() == "0"
    if rc in (124, 137):
        fix = (f"It did not answer within {timeout_s} s: the driver or a device is hung, or another process holds "
               "the NPUs (npu-smi info on the node shows which); the training container would hang there too.")
    elif rc == 125:
        fix = ("The container did not start (Docker's message above): the training container would not either; "
               "check the NPU devices (rollout8_container_npu_devices, rollout8_container_npu_common_devices) and the "
               "driver's files mounted (rollout8_container_npu_mounts) on this node.")
    elif rc in (126, 127):
        fix = ("npu-smi is not there (or not executable) in the container: mount the driver's npu-smi at "
               "/usr/local/bin/npu-smi (rollout8_npu_smi, rollout8_container_npu_mounts).")
    elif root:
        fix = ("It runs as root, so no group is missing: the devices or driver files given to the container are "
               "not enough (rollout8_container_npu_devices, rollout8_container_npu_mounts), or another container "
               "holds the NPUs.")
    elif not group:
        fix = ("rollout8_npu_group is empty, so no driver group was added: set it to the group the driver's devices "
               "and files belong to (the driver's HwHiAiUser), or run the container as root (rollout8_container_user: "
               "\"0:0\").")
    elif not gid:
        fix = (f"The node has no {group} group (getent group {group} finds none), so none was added: install the "
               f"driver as its guide says (groupadd {group}; useradd -g {group} {group}; then the driver's installer, "
               f"which gives {group} its devices and files), or set rollout8_npu_group to the group that owns "
               "/dev/davinci* here.")
    else:
        fix = (f"{group}'s gid {gid} was added and npu-smi still refuses: the driver's permissions (/dev/davinci*, "
               f"/dev/davinci_manager, /usr/local/Ascend/driver and /usr/local/dcmi must be open to group {group}: "
               "reinstall the driver for it, e.g. with --install-for-all), or run the container as root "
               "(rollout8_container_user: \"0:0\").")
    return {"problem": head + fix, "driver": "", "summary": ""}


class FilterModule:
    def filters(self):
        return {f.__name__: f for f in (rollout8_npu_mounts, rollout8_mount_label, rollout8_getent_gid,
                                        rollout8_container_groups, rollout8_npu_probe_argv,
                                        rollout8_npu_probe_verdict)}
