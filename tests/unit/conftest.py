"""Fixtures of the unit tier: the pristine upstream files the patch tests start from, one read-only copy each."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import upstream_wheels as uw


@pytest.fixture(scope="session")
def flashrl_pristine(tmp_path_factory) -> Path:
    """flash_rl/ of the flash-llm-rl wheel at the lock's pin, unpatched: a dir holding flash_rl/. Read-only: a test
    that patches or runs it works on a copy (uw.copy_tree)."""
    whl = uw.wheel("flash-llm-rl", uw.locked_pypi_version("flash-llm-rl"))
    return uw.unpack(whl, tmp_path_factory.mktemp("flashrl-pristine"), "flash_rl")


@pytest.fixture(scope="session")
def verl_pristine(tmp_path_factory) -> Path:
    """verl/__init__.py of the verl stand-in wheel (byte-identical to the pin's, see test_patches.py), unpatched: a
    dir holding verl/__init__.py. Read-only, as flashrl_pristine."""
    whl = uw.wheel("verl", uw.VERL_STAND_IN_VERSION)
    root = tmp_path_factory.mktemp("verl-pristine")
    with zipfile.ZipFile(whl) as zf:
        zf.extract("verl/__init__.py", root)
    return root
