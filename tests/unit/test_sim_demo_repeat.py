"""`make demo` again after the checkout changed (another image or spec: another plan), on the same cluster: the
demo's run finished all its steps under the earlier version, launch refuses to resubmit it with nothing to train,
and the demo starts its own run anew (virtual/sim_demo.py). Only that refusal of the demo's own run does so."""

from __future__ import annotations

from pathlib import Path

import sim_demo

# train.yml's output as the YAML callback wraps it (seen on the simulated cluster after a `git pull` and `make demo`)
REFUSED = """TASK [launch : Something is left to train] *************************************
fatal: [rollout8-sim-head]: FAILED! =>
    assertion: rollout8_checkpoint_step | int < rollout8_plan.training_steps | int
    changed: false
    evaluated_to: false
    msg: 'run tiny-cpu: its latest checkpoint is step 3 (/mnt/rollout8-shared/tiny-cpu/796f084a263d/checkpoints),
        at or past trainer.total_training_steps 3: a resubmission would resume there with
        nothing to train. Raise trainer.total_training_steps to train on from it, or give
        the run a new name to start from step 0. Nothing was submitted.'
"""


def test_the_refusal_of_the_demos_finished_run_restarts_it():
    assert sim_demo.finished_under_an_earlier_version(REFUSED, "tiny-cpu")


def test_another_runs_refusal_or_another_failure_does_not():
    assert not sim_demo.finished_under_an_earlier_version(REFUSED, "tiny-cpu-lifecycle")
    assert not sim_demo.finished_under_an_earlier_version(REFUSED.replace("Nothing was submitted.", ""), "tiny-cpu")
    assert not sim_demo.finished_under_an_earlier_version("fatal: [rollout8-sim-w1]: UNREACHABLE!", "tiny-cpu")


def test_the_pattern_is_the_launch_roles_message():
    """The role's own words (roles/launch/tasks/main.yml), so a reworded refusal fails here, not in a demo."""
    role = (Path(sim_demo.REPO) / "ansible/roles/launch/tasks/main.yml").read_text()
    said = " ".join(role.split())
    assert "its latest checkpoint is step" in said and "at or past trainer.total_training_steps" in said
    assert "Nothing was submitted." in said
