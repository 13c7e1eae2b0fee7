"""`rollout8 logs`: verdicts on logs written by FlashRL's own logging, laid out the way Ray writes them.

The FlashRL lines come from running FlashRL's real import-time patching and patched vllm.LLM.__init__
(flashrl_log_emitter.py, against a stand-in vllm package); the tests then place them in Ray's layouts:
per-worker files (session_*/logs/worker-<id>-<job>-<pid>.err with the `:actor_name:` marker) and the driver's
forwarded output (`(WorkerDict pid=N, ip=A)` prefixes, ANSI colours, `[repeated Nx across cluster]`).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from flashrl_log_emitter import emit  # tests/support

from rollout8.cli import main
from rollout8.runspec.flashrl_config import build_config, write_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    """Real FlashRL output: a hybrid 2:1 config over ranks 0-2 (int8, int8, bf16) with 3 syncs each,
    rank 3 (int8) whose quantizer hits trap 4 (no CUDA), and a worker that imported flash_rl without
    FLASHRL_CONFIG."""
    import torch

    tmp = tmp_path_factory.mktemp("emit")
    torch.save({}, tmp / "profile.pt")
    config = write_config(build_config("hybrid", int8_model=str(tmp / "int8"), profile=str(tmp / "profile.pt"),
                                       bf16_model=str(tmp / "bf16"), mix=(2, 1)), tmp / "flashrl.yaml")
    ranks = [{"rank": r, "tp": 1, "syncs": 3, "file": str(tmp / f"rank{r}.log")} for r in range(3)]
    ranks.append({"rank": 3, "tp": 1, "syncs": 1, "file": str(tmp / "rank3.log"), "cuda_shim": False})
    emit(tmp / "a", config, ranks)
    emit(tmp / "b", None, [{"rank": 4, "tp": 1, "syncs": 0, "file": str(tmp / "noconfig.log")}])
    return tmp


def ray_session(root: Path, workers: dict[int, tuple[str, Path]], session: str = "2026-11-30_12-00-00_000000_1",
                job: str = "01000000") -> Path:
    """Ray's layout: one worker-<id>-<job>-<pid>.out/.err pair per process, the actor marker first."""
    logs = root / f"session_{session}" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for pid, (actor, source) in workers.items():
        stem = f"worker-{pid:056x}-{job}-{pid}"
        (logs / f"{stem}.out").write_text(f":job_id:{job}\n:actor_name:{actor}\n")
        (logs / f"{stem}.err").write_text(f":job_id:{job}\n:actor_name:{actor}\n" + source.read_text())
    (logs / "raylet.out").write_text("[2026-11-30 12:00:00,000 I 1 1] raylet started\n")
    return root


