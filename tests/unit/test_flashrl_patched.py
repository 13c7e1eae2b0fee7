"""The patched FlashRL behaves as the patch headers say, and the unpatched one shows each bug.

Every test runs FlashRL's own code from the flash-llm-rl wheel at the lock's pin, unpacked into tmp and patched
there with `rollout8.node.patches` (some tests apply only some patches, to keep the unpatched baseline).

- quantizer (patch 0001): runs on CPU torch; unpatched it stops with "Torch not compiled with CUDA enabled";
  on a W8A8 checkpoint built by the test it reproduces the checkpoint's int8 weights within 1 LSB;
- weight reload (patch 0002): the hook FlashRL puts on vLLM's load_weights, run on a model whose parameters live
  on torch's `meta` device (the only non-CPU device a CPU build has). vLLM itself is not installed here: a
  stand-in (tests/fixtures/vllm_standin) provides the few names the hook needs and records where each weight
  was written. Patched, the reload writes on the parameter's device; unpatched, it allocates fresh host
  memory, which a meta parameter refuses (on CPU the two are indistinguishable, on an NPU it is the slow path);
- `flashrl setup -a --fn bf16` (patch 0003): the real console command in a subprocess, HOME in tmp, in a
  throwaway venv layered on .venv so the usercustomize.py FlashRL writes lands in tmp.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import upstream_wheels as uw
import yaml

from rollout8.node import patches

torch = pytest.importorskip("torch")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QUANT, RELOAD, SETUP = "0001-int8-quantizer-device.patch", "0002-reload-on-param-device.patch", \
    "0003-setup-append-bf16.patch"
CHUNKED = "0004-int8-requant-in-row-blocks.patch"


@pytest.fixture(scope="module")
def flashrl(flashrl_pristine, tmp_path_factory):
    """flashrl(*patch_file_names) -> a site-packages-like dir holding flash_rl with just those patches applied."""
    made: dict[tuple, Path] = {}
    by_name = {p.path.name: p for p in patches.find_patches("flash_rl")}

    def make(*names: str) -> Path:
        key = tuple(sorted(names))
        if key not in made:
            target = uw.copy_tree(flashrl_pristine, tmp_path_factory.mktemp("flashrl") / "site-packages")
            for name in key:
                assert patches.apply_patch(by_name[name], target).state == patches.APPLIED
            made[key] = target
        return made[key]

    return make


def _small_profile():
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(8, 16, generator=gen) * 0.05).to(torch.bfloat16)
    profile = {"q.weight": {"input_scale": torch.rand(1, 16, generator=gen) + 0.5,
                            "output_scale": 1.0 / (torch.rand(8, 1, generator=gen) * 1e-3 + 4e-4),
                            "type": torch.int8}}
    return w, profile


# ------------------------------------------------------------------------------------------- quantizer (0001)
def test_unpatched_quantizer_needs_cuda(flashrl):
    w, profile = _small_profile()
    unpatched = uw.load_quantization(flashrl())
    with pytest.raises((AssertionError, RuntimeError), match="Torch not compiled with CUDA enabled"):
        unpatched.linear_quantize("q.weight", w, profile)


def test_patched_quantizer_runs_on_cpu(flashrl):
    w, profile = _small_profile()
    patched = uw.load_quantization(flashrl(QUANT))
    q = patched.linear_quantize("q.weight", w, profile)
    p = profile["q.weight"]
    expected = torch.round(w * p["output_scale"] * p["input_scale"]).clamp(-128, 127).to(torch.int8)
    assert q.dtype == torch.int8 and q.device.type == "cpu"
    assert torch.equal(q, expected)
    assert q.abs().max() > 20  # the scales made a real int8 range, not all zeros
    names = [n for n, _ in patched.flash_quantize(iter([("q.weight", w), ("other", w)]), profile)]
    assert names == ["q.weight", "other"]


def test_patched_quantizer_reproduces_w8a8_checkpoint_within_one_lsb(flashrl, model_pair):
    """model_pair (tests/conftest.py): rollout8.quant.testmodels.make_pair's tiny Qwen2 bf16 model and its
    compressed-tensors W8A8 twin, cached in .cache/testmodels; the profile is FlashRL's, computed by
    rollout8.quant.profile."""
    from rollout8.quant.checkpoint import Checkpoint
    from rollout8.quant.profile import compute_profile

    pair = model_pair
    profile = compute_profile(pair.bf16, pair.int8)
    quant = uw.load_quantization(flashrl(QUANT))
    bf16, int8 = Checkpoint(pair.bf16), Checkpoint(pair.int8)

    linear = [n for n, e in profile.items() if e["type"] == torch.int8]
    norms = [n for n, e in profile.items() if e["type"] != torch.int8]
    assert linear and norms
    off_by_one = total = 0
    for name in linear:
        ours = quant.linear_quantize(name, bf16.get(name), profile)  # bf16, as the trainer sends it
        ref = int8.get(name)
        assert ours.dtype == torch.int8 and ours.shape == ref.shape, name
        diff = (ours.int() - ref.int()).abs()
        assert diff.max().item() <= 1, f"{name}: off by {diff.max().item()} LSB"
        off_by_one += int((diff == 1).sum())
        total += diff.numel()
    assert off_by_one < total * 0.2  # mostly exact: the fitted up/down factor accounts for the few 1-LSB steps
    for name in norms:
        ours = quant.linear_quantize(name, bf16.get(name), profile)
        torch.testing.assert_close(ours.float(), int8.get(name).float(), rtol=2e-3, atol=1e-3)


# ---------------------------------------------------------------------------------------------- reload (0002)
def _reload_setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A FlashRL config, an int8 model layout for the stand-in, a profile, and bf16 'trainer' weights."""
    gen = torch.Generator().manual_seed(1)
    q, norm = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.input_layernorm.weight"
    spec = {q: [[8, 16], "int8"], q + "_scale": [[8, 1], "float32"], norm: [[16], "bfloat16"]}
    model_dir = tmp_path / "int8-model"
    model_dir.mkdir()
    (model_dir / "standin.json").write_text(json.dumps(spec))
    profile = {
        norm: {"input_scale": torch.rand(16, generator=gen) + 0.5, "output_scale": 1.0, "type": torch.bfloat16},
        q: {"input_scale": torch.rand(1, 16, generator=gen) + 0.5,
            "output_scale": 1.0 / (torch.rand(8, 1, generator=gen) * 1e-3 + 4e-4), "type": torch.int8},
    }
    torch.save(profile, tmp_path / "profile.pt")
    weights = {q: (torch.randn(8, 16, generator=gen) * 0.05).to(torch.bfloat16),
               norm: torch.ones(16, dtype=torch.bfloat16)}
    torch.save(weights, tmp_path / "weights.pt")
    config = tmp_path / "flashrl.yaml"
    config.write_text(yaml.safe_dump({"configs": [{
        "fn": "int8", "model": str(model_dir), "profile": str(tmp_path / "profile.pt"), "load_format": "auto",
        "distributed_executor_backend": "external_launcher"}]}))
    return config, model_dir, tmp_path / "weights.pt"


