"""The simulated cluster's images, each built once and cached by content (virtual/README.md).

What this module owns: the base image rollout8/bookworm-base:4 (scripts/make-base-image.sh: debootstrap + docker
import, no registry), the wheelhouse and the rollout8 wheel (scripts/build-wheelhouse.sh, into .cache/wheelhouse),
the stack image rollout8/sim-stack:<key> (the base with /opt/rollout8/venv installed from the wheelhouse in a
container with --network none: the air-gapped path, for real), the node image rollout8/sim-node:<key> (vLLM's CPU
adaptations, the CPU bridges, patches/ applied), the stand-in for docker/Dockerfile's `stack` stage and the
docker-runtime test's training image built on it; the disk guards every build step goes through, and the two
helpers (`sh`, `docker_ok`) the other sim_* modules run commands with.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "rollout8/bookworm-base:4"


def sh(*args: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, text=True, capture_output=capture, cwd=REPO)


def docker_ok(*args: str) -> bool:
    return sh("docker", *args, check=False, capture=True).returncode == 0


def wheelhouse() -> Path:
    out = sh("bash", "scripts/build-wheelhouse.sh", capture=True)
    sys.stderr.write(out.stderr)
    return REPO / out.stdout.strip().splitlines()[-1]


def bundle_wheel() -> Path:
    wheels = sorted((REPO / ".cache" / "wheelhouse" / "bundle").glob("rollout8-*.whl"))
    if not wheels:
        raise SystemExit("no rollout8 wheel: run `bash scripts/build-wheelhouse.sh` first")
    return wheels[-1]


def stack_image(house: Path) -> str:
    """The base plus the node stack in /opt/rollout8/venv, installed offline from the wheelhouse (minutes)."""
    image = f"rollout8/sim-stack:{hashlib.sha256(f'{BASE_IMAGE} {house.name}'.encode()).hexdigest()[:12]}"
    if docker_ok("image", "inspect", image):
        return image
    sh("bash", "scripts/make-base-image.sh")  # cached; every caller (demo, tests, bench) gets it, whatever the order
    print(f">> stack image {image}: offline install of the node stack from {house} (about 4 minutes)",
          file=sys.stderr)
    script = ("set -e; python3 -m venv /opt/rollout8/venv; P='/opt/rollout8/venv/bin/pip -q "
              "--disable-pip-version-check'; $P install --no-index --find-links /wheelhouse "
              "-r /wheelhouse/requirements.txt; $P install --no-index --no-deps --find-links /wheelhouse "
              "-r /wheelhouse/requirements-nodeps.txt; rm -rf /root/.cache/pip")
    _commit(image, BASE_IMAGE, script, f"{house.resolve()}:/wheelhouse:ro")
    return image


# What the node image adds to the stack image, each file keying the image: the engine tier's machine
# adaptations (vLLM's platform dist-info, the GLIBCXX relaxation, the CPU int8 ops), the CPU bridges of a verl
# run (virtual/cpu_bridges/), the bundle's patches (applied to FlashRL and verl as the training image does).
NODE_LAYER = ("virtual/engine/cpu_engine_support.py", "virtual/cpu_bridges/rollout8_cpu_bridges.py", "patches",
              "src/rollout8/node/patches.py", "virtual/node-init.sh")


def content_key(seed: str, names: tuple[str, ...]) -> str:
    """A 12-hex key of seed and the bytes (and repository paths) of every file under names: an image tag, a stamp."""
    digest = hashlib.sha256(seed.encode())
    for name in names:
        path = REPO / name
        for item in sorted([path] if path.is_file() else (p for p in path.rglob("*") if p.is_file()
                                                          and "__pycache__" not in p.parts)):
            digest.update(item.relative_to(REPO).as_posix().encode() + b"\0" + item.read_bytes())
    return digest.hexdigest()[:12]


def node_image(house: Path) -> str:
    """The simulated node: the stack image, machine adaptations made, the CPU bridges in site-packages,
    patches/ applied to FlashRL and verl (seconds on top of the cached stack image)."""
    stack = stack_image(house)
    image = f"rollout8/sim-node:{content_key(f'{stack} {NODE_ACCESS} {NODE_DAEMON}', NODE_LAYER)}"
    if docker_ok("image", "inspect", image):
        print(f">> node image {image} already built", file=sys.stderr)
        return image
    print(f">> node image {image}: Docker, CPU adaptations and patches on {stack}", file=sys.stderr)
    script = (f"set -e; {NODE_DAEMON}; {CPU_ADAPTATIONS}; {NODE_ACCESS}; "
              "install -m 0755 /repo/virtual/node-init.sh /usr/local/sbin/rollout8-node-init; "
              "PYTHONPATH=/repo/src $V -m rollout8 patches apply --target $S --component all")
    # the network for Debian's mirror (the Docker packages); the stack below it was installed with none
    _commit(image, stack, script, f"{REPO}:/repo:ro", network="bridge")
    return image


# How the nodes are reached, as Atlas clusters are usually set up: sshd, and a non-root login user with passwordless
# sudo (Ansible logs in as NODE_USER and becomes root). The host keys are made when a node first starts (the base
# image's, made by debootstrap, would be one key for every node); the login key is the cluster's (sim_nodes.up).
NODE_USER = "deploy"
NODE_ACCESS = (f"useradd --create-home --shell /bin/bash {NODE_USER}; "
               f"echo '{NODE_USER} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{NODE_USER}; "
               f"chmod 0440 /etc/sudoers.d/{NODE_USER}; rm -f /etc/ssh/ssh_host_*")
# Each node runs its own Docker daemon, as an Atlas node does (Debian's docker.io; python3-requests for the
# community.docker modules, which run with the node's Python).
NODE_DAEMON = ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
               "docker.io tini python3-requests >/dev/null && rm -rf /var/lib/apt/lists/*")
# The node's main process (virtual/node-init.sh): host keys on first start, the node's dockerd in the background,
# sshd in the foreground (its sessions start the training containers, or Ray and the jobs on the host runtime).
NODE_COMMAND = ("/usr/local/sbin/rollout8-node-init",)


# The simulated tier's CPU adaptations, made in the node image and in the stand-in stack alike (run with the
# repository at /repo): vLLM's CPU platform dist-info and the GLIBCXX relaxation (cpu_engine_support.py
# prepare-env), the CPU bridges of a verl run (loaded for accelerator: cpu only) in site-packages.
CPU_ADAPTATIONS = (
    "set -e; S=$(/opt/rollout8/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); "
    "V=/opt/rollout8/venv/bin/python; "
    "cp /repo/virtual/engine/cpu_engine_support.py /repo/virtual/cpu_bridges/rollout8_cpu_bridges.py $S/; "
    "$V $S/cpu_engine_support.py prepare-env")


# Free space a new image needs in docker's storage, by repository (the stack image installs GBs of wheels).
IMAGE_DISK_GB = {"rollout8/sim-stack": 12, "rollout8/sim-node": 1, "rollout8/sim-standin": 1}


def free_gb(path: str) -> float:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize / 1e9


def need_disk(path: str, gb: float, what: str) -> None:
    """Refuse in one line before a step that would run out of disk half-way (ENOSPC deep inside pip or docker)."""
    have = free_gb(path)
    if have < gb:
        raise SystemExit(f"rollout8: {what} needs about {gb:.0f} GB free under {path}, only {have:.1f} GB are: "
                         "free disk space (`docker image prune`, old clones' .cache) and re-run")


def _prune_superseded(image: str, engine: str = "docker") -> None:
    """Remove the other tags of image's repository: each is keyed by content, so an older key is superseded and
    only holds disk (a stack image is GBs). Images a container still uses stay (docker refuses; ignored)."""
    repo = image.rsplit(":", 1)[0]
    listed = sh(engine, "images", "--format", "{{.Repository}}:{{.Tag}}", check=False, capture=True).stdout.split()
    # podman names local images localhost/NAME and copies from Docker docker.io/NAME: compare without them
    def short(name: str) -> str:
        return name.split("/", 1)[1] if name.startswith(("localhost/", "docker.io/")) else name

    for old in sorted(name for name in set(listed) if short(name).rsplit(":", 1)[0] == repo and short(name) != image):
        if sh(engine, "rmi", old, check=False, capture=True).returncode == 0:
            print(f">> removed superseded image {old}", file=sys.stderr)


def _commit(image: str, base: str, script: str, volume: str, changes: tuple[str, ...] = (),
            network: str = "none") -> None:
    """Run script in a container of base, with no network by default (the air-gapped path, for real), commit it
    as image."""
    root = sh("docker", "info", "-f", "{{.DockerRootDir}}", check=False, capture=True).stdout.strip()
    need_disk(root or "/var/lib/docker", IMAGE_DISK_GB.get(image.rsplit(":", 1)[0], 1), f"building {image}")
    builder = "rollout8-sim-build-" + image.replace("/", "-").replace(":", "-")
    sh("docker", "rm", "-f", builder, check=False, capture=True)
    sh("docker", "run", "--name", builder, "--network", network, "-v", volume, base, "bash", "-c", script)
    flags = [arg for change in ('CMD ["sleep", "infinity"]', *changes) for arg in ("-c", change)]
    sh("docker", "commit", *flags, builder, image, capture=True)
    sh("docker", "rm", builder, capture=True)
    _prune_superseded(image)


# The stand-in for docker/Dockerfile's `stack` stage (the CANN, torch_npu and vLLM-Ascend build, impossible here):
# the simulated node's stack (the real-job engine stack in /opt/rollout8/venv, first on PATH as the real stack's
# python3 is), its CPU adaptations, and a stand-in CANN set_env.sh where the toolkit puts its own. On it,
# docker/Dockerfile's own `patched` and `bundle` stages build the docker-runtime test's training image with
# `make image STACK_IMAGE=...`: patches, bundle, entrypoint, labels, all as in the real image.
STANDIN_LAYER = ("virtual/engine/cpu_engine_support.py", "virtual/cpu_bridges/rollout8_cpu_bridges.py",
                 "virtual/cann-standin/set_env.sh")
STANDIN_PATH = "/opt/rollout8/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the bundle stages read besides the Dockerfile (their COPY sources and bind mounts) keys the image, with the
# Makefile and image-save.sh that build and save it.
BUILD_FILES = ("docker/Dockerfile", "Makefile", "scripts/image-save.sh")


def bundle_inputs() -> tuple[str, ...]:
    """The repository paths docker/Dockerfile's patched and bundle stages read, from the Dockerfile itself."""
    text = (REPO / "docker" / "Dockerfile").read_text()
    text = text[text.index("AS patched"):].replace("\\\n", " ")
    found = set(re.findall(r"--mount=type=bind,source=([^,\s]+)", text))
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            found.update(w for w in words[1:-1] if not w.startswith("--"))
    return tuple(sorted(found)) + BUILD_FILES


