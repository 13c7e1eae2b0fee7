"""The main job's two traps on the simulated 3-node cluster, each a real verl GRPO run that trains in bf16
while it was meant to run int8, which only the verify play can tell.

Each run is the real thing: train.yml converges the nodes, submits the rendered launch.sh (python -m
verl.trainer.main_ppo) as a Ray job, collects every node's Ray logs and runs the verify play. One training step
each (the trap shows from the first step on). The main job's own proof (int8 on every rank, one quantized sync
per step, the sync diagnostic, the CPU bridges) is on its resumed run in test_lifecycle.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import Cluster, Run, trap

from rollout8.node.probe_job import read_verdict

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow, trap]

NODES = ("rollout8-sim-head", "rollout8-sim-w1", "rollout8-sim-w2")
STEPS = 1
TIMEOUT = 1800


def job_dir(run: Run, work: Path) -> Path:
    ids = re.findall(r"rollout8-[\w.-]+-verl-\d{14}", run.output)
    assert ids, run.output[-3000:]
    return work / "logs" / ids[-1]


def assert_trained_bf16_and_verify_named_every_node(trap: Run, work: Path, status: str, rank: str = r"[\d?]+") -> None:
    """A trap run: verl trained every step, then the verify play failed naming each node's rollout process with
    `status` (no rank line exists without FlashRL's config: each is named by pid and node)."""
    assert trap.rc != 0
    assert "TASK [verify : Every rollout rank ran with the int8 patch]" in trap.output, trap.output[-6000:]
    job = job_dir(trap, work)
    assert re.findall(r"step:(\d+) - ", (job / "driver.log").read_text(errors="replace"))[-1] == str(STEPS)
    named = re.findall(rf"rank {rank} \(pid \d+ in (rollout8-sim-\w+)\): {status}", trap.output)
    assert sorted(named) == sorted(NODES), trap.output[-4000:]
    assert "verdict: NOT confirmed" in trap.output


def one_step_spec(cluster: Cluster, name: str, **verl) -> Path:
    """The tests' spec trained for one step (beside it: its relative paths still resolve)."""
    import yaml

    spec = yaml.safe_load(cluster.spec.read_text())
    spec["name"] = name
    spec["deploy"]["root"] = f"/var/lib/rollout8/runs/{name}"
    spec["verl"].update({"trainer.total_training_steps": STEPS, "trainer.experiment_name": name, **verl})
    path = cluster.spec.parent / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_flashrl_config_only_in_the_driver_finishes_bf16_and_verify_names_the_ranks(sim_cluster: Cluster):
    """Trap 2 on the real job: Ray started without the run's env, FLASHRL_CONFIG removed from the job's
    runtime_env, so only the driver (launch.sh) has it. verl trains, in bf16; the verify play fails.

    On the same Ray (one restart without the env serves both), the probe job submitted with FLASHRL_CONFIG for its
    driver only names it on every node. ray #59063: without RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES the job
    supervisor hides the NPUs from the entrypoint (ASCEND_RT_VISIBLE_DEVICES='') and every worker holding NPUs gets
    them renumbered."""
    drop = json.dumps({"rollout8_job_args": ["~ray_kwargs.ray_init.runtime_env.env_vars.FLASHRL_CONFIG"]})
    name = "tiny-cpu-sim-trap2"
    try:
        trap = sim_cluster.playbook("-e", "rollout8_ray_export_env=false", "-e", drop, "-e", "rollout8_relaunch=true",
                                    kind="verl", spec=one_step_spec(sim_cluster, name), timeout=TIMEOUT)
        assert_trained_bf16_and_verify_named_every_node(trap, sim_cluster.work, "no-config")

        plan = f"/var/lib/rollout8/runs/{name}/rollout8-plan.json"
        cfg = json.loads(sim_cluster.node(NODES[0], "cat", plan).stdout)["node_paths"]["flashrl"]
        job = sim_cluster.container(NODES[0], "ray", "job", "submit", "--address", "http://127.0.0.1:8265", "--",
                                    "env", f"FLASHRL_CONFIG={cfg}", "rollout8", "probe-job", "--plan", plan,
                                    "--nodes", "3", check=False)
        out = job.stdout + job.stderr
        verdict = read_verdict(out)
        assert verdict is not None, out[-3000:]
        for node in NODES:
            pattern = rf"{node} \(\S+\) env\s+FAIL FLASHRL_CONFIG is not in the Ray worker's environment"
            assert re.search(pattern, out), out
            renumbered = (rf"{node} \(\S+\) npu-visible\s+FAIL RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES is "
                          r"not in the environment of the Ray worker holding this node's NPUs "
                          r"\(ASCEND_RT_VISIBLE_DEVICES=0 \(set by Ray\)\)")
            assert re.search(renumbered, out), out
        assert "driver npu-visible FAIL ASCEND_RT_VISIBLE_DEVICES='' in the driver (the job's entrypoint): Ray hid " \
               "every NPU from it (ray #59063" in out, out[-3000:]
        assert verdict["driver_env"]["FLASHRL_CONFIG"] == cfg
        assert verdict["ok"] is False and verdict["driver_npu_visibility"]["ok"] is False
    finally:
        restore = sim_cluster.playbook("--tags", "ray")
        assert restore.rc == 0, restore.output[-4000:]


def test_async_rollout_rendered_without_check_runs_bf16_and_verify_names_the_servers(sim_cluster: Cluster):
    """Trap 1 on the real job: rollout.mode=async (the pin's default) builds vLLM AsyncLLM servers, which FlashRL
    never hooks. `rollout8 check` refuses the spec; planned with --no-check (rollout8_plan_check=false), verl
    trains all its steps in bf16 and the verify play fails, naming every node's rollout server."""
    # what verl's async agent loop needs of this batch: one loop worker, the raw chat
    path = one_step_spec(sim_cluster, "tiny-cpu-sim-async", **{"actor_rollout_ref.rollout.mode": "async",
                                                               "actor_rollout_ref.rollout.agent.num_workers": 1,
                                                               "data.return_raw_chat": True})
    refused = sim_cluster.playbook("--tags", "never", spec=path, kind="verl")
    assert refused.rc != 0 and "[rollout-mode]" in refused.output, refused.output[-3000:]
    trap = sim_cluster.playbook("-e", "rollout8_plan_check=false", spec=path, kind="verl", timeout=TIMEOUT)
    assert_trained_bf16_and_verify_named_every_node(trap, sim_cluster.work, "async: verl's async rollout server",
                                                    rank=r"\?")