def _run_reload(site: Path, tmp_path: Path, device: str, expect_ok: bool = True, **extra_env: str) -> tuple[dict, str]:
    config, model_dir, weights = _reload_setup(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHRL_", "VLLM_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(FIXTURES / "vllm_standin")]), FLASHRL_CONFIG=str(config),
               FLASHRL_LOGGING_LEVEL="DEBUG", RANK="0", WORLD_SIZE="1", HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    env.pop("ROLLOUT8_FLASHRL_HOST_RELOAD", None)
    env.update(extra_env)
    done = subprocess.run([sys.executable, str(FIXTURES / "flashrl_reload_probe.py"), str(model_dir), str(weights),
                           device], capture_output=True, text=True, env=env, timeout=300, check=False)
    if not expect_ok:
        assert done.returncode != 0, done.stdout[-2000:]
        return {}, done.stderr
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT ")), done.stderr


@pytest.mark.slow
def test_patched_reload_allocates_on_the_parameter_device(flashrl, tmp_path):
    result, log = _run_reload(flashrl(QUANT, RELOAD), tmp_path, "meta")
    assert "Successfully patched the load_weights function of vllm" in log  # FlashRL's own hook ran
    assert result["hooked"]
    assert len(result["load_devices"]) == 2  # two weight syncs
    for sync in result["load_devices"]:
        assert sync and set(sync.values()) == {"meta"}, sync
    assert set(result["param_devices"].values()) == {"meta"}


