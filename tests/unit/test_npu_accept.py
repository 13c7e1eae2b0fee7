"""The NPU acceptance suite's logic, on CPU: parsing, version checks against the lock, the engine weight comparison
(transposition, fusing, the NZ question), report lines; and that the suite itself skips plainly without an NPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rollout8.lock import load_lock
from rollout8.node import npu_accept
from rollout8.node.npu_accept import EnvFacts, SpeedRun, StepResult

REPO = Path(__file__).resolve().parents[2]

NPU_SMI = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.rc3                 Version: 24.1.rc3                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.1        41                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3374 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | {health:<13} | 90.5        40                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3373 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
+===========================+===============+====================================================+
"""


@pytest.fixture(scope="module")
def lock():
    return load_lock()


def good_facts(lock, **changes) -> EnvFacts:
    facts = EnvFacts(npu_smi_text=NPU_SMI.format(health="OK"), cann_version=lock.cann.version.lower(),
                     cann_source="/usr/local/Ascend/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info",
                     driver_version="24.1.rc3", torch_version=lock.pypi["torch"] + "+cpu",
                     torch_npu_version=lock.pypi["torch_npu"], npu_device_count=2, vllm_ascend_version="0.10.1rc1")
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


# ------------------------------------------------------------------------------------------------ environment
def test_npu_smi_rows_and_version_are_parsed():
    smi = npu_accept.parse_npu_smi(NPU_SMI.format(health="Warning"))
    assert smi.version == "24.1.rc3"
    assert smi.npus == [(0, "910B3", "OK"), (1, "910B3", "Warning")]


@pytest.mark.parametrize("text, version", [
    ("Version=24.1.rc3\nVersionInfo=...\n", "24.1.rc3"),
    ("package_name=Ascend-cann-toolkit\nversion=8.2.RC3\ninnerversion=V100R001C23\n", "8.2.RC3"),
    ("runtime_running_version=[8.2.0.0.201:8.2.RC3]\n", "8.2.RC3"),
    ("nothing here\n", None),
])
def test_version_files(text, version):
    assert npu_accept.read_version_file(text) == version


def test_cann_version_files_prefer_the_install_info(tmp_path):
    latest = tmp_path / "ascend-toolkit" / "latest"
    (latest / "aarch64-linux").mkdir(parents=True)
    (latest / "aarch64-linux" / "ascend_toolkit_install.info").write_text("version=8.2.RC3\n")
    (latest / "version.cfg").write_text("runtime_running_version=[1:8.1.RC1]\n")
    files = [p for p in npu_accept.cann_version_files(tmp_path) if p.is_file()]
    assert files[0].name == "ascend_toolkit_install.info"


def test_environment_passes_with_the_pinned_stack(lock):
    step = npu_accept.check_environment(good_facts(lock), lock)
    assert step.ok, step.line()
    assert step.line().startswith("PASS environment: npu-smi 24.1.rc3: 2 NPU(s), all OK")
    assert f"CANN {lock.cann.version.lower()} (lock {lock.cann.version}" in step.line()
    assert "vllm_ascend_C loads" in step.line()


@pytest.mark.parametrize("changes, expected", [
    ({"cann_version": "8.2.RC2"}, "CANN 8.2.RC2 (lock 8.2.RC3"),
    ({"cann_version": None}, "CANN not found"),
    ({"torch_npu_version": "2.7.1.dev20250724"}, "torch_npu 2.7.1.dev20250724 (lock 2.7.1)"),
    ({"torch_version": "2.6.0"}, "torch 2.6.0 (lock 2.7.1)"),
    ({"npu_device_count": 0}, "torch_npu sees 0 NPU(s)"),
    ({"npu_smi_text": None}, "npu-smi did not run"),
    ({"npu_smi_text": NPU_SMI.format(health="Alarm")}, "unhealthy: NPU 1 910B3 health Alarm"),
    ({"vllm_ascend_c_error": "ImportError: libascendcl.so"}, "COMPILE_CUSTOM_KERNELS=1"),
    ({"driver_version": None}, "driver not found"),
])
def test_environment_fails_naming_what_is_wrong(lock, changes, expected):
    step = npu_accept.check_environment(good_facts(lock, **changes), lock)
    assert step.status == "FAIL"
    assert step.line().startswith("FAIL environment: ") and expected in step.line(), step.line()


def test_python_release_match_refuses_dev_builds():
    assert npu_accept.same_python_release("2.7.1.post2", "2.7.1")
    assert not npu_accept.same_python_release("2.7.10", "2.7.1")
    assert not npu_accept.same_python_release("2.7.1rc1", "2.7.1")


# ------------------------------------------------------------------------------------------------ weights
def _hf_int8(layers=2, hidden=8, kv=4, inter=12, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv, hidden), "self_attn.v_proj": (kv, hidden),
              "self_attn.o_proj": (hidden, hidden), "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
              "mlp.down_proj": (hidden, inter)}
    return {f"model.layers.{i}.{n}.weight": torch.randint(-128, 128, s, generator=g, dtype=torch.int8)
            for i in range(layers) for n, s in shapes.items()}


