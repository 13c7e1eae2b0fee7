"""The training image for linux/arm64, as an Atlas node's Kunpeng 920 runs it (issue 43, item 3, its second part).

Built under QEMU on this x86_64 machine through `make image`'s own stages: docker/Dockerfile's `patched` and `bundle`
on the arm64 stand-in of its `stack` stage (virtual/sim_arm64.py: vLLM at the x86 stand-in's version, built from
PyPI's sdist with VLLM_TARGET_DEVICE=empty as the real image builds the pinned commit; torch, Ray, FlashRL, verl
from aarch64 wheels). Then `make image-save` must record architecture arm64, the image's labels must carry every
pin, and `make smoke PLATFORM=linux/arm64` (tests/image, inside the image, run by the emulated Python) must pass.

No NPU, no vllm-ascend: this vLLM has no compiled ops and finds no platform, so no engine can run here. The checks
that need one must skip saying so (never pass by pretending): tests/engine, baked into the image, is run there too.

Tens of minutes of emulation cold, so `make test` skips it and `make arm64-image-check` runs it
(ROLLOUT8_TEST_ARM64=1), printing how long each step took.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sim_arm64  # virtual/, on pytest's pythonpath
import sim_images

from rollout8.lock import load_lock

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / ".cache" / "arm64-image"
# what tests/engine imports in the image: tests/npu's helpers and the engine harness (pytest's pythonpath in a
# checkout; scripts/accept-npu.sh sets the same)
HARNESS = "/opt/rollout8/tests/npu:/opt/rollout8/virtual/engine"


def timed(what: str, started: float) -> None:
    print(f"\n>> arm64 image: {what} in {time.monotonic() - started:.1f} s", file=sys.stderr)


def builder(*args: str, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([sim_images.BUILDER, *args], capture_output=True, text=True, timeout=timeout)


def in_image(image: str, *command: str) -> subprocess.CompletedProcess:
    """command in a container of image (the arm64 one, emulated), through the image's entrypoint."""
    return builder("run", "--rm", f"--platform={sim_arm64.PLATFORM}", *sim_arm64.RUN_FLAGS.split(), image, *command)


@pytest.fixture(scope="module")
def image() -> str:
    if os.environ.get("ROLLOUT8_TEST_ARM64") != "1":
        pytest.skip("the arm64 training image takes tens of minutes to build under QEMU: `make arm64-image-check` "
                    "runs it (ROLLOUT8_TEST_ARM64=1)")
    for tool in ("docker", sim_images.BUILDER):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool} here (scripts/ci-setup.sh installs it)")
    # asked for explicitly: no emulation is a failure with the fix, not a skip
    assert Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists(), (
        "no aarch64 emulation on this machine: as root, apt-get install qemu-user-static binfmt-support (and "
        "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc where it is not mounted)")
    started = time.monotonic()
    base = sim_images.base_image_for(sim_arm64.ARCH)
    timed(f"base image {base}", started)
    started = time.monotonic()
    house = sim_arm64.wheelhouse()
    timed(f"wheelhouse {house.name}", started)
    started = time.monotonic()
    stack = sim_arm64.stack_image(house)
    timed(f"stack image {stack}", started)
    started = time.monotonic()
    standin = sim_arm64.standin_stack_image(house)
    timed(f"stand-in stack image {standin}", started)
    started = time.monotonic()
    built = sim_arm64.train_image()
    timed(f"training image {built} (make image PLATFORM={sim_arm64.PLATFORM})", started)
    return built


def test_image_save_records_arm64_and_the_labels_carry_the_pins(image):
    started = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    tarball = OUT / f"{image.replace('/', '_').replace(':', '_')}.tar"
    try:
        saved = subprocess.run(["make", "--no-print-directory", "image-save", f"ENGINE={sim_images.BUILDER}",
                                f"IMAGE={image}", f"IMAGE_TARBALL={tarball}", f"PYTHON={sys.executable}"],
                               cwd=REPO, capture_output=True, text=True, timeout=1800)
        assert saved.returncode == 0, saved.stdout + saved.stderr
        record = json.loads(tarball.with_name(tarball.name + ".json").read_text())
    finally:
        for path in OUT.glob(tarball.name + "*"):
            path.unlink()
    timed("make image-save", started)
    assert (record["architecture"], record["os"]) == ("arm64", "linux"), record
    labels = json.loads(builder("image", "inspect", "-f", "{{json .Labels}}", image).stdout)
    lock = load_lock(REPO / "versions.lock.yaml")
    assert labels["io.rollout8.pin.flash-llm-rl"] == lock.pypi["flash-llm-rl"], labels
    assert labels["io.rollout8.pin.vllm"] == lock.git["vllm"].commit, labels
    assert labels["io.rollout8.stack-image"].startswith("rollout8/sim-standin-arm64:"), labels


