#!/usr/bin/python
"""The run's deploy root on a node: made with rollout8's marker, removed only with it (Python 3.7 compatible).

rollout8 removes only what it made. The marker is `<deploy root>/.rollout8-deploy-root`, a JSON note: made by
rollout8, this path, the run.

- `state: present` (the artifacts role, before anything is sent): a missing deploy root is made with the marker
  inside: it is made under a temporary name next to it, then renamed, so it appears with its marker or not at all.
  A deploy root that exists is left as it is: with the marker it is rollout8's; without it, it was there before
  (`marked: false`): rollout8 deploys into it and never marks it, so reset never removes it. A path no deploy root
  may be (`/`, relative, a `.` or `..` segment, a system directory, also once symlinks are resolved) fails.
- `state: absent` (the reset role): removes the deploy root only when it is a directory (not a link, not a mount
  point, no other filesystem mounted inside) holding the marker, the marker naming this path; and never `/`, a
  relative path or one with `.` or `..`, a top-level directory or a system directory, even with a marker. Anything
  else is refused, not failed: `refused` says why and nothing is touched. A deploy root that is not there is no
  change.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule

MARKER = ".rollout8-deploy-root"
# The system's top-level directories and the usual mount points: never a deploy root, never removed.
SYSTEM_TOP = frozenset(("bin", "boot", "data", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "lost+found",
                        "media", "mnt", "opt", "proc", "root", "run", "sbin", "snap", "srv", "sys", "tmp", "usr",
                        "var"))
# ... and those whose every direct subdirectory is the system's too (/usr/local, /var/lib, /etc/ssh, /home/<user>).
SYSTEM_TREES = frozenset(("bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "proc", "root",
                          "run", "sbin", "snap", "sys", "usr", "var"))


def path_problem(path: str, removing: bool) -> str:
    """Why `path` can never be a deploy root (to make or to remove), or "" when it may be one."""
    if not path.startswith("/"):
        return "is not an absolute path"
    segments = path.split("/")[1:]
    if segments == [""]:
        return "is / (the whole filesystem)"
    if any(part in (".", "..") for part in segments):
        return "has a .. (or .) segment"
    if "" in segments:
        return "has an empty segment (// or a trailing /)"
    if len(segments) == 1 and segments[0] in SYSTEM_TOP:
        return "is a system directory"
    if len(segments) == 1 and removing:
        return "is a top-level directory"
    if len(segments) == 2 and segments[0] in SYSTEM_TREES:
        return "is a system directory"
    return ""


def problem(path: str, removing: bool) -> str:
    """path_problem() of the path as given and of where it leads once symlinks are resolved."""
    found = path_problem(path, removing)
    if found:
        return found
    real = os.path.realpath(path)
    if real != path:
        found = path_problem(real, removing)
        if found:
            return f"leads to {real}, which {found}"
    return ""


def marker_text(path: str, run: str) -> str:
    note = {"created_by": "rollout8", "path": path, "run": run,
            "note": "rollout8 made this directory as the run's deploy root; reset.yml with "
                    "rollout8_reset_remove_artifacts=true removes it, and only a directory holding this file naming "
                    "its path"}
    return json.dumps(note, indent=1, sort_keys=True) + "\n"


def marker_problem(path: str) -> str:
    """Why the directory `path` does not carry rollout8's marker for itself (said of it), or "" when it does."""
    marker = os.path.join(path, MARKER)
    try:
        info = os.lstat(marker)
    except OSError:
        return f"has no {MARKER} (rollout8 did not make it)"
    if not stat.S_ISREG(info.st_mode) or info.st_size > 65536:
        return f"has a {MARKER} that is not the small file rollout8 writes"
    try:
        with open(marker) as handle:
            note = json.load(handle)
    except (OSError, ValueError):
        return f"has a {MARKER} that is not rollout8's JSON note"
    if not isinstance(note, dict) or note.get("created_by") != "rollout8":
        return f"has a {MARKER} that does not say rollout8 made it"
    if note.get("path") != path:
        return f"has a {MARKER} naming another directory ({note.get('path')})"
    return ""


def foreign_mount(path: str) -> str:
    """A mount point at or inside `path` (not following links), or ""."""
    if os.path.ismount(path):
        return path
    device = os.lstat(path).st_dev
    for top, dirs, _ in os.walk(path):
        for name in dirs:
            inner = os.path.join(top, name)
            if os.lstat(inner).st_dev != device:
                return inner
    return ""


def make(module: AnsibleModule, path: str, run: str, mode: int) -> None:
    found = problem(path, removing=False)
    if found:
        module.fail_json(msg=f"deploy root {path} {found}: refused, nothing was sent; name a directory of its own "
                             "for deploy.root in the run spec", path=path)
    if os.path.lexists(path):
        if not os.path.isdir(path):
            module.fail_json(msg=f"deploy root {path} exists and is not a directory: refused, nothing was sent",
                             path=path)
        mark = marker_problem(path)
        msg = (f"{path} is rollout8's (its {MARKER})" if not mark else
               f"{path} was there before rollout8 (it {mark}): the run's files go into it; reset never removes it")
        module.exit_json(changed=False, path=path, created=False, marked=not mark, msg=msg)
    if module.check_mode:
        module.exit_json(changed=True, path=path, created=True, marked=True, msg=f"{path} would be made")
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o755, exist_ok=True)
    fresh = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.rollout8-", dir=parent)
    try:
        with open(os.path.join(fresh, MARKER), "w") as handle:
            handle.write(marker_text(path, run))
        os.chmod(os.path.join(fresh, MARKER), 0o644)
        os.chmod(fresh, mode)
        os.rename(fresh, path)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    module.exit_json(changed=True, path=path, created=True, marked=True, msg=f"{path} made, with its {MARKER}")


def remove(module: AnsibleModule, path: str) -> None:
    def refuse(why: str) -> None:
        module.exit_json(changed=False, path=path, removed=False, refused=why,
                         msg=f"left {path} in place: it {why}; reset removes only a deploy root rollout8 made, "
                             "never / or a system directory")

    found = problem(path, removing=True)
    if found:
        refuse(found)
    if not os.path.lexists(path):
        module.exit_json(changed=False, path=path, removed=False, refused="", msg=f"{path} is not there")
    if os.path.islink(path):
        refuse("is a symbolic link")
    if not os.path.isdir(path):
        refuse("is not a directory")
    mark = marker_problem(path)
    if mark:
        refuse(mark)
    mount = foreign_mount(path)
    if mount:
        refuse(f"is or holds a mount point ({mount})")
    if not module.check_mode:
        try:
            shutil.rmtree(path)
        except OSError as exc:
            module.fail_json(msg=f"removing {path} failed: {exc}", path=path)
    module.exit_json(changed=True, path=path, removed=True, refused="", msg=f"removed {path}")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "run": {"type": "str", "default": ""},
            "mode": {"type": "str", "default": "0755"},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    if module.params["state"] == "absent":
        remove(module, path)
    try:
        mode = int(module.params["mode"], 8)
    except ValueError:
        module.fail_json(msg=f"mode {module.params['mode']!r} is not an octal mode")
    make(module, path, module.params["run"], mode)


if __name__ == "__main__":
    main()
