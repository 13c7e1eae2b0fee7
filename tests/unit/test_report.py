"""`rollout8 report` on training logs written in verl's formats: console lines, JSONL file logger, tensorboard."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import struct
import subprocess
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from verl_log_writers import (  # noqa: E402
    ConsoleWriter,
    JsonlWriter,
    console_line,
    train_metrics,
    val_metrics,
    verl_loggers,
    verl_source,
)

from rollout8 import cli  # noqa: E402
from rollout8.results.report import build, speedup  # noqa: E402
from rollout8.results.verl_logs import load_run, parse_console_line  # noqa: E402

RAY_PREFIX = "(TaskRunner pid=4242) "


def _np(data: dict) -> dict:
    """Like verl's reduce_metrics output: numpy scalars (which print as np.float64(...) under numpy 2)."""
    return {k: np.float64(v) if isinstance(v, float) else v for k, v in data.items()}


def write_run(run_dir: Path, *, factor: float, steps: int, accs: dict[int, float], console: bool = True,
              jsonl: bool = True, with_tis: bool = True, with_throughput: bool = True) -> None:
    """A run logging `steps` training steps, validation at the steps in `accs` (step 0 = before training)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    writers = []
    if console:
        writers.append(ConsoleWriter(run_dir / "train.log", prefix=RAY_PREFIX))
    if jsonl:
        writers.append(JsonlWriter(run_dir / "metrics.jsonl"))
    if 0 in accs:
        for w in writers:
            w.log(val_metrics(accs[0]), 0)
    for step in range(1, steps + 1):
        data = train_metrics(step, 10.0 * factor + 0.2 * (step % 3), 0.4 + 0.04 * step, with_tis, with_throughput)
        if step in accs:
            data.update(val_metrics(accs[step]))
        for w in writers:
            w.log(_np(data) if isinstance(w, ConsoleWriter) else data, step)
    for w in writers:
        w.close()


# ---------------------------------------------------------------------------------------------- parsing
def test_console_line_parsing_handles_ray_prefix_numpy_reprs_and_special_values():
    line = RAY_PREFIX + console_line(
        {"critic/rewards/mean": np.float64(0.75), "actor/pg_loss": -1.5e-05, "training/global_step": 3,
         "rollout_corr/kl": float("nan"), "perf/throughput": np.float32(12.5), "flag": True, "name": "skipped"}, 3)
    step, metrics, bad = parse_console_line("\x1b[36m" + line + "\x1b[0m\n")
    assert step == 3 and bad == []
    assert metrics["critic/rewards/mean"] == 0.75
    assert metrics["actor/pg_loss"] == -1.5e-05
    assert metrics["training/global_step"] == 3
    assert math.isnan(metrics["rollout_corr/kl"])
    assert metrics["perf/throughput"] == 12.5
    assert metrics["flag"] == 1.0
    assert "name" not in metrics  # verl prints numbers only
    line = "(TaskRunner pid=7, ip=10.0.0.2) step:4 - a:1.5 [repeated 2x across cluster]"
    step, metrics, bad = parse_console_line(line)
    assert (step, metrics, bad) == (4, {"a": 1.5}, [])
    assert parse_console_line("epoch 1, training/global_step:3 - foo:1") is None
    assert parse_console_line("Training Progress: 10%|#  | 1/10") is None


@pytest.fixture(scope="module")
def verl_tree(tmp_path_factory):
    root, why = verl_source(tmp_path_factory.mktemp("verl-src"))
    if root is None:
        pytest.skip(f"no verl source to run verl's own loggers ({why}); set ROLLOUT8_VERL_SRC to a verl checkout")
    return root


def test_hand_written_console_format_is_verls(verl_tree, capsys):
    local_logger, _ = verl_loggers(verl_tree)
    data = _np(train_metrics(2, 9.5, 0.6)) | {"name": "x"}
    local_logger(print_to_console=True).log(data=data, step=2)
    assert capsys.readouterr().out == console_line(data, 2) + "\n"


def test_real_verl_loggers_round_trip(verl_tree, tmp_path, monkeypatch):
    local_logger, file_logger = verl_loggers(verl_tree)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(run_dir / "exp.jsonl"))
    console, jsonl = local_logger(print_to_console=True), file_logger("proj", "exp")
    expected = {}
    buf = io.StringIO()
    with redirect_stdout(buf):
        for step in range(1, 5):
            data = train_metrics(step, 10.0 + step, 0.5)
            expected[step] = data
            console.log(data=_np(data), step=step)
            jsonl.log(data=data, step=step)
    jsonl.finish()
    (run_dir / "console.log").write_text("".join(RAY_PREFIX + line + "\n" for line in buf.getvalue().splitlines()))
    for only in ("console.log", "exp.jsonl"):
        run = load_run(run_dir / only)
        assert sorted(run.steps) == [1, 2, 3, 4], only
        for step, data in expected.items():
            for key, value in data.items():
                assert run.steps[step][key] == pytest.approx(value), (only, step, key)


# ---------------------------------------------------------------------------------------------- robustness
def test_truncated_console_and_jsonl_are_read_up_to_the_cut(tmp_path):
    run_dir = tmp_path / "int8"
    write_run(run_dir, factor=0.8, steps=6, accs={0: 0.5})
    # The run is killed while writing step 7: the console line and the JSONL record end mid-way.
    partial = RAY_PREFIX + console_line(_np(train_metrics(7, 8.0, 0.7)), 7)
    with open(run_dir / "train.log", "a") as fh:
        fh.write(partial[: partial.index("timing_s/gen:") + len("timing_s/gen:np.float6")])
    record = json.dumps({"step": 7, "data": train_metrics(7, 8.0, 0.7)})
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(record[: len(record) // 2])
    run = load_run(run_dir)
    assert max(run.steps) == 7
    assert "critic/rewards/mean" in run.steps[7] and "timing_s/gen" not in run.steps[7]
    assert "timing_s/step" not in run.steps[7]
    notes = " ".join(run.notes)
    assert "train.log:" in notes and "step 7" in notes and "interrupted" in notes
    assert "metrics.jsonl: last line is not complete JSON" in notes


def test_restarted_steps_later_values_win_and_are_noted(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir, factor=1.0, steps=5, accs={}, jsonl=False)
    with open(run_dir / "train.log", "a") as fh:  # resumed from the step-3 checkpoint: steps 4, 5 again
        for step in (4, 5):
            fh.write(RAY_PREFIX + console_line(_np(train_metrics(step, 99.0, 0.9)), step) + "\n")
    run = load_run(run_dir)
    assert run.steps[4]["timing_s/step"] == 99.0 and run.steps[5]["critic/rewards/mean"] == 0.9
    assert run.steps[3]["timing_s/step"] != 99.0
    assert run.relogged_steps == {4, 5}
    assert any("4, 5" in n and "restarted" in n for n in run.notes)


def test_identical_duplicates_from_two_loggers_are_not_called_restarts(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir, factor=1.0, steps=4, accs={0: 0.3, 4: 0.6})  # console + JSONL: same values twice
    run = load_run(run_dir)
    assert run.relogged_steps == set()
    assert sorted(run.steps) == [0, 1, 2, 3, 4]
    assert len(run.files) == 2


def test_collected_ray_logs_use_the_driver_log_for_metrics(tmp_path):
    """The layout Ansible collects: driver.log of the job plus each node's Ray session logs (all jobs)."""
    job = tmp_path / "logs" / "raysubmit_B"
    worker_dir = job / "node1" / "logs"
    worker_dir.mkdir(parents=True)
    with open(job / "driver.log", "w") as fh:
        fh.write("2025-01-01 INFO job started\n")
        for step in (1, 2):
            fh.write(RAY_PREFIX + console_line(_np(train_metrics(step, 8.0, 0.6)), step) + "\n")
    with open(worker_dir / "worker-abc-01000000-123.out", "w") as fh:
        fh.write(":job_id:01000000\n")  # an earlier job on the same Ray cluster, with other values
        for step in (1, 2, 3):
            fh.write(console_line(train_metrics(step, 50.0, 0.1), step) + "\n")
    (worker_dir / "worker-def-02000000-456.err").write_text(
        "2025-01-01 DEBUG flash_rl - rank 0 flash_rl config: fn: int8\n")
    run = load_run(job)
    assert sorted(run.steps) == [1, 2]
    assert run.steps[2]["timing_s/step"] == 8.0 and run.relogged_steps == set()
    assert run.mode == "int8" and run.mode_source == "FlashRL log lines"
    assert any("metrics read from the Ray job driver log (driver.log)" in n for n in run.notes)


