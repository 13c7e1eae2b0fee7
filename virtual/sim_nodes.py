"""The simulated cluster's nodes: three containers on two Docker networks, and Ansible against them.

What this module owns: the node containers (rollout8-sim-head, -w1, -w2) of the node image and their networks, made
idempotently by `up` and removed by `down`, with the bastion every node is reached through; how Ansible reaches them
(ssh through the bastion as the non-root login user with passwordless sudo, a key the cluster makes, the inventory
`up` writes); the simulated shared filesystem (one host directory every node mounts at the same path); the
inventories (the one `up` writes, virtual/inventory-docker); and `run_playbook`, ansible-playbook from .venv against
them, as `make demo`, the cluster tests and the benchmarks run it (`Run`: exit code, output, wall time, PLAY RECAP).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sim_images import (
    NODE_COMMAND,
    NODE_UID,
    NODE_USER,
    REPO,
    _prune_superseded,
    content_key,
    docker_ok,
    node_image,
    prerequisites,
    sh,
)

# Two networks per node, as an Atlas node has a management NIC and a data (RoCE) NIC: the management network holds
# the default route and the controller's ssh; the data network (internal: no gateway, no route out) is the one the
# cluster must use, and the only one whose job ports the firewall opens. node-init.sh names the data interface
# DATA_NIC (Docker numbers the interfaces in no fixed order across restarts), as a real node's name is fixed.
NETWORK = "rollout8-sim"
DATA_NETWORK = "rollout8-sim-data"
DATA_NIC = "data0"
# The node whose hostname resolves to 127.0.1.1, as Debian's and Ubuntu's installers write /etc/hosts.
LOOPBACK_HOSTNAME_NODE = "rollout8-sim-w2"
# The node as old as the vendors' (sim_images.OLD_BASE_IMAGE: Python 3.9, no python3-requests).
OLD_PYTHON_NODE = "rollout8-sim-w1"
NODES = ("rollout8-sim-head", "rollout8-sim-w1", "rollout8-sim-w2")
# The node whose login user has another uid:gid than on the others (node-init.sh), as on a site whose nodes were set
# up one by one: the demo's training containers run as one uid:gid (rollout8_container_user in
# virtual/inventory/group_vars/cluster.yml); without it the facts play refuses the cluster naming both ids.
OTHER_UID_NODE = "rollout8-sim-w1"
OTHER_UID = 1001
# The node without a default route (node-init.sh), as air-gapped nodes often are: its cluster address comes from the
# data NIC the inventory names; with none named it is refused, naming it.
NO_ROUTE_NODE = "rollout8-sim-w2"
# Every node is reached through one bastion (ssh ProxyJump), as an Atlas cluster behind its jump host: the nodes'
# firewall takes ssh from the bastion only, and the bastion's sshd takes few unauthenticated connections at once
# (MaxStartups start:rate:full, far below sshd's default 10:30:100, which 16+ nodes at once exceed): a connection
# it drops is carried by ansible.cfg's ssh retries. It is a container of the node image running sshd alone. Its
# start is the node count: the nodes' retries come back all at once (Ansible's pauses have no jitter), and a
# lower start would drop one of them at random on every attempt.
BASTION = "rollout8-sim-bastion"
BASTION_MAX_STARTUPS = "3:50:6"
BASTION_COMMAND = ("sh", "-c", "ssh-keygen -A && mkdir -p /run/sshd && "
                   f"exec /usr/sbin/sshd -D -e -o MaxStartups={BASTION_MAX_STARTUPS}")
LABEL = "rollout8.sim=1"
HERE = REPO / "virtual"
# The inventory `up` writes (the nodes' addresses change with every container): the sample's shape, its group
# variables from virtual/inventory/group_vars, the login user and key of the cluster's access.
INVENTORY = REPO / ".cache" / "cluster" / "inventory" / "hosts.ini"
GROUP_VARS = HERE / "inventory" / "group_vars"
SSH_DIR = REPO / ".cache" / "cluster" / "ssh"
DOCKER_INVENTORY = HERE / "inventory-docker" / "hosts.ini"
ANSIBLE_DIR = REPO / "ansible"
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@dataclass
class Run:
    """One ansible-playbook run: exit code, output, wall time."""

    rc: int
    output: str
    seconds: float

    def failure(self, lines: int = 4) -> str:
        """The last fatal and msg lines of the run, joined on one line (a bench's error, whose log goes with it)."""
        found = [line for line in self.output.splitlines() if "fatal:" in line or "msg:" in line]
        return " | ".join(found[-lines:])[-1500:]

    def recap(self) -> dict[str, dict[str, int]]:
        tail = self.output.rsplit("PLAY RECAP", 1)[-1]
        return {m[0]: {"ok": int(m[1]), "changed": int(m[2]), "unreachable": int(m[3]), "failed": int(m[4])}
                for m in RECAP.findall(tail)}


# The controller's environment as a jump host has it (scripts/controller-env.sh: ansible-core and the rollout8 CLI,
# no torch), from which `make demo` drives the cluster; the tests' playbooks run from .venv unless they ask for it.
CONTROLLER_VENV = REPO / ".cache" / "controller-venv"


def controller_venv() -> Path:
    """CONTROLLER_VENV, made (or brought up to date with pyproject.toml's pins) when it is not; returns it."""
    key = content_key("controller", ("pyproject.toml", "scripts/controller-env.sh"))
    stamp = CONTROLLER_VENV / ".made-by"
    if not stamp.is_file() or stamp.read_text() != key:
        subprocess.run(["bash", "scripts/controller-env.sh"], cwd=REPO, check=True,
                       env=dict(os.environ, VENV=str(CONTROLLER_VENV)))
        stamp.write_text(key)
    return CONTROLLER_VENV


def run_playbook(inventory: Path, spec: Path, work: Path, facts: Path, *args: str,
                 playbook: str = "train.yml", timeout: int = 900, stream: bool = False,
                 controller: Path | None = None) -> Run:
    """ansible-playbook against the simulated cluster, as `make demo` runs it (bounded by timeout): from .venv, or
    from the controller environment given (CONTROLLER_VENV: no torch, the rollout8 CLI it holds).

    With stream=True its output is also printed line by line as it comes (the demo's progress)."""
    venv = controller or REPO / ".venv"
    env = dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(facts), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_NOCOLOR="1", PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
    cmd = [str(venv / "bin" / "ansible-playbook"), "-i", str(inventory), playbook,
           "-e", f"rollout8_run_spec={spec}", "-e", f"rollout8_work_dir={work}", *args]
    work.mkdir(parents=True, exist_ok=True)
    (work / "last-playbook.cmd").write_text(" ".join(cmd) + "\n")  # which controller ran it
    start = time.monotonic()
    if stream:
        proc = subprocess.Popen(cmd, cwd=ANSIBLE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        timer = threading.Timer(timeout, proc.kill)  # bounded like the captured run below
        timer.start()
        lines = []
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                lines.append(line)
            rc = proc.wait()
        finally:
            timer.cancel()
        run = Run(rc, "".join(lines), time.monotonic() - start)
    else:
        proc = subprocess.run(cmd, cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=timeout)
        run = Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)
    (work / "last-playbook.log").write_text(run.output)
    note_time(run, playbook, args)
    return run


# Where the simulated cluster's playbook time goes (CI's budget is spent here): one line per run, appended.
PLAYBOOK_TIMES = REPO / ".cache" / "playbook-times.tsv"


def note_time(run: Run, playbook: str, args: tuple[str, ...]) -> None:
    """Append the run's seconds, rc, the test that ran it (pytest's PYTEST_CURRENT_TEST) and its arguments."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "-").split(" ")[0]
    shown = " ".join(a for a in args if not a.startswith("{"))[:300]  # JSON extra-vars are long and say little
    PLAYBOOK_TIMES.parent.mkdir(parents=True, exist_ok=True)
    with PLAYBOOK_TIMES.open("a") as out:
        out.write(f"{time.strftime('%H:%M:%S')}\t{run.seconds:.1f}\t{run.rc}\t{test}\t{playbook} {shown}\n")


# The simulated shared filesystem (an NFS mount on a real cluster): one host directory every node mounts at the
# same path, for cluster.shared_dir (verl's checkpoints, resumed after a node failure). As NFS exports are by
# default, it squashes root: each node gets the raw directory at SHARED_EXPORT and serves it at SHARED_DIR through
# virtual/rootsquash.py (node-init.sh), so root on a node writes as nobody; the export belongs to the login user's
# uid (NODE_UID, the same on every node), whom the training container runs as by default.
SHARED_HOST = REPO / ".cache" / "cluster" / "shared"
SHARED_DIR = "/mnt/rollout8-shared"
SHARED_EXPORT = "/srv/rollout8-export"
# A second shared export, for models and data (on a real cluster often an NFS export of its own, beside the one
# holding checkpoints), mounted at NODE_MODELS on every node and not on this machine: the controller is a jump host
# that never mounts the models. SHARED_MODELS is the file server's disk, outside the controller's work tree (the
# checkout), where the simulator puts what the nodes read: the demo's models and data (sim_runs.demo_spec) and the
# tests'. A run spec with deploy.shared_storage names its artifacts there, outside cluster.shared_dir; the head
# plans it (train.yml's head plan play), and only training containers that mount those paths can read them.
SHARED_MODELS = Path(os.environ.get("ROLLOUT8_SIM_MODELS", "/var/lib/rollout8-sim/models"))
NODE_MODELS = "/mnt/rollout8-models"
# The login users' homes, as on many sites an NFS export with root_squash: each node's own directory here, at
# HOMES_EXPORT on the node, served at HOMES_DIR through virtual/rootsquash.py (node-init.sh), the login user's home
# moved there. Root (Ansible's become) cannot read what the login user writes in it: Ansible's remote temporary
# directory must not be there (ansible.cfg's remote_tmp).
HOMES_HOST = REPO / ".cache" / "cluster" / "homes"
HOMES_EXPORT = "/srv/rollout8-homes"
HOMES_DIR = "/nfs-home"
# Each node's own Docker daemon keeps its data root (the images it loaded) on the node's volume: what a real node's
# disk is. It outlives the container stopped and started (a re-run of `make demo` finds the training image loaded);
# `down` removes it, and so does replacing the container (up: a new machine).
# The daemon needs what --privileged gives, less CAP_SYS_RESOURCE: a sandbox whose Docker lacks a capability
# refuses --privileged outright ("unable to apply caps"), seen on the machines this project runs on.
NODE_PRIVILEGE = ("--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE", "--device", "/dev/fuse",
                  "--security-opt", "seccomp=unconfined",
                  "--security-opt", "apparmor=unconfined", "--security-opt", "systempaths=unconfined")


def node_volume(name: str) -> str:
    return f"{name}-docker"


def up() -> str:
    """The network and the node containers of the current node image, idempotently: a container of the same
    image and mount is started if stopped and otherwise left alone; any other is replaced. Then the access: the
    cluster's login key authorized for the login user on every node, their host keys known, the inventory
    written. Returns the image."""
    prerequisites()
    image = node_image()
    images = {name: node_image(old=True) if name == OLD_PYTHON_NODE else image for name in NODES}
    for shared in (SHARED_HOST, SHARED_MODELS, *(HOMES_HOST / name for name in NODES)):
        shared.mkdir(parents=True, exist_ok=True)
    own_export()
    for network, internal in ((NETWORK, False), (DATA_NETWORK, True)):
        if not docker_ok("network", "inspect", network):
            sh("docker", "network", "create", "--label", LABEL, *(["--internal"] if internal else []), network,
               capture=True)
    for name in NODES:
        mounts = sorted([f"{SHARED_HOST}:{SHARED_EXPORT}", f"{SHARED_MODELS}:{NODE_MODELS}",
                         f"{HOMES_HOST / name}:{HOMES_EXPORT}", f"{node_volume(name)}:/var/lib/docker"])
        want = sorted(mounts + [f"net:{NETWORK}", f"net:{DATA_NETWORK}"] + [f"env:{e}" for e in node_env(name)])
        state = sh("docker", "inspect", "-f", "{{.State.Running}} {{.Config.Image}} {{range .Mounts}}"
                   "{{if .Name}}{{.Name}}{{else}}{{.Source}}{{end}}:{{.Destination}} {{end}}"
                   "{{range $net, $_ := .NetworkSettings.Networks}}net:{{$net}} {{end}}"
                   '{{range .Config.Env}}env:{{.}} {{end}}', name,
                   check=False, capture=True)
        fields = [f for f in state.stdout.split() if not f.startswith("env:") or f.startswith("env:ROLLOUT8_SIM_")]
        if state.returncode == 0 and fields[1] == images[name] and sorted(fields[2:]) == want:
            if fields[0] != "true":
                sh("docker", "start", name, capture=True)
            continue
        sh("docker", "rm", "-f", name, check=False, capture=True)
        # A replaced node is a new machine: its disk goes with it. Kept, its daemon would restart the old node's
        # training container (restart: unless-stopped) and Docker would make that container's bind-mount sources
        # in the new node's file system, the deploy root among them, without rollout8's marker: the next converge
        # fills a deploy root "there before rollout8" and reset leaves it (seen in CI, whose clone's new paths
        # replace the nodes while the volumes of the last session's cluster survive). The image is loaded again.
        sh("docker", "volume", "rm", "-f", node_volume(name), check=False, capture=True)
        # created on the management network (the default route), the data network connected before it boots
        sh("docker", "create", "--name", name, "--hostname", name, "--network", NETWORK, "--label", LABEL,
           "--init", "--shm-size", "512m", *NODE_PRIVILEGE, *(arg for m in mounts for arg in ("-v", m)),
           *(arg for e in node_env(name) for arg in ("-e", e)), images[name], *NODE_COMMAND, capture=True)
        sh("docker", "network", "connect", DATA_NETWORK, name, capture=True)
        sh("docker", "start", name, capture=True)
    bastion_up(image)
    for each in set(images.values()):
        _prune_superseded(each)  # an older node image, in use until its containers were replaced just now
    daemons_up()
    firewall()
    access()
    print(f">> simulated cluster up: {', '.join(NODES)} (inventory {INVENTORY.relative_to(REPO)}, ssh as "
          f"{NODE_USER})", file=sys.stderr)
    return image


def node_env(name: str) -> list[str]:
    """The node's traits, as node-init.sh reads them from its environment (part of what `up` compares: a node
    with other traits is replaced)."""
    env = [f"ROLLOUT8_SIM_DATA_NIC={DATA_NIC}", f"ROLLOUT8_SIM_LOGIN_USER={NODE_USER}",
           f"ROLLOUT8_SIM_HOMES={HOMES_DIR}"]
    if name == LOOPBACK_HOSTNAME_NODE:
        env.append("ROLLOUT8_SIM_HOSTNAME_LOOPBACK=1")
    if name == OTHER_UID_NODE:
        env.append(f"ROLLOUT8_SIM_LOGIN_UID={OTHER_UID}")
    if name == NO_ROUTE_NODE:
        env.append("ROLLOUT8_SIM_NO_DEFAULT_ROUTE=1")
    return sorted(env)


def bastion_up(image: str) -> None:
    """The bastion container of the node image on the management network, idempotently (left alone when running
    that image and command)."""
    state = sh("docker", "inspect", "-f", '{{.State.Running}} {{.Config.Image}} {{join .Config.Cmd " "}}', BASTION,
               check=False, capture=True)
    if state.returncode == 0 and state.stdout.strip() == f"true {image} {' '.join(BASTION_COMMAND)}":
        return
    sh("docker", "rm", "-f", BASTION, check=False, capture=True)
    sh("docker", "run", "-d", "--name", BASTION, "--hostname", BASTION, "--network", NETWORK, "--label", LABEL,
       "--init", image, *BASTION_COMMAND, capture=True)


def own_export() -> None:
    """The shared export belongs to the login user's uid, as a file server's admin sets it up for the cluster's
    users: everything in it, so what an earlier version wrote as root (checkpoints, the image tarball this machine
    saved there) stays usable, mode 0755 (root on a node, squashed to nobody, cannot write there)."""
    SHARED_HOST.chmod(0o755)
    for path in [SHARED_HOST, *SHARED_HOST.rglob("*")]:
        if not path.is_symlink() and (path.stat().st_uid, path.stat().st_gid) != (NODE_UID, NODE_UID):
            os.chown(path, NODE_UID, NODE_UID)


def access() -> Path:
    """How Ansible reaches the running nodes, made again (a restarted container may have a new address): the
    cluster's login key authorized for the login user on every node, their host keys known, the inventory written
    with their addresses. Returns the inventory."""
    addresses = {name: address(name) for name in NODES}
    key = login_key()
    bastion = address(BASTION)
    for name in (BASTION, *NODES):
        authorize(name, key.with_suffix(".pub").read_text())
    known_hosts(addresses, bastion)
    return write_inventory(INVENTORY.parent, addresses, key, bastion=bastion)


# The nodes' firewall, as openEuler's and Kylin's firewalld: input dropped but for ssh and what README.md's
# "Firewall" block opens, from the cluster's network only. Its ports are read from that block (between the
# markers), not from the roles: a port the product uses and the README does not document fails the demo.
FIREWALL_BLOCK = re.compile(r"<!-- firewall:begin -->(.*?)<!-- firewall:end -->", re.S)
FIREWALL_PORT = re.compile(r"--add-port=(\d+(?:-\d+)?)/tcp")
FIREWALL_CONF = "/etc/nftables.conf"  # what Debian's nftables.service loads at boot; node-init.sh does too


def documented_ports(readme: Path = REPO / "README.md") -> list[str]:
    """The TCP ports and ranges the README's firewall rule opens between nodes ("6379-6386", ...)."""
    block = FIREWALL_BLOCK.search(readme.read_text())
    ports = FIREWALL_PORT.findall(block.group(1)) if block else []
    if not ports:
        raise SystemExit(f"{readme}: no firewall-cmd --add-port=.../tcp lines between the firewall markers")
    return ports