@pytest.mark.slow
def test_unpatched_reload_goes_through_host_memory(flashrl, tmp_path):
    """The baseline the test above fails on. Upstream re-points each parameter to torch.empty(shape, dtype), a host
    tensor; a host tensor cannot stand in for a meta parameter, so on this model the reload stops right there."""
    _, log = _run_reload(flashrl(QUANT), tmp_path, "meta", expect_ok=False)
    assert "Successfully patched the load_weights function of vllm" in log
    assert "existing_params[name].data = torch.empty(shape, dtype=dtype)" in log
    assert "incompatible tensor type" in log


@pytest.mark.slow
def test_host_reload_switch_restores_upstream_allocation(flashrl, tmp_path):
    """ROLLOUT8_FLASHRL_HOST_RELOAD=1 (the patch header's escape hatch when the device copy does not fit)."""
    _, log = _run_reload(flashrl(QUANT, RELOAD), tmp_path, "meta", expect_ok=False, ROLLOUT8_FLASHRL_HOST_RELOAD="1")
    assert "incompatible tensor type" in log


@pytest.mark.slow
@pytest.mark.parametrize("requant", [(), (CHUNKED,)], ids=["whole-tensor requant", "row-block requant (0004)"])
def test_patched_reload_on_cpu_quantizes_into_the_original_storage(flashrl, tmp_path, requant):
    """Also with 0004 (tests/unit/test_flashrl_requant.py tests it alone): through FlashRL's own load_weights hook
    the int8 values written into the original storage are the same."""
    result, _ = _run_reload(flashrl(QUANT, RELOAD, *requant), tmp_path, "cpu")
    assert result["same_storage"]
    weights = torch.load(tmp_path / "weights.pt")
    profile = torch.load(tmp_path / "profile.pt")
    q = "model.layers.0.self_attn.q_proj.weight"
    p = profile[q]
    expected = torch.round(weights[q] * p["output_scale"] * p["input_scale"]).clamp(-128, 127).to(torch.int8)
    assert torch.equal(torch.tensor(result["values"][q], dtype=torch.int8), expected)
    assert result["loaded"][1][q] == ["torch.int8", [8, 16]]


# ------------------------------------------------------------------------------------------------ setup (0003)
def _setup_env(tmp_path: Path, site: Path) -> tuple[Path, dict]:
    """A throwaway venv whose site-packages is tmp (FlashRL's setup writes usercustomize.py there), seeing .venv's
    packages through a .pth file, and the flash_rl copy under test first on PYTHONPATH."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    [venv_site] = (venv / "lib").glob("python3*/site-packages")
    parent_site = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (venv_site / "rollout8-parent.pth").write_text("\n".join(parent_site) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHRL_")}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(site))
    (tmp_path / "home").mkdir()
    return venv, env


def _flashrl_cli(venv: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    code = "import sys; from flash_rl.commands import run; sys.argv = ['flashrl', *sys.argv[1:]]; run()"
    return subprocess.run([str(venv / "bin" / "python"), "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("patched", [False, True], ids=["unpatched", "patched"])
def test_setup_append_bf16(flashrl, tmp_path, patched):
    site = flashrl(QUANT, SETUP) if patched else flashrl(QUANT)
    venv, env = _setup_env(tmp_path, site)
    config = tmp_path / "flashrl.yaml"
    # the entry `flashrl setup -m /models/int8 -p /models/profile.pt --fn int8` writes (Int8Config + model, profile)
    int8_entry = {"fn": "int8", "model": "/models/int8", "profile": "/models/profile.pt", "load_format": "auto",
                  "distributed_executor_backend": "external_launcher"}
    config.write_text(yaml.safe_dump({"configs": [int8_entry]}))
    second = _flashrl_cli(venv, env, "setup", "-a", "--fn", "bf16", "-o", str(config))
    entries = yaml.safe_load(config.read_text())["configs"]
    if not patched:
        assert second.returncode != 0
        assert "AssertionError: load_format should be 'auto' for bf16" in second.stderr
        assert [e["fn"] for e in entries] == ["int8"]
        return
    assert second.returncode == 0, second.stderr[-2000:]
    assert [e["fn"] for e in entries] == ["int8", "bf16"]
    assert entries[1]["load_format"] == "dummy" and entries[0]["load_format"] == "auto"
    assert entries[0]["model"] == "/models/int8"
    [venv_site] = (venv / "lib").glob("python3*/site-packages")
    assert "import flash_rl" in (venv_site / "usercustomize.py").read_text()  # landed in tmp, not in .venv
