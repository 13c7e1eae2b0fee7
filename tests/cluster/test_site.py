"""The simulated site's unkind traits (virtual/sim_nodes.py), as an Atlas site has them, each survived by the demo
or refused in one line before anything on the nodes changes:

- a node whose login user has another uid:gid (OTHER_UID_NODE): the demo's containers run as one uid:gid
  (rollout8_container_user in virtual/inventory/group_vars); left to the login users' ids, refused naming both;
- a node without a default route (NO_ROUTE_NODE): the demo names its data NIC; with nothing named, refused naming
  the node and the knob (before, a raw Jinja error: ansible_default_ipv4 has no address there);
- the login users' homes on a root-squashed share (HOMES_DIR): Ansible's temporary files stay off them
  (ansible.cfg's remote_tmp) and a `copy` under become works;
- the shared directory root-squashed: a stage directory the squashed root (nobody) cannot reach is refused before
  any byte of the image is sent (docker load reads the tarball as root).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import sim_demo
import simcluster
import yaml
from conftest import Cluster, Run, one_line

NO_SUCH_IMAGE = "sha256:" + "0" * 64  # an id no node has: every node needs the image


def absolute_spec(cluster: Cluster) -> dict:
    """The tests' run spec with its paths made absolute, to be written elsewhere."""
    spec = yaml.safe_load(cluster.spec.read_text())
    base = cluster.spec.parent
    spec["model"] = {k: (str((base / v).resolve()) if k in ("bf16", "int8", "profile") else v)
                     for k, v in spec["model"].items()}
    spec["data"] = {k: str((base / v).resolve()) for k, v in spec["data"].items()}
    return spec


def test_a_node_whose_login_uid_differs_is_refused_naming_both_ids(sim_cluster: Cluster, converged: Run):
    assert converged.rc == 0, converged.output[-3000:]
    refused = sim_cluster.playbook("--tags", "preflight", "-e", "rollout8_container_user=", timeout=300)
    out = one_line(refused.output).replace("''", "'")  # the YAML callback doubles a quote
    assert refused.rc != 0, out[-3000:]
    uid, other = simcluster.NODE_UID, simcluster.OTHER_UID
    same = ", ".join(n for n in simcluster.NODES if n != simcluster.OTHER_UID_NODE)
    assert (f"the training container would run as different uid:gid on different nodes ({uid}:{uid} on {same}; "
            f"{other}:{other} on {simcluster.OTHER_UID_NODE}; from the login user's ids)") in out, out[-3000:]
    assert f'Set rollout8_container_user: "{uid}:{uid}" for the cluster in group_vars' in out
    assert "TASK [preflight" not in out and "TASK [Guard]" not in out
    assert all(r["changed"] == 0 for r in refused.recap().values()), refused.recap()


def test_a_node_without_a_default_route_and_no_nic_named_is_refused_naming_it(sim_cluster: Cluster,
                                                                               converged: Run, tmp_path: Path):
    """A one-node run on the node without a default route (a multi-node one without a data NIC is refused by the
    plan already), its NIC named nowhere."""
    assert converged.rc == 0, converged.output[-3000:]
    node = simcluster.NO_ROUTE_NODE
    assert "default" not in sim_cluster.node(node, "ip", "route").stdout
    inventory = tmp_path / "inventory" / "hosts.ini"
    inventory.parent.mkdir()
    text = simcluster.INVENTORY.read_text()
    address = next(line.split("ansible_host=")[1] for line in text.splitlines() if line.startswith(node + " "))
    head, rest = text.split("[cluster:children]", 1)
    inventory.write_text(f"[head]\n{node} ansible_host={address}\n\n[workers]\n\n[cluster:children]{rest}")
    os.symlink(simcluster.INVENTORY.parent / "group_vars", inventory.parent / "group_vars")
    spec = absolute_spec(sim_cluster)
    spec["cluster"].update(nnodes=1)
    spec["cluster"].pop("network", None)
    one = tmp_path / "one-node.yaml"
    one.write_text(yaml.safe_dump(spec, sort_keys=False))
    refused = simcluster.run_playbook(inventory, one, sim_cluster.work, sim_cluster.facts, *sim_demo.image_args(one),
                                      "--tags", "preflight", "-e", "rollout8_cluster_nic=", "-e",
                                      "rollout8_plan_check=false", timeout=300)
    out = one_line(refused.output).replace("''", "'")  # the YAML callback doubles a quote
    assert refused.rc != 0, out[-3000:]
    assert (f"{node}: no default route, and neither rollout8_cluster_nic, the run spec's cluster.network.nic nor "
            "rollout8_node_address names its cluster address: set rollout8_cluster_nic") in out, out[-3000:]
    assert "TASK [preflight" not in out
    assert all(r["changed"] == 0 for r in refused.recap().values()), refused.recap()