def firewall_rules(subnet: str, ports: list[str], ssh_from: str | None = None) -> str:
    """An nftables ruleset: input policy drop; loopback, replies, ICMP and ssh (from ssh_from only, when given: the
    bastion) accepted; the documented ports from the cluster's subnet only."""
    return "\n".join([
        "#!/usr/sbin/nft -f",
        "# the simulated node's firewall (virtual/sim_nodes.py, from README.md's Firewall block)",
        "flush ruleset",
        "table inet filter {",
        "  chain input {",
        "    type filter hook input priority filter; policy drop;",
        "    iif lo accept",
        "    ct state established,related accept",
        "    meta l4proto { icmp, ipv6-icmp } accept",
        f"    {f'ip saddr {ssh_from} ' if ssh_from else ''}tcp dport 22 accept",
        f"    ip saddr {subnet} tcp dport {{ {', '.join(ports)} }} accept",
        "  }",
        "}", ""])


def firewall() -> None:
    """Every node's firewall set to the documented rule, the job's ports open from the data network only, ssh from
    the bastion only (written where the node loads it at boot, and loaded)."""
    subnet = sh("docker", "network", "inspect", "-f", "{{(index .IPAM.Config 0).Subnet}}", DATA_NETWORK,
                capture=True).stdout.strip()
    rules = firewall_rules(subnet, documented_ports(), ssh_from=address(BASTION))
    for name in NODES:
        load = subprocess.run(["docker", "exec", "-i", name, "sh", "-c",
                               f"cat > {FIREWALL_CONF} && nft -f {FIREWALL_CONF}"],
                              input=rules, text=True, capture_output=True, timeout=60)
        if load.returncode != 0:
            raise SystemExit(f"{name}: its firewall did not load ({FIREWALL_CONF}): {load.stderr.strip()[-400:]}")


