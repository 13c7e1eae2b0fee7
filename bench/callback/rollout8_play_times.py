"""An Ansible callback for bench/bench_nodes.py: the wall time of every play and every task of a run, as JSON.

Enabled only by the bench (ANSIBLE_CALLBACKS_ENABLED=rollout8_play_times, this directory added to
ANSIBLE_CALLBACK_PLUGINS beside ansible/plugins/callback); the screen output stays the rollout8 callback's. With the
linear strategy a task starts on every host at once and the next starts once every host has finished it, so a
task's wall time is the time from its start to the next task's (or play's, or the run's end). The file named by
ROLLOUT8_PLAY_TIMES gets [{"play": name, "seconds": s, "tasks": [{"task": name, "seconds": s}, ...]}, ...] when the
run ends (also a failed one).
"""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
  name: rollout8_play_times
  type: aggregate
  short_description: wall time of every play and task, as JSON (bench/bench_nodes.py)
  description:
    - Writes the wall time of every play and task to the file named by ROLLOUT8_PLAY_TIMES when the run ends.
  requirements:
    - enabled in ANSIBLE_CALLBACKS_ENABLED
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "rollout8_play_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.plays = []
        self._play = None
        self._task = None

    def _end_task(self, now):
        if self._task is not None:
            self._task["seconds"] = round(now - self._task.pop("start"), 3)
            self._task = None

    def _end_play(self, now):
        self._end_task(now)
        if self._play is not None:
            self._play["seconds"] = round(now - self._play.pop("start"), 3)
            self._play = None

    def v2_playbook_on_play_start(self, play):
        now = time.monotonic()
        self._end_play(now)
        self._play = {"play": play.get_name().strip(), "start": now, "tasks": []}
        self.plays.append(self._play)

    def v2_playbook_on_task_start(self, task, is_conditional):
        now = time.monotonic()
        self._end_task(now)
        if self._play is not None:
            self._task = {"task": task.get_name().strip(), "start": now}
            self._play["tasks"].append(self._task)

    def v2_playbook_on_handler_task_start(self, task):
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_stats(self, stats):
        self._end_play(time.monotonic())
        path = os.environ.get("ROLLOUT8_PLAY_TIMES")
        if path:
            with open(path, "w") as out:
                json.dump(self.plays, out, indent=1)
