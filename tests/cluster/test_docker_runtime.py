"""The production runtime, run for real: train.yml with rollout8_runtime=docker on this machine (one node).

The training image is built in the test (the simulated node image plus the bundle wheel), saved as the tarball
`make image-save` would write, removed, and loaded back by the image role; the runtime role starts the training
container (host network); Ray runs inside it; the smoke job must be green; reset.yml removes it all.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import simcluster
from conftest import REPO, docker_available

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]

CONTAINER = "rollout8-train-citest"
HOME = "/tmp/r8d-home"  # short: Ray's unix socket paths live under it
ROOT = "/tmp/r8d-runs/tiny-cpu-docker"


def playbook(work: Path, spec: Path, image: str, tarball: Path, *extra: str, name: str = "train.yml"):
    args = {"rollout8_runtime": "docker",
            "rollout8_job_kind": "smoke", "rollout8_image": image, "rollout8_image_tarball": str(tarball),
            "rollout8_container_name": CONTAINER, "rollout8_container_shm_size": "512m", "rollout8_home": HOME,
            # the test image keeps its Python in a venv; the real image uses the default /usr/local/bin
            "rollout8_container_bin": "/opt/rollout8/venv/bin",
            "rollout8_ray_port": 26379, "rollout8_ray_dashboard_port": 28265, "rollout8_ray_num_cpus": 1,
            "rollout8_ray_object_store_bytes": 100000000, "rollout8_preflight_min_disk_gb": 1,
            "rollout8_preflight_min_shm_gb": 0.25, "rollout8_job_timeout_s": 600, "rollout8_job_poll_s": 5,
            "ansible_python_interpreter": sys.executable}
    inventory = simcluster.DOCKER_INVENTORY
    run = simcluster.run_playbook(inventory, spec, work, work / "facts", simcluster.bundle_wheel(),
                                  "-e", json.dumps(args), *extra, playbook=name)
    (work / f"{name}.log").write_text(run.output)
    return run.rc, run.output


def test_docker_runtime_one_node_on_this_machine(tmp_path_factory):
    reason = docker_available()
    if reason:
        pytest.skip(reason)
    simcluster.wheelhouse()  # cached by content; rebuilds the bundle wheel
    image = simcluster.train_image(simcluster.bundle_wheel())
    work = tmp_path_factory.mktemp("docker-runtime")
    # The tarball is the image's full size (GBs): written for this run only and removed at the end, never cached
    # (a cache keyed by the bundle wheel kept one per code change and filled CI's disk).
    tarball = work / f"{image.replace('/', '_').replace(':', '_')}.tar"
    staged = Path(HOME) / "images" / tarball.name
    subprocess.run(["docker", "save", "-o", str(tarball), image], check=True)
    subprocess.run(["docker", "rm", "-f", CONTAINER], capture_output=True)
    subprocess.run(["docker", "rmi", image], capture_output=True, check=True)  # the image role must load it back

    run_dir = simcluster.prepare_run(REPO / ".cache" / "cluster" / "run")
    spec = work / "docker-run.yaml"
    text = run_dir.read_text().replace("nnodes: 3", "nnodes: 1").replace("name: tiny-cpu-sim", "name: tiny-cpu-docker")
    text = text.replace("/var/lib/rollout8/runs/tiny-cpu-sim", ROOT)
    text = text.replace(" tiny/", f" {run_dir.parent}/tiny/").replace(" data/", f" {run_dir.parent}/data/")
    spec.write_text(text)
    try:
        rc, out = playbook(work, spec, image, tarball)
        assert rc == 0, out[-5000:]
        assert "Docker load" in out and "changed: [localhost]" in out
        assert not staged.exists(), "the image role left its staged copy of the tarball on the node"
        assert "smoke job GREEN on all 1 nodes" in out
        inspect = json.loads(subprocess.run(["docker", "inspect", CONTAINER], capture_output=True, text=True,
                                            check=True).stdout)[0]
        assert inspect["HostConfig"]["NetworkMode"] == "host"
        assert f"FLASHRL_CONFIG={ROOT}/flashrl.yaml" in inspect["Config"]["Env"]

        # The accept-npu tag runs the NPU acceptance suite in the training container. The real image ships the
        # script (docker/Dockerfile's bundle stage); this test image gets it by docker cp. No NPU here: the play
        # must fail and say so (exit 3), never pass.
        subprocess.run(["docker", "exec", CONTAINER, "mkdir", "-p", "/opt/rollout8/scripts"], check=True)
        subprocess.run(["docker", "cp", str(REPO / "scripts" / "accept-npu.sh"),
                        f"{CONTAINER}:/opt/rollout8/scripts/accept-npu.sh"], check=True)
        rc, out = playbook(work, spec, image, tarball, "--tags", "accept-npu")
        assert rc != 0 and "no Ascend NPU on localhost (exit 3)" in out, out[-3000:]
        rc, out = playbook(work, spec, image, tarball, "-e", "rollout8_reset_confirmed=true", name="reset.yml")
        assert rc == 0, out[-3000:]
        gone = subprocess.run(["docker", "inspect", CONTAINER], capture_output=True)
        assert gone.returncode != 0
    finally:
        subprocess.run(["docker", "rm", "-f", CONTAINER], capture_output=True)
        tarball.unlink(missing_ok=True)
        staged.unlink(missing_ok=True)