def daemons_up(attempts: int = 120) -> None:
    """Wait until every node's own Docker daemon answers (bounded: attempts x 0.5 s); its log names why not."""
    for name in NODES:
        for _ in range(attempts):
            if sh("docker", "exec", name, "docker", "info", "-f", "{{.ServerVersion}}", check=False,
                  capture=True).returncode == 0:
                break
            time.sleep(0.5)
        else:
            log = sh("docker", "exec", name, "tail", "-n", "5", "/var/log/dockerd.log", check=False, capture=True)
            raise SystemExit(f"{name}: its Docker daemon does not answer after {attempts // 2} s: "
                             f"{(log.stdout + log.stderr).strip()[-400:]}")


def address(name: str, network: str = NETWORK) -> str:
    """The node's address on the management network (the controller reaches it there by ssh, as a real node's), or
    on another of its networks."""
    out = sh("docker", "inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}', name,
             capture=True).stdout.strip()
    if not out:
        raise SystemExit(f"{name} has no address on the {network} network: `make demo-down`, then again")
    return out


def data_address(name: str) -> str:
    """The node's address on the data network: its cluster address (Ray, Gloo, the job's ports)."""
    return address(name, DATA_NETWORK)


def login_key() -> Path:
    """The cluster's ssh login key (made once; the controller's side of the nodes' authorized_keys)."""
    key = SSH_DIR / "id_ed25519"
    if not key.exists():
        SSH_DIR.mkdir(parents=True, exist_ok=True)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rollout8-sim", "-f", str(key), capture=True)
    return key


