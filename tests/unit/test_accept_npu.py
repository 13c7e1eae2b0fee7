"""The NPU acceptance suite's logic, on CPU: parsing, version checks against the lock, the engine weight comparison
(transposition, fusing, the NZ question), report lines; and that the suite itself skips plainly without an NPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollout8.lock import load_lock
from rollout8.node import accept_npu
from rollout8.node.accept_npu import EnvFacts, SpeedRun, StepResult

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
    smi = accept_npu.parse_npu_smi(NPU_SMI.format(health="Warning"))
    assert smi.version == "24.1.rc3"
    assert smi.npus == [(0, "910B3", "OK"), (1, "910B3", "Warning")]


@pytest.mark.parametrize("text, version", [
    ("Version=24.1.rc3\nVersionInfo=...\n", "24.1.rc3"),
    ("package_name=Ascend-cann-toolkit\nversion=8.2.RC3\ninnerversion=V100R001C23\n", "8.2.RC3"),
    ("runtime_running_version=[8.2.0.0.201:8.2.RC3]\n", "8.2.RC3"),
    ("nothing here\n", None),
])
def test_version_files(text, version):
    assert accept_npu.read_version_file(text) == version


def test_cann_version_files_prefer_the_install_info(tmp_path):
    latest = tmp_path / "ascend-toolkit" / "latest"
    (latest / "aarch64-linux").mkdir(parents=True)
    (latest / "aarch64-linux" / "ascend_toolkit_install.info").write_text("version=8.2.RC3\n")
    (latest / "version.cfg").write_text("runtime_running_version=[1:8.1.RC1]\n")
    files = [p for p in accept_npu.cann_version_files(tmp_path) if p.is_file()]
    assert files[0].name == "ascend_toolkit_install.info"


def test_environment_passes_with_the_pinned_stack(lock):
    step = accept_npu.check_environment(good_facts(lock), lock)
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
    step = accept_npu.check_environment(good_facts(lock, **changes), lock)
    assert step.status == "FAIL"
    assert step.line().startswith("FAIL environment: ") and expected in step.line(), step.line()


def test_python_release_match_refuses_dev_builds():
    assert accept_npu.same_python_release("2.7.1.post2", "2.7.1")
    assert not accept_npu.same_python_release("2.7.10", "2.7.1")
    assert not accept_npu.same_python_release("2.7.1rc1", "2.7.1")


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
    return {name: w.t().contiguous() for name, w in accept_npu.expected_fused(hf, layers).items()}


def test_expected_fused_concatenates_in_vllm_order():
    import torch

    hf = _hf_int8()
    fused = accept_npu.expected_fused(hf, 2)
    assert set(fused) == {f"model.layers.{i}.{n}.weight" for i in range(2) for n in accept_npu.FUSED}
    qkv = fused["model.layers.1.self_attn.qkv_proj.weight"]
    assert torch.equal(qkv[8:12], hf["model.layers.1.self_attn.k_proj.weight"])
    assert torch.equal(fused["model.layers.0.mlp.gate_up_proj.weight"][12:], hf["model.layers.0.mlp.up_proj.weight"])


def test_transposed_engine_weights_compare_equal():
    hf = _hf_int8()
    cmp = accept_npu.compare_engine_int8(_engine_like_vllm_ascend(hf), accept_npu.expected_fused(hf, 2))
    assert cmp.transposed is True and cmp.ok() and cmp.worst_lsb == 0 and len(cmp.rows) == 8


def test_untransposed_engine_weights_compare_equal_too():
    hf = _hf_int8()
    expected = accept_npu.expected_fused(hf, 2)
    cmp = accept_npu.compare_engine_int8({k: v.clone() for k, v in expected.items()}, expected)
    assert cmp.transposed is False and cmp.ok()


def test_one_lsb_passes_two_fail():
    import torch

    hf = _hf_int8()
    expected = accept_npu.expected_fused(hf, 2)
    engine = _engine_like_vllm_ascend(hf)
    name = "model.layers.0.mlp.down_proj.weight"
    engine[name] = (engine[name].to(torch.int16) + 1).clamp(-128, 127).to(torch.int8)
    assert accept_npu.compare_engine_int8(engine, expected).ok()
    engine[name] = (engine[name].to(torch.int16) + 1).clamp(-128, 127).to(torch.int8)
    cmp = accept_npu.compare_engine_int8(engine, expected)
    assert not cmp.ok() and cmp.worst_lsb == 2


def test_a_reload_that_ignored_the_transposition_is_caught():
    """FlashRL's reload copies with as_strided into the recorded storage; if that lands the [out, in] bytes in the
    engine's [in, out] tensor without transposing, shapes look right and values are scrambled."""
    hf = _hf_int8()
    expected = accept_npu.expected_fused(hf, 2)
    engine = {k: v.contiguous().view(v.shape[1], v.shape[0]) for k, v in expected.items()}
    cmp = accept_npu.compare_engine_int8(engine, expected)
    assert cmp.transposed is True and not cmp.ok() and cmp.worst_lsb > 1
    step = accept_npu.check_reload(cmp, generated_before=["a"], generated_after=["b"],
                                   formats={k: 29 for k in engine})
    assert step.status == "FAIL" and "trap 6" in step.line() and "engine format NZ" in step.line()