def run_logs(path: Path, capsys, *extra) -> tuple[int, dict]:
    rc = main(["logs", str(path), "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_every_rank_patched_or_bf16_by_config(emitted, tmp_path, capsys):
    ray_session(tmp_path, {101: ("WorkerDict", emitted / "rank0.log"), 102: ("WorkerDict", emitted / "rank1.log"),
                           103: ("WorkerDict", emitted / "rank2.log")})
    rc, report = run_logs(tmp_path, capsys)
    assert rc == 0 and report["ok"]
    assert [(r["rank"], r["status"], r["syncs"], r["pid"]) for r in report["ranks"]] == [
        (0, "patched", 3, 101), (1, "patched", 3, 102), (2, "bf16", 0, 103)]
    assert report["quantized_syncs"] == 6


def test_a_rank_that_patched_then_ended_before_its_first_sync_is_named_and_red(emitted, tmp_path, capsys):
    """Issue 45: the patch line alone is not int8. A rank whose engine FlashRL patched, then ended before its first
    quantized weight sync (exit, crash, lost node), is named and fails the verdict beside ranks that synced."""
    config = emitted / "flashrl.yaml"
    emit(tmp_path / "emit", config, [{"rank": 1, "tp": 1, "syncs": 0, "file": str(tmp_path / "died.log")}])
    ray_session(tmp_path / "run", {101: ("WorkerDict", emitted / "rank0.log"),
                                   102: ("WorkerDict", tmp_path / "died.log")})
    rc, report = run_logs(tmp_path / "run", capsys)
    assert rc != 0 and not report["ok"] and report["no_sync"] == 1
    assert [(r["rank"], r["status"], r["syncs"]) for r in report["ranks"]] == [(0, "patched", 3), (1, "no-sync", 0)]
    assert "no quantized weight sync followed" in report["ranks"][1]["reason"]
    assert main(["logs", str(tmp_path / "run")]) != 0
    out = capsys.readouterr().out
    assert "rank 1 (pid 102" in out and "no-sync: FlashRL patched its vLLM engine" in out, out
    assert "1 patched but never synced" in out


def test_cuda_failure_is_an_error(emitted, tmp_path, capsys):
    ray_session(tmp_path, {101: ("WorkerDict", emitted / "rank0.log"), 104: ("WorkerDict", emitted / "rank3.log")})
    rc, report = run_logs(tmp_path, capsys)
    assert rc == 1 and not report["ok"]
    bad = report["ranks"][1]
    assert bad["rank"] == 3 and bad["status"] == "error" and "Torch not compiled with CUDA enabled" in bad["reason"]


def test_cuda_driver_failure_is_an_error(emitted, tmp_path, capsys):
    # What FlashRL's unpatched quantizer raises on a CUDA build of torch without a GPU (seen in the engine tier).
    text = (emitted / "rank3.log").read_text()
    assert "Torch not compiled with CUDA enabled" in text
    variant = tmp_path / "rank3-driver.log"
    variant.write_text(text.replace("Torch not compiled with CUDA enabled", "Found no NVIDIA driver on your system."))
    ray_session(tmp_path / "s", {101: ("WorkerDict", emitted / "rank0.log"), 104: ("WorkerDict", variant)})
    rc, report = run_logs(tmp_path / "s", capsys)
    assert rc == 1 and report["ranks"][1]["status"] == "error"
    assert "Found no NVIDIA driver" in report["ranks"][1]["reason"]


def test_worker_that_never_saw_the_config(emitted, tmp_path, capsys):
    ray_session(tmp_path, {101: ("WorkerDict", emitted / "rank0.log"), 105: ("WorkerDict", emitted / "noconfig.log"),
                           106: ("TaskRunner", emitted / "noconfig.log")})
    rc, report = run_logs(tmp_path, capsys)
    assert rc == 1 and report["no_config"] == 1 and report["rollout_ranks"] == 2
    missing = [r for r in report["ranks"] if r["status"] == "no-config"]
    assert missing[0]["pid"] == 105 and "FLASHRL_CONFIG" in missing[0]["reason"]
    assert report["other_processes"] == 1  # the TaskRunner's skip is not a rollout rank


def test_driver_output_with_ray_prefixes_and_repeats(emitted, tmp_path, capsys):
    lines = []
    for pid, ip, name in ((201, "10.0.0.1", "rank0.log"), (202, "10.0.0.2", "rank1.log")):
        for line in (emitted / name).read_text().splitlines():
            lines.append(f"\x1b[36m(WorkerDict pid={pid}, ip={ip})\x1b[0m {line}")
    lines.append("\x1b[36m(WorkerDict pid=202, ip=10.0.0.2)\x1b[0m 2026-11-30 12:00:09,000 - "
                 "flash_rl.flash_quantization - DEBUG - flash_rl quantization is called [repeated 5x across cluster]")
    lines.append("(TaskRunner pid=99) 2026-11-30 12:00:00,000 - flash_rl - DEBUG - Skipping the patching of vllm")
    lines.append("plain driver line, no prefix")
    (tmp_path / "driver.log").write_text("\n".join(lines) + "\n")
    rc, report = run_logs(tmp_path / "driver.log", capsys)
    assert rc == 0
    assert [(r["rank"], r["ip"], r["syncs"]) for r in report["ranks"]] == [(0, "10.0.0.1", 3), (1, "10.0.0.2", 3)]
    assert report["unattributed_syncs"] == 5 and report["quantized_syncs"] == 11


def test_plain_files_and_min_syncs(emitted, tmp_path, capsys):
    for r in (0, 1):
        shutil.copy(emitted / f"rank{r}.log", tmp_path / f"rank{r}.log")
    rc, report = run_logs(tmp_path, capsys)
    assert rc == 0 and report["patched"] == 2
    rc, report = run_logs(tmp_path, capsys, "--min-syncs", "4")
    assert rc == 1 and "--min-syncs 4" in report["ranks"][0]["reason"]


def test_no_rank_found_is_not_a_pass(tmp_path, capsys):
    (tmp_path / "x.log").write_text("nothing from FlashRL here\n")
    assert main(["logs", str(tmp_path)]) == 1
    assert "no rollout rank found" in capsys.readouterr().out


def test_only_bf16_ranks_is_not_int8(emitted, tmp_path, capsys):
    shutil.copy(emitted / "rank2.log", tmp_path / "rank2.log")
    rc, report = run_logs(tmp_path, capsys)
    assert rc == 1 and report["bf16"] == 1 and report["patched"] == 0


def test_info_level_logs_are_incomplete_not_patched(emitted, tmp_path, capsys):
    """Without FLASHRL_LOGGING_LEVEL=DEBUG the load_weights and sync lines are missing: no false pass."""
    lines = [line for line in (emitted / "rank0.log").read_text().splitlines() if " - DEBUG - " not in line]
    (tmp_path / "rank0.log").write_text("\n".join(lines) + "\n")
    rc, report = run_logs(tmp_path, capsys)
    assert rc == 1 and report["ranks"][0]["status"] == "incomplete"
    assert "FLASHRL_LOGGING_LEVEL" in report["ranks"][0]["reason"]


def test_steps_require_exactly_one_sync_per_training_step(emitted, tmp_path, capsys):
    """--steps N (the verify play passes the plan's trainer.total_training_steps): 3 syncs pass only for 3 steps."""
    for r in (0, 1):
        shutil.copy(emitted / f"rank{r}.log", tmp_path / f"rank{r}.log")
    assert run_logs(tmp_path, capsys, "--steps", "3")[0] == 0
    for steps in ("2", "4"):  # a missed sync, or one sync too many (a rank reloading twice), both fail
        rc, report = run_logs(tmp_path, capsys, "--steps", steps)
        assert rc == 1 and all(f"one per training step: {steps}" in r["reason"] for r in report["ranks"])


def test_collected_worker_logs_name_their_host(emitted, tmp_path, capsys):
    """The verify play's layout, <job>/<host>/logs/worker-*: a rank without a Ray ip prefix is named by host."""
    for host, r in (("node-a", 0), ("node-b", 1)):
        ray_session(tmp_path / host, {100 + r: ("WorkerDict", emitted / f"rank{r}.log")})
    assert main(["logs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "(pid 100 in node-a)" in out and "(pid 101 in node-b)" in out


def test_async_rollout_servers_are_named_and_fail_the_verdict(tmp_path, capsys):
    """rollout.mode=async: verl's vLLMHttpServer imports flash_rl (its patches apply) but builds an AsyncLLM,
    which FlashRL never hooks, so no rank line ever appears: each server is named, and the verdict fails."""
    server_log = tmp_path / "server.log"
    server_log.write_text("2026-12-01 12:05:08,068 - flash_rl.vllm_patch - DEBUG - Successfully patched vllm\n"
                          "WARNING 12-01 12:05:26 LoRA dynamic loading & unloading is enabled in the API server.\n")
    for host, pid in (("node-a", 200), ("node-b", 201)):
        ray_session(tmp_path / "job" / host, {pid: ("vLLMHttpServer", server_log)})
    rc = main(["logs", str(tmp_path / "job")])
    out = capsys.readouterr().out
    assert rc != 0 or "NOT confirmed" in out
    assert "(pid 200 in node-a): async: verl's async rollout server" in out
    assert "(pid 201 in node-b): async:" in out and "2 async rollout server(s)" in out
    assert "verdict: NOT confirmed" in out


def test_a_crashed_session_beside_an_older_good_one_is_judged_alone(emitted, tmp_path, capsys):
    """An older, good Ray session and a newer one whose rank crashed (no CUDA) in one directory: the newest is
    judged, and named, never merged with the good one; --job picks the other."""
    ray_session(tmp_path, {101: ("WorkerDict", emitted / "rank0.log")}, session="2026-11-30_12-00-00_000000_1")
    ray_session(tmp_path, {201: ("WorkerDict", emitted / "rank3.log")}, session="2026-12-01_09-00-00_000000_1",
                job="02000000")
    assert main(["logs", str(tmp_path)]) != 0
    captured = capsys.readouterr()
    new, old = "session_2026-12-01_09-00-00_000000_1:02000000", "session_2026-11-30_12-00-00_000000_1:01000000"
    assert f"judging job {new} (the newest of 2 jobs in {tmp_path}); 1 older job(s) ignored: {old}" in captured.out
    assert "pid 101" not in captured.out and "verdict: NOT confirmed" in captured.out
    assert f"job {new}: int8 rollout not confirmed on 1 of 1 rollout worker(s): rank 3 (pid 201) error" \
        in captured.err
    rc, report = run_logs(tmp_path, capsys, "--job", "session_2026-11-30_12-00-00_000000_1")
    assert rc == 0 and report["ok"] and [r["pid"] for r in report["ranks"]] == [101]
    assert report["judged"] == old and report["ignored"] == [new] and report["chosen_by"] == "--job"
    assert main(["logs", str(tmp_path), "--job", "session_1999"]) != 0
    assert "--job session_1999: no such job in these logs (found: " in capsys.readouterr().err


def test_jobs_collected_side_by_side_are_told_apart(emitted, tmp_path, capsys):
    """The verify play's layout, logs/<job>/driver.log + <host>/logs/worker-*, for two jobs: the one submitted
    last is judged (by the UTC time in the launch role's submission id, not by which file was written last).
    Within one submission, the job manager's Ray job (its JobSupervisor) is nobody's training job."""
    older, newer = "rollout8-t-verl-20261201080000", "rollout8-t-verl-20261201090000"
    for job, pid, source, age in ((older, 101, "rank3.log", 0), (newer, 102, "rank0.log", 60)):
        host = tmp_path / job / "node-a" / "logs"
        host.mkdir(parents=True)
        (tmp_path / job / "driver.log").write_text("step:1 - x:1\n")
        for ray_job in ("02000000", "03000000"):  # the job supervisor's and the driver's
            stem = host / f"worker-{pid:056x}-{ray_job}-{pid + int(ray_job[1])}"
            stem.with_suffix(".err").write_text(":actor_name:WorkerDict\n" + (emitted / source).read_text()
                                                if ray_job == "03000000" else ":actor_name:JobSupervisor\n")
            os.utime(stem.with_suffix(".err"), (time.time() - age,) * 2)  # the older one written last
    rc, report = run_logs(tmp_path, capsys)
    assert rc == 0 and report["judged"] == f"{newer}:03000000"
    assert report["jobs"] == [f"{older}:03000000", f"{newer}:03000000"] and report["ignored"] == [f"{older}:03000000"]
    rc, report = run_logs(tmp_path / newer, capsys)
    assert rc == 0 and report["judged"] == "03000000" and report["chosen_by"] == "only" and len(report["ranks"]) == 1


# ------------------------------------------------------------------ several jobs of one Ray session (issue 30)
SUPERVISOR = ("JobSupervisor", None)  # the job manager's actor, in a Ray job of its own


def session_jobs(root: Path, jobs: dict[str, dict[int, tuple[str, Path | None]]],
                 drivers: dict[str, tuple[str, list[str]]] | None = None,
                 session: str = "2026-12-01_09-00-00_000000_1") -> Path:
    """One Ray session holding several jobs, as Ray files them: worker-<id>-<Ray job>-<pid>.out/.err per process
    (a source of None: a process that logged nothing of FlashRL), python-core-driver-<Ray job>..._<pid>.log per
    driver, and job-driver-<submission>.log per submission (`drivers`: submission -> (Ray job, its own lines);
    the lines of the job's processes are forwarded into it with Ray's `(Actor pid=N, ip=A)` prefix)."""
    logs = root / f"session_{session}" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for job, workers in jobs.items():
        (logs / f"python-core-driver-{job}{'f' * 48}_{9000 + int(job[:2], 16)}.log").write_text(
            "[2026-12-01 09:00:00,000 I 1 1] core_worker_process.cc:192: Constructing CoreWorkerProcess.\n")
        for pid, (actor, source) in workers.items():
            stem = f"worker-{pid:056x}-{job}-{pid}"
            (logs / f"{stem}.out").write_text(f":job_id:{job}\n:actor_name:{actor}\nModel config after override\n")
            (logs / f"{stem}.err").write_text(f":job_id:{job}\n" + (source.read_text() if source else ""))
    for submission, (job, lines) in (drivers or {}).items():
        forwarded = []
        for pid, (actor, _source) in jobs[job].items():
            if actor != "JobSupervisor":
                forwarded.append(f"\x1b[36m({actor} pid={pid}, ip=10.0.0.1)\x1b[0m started\n")
        (logs / f"job-driver-{submission}.log").write_text("".join(forwarded) + "".join(f"{x}\n" for x in lines))
    return root


CRASH = ["Error executing job with overrides: ['algorithm.adv_estimator=grpo']", "Traceback (most recent call last):",
         '  File "/opt/verl/verl/trainer/main_ppo.py", line 42, in main', "    run_ppo(config)",
         "ray.exceptions.RayTaskError(ValueError): ray::TaskRunner.run() (pid=300, ip=10.0.0.1)",
         "ValueError: the rollout engine died"]


@pytest.mark.parametrize("crash", ["driver traceback", "no rollout worker"])
def test_an_older_green_job_never_makes_a_newer_crashed_one_green(emitted, tmp_path, capsys, crash):
    """Issue 30: one session, an older job green on every rank and a newer one that crashed (its driver died
    with a traceback after its worker built nothing; or it died before starting any rollout worker): the newer
    is judged, red, and named; the older one is said to be ignored."""
    new_workers = {300: ("TaskRunner", None)} | ({301: ("WorkerDict", None)} if crash == "driver traceback" else {})
    session_jobs(tmp_path, {"01000000": {90: SUPERVISOR},
                            "02000000": {200: ("TaskRunner", None), 201: ("WorkerDict", emitted / "rank0.log"),
                                         202: ("WorkerDict", emitted / "rank1.log")},
                            "03000000": new_workers},
                 drivers={"raysubmit_old": ("02000000", ["done"]),
                          "raysubmit_new": ("03000000", CRASH if crash == "driver traceback" else [])})
    assert main(["logs", str(tmp_path)]) != 0
    captured = capsys.readouterr()
    job = "session_2026-12-01_09-00-00_000000_1:03000000"
    assert f"judging job {job} (the newest of 2 jobs in {tmp_path}); 1 older job(s) ignored: " \
           "session_2026-12-01_09-00-00_000000_1:02000000" in captured.out, captured.out
    assert "pid 201" not in captured.out and "pid 202" not in captured.out
    assert "verdict: NOT confirmed" in captured.out and captured.err.count("\n") == 1
    if crash == "driver traceback":
        assert f"error: job {job} crashed: job-driver-raysubmit_new.log: ValueError: the rollout engine died" \
            in captured.err
        assert "rank ? (pid 301 in session_2026-12-01_09-00-00_000000_1): unconfirmed" in captured.out
    else:
        assert f"error: job {job}: no rollout worker found" in captured.err


def test_an_older_crashed_job_does_not_hide_a_newer_green_one(emitted, tmp_path, capsys):
    """The other way round: the older job crashed (a CUDA trap on its rank, a traceback in its driver); the
    newer is green on every rank, and is the one judged; the older one is named as ignored."""
    session_jobs(tmp_path, {"02000000": {200: ("TaskRunner", None), 201: ("WorkerDict", emitted / "rank3.log")},
                            "03000000": {300: ("TaskRunner", None), 301: ("WorkerDict", emitted / "rank0.log"),
                                         302: ("WorkerDict", emitted / "rank1.log")}},
                 drivers={"raysubmit_old": ("02000000", CRASH), "raysubmit_new": ("03000000", ["done"])})
    assert main(["logs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 older job(s) ignored: session_2026-12-01_09-00-00_000000_1:02000000 (judge one with --job)" in out
    assert "verdict: int8 rollouts confirmed" in out and "pid 201" not in out and "the job crashed" not in out
    # --job by the Ray job id: the older one, red for its own reasons
    rc, report = run_logs(tmp_path, capsys, "--job", "02000000")
    assert rc == 1 and report["judged"] == "session_2026-12-01_09-00-00_000000_1:02000000"
    assert report["ignored"] == ["session_2026-12-01_09-00-00_000000_1:03000000"]
    assert report["crash"]["cause"] == "ValueError: the rollout engine died"
    assert [(r["pid"], r["status"]) for r in report["ranks"]] == [(201, "error")]


def test_a_rollout_worker_without_the_patch_line_fails_and_is_named(emitted, tmp_path, capsys):
    """Issue 30: two of three rollout workers logged FlashRL's patch line, the third (a WorkerDict of the same
    job) logged nothing of FlashRL: red, naming it."""
    session_jobs(tmp_path, {"02000000": {201: ("WorkerDict", emitted / "rank0.log"),
                                         202: ("WorkerDict", emitted / "rank1.log"), 203: ("WorkerDict", None),
                                         204: ("TaskRunner", None)}})
    assert main(["logs", str(tmp_path)]) != 0
    captured = capsys.readouterr()
    assert "rank ? (pid 203 in session_2026-12-01_09-00-00_000000_1): unconfirmed: a rollout worker of this job " \
        "that never logged FlashRL's config" in captured.out
    assert "pid 204" not in captured.out  # the TaskRunner is no rollout worker
    assert "3 rollout rank(s): 2 int8-patched, 0 bf16 by config, 0 never saw the config, 0 failed, 0 incomplete, " \
        "1 without FlashRL's patch line" in captured.out
    assert "02000000: int8 rollout not confirmed on 1 of 3 rollout worker(s): (pid 203) unconfirmed" in captured.err


def test_a_driver_log_alone_cannot_confirm_every_worker(emitted, tmp_path, capsys):
    """Ray folds lines that differ only in numbers into `[repeated Nx across cluster]`: a worker whose patch line
    was folded into another's shows none of its own in the driver log. Never green on that; it is named."""
    lines = [f"\x1b[36m(WorkerDict pid=201, ip=10.0.0.1)\x1b[0m {line}"
             for line in (emitted / "rank0.log").read_text().splitlines()]
    lines.append("\x1b[36m(WorkerDict pid=202, ip=10.0.0.2)\x1b[0m 2026-12-01 09:00:01,000 - flash_rl.vllm_patch - "
                 "DEBUG - Successfully patched the load_weights function of vllm [repeated 1x across cluster]")
    lines.append("\x1b[36m(WorkerDict pid=202, ip=10.0.0.2)\x1b[0m Model config after override: Qwen2Config")
    (tmp_path / "driver.log").write_text("\n".join(lines) + "\n")
    rc, report = run_logs(tmp_path / "driver.log", capsys)
    assert rc == 1 and [(r["pid"], r["ip"], r["status"]) for r in report["ranks"]] == [
        (201, "10.0.0.1", "patched"), (202, "10.0.0.2", "unconfirmed")]
    assert "[repeated Nx across cluster]" in report["ranks"][1]["reason"]


def test_a_submission_is_judged_by_the_job_its_driver_log_ran(emitted, tmp_path, capsys):
    """The verify play collects what was written since its job started: a newer Ray job (another plan's, started
    meanwhile) may be in there. The submission's driver.log forwards its own job's processes: that job is judged,
    and its crash (a traceback in driver.log) is red even with every rank patched."""
    job = tmp_path / "rollout8-t-verl-20261201090000"
    host = job / "node-a" / "logs"
    host.mkdir(parents=True)
    for ray_job, pid, source in (("02000000", 201, "rank0.log"), ("03000000", 301, "rank1.log")):
        stem = host / f"worker-{pid:056x}-{ray_job}-{pid}"
        stem.with_suffix(".out").write_text(f":job_id:{ray_job}\n:actor_name:WorkerDict\n")
        stem.with_suffix(".err").write_text(f":job_id:{ray_job}\n" + (emitted / source).read_text())
    (job / "driver.log").write_text("\x1b[36m(WorkerDict pid=201, ip=10.0.0.1)\x1b[0m loading\n")
    rc, report = run_logs(job, capsys)
    assert rc == 0 and report["judged"] == "02000000" and [r["pid"] for r in report["ranks"]] == [201]
    assert report["notes"] == ["Ray job(s) 03000000 beside driver.log: not the job it ran (its lines come from Ray "
                               "job 02000000), not read"]
    with open(job / "driver.log", "a") as fh:
        fh.write("\n".join(CRASH) + "\n")
    assert main(["logs", str(job)]) == 1
    captured = capsys.readouterr()
    assert "rank 0 (pid 201 in node-a): patched" in captured.out
    assert "error: job 02000000 crashed: driver.log: ValueError: the rollout engine died" in captured.err


def test_job_names_that_match_several_jobs_are_refused(emitted, tmp_path, capsys):
    for session in ("2026-11-30_12-00-00_000000_1", "2026-12-01_09-00-00_000000_1"):
        session_jobs(tmp_path, {"02000000": {201: ("WorkerDict", emitted / "rank0.log")}}, session=session)
    assert main(["logs", str(tmp_path), "--job", "02000000"]) == 2
    assert "--job 02000000: names several jobs (session_2026-11-30_12-00-00_000000_1:02000000, " \
        "session_2026-12-01_09-00-00_000000_1:02000000): give one of these names" in capsys.readouterr().err
    rc, report = run_logs(tmp_path, capsys, "--job", "session_2026-11-30_12-00-00_000000_1:02000000")
    assert rc == 0 and report["judged"] == "session_2026-11-30_12-00-00_000000_1:02000000"


def test_duplicate_ranks_and_compressed_logs_are_reported(emitted, tmp_path, capsys):
    ray_session(tmp_path, {101: ("WorkerDict", emitted / "rank0.log"), 102: ("WorkerDict", emitted / "rank0.log")})
    assert main(["logs", str(tmp_path)]) == 0
    assert "note: rank 0 is reported by 2 processes (pids 101, 102)" in capsys.readouterr().out
    (tmp_path / "more.log.gz").write_bytes(gzip.compress(b"flash_rl quantization is called\n"))
    assert main(["logs", str(tmp_path)]) != 0
    out = capsys.readouterr().out
    assert "1 compressed log file(s) not read, e.g." in out and "more.log.gz" in out


def test_links_that_loop_and_fifos_neither_hang_nor_pass(emitted, tmp_path, capsys):
    """A link back up the tree, a link to itself and a FIFO among the logs: skipped (nothing waits on them), the
    verdict is the job's; the same things named as the directory: one line."""
    ray_session(tmp_path, {101: ("WorkerDict", emitted / "rank0.log")})
    logs = tmp_path / "session_2026-11-30_12-00-00_000000_1" / "logs"
    (logs / "up").symlink_to(tmp_path, target_is_directory=True)
    (logs / "self.log").symlink_to("self.log")
    os.mkfifo(logs / "pipe.log")
    rc, report = run_logs(tmp_path, capsys)
    assert rc == 0 and [r["pid"] for r in report["ranks"]] == [101]
    (tmp_path / "loop").symlink_to("loop")
    assert main(["logs", str(tmp_path / "loop")]) == 2
    assert f"{tmp_path / 'loop'}: a symbolic link loop" in capsys.readouterr().err
    assert main(["logs", str(logs / "pipe.log")]) == 2
    assert "not a directory or a regular file" in capsys.readouterr().err
