# rollout8's screen output: Ansible's default callback, except that a bounded wait reads as waiting.
#
# A task that polls (an `until` loop on something that takes time: the job getting under way, the job's end, the
# nodes registering at the head) says `rollout8_poll: true` in its vars. Each retry of such a task is a progress
# line, "waiting: [head]: Wait until the job is under way: RUNNING, step 3 (45 s of at most 1800 s)", instead of
# the default callback's "FAILED - RETRYING: [head]: ... (715 retries left)", which a person reads as a failure.
# A task retried because it failed (an rsync the bastion dropped, a submission Ray refused) keeps the default line.
# A task run in the background and polled (async, poll > 0: a docker load of minutes) says the same at each poll,
# "waiting: [w1]: Docker load (40 s)", where the default callback prints a job id.
from __future__ import annotations

import time

from ansible.plugins.callback.default import CallbackModule as DefaultCallback

from ansible import constants as C

DOCUMENTATION = """
    name: rollout8
    type: stdout
    short_description: Ansible's default output, with bounded waits shown as progress
    description:
      - The default callback; a retry of a task whose vars say rollout8_poll is a "waiting" line with the time
        spent, the bound and what the poll saw, not "FAILED - RETRYING".
    extends_documentation_fragment:
      - default_callback
      - result_format_callback
    requirements:
      - set as stdout in configuration
"""


def poll_progress(result: dict) -> str:
    """What one poll saw, in words: a Ray job's status and last training step, or the nodes registered at the head
    (rollout8_ray_api's results); "" for a result of another kind."""
    if "status" in result:
        said = str(result.get("status") or "no status yet")
        step = result.get("last_step")
        keeper = result.get("keeper") or {}
        if step is not None:
            said += f", step {step}"
        elif said == "RUNNING":
            said += ", no training step yet"
        if isinstance(keeper, dict) and keeper.get("state"):
            said += f" (keeper: {keeper['state']})"
        return said
    if isinstance(result.get("nodes"), dict):
        if not result.get("reachable", True):
            return "the head's Ray API does not answer yet"
        return f"{len(result['nodes'])} node(s) registered"
    return ""


def waiting_line(host: str, task: str, result: dict, delay: float) -> str:
    """The line for one failed attempt of a polling task, before its pause: Ansible's result counts `attempts` made of
    `retries` in all (the task's retries + 1), `delay` s apart; the wait is bounded by the pauses between them."""
    attempts = int(result.get("attempts") or 0)
    retries = int(result.get("retries") or 0)
    seen = poll_progress(result)
    spent = int(attempts * delay)  # by the next attempt
    bound = int(max(retries - 1, 0) * delay)
    return f"waiting: [{host}]: {task}{': ' + seen if seen else ''} ({spent} s of at most {bound} s)"


def async_line(host: str, task: str, spent: float, bound: int) -> str:
    """The line for one poll of a task running in the background since `spent` s, for at most `bound` s (0: a bound
    still a template when the task started, not shown)."""
    return f"waiting: [{host}]: {task} ({int(spent)} s{f' of at most {bound} s' if bound else ''})"


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "rollout8"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the task the play runs now: its name, when it started (monotonic) and its background bound (async); a
        # poll's result is async_status's, which knows neither
        self._running = ("", 0.0, 0)

    def v2_playbook_on_task_start(self, task, is_conditional):
        try:
            bound = int(task.async_val or 0)
        except (TypeError, ValueError):  # a template Ansible has not resolved yet
            bound = 0
        self._running = ((task.name or task.get_name()).strip(), time.monotonic(), bound)  # as a retry's line names it
        return super().v2_playbook_on_task_start(task, is_conditional)

    def v2_runner_on_async_poll(self, result):
        name, started, bound = self._running
        line = async_line(self.host_label(result), name, time.monotonic() - started, bound)
        self._display.display(line, color=C.COLOR_DEBUG)

    def v2_runner_on_async_ok(self, result):
        pass  # the task's own ok/changed line follows; the default's "ASYNC OK on <host>: jid=..." says nothing more

    def v2_runner_retry(self, result):
        fields = result._task_fields or {}
        polls = (fields.get("vars") or {}).get("rollout8_poll")
        if str(polls).lower() not in ("true", "yes", "1"):
            return super().v2_runner_retry(result)
        try:
            delay = float(fields.get("delay") or 0)
        except (TypeError, ValueError):
            delay = 0.0
        task = result.task_name or result._task
        self._display.display(waiting_line(self.host_label(result), str(task), result._result, delay),
                              color=C.COLOR_DEBUG)
