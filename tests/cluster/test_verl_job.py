"""The main job on the simulated 3-node cluster: verl GRPO with FlashRL int8 rollouts, and its two traps.

Each run is the real thing: train.yml converges the nodes, submits the rendered launch.sh (python -m
verl.trainer.main_ppo, rollout.mode=sync) as a Ray job, collects every node's Ray logs and runs the verify play
(`rollout8 logs --steps N`, `rollout8 report`). The tests' spec turns the CPU sync diagnostic on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import Cluster, Run

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]

NODES = ("rollout8-sim-head", "rollout8-sim-w1", "rollout8-sim-w2")
STEPS = 3
TIMEOUT = 1800


def job_dir(run: Run, work: Path) -> Path:
    ids = re.findall(r"rollout8-[\w.-]+-verl-\d{14}", run.output)
    assert ids, run.output[-3000:]
    return work / "logs" / ids[-1]


def worker_logs(job: Path) -> dict[str, str]:
    """host -> the text of its Ray worker logs (stderr and stdout of every worker process)."""
    out = {}
    for host in NODES:
        files = sorted((job / host / "logs").glob("worker-*"))
        out[host] = "\n".join(f.read_text(errors="replace") for f in files)
    return out


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


@pytest.fixture(scope="module")
def verl_run(sim_cluster: Cluster) -> tuple[Run, Path]:
    run = sim_cluster.playbook("-e", "rollout8_relaunch=true", kind="verl", timeout=TIMEOUT)
    return run, job_dir(run, sim_cluster.work) if run.rc == 0 else Path("/nonexistent")


def test_verl_grpo_runs_with_int8_rollouts_on_every_rank(verl_run):
    run, job = verl_run
    assert run.rc == 0, run.output[-6000:]
    assert re.search(r"3 rollout rank\(s\): 3 int8-patched, 0 bf16 by config, 0 never saw the config, 0 failed, "
                     r"0 incomplete; 9 quantized sync\(s\)", run.output), run.output[-4000:]
    assert "verdict: int8 rollouts confirmed" in run.output
    driver = (job / "driver.log").read_text(errors="replace")
    steps = re.findall(r"step:(\d+) - ", driver)
    assert steps[-1] == str(STEPS), steps
    assert (job / "report" / "report.html").is_file()


def test_collected_logs_show_the_patch_firing_on_every_rank_once_per_step(verl_run):
    run, job = verl_run
    assert run.rc == 0
    for host, text in worker_logs(job).items():
        assert "flash_rl config detected" in text, host
        assert re.search(r"rank \d+ flash_rl config: fn: int8", text), host
        assert "Successfully patched the load_weights function of vllm" in text, host
        assert text.count("flash_rl quantization is called") == STEPS, (host, text.count("flash_rl quantization"))
        assert "Torch not compiled with CUDA enabled" not in text, host


def test_every_sync_requantizes_the_actors_new_weights(verl_run):
    """The CPU diagnostic, at each sync of each rank: engine int8 == online quantization of the actor's weights
    within 1 LSB, and different from the previous sync's (the policy moved)."""
    run, job = verl_run
    assert run.rc == 0
    for host, text in worker_logs(job).items():
        checks = re.findall(r"sync-check sync=(\d+) (OK|FAIL): .* max (\d+) LSB .*?; (first sync|(\d+) of \d+ entries "
                            r"changed since the last sync)", text)
        assert [c[0] for c in checks] == [str(i) for i in range(1, STEPS + 1)], (host, checks)
        assert all(c[1] == "OK" and int(c[2]) <= 1 for c in checks), (host, checks)
        assert all(int(c[4]) > 0 for c in checks[1:]), (host, checks)


def test_every_cpu_bridge_is_loaded_in_the_workers(verl_run):
    run, job = verl_run
    assert run.rc == 0
    bridges = ("ray_bundles", "gloo_backend+collectives", "fsdp_module_states", "torch_cpu_device", "vllm_triton",
               "vllm_int8_ops", "vllm_cpu_threads", "vllm_sleep_mode", "verl_worker_config")
    text = "\n".join(worker_logs(job).values())
    for name in bridges:
        assert f"rollout8_cpu_bridges: applied {name} " in text, name


def test_flashrl_config_only_in_the_driver_finishes_bf16_and_verify_names_the_ranks(sim_cluster: Cluster, verl_run):
    """Trap 2 on the real job: Ray started without the run's env, FLASHRL_CONFIG removed from the job's
    runtime_env, so only the driver (launch.sh) has it. verl trains, in bf16; the verify play fails."""
    drop = json.dumps({"rollout8_job_args": ["~ray_kwargs.ray_init.runtime_env.env_vars.FLASHRL_CONFIG"]})
    try:
        trap = sim_cluster.playbook("-e", "rollout8_ray_export_env=false", "-e", drop, "-e", "rollout8_relaunch=true",
                                    kind="verl", timeout=TIMEOUT)
        assert_trained_bf16_and_verify_named_every_node(trap, sim_cluster.work, "no-config")
    finally:
        restore = sim_cluster.playbook("--tags", "ray")
        assert restore.rc == 0, restore.output[-4000:]


def test_async_rollout_rendered_without_check_runs_bf16_and_verify_names_the_servers(sim_cluster: Cluster, verl_run):
    """Trap 1 on the real job: rollout.mode=async (the pin's default) builds vLLM AsyncLLM servers, which FlashRL
    never hooks. `rollout8 check` refuses the spec; planned with --no-check (rollout8_plan_check=false), verl
    trains all its steps in bf16 and the verify play fails, naming every node's rollout server."""
    import yaml

    spec = yaml.safe_load(sim_cluster.spec.read_text())
    spec["name"] = "tiny-cpu-sim-async"
    spec["deploy"]["root"] = "/var/lib/rollout8/runs/tiny-cpu-sim-async"
    spec["verl"].update({"actor_rollout_ref.rollout.mode": "async",
                         # what verl's async agent loop needs of this batch: one loop worker, the raw chat
                         "actor_rollout_ref.rollout.agent.num_workers": 1, "data.return_raw_chat": True})
    path = sim_cluster.spec.parent / "sim-run-async.yaml"  # beside the spec: its relative paths still resolve
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    refused = sim_cluster.playbook("--tags", "never", spec=path, kind="verl")
    assert refused.rc != 0 and "[rollout-mode]" in refused.output, refused.output[-3000:]
    trap = sim_cluster.playbook("-e", "rollout8_plan_check=false", spec=path, kind="verl", timeout=TIMEOUT)
    assert_trained_bf16_and_verify_named_every_node(trap, sim_cluster.work, "async: verl's async rollout server",
                                                    rank=r"\?")
