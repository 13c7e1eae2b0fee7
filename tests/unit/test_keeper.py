"""The keeper's decisions (rollout8.node.keeper): when a failed job is resumed, when the keeper waits, when it gives
up and what it says; the verify module's view of a job the keeper is resuming. The loop around them runs on the
simulated cluster (tests/cluster/test_lifecycle.py: a worker's training container stopped and started again)."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

from rollout8.node import keeper

CONFIG = {"run": "r", "root": "job-a", "attempts": 2, "wait_s": 100, "settle_s": 10, "npus": 1,
          "nodes": {"head": "10.0.0.1", "w1": "10.0.0.2"}}


def failed(step, message="Job entrypoint command failed with exit code 1"):
    return {"status": "FAILED", "message": message}, step  # Ray's record of the job, and the step it failed at


def test_a_running_job_is_watched_and_an_ended_one_is_told_once():
    status = keeper.fresh(CONFIG)
    status, action = keeper.judge(status, CONFIG, {"status": "RUNNING", "message": ""}, 0)
    assert (status["state"], action) == ("watching", "")
    status, action = keeper.judge(status, CONFIG, {"status": "SUCCEEDED", "message": ""}, 1)
    assert (status["state"], action) == ("ended", "end")
    assert keeper.judge(status, CONFIG, {"status": "SUCCEEDED", "message": ""}, 2)[1] == ""


def test_a_stopped_job_is_never_resumed():
    status, action = keeper.judge(keeper.fresh(CONFIG), CONFIG, {"status": "STOPPED", "message": ""}, 0)
    assert (status["state"], action) == ("ended", "end")


def test_no_answer_from_ray_decides_nothing():
    status = keeper.fresh(CONFIG)
    assert keeper.judge(status, CONFIG, None, 0) == (status, "")


def test_a_failure_waits_for_the_cluster_then_resubmits_after_it_settled():
    job, step = failed(4)
    status, action = keeper.judge(keeper.fresh(CONFIG), CONFIG, job, 100, step, "ActorDiedError: w1")
    assert (status["state"], action) == ("waiting", "wait")
    assert status["pending"] == {"failed_job": "job-a", "state": "FAILED", "step": 4,
                                 "cause": "Job entrypoint command failed with exit code 1; ActorDiedError: w1"}
    status, action = keeper.wait_step(status, CONFIG, ["w1"], 105)
    assert action == "" and status["missing"] == ["w1"]
    status, action = keeper.wait_step(status, CONFIG, [], 110)  # back, not yet settled
    assert action == "" and status["whole_since"] == 110
    status, action = keeper.wait_step(status, CONFIG, None, 112)  # Ray did not answer: settling starts again
    assert action == "" and status["whole_since"] == 0
    status, action = keeper.wait_step(status, CONFIG, [], 113)
    status, action = keeper.wait_step(status, CONFIG, [], 123)
    assert action == "resubmit"


def test_a_cluster_not_whole_in_time_gives_up_naming_the_missing_node():
    status, _ = keeper.judge(keeper.fresh(CONFIG), CONFIG, failed(4)[0], 0, 4)
    status, action = keeper.wait_step(status, CONFIG, ["w1"], 50)
    status, action = keeper.wait_step(status, CONFIG, ["w1"], 101)
    assert action == "give_up" and status["state"] == "gave_up"
    assert status["reason"] == "job job-a FAILED; the cluster was not whole again within 100 s: w1 not back"


def resumed(status, step, number, job_id):
    status = dict(status, state="watching", judged="", job_id=job_id)
    status["attempts"] = status["attempts"] + [{"n": number, "failed_job": "x", "state": "FAILED", "step": step,
                                                "cause": "", "job_id": job_id, "waited_s": 40}]
    return status


def test_the_same_step_failing_twice_gives_up():
    status = resumed(keeper.fresh(CONFIG), 4, 1, "job-a-r1")
    status, action = keeper.judge(status, CONFIG, failed(4)[0], 0, 4)
    assert action == "give_up"
    assert "at step 4 again, as the attempt before it did" in status["reason"]
    # another step: resumed again
    status = resumed(keeper.fresh(CONFIG), 4, 1, "job-a-r1")
    assert keeper.judge(status, CONFIG, failed(6)[0], 0, 6)[1] == "wait"


def test_the_attempt_limit_gives_up():
    status = resumed(resumed(keeper.fresh(CONFIG), 2, 1, "job-a-r1"), 5, 2, "job-a-r2")
    status, action = keeper.judge(status, CONFIG, failed(7)[0], 0, 7)
    assert action == "give_up" and "2 of 2 automatic resumes used" in status["reason"]


def test_whole_counts_npus_per_node():
    need = {"head": "10.0.0.1", "w1": "10.0.0.2"}
    assert keeper.whole(need, 8, {"10.0.0.1": 8, "10.0.0.2": 8}) == []
    assert keeper.whole(need, 8, {"10.0.0.1": 8, "10.0.0.2": 4}) == ["w1"]
    assert keeper.whole(need, 8, {"10.0.0.1": 8}) == ["w1"]


def test_summary_names_attempts_and_the_reason_it_gave_up():
    status = resumed(keeper.fresh(CONFIG), 4, 1, "job-a-r1")
    status.update(state="gave_up", reason="job job-a-r1 FAILED at step 4 again")
    line = keeper.summary(status, 3)
    assert line.startswith("automatic resume 1 of 3: job x FAILED at step 4 (no cause logged), resumed as job-a-r1 "
                           "after 40 s; automatic resume gave up: job job-a-r1 FAILED at step 4 again")
    assert keeper.summary(None) == ""


def test_the_failed_step_and_cause_come_from_the_tail_of_the_driver_log(tmp_path):
    logs = tmp_path / "session_2026" / "logs"
    logs.mkdir(parents=True)
    (logs / "job-driver-j1.log").write_text(
        "step:1 - a:1 - timing_s/step:2.0\nstep:2 - a:1 - timing_s/step:2.0\n"
        "ray.exceptions.ActorDiedError: The actor died because its node has died. Node IP: 10.0.0.2\n")
    step, cause = keeper.failed_at(str(tmp_path), "j1")
    assert step == 2 and cause.startswith("ray.exceptions.ActorDiedError")
    assert keeper.failed_at(str(tmp_path), "other") == (None, "")


def test_the_keeper_starts_nothing_without_the_plays_record_or_while_the_play_holds_ray(tmp_path):
    now = time.time()
    assert keeper.keep_ray(tmp_path, now) is False  # no ray-state.json: never converged, or reset
    (tmp_path / keeper.RAY_STATE).write_text(json.dumps({"argv": ["false"]}))
    (tmp_path / keeper.PAUSE).write_text("")
    assert keeper.paused(tmp_path, now) and keeper.keep_ray(tmp_path, now) is False
    old = now - keeper.PAUSE_MAX_S - 1
    os.utime(tmp_path / keeper.PAUSE, (old, old))
    assert not keeper.paused(tmp_path, now)  # a pause left by a play that died no longer holds


def test_the_keeper_runs_the_recorded_argv_when_no_raylet_runs_and_not_when_one_does(tmp_path):
    """/proc as the container sees it: its processes by pid, each with its comm."""
    proc, run = tmp_path / "proc", tmp_path / "run"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "comm").write_text("tini\n")
    run.mkdir()
    mark = tmp_path / "started"
    (run / keeper.RAY_STATE).write_text(json.dumps({"argv": ["touch", str(mark)]}))
    assert keeper.keep_ray(run, time.time(), proc) is True and mark.exists()
    mark.unlink()
    (proc / "42").mkdir()
    (proc / "42" / "comm").write_text("raylet\n")
    assert keeper.keep_ray(run, time.time(), proc) is False and not mark.exists()


def ray_api_module():
    path = Path(__file__).resolve().parents[2] / "ansible" / "library" / "rollout8_ray_api.py"
    spec = importlib.util.spec_from_file_location("rollout8_ray_api", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_verify_sees_a_failed_job_as_resuming_while_the_keeper_is_on_and_alive(tmp_path):
    api = ray_api_module()
    assert api.keeper_view(str(tmp_path), "job-a", "FAILED") == ("FAILED", None)  # no keeper.json: off
    (tmp_path / "keeper.json").write_text(json.dumps(CONFIG))
    record = {**keeper.fresh(CONFIG), "state": "waiting"}
    (tmp_path / "keeper-status.json").write_text(json.dumps(record))
    assert api.keeper_view(str(tmp_path), "job-a", "FAILED")[0] == "RESUMING"
    assert api.keeper_view(str(tmp_path), "job-a", "RUNNING")[0] == "RUNNING"
    assert api.keeper_view(str(tmp_path), "job-b", "FAILED") == ("FAILED", None)  # a job it does not keep
    (tmp_path / "keeper-status.json").write_text(json.dumps({**record, "state": "gave_up", "reason": "x"}))
    assert api.keeper_view(str(tmp_path), "job-a", "FAILED") == ("FAILED", {**record, "state": "gave_up",
                                                                             "reason": "x"})
    # a job the keeper saw succeed, that Ray no longer knows (its Ray restarted since): ended, not resuming (the
    # guard would otherwise refuse every other run while it is "RESUMING")
    (tmp_path / "keeper-status.json").write_text(json.dumps({**record, "state": "ended"}))
    assert api.keeper_view(str(tmp_path), "job-a", "NONE")[0] == "NONE"
    (tmp_path / "keeper-status.json").write_text(json.dumps(record))
    old = time.time() - api.KEEPER_ALIVE_S - 1
    os.utime(tmp_path / "keeper-status.json", (old, old))
    assert api.keeper_view(str(tmp_path), "job-a", "FAILED")[0] == "FAILED"  # a keeper not running resumes nothing
    (tmp_path / "keeper.json").write_text(json.dumps({**CONFIG, "attempts": 0}))
    assert api.keeper_view(str(tmp_path), "job-a", "FAILED") == ("FAILED", None)


def test_the_hook_command_gets_the_event_and_the_line(tmp_path):
    out = tmp_path / "told"
    keeper.notify({"hook_command": f'echo "$ROLLOUT8_EVENT|$ROLLOUT8_LINE" >> {out}'}, "resumed", "run r: resumed")
    assert out.read_text() == "resumed|run r: resumed\n"


def test_the_hook_url_gets_a_json_post_and_a_failing_hook_is_only_logged(capsys):
    import http.server
    import threading

    got = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the standard library's name
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        keeper.notify({"hook_url": f"http://127.0.0.1:{server.server_port}/", "run": "r"}, "gave_up", "line")
        thread.join(10)
    finally:
        server.server_close()
    assert got == [{"event": "gave_up", "line": "line", "run": "r"}]
    keeper.notify({"hook_command": "exit 3"}, "ended", "line")  # logged, not raised
    assert "the hook failed (ended)" in capsys.readouterr().out


def test_a_job_ray_lost_with_the_heads_restart_is_resumed_like_a_failed_one():
    """The head's training container restarted: its keeper starts a new Ray (a new GCS) that does not know the job."""
    lost = {"status": "LOST", "message": "Ray no longer knows the job (its head restarted)"}
    status, action = keeper.judge(keeper.fresh(CONFIG), CONFIG, lost, 0, 3)
    assert action == "wait" and status["pending"]["state"] == "LOST" and status["pending"]["step"] == 3


def test_the_cause_is_one_short_line_of_rays_message_and_the_drivers_last_error():
    message = ("Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
               "  File x\nRuntimeError: gloo\n" + "log line\n" * 500)
    status, _ = keeper.judge(keeper.fresh(CONFIG), CONFIG, {"status": "FAILED", "message": message}, 0, 9,
                             "RuntimeError: [pair.cc:534] Connection closed by peer [10.0.0.2]:34018")
    assert status["pending"]["cause"] == ("Job entrypoint command failed with exit code 1; RuntimeError: [pair.cc:534] "
                                          "Connection closed by peer [10.0.0.2]:34018")
    assert keeper.brief("\x1b[36m(WorkerDict pid=1)\x1b[0m ValueError: x") == "(WorkerDict pid=1) ValueError: x"