def test_wrong_shapes_and_missing_weights_fail():
    import torch

    hf = _hf_int8()
    expected = accept_npu.expected_fused(hf, 2)
    engine = _engine_like_vllm_ascend(hf)
    engine["model.layers.0.self_attn.qkv_proj.weight"] = torch.zeros((3, 5), dtype=torch.int8)
    assert "neither" in accept_npu.compare_engine_int8(engine, expected).problem
    engine = _engine_like_vllm_ascend(hf)
    del engine["model.layers.1.mlp.down_proj.weight"]
    cmp = accept_npu.compare_engine_int8(engine, expected)
    assert cmp.missing == ["model.layers.1.mlp.down_proj.weight"] and not cmp.ok()
    step = accept_npu.check_reload(cmp, generated_before=[], generated_after=["x"])
    assert step.status == "FAIL" and "missing in the engine" in step.line()


def test_reload_passes_with_text_and_matching_weights():
    hf = _hf_int8()
    cmp = accept_npu.compare_engine_int8(_engine_like_vllm_ascend(hf), accept_npu.expected_fused(hf, 2))
    step = accept_npu.check_reload(cmp, generated_before=["x"], generated_after=["y"], formats={"a": 29})
    assert step.ok and "8 int8 weights equal verify-quant's expectation within 0 LSB" in step.line()
    assert "[in, out]" in step.line()
    host = accept_npu.check_reload(cmp, generated_before=["x"], generated_after=["y"], formats={"a": None})
    assert host.ok and "format" not in host.line()  # weights that are not NPU tensors have no format
    empty = accept_npu.check_reload(cmp, generated_before=["x"], generated_after=["  "])
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
    expected = accept_npu.expected_fused(dict(apply_profile(Checkpoint(pair.bf16).iter_tensors(wanted), profile)),
                                         pair.shape.num_hidden_layers)
    checkpoint = dict(Checkpoint(pair.int8).iter_tensors(wanted))
    engine = _engine_like_vllm_ascend(checkpoint, pair.shape.num_hidden_layers)
    cmp = accept_npu.compare_engine_int8(engine, expected)
    assert cmp.ok() and cmp.worst_lsb <= 1 and len(cmp.rows) == 4 * pair.shape.num_hidden_layers


# ------------------------------------------------------------------------------------------------ other steps
def test_loading_checks_name_the_missing_piece():
    start = {"served_model": "/m/int8", "quantization": "ascend", "qkv_weight_dtype": "torch.int8",
             "has_flashrl_load_weights": True}
    assert accept_npu.check_loading(start, ["Paris."], "/m/int8").ok
    bad = accept_npu.check_loading({**start, "served_model": "/m/bf16"}, ["Paris."], "/m/int8")
    assert bad.status == "FAIL" and "FlashRL's config was not applied" in bad.line()
    bad = accept_npu.check_loading({**start, "quantization": None}, ["Paris."], "/m/int8")
    assert "quantization None (need 'ascend')" in bad.line()
    assert accept_npu.check_loading(start, [], "/m/int8").status == "FAIL"