def test_a_stage_directory_the_squashed_root_cannot_reach_is_refused_before_any_send(sim_cluster: Cluster,
                                                                                    converged: Run, tmp_path: Path):
    """The shared directory without search permission for others: docker load (root, squashed to nobody) could not
    read the tarball there. Every node that would load is refused, naming the directory, and nothing is sent. The
    tarball is a stand-in whose `make image-save` record names an image no node has (the probe comes before any
    byte of it is read)."""
    assert converged.rc == 0, converged.output[-3000:]
    image = simcluster.train_image()
    tarball = tmp_path / "standin.tar"
    tarball.write_bytes(b"not sent")
    (tmp_path / "standin.tar.json").write_text(json.dumps({"image": image, "id": NO_SUCH_IMAGE,
                                                           "architecture": "amd64", "os": "linux", "size": 8}))
    spec = absolute_spec(sim_cluster)
    spec["cluster"]["shared_dir"] = simcluster.SHARED_DIR  # the image goes there once, every node loads it there
    shared = tmp_path / "shared.yaml"
    shared.write_text(yaml.safe_dump(spec, sort_keys=False))
    export = simcluster.SHARED_HOST
    mode = export.stat().st_mode & 0o7777
    export.chmod(0o750)
    try:
        refused = sim_cluster.playbook("--tags", "image", "-e", "rollout8_image_id=", "-e",
                                       f"rollout8_image_tarball={tarball}", spec=shared, timeout=300)
    finally:
        export.chmod(mode)
    out = one_line(refused.output).replace("''", "'")  # the YAML callback doubles a quote
    assert refused.rc != 0, out[-3000:]
    for node in simcluster.NODES:
        assert (f"{node}: {simcluster.SHARED_DIR} does not let others search it (as nobody, 65534: `docker load` "
                "reads the tarball as root") in out, out[-3000:]
    assert "Nothing was sent." in out
    assert "TASK [image : Send the tarball" not in out and "TASK [image : Docker load" not in out
    assert not list(export.rglob("standin.tar")), "the tarball was sent"


def test_ansibles_temporary_files_stay_off_the_squashed_homes(sim_cluster: Cluster, converged: Run):
    """The login user's home is on a root-squashed share: a `copy` under become (the file staged by the login user in
    Ansible's remote temporary directory, moved into place by root) stages it under /tmp (ansible.cfg's remote_tmp),
    never in that home, and works there."""
    assert converged.rc == 0, converged.output[-3000:]
    node = simcluster.OTHER_UID_NODE
    home = sim_cluster.node(node, "getent", "passwd", simcluster.NODE_USER).stdout.split(":")[5]
    assert home == f"{simcluster.HOMES_DIR}/{simcluster.NODE_USER}", home
    assert "rootsquash" in sim_cluster.node(node, "findmnt", "-n", "-o", "SOURCE", simcluster.HOMES_DIR).stdout
    env = dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(sim_cluster.facts), ANSIBLE_NOCOLOR="1")
    copy = subprocess.run([str(simcluster.REPO / ".venv" / "bin" / "ansible"), node, "-i", str(simcluster.INVENTORY),
                           "-b", "-vvv", "-m", "ansible.builtin.copy", "-a",
                           "content=probe dest=/tmp/rollout8-copy-probe mode=0644"],
                          cwd=simcluster.ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=120)
    assert copy.returncode == 0, copy.stdout[-2000:] + copy.stderr[-2000:]
    staged = re.findall(r"mkdir -p \"` echo (\S+) `\"", copy.stdout)
    # (the node's shell expands ${USER}: one directory per login user)
    assert staged and all(path.startswith("/tmp/.ansible-") for path in staged), staged
