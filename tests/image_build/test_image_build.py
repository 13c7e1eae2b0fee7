"""Build what can be built of docker/Dockerfile, for real, and inspect it.

The full image needs the CANN installers and GitHub; neither is here. Its last two stages (`patched`, `bundle`)
are built for real on top of a CPU stand-in for the `stack` stage (docker/Dockerfile.ci-stack: bookworm, the real
flash-llm-rl wheel at the lock's pin, verl's released wheel whose verl/__init__.py equals the pinned commit's,
FlashRL's auto patch written by FlashRL itself), by `make image STACK_IMAGE=...` itself (every build arg from the
lock). This proves: the STACK_IMAGE hook, the CA bundle passed as a BuildKit secret (pip reaches PyPI through it
and it is in no layer), the pip cache mount (nothing cached lands in the image), the patch step
(`rollout8 patches apply` + `flashrl cleanup` on a real flash-llm-rl install), the bundle install, the OCI labels
carrying every pin, and `make test-image` running tests/image inside the result.

Builder: `docker build` with BuildKit when the buildx plugin is present, else podman (buildah), which implements
the same Dockerfile features; Debian's docker.io 20.10 CLI has no BuildKit without buildx.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollout8.lock import load_lock

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BASE = os.environ.get("ROLLOUT8_TEST_BASE_IMAGE", "rollout8/bookworm-base:4")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
WHEELS = ROOT / ".cache" / "foundation" / "wheels"
# ROLLOUT8_TEST_BUNDLE_TAG: another tag, so two checkouts on one machine do not replace each other's image
BUNDLE_TAG = os.environ.get("ROLLOUT8_TEST_BUNDLE_TAG", "rollout8-test/bundle:pytest")
# podman's default rlimits exceed what this kind of machine lets a container set
PODMAN_RUN_FLAGS = "--ulimit nofile=4096:4096 --ulimit nproc=4096:4096"


def sh(cmd: list[str], timeout: float = 900, check: bool = True, **kw) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[:6])} ... failed ({result.returncode}):\n{result.stdout[-4000:]}\n"
                             f"{result.stderr[-4000:]}")
    return result


def docker_ok() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="module")
def engine() -> str:
    if docker_ok() and subprocess.run(["docker", "buildx", "version"], capture_output=True, timeout=30).returncode == 0:
        return "docker"
    if shutil.which("podman"):
        return "podman"
    pytest.skip("no BuildKit-capable builder: the docker buildx plugin is absent and podman is not installed "
                "(scripts/ci-setup.sh installs podman)")


@pytest.fixture(scope="module")
def base_image(engine) -> str:
    """The local bookworm base (no registry is reachable), present in the builder's image store."""
    have = sh([engine, "image", "inspect", BASE], check=False).returncode == 0
    if have:
        return BASE
    if not docker_ok():
        pytest.skip(f"base image {BASE} missing and no Docker engine to make it (scripts/make-base-image.sh)")
    sh(["bash", "scripts/make-base-image.sh"], cwd=ROOT, timeout=900)
    if engine == "podman":
        save = subprocess.Popen(["docker", "save", BASE], stdout=subprocess.PIPE)
        load = subprocess.run(["podman", "load"], stdin=save.stdout, capture_output=True, text=True, timeout=600)
        save.wait(timeout=600)
        assert load.returncode == 0 and save.returncode == 0, load.stderr
    return BASE


@pytest.fixture(scope="module")
def torch_wheel() -> Path:
    """The CPU torch wheel this test environment uses (`flashrl cleanup` imports torch), fetched by pip."""
    import torch

    version = torch.__version__.split("+")[0]
    WHEELS.mkdir(parents=True, exist_ok=True)
    found = sorted(WHEELS.glob(f"torch-{version}*.whl"))
    if not found:
        result = sh([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(WHEELS), f"torch=={version}"],
                    check=False, timeout=900)
        found = sorted(WHEELS.glob(f"torch-{version}*.whl"))
        if not found:
            pytest.skip(f"no torch {version} wheel obtainable for the stand-in stack: {result.stderr[-500:]}")
    if "+cpu" not in found[0].name and found[0].stat().st_size > 400e6:
        pytest.skip(f"{found[0].name} is a CUDA build (too large for a lean CI build)")
    return found[0]


def build_cmd(engine: str) -> list[str]:
    cmd = [engine, "build"]
    if engine == "podman":
        cmd += ["--format", "docker", "--pull=never"]
    if CA_BUNDLE.is_file():
        cmd += ["--secret", f"id=ca_bundle,src={CA_BUNDLE}"]
    return cmd


@pytest.fixture(scope="module")
def stack_standin(engine, base_image, torch_wheel, tmp_path_factory) -> str:
    import transformers

    lock = load_lock()
    dockerfile = ROOT / "docker" / "Dockerfile.ci-stack"
    key = hashlib.sha256(f"{dockerfile.read_text()}{torch_wheel.name}{transformers.__version__}"
                         f"{lock.pypi['flash-llm-rl']}{base_image}".encode()).hexdigest()[:12]
    tag = f"rollout8-test/stack-standin:{key}"
    if sh([engine, "image", "inspect", tag], check=False).returncode == 0:
        return tag
    ctx = tmp_path_factory.mktemp("standin")
    (ctx / "wheels").mkdir()
    try:
        os.link(torch_wheel, ctx / "wheels" / torch_wheel.name)
    except OSError:
        shutil.copy2(torch_wheel, ctx / "wheels" / torch_wheel.name)
    shutil.copy2(dockerfile, ctx / "Dockerfile")
    sh([*build_cmd(engine), "--build-arg", f"BASE={base_image}",
        "--build-arg", f"FLASH_LLM_RL_VERSION={lock.pypi['flash-llm-rl']}",
        "--build-arg", f"TRANSFORMERS_VERSION={transformers.__version__}", "-t", tag, str(ctx)], timeout=1500)
    return tag