def test_speed_is_reported_side_by_side():
    step = accept_npu.check_speed(SpeedRun("int8", 16, 512, 2.0), SpeedRun("bf16", 16, 512, 4.0))
    assert step.ok and "int8 256.0 tokens/s vs bf16 128.0 tokens/s (x2.00" in step.line()
    assert step.details[0].split() == ["engine", "prompts", "tokens", "seconds", "tokens/s"]
    assert step.details[1].split() == ["int8", "16", "512", "2.00", "256.0"]
    assert accept_npu.check_speed(None, SpeedRun("bf16", 1, 1, 1.0)).line() == \
        "FAIL speed: no measurement from the int8 engine"
    assert accept_npu.check_speed(SpeedRun("int8", 1, 0, 1.0), SpeedRun("bf16", 1, 5, 1.0)).status == "FAIL"


def test_logs_step_follows_the_exit_code():
    green = accept_npu.check_logs(0, "rank 0: int8\nverdict: GREEN\n")
    assert green.line() == "PASS logs: rollout8 logs: verdict: GREEN"
    assert accept_npu.check_logs(1, "verdict: RED (rank 0 stayed bf16)").status == "FAIL"


def test_report_ends_with_one_verdict():
    ok = StepResult("environment", "PASS", "fine")
    bad = StepResult("reload", "FAIL", "off by 7 LSB")
    text = accept_npu.format_report([ok, bad])
    assert text.splitlines() == ["PASS environment: fine", "FAIL reload: off by 7 LSB",
                                 "acceptance: FAIL (1/2 steps passed) (failed: reload)"]
    assert accept_npu.format_report([ok]).endswith("acceptance: PASS (1/1 steps passed)")


def test_a_skipped_step_is_named_not_failed():
    ok = StepResult("environment", "PASS", "fine")
    skip = StepResult("hccl", "SKIP", "one node given")
    assert accept_npu.format_report([ok, skip]).splitlines()[-1] == \
        "acceptance: PASS (1/1 steps passed; skipped: hccl)"
    bad = StepResult("ray-npu", "FAIL", "hidden")
    assert accept_npu.format_report([ok, bad, skip]).splitlines()[-1] == \
        "acceptance: FAIL (1/2 steps passed; skipped: hccl) (failed: ray-npu)"
    assert accept_npu.format_report([skip]).splitlines()[-1].startswith("acceptance: FAIL (0/0")


def test_the_suite_has_a_test_per_step():
    """Every step of STEPS is recorded by some test in tests/npu (the report orders by STEPS)."""
    text = "".join(p.read_text() for p in (REPO / "tests" / "npu").glob("test_*.py"))
    for step in accept_npu.STEPS:
        func = {"cann-pairing": "check_cann_pairing", "ray-npu": "check_ray_npu", "weight-sync": "check_weight_sync",
                "hccl": "check_hccl", "logs": "check_logs", "speed": "check_speed", "loading": "check_loading",
                "reload": "check_reload", "environment": "check_environment"}[step]
        assert f"accept_npu.{func}(" in text, step


# ------------------------------------------------------------------------------------------------ cann-pairing
# As in Ascend/pytorch #99 (torch_npu 2.7.1 on CANN 8.3.RC1).
UNDEFINED = ("  File \".../torch_npu/op_plugin/atb/_atb_ops.py\", line 66, in <module>\n"
             "    torch.ops.load_library(atb_so_path)\n"
             "OSError: /usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_1/lib/libtbe_adapter.so: undefined symbol: "
             "_ZN3Mki2DlC1ERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEb\n")


def _probe(rc=0, output="{}", torch_npu="2.7.1", cann="8.2.RC3"):
    return accept_npu.ImportProbe(rc, output, torch_npu, cann)


def test_cann_pairing_names_the_undefined_symbol_and_the_pinned_pair(lock):
    step = accept_npu.check_cann_pairing(_probe(1, UNDEFINED, cann="8.3.RC1"), lock)
    line = step.line()
    assert line.startswith("FAIL cann-pairing: torch_npu 2.7.1 on CANN 8.3.RC1 does not load")
    assert f"undefined symbol {UNDEFINED.split('undefined symbol: ')[1].strip()} in libtbe_adapter.so" in line
    assert "Ascend/pytorch #99" in line
    assert f"CANN {lock.cann.version} + torch_npu {lock.pypi['torch_npu']}" in line


