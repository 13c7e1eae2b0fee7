"""The production runtime, run for real: train.yml with rollout8_runtime=docker on this machine (one node).

The training image is built as a user builds it, from docker/Dockerfile's own `patched` and `bundle` stages
(`make image STACK_IMAGE=...`, podman here) on a CPU stand-in for the `stack` stage: the real-job engine stack
with a stand-in CANN set_env.sh (simcluster.standin_stack_image). `make image-save` writes the tarball, which the
image role loads on the node; the runtime role starts the training container (host network); Ray runs inside
it; the probe job must be green; reset.yml removes it all.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import re
import shutil
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
    run = simcluster.run_playbook(inventory, spec, work, work / "facts", simcluster.bundle_wheel(),
                                  "-e", json.dumps(args), *extra, playbook=name)
    (work / f"{name}.log").write_text(run.output)
    return run.rc, run.output


def process_env(container: str, name: str) -> str:
    """The environment of the newest process called `name` in the container, one VAR=value per line."""
    cmd = f"tr '\\0' '\\n' < /proc/$(pgrep -nx {name})/environ"
    return subprocess.run(["docker", "exec", container, "bash", "-c", cmd], capture_output=True, text=True,
                          check=True).stdout


def latest_driver_log(work: Path) -> str:
    logs = sorted((work / "logs").glob("*/driver.log"), key=lambda p: p.stat().st_mtime)
    assert logs, f"no driver log under {work / 'logs'}"
    return logs[-1].read_text(errors="replace")


def docker_spec(work: Path) -> Path:
    """The simulated cluster's run spec, for one node with this test's deploy root, on shared storage: the models
    and data are read where they are (this machine's .cache/cluster/run, outside the deploy root and any shared
    directory), which only a training container that mounts them can do."""
    run_spec = simcluster.prepare_run(REPO / ".cache" / "cluster" / "run")
    spec = work / "docker-run.yaml"
    text = run_spec.read_text().replace("nnodes: 3", "nnodes: 1").replace("name: tiny-cpu-sim", "name: tiny-cpu-docker")
    text = text.replace("  root: /var/lib/rollout8/runs/tiny-cpu-sim", f"  root: {ROOT}\n  shared_storage: true")
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


def test_docker_runtime_one_node_on_this_machine(tmp_path_factory):
    reason = docker_available()
    if reason:
        pytest.skip(reason)
    if not shutil.which(simcluster.BUILDER):
        pytest.skip(f"no {simcluster.BUILDER} to build docker/Dockerfile's stages (scripts/ci-setup.sh installs it)")
    simcluster.wheelhouse()  # cached by content; rebuilds the bundle wheel
    image = simcluster.train_image()  # in the builder's store, as after `make image`
    work = tmp_path_factory.mktemp("docker-runtime")
    spec = docker_spec(work)
    # The tarball is the image's full size (GBs): written for this run only and removed at the end, never cached
    # (a cache keyed by the bundle wheel kept one per code change and filled CI's disk).
    tarball = work / f"{image.replace('/', '_').replace(':', '_')}.tar"
    staged = Path(HOME) / "images" / tarball.name
    subprocess.run(["make", "-C", str(REPO), "--no-print-directory", "image-save", f"ENGINE={simcluster.BUILDER}",
                    f"IMAGE={image}", f"IMAGE_TARBALL={tarball}"], check=True)
    assert json.loads(Path(f"{tarball}.json").read_text())["image"] == image
    subprocess.run(["docker", "rm", "-f", CONTAINER], capture_output=True)
    subprocess.run(["docker", "rmi", "-f", image], capture_output=True)  # a previous run's
    # An older build under the same tag (here: the base image): the role compares the node's image id with the one
    # `make image-save` recorded beside the tarball, and loads the tarball instead of keeping the stale image.
    subprocess.run(["docker", "tag", simcluster.BASE_IMAGE, image], check=True)
    saved_id = json.loads(Path(f"{tarball}.json").read_text())["id"]
    saved_id = saved_id if saved_id.startswith("sha256:") else f"sha256:{saved_id}"

    try:
        rc, out = playbook(work, spec, image, tarball)
        assert rc == 0, out[-5000:]
        assert "Docker load" in out and "changed: [localhost]" in out
        loaded = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image], capture_output=True, text=True,
                                check=True).stdout.strip()
        assert loaded == saved_id, f"the node keeps {loaded}, the tarball holds {saved_id}"
        assert not staged.exists(), "the image role left its staged copy of the tarball on the node"
        assert "probe job GREEN on all 1 nodes" in out
        inspect = json.loads(subprocess.run(["docker", "inspect", CONTAINER], capture_output=True, text=True,
                                            check=True).stdout)[0]
        assert inspect["HostConfig"]["NetworkMode"] == "host"
        # the shared-storage models and data, mounted read-only at their own paths: the probe's artifacts check
        # (every file's sha256, read inside the container) is green only through them
        run_dir = REPO / ".cache" / "cluster" / "run"
        for path in (run_dir / "tiny" / "bf16", run_dir / "tiny" / "int8", run_dir / "data" / "train.parquet"):
            assert f"{path}:{path}:ro" in inspect["HostConfig"]["Binds"], inspect["HostConfig"]["Binds"]
        assert f"FLASHRL_CONFIG={ROOT}/flashrl.yaml" in inspect["Config"]["Env"]
        # built by docker/Dockerfile's bundle stage: its entrypoint, its labels
        assert inspect["Config"]["Entrypoint"] == ["/usr/local/bin/rollout8-entrypoint"]
        assert inspect["Config"]["Labels"]["io.rollout8.stack-image"].startswith("rollout8/sim-standin:")

        # CANN's environment reaches every process the roles start through `docker exec` (the image's entrypoint
        # sources set_env.sh; here a stand-in exporting a marker): Ray's raylet, the job's driver and its workers.
        assert "ROLLOUT8_CANN_STANDIN=1" in process_env(CONTAINER, "raylet")
        driver = latest_driver_log(work)
        assert "probe-job: driver cann ok   CANN environment loaded: ASCEND_TOOLKIT_HOME=" in driver, driver[-3000:]
        assert re.search(r"probe-job: \S+ \(\S+\) cann +ok   CANN environment loaded", driver), driver[-3000:]

        # The accept-npu tag runs the NPU acceptance suite the image ships in the training container. No NPU
        # here: the play must fail and say so (exit 3), never pass.
        rc, out = playbook(work, spec, image, tarball, "--tags", "accept-npu")
        assert rc != 0 and "no Ascend NPU on localhost (exit 3)" in out, out[-3000:]
        assert "accept-npu: CANN environment loaded: ASCEND_TOOLKIT_HOME=" in out, out[-3000:]

        # Without the entrypoint in front of docker exec (the roles before this fix): Ray restarts without CANN's
        # environment and the probe job is red, naming it.
        rc, out = playbook(work, spec, image, tarball, "-e", '{"rollout8_container_exec_prefix": []}',
                           "-e", "rollout8_relaunch=true")
        assert rc != 0 and "probe job RED on " in one_line(out) and "cann=FAIL" in one_line(out), out[-3000:]
        assert "ROLLOUT8_CANN_STANDIN" not in process_env(CONTAINER, "raylet")
        driver = latest_driver_log(work)
        assert "CANN is installed but its environment is not loaded in this process" in driver, driver[-3000:]
        rc, out = playbook(work, spec, image, tarball, "-e", "rollout8_reset_confirmed=true", name="reset.yml")
        assert rc == 0, out[-3000:]
        gone = subprocess.run(["docker", "inspect", CONTAINER], capture_output=True)
        assert gone.returncode != 0
    finally:
        subprocess.run(["docker", "rm", "-f", CONTAINER], capture_output=True)
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)  # GBs; the builder's store keeps it
        tarball.unlink(missing_ok=True)
        staged.unlink(missing_ok=True)
