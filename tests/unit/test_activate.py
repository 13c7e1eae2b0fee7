"""rollout8.activate, what the patched verl/__init__.py imports right after flash_rl.

Each case runs in a fresh interpreter (the module acts at import, once per process). On this CPU machine
torch_npu is absent, so transfer_to_npu is reported "not-installed"; the NPU path is the npu-marked test.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import upstream_wheels as uw
import yaml

from rollout8.node import patches
from rollout8.node.activation import MARKER

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _python(code: str, env_extra: dict, pythonpath: list[Path] = ()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHRL_", "ROLLOUT8_TRANSFER"))}
    env.update(env_extra)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          check=False)


def _marker_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if MARKER in ln]


def test_cpu_import_without_config_logs_one_line():
    done = _python("import rollout8.activate as a; print(a.STATE['transfer_to_npu'])", {})
    assert done.returncode == 0, done.stderr
    [line] = _marker_lines(done.stderr)
    assert "INFO" in line and "config=unset" in line and "transfer_to_npu=not-installed" in line
    assert done.stdout.strip() == "not-installed"


def test_transfer_to_npu_can_be_disabled():
    done = _python("import rollout8.activate", {"ROLLOUT8_TRANSFER_TO_NPU": "0"})
    assert done.returncode == 0, done.stderr
    [line] = _marker_lines(done.stderr)
    assert "transfer_to_npu=disabled" in line


@pytest.mark.parametrize("value, expected", [
    ("flashrl.yaml", "is not an absolute path"),
    ("/nonexistent/rollout8/flashrl.yaml", "does not exist on this node"),
])
def test_bad_flashrl_config_is_refused_before_flashrl_can_try_the_hub(value, expected):
    done = _python("import rollout8.activate", {"FLASHRL_CONFIG": value})
    assert done.returncode != 0
    assert "ActivationError" in done.stderr and expected in done.stderr
    assert f"FLASHRL_CONFIG={value} " in done.stderr
    [line] = _marker_lines(done.stderr)
    assert "ERROR" in line and "config=invalid" in line


def test_relative_profile_inside_the_config_is_refused(tmp_path):
    model = tmp_path / "int8"
    model.mkdir()
    config = tmp_path / "flashrl.yaml"
    config.write_text(yaml.safe_dump({"configs": [{"fn": "int8", "model": str(model), "profile": "profile.pt"}]}))
    done = _python("import rollout8.activate", {"FLASHRL_CONFIG": str(config)})
    assert done.returncode != 0
    assert "configs[0].profile='profile.pt' is not an absolute path" in done.stderr


def test_builtin_config_name_is_accepted():
    done = _python("import rollout8.activate", {"FLASHRL_CONFIG": "bf16"})
    assert done.returncode == 0, done.stderr
    [line] = _marker_lines(done.stderr)
    # flash_rl was not imported first here, so the line says so, as a warning
    assert "config=bf16" in line and "vllm_hooked=no-flash_rl" in line and "WARNING" in line


@pytest.mark.slow
def test_patched_verl_head_activates_flashrl(verl_pristine, flashrl_pristine, tmp_path):
    """The first statements of the patched verl/__init__.py, run with FlashRL (patched copy) and the stand-in vLLM:
    FlashRL hooks vLLM's LLM and the activation line says so. (The rest of verl's __init__ needs ray and friends.)"""
    verl_root = uw.copy_tree(verl_pristine, tmp_path / "verl-src")
    patches.apply_patches(verl_root, "verl")
    source = (verl_root / "verl" / "__init__.py").read_text()
    head = [node for node in ast.parse(source).body[:2]]
    assert [ast.unparse(n) for n in head] == ["import flash_rl", "import rollout8.activate"]
    code = "\n".join(ast.unparse(n) for n in head)

    site = uw.copy_tree(flashrl_pristine, tmp_path / "site")
    patches.apply_patches(site, "flash_rl")
    model, profile = tmp_path / "int8", tmp_path / "profile.pt"
    model.mkdir()
    profile.write_bytes(b"")
    config = tmp_path / "flashrl.yaml"
    config.write_text(yaml.safe_dump({"configs": [{"fn": "int8", "model": str(model), "profile": str(profile)}]}))

    done = _python(code, {"FLASHRL_CONFIG": str(config), "FLASHRL_LOGGING_LEVEL": "DEBUG"},
                   [site, FIXTURES / "vllm_standin"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Successfully patched vllm" in done.stderr  # FlashRL's own line: vllm.LLM hooked
    [line] = _marker_lines(done.stderr)
    assert f"config={config}" in line and "fn=int8" in line and "vllm_hooked=yes" in line
    assert "INFO" in line


@pytest.mark.npu
def test_on_npu_transfer_to_npu_is_imported():
    pytest.importorskip("torch_npu", reason="needs torch_npu (an Ascend NPU node)")
    done = _python("import rollout8.activate, sys, torch; "
                   "print('torch_npu.contrib.transfer_to_npu' in sys.modules, torch.cuda.is_available())", {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]
    [line] = _marker_lines(done.stderr)
    assert "transfer_to_npu=imported" in line


def test_the_logic_module_has_no_import_side_effect():
    done = _python("import rollout8.node.activation", {"FLASHRL_CONFIG": "relative.yaml"})
    assert done.returncode == 0, done.stderr
    assert not _marker_lines(done.stderr)
