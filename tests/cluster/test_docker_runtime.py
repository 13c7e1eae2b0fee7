"""The image role's refusals of an image built for another architecture, on this machine as the one node.

The production runtime itself (the training image built by `make image`'s own stages, distributed, the training
containers, Ray and the jobs inside them, reset.yml) is walked on the simulated cluster by test_demo_runtime.py;
here, train.yml with rollout8_runtime=docker against this machine's own daemon needs only a one-file image.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import simcluster
from conftest import REPO, docker_available, one_line

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]

CONTAINER = "rollout8-train-citest"
HOME = "/tmp/r8d-home"  # short: Ray's unix socket paths live under it
ROOT = "/tmp/r8d-runs/tiny-cpu-docker"


def playbook(work: Path, spec: Path, image: str, tarball: Path | None, *extra: str, name: str = "train.yml"):
    args = {"rollout8_runtime": "docker", "rollout8_job_kind": "probe", "rollout8_image": image,
            "rollout8_image_tarball": str(tarball) if tarball else "",
            "rollout8_container_name": CONTAINER, "rollout8_container_shm_size": "512m", "rollout8_home": HOME,
            # the stand-in stack keeps its Python in a venv; the real stack installs into /usr/local/bin (default)
            "rollout8_container_bin": "/opt/rollout8/venv/bin",
            "rollout8_ray_port": 26379, "rollout8_ray_dashboard_port": 28265, "rollout8_ray_num_cpus": 1,
            "rollout8_ray_object_store_bytes": 100000000, "rollout8_preflight_min_disk_gb": 1,
            "rollout8_preflight_min_shm_gb": 0.25, "rollout8_job_timeout_s": 600, "rollout8_job_poll_s": 5,
            "ansible_python_interpreter": sys.executable}
    inventory = simcluster.DOCKER_INVENTORY
    run = simcluster.run_playbook(inventory, spec, work, work / "facts", "-e", json.dumps(args), *extra, playbook=name)
    (work / f"{name}.log").write_text(run.output)
    return run.rc, run.output


def docker_spec(work: Path) -> Path:
    """The simulated cluster's run spec, for one node with this test's deploy root, on shared storage: the models
    and data are read where they are (this machine's .cache/cluster/run, outside the deploy root and any shared
    directory), which only a training container that mounts them can do."""
    run_spec = simcluster.prepare_run(REPO / ".cache" / "cluster" / "run")
    spec = work / "docker-run.yaml"
    text = run_spec.read_text().replace("nnodes: 3", "nnodes: 1").replace("name: tiny-cpu-sim", "name: tiny-cpu-docker")
    text = text.replace("  root: /var/lib/rollout8/runs/tiny-cpu-sim", f"  root: {ROOT}\n  shared_storage: true")
    # one node, this machine: no data NIC to name (its interfaces have other names than the simulated nodes')
    text = re.sub(r"\n  network:\n    nic: \S+[^\n]*", "", text)
    assert "shared_storage: true" in text
    text = text.replace(" tiny/", f" {run_spec.parent}/tiny/").replace(" data/", f" {run_spec.parent}/data/")
    spec.write_text(text)
    return spec


def foreign_arch_tarball(path: Path, tag: str, arch: str) -> None:
    """A one-file image whose config says `arch`, in `docker save`'s layout (docker import ignores --platform
    without the experimental daemon, and no arm64 base can be pulled here)."""
    def add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as lt:
        add(lt, "hello", b"hi\n")
    diff = hashlib.sha256(layer.getvalue()).hexdigest()
    config = json.dumps({"architecture": arch, "os": "linux", "config": {"Cmd": ["/hello"]},
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff}"]}}).encode()
    cid = hashlib.sha256(config).hexdigest()
    with tarfile.open(path, "w") as tf:
        add(tf, f"{diff}/layer.tar", layer.getvalue())
        add(tf, f"{cid}.json", config)
        add(tf, "manifest.json", json.dumps([{"Config": f"{cid}.json", "RepoTags": [tag],
                                              "Layers": [f"{diff}/layer.tar"]}]).encode())


def test_image_of_another_architecture_is_refused(tmp_path_factory):
    """An arm64 image for an x86_64 node (or the reverse, on an Atlas A2 cluster): refused in one line naming both,
    before the tarball is copied; and an image already on the node is refused before any container starts."""
    reason = docker_available()
    if reason:
        pytest.skip(reason)
    simcluster.wheelhouse()
    work = tmp_path_factory.mktemp("foreign-arch")
    spec = docker_spec(work)
    node_arch = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
    foreign = "arm64" if node_arch == "amd64" else "amd64"
    tag = f"rollout8-test/foreign:{foreign}"
    raw = work / "raw.tar"
    foreign_arch_tarball(raw, tag, foreign)
    subprocess.run(["docker", "load", "-i", str(raw)], capture_output=True, check=True)
    tarball = work / "foreign.tar"
    try:
        subprocess.run(["bash", str(REPO / "scripts" / "image-save.sh"), tag, str(tarball)], capture_output=True,
                       check=True)
        assert json.loads(Path(f"{tarball}.json").read_text())["architecture"] == foreign
        subprocess.run(["docker", "rmi", tag], capture_output=True, check=True)

        rc, out = playbook(work, spec, tag, tarball, "--tags", "image")
        out = one_line(out)
        assert rc != 0
        line = f"holds {tag} for {foreign}"
        assert line in out and f"the node is {platform.machine()} ({node_arch})" in out and "Nothing was copied" in out
        assert not (Path(HOME) / "images" / tarball.name).exists()
        assert subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode != 0

        # the tarball names another image than the inventory: refused the same way
        rc, out = playbook(work, spec, "rollout8/stack:other", tarball, "--tags", "image")
        out = one_line(out)
        assert rc != 0 and "but rollout8_image is rollout8/stack:other" in out, out[-3000:]

        # already on the node (loaded by hand): refused after inspection, no container started
        subprocess.run(["docker", "load", "-i", str(raw)], capture_output=True, check=True)
        rc, out = playbook(work, spec, tag, None, "--tags", "image,runtime")
        out = one_line(out)
        assert rc != 0 and f"image {tag} is built for {foreign}" in out, out[-3000:]
        assert "no container was started from it" in out
        assert subprocess.run(["docker", "inspect", CONTAINER], capture_output=True).returncode != 0
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