def authorize(name: str, public_key: str) -> None:
    """The login key in the login user's authorized_keys on the node (what a cluster's provisioning does), written
    as the login user: a node's home is on a root-squashed share (HOMES_HOST), where root writes as nobody."""
    subprocess.run(["docker", "exec", "-i", "-u", NODE_USER, name, "sh", "-c",
                    f'umask 077; h=$(getent passwd {NODE_USER} | cut -d: -f6); mkdir -p "$h/.ssh" && '
                    'cat > "$h/.ssh/keys.new" && mv "$h/.ssh/keys.new" "$h/.ssh/authorized_keys"'],
                   input=public_key, text=True, check=True, capture_output=True)


def known_hosts(addresses: dict[str, str], bastion: str, attempts: int = 60) -> None:
    """The bastion's and the nodes' host keys, read once sshd answers (bounded: attempts x 0.5 s), into the
    cluster's known_hosts: the bastion's from here, the nodes' from the bastion (the only place they take ssh
    from), as an operator reads them."""
    lines = []
    for name, ip in {BASTION: bastion, **addresses}.items():
        via = () if name == BASTION else ("docker", "exec", BASTION)
        for _ in range(attempts):
            scan = sh(*via, "ssh-keyscan", "-T", "2", "-t", "ed25519", ip, check=False, capture=True)
            if scan.stdout.strip():
                lines.append(scan.stdout.strip())
                break
            time.sleep(0.5)
        else:
            logs = sh("docker", "logs", "--tail", "5", name, check=False, capture=True)
            raise SystemExit(f"{name}: sshd does not answer on {ip}:22 after {attempts // 2} s: "
                             f"{(logs.stdout + logs.stderr).strip()[-300:]}")
    (SSH_DIR / "known_hosts").write_text("\n".join(lines) + "\n")


