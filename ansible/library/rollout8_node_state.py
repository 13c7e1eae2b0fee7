#!/usr/bin/python
"""What preflight needs to know of a node in one round trip, on the node's own Python (Python 3.7 compatible):
the free space of the filesystem that will hold `path` (its nearest existing ancestor), the size of /dev/shm, the
node's clock and whether rsync is on PATH. Reads only; `changed` is always false.
"""


import os
import time
from shutil import disk_usage, which

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={"path": {"type": "str", "required": True}}, supports_check_mode=True)
    path = module.params["path"]
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    shm = disk_usage("/dev/shm").total if os.path.isdir("/dev/shm") else 0
    module.exit_json(changed=False, path=path, existing=probe, free_bytes=disk_usage(probe).free, shm_bytes=shm,
                     time=int(time.time()), rsync=which("rsync") or "")


if __name__ == "__main__":
    main()
