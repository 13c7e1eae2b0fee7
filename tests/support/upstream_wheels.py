"""Pristine upstream files for the patch tests: wheels downloaded from PyPI with pip, cached between runs.

The cache is <repo>/.cache/wheels (ROLLOUT8_WHEEL_CACHE overrides it), so a rerun needs no network.
Tests unpack into their own tmp dirs: the .venv's installed copies are never patched by a test.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import yaml

from rollout8.paths import lock_path, repo_root

# verl's PyPI release whose verl/__init__.py is byte-identical to the one at the verl pin (see test_patches.py).
VERL_STAND_IN_VERSION = "0.6.1"


def wheel_cache() -> Path:
    env = os.environ.get("ROLLOUT8_WHEEL_CACHE")
    if env:
        path = Path(env)
    else:
        root = repo_root()
        path = (root / ".cache" / "wheels") if root else Path.home() / ".cache" / "rollout8" / "wheels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def locked_pypi_version(dist: str) -> str:
    """The exact version the lock pins for a PyPI distribution (so no pin is typed twice)."""
    return str(yaml.safe_load(lock_path().read_text())["pypi"][dist])


def wheel(dist: str, version: str) -> Path:
    """The wheel dist==version from the cache, downloaded with pip on first use."""
    stem = dist.replace("-", "_")
    cache = wheel_cache()
    hits = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if hits:
        return hits[0]
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", str(cache), f"{dist}=={version}"]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=300, check=False)
    hits = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if done.returncode != 0 or not hits:
        raise RuntimeError(f"could not download {dist}=={version} from PyPI into {cache} "
                           f"(put the wheel there by hand on an offline machine):\n{done.stderr[-2000:]}")
    return hits[0]


def unpack(whl: Path, dest: Path, package: str) -> Path:
    """Extract one top-level package of a wheel into dest; returns dest (the dir that contains `package`/)."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(whl) as zf:
        members = [m for m in zf.namelist() if m.startswith(f"{package}/")]
        zf.extractall(dest, members)
    return dest


def copy_tree(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def load_quantization(site: Path):
    """flash_rl/flash_quantization.py of one unpacked copy, as a standalone module (it imports only torch and
    transformers), under a fresh name so several copies (patched or not) load side by side."""
    path = site / "flash_rl" / "flash_quantization.py"
    spec = importlib.util.spec_from_file_location(f"flashq_{uuid.uuid4().hex}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