@pytest.mark.parametrize("output, expected", [
    ("OSError: libhccl.so: cannot open shared object file: No such file or directory", "not sourced"),
    ("ModuleNotFoundError: No module named 'torch_npu'", "not installed in this interpreter"),
    ("ImportError: .../torch_npu/lib/libtorch_npu.so: undefined symbol: _ZN5torch10ValueErrorC1EPKcz",
     "a symbol of torch itself, so torch and torch_npu are not a pair"),  # Ascend/pytorch #35
    ("ModuleNotFoundError: No module named 'torch_npu.contrib'", "exit 1: ModuleNotFoundError"),
    ("RuntimeError: something else entirely", "exit 1: RuntimeError: something else entirely"),
])
def test_cann_pairing_other_failures_say_what_to_do(lock, output, expected):
    step = accept_npu.check_cann_pairing(_probe(1, output), lock)
    assert step.status == "FAIL" and expected in step.line(), step.line()
    assert "Ascend/pytorch #99" not in step.line()


def test_cann_pairing_passes_and_notes_a_pair_other_than_the_lock(lock):
    good = accept_npu.check_cann_pairing(_probe(cann=lock.cann.version.lower(), torch_npu=lock.pypi["torch_npu"]),
                                         lock)
    assert good.ok and "loads in a fresh process" in good.line() and "this is not it" not in good.line()
    other = accept_npu.check_cann_pairing(_probe(cann="8.3.RC1"), lock)
    assert other.ok and "this is not it: see the environment step" in other.line()


# ------------------------------------------------------------------------------------------------ ray-npu
def _probe_line(**fields) -> str:
    import json

    return accept_npu.PROBE_MARK + json.dumps(fields)


GOOD_ENTRY = dict(where="entrypoint", available=True, count=8, visible=None, noset="1")
GOOD_TASK = dict(where="task", available=True, count=8, visible=None, noset="1")


def _ray_output(entry=GOOD_ENTRY, task=GOOD_TASK) -> str:
    lines = ["Job submission server address: http://127.0.0.1:8265", "-" * 20]
    if entry:
        lines.append(_probe_line(**entry))
    if task:
        lines.append("(probe pid=4242, ip=10.0.0.2) ignored worker noise")
        lines.append(_probe_line(**task))
    lines.append("Job 'raysubmit_abc' succeeded")
    return "\n".join(lines)


def test_probe_lines_are_found_among_ray_output():
    text = _ray_output() + "\n" + accept_npu.PROBE_MARK + "{not json"
    probes = accept_npu.parse_probes(text)
    assert set(probes) == {"entrypoint", "task"} and probes["task"]["count"] == 8


def test_ray_npu_passes_when_both_processes_see_npus():
    step = accept_npu.check_ray_npu(returncode=0, output=_ray_output())
    assert step.ok and "job entrypoint: is_available True, 8 NPU(s)" in step.line()


def test_ray_npu_fails_on_the_job_supervisors_hidden_npus():
    hidden = dict(GOOD_ENTRY, available=False, count=0, visible="", noset=None)
    step = accept_npu.check_ray_npu(returncode=0, output=_ray_output(entry=hidden))
    line = step.line()
    assert step.status == "FAIL" and "the job entrypoint sees no NPU" in line
    assert "ASCEND_RT_VISIBLE_DEVICES=''" in line and "ray #59063" in line and "before `ray start`" in line


def test_ray_npu_fails_when_workers_lack_the_flag_or_the_resource():
    renumbered = dict(GOOD_TASK, count=1, visible="3", noset=None)
    step = accept_npu.check_ray_npu(returncode=0, output=_ray_output(task=renumbered))
    assert step.status == "FAIL" and f"runs without {accept_npu.NOSET} (" in step.line()
    assert accept_npu.check_ray_npu(returncode=0, output=_ray_output(task=dict(GOOD_TASK, noset="true"))).ok
    unscheduled = dict(where="task", error="not scheduled within 180 s: no node offers a free NPU resource")
    step = accept_npu.check_ray_npu(returncode=0, output=_ray_output(task=unscheduled))
    assert step.status == "FAIL" and "--resources" in step.line() and "not scheduled" in step.line()
    step = accept_npu.check_ray_npu(returncode=0, output=_ray_output(task=None))
    assert "the NPU task printed no probe" in step.line()


def test_ray_npu_without_probes_or_without_ray():
    step = accept_npu.check_ray_npu(returncode=1, output="ConnectionError: could not connect\n")
    assert step.status == "FAIL" and "exited 1: ConnectionError: could not connect" in step.line()
    skipped = accept_npu.check_ray_npu(returncode=None, output="", skip=accept_npu.NO_RAY.format(address="http://h"))
    assert skipped.status == "SKIP" and "ROLLOUT8_ACCEPT_RAY_ADDRESS" in skipped.line()


