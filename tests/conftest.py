"""Fixtures shared by every test tier. Keep edits here small: several helpers add fixtures to this file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Test-only helpers (log emitters, verl log writers, the upstream wheel cache) live in tests/support/, importable by
# name through pytest's `pythonpath` (pyproject.toml).


# ---------------------------------------------------------------------------------------------- test models
# Built once per session. Pairs are cached across sessions in .cache/testmodels/, keyed by the builder's source
# hash, preset, seed and overrides (a changed builder builds new ones). ROLLOUT8_TESTMODEL_CACHE=0 disables the
# cache (a fresh tmp dir per session); any other value is used as the cache directory.
@pytest.fixture(scope="session")
def model_pair_factory(tmp_path_factory):
    """Callable (preset="tiny", seed=0, **shape_overrides) -> rollout8.quant.testmodels.ModelPair (.bf16, .int8)."""
    from rollout8.quant.testmodels import cached_pair

    setting = os.environ.get("ROLLOUT8_TESTMODEL_CACHE", "")
    if setting == "0":
        root = tmp_path_factory.mktemp("testmodels")
    else:
        root = Path(setting) if setting else REPO_ROOT / ".cache" / "testmodels"
    built = {}

    def make(preset: str = "tiny", seed: int = 0, **overrides):
        key = (preset, seed, tuple(sorted(overrides.items())))
        if key not in built:
            built[key] = cached_pair(root, preset=preset, seed=seed, **overrides)
        return built[key]

    return make


@pytest.fixture(scope="session")
def model_pair(model_pair_factory):
    """The tiny Qwen2 GQA pair: bf16 and its W8A8 compressed-tensors twin."""
    return model_pair_factory("tiny")
