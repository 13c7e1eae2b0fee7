"""Fixtures of the image tests (tests/image), in the style of jupyter/docker-stacks: plain pytest, no plugins.

`make test-image` runs these inside the built image (they are baked in at /opt/rollout8/tests/image). The same files
run on a CPU checkout in CI: what needs the NPU stack (torch_npu, vllm_ascend, CANN) is skipped there with the
reason, what needs an NPU device is marked `npu`, and what needs the image itself asks for the `in_image` fixture.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from image_support import installed_version

from rollout8.lock import Lock, load_lock

SOURCES_FILE = Path("/opt/rollout8/sources.txt")


def pytest_configure(config: pytest.Config) -> None:
    # Inside the image there is no pyproject.toml: register the markers these tests use.
    config.addinivalue_line("markers", "npu: needs a real Ascend NPU (skipped elsewhere, with the reason)")


@pytest.fixture(scope="session")
def lock() -> Lock:
    return load_lock()


@pytest.fixture(scope="session")
def in_image() -> None:
    if os.environ.get("ROLLOUT8_IN_IMAGE") != "1":
        pytest.skip("checks the built image itself: run with `make test-image` (ROLLOUT8_IN_IMAGE is not set here)")


@pytest.fixture(scope="session")
def npu_stack() -> None:
    """The NPU Python stack (torch_npu, vllm-ascend) is installed: the real image, not a CPU checkout."""
    missing = [d for d in ("torch_npu", "vllm_ascend") if installed_version(d) is None]
    if missing:
        pytest.skip(f"NPU stack not installed here ({', '.join(missing)} absent): runs in the full rollout8 image")


@pytest.fixture(scope="session")
def npu_device() -> None:
    if not Path("/dev/davinci_manager").exists():
        pytest.skip("no Ascend NPU device (/dev/davinci_manager absent): run on an Atlas node with the NPU flags")


@pytest.fixture(scope="session")
def source_commits(npu_stack) -> dict[str, str]:
    """name -> commit of each git tree the image build installed (written by docker/Dockerfile's stack stage)."""
    if not SOURCES_FILE.is_file():
        pytest.fail(f"{SOURCES_FILE} missing: the image was not built by docker/Dockerfile's stack stage")
    pairs = (line.split() for line in SOURCES_FILE.read_text().splitlines() if line.strip())
    return {name: commit for name, commit in pairs}


@pytest.fixture(scope="session")
def flash_rl_site() -> Path:
    """The site-packages directory that holds flash_rl (and, in the image, verl next to it)."""
    spec = importlib.util.find_spec("flash_rl")
    if spec is None or spec.origin is None:
        pytest.skip("flash_rl (flash-llm-rl) not installed in this Python")
    return Path(spec.origin).parent.parent