def write_inventory(directory: Path, addresses: dict[str, str], key: Path, bastion: str | None = None) -> Path:
    """The simulated cluster's inventory, shaped like ansible/inventory/sample (only addresses and user differ):
    hosts.ini and a copy of virtual/inventory/group_vars in directory. With a bastion (its address), the nodes are
    reached through it (ProxyJump to the Host block of an ssh config written beside the key: its address, the login
    user, key and known hosts; ssh hands -F on to the jump)."""
    head, *workers = addresses
    known = key.parent / "known_hosts"
    ssh_args = f"-o UserKnownHostsFile={known}"
    if bastion:
        config = key.parent / "config"
        config.write_text(f"# Written by virtual/sim_nodes.py: the simulated cluster's bastion\nHost {BASTION}\n"
                          f"  HostName {bastion}\n  User {NODE_USER}\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
                          f"  UserKnownHostsFile {known}\n")
        ssh_args = f"-F {config} {ssh_args} -o ProxyJump={BASTION}"
    lines = ["# Written by virtual/sim_nodes.py (`make demo`, the cluster tests) for the containers of this machine.",
             "[head]", f"{head} ansible_host={addresses[head]}", "", "[workers]",
             *(f"{w} ansible_host={addresses[w]}" for w in workers), "", "[cluster:children]", "head", "workers", "",
             "[cluster:vars]",
             "# a login user with passwordless sudo: the plays become root on the nodes",
             f"ansible_user={NODE_USER}",
             "ansible_python_interpreter=/usr/bin/python3",
             f"ansible_ssh_private_key_file={key}",
             f"ansible_ssh_common_args={ssh_args}", ""]
    directory.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(directory / "group_vars", ignore_errors=True)
    shutil.copytree(GROUP_VARS, directory / "group_vars")
    (directory / "hosts.ini").write_text("\n".join(lines))
    return directory / "hosts.ini"


