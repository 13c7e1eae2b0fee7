"""`make demo` walks the production path: ssh as a non-root user with sudo, a Docker daemon per node, the training
image distributed through the shared storage, the training containers started by the runtime role, Ray inside
them, the real verl GRPO job with int8 rollouts across nodes, its checkpoint on the shared storage.

The demo runs once for the module (warm after `make demo`: every node has the image, nothing is sent); the tests
read what it left on the nodes, the shared directory and the collected logs.
"""

from __future__ import annotations

import configparser
import functools
import re
import subprocess

import conftest
import pytest
import sim_demo
import simcluster
from conftest import docker_available

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]

CONTAINER = "rollout8-train"  # the runtime role's default name
on_node = functools.partial(conftest.on_node, timeout=120)  # every command here takes seconds


@pytest.fixture(scope="module")
def demo_job():
    reason = docker_available()
    if reason:
        pytest.skip(reason)
    assert sim_demo.demo() == 0, f"make demo failed: see {sim_demo.DEMO_WORK / 'last-playbook.log'}"
    job = sim_demo.latest_job_logs(sim_demo.DEMO_WORK)
    assert job is not None and sim_demo.job_kind(job) == "verl", f"no verl job collected under {sim_demo.DEMO_WORK}"
    return job


def test_inventory_is_ssh_as_a_non_root_user_with_become(demo_job):
    inventory = configparser.ConfigParser(allow_no_value=True, delimiters=("=",))
    inventory.read_string(simcluster.INVENTORY.read_text())
    cluster_vars = dict(inventory["cluster:vars"])
    assert cluster_vars["ansible_user"] == simcluster.NODE_USER != "root"
    # ssh, Ansible's default connection: none is named in the inventory, its group variables or the demo's
    for path in (simcluster.INVENTORY, *simcluster.INVENTORY.parent.rglob("*.yml"), sim_demo.DOCKER_RUNTIME_VARS):
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
        # Ray runs inside it (the node's own processes hold no raylet of the host runtime)
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


def test_the_checkpoint_is_on_the_shared_storage(demo_job):
    steps = sorted((simcluster.SHARED_HOST / "tiny-cpu").glob("*/checkpoints/global_step_3"))
    assert steps, f"no checkpoint of step 3 under {simcluster.SHARED_HOST / 'tiny-cpu'}"
    assert any(p.is_file() and p.stat().st_size > 0 for p in steps[-1].rglob("*")), f"{steps[-1]} holds no file"


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
    run = simcluster.run_playbook(simcluster.INVENTORY, simcluster.SHIPPED_SPEC, sim_demo.DEMO_WORK,
                                  sim_demo.DEMO_WORK / "facts", simcluster.bundle_wheel(),
                                  "-e", f"@{sim_demo.DOCKER_RUNTIME_VARS}", "-e", f"rollout8_image={image}",
                                  "-e", f"rollout8_image_tarball={tarball}", "--tags", "image", timeout=600)
    assert run.rc == 0, run.output[-3000:]
    for task in ("Send the tarball (rsync, resumable)", "Docker load"):
        block = run.output.split(f"TASK [image : {task}]", 1)[1].split("TASK [", 1)[0]
        assert "changed:" not in block and "ok:" not in block, f"{task}:\n{block}"
    # the shared copy the demo's play may have sent is gone once every node loaded it; this run sent none
    assert all(r["changed"] == 0 for r in run.recap().values()), run.recap()


def test_nodes_holding_different_images_under_one_tag_are_refused_naming_them():
    """No tarball and no rollout8_image_id (a registry's tag): the nodes must still hold one image; three daemons
    with three builds under the same tag are refused, each node named with its id, before any container starts."""
    reason = docker_available()
    if reason:
        pytest.skip(reason)
    simcluster.up()
    tag = "rollout8-test/odd:1"
    ids = {}
    try:
        for node in simcluster.NODES:
            on_node(node, "sh", "-c", f"mkdir -p /tmp/odd && echo {node} > /tmp/odd/which && "
                                      f"tar -C /tmp/odd -c which | docker import - {tag}")
            ids[node] = on_node(node, "docker", "image", "inspect", "-f", "{{.Id}}", tag).stdout.strip()
        assert len(set(ids.values())) == 3
        run = simcluster.run_playbook(simcluster.INVENTORY, simcluster.SHIPPED_SPEC, sim_demo.DEMO_WORK,
                                      sim_demo.DEMO_WORK / "facts", simcluster.bundle_wheel(),
                                      "-e", f"@{sim_demo.DOCKER_RUNTIME_VARS}", "-e", f"rollout8_image={tag}",
                                      "--tags", "image", timeout=600)
        assert run.rc != 0
        line = " ".join(run.output.split())
        assert f"{tag} is not one image on every node" in line, run.output[-3000:]
        for node, image_id in ids.items():
            assert f"{node} has {image_id}" in line
    finally:
        for node in simcluster.NODES:
            on_node(node, "docker", "rmi", "-f", tag, check=False)
