"""Paths on every node in the run spec (deploy.root, cluster.shared_dir): absolute, normalised, and the rule of what
may be a deploy root. Pure functions of the path: no node is asked (the node asks itself again, symbolic links
resolved, before it makes or removes the directory: ansible/library/rollout8_deploy_root.py).
"""

from __future__ import annotations

from pathlib import PurePosixPath


def node_absolute(value: str | None) -> str | None:
    """A path on every node: absolute, without '..', normalised (no '//', '.' segment or trailing slash)."""
    if value is None:
        return None
    if not PurePosixPath(value).is_absolute():
        raise ValueError(f"{value!r} must be an absolute path (it is a path on every node)")
    if any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise ValueError(f"{value!r} holds a control character (a newline, a tab...): give the path on one line")
    parts = value.split("/")
    if ".." in parts:
        raise ValueError(f"{value!r} has a '..' segment: give the directory itself (each node would resolve '..' "
                         "through its own symbolic links)")
    return "/" + "/".join(part for part in parts if part not in ("", "."))


# deploy.root is made on every node, filled with this run's copies, and removed whole by reset.yml: it must be a
# directory of this run's own, never one that holds the system's or other software's files. The rule is the one the
# node applies before it makes or removes the directory (ansible/library/rollout8_deploy_root.py), so `check` refuses
# on the controller what a node would refuse, plus what only the spec knows (the shared directory, rollout8's own
# parent of every default deploy root):
# - `/`; a top-level directory of the Filesystem Hierarchy Standard (FHS 3.0 ch. 3 and its Linux annex: bin, boot,
#   dev, etc, home, lib, lib32/lib64/libx32, media, mnt, opt, proc, root, run, sbin, srv, sys, tmp, usr, var), plus
#   /snap and /lost+found that distributions add and /data, the usual mount point of a data disk: each holds the
#   system's files, other software's, or a whole other filesystem;
# - a direct subdirectory of those whose every child is the system's or a user's (/usr/local, /var/lib, /etc/ssh,
#   /home/<user>, /root/<x>...); deeper, a directory of one's own is fine (/var/lib/rollout8/runs/<name>, the
#   default). /opt, /srv, /mnt, /media, /tmp and /data are where one's own directories go: /srv/rollout8 is fine;
# - anything inside /proc, /sys, /dev and /run (kernel and memory filesystems: nothing written there is storage) and
#   inside /usr/local/Ascend (the NPU driver and CANN, mounted into the training container);
# - /var/lib/rollout8 and /var/lib/rollout8/runs: they hold every run's default deploy root, which a reset of this
#   one would remove.
SYSTEM_TOP = frozenset(("bin", "boot", "data", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "lost+found",
                        "media", "mnt", "opt", "proc", "root", "run", "sbin", "snap", "srv", "sys", "tmp", "usr",
                        "var"))
SYSTEM_TREES = frozenset(("bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "proc", "root",
                          "run", "sbin", "snap", "sys", "usr", "var"))
NOT_STORAGE = {"/proc": "a kernel filesystem", "/sys": "a kernel filesystem", "/dev": "devices and shared memory",
               "/run": "a memory filesystem", "/usr/local/Ascend": "the NPU driver and CANN"}
RUNS_PARENTS = frozenset(("/var/lib/rollout8", "/var/lib/rollout8/runs"))


def deploy_root_problem(root: str) -> str | None:
    """Why a normalised absolute path cannot be a deploy root, or None."""
    parts = root.strip("/").split("/") if root != "/" else []
    if not parts:
        return "is / (the whole filesystem)"
    if len(parts) == 1 and parts[0] in SYSTEM_TOP or len(parts) == 2 and parts[0] in SYSTEM_TREES:
        return "is a system directory"
    for tree, what in NOT_STORAGE.items():
        if root.startswith(tree + "/"):
            return f"lies inside {tree} ({what}), not a place for the run's files"
    if root in RUNS_PARENTS:
        return "holds every run's default deploy root"
    return None


def within(path: str, directory: str) -> bool:
    """path is directory or lies inside it (both normalised absolute paths)."""
    return path == directory or directory == "/" or path.startswith(directory.rstrip("/") + "/")


# With deploy.shared_storage the models, profile and data are read where the spec names them, on every node; the
# docker runtime mounts each into the training container at the same path (read-only; ansible/roles/runtime). A
# path cannot be such a mount when Docker's volume syntax cannot carry it, or when mounted it would hide the
# image's own files: /, a top-level system directory, the image's software (/usr, /etc, /bin, /sbin, /lib*) or a
# kernel or memory filesystem and the NPU driver's tree (mounted from the node already).
IMAGE_TREES = frozenset(("bin", "etc", "lib", "lib32", "lib64", "libx32", "sbin", "usr"))


def mount_problem(path: str) -> str | None:
    """Why a normalised absolute path cannot be mounted into the training container at the same path, or None."""
    if ":" in path or "," in path:
        return "holds ':' or ',', which a Docker volume cannot carry"
    parts = path.strip("/").split("/") if path != "/" else []
    if not parts:
        return "is / (the whole filesystem)"
    if len(parts) == 1 and parts[0] in SYSTEM_TOP:
        return "is a top-level system directory"
    for tree, what in NOT_STORAGE.items():
        if within(path, tree):
            return f"lies inside {tree} ({what})"
    if parts[0] in IMAGE_TREES:
        return f"lies inside /{parts[0]}, the image's own software"
    return None


def container_mounts(paths: list[str], mounted: list[str]) -> list[str]:
    """What a training container must mount, each at its own path, to see every one of paths: those not inside a
    directory it mounts already (mounted) nor inside another of paths, sorted."""
    chosen: list[str] = []
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if not any(within(path, directory) for directory in (*mounted, *chosen)):
            chosen.append(path)
    return sorted(chosen)