def test_make_smoke_passes_in_the_arm64_image(image):
    started = time.monotonic()
    result = sim_arm64.smoke(image)
    timed("make smoke PLATFORM=linux/arm64", started)
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and " failed" not in summary and " error" not in summary, summary
    # what skips, skips for the reason there is: no NPU stack (torch_npu, vllm-ascend) in a stand-in
    reasons = set(re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", result.stdout, re.M))
    assert reasons and all("NPU stack not installed here" in r or "no Ascend NPU device" in r for r in reasons), reasons


NO_ENGINE = """
import json, platform, vllm
from importlib import metadata
from vllm.platforms import current_platform
import engine_platform
ok, why = engine_platform.engine_available()
print(json.dumps({"machine": platform.machine(), "vllm": vllm.__version__, "dist": metadata.version("vllm"),
                  "platform": type(current_platform).__name__, "engine": ok, "why": why}))
"""


def test_no_engine_runs_here_and_the_engine_tests_say_why(image):
    """vLLM with no device and no vllm-ascend: UnspecifiedPlatform, and tests/engine (in the image for Atlas nodes)
    skips every test naming that, instead of failing or passing without an engine."""
    started = time.monotonic()
    probe = in_image(image, "env", f"PYTHONPATH={HARNESS}", "python3", "-c", NO_ENGINE)
    assert probe.returncode == 0, probe.stdout + probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    timed("vLLM's platform probed", started)
    # the dist's version says how it was built (vllm.__version__ is setuptools-scm's, without the device suffix)
    assert found["machine"] == "aarch64" and found["dist"] == f"{sim_arm64.vllm_version()}+empty", found
    assert found["platform"] == "UnspecifiedPlatform" and found["engine"] is False, found
    assert "VLLM_TARGET_DEVICE=empty" in found["why"], found
    started = time.monotonic()
    run = in_image(image, "env", f"PYTHONPATH={HARNESS}", "python3", "-m", "pytest", "-p", "no:cacheprovider", "-q",
                   "-rs", "/opt/rollout8/tests/engine")
    timed("tests/engine in the image", started)
    print(run.stdout[-3000:])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"=* ?\d+ skipped in .*", summary.strip("= ")) or (
        "skipped" in summary and "passed" not in summary and "failed" not in summary), summary
    assert "VLLM_TARGET_DEVICE=empty" in run.stdout, run.stdout[-3000:]


RAY_ON_AARCH64 = """
import json, platform, subprocess, time
started = time.monotonic()
subprocess.run(["ray", "start", "--head", "--num-cpus", "1", "--resources", '{"NPU": 1}', "--disable-usage-stats",
                "--include-dashboard=false"], check=True, capture_output=True)
head = time.monotonic() - started
import ray
ray.init(address="auto")
machine = ray.get(ray.remote(resources={"NPU": 1})(lambda: platform.machine()).remote())
print(json.dumps({"machine": machine, "npu": ray.cluster_resources().get("NPU"), "head_s": round(head, 1),
                  "task_s": round(time.monotonic() - started - head, 1)}))
"""


def test_ray_starts_and_runs_an_npu_task_on_aarch64(image):
    """The image's Ray (the lock's pin, its aarch64 wheel) under QEMU: a head advertising the NPU resource, as the
    runtime role starts it, and a task placed on that resource runs on aarch64. Not the cluster: one container."""
    started = time.monotonic()
    run = in_image(image, "python3", "-c", RAY_ON_AARCH64)
    timed("Ray head and an NPU task", started)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    print(found)
    assert (found["machine"], found["npu"]) == ("aarch64", 1.0), found