def _engine_like_vllm_ascend(hf, layers=2):
    """What W8A8_DYNAMIC's post-load step leaves (read back in ND): fused, transposed to [in, out]."""
    return {name: w.t().contiguous() for name, w in npu_accept.expected_fused(hf, layers).items()}


def test_expected_fused_concatenates_in_vllm_order():
    import torch

    hf = _hf_int8()
    fused = npu_accept.expected_fused(hf, 2)
    assert set(fused) == {f"model.layers.{i}.{n}.weight" for i in range(2) for n in npu_accept.FUSED}
    qkv = fused["model.layers.1.self_attn.qkv_proj.weight"]
    assert torch.equal(qkv[8:12], hf["model.layers.1.self_attn.k_proj.weight"])
    assert torch.equal(fused["model.layers.0.mlp.gate_up_proj.weight"][12:], hf["model.layers.0.mlp.up_proj.weight"])


def test_transposed_engine_weights_compare_equal():
    hf = _hf_int8()
    cmp = npu_accept.compare_engine_int8(_engine_like_vllm_ascend(hf), npu_accept.expected_fused(hf, 2))
    assert cmp.transposed is True and cmp.ok() and cmp.worst_lsb == 0 and len(cmp.rows) == 8


def test_untransposed_engine_weights_compare_equal_too():
    hf = _hf_int8()
    expected = npu_accept.expected_fused(hf, 2)
    cmp = npu_accept.compare_engine_int8({k: v.clone() for k, v in expected.items()}, expected)
    assert cmp.transposed is False and cmp.ok()


def test_one_lsb_passes_two_fail():
    import torch

    hf = _hf_int8()
    expected = npu_accept.expected_fused(hf, 2)
    engine = _engine_like_vllm_ascend(hf)
    name = "model.layers.0.mlp.down_proj.weight"
    engine[name] = (engine[name].to(torch.int16) + 1).clamp(-128, 127).to(torch.int8)
    assert npu_accept.compare_engine_int8(engine, expected).ok()
    engine[name] = (engine[name].to(torch.int16) + 1).clamp(-128, 127).to(torch.int8)
    cmp = npu_accept.compare_engine_int8(engine, expected)
    assert not cmp.ok() and cmp.worst_lsb == 2


def test_a_reload_that_ignored_the_transposition_is_caught():
    """FlashRL's reload copies with as_strided into the recorded storage; if that lands the [out, in] bytes in the
    engine's [in, out] tensor without transposing, shapes look right and values are scrambled."""
    hf = _hf_int8()
    expected = npu_accept.expected_fused(hf, 2)
    engine = {k: v.contiguous().view(v.shape[1], v.shape[0]) for k, v in expected.items()}
    cmp = npu_accept.compare_engine_int8(engine, expected)
    assert cmp.transposed is True and not cmp.ok() and cmp.worst_lsb > 1
    step = npu_accept.check_reload(cmp, generated_before=["a"], generated_after=["b"],
                                   formats={k: 29 for k in engine})
    assert step.status == "FAIL" and "trap 6" in step.line() and "engine format NZ" in step.line()


def test_wrong_shapes_and_missing_weights_fail():
    import torch

    hf = _hf_int8()
    expected = npu_accept.expected_fused(hf, 2)
    engine = _engine_like_vllm_ascend(hf)
    engine["model.layers.0.self_attn.qkv_proj.weight"] = torch.zeros((3, 5), dtype=torch.int8)
    assert "neither" in npu_accept.compare_engine_int8(engine, expected).problem
    engine = _engine_like_vllm_ascend(hf)
    del engine["model.layers.1.mlp.down_proj.weight"]
    cmp = npu_accept.compare_engine_int8(engine, expected)
    assert cmp.missing == ["model.layers.1.mlp.down_proj.weight"] and not cmp.ok()
    step = npu_accept.check_reload(cmp, generated_before=[], generated_after=["x"])
    assert step.status == "FAIL" and "missing in the engine" in step.line()


def test_reload_passes_with_text_and_matching_weights():
    hf = _hf_int8()
    cmp = npu_accept.compare_engine_int8(_engine_like_vllm_ascend(hf), npu_accept.expected_fused(hf, 2))
    step = npu_accept.check_reload(cmp, generated_before=["x"], generated_after=["y"], formats={"a": 29})
    assert step.ok and "8 int8 weights equal verify-quant's expectation within 0 LSB" in step.line()
    assert "[in, out]" in step.line()
    host = npu_accept.check_reload(cmp, generated_before=["x"], generated_after=["y"], formats={"a": None})
    assert host.ok and "format" not in host.line()  # weights that are not NPU tensors have no format
    empty = npu_accept.check_reload(cmp, generated_before=["x"], generated_after=["  "])
    assert empty.status == "FAIL"


