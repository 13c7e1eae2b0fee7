"""Where the bundle's own data lives, in a checkout and in an installed wheel."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT = PACKAGE_DIR.parent.parent  # <repo>/src/rollout8 -> <repo>


def repo_root() -> Path | None:
    """The checkout this package runs from, if any (editable installs, tests, the Makefile)."""
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "versions.lock.yaml").is_file():
        return _CHECKOUT
    return None


def bundle_file(relative: str) -> Path:
    """A file shipped with the bundle: from the checkout if there is one, else from the wheel's data dir.

    ROLLOUT8_HOME overrides both (for a bundle unpacked somewhere else).
    """
    home = os.environ.get("ROLLOUT8_HOME")
    candidates = []
    if home:
        candidates.append(Path(home) / relative)
    root = repo_root()
    if root is not None:
        candidates.append(root / relative)
    candidates.append(PACKAGE_DIR / "data" / relative)
    for path in candidates:
        if path.exists():
            return path
    return candidates[0]


def lock_path() -> Path:
    return bundle_file("versions.lock.yaml")


def patches_dir() -> Path:
    return bundle_file("patches")