def inventory_ssh(inventory: Path = INVENTORY) -> dict[str, list[str]]:
    """How Ansible reaches each host of an inventory written by write_inventory: {host: ssh argv up to the
    command}, from its own settings (ansible_host, ansible_user, the key, ansible_ssh_common_args: the bastion's
    ProxyJump included). The one way a benchmark or a test reaches a node over ssh, so none keeps a command line of
    its own that the inventory has outgrown (a node that takes ssh from the bastion only times out on a direct one)."""
    hosts: dict[str, str] = {}
    settings: dict[str, str] = {}
    section = ""
    for raw in inventory.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section == "cluster:vars":
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
        elif section in ("head", "workers"):
            name, *pairs = line.split()
            hosts[name] = dict(p.split("=", 1) for p in pairs).get("ansible_host", name)
    base = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=20"]
    if "ansible_ssh_private_key_file" in settings:
        base += ["-i", settings["ansible_ssh_private_key_file"]]
    base += shlex.split(settings.get("ansible_ssh_common_args", ""))
    if "ansible_user" in settings:
        base += ["-l", settings["ansible_user"]]
    return {name: [*base, address] for name, address in hosts.items()}


def rsync_over_inventory(inventory: Path = INVENTORY) -> tuple[str, dict[str, str]]:
    """(rsync's --rsh, {host: address}) from the same settings as inventory_ssh."""
    argv = inventory_ssh(inventory)
    rsh = " ".join(shlex.quote(a) for a in next(iter(argv.values()))[:-1]) if argv else "ssh"
    return rsh, {name: a[-1] for name, a in argv.items()}


def down(keep_images: bool = False) -> None:
    """Remove the node containers, their volumes (each node's Docker data: the images it loaded, unless
    keep_images) and the networks (images, wheelhouse and the shared directory stay)."""
    sh("docker", "rm", "-f", BASTION, check=False, capture=True)
    for name in NODES:
        sh("docker", "rm", "-f", name, check=False, capture=True)
        if not keep_images:
            sh("docker", "volume", "rm", node_volume(name), check=False, capture=True)
    for network in (NETWORK, DATA_NETWORK):
        sh("docker", "network", "rm", network, check=False, capture=True)
    print(">> simulated cluster removed", file=sys.stderr)