@pytest.mark.parametrize("env, address", [
    ({}, "http://127.0.0.1:8265"),
    ({"RAY_ADDRESS": "10.0.0.1:6379"}, "http://127.0.0.1:8265"),  # the GCS, not the job API
    ({"RAY_ADDRESS": "http://10.0.0.1:8265"}, "http://10.0.0.1:8265"),
    ({"ROLLOUT8_ACCEPT_RAY_ADDRESS": "10.0.0.1:8265", "RAY_ADDRESS": "http://x:1"}, "http://10.0.0.1:8265"),
])
def test_ray_job_address(env, address):
    assert accept_npu.ray_job_address(env) == address


# ------------------------------------------------------------------------------------------------ weight-sync
GB = 10**9


def test_weight_sync_reports_seconds_gbps_and_the_post_load_share():
    timing = accept_npu.SyncTiming(seconds=5.0, post_load_seconds=2.0, bytes=15 * GB, parameters=7_600_000_000)
    step = accept_npu.check_weight_sync(timing, model="pair-bench-7b")
    assert step.ok, step.line()
    assert ("one sync of pair-bench-7b (7.6B parameters, 15.0 GB bf16) in 5.0 s = 3.00 GB/s, "
            "post-load transpose/NZ 2.0 s (40%)") in step.line()


def test_a_slow_sync_names_the_post_load_step_when_it_dominates():
    timing = accept_npu.SyncTiming(seconds=60.0, post_load_seconds=45.0, bytes=15 * GB, parameters=7_600_000_000)
    step = accept_npu.check_weight_sync(timing, model="m")
    assert step.status == "FAIL" and "0.25 GB/s" in step.line() and "below 0.5 GB/s" in step.line()
    assert "SkyRL #176" in step.line() and "transpose + NZ cast" in step.line()


def test_a_slow_sync_otherwise_points_at_the_host_memory_reload():
    timing = accept_npu.SyncTiming(seconds=60.0, post_load_seconds=5.0, bytes=15 * GB, parameters=7_600_000_000)
    step = accept_npu.check_weight_sync(timing, model="m")
    assert step.status == "FAIL" and "trap 5" in step.line() and "flash_rl/0002" in step.line()
    unmeasured = accept_npu.SyncTiming(seconds=60.0, post_load_seconds=None, bytes=15 * GB, parameters=1)
    step = accept_npu.check_weight_sync(unmeasured, model="m")
    assert "post-load step not measured" in step.line() and "trap 5" in step.line()
    assert accept_npu.check_weight_sync(timing, model="m", min_gbps=0.2).ok  # the floor is the caller's


def test_weight_sync_without_a_measurement_fails():
    step = accept_npu.check_weight_sync(None, model="m", error="vllm.LLM did not start: OOM")
    assert step.line() == "FAIL weight-sync: no sync of m was timed: vllm.LLM did not start: OOM"


def test_the_generated_7b_pair_is_sized_before_it_is_written(tmp_path):
    from rollout8.quant.testmodels import PRESETS

    need = accept_npu.generated_pair_bytes(PRESETS["bench-7b"])
    assert 30e9 < need < 36e9  # 15.2 GB bf16 + 2 x ~8.7 GB (int8 linears, bf16 embeddings and lm_head)
    assert accept_npu.room_problem(int(need * 1.2), need, tmp_path) is None
    line = accept_npu.room_problem(int(20e9), need, tmp_path)
    assert line.startswith(f"needs ~{need / 1e9:.0f} GB free in {tmp_path}") and "has 20 GB" in line
    assert "ROLLOUT8_ACCEPT_WORK" in line


def test_min_sync_gbps_from_the_environment():
    assert accept_npu.min_sync_gbps({}) == accept_npu.MIN_SYNC_GBPS
    assert accept_npu.min_sync_gbps({"ROLLOUT8_ACCEPT_MIN_SYNC_GBPS": "2"}) == 2.0
    for bad in ("fast", "0", "-1"):
        with pytest.raises(ValueError, match="ROLLOUT8_ACCEPT_MIN_SYNC_GBPS"):
            accept_npu.min_sync_gbps({"ROLLOUT8_ACCEPT_MIN_SYNC_GBPS": bad})


