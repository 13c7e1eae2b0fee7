"""Helpers shared by the image tests (a uniquely named module: several test folders have a conftest.py)."""

from __future__ import annotations

import importlib.metadata
import site
import sys
from pathlib import Path


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def site_dirs() -> list[Path]:
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return [Path(d) for d in dirs if d and Path(d).is_dir()] + [Path(p) for p in sys.path if p.endswith("-packages")]
