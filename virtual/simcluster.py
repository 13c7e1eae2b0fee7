"""The simulated cluster: three Debian bookworm containers on a user-defined Docker network (virtual/README.md).

The entry point and the module the tests and benchmarks import (`import simcluster`, with virtual/ on sys.path);
the work lives in the modules beside it, each re-exported here under its old name:
- sim_images.py: the base image (debootstrap + docker import), the wheelhouse and the rollout8 wheel, the stack,
  node, stand-in stack and training images, each cached by content; the disk guards;
- sim_nodes.py: the network and the node containers (up, down), the shared directory, the inventories,
  run_playbook (ansible-playbook against the nodes);
- sim_runs.py: the run specs (the shipped tiny-cpu spec, the tests' copy, the bf16 twin) and their artifacts;
- sim_demo.py: `make demo` and `make demo-compare`, and the verdict read back from the collected logs.

`python virtual/simcluster.py up` builds what is missing and starts the nodes; `down` removes containers and
network; `wheel` prints the bundle wheel's path; `demo` is `make demo` (`up`, then configs/runs/tiny-cpu.yaml
through ansible/train.yml, then the verdict); `compare` is `make demo-compare` (the same spec with int8 and with
bf16 rollouts, then one `rollout8 report`). Extra arguments of demo and compare go to ansible-playbook.
"""

from __future__ import annotations

import sys

import sim_registry
from sim_demo import DEMO_WORK, compare, demo, job_kind, latest_job_logs, probe_verdict, run_jobs, verl_verdict
from sim_images import (
    BASE_IMAGE,
    BUILD_FILES,
    BUILDER,
    CPU_ADAPTATIONS,
    CPU_UNUSED,
    IMAGE_DISK_GB,
    NODE_ACCESS,
    NODE_COMMAND,
    NODE_LAYER,
    NODE_UID,
    NODE_USER,
    OLD_BASE_IMAGE,
    REPO,
    STANDIN_LAYER,
    STANDIN_PATH,
    bundle_inputs,
    bundle_wheel,
    content_key,
    docker_ok,
    free_gb,
    need_disk,
    node_image,
    sh,
    stack_image,
    standin_stack_image,
    train_image,
    train_tarball,
    wheelhouse,
)
from sim_nodes import (
    ANSIBLE_DIR,
    BASTION,
    BASTION_MAX_STARTUPS,
    CONTROLLER_VENV,
    DATA_NETWORK,
    DATA_NIC,
    DOCKER_INVENTORY,
    FIREWALL_CONF,
    GROUP_VARS,
    HERE,
    HOMES_DIR,
    HOMES_HOST,
    INVENTORY,
    LABEL,
    LOOPBACK_HOSTNAME_NODE,
    NETWORK,
    NO_ROUTE_NODE,
    NODE_MODELS,
    NODE_PRIVILEGE,
    NODES,
    OLD_PYTHON_NODE,
    OTHER_UID,
    OTHER_UID_NODE,
    RECAP,
    SHARED_DIR,
    SHARED_EXPORT,
    SHARED_HOST,
    SHARED_MODELS,
    SSH_DIR,
    Run,
    access,
    address,
    controller_venv,
    daemons_up,
    data_address,
    documented_ports,
    down,
    firewall_rules,
    inventory_ssh,
    node_volume,
    own_export,
    prerequisites,
    rsync_over_inventory,
    run_playbook,
    up,
    write_inventory,
)
from sim_runs import (
    MODEL_PRESET,
    SHIPPED_SPEC,
    bf16_twin,
    clear_demo_runs,
    demo_runs,
    demo_spec,
    from_scratch,
    full_gc_twin,
    prepare_run,
)

__all__ = [
    # sim_images
    "BASE_IMAGE", "BUILD_FILES", "BUILDER", "CPU_ADAPTATIONS", "CPU_UNUSED", "IMAGE_DISK_GB", "NODE_ACCESS",
    "NODE_COMMAND", "NODE_LAYER", "NODE_UID", "NODE_USER", "OLD_BASE_IMAGE", "REPO", "STANDIN_LAYER", "STANDIN_PATH",
    "bundle_inputs", "bundle_wheel", "content_key", "docker_ok", "free_gb", "need_disk", "node_image",
    "sh", "stack_image", "standin_stack_image", "train_image", "train_tarball", "wheelhouse",
    # sim_nodes
    "ANSIBLE_DIR", "BASTION", "BASTION_MAX_STARTUPS", "DATA_NETWORK", "DATA_NIC", "DOCKER_INVENTORY", "GROUP_VARS",
    "HERE", "HOMES_DIR", "HOMES_HOST", "INVENTORY", "LABEL",
    "LOOPBACK_HOSTNAME_NODE", "NETWORK", "NO_ROUTE_NODE", "NODE_PRIVILEGE", "NODES", "OLD_PYTHON_NODE", "OTHER_UID",
    "OTHER_UID_NODE", "RECAP", "SHARED_DIR",
    "SHARED_EXPORT",
    "SHARED_HOST", "SHARED_MODELS", "NODE_MODELS", "CONTROLLER_VENV", "controller_venv",
    "SSH_DIR", "FIREWALL_CONF", "Run", "access", "address", "data_address",
    "daemons_up", "documented_ports", "down", "firewall_rules", "node_volume", "own_export", "prerequisites",
    "run_playbook", "up", "write_inventory", "inventory_ssh", "rsync_over_inventory",
    # sim_runs
    "MODEL_PRESET", "SHIPPED_SPEC", "bf16_twin", "clear_demo_runs", "demo_runs", "demo_spec", "from_scratch",
    "full_gc_twin",
    "prepare_run",
    # sim_demo
    "DEMO_WORK", "compare", "demo", "job_kind", "run_jobs", "latest_job_logs", "probe_verdict", "verl_verdict",
]

USAGE = "usage: simcluster.py up|down|wheel|controller-venv|demo|compare [ansible-playbook args]"


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "up"
    if command == "up":
        up()
        print(demo_spec())
    elif command == "down":
        down()
        sim_registry.stop()  # one a demo left running (it stops its own when it ends); its storage stays
        clear_demo_runs()  # the next `make demo` finds new nodes: its run starts anew
    elif command == "wheel":
        print(bundle_wheel())
    elif command == "controller-venv":
        print(controller_venv())
    elif command == "demo":
        return demo(*argv[1:])
    elif command == "compare":
        return compare(*argv[1:])
    else:
        raise SystemExit(USAGE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
