#!/usr/bin/python
"""What preflight needs to know of a node in one round trip, on the node's own Python (Python 3.7 compatible): the free
space of the filesystem that will hold `path` (its nearest existing ancestor) and its device number (two paths on
one filesystem share it), the same of `checkpoint_path` when given (where verl's checkpoints land:
`checkpoint_existing`, `checkpoint_free_bytes`, `checkpoint_device`), the size of /dev/shm, the node's clock,
whether rsync is on PATH, the machine's architecture as the kernel names it (`machine`: aarch64 on a Kunpeng node),
and the Python running this module (`python`, `python_version`) with the version of its
`requests` library (`requests`, empty when it cannot be imported: the community.docker modules that load the image
and start the training container need it in this same Python). With `docker: true`, what the training container's
start depends on in the node's runtime: Docker's init binary (`docker_init_name` as `docker info` names it,
`docker_init`: where it is, "" when the daemon would not find it: some distribution packages of Docker 18.09/20.10
leave it out, and the container runs with --init), whether Docker labels containers for SELinux
(`docker_selinux`), and SELinux's mode (`selinux`: Enforcing, Permissive or Disabled; `getenforce` where it exists,
else /sys/fs/selinux/enforce). Reads only; `changed` is always false.
"""


import json
import os
import subprocess
import sys
import time
from shutil import disk_usage, which

from ansible.module_utils.basic import AnsibleModule


def requests_version():
    """The version of the `requests` this Python imports, or "" (absent, or broken: an import that fails)."""
    try:
        import requests  # noqa: F401 (only whether it imports)
    except Exception:  # an ImportError, or a broken install failing in its own import
        return ""
    return str(getattr(requests, "__version__", "unknown"))


# where dockerd looks for its init binary when docker info names it without a path (after its own PATH)
DOCKER_LIBEXEC = ("/usr/local/libexec/docker", "/usr/libexec/docker", "/usr/local/lib/docker", "/usr/lib/docker")


def read(argv, timeout=30):
    """(rc, stdout) of one bounded call; (127, "") when it cannot run."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                              universal_newlines=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return 127, ""
    return proc.returncode, proc.stdout


def docker_runtime(path_env):
    """Docker's init binary (name, where it is or ""), whether Docker labels containers for SELinux, and SELinux's
    mode, as a dict of docker_init_name, docker_init, docker_selinux, selinux."""
    out = {"docker_init_name": "", "docker_init": "", "docker_selinux": False, "selinux": "Disabled"}
    rc, text = read(["docker", "info", "--format", "{{json .InitBinary}} {{json .SecurityOptions}}"])
    if rc == 0 and text.strip():
        try:
            name, options = [json.loads(part) for part in text.strip().split(" ", 1)]
        except ValueError:
            name, options = "", []
        out["docker_init_name"] = name or ""
        out["docker_selinux"] = any("name=selinux" in str(option) for option in options or [])
        if name and os.path.isabs(name):
            out["docker_init"] = name if os.access(name, os.X_OK) else ""
        elif name:
            out["docker_init"] = which(name, path=os.pathsep.join([path_env] + list(DOCKER_LIBEXEC))) or ""
    getenforce = which("getenforce", path=os.pathsep.join([path_env, "/usr/sbin", "/usr/bin", "/sbin"]))
    if getenforce:
        rc, text = read([getenforce])
        if rc == 0 and text.strip():
            out["selinux"] = text.strip().split()[0]
    elif os.path.exists("/sys/fs/selinux/enforce"):
        with open("/sys/fs/selinux/enforce") as handle:
            out["selinux"] = "Enforcing" if handle.read().strip() == "1" else "Permissive"
    return out


def nearest_existing(path):
    """path, or its nearest ancestor that exists (what will hold it once it is made)."""
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return probe


def main():
    module = AnsibleModule(argument_spec={"path": {"type": "str", "required": True},
                                          "checkpoint_path": {"type": "str", "required": False, "default": None},
                                          "docker": {"type": "bool", "required": False, "default": False}},
                           supports_check_mode=True)
    path = module.params["path"]
    probe = nearest_existing(path)
    checkpoint = {}
    if module.params["checkpoint_path"]:
        held = nearest_existing(module.params["checkpoint_path"])
        checkpoint = {"checkpoint_path": module.params["checkpoint_path"], "checkpoint_existing": held,
                      "checkpoint_free_bytes": disk_usage(held).free, "checkpoint_device": os.stat(held).st_dev}
    shm = disk_usage("/dev/shm").total if os.path.isdir("/dev/shm") else 0
    runtime = docker_runtime(os.environ.get("PATH", "")) if module.params["docker"] else {}
    module.exit_json(changed=False, path=path, existing=probe, free_bytes=disk_usage(probe).free, shm_bytes=shm,
                     device=os.stat(probe).st_dev, time=int(time.time()), rsync=which("rsync") or "",
                     machine=os.uname()[4], python=sys.executable,
                     python_version=".".join(str(part) for part in sys.version_info[:3]),
                     requests=requests_version(), **dict(checkpoint, **runtime))


if __name__ == "__main__":
    main()