BUILDER = os.environ.get("ROLLOUT8_SIM_BUILDER", "podman")


def standin_stack_image(house: Path) -> str:
    """docker/Dockerfile's `stack` stage on CPU: the node stack, CPU adaptations, stand-in CANN (seconds)."""
    stack = stack_image(house)
    image = f"rollout8/sim-standin:{content_key(stack, STANDIN_LAYER)}"
    if docker_ok("image", "inspect", image):
        return image
    print(f">> stand-in stack image {image}: CPU adaptations and a stand-in CANN on {stack}", file=sys.stderr)
    script = (f"{CPU_ADAPTATIONS}; install -D -m 0644 /repo/virtual/cann-standin/set_env.sh "
              "/usr/local/Ascend/ascend-toolkit/set_env.sh")
    _commit(image, stack, script, f"{REPO}:/repo:ro", changes=(f"ENV PATH={STANDIN_PATH}",))
    return image


def _builder_has(image: str) -> bool:
    return sh(BUILDER, "image", "exists" if BUILDER == "podman" else "inspect", image, check=False,
              capture=True).returncode == 0


def train_image() -> str:
    """The docker-runtime test's training image, built from docker/Dockerfile's `patched` and `bundle` stages
    (`make image`, BuildKit-compatible builder: podman here, since Debian's docker 20.10 has no buildx) on the
    stand-in stack. Returns its reference; it lives in the builder's store (`make image-save` writes the tarball
    the image role loads, as for a real node)."""
    standin = standin_stack_image(wheelhouse())
    image = f"rollout8/sim-train:{content_key(standin, bundle_inputs())}"
    if _builder_has(image):
        return image
    if BUILDER == "podman" and not _builder_has(standin):
        print(f">> copying {standin} from Docker to podman's store (once per stand-in stack; minutes)",
              file=sys.stderr)
        need_disk("/var/lib/containers", IMAGE_DISK_GB["rollout8/sim-stack"], f"copying {standin} to podman")
        sh("podman", "pull", "-q", f"docker-daemon:{standin}", capture=True)
        _prune_superseded(standin, engine="podman")
    print(f">> training image {image}: docker/Dockerfile's patched and bundle stages on {standin} ({BUILDER})",
          file=sys.stderr)
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    sh("make", "--no-print-directory", "image", f"ENGINE={BUILDER}", f"IMAGE={image}", f"STACK_IMAGE={standin}",
       f"PYTHON={sys.executable}", "NO_CACHE=1", "PIP_INDEX_URL=https://pypi.org/simple",
       *([f"CA_BUNDLE={ca}"] if ca.is_file() else []))
    _prune_superseded(image, engine=BUILDER)
    return image


def train_tarball(image: str, directory: Path) -> Path:
    """The `make image-save` tarball of the training image (train_image's) in directory, written once per image
    (its name carries the image's content key; superseded ones are removed). Uncompressed: on this machine gzip
    took 4 minutes of CPU to write the 8 GB image as 4.2 GB, and every node would spend more to unpack it; the
    .tar.gz that `make image-save` writes by default is for a real network."""
    tarball = directory / f"{image.replace('/', '_').replace(':', '_')}.tar"
    record = tarball.with_name(tarball.name + ".json")
    if tarball.is_file() and record.is_file() and json.loads(record.read_text()).get("image") == image:
        return tarball
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("rollout8_sim-train_*"):
        old.unlink()
    need_disk(str(directory), IMAGE_DISK_GB["rollout8/sim-stack"], f"saving {image} to {directory}")
    print(f">> make image-save: {image} -> {tarball}", file=sys.stderr)
    sh("make", "--no-print-directory", "image-save", f"ENGINE={BUILDER}", f"IMAGE={image}",
       f"IMAGE_TARBALL={tarball}", f"PYTHON={sys.executable}")
    return tarball