def test_mode_from_rendered_manifest_flashrl_config_or_run_spec(tmp_path):
    for name, files, expected in (
        ("manifest", {"render.json": json.dumps({"schema": 1, "name": "x", "quantization": "hybrid"}),
                      "flashrl.yaml": "configs:\n- fn: int8\n"}, ("hybrid", "rendered manifest render.json")),
        ("flashrl", {"flashrl.yaml": "configs:\n- fn: int8\n- fn: bf16\n"},
         ("hybrid (bf16+int8)", "FlashRL config flashrl.yaml")),
        ("spec", {"spec.yaml": "rollout:\n  quantization: bf16\n"},
         ("bf16", "run spec spec.yaml (rollout.quantization)")),
        ("none", {"other.yaml": "a: 1\n"}, (None, "")),
    ):
        run_dir = tmp_path / name
        write_run(run_dir, factor=1.0, steps=1, accs={}, jsonl=False)
        for file, text in files.items():
            (run_dir / file).write_text(text)
        run = load_run(run_dir)
        assert (run.mode, run.mode_source) == expected, name


def test_config_option_gives_mode_and_label_as_the_verify_play_calls_it(tmp_path, capsys):
    """`rollout8 report JOB_LOGS --config PLAN_DIR/rollout8-plan.json -o JOB_LOGS/report` (one run: no speed-up)."""
    job = tmp_path / "logs" / "rollout8-qwen-int8-0123456789ab"
    write_run(job, factor=0.8, steps=3, accs={0: 0.5, 3: 0.6}, jsonl=False)
    (job / "train.log").rename(job / "driver.log")
    plan = tmp_path / "plan" / "rollout8-plan.json"
    plan.parent.mkdir()
    plan.write_text(json.dumps({"schema": 1, "name": "qwen2.5-7b-int8-gsm8k", "quantization": "int8",
                                "job_id": "rollout8-qwen-int8-0123456789ab"}))
    out = job / "report"
    assert cli.main(["report", str(job), "--config", str(plan), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "qwen2.5-7b-int8-gsm8k (int8): 3 steps, final val 0.6 (best 0.6)" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"][0]["step_time"].get("speedup") is None
    # a second call on the same directory ignores the report it wrote (no log files in it)
    assert cli.main(["report", str(job), "--config", str(plan), "-o", str(out)]) == 0


# ---------------------------------------------------------------------------------------------- summary
def test_speedup_ratio_and_interval():
    base = {s: 10.0 + (s % 2) for s in range(1, 21)}
    fast = {s: 8.0 + (s % 2) * 0.8 for s in range(1, 21)}
    sp = speedup(base, fast)
    assert sp.ratio == pytest.approx(10.5 / 8.4)
    assert sp.low <= sp.ratio <= sp.high and sp.steps == 20
    assert speedup(base, {}) is None


@pytest.fixture
def three_runs(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs / "bf16", factor=1.0, steps=10, accs={0: 0.50, 5: 0.70, 10: 0.88})
    (runs / "bf16" / "run.yaml").write_text("rollout:\n  quantization: bf16\n")
    # int8: interrupted after step 8 (console only for the tail), one step logged twice after a restart
    write_run(runs / "int8", factor=0.8, steps=8, accs={0: 0.50, 5: 0.72})
    with open(runs / "int8" / "train.log", "a") as fh:
        fh.write(RAY_PREFIX + console_line(_np(train_metrics(8, 8.3, 0.75)), 8) + "\n")
        fh.write(RAY_PREFIX + console_line(_np(train_metrics(9, 8.1, 0.76)), 9)[:80])
    (runs / "int8" / "flashrl.yaml").write_text("configs:\n- fn: int8\n  model: /models/int8\n")
    # hybrid: no throughput and no rollout-correction metrics at all, mode from FlashRL's log lines
    write_run(runs / "hybrid", factor=0.9, steps=10, accs={0: 0.50, 10: 0.86}, jsonl=False, with_tis=False,
              with_throughput=False)
    (runs / "hybrid" / "worker-1.out").write_text(
        "(WorkerDict pid=1) rank 0 flash_rl config: fn: int8\n(WorkerDict pid=2) rank 4 flash_rl config: fn: bf16\n")
    return runs


def test_report_three_runs(three_runs, tmp_path):
    out = tmp_path / "out"
    summary = build([three_runs / "bf16", three_runs / "int8", three_runs / "hybrid"], out)
    rows = {r["label"]: r for r in summary["runs"]}
    assert summary["baseline"] == "bf16"
    assert [rows[k]["mode"] for k in ("bf16", "int8", "hybrid")] == ["bf16", "int8", "hybrid (bf16+int8)"]
    vkey = "val-core/openai/gsm8k/reward/mean@1"
    assert rows["bf16"]["val"][vkey] == {"final": 0.88, "final_step": 10, "best": 0.88, "best_step": 10,
                                         "initial": 0.5}
    assert rows["int8"]["val"][vkey]["final"] == 0.72 and rows["int8"]["last_step"] == 9
    # step time: int8 ~0.8x of bf16 -> speed-up ~1.25 (steps 2..8 in common; step 8 relogged with 8.3 s)
    sp = rows["int8"]["step_time"]["speedup"]
    assert sp["steps"] == 7 and 1.15 < sp["ratio"] < 1.3 and sp["low"] <= sp["ratio"] <= sp["high"]
    assert rows["hybrid"]["throughput"] is None and rows["bf16"]["throughput"] > 0
    assert rows["bf16"]["switch_time"] == pytest.approx(0.5)
    assert rows["bf16"]["update_time"] == pytest.approx(0.25 * rows["bf16"]["step_time"]["mean"], rel=0.01)
    notes = "\n".join(summary["notes"])
    assert "int8: steps logged more than once with different values (restarted run?): 8" in notes
    assert "int8: stops at step 9 while the longest run reaches 10" in notes
    assert "train.log:" in notes and "step 9" in notes
    assert "Throughput: hybrid has no `perf/throughput`" in notes
    assert "hybrid has no `rollout_corr/rollout_is_mean`" in notes
    assert sorted(summary["pictures"]) == sorted(
        ["accuracy.png", "response_length.png", "time.png", "throughput.png", "rollout_correction.png"])
    for name in summary["pictures"]:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert width > 300 and height > 200
    page = (out / "report.html").read_text()
    assert page.count("<img src=\"data:image/png;base64,") == 5
    assert "hybrid has no `perf/throughput`" in page and "1.2" in page
    assert json.loads((out / "summary.json").read_text())["baseline"] == "bf16"


def test_metric_missing_from_every_run_is_a_note_not_a_crash(tmp_path):
    write_run(tmp_path / "a", factor=1.0, steps=3, accs={}, with_tis=False, with_throughput=False)
    write_run(tmp_path / "b", factor=0.9, steps=3, accs={}, with_tis=False, with_throughput=False)
    summary = build([tmp_path / "a", tmp_path / "b"], tmp_path / "out", labels=["bf16 run", "int8 run"],
                    modes=["bf16", "int8"])
    notes = "\n".join(summary["notes"])
    assert "validation: no run has `val-core/" in notes
    assert "Throughput: no run has `perf/throughput`" in notes
    assert "rollout correction: no run has `rollout_corr/*`" in notes
    assert "throughput.png" not in summary["pictures"] and "time.png" in summary["pictures"]
    assert [r["label"] for r in summary["runs"]] == ["bf16 run", "int8 run"]


def test_cli_errors_are_one_clear_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "driver.log").write_text("nothing to see\n")
    assert cli.main(["report", str(empty), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no verl metrics found" in err and str(empty) in err
    assert cli.main(["report", str(tmp_path / "missing"), "-o", str(tmp_path / "o")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    write_run(tmp_path / "r", factor=1.0, steps=2, accs={})
    bad_config = ["--config", str(empty / "driver.log")]
    assert cli.main(["report", str(tmp_path / "r"), "-o", str(tmp_path / "o"), *bad_config]) == 2
    assert "--config" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path / "r"), "-o", str(tmp_path / "o"), "--baseline", "nope"]) == 2
    assert "--baseline nope: no run has that label" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path / "r"), "-o", str(tmp_path / "o")]) == 0
    assert "wrote" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- tensorboard