def test_the_post_load_timer_wraps_each_quant_method_class_once_and_restores_it():
    """tests/npu/npu_worker.py's timer (the harness, no NPU involved): two layers sharing one quant method class
    are timed once each per call, and the class is as before afterwards."""
    import importlib

    import torch

    worker = importlib.import_module("npu_worker")  # tests/npu, on pytest's pythonpath (pyproject.toml)

    calls = []

    class Method:
        def process_weights_after_loading(self, layer):
            calls.append(layer)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.quant_method = Method()

    model = torch.nn.Sequential(Layer(), Layer())
    original = Method.process_weights_after_loading
    with worker.time_post_load(model, torch.device("cpu")) as total:
        for layer in model:
            layer.quant_method.process_weights_after_loading(layer)
    assert total["calls"] == 2 and total["seconds"] >= 0 and calls == list(model)
    assert Method.process_weights_after_loading is original


# ------------------------------------------------------------------------------------------------ hccl
QWEN7B = {"hidden_size": 3584, "vocab_size": 152064, "num_attention_heads": 28, "intermediate_size": 18944}


def test_largest_weight_of_the_7b_shape_is_the_embedding():
    assert accept_npu.largest_weight(QWEN7B) == ("model.embed_tokens.weight", (152064, 3584))
    wide = dict(QWEN7B, vocab_size=1000)
    assert accept_npu.largest_weight(wide) == ("model.layers.0.mlp.gate_proj.weight", (18944, 3584))


def test_the_bench_7b_preset_is_the_qwen_7b_shape():
    import dataclasses

    from rollout8.quant.testmodels import PRESETS

    shape = PRESETS["bench-7b"]
    assert 7.5e9 < shape.num_parameters() < 7.7e9  # Qwen2.5-7B: 7.61B
    assert accept_npu.largest_weight(dataclasses.asdict(shape)) == ("model.embed_tokens.weight", (152064, 3584))


@pytest.mark.parametrize("env, plan, problem", [
    ({}, None, None),
    ({"ROLLOUT8_ACCEPT_HCCL_MASTER": "10.0.0.1:29555", "ROLLOUT8_ACCEPT_HCCL_RANK": "1"},
     accept_npu.HcclPlan("10.0.0.1", 29555, 1, 2), None),
    ({"ROLLOUT8_ACCEPT_HCCL_MASTER": "10.0.0.1", "ROLLOUT8_ACCEPT_HCCL_RANK": "0"}, None, "give HOST:PORT"),
    ({"ROLLOUT8_ACCEPT_HCCL_MASTER": "10.0.0.1:70000", "ROLLOUT8_ACCEPT_HCCL_RANK": "0"}, None, "give HOST:PORT"),
    ({"ROLLOUT8_ACCEPT_HCCL_MASTER": "10.0.0.1:29555"}, None, "ROLLOUT8_ACCEPT_HCCL_RANK=''"),
    ({"ROLLOUT8_ACCEPT_HCCL_MASTER": "10.0.0.1:29555", "ROLLOUT8_ACCEPT_HCCL_RANK": "2"}, None, "1 .. 1"),
    ({"ROLLOUT8_ACCEPT_HCCL_MASTER": "h:1", "ROLLOUT8_ACCEPT_HCCL_RANK": "0", "ROLLOUT8_ACCEPT_HCCL_WORLD": "1"},
     None, "2 or more"),
])
def test_hccl_plan_from_the_environment(env, plan, problem):
    got, why = accept_npu.hccl_plan(env)
    assert got == plan
    assert (why is None) if problem is None else (problem in why), why


PLAN = accept_npu.HcclPlan("10.0.0.1", 29555, 1, 2)
SHAPE = (152064, 3584)


def _hccl(plan=PLAN, **probe):
    return accept_npu.check_hccl(plan, probe or None, tensor="model.embed_tokens.weight", shape=SHAPE)


def test_hccl_with_one_node_is_skipped_saying_how_to_give_the_second():
    step = _hccl(plan=None)
    assert step.status == "SKIP" and step.line().startswith("SKIP hccl: one node given")
    for name in ("ROLLOUT8_ACCEPT_HCCL_MASTER", "ROLLOUT8_ACCEPT_HCCL_RANK=0", "make accept-npu"):
        assert name in step.line()
    bad = accept_npu.check_hccl(None, None, tensor="t", shape=SHAPE, problem="ROLLOUT8_ACCEPT_HCCL_MASTER='x': ...")
    assert bad.status == "FAIL"