@pytest.fixture(scope="module")
def bundle(engine, stack_standin) -> dict:
    sh([engine, "rmi", "-f", BUNDLE_TAG], check=False)  # the previous run's image: no dangling copies pile up
    start = time.monotonic()
    # `make image` itself, every build arg from the lock. NO_CACHE: the patch step must really run here (its
    # output is asserted); the stand-in stack is an image, so only the two bundle stages are built (seconds).
    ca = [f"CA_BUNDLE={CA_BUNDLE}"] if CA_BUNDLE.is_file() else []
    result = sh(["make", "--no-print-directory", "image", f"ENGINE={engine}", f"IMAGE={BUNDLE_TAG}",
                 f"STACK_IMAGE={stack_standin}", "NO_CACHE=1", "PIP_INDEX_URL=https://pypi.org/simple",
                 f"PYTHON={sys.executable}", *ca], cwd=ROOT, timeout=1500)
    print(f"bundle stages built in {time.monotonic() - start:.0f} s")
    info = json.loads(sh([engine, "image", "inspect", BUNDLE_TAG]).stdout)[0]
    return {"log": result.stdout + result.stderr, "info": info, "stack": stack_standin}


def run_in(engine: str, *cmd: str) -> subprocess.CompletedProcess:
    flags = PODMAN_RUN_FLAGS.split() if engine == "podman" else []
    return sh([engine, "run", "--rm", *flags, BUNDLE_TAG, *cmd], check=False, timeout=600)


def test_labels_carry_every_pin(bundle):
    lock = load_lock()
    labels = bundle["info"]["Config"]["Labels"]
    for name, version in lock.pypi.items():
        assert labels[f"io.rollout8.pin.{name}"] == version
    for name, pin in lock.git.items():
        assert labels[f"io.rollout8.pin.{name}"] == pin.commit
    assert labels["io.rollout8.pin.cann"] == lock.cann.version
    assert labels["io.rollout8.pin.base-image"] == lock.base_image.reference
    assert labels["io.rollout8.lock.digest"] == lock.digest()
    assert labels["io.rollout8.stack-image"] == bundle["stack"]
    # the bundle's own identity (make image: package version, commit, repository, the commit's time)
    from rollout8 import __version__

    assert labels["org.opencontainers.image.version"] == __version__
    head = sh(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).stdout.strip()
    assert labels["org.opencontainers.image.revision"] in (head, f"{head}-dirty")
    assert labels["org.opencontainers.image.source"]
    created = sh(["git", "-C", str(ROOT), "log", "-1", "--format=%cI"]).stdout.strip()
    assert labels["org.opencontainers.image.created"] == created


def test_built_from_the_hashed_lock(engine, bundle):
    """pytest and its dependencies came from layer `bundle` (hashes required), the rollout8 wheel from the
    bundle-build stage (no hatchling in the image), and `rollout8 lock --check` ran in the build."""
    log = bundle["log"]
    assert "--require-hashes" in log or "bundle-" in log
    assert "/wheels/rollout8-" in log or "rollout8-" in log
    result = run_in(engine, "bash", "-c", "python3 -m pip show hatchling >/dev/null 2>&1 && echo has-hatchling;"
                    " ls /opt/rollout8/requirements; python3 -m pytest --version")
    out = result.stdout + result.stderr
    assert "has-hatchling" not in out, out
    assert "bundle-x86_64.txt" in out and "bundle-aarch64.txt" in out, out
    assert f"pytest {load_lock().pypi['pytest']}" in out, out


def test_patch_step_ran_on_the_real_wheel(bundle):
    log = bundle["log"]
    assert "applied now" in log or "already applied" in log, log[-3000:]
    assert "flash_rl setup removed from usercustomize.py" in log, "flashrl cleanup found no auto patch to undo"


def test_patches_applied_in_the_image(engine, bundle):
    find = "import importlib.util as u, os; print(os.path.dirname(os.path.dirname(u.find_spec('flash_rl').origin)))"
    site = f'$(python3 -c "{find}")'
    result = run_in(engine, "bash", "-c", f"rollout8 patches check --target {site}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all 4 patches applied" in result.stdout or "patches applied" in result.stdout


def test_no_secret_and_no_pip_cache_in_the_image(engine, bundle):
    env = bundle["info"]["Config"].get("Env") or []
    assert not [e for e in env if e.startswith(("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"))], env
    result = run_in(engine, "bash", "-c",
                    "test ! -e /run/secrets/ca_bundle && test ! -e /root/.cache/pip && echo clean")
    assert result.stdout.strip() == "clean", result.stdout + result.stderr
    history = sh([engine, "history", "--no-trunc", BUNDLE_TAG]).stdout
    assert "BEGIN CERTIFICATE" not in history


def test_make_smoke_runs_tests_image_in_the_image(engine, bundle):
    flags = PODMAN_RUN_FLAGS if engine == "podman" else ""
    start = time.monotonic()
    result = sh(["make", "-C", str(ROOT), "smoke", f"ENGINE={engine}", f"IMAGE={BUNDLE_TAG}",
                 f"IMAGE_TEST_FLAGS={flags}", f"PYTHON={sys.executable}"], check=False, timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert " passed" in out and "failed" not in out, out[-4000:]
    # in the image: the image-only checks run (not skipped); the NPU stack checks skip with their reason
    assert "ROLLOUT8_IN_IMAGE is not set" not in out
    assert "NPU stack not installed here" in out
    print(f"make smoke in the image: {time.monotonic() - start:.0f} s")
