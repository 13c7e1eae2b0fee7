#!/usr/bin/python
"""What preflight needs to know of a node in one round trip, on the node's own Python (Python 3.7 compatible): the free
space of the filesystem that will hold `path` (its nearest existing ancestor) and its device number (two paths on
one filesystem share it), the same of `checkpoint_path` when given (where verl's checkpoints land:
`checkpoint_existing`, `checkpoint_free_bytes`, `checkpoint_device`), the size of /dev/shm, the node's clock,
whether rsync is on PATH, the machine's architecture as the kernel names it (`machine`: aarch64 on a Kunpeng node),
and the Python running this module (`python`, `python_version`) with the version of its
`requests` library (`requests`, empty when it cannot be imported: the community.docker modules that load the image
and start the training container need it in this same Python). Reads only; `changed` is always false.
"""


import os
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
                                          "checkpoint_path": {"type": "str", "required": False, "default": None}},
                           supports_check_mode=True)
    path = module.params["path"]
    probe = nearest_existing(path)
    checkpoint = {}
    if module.params["checkpoint_path"]:
        held = nearest_existing(module.params["checkpoint_path"])
        checkpoint = {"checkpoint_path": module.params["checkpoint_path"], "checkpoint_existing": held,
                      "checkpoint_free_bytes": disk_usage(held).free, "checkpoint_device": os.stat(held).st_dev}
    shm = disk_usage("/dev/shm").total if os.path.isdir("/dev/shm") else 0
    module.exit_json(changed=False, path=path, existing=probe, free_bytes=disk_usage(probe).free, shm_bytes=shm,
                     device=os.stat(probe).st_dev, time=int(time.time()), rsync=which("rsync") or "",
                     machine=os.uname()[4], python=sys.executable,
                     python_version=".".join(str(part) for part in sys.version_info[:3]),
                     requests=requests_version(), **checkpoint)


if __name__ == "__main__":
    main()