def test_hccl_passes_with_both_collectives_correct():
    ok = {"mismatched": 0, "entries": SHAPE[0] * SHAPE[1]}
    step = _hccl(init_s=3.2, broadcast={**ok, "seconds": 0.1}, all_reduce={**ok, "seconds": 0.2})
    assert step.ok, step.line()
    assert "rank 1 of 2 via 10.0.0.1:29555: communicator up in 3.2 s" in step.line()
    assert ("broadcast from rank 0 of model.embed_tokens.weight [152064, 3584], 1.09 GB correct in 0.10 s "
            "(10.9 GB/s)") in step.line()
    assert "all-reduce of model.embed_tokens.weight" in step.line() and "0.20 s (5.4 GB/s)" in step.line()


def test_a_corrupt_large_broadcast_is_the_verl_6834_bug():
    ok = {"mismatched": 0, "entries": 10, "seconds": 0.2}
    step = _hccl(init_s=1.0, broadcast={"mismatched": 7, "entries": 10, "seconds": 0.1}, all_reduce=ok)
    assert step.status == "FAIL" and "returned wrong data (7 of 10 entries)" in step.line()
    assert "verl PR #6834" in step.line()
    step = _hccl(init_s=1.0, broadcast=ok, all_reduce={"mismatched": 1, "entries": 10, "seconds": 0.1})
    assert step.status == "FAIL" and "wrong sums" in step.line()


def test_an_hccl_init_failure_is_mapped_to_its_usual_cause():
    error = ("RuntimeError: create_config:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:148 HCCL function error: "
             "hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, &(comm->hcclComm_)), error code is 4\n"
             "[ERROR] 2025-10-29 (PID:1, Device:0, RankID:1) ERR02200 DIST call hccl api failed.")
    step = _hccl(phase="init", error=error, env={"HCCL_IF_IP": "10.0.0.2"})
    line = step.line()
    assert line.startswith("FAIL hccl: rank 1 of 2 via 10.0.0.1:29555: init failed: HCCL_E_INTERNAL (4) from "
                           "hcclCommInitRootInfoConfig")
    assert "HCCL_SOCKET_IFNAME" in line and "HCCL_HOST_SOCKET_PORT_RANGE" in line and "verl #3947" in line
    assert line.endswith("(HCCL_IF_IP=10.0.0.2)")
    assert "no HCCL_* set" in _hccl(phase="broadcast", error="RuntimeError: boom").line()
    alone = _hccl(phase="init", error="Traceback ...\ntorch.distributed.DistStoreError: Timed out after 661 seconds")
    assert "DistStoreError: Timed out" in alone.line() and "if the other node never joined" in alone.line()
    assert "never joined" not in _hccl(phase="broadcast", error="RuntimeError: boom").line()
    assert "printed nothing" in _hccl().line()


# ------------------------------------------------------------------------------------------------ hccl codes
@pytest.mark.parametrize("text, code, function, ids", [
    ("HCCL function error: hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, &(comm->hcclComm_)), "
     "error code is 5", 5, "hcclCommInitRootInfoConfig", ()),
    ("HCCL function error: HcclGetRootInfo(&hcclID), error code is 11\nEJ0003: Failed to bind the IP port.",
     11, "HcclGetRootInfo", ("EJ0003",)),
    ("OPS function error: HcclAllreduce, error code is 6\nEI0006: Getting socket times out.", 6, "HcclAllreduce",
     ("EI0006",)),
    ("[op_base.cc:1097][InitCommRootInfo]errNo[0x0000000005000007] hcclComm init error", 7, None, ()),
])
def test_hccl_errors_are_parsed(text, code, function, ids):
    from rollout8.node.hccl_codes import parse_hccl_error

    err = parse_hccl_error(text)
    assert (err.code, err.function, err.error_ids) == (code, function, ids)


def test_hccl_code_names_follow_hccls_enum_and_every_cause_names_a_source():
    from rollout8.node import hccl_codes

    assert hccl_codes.parse_hccl_error("RuntimeError: out of memory") is None
    assert (hccl_codes.NAMES[4], hccl_codes.NAMES[5], hccl_codes.NAMES[9]) == \
        ("HCCL_E_INTERNAL", "HCCL_E_NOT_SUPPORT", "HCCL_E_TIMEOUT")
    assert all(c.code == k and c.sources and k in hccl_codes.NAMES for k, c in hccl_codes.CAUSES.items())
    unknown = hccl_codes.explain(hccl_codes.HcclError(17, None, ()))
    assert unknown.startswith("HCCL_E_PROFILING (17): no usual cause is known here") and "plog" in unknown
    timeout = hccl_codes.explain(hccl_codes.HcclError(9, "hcclCommInitRootInfoConfig", ("EI0006",)))
    assert "HCCL_CONNECT_TIMEOUT" in timeout and "remote rank did not send" in timeout


