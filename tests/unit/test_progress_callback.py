"""The screen output's bounded waits (ansible/plugins/callback/rollout8.py): a polling task's retry is a `waiting:`
line with the time spent, the bound and what the poll saw; a task retried because it failed keeps Ansible's
"FAILED - RETRYING"."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
PLUGIN = ANSIBLE_DIR / "plugins" / "callback" / "rollout8.py"


def load_callback():
    spec = importlib.util.spec_from_file_location("rollout8_callback", PLUGIN)  # not "rollout8": the package's name
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_job_poll_reads_as_its_status_and_step():
    cb = load_callback()
    assert cb.poll_progress({"status": "RUNNING", "last_step": 3}) == "RUNNING, step 3"
    assert cb.poll_progress({"status": "RUNNING", "last_step": None}) == "RUNNING, no training step yet"
    assert cb.poll_progress({"status": "PENDING", "last_step": None}) == "PENDING"
    assert cb.poll_progress({"status": "RESUMING", "keeper": {"state": "waiting"}}) == "RESUMING (keeper: waiting)"
    assert cb.poll_progress({"reachable": True, "nodes": {"10.0.0.1": 8, "10.0.0.2": 8}}) == "2 node(s) registered"
    assert cb.poll_progress({"reachable": False, "nodes": {}}) == "the head's Ray API does not answer yet"
    assert cb.poll_progress({"stdout": "12"}) == ""


def test_the_waiting_line_gives_the_time_spent_and_the_bound():
    cb = load_callback()
    assert cb.async_line("w1", "Docker load", 40.7, 3660) == "waiting: [w1]: Docker load (40 s of at most 3660 s)"
    assert cb.async_line("w1", "Docker load", 40.7, 0) == "waiting: [w1]: Docker load (40 s)"
    line = cb.waiting_line("head", "Wait until the job is under way",
                           {"status": "RUNNING", "last_step": None, "attempts": 3, "retries": 121}, 15)
    assert line == ("waiting: [head]: Wait until the job is under way: RUNNING, no training step yet "
                    "(45 s of at most 1800 s)")
    assert cb.waiting_line("head", "checkpoint", {"stdout": "4", "attempts": 1, "retries": 6}, 2) == \
        "waiting: [head]: checkpoint (2 s of at most 10 s)"


def test_ansible_cfg_prints_polls_as_waiting_and_failures_as_retrying(tmp_path):
    """The callback as ansible.cfg loads it, on a local play: a polling task, a task retried after failing, a task in
    the background polled."""
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump([{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": [
        {"name": "a bounded wait", "ansible.builtin.command": "false", "register": "r", "until": "r.rc == 0",
         "retries": 2, "delay": 1, "failed_when": False, "changed_when": False, "vars": {"rollout8_poll": True}},
        {"name": "a send the bastion dropped", "ansible.builtin.command": "false", "register": "s",
         "until": "s.rc == 0", "retries": 2, "delay": 0, "failed_when": False, "changed_when": False},
        {"name": "a load of minutes", "ansible.builtin.command": "sleep 5", "async": 30, "poll": 1,
         "changed_when": False}]}]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(book),
                          "-e", f"ansible_python_interpreter={sys.executable}"],
                         cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "waiting: [localhost]: a bounded wait (2 s of at most 2 s)" in run.stdout, run.stdout
    assert "waiting: [localhost]: a bounded wait (1 s of at most 2 s)" in run.stdout, run.stdout
    assert "FAILED - RETRYING: [localhost]: a bounded wait" not in run.stdout, run.stdout
    assert "FAILED - RETRYING: [localhost]: a send the bastion dropped (1 retries left)." in run.stdout, run.stdout
    polls = re.findall(r"waiting: \[localhost\]: a load of minutes \((\d+) s of at most 30 s\)", run.stdout)
    assert len(polls) >= 2 and polls == sorted(polls, key=int), run.stdout
    assert "ASYNC POLL" not in run.stdout and "ASYNC OK" not in run.stdout, run.stdout
