"""`rollout8 progress`: where a verl job stands, read from its driver log as verl's console logger writes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollout8.cli import main
from rollout8.errors import Rollout8Error
from rollout8.results.progress import progress_line, read_progress

PREFIX = "\x1b[36m(TaskRunner pid=4242)\x1b[0m "


def step_line(step: int, reward: float, seconds: float) -> str:
    return (f"{PREFIX}step:{step} - actor/lr:np.float64(0.001) - critic/score/mean:np.float64({reward}) - "
            f"timing_s/gen:1.5 - timing_s/step:{seconds} - training/global_step:{step}\n")


def write(path: Path, *lines: str) -> Path:
    path.write_text("".join(lines))
    return path


def test_running_job_reports_last_step_reward_and_step_time(tmp_path):
    log = write(tmp_path / "driver.log", f"{PREFIX}step:0 - val-core/openai/gsm8k/reward/mean@1:0.1\n",
                step_line(1, 0.25, 3.9), step_line(2, 0.5, 4.1))
    p = read_progress(log, total=4)
    assert p.trained == [1, 2] and p.last_step == 2  # the validation at step 0 is no training step
    assert p.reward == 0.5 and p.step_time_s == 4.1 and p.resumed_from is None and p.cause is None
    assert progress_line("J", "RUNNING", p) == "job J RUNNING: step 2 of 4, reward 0.5, step time 4.1 s"


def test_resumed_job_counts_only_the_steps_it_trained(tmp_path):
    log = write(tmp_path / "driver.log",
                f"{PREFIX}Load from checkpoint folder: /mnt/shared/ckpt/global_step_2\n",
                f"{PREFIX}Setting global step to 2\n",
                f"{PREFIX}step:2 - val-core/openai/gsm8k/reward/mean@1:0.3\n",  # validation at the resumed step
                step_line(3, 0.5, 4.0), step_line(4, 0.75, 4.0))
    p = read_progress(log, total=4)
    assert p.trained == [3, 4] and p.resumed_from == 2
    assert p.checkpoint == "/mnt/shared/ckpt/global_step_2"
    assert progress_line("J", "SUCCEEDED", p).endswith("(resumed from the step-2 checkpoint)")


def test_failed_job_names_the_cause_and_the_addresses_in_it(tmp_path):
    log = write(tmp_path / "driver.log", step_line(1, 0.25, 3.9), step_line(2, 0.5, 4.1),
                f"{PREFIX}ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task. "
                "The actor's node 1a2b was terminated unexpectedly: node_ip 172.18.0.4\n")
    p = read_progress(log, total=4)
    assert p.last_step == 2 and "ActorDiedError" in p.cause and p.ips == ["172.18.0.4"]


def test_no_step_yet_and_no_log(tmp_path):
    assert progress_line("J", "RUNNING", read_progress(write(tmp_path / "driver.log", "loading\n"), 4)) == \
        "job J RUNNING: no training step logged yet"
    with pytest.raises(Rollout8Error, match="absent.log: no such file or directory"):
        read_progress(tmp_path / "absent.log")


def progress_error(capsys, *argv: str) -> str:
    """`rollout8 progress ARGV`: it must fail, with one error line and nothing on stdout."""
    assert main(["progress", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    return captured.err


def test_a_directory_without_a_driver_log_is_named_not_read_as_no_step_yet(tmp_path, capsys):
    """Issue 30: a job directory holding no driver.log (the node logs only, say) is no "no step yet": the answer
    names the directory and the file it looked for; with Ray's own driver logs there, it names them."""
    job = tmp_path / "rollout8-x-verl-20261201000000"
    (job / "node-a" / "logs").mkdir(parents=True)
    err = progress_error(capsys, str(job), "--json", "--state", "RUNNING")
    assert err == (f"rollout8 progress: error: {job}: no driver log: looked for {job / 'driver.log'}, which does not "
                   "exist; the verify play keeps it there (ansible-playbook train.yml --tags verify), or pass the "
                   "driver log file itself\n")
    session = tmp_path / "session_2026-12-01_09-00-00_000000_1"
    (session / "logs").mkdir(parents=True)
    write(session / "logs" / "job-driver-raysubmit_A.log", step_line(1, 0.25, 3.9))
    err = progress_error(capsys, str(session))
    assert f"looked for {session / 'driver.log'}, which does not exist; Ray's own driver logs are here, pass one " \
           f"of them: {session / 'logs' / 'job-driver-raysubmit_A.log'}" in err
    assert main(["progress", str(session / "logs" / "job-driver-raysubmit_A.log")]) == 0
    assert "step 1" in capsys.readouterr().out


def test_symlink_loops_and_fifos_are_one_line_answers(tmp_path, capsys):
    """A driver.log that is a symbolic link loop, a job path that is one, a dangling link, a FIFO (opening one
    would wait for a writer forever): one line each, no hang, no traceback."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "driver.log").symlink_to("driver.log")
    assert "no readable driver log: " in progress_error(capsys, str(job))
    assert "symbolic link loop" in progress_error(capsys, str(job / "driver.log"))
    (tmp_path / "loop").symlink_to("loop")
    assert f"{tmp_path / 'loop'}: a symbolic link loop" in progress_error(capsys, str(tmp_path / "loop"))
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    assert f"a symbolic link to {tmp_path / 'nowhere'}, which does not exist" in progress_error(
        capsys, str(tmp_path / "gone"))
    fifo = tmp_path / "fifo-job"
    fifo.mkdir()
    os.mkfifo(fifo / "driver.log")
    cli = Path(sys.executable).with_name("rollout8")
    proc = subprocess.run([str(cli), "progress", str(fifo)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"rollout8 progress: error: {fifo / 'driver.log'}: not a regular file (a directory, a "
                           "FIFO or a device): no driver log to read\n")


def test_cli_json_carries_the_line(tmp_path):
    job = tmp_path / "rollout8-x-verl-20261201000000"
    job.mkdir()
    write(job / "driver.log", step_line(1, 0.25, 3.9))
    cli = Path(sys.executable).with_name("rollout8")
    out = subprocess.run([str(cli), "progress", str(job), "--steps", "3", "--state", "RUNNING", "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    data = json.loads(out)
    assert data["trained"] == [1] and data["total"] == 3
    assert data["line"] == f"job {job.name} RUNNING: step 1 of 3, reward 0.25, step time 3.9 s"


def test_the_keepers_attempts_beside_the_driver_log_are_in_the_line(tmp_path, capsys):
    """verify keeps the head keeper's record with the job's logs; `rollout8 progress` names each automatic resume."""
    job = tmp_path / "rollout8-x-verl-20261201000000-r1"
    job.mkdir()
    write(job / "driver.log", step_line(6, 0.5, 3.0))
    (job / "keeper-status.json").write_text(json.dumps({
        "root": "rollout8-x-verl-20261201000000", "job_id": job.name, "state": "watching", "attempts": [
            {"n": 1, "failed_job": "rollout8-x-verl-20261201000000", "state": "FAILED", "step": 4,
             "cause": "ActorDiedError", "job_id": job.name, "waited_s": 95}]}))
    assert main(["progress", str(job), "--steps", "8", "--state", "RUNNING", "--attempts", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["line"].endswith("; automatic resume 1 of 3: job rollout8-x-verl-20261201000000 FAILED at step 4 "
                                 f"(ActorDiedError), resumed as {job.name} after 95 s")
    assert data["attempts"][0]["step"] == 4 and data["resume"] == "watching"
