"""Checks of the pinned NPU stack: skipped (with the reason) where it is not installed, i.e. everywhere but the
full rollout8 image; the `npu`-marked ones need an Ascend device as well."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from image_support import installed_version

# distribution name in the lock -> distribution name installed
PYPI_DISTS = {"torch": "torch", "torch_npu": "torch_npu", "ray": "ray", "flash-llm-rl": "flash-llm-rl"}
# git pin name in the lock -> importable module proving it is there (imports that need no NPU)
GIT_MODULES = {"vllm": "vllm", "transformers": "transformers", "megatron-lm": "megatron.core"}
# PyPI-installed modules whose import needs no NPU device
PLAIN_MODULES = ["flash_rl", "ray", "torch"]


@pytest.mark.parametrize("name", sorted(PYPI_DISTS))
def test_pypi_versions(npu_stack, lock, name):
    have = installed_version(PYPI_DISTS[name])
    assert have is not None, f"{name} is not installed"
    assert have.split("+")[0] == lock.pypi[name], f"{name} {have}, the lock pins {lock.pypi[name]}"


def test_git_trees_at_their_commits(lock, source_commits):
    assert set(source_commits) == set(lock.git), f"installed trees {sorted(source_commits)} vs lock {sorted(lock.git)}"
    for name, pin in lock.git.items():
        assert source_commits[name] == pin.commit, f"{name}: built from {source_commits[name]}, lock {pin.commit}"


@pytest.mark.parametrize("name", sorted(GIT_MODULES))
def test_imports_without_npu(npu_stack, name):
    module = importlib.import_module(GIT_MODULES[name])
    print(f"{name}: {getattr(module, '__version__', '(no __version__)')}")


@pytest.mark.parametrize("module", PLAIN_MODULES)
def test_plain_imports(npu_stack, module):
    imported = importlib.import_module(module)
    print(f"{module}: {getattr(imported, '__version__', '(no __version__)')}")


def test_megatron_core_matches_the_tag(npu_stack, lock):
    """The lock's note names the tag (core_vX.Y.Z) the commit was resolved from; megatron-core must say the same."""
    import re

    from megatron.core import package_info

    tag = re.search(r"core_v(\d+\.\d+\.\d+)", lock.git["megatron-lm"].note)
    assert tag, "the lock's git.megatron-lm.note no longer names the tag"
    assert package_info.__version__ == tag.group(1)


def test_vllm_dev_version(npu_stack, lock):
    import vllm

    print(f"vllm.__version__ = {vllm.__version__}")  # a dev string: the pin is a main commit, not a release
    assert lock.git["vllm"].commit[:7] in vllm.__version__ or "dev" in vllm.__version__


def test_torch_at_pin(npu_stack, lock):
    import torch

    assert torch.__version__.split("+")[0] == lock.pypi["torch"]


def test_pip_check(npu_stack):
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_triton_removed(npu_stack):
    assert installed_version("triton") is None, "triton is installed: it breaks vLLM on Ascend (stack-facts)"


@pytest.mark.npu
@pytest.mark.parametrize("module", ["torch_npu", "vllm_ascend", "mindspeed", "verl"])
def test_imports_on_npu(npu_stack, npu_device, module):
    imported = importlib.import_module(module)
    print(f"{module}: {getattr(imported, '__version__', '(no __version__)')}")


@pytest.mark.npu
def test_vllm_ascend_custom_kernels_load(npu_stack, npu_device):
    importlib.import_module("vllm_ascend.vllm_ascend_C")


def test_the_image_carries_no_verl_recipe(npu_stack):
    """`rollout8 import` refuses a verl recipe's own trainer (`python3 -m recipe.dapo.main_dapo`, ...) first of all
    because the image cannot run one: verl's wheel at the pin leaves recipe/ out (it has no __init__.py, so
    setup.py's find_packages skips it). If the image ever carries the recipes, the refusal's reason
    (rollout8.commands.import NO_RECIPE) and docs/import-corpus.md must change with it."""
    import importlib.util
    from importlib import metadata

    assert importlib.util.find_spec("recipe") is None, "a `recipe` package is importable: update the importer"
    files = [str(f) for f in metadata.files("verl") or []]
    assert files and not [f for f in files if f.startswith("recipe/")], "verl's wheel now carries recipe/"