# ------------------------------------------------------------------------------------------------ without an NPU
def test_absent_npu_reasons(tmp_path):
    def which(name):
        return "/usr/local/bin/npu-smi"

    assert "no Ascend device nodes" in accept_npu.npu_absent_reason(dev=tmp_path)
    (tmp_path / "davinci0").touch()
    assert accept_npu.npu_absent_reason(dev=tmp_path, which=lambda n: None) == "npu-smi is not on PATH"
    assert accept_npu.npu_absent_reason(dev=tmp_path, which=which, find_spec=lambda m: None) == \
        "python module torch_npu is not installed"
    assert accept_npu.npu_absent_reason(dev=tmp_path, which=which, find_spec=lambda m: object()) is None


@pytest.mark.skipif(accept_npu.npu_absent_reason() is None, reason="this machine has an NPU")
def test_the_suite_collects_and_skips_with_the_reason_here():
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/npu", "-q", "-rs", "-p", "no:cacheprovider"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(accept_npu.STEPS)} skipped" in proc.stdout
    assert "needs an Ascend NPU node" in proc.stdout and accept_npu.npu_absent_reason() in proc.stdout


@pytest.mark.skipif(accept_npu.npu_absent_reason() is None, reason="this machine has an NPU")
def test_make_accept_npu_says_plainly_that_it_needs_an_npu():
    proc = subprocess.run(["bash", "scripts/accept-npu.sh"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "ACCEPT_PYTHON": sys.executable})
    assert proc.returncode == 3
    assert proc.stderr.startswith("accept-npu: the NPU acceptance suite needs an Ascend NPU node")
    assert "tests/npu" not in proc.stdout  # pytest never started


def test_weight_sync_shows_the_parts_a_jobs_sync_lines_carry():
    parts = {"gather": 0.5, "requant": 1.25, "load": 2.0, "postload": 1.25}
    timing = accept_npu.SyncTiming(seconds=5.0, post_load_seconds=1.2, bytes=15 * GB, parameters=1, parts=parts)
    step = accept_npu.check_weight_sync(timing, model="m")
    assert step.details == ["parts (host-side; the device is synchronized at the sync's ends only): gather 0.50 s, "
                            "requant 1.25 s, load 2.00 s, postload 1.25 s"]
    assert accept_npu.check_weight_sync(timing, model="m", min_gbps=100).details == step.details  # FAIL keeps them


def test_the_script_refuses_a_work_directory_its_user_cannot_write_before_the_npu_gate(tmp_path):
    """accept-npu.sh runs as the training container's user: a work directory it cannot make (here under a file, which
    refuses root too) is named, with the user and the knob, before the NPU gate (exit 2, not the gate's 3); a
    writable one passes to the gate (here a stand-in python that exits 3, as the gate does without an NPU)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    gate = tmp_path / "python"
    gate.write_text("#!/bin/sh\necho gate-reached >&2\nexit 3\n")
    gate.chmod(0o755)
    script = REPO / "scripts" / "accept-npu.sh"
    results = {}
    for name, work in (("blocked", blocker / "accept"), ("writable", tmp_path / "home" / "accept")):
        env = dict(os.environ, ROLLOUT8_ACCEPT_WORK=str(work), ACCEPT_PYTHON=str(gate), HOME=str(tmp_path / "home"))
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env)
        results[name] = (proc.returncode, proc.stderr)
    rc, err = results["blocked"]
    assert rc == 2 and "gate-reached" not in err, err
    assert (f"accept-npu: the work directory {blocker / 'accept'} cannot be written by uid {os.getuid()} (gid "
            f"{os.getgid()}), the user the suite runs as: set ROLLOUT8_ACCEPT_WORK (Ansible: "
            "rollout8_accept_work)") in err
    rc, err = results["writable"]
    assert rc == 3 and "gate-reached" in err and (tmp_path / "home" / "accept").is_dir(), err
