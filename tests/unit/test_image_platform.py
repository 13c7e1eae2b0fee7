"""`make image` builds for the Atlas nodes' architecture (aarch64), not silently for the build host's: on a host that
is not aarch64 it refuses up front, before the lock check and the build, unless PLATFORM (or a ready STACK_IMAGE,
whose architecture decides) is given."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO), *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.skipif(platform.machine() in ("aarch64", "arm64"), reason="an aarch64 build host builds for itself")
def test_an_x86_64_host_without_platform_is_refused_saying_how_to_build_for_the_nodes():
    refused = make("image-platform")
    assert refused.returncode == 2, refused.stderr
    assert (f"make image: this build host is {platform.machine()} and Atlas A2 nodes are aarch64 (Kunpeng 920): build "
            "on a Kunpeng host, or here with PLATFORM=linux/arm64 under QEMU emulation") in refused.stderr
    # before the lock check: `make image` stops at its first prerequisite
    dry = make("-n", "image")
    assert dry.returncode == 0 and dry.stdout.index("make image: this build host") < dry.stdout.index("lock")


def test_an_explicit_platform_or_a_ready_stack_image_builds_for_it():
    for args in (["PLATFORM=linux/arm64"], ["PLATFORM=linux/amd64"], ["STACK_IMAGE=my/stack:1"]):
        assert make("image-platform", *args).returncode == 0, args
    dry = make("-n", "image", "PLATFORM=linux/arm64")
    assert "--platform=linux/arm64" in dry.stdout, dry.stdout[-2000:]


def test_the_sample_ci_pipelines_build_for_the_nodes():
    for path in (REPO / "ci-examples" / "gitlab" / ".gitlab-ci.yml",
                 REPO / "ci-examples" / "github" / ".github" / "workflows" / "rollout8-image.yml"):
        text = path.read_text()
        assert "make image PLATFORM=linux/arm64 " in text, path