def test_expectation_from_a_real_profile_matches_the_checkpoint(model_pair_factory, tmp_path):
    """The reload step's expectation (quantmath on the bf16 weights with the profile), put in vLLM-ascend's
    engine layout, compares within 1 LSB to the int8 checkpoint in that layout: the step's PASS case, on CPU."""
    import torch

    from rollout8.quant.checkpoint import Checkpoint
    from rollout8.quant.profile import compute_profile
    from rollout8.quant.quantmath import apply_profile

    pair = model_pair_factory("tiny")
    profile = compute_profile(pair.bf16, pair.int8)
    wanted = [n for n in profile if profile[n]["type"] == torch.int8]
    expected = npu_accept.expected_fused(dict(apply_profile(Checkpoint(pair.bf16).iter_tensors(wanted), profile)),
                                         pair.shape.num_hidden_layers)
    checkpoint = dict(Checkpoint(pair.int8).iter_tensors(wanted))
    engine = _engine_like_vllm_ascend(checkpoint, pair.shape.num_hidden_layers)
    cmp = npu_accept.compare_engine_int8(engine, expected)
    assert cmp.ok() and cmp.worst_lsb <= 1 and len(cmp.rows) == 4 * pair.shape.num_hidden_layers


# ------------------------------------------------------------------------------------------------ other steps
def test_loading_checks_name_the_missing_piece():
    start = {"served_model": "/m/int8", "quantization": "ascend", "qkv_weight_dtype": "torch.int8",
             "has_flashrl_load_weights": True}
    assert npu_accept.check_loading(start, ["Paris."], "/m/int8").ok
    bad = npu_accept.check_loading({**start, "served_model": "/m/bf16"}, ["Paris."], "/m/int8")
    assert bad.status == "FAIL" and "FlashRL's config was not applied" in bad.line()
    bad = npu_accept.check_loading({**start, "quantization": None}, ["Paris."], "/m/int8")
    assert "quantization None (need 'ascend')" in bad.line()
    assert npu_accept.check_loading(start, [], "/m/int8").status == "FAIL"


def test_speed_is_reported_side_by_side():
    step = npu_accept.check_speed(SpeedRun("int8", 16, 512, 2.0), SpeedRun("bf16", 16, 512, 4.0))
    assert step.ok and "int8 256.0 tokens/s vs bf16 128.0 tokens/s (x2.00" in step.line()
    assert step.details[0].split() == ["engine", "prompts", "tokens", "seconds", "tokens/s"]
    assert step.details[1].split() == ["int8", "16", "512", "2.00", "256.0"]
    assert npu_accept.check_speed(None, SpeedRun("bf16", 1, 1, 1.0)).line() == \
        "FAIL speed: no measurement from the int8 engine"
    assert npu_accept.check_speed(SpeedRun("int8", 1, 0, 1.0), SpeedRun("bf16", 1, 5, 1.0)).status == "FAIL"


def test_logs_step_follows_the_exit_code():
    green = npu_accept.check_logs(0, "rank 0: int8\nverdict: GREEN\n")
    assert green.line() == "PASS logs: rollout8 logs: verdict: GREEN"
    assert npu_accept.check_logs(1, "verdict: RED (rank 0 stayed bf16)").status == "FAIL"


def test_report_ends_with_one_verdict():
    ok = StepResult("environment", "PASS", "fine")
    bad = StepResult("reload", "FAIL", "off by 7 LSB")
    text = npu_accept.format_report([ok, bad])
    assert text.splitlines() == ["PASS environment: fine", "FAIL reload: off by 7 LSB",
                                 "acceptance: FAIL (1/2 steps passed) (failed: reload)"]
    assert npu_accept.format_report([ok]).endswith("acceptance: PASS (1/1 steps passed)")


# ------------------------------------------------------------------------------------------------ without an NPU
def test_absent_npu_reasons(tmp_path):
    def which(name):
        return "/usr/local/bin/npu-smi"

    assert "no Ascend device nodes" in npu_accept.npu_absent_reason(dev=tmp_path)
    (tmp_path / "davinci0").touch()
    assert npu_accept.npu_absent_reason(dev=tmp_path, which=lambda n: None) == "npu-smi is not on PATH"
    assert npu_accept.npu_absent_reason(dev=tmp_path, which=which, find_spec=lambda m: None) == \
        "python module torch_npu is not installed"
    assert npu_accept.npu_absent_reason(dev=tmp_path, which=which, find_spec=lambda m: object()) is None


@pytest.mark.skipif(npu_accept.npu_absent_reason() is None, reason="this machine has an NPU")
def test_the_suite_collects_and_skips_with_the_reason_here():
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/npu", "-q", "-rs", "-p", "no:cacheprovider"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 skipped" in proc.stdout
    assert "needs an Ascend NPU node" in proc.stdout and npu_accept.npu_absent_reason() in proc.stdout


@pytest.mark.skipif(npu_accept.npu_absent_reason() is None, reason="this machine has an NPU")
def test_make_accept_npu_says_plainly_that_it_needs_an_npu():
    proc = subprocess.run(["bash", "scripts/accept-npu.sh"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "ACCEPT_PYTHON": sys.executable})
    assert proc.returncode == 3
    assert proc.stderr.startswith("accept-npu: the NPU acceptance suite needs an Ascend NPU node")
    assert "tests/npu" not in proc.stdout  # pytest never started