def test_tensorboard_fixture_from_torch_summary_writer(tmp_path):
    """Event bytes written by torch's SummaryWriter (data/report/make_tfevents.py), read with no tensorboard."""
    run = load_run(Path(__file__).parent / "data" / "report" / "tensorboard")
    assert sorted(run.steps) == [1, 2, 3] and run.notes == []
    assert run.steps[2]["critic/rewards/mean"] == pytest.approx(0.7)
    assert run.steps[3]["timing_s/step"] == pytest.approx(13.0)
    assert run.steps[3]["val-core/openai/gsm8k/reward/mean@1"] == pytest.approx(0.75)
    assert "val-core/openai/gsm8k/reward/mean@1" not in run.steps[2]


def test_tensorboard_events_written_by_torch(tmp_path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        pytest.skip(f"torch.utils.tensorboard unavailable ({exc}); rollout8's event reader needs no package, "
                    "but writing real event files for this test needs `tensorboard`")
    run_dir = tmp_path / "tb"
    writer = SummaryWriter(str(run_dir))  # what verl's _TensorboardAdapter does
    for step in range(1, 4):
        for key, value in train_metrics(step, 10.0, 0.5).items():
            writer.add_scalar(key, value, step)
    writer.close()
    run = load_run(run_dir)
    assert sorted(run.steps) == [1, 2, 3]
    assert run.steps[2]["critic/rewards/mean"] == pytest.approx(0.5)
    assert run.steps[3]["timing_s/step"] == pytest.approx(10.0)
    # a writer killed mid-record: everything before the cut is read, and the cut is noted
    (events,) = run_dir.glob("events.out.tfevents.*")
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / events.name).write_bytes(events.read_bytes()[:-7])
    run = load_run(cut)
    assert sorted(run.steps) == [1, 2, 3] and "timing_s/step" in run.steps[2]
    assert any("ends inside a record" in n for n in run.notes)


# ---------------------------------------------------------------------------------------------- browser
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--virtual-time-budget=10000"]


def test_html_opens_with_its_pictures_in_a_real_browser(three_runs, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (scripts/ci-setup.sh installs it): cannot render the page")
    out = tmp_path / "out"
    summary = build([three_runs / "bf16", three_runs / "int8", three_runs / "hybrid"], out)
    n = len(summary["pictures"])
    assert n == 5
    profile = tmp_path / "chromium-profile"
    env = dict(os.environ, HOME=str(tmp_path))
    proc = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", (out / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"images-loaded:{n}/{n}" in proc.stdout, proc.stdout[-500:] + proc.stderr[-2000:]
    # The check itself can fail: a broken picture is counted as not loaded.
    page = (out / "report.html").read_text()
    broken = out / "broken.html"
    broken.write_text(page.replace("data:image/png;base64,iVBOR", "data:image/png;base64,AAAA", 1))
    proc = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}-2", "--dump-dom", broken.as_uri()],
        capture_output=True, text=True, timeout=120, env=env)
    assert f"images-loaded:{n - 1}/{n}" in proc.stdout, proc.stdout[-500:]
