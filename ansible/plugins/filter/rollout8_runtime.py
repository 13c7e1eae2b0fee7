"""The runtime role's NPU driver mounts, run on the controller: npu-smi and hccn_tool mounted from where this node
has them (found by the node module rollout8_hccn: PATH, then the driver's directories) at the paths the image
expects; Docker would make an empty directory of a source that is not there. And the SELinux label of the mounts
of the node's own directories (rollout8_container_mount_label)."""

from __future__ import annotations

from collections.abc import Mapping


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


class FilterModule:
    def filters(self):
        return {"rollout8_npu_mounts": rollout8_npu_mounts, "rollout8_mount_label": rollout8_mount_label}
