"""rollout8.node.ray_start: `ray start` again after Ray's fixed 20 s dashboard wait ran out, and only then.

The Ray here is a stand-in executable named `ray` (the failure needs a head too busy for 20 s, which a test cannot
order up): it prints what Ray 2.46 prints when its dashboard does not register, for as many starts as told, and
records every call, so the retry's decisions (stop what the start left, start again, give up, pass other failures
through at once) are what is asserted."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from rollout8.node import ray_start

RAY = r'''#!{python}
import sys
from pathlib import Path
here = Path(__file__).parent
calls = here / "calls"
calls.write_text(calls.read_text() + " ".join(sys.argv[1:]) + "\n" if calls.exists() else " ".join(sys.argv[1:]) + "\n")
if sys.argv[1] == "stop":
    sys.exit(0)
left = int((here / "failures").read_text())
if left > 0:
    (here / "failures").write_text(str(left - 1))
    print("{message}", file=sys.stderr)
    sys.exit(1)
print("Ray runtime started.")
'''


def stand_in(tmp_path: Path, failures: int, message: str) -> Path:
    ray = tmp_path / "ray"
    ray.write_text(RAY.format(python=sys.executable, message=message))
    ray.chmod(ray.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "failures").write_text(str(failures))
    return ray


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


DASHBOARD = ("Failed to start the dashboard | Exception: The last 20 lines of /tmp/ray/session_x/logs/dashboard.log "
             "(it contains the error message from the dashboard):")


def test_a_dashboard_that_missed_rays_20_s_is_stopped_and_started_again(tmp_path, capsys):
    ray = stand_in(tmp_path, failures=1, message=DASHBOARD)
    said: list[str] = []
    assert ray_start.start(["env", "--unset=X", str(ray), "start", "--head"], pause_s=0, say=said.append) == 0
    assert calls(tmp_path) == ["start --head", "stop --force", "start --head"]
    assert len(said) == 1 and "attempt 1 of 3" in said[0] and "stopped what the start left" in said[0], said
    assert "Ray runtime started." in capsys.readouterr().out


def test_it_gives_up_after_the_attempts_saying_why(tmp_path):
    ray = stand_in(tmp_path, failures=5, message=DASHBOARD)
    said: list[str] = []
    assert ray_start.start([str(ray), "start", "--head"], attempts=2, pause_s=0, say=said.append) == 1
    assert calls(tmp_path) == ["start --head", "stop --force", "start --head"]
    assert "did not register within Ray's fixed 20 s on 2 attempts" in said[-1], said


def test_any_other_failure_is_returned_at_once_with_nothing_stopped(tmp_path, capsys):
    ray = stand_in(tmp_path, failures=1, message="ValueError: Failed to bind to 0.0.0.0:6379 (port in use)")
    said: list[str] = []
    assert ray_start.start([str(ray), "start", "--head"], pause_s=0, say=said.append) == 1
    assert calls(tmp_path) == ["start --head"] and said == []
    assert "port in use" in capsys.readouterr().err


def test_the_stop_uses_the_same_ray_and_an_argv_without_ray_is_refused():
    assert ray_start.stop_argv(["env", "--unset=A", "/opt/v/bin/ray", "start", "--head"]) == \
        ["env", "--unset=A", "/opt/v/bin/ray", "stop", "--force"]
    try:
        ray_start.start(["true"])
    except ValueError as exc:
        assert "no ray executable" in str(exc)
    else:
        raise AssertionError("an argv without ray ran")
