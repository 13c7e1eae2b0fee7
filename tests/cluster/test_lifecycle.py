"""The main job's lifecycle on the simulated cluster, with the real verl job (int8 rollouts, 20 steps):

1. train.yml returns while the job runs (its first training step logged), saying how to follow it;
2. `--tags verify` in a new controller process shows where the job stands (step N of 9, reward, step time) and the
   int8 verdict so far;
3. the spec is edited while the job runs (an environment key removed, a retention limit added) and train.yml run
   again: nothing on the nodes changes (the same training containers, the job still running) and one line names
   the running job, its step, the changed keys and the two choices (issue 28, part 1);
4. with -e rollout8_replace=true the job is stopped right after its next checkpoint lands and the edited version
   submitted: it resumes from that checkpoint (found by the run's identity, which neither edit changes), trains
   only the steps after it (none twice), and the removed environment key is absent from the new training
   containers;
5. a worker's training container is stopped mid-run (right after a checkpoint landed on the shared directory) and
   started again, with no controller action: its keeper starts Ray again, the head's keeper sees the job failed,
   waits until every node is back and resubmits it (issue 28, part 3);
6. verify follows the run through that automatic resume: verl resumed from the latest checkpoint on
   cluster.shared_dir and trained only the remaining steps, the attempt is named (job, step, cause, new job), and
   the final verdict counts one int8 sync per step trained.

The resumed job is then the main job's proof in the collected logs of every node: FlashRL's patch fired on every
rank and quantized once per step, every sync re-quantized the actor's new weights (the CPU sync diagnostic), and
every CPU bridge was loaded (each train.yml run is the real thing: converge, the rendered launch.sh as a Ray job,
every node's Ray logs collected, `rollout8 logs --steps N` and `rollout8 report` in the verify play).

The spec is the tests' spec with cluster.shared_dir (one host directory every simulated node mounts at the same
path, simcluster.SHARED_DIR), trainer.save_freq 1, and a reward that takes half a second per response, so a step
lasts long enough (about 13 s) for a controller process to see the job running.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import simcluster
import yaml
from conftest import Cluster, latest_checkpoint, one_line, trap

from rollout8.results.progress import read_progress

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]

STEPS = 20
ENV_KEY = "ROLLOUT8_LIFECYCLE_RUN"  # in the first version of the spec only
NODES = ("rollout8-sim-head", "rollout8-sim-w1", "rollout8-sim-w2")
WORKER = "rollout8-sim-w2"
TIMEOUT = 1800
SLOW_REWARD = '''"""Test reward: the share of digits in the response, half a second per response (~10 s a step) until
the test leaves a file named `fast` beside the run's checkpoints (its steps then take what the job itself takes)."""
import os
import time

FAST = {fast!r}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if not os.path.exists(FAST):
        time.sleep(0.5)
    text = solution_str or ""
    return sum(c.isdigit() for c in text) / max(len(text), 1)
'''


def lifecycle_spec(cluster: Cluster, name: str = "tiny-cpu-lifecycle") -> Path:
    """The tests' spec as run `name`, its steps slow until SHARED_HOST/<name>/fast exists (see SLOW_REWARD)."""
    spec = yaml.safe_load(cluster.spec.read_text())
    base = cluster.spec.parent
    spec["name"] = name
    spec["model"] = {k: (str((base / v).resolve()) if k in ("bf16", "int8", "profile") else v)
                     for k, v in spec["model"].items()}
    reward = cluster.work / f"{name}-reward.py"
    reward.write_text(SLOW_REWARD.format(fast=f"{simcluster.SHARED_DIR}/{name}/fast"))
    spec["data"] = {"train": str((base / spec["data"]["train"]).resolve()),
                    "val": str((base / spec["data"]["val"]).resolve()), "reward": str(reward)}
    spec["cluster"]["shared_dir"] = simcluster.SHARED_DIR
    # the data NIC named in the inventory only (rollout8_cluster_nic for every node: the README's step 3)
    spec["cluster"].pop("network", None)
    spec["deploy"]["root"] = f"/var/lib/rollout8/runs/{name}"
    spec["verl"].update({"trainer.experiment_name": name, "trainer.total_training_steps": STEPS,
                         "trainer.save_freq": 1})
    spec["env"] = {**(spec.get("env") or {}), ENV_KEY: "1"}  # beside the sync diagnostic the sim spec turns on
    path = cluster.work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def progress_of(cluster: Cluster, job: str) -> dict:
    cli = str(simcluster.REPO / ".venv" / "bin" / "rollout8")
    out = subprocess.run([cli, "progress", str(cluster.work / "logs" / job), "--json"], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return json.loads(out)


def containers(cluster: Cluster) -> dict[str, str]:
    """Each node's training container: its id and when it started (the same after a run that changed nothing)."""
    return {node: cluster.node(node, "docker", "inspect", "-f", "{{.Id}} {{.State.StartedAt}}",
                               "rollout8-train").stdout.strip() for node in NODES}


def ray_processes(cluster: Cluster) -> dict[str, str]:
    """Each node's raylet pid in its training container (another after Ray restarted)."""
    find = ("for p in /proc/[0-9]*; do case $(readlink $p/exe 2>/dev/null) in */raylet) echo ${p#/proc/};; esac; "
            "done")  # by the executable: a command line naming raylet (this loop's own) is not one
    return {node: cluster.container(node, "sh", "-c", find).stdout.split() for node in NODES}


def trained_by(cluster: Cluster, job: str) -> list[int]:
    """The training steps a job logged, from Ray's driver log on the head's disk (Ray's temp directory is the
    node's: it outlives the training container and Ray's session)."""
    log = cluster.node(NODES[0], "sh", "-c", f"cat /opt/rollout8/ray/session_*/logs/job-driver-{job}.log").stdout
    path = cluster.work / f"{job}.driver.log"
    path.write_text(log)
    return read_progress(path).trained


STOP_RUNNING = """
import json, subprocess, urllib.request
jobs = json.load(urllib.request.urlopen("http://127.0.0.1:8265/api/jobs/", timeout=30))
for job in jobs:
    if job["status"] in ("RUNNING", "PENDING") and (job.get("submission_id") or "").startswith(PREFIX):
        subprocess.run(["/opt/rollout8/venv/bin/ray", "job", "stop", "--address", "http://127.0.0.1:8265",
                        job["submission_id"]], check=True, timeout=120)
        print(job["submission_id"])
"""


def stop_leftover_jobs(cluster: Cluster) -> None:
    """Stop this test's jobs an interrupted run left running (they would write into the run's checkpoints)."""
    code = STOP_RUNNING.replace("PREFIX", repr("rollout8-tiny-cpu-lifecycle-"))
    cluster.container(NODES[0], "/opt/rollout8/venv/bin/python", "-c", code, check=False)


def jobs_in(output: str) -> list[str]:
    return re.findall(r"rollout8-tiny-cpu-lifecycle-\w+-verl-\d{14}", output)


def keeper_record(cluster: Cluster) -> dict:
    out = cluster.node(NODES[0], "cat", "/opt/rollout8/run/keeper-status.json", check=False).stdout
    try:
        return json.loads(out)
    except ValueError:
        return {}


def wait_for_keeper(cluster: Cluster, seen, timeout: float = 600) -> dict:
    """The head keeper's record once `seen(record)` holds (polled, bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = keeper_record(cluster)
        if seen(record):
            return record
        time.sleep(2)
    raise AssertionError(f"the head's keeper did not get there in {timeout} s: {keeper_record(cluster)}")


@pytest.fixture(scope="module")
def lifecycle(sim_cluster) -> dict:
    """Steps 1-6, each asserted as it happens; returns the resumed job's collected logs and steps."""
    spec = lifecycle_spec(sim_cluster)
    shared = simcluster.SHARED_HOST / "tiny-cpu-lifecycle"
    stop_leftover_jobs(sim_cluster)
    shutil.rmtree(shared, ignore_errors=True)  # no checkpoint of an earlier session: this job starts at step 1

    # 1. train.yml returns once the job runs
    first = sim_cluster.playbook("-e", "rollout8_relaunch=true", kind="verl", spec=spec, follow=False,
                                 timeout=TIMEOUT)
    assert first.rc == 0, first.output[-6000:]
    job = jobs_in(first.output)[-1]
    text = one_line(first.output)
    assert f"job {job}: RUNNING. Follow it any time" in text, text[-4000:]
    assert re.search(rf"job {job} RUNNING: step [1-5] of {STEPS}, reward \S+, step time \S+ s; still running", text)
    assert "(so far: the job is still running)" in text

    # 2. verify in a new controller process: where the job stands
    later = sim_cluster.playbook("--tags", "verify", kind="verl", spec=spec, follow=False, timeout=600)
    assert later.rc == 0, later.output[-6000:]
    seen = re.search(rf"job {job} RUNNING: step (\d+) of {STEPS}", one_line(later.output))
    assert seen and int(seen.group(1)) < STEPS, one_line(later.output)[-4000:]

    # 3. an edited spec while the job runs: refused in one line, nothing on the nodes changed
    edited = yaml.safe_load(spec.read_text())
    del edited["env"][ENV_KEY]
    edited["verl"]["trainer.max_actor_ckpt_to_keep"] = 3
    edited_path = sim_cluster.work / "lifecycle-edited.yaml"
    edited_path.write_text(yaml.safe_dump(edited, sort_keys=False))
    before = containers(sim_cluster)
    refused = sim_cluster.playbook(kind="verl", spec=edited_path, follow=False, timeout=900)
    text = one_line(refused.output).replace("''", "'")  # the YAML callback doubles a quote in a quoted message
    assert refused.rc != 0, text[-4000:]
    said = re.search(rf"run tiny-cpu-lifecycle: job {job} is RUNNING at step (\d+) of {STEPS} under another version "
                     rf"of this run spec; changed: env\.{ENV_KEY} removed \(was '1'\), "
                     r"verl\.trainer\.max_actor_ckpt_to_keep added \(3\); the run's checkpoints resume under them\. "
                     r"Nothing on the nodes was changed\. Either wait for it to end .* or replace it now: "
                     r"-e rollout8_replace=true stops it and submits this version\.", text)
    assert said, text[-4000:]
    assert "TASK [preflight" not in refused.output and "TASK [runtime" not in refused.output
    assert containers(sim_cluster) == before

    # 3b. another run spec (another run) while the job runs: refused naming the job, nothing on the nodes changed
    rays = ray_processes(sim_cluster)
    assert all(rays.values()), rays
    other = sim_cluster.playbook(kind="verl", follow=False, timeout=900)
    text = one_line(other.output).replace("''", "'")  # the YAML callback doubles a quote in a quoted message
    assert other.rc != 0, text[-4000:]
    assert re.search(rf"job {job} \(run tiny-cpu-lifecycle\) is RUNNING at step \d+ on this cluster; run "
                     rf"{yaml.safe_load(sim_cluster.spec.read_text())['name']} \(.+\) is another run spec: its "
                     r"training containers, image and Ray would replace that job's and kill it\. Nothing on the nodes "
                     r"was changed\..* -e rollout8_replace=true stops it and submits this run\.", text), text[-4000:]
    assert "TASK [preflight" not in other.output and "TASK [runtime" not in other.output
    assert containers(sim_cluster) == before and ray_processes(sim_cluster) == rays

    # 4. replaced: the job stopped, the edited version resumes from the run's latest checkpoint
    checkpointed = latest_checkpoint(shared)
    hook_log = shared / "hook.log"  # the notify hook, run by the head's keeper in its training container
    hook = f'echo "$ROLLOUT8_EVENT|$ROLLOUT8_LINE" >> {simcluster.SHARED_DIR}/tiny-cpu-lifecycle/hook.log'
    replaced = sim_cluster.playbook("-e", "rollout8_replace=true", "-e", json.dumps({"rollout8_notify_command": hook}),
                                    kind="verl", spec=edited_path, follow=False, timeout=TIMEOUT)
    assert replaced.rc == 0, replaced.output[-6000:]
    first_job, job = job, [j for j in jobs_in(replaced.output) if j != job][-1]
    assert f"job {first_job} STOPPED: this version of the run spec is applied and submitted next" \
        in one_line(replaced.output), one_line(replaced.output)[-4000:]
    # stopped right after a checkpoint landed (the replace waits for the next save): no trained step trained again
    landed = re.search(rf"job {first_job}: its step-(\d+) checkpoint landed: stopping it now, this version resumes "
                       r"there and trains no step twice", one_line(replaced.output))
    assert landed, one_line(replaced.output)[-4000:]
    for node in NODES:
        env = sim_cluster.container(node, "printenv").stdout
        assert f"{ENV_KEY}=" not in env, (node, env)
    spec = edited_path

    # 5. stop a worker's training container right after a checkpoint landed (bounded wait), start it again; no
    # controller action: the head's keeper resumes the job once the worker's keeper has Ray back
    start = latest_checkpoint(shared)
    deadline = time.monotonic() + 300
    while latest_checkpoint(shared) <= start and time.monotonic() < deadline:
        time.sleep(0.2)
    killed_at = latest_checkpoint(shared)
    assert start < killed_at < STEPS, f"no new checkpoint before the end (had {start}, now {killed_at})"
    sim_cluster.node(WORKER, "docker", "stop", "-t", "2", "rollout8-train")
    (shared / "fast").touch()  # the steps left run at the job's own pace: the slow reward did its part
    failed_seen = wait_for_keeper(sim_cluster, lambda k: k.get("state") == "waiting" or k.get("attempts"))
    sim_cluster.node(WORKER, "docker", "start", "rollout8-train")
    trained_before = trained_by(sim_cluster, job)
    assert trained_before and max(trained_before) <= killed_at, (trained_before, killed_at, failed_seen)

    # the replacing job resumed where the first one's checkpoints ended and trained each step once
    replacing = progress_of(sim_cluster, job)
    first = trained_by(sim_cluster, first_job)
    assert replacing["resumed_from"] is not None and replacing["resumed_from"] >= checkpointed, \
        (replacing, checkpointed)
    assert max(first) == replacing["resumed_from"] == int(landed.group(1)), (first, replacing, landed.group(0))
    assert replacing["trained"][0] == replacing["resumed_from"] + 1, (first, replacing)

    # 6. verify follows the run through the automatic resume to its end: only the remaining steps, each once
    done = sim_cluster.playbook("--tags", "verify", kind="verl", spec=spec, timeout=TIMEOUT)
    assert done.rc == 0, done.output[-6000:]
    resumed = f"{job}-r1"
    text = one_line(done.output)
    progress = progress_of(sim_cluster, resumed)
    assert progress["resumed_from"] == killed_at, progress
    assert progress["trained"] == list(range(killed_at + 1, STEPS + 1)), progress
    assert not set(progress["trained"]) & set(trained_before), (trained_before, progress["trained"])
    assert f"job {resumed} SUCCEEDED: step {STEPS} of {STEPS}" in text, text[-4000:]
    assert f"(resumed from the step-{killed_at} checkpoint)" in text
    assert re.search(rf"automatic resume 1 of 3: job {job} FAILED at step \d+ \(.+\), resumed as {resumed} after "
                     r"\d+ s", text), text[-4000:]
    assert progress["attempts"][0]["failed_job"] == job and progress["attempts"][0]["job_id"] == resumed
    assert re.search(rf"3 rollout rank\(s\): 3 int8-patched.*; {3 * (STEPS - killed_at)} quantized sync", text), \
        text[-4000:]
    assert "verdict: int8 rollouts confirmed" in text
    told = hook_log.read_text().splitlines()
    assert [line.split("|")[0] for line in told] == ["resumed", "ended"], told
    assert f"automatic resume 1 of 3: submitted {resumed}" in told[0] and f"job {resumed} SUCCEEDED" in told[1], told
    return {"job": sim_cluster.work / "logs" / resumed, "steps": STEPS - killed_at, "killed_at": killed_at}


def test_returns_while_running_verify_follows_and_the_cluster_resumes_a_stopped_worker_by_itself(lifecycle):
    assert lifecycle["steps"] >= 1 and (lifecycle["job"] / "driver.log").is_file()


def test_a_rerun_with_fewer_steps_than_the_latest_checkpoint_is_refused(sim_cluster, lifecycle):
    """The run ended at step 20 with its checkpoint; the same run with total_training_steps 10 finds that checkpoint
    (the step count is not part of what a checkpoint resumes under) and would log "step 21 of 10": refused, naming
    the checkpoint and the two ways on, and nothing submitted."""
    spec = yaml.safe_load((sim_cluster.work / "lifecycle-edited.yaml").read_text())
    spec["verl"]["trainer.total_training_steps"] = 10
    path = sim_cluster.work / "lifecycle-fewer.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    run = sim_cluster.playbook(kind="verl", spec=path, follow=False, timeout=900)
    text = one_line(run.output)
    assert run.rc != 0, text[-4000:]
    assert re.search(rf"run tiny-cpu-lifecycle: its latest checkpoint is step {STEPS} \(\S+/checkpoints\), at or past "
                     r"trainer.total_training_steps 10: a resubmission would resume there with nothing to train\. "
                     r"Raise trainer.total_training_steps to train on from it, or give the run a new name to start "
                     r"from step 0\. Nothing was submitted\.", text), text[-4000:]
    plan = json.loads((sim_cluster.work / path.stem / "rollout8-plan.json").read_text())
    submitted = sim_cluster.node(NODES[0], "test", "-e", f"/opt/rollout8/run/job-{plan['job_id']}-verl.txt",
                                 check=False)
    assert submitted.returncode != 0, "a job was submitted"


def worker_logs(job: Path) -> dict[str, str]:
    """host -> the text of its Ray worker logs (stderr and stdout of every worker process)."""
    out = {}
    for host in NODES:
        files = sorted((job / host / "logs").glob("worker-*"))
        out[host] = "\n".join(f.read_text(errors="replace") for f in files)
    return out


def test_the_resumed_job_wrote_its_report(lifecycle):
    assert (lifecycle["job"] / "report" / "report.html").is_file()


def test_collected_logs_show_the_patch_firing_on_every_rank_once_per_step(lifecycle):
    for host, text in worker_logs(lifecycle["job"]).items():
        assert "flash_rl config detected" in text, host
        assert re.search(r"rank \d+ flash_rl config: fn: int8", text), host
        assert "Successfully patched the load_weights function of vllm" in text, host
        count = text.count("flash_rl quantization is called")
        assert count == lifecycle["steps"], (host, count, lifecycle["steps"])
        assert "Torch not compiled with CUDA enabled" not in text, host


def test_every_sync_requantizes_the_actors_new_weights(lifecycle):
    """The CPU diagnostic, at each sync of each rank: engine int8 == online quantization of the actor's weights
    within 1 LSB, and different from the previous sync's (the policy moved)."""
    for host, text in worker_logs(lifecycle["job"]).items():
        checks = re.findall(r"sync-check sync=(\d+) (OK|FAIL): .* max (\d+) LSB .*?; (first sync|(\d+) of \d+ entries "
                            r"changed since the last sync)", text)
        assert [c[0] for c in checks] == [str(i) for i in range(1, lifecycle["steps"] + 1)], (host, checks)
        assert all(c[1] == "OK" and int(c[2]) <= 1 for c in checks), (host, checks)
        assert all(int(c[4]) > 0 for c in checks[1:]), (host, checks)


def test_every_cpu_bridge_is_loaded_in_the_workers(lifecycle):
    bridges = ("ray_bundles", "gloo_backend+collectives", "fsdp_module_states", "torch_cpu_device", "vllm_triton",
               "vllm_int8_ops", "vllm_cpu_threads", "vllm_sleep_mode", "verl_worker_config")
    text = "\n".join(worker_logs(lifecycle["job"]).values())
    for name in bridges:
        assert f"rollout8_cpu_bridges: applied {name} " in text, name




@trap
def test_a_worker_that_never_comes_back_ends_in_a_failed_verdict_after_the_bounded_wait(sim_cluster):
    """A worker's training container stopped and left down: the head's keeper waits rollout8_autoresume_wait_s for
    it, resubmits nothing, gives up naming the node, and verify ends in a failed verdict saying so."""
    stop_leftover_jobs(sim_cluster)
    spec = yaml.safe_load(lifecycle_spec(sim_cluster, "tiny-cpu-lost").read_text())
    spec["env"].pop(ENV_KEY, None)
    path = sim_cluster.work / "lost.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    shutil.rmtree(simcluster.SHARED_HOST / "tiny-cpu-lost", ignore_errors=True)
    wait_s = 20  # the keeper's give-up is what is tested, not the length of its wait
    first = sim_cluster.playbook("-e", "rollout8_relaunch=true", "-e", f"rollout8_autoresume_wait_s={wait_s}",
                                 kind="verl", spec=path, follow=False, timeout=TIMEOUT)
    assert first.rc == 0, first.output[-6000:]
    job = re.findall(r"rollout8-tiny-cpu-lost-\w+-verl-\d{14}", first.output)[-1]
    sim_cluster.node(WORKER, "docker", "stop", "-t", "2", "rollout8-train")
    try:
        verify = sim_cluster.playbook("--tags", "verify", kind="verl", spec=path, timeout=900)
        text = one_line(verify.output)
        assert verify.rc != 0 and f"job {job} FAILED" in text, text[-4000:]
        assert f"Ray is down on {WORKER} ({simcluster.data_address(WORKER)})" in text, text[-4000:]
        assert (f"Automatic resume gave up: job {job} FAILED; the cluster was not whole again within {wait_s} s: "
                f"{WORKER} not back") in text, text[-4000:]
        record = keeper_record(sim_cluster)
        assert record["state"] == "gave_up" and record["attempts"] == [], record
        state = sim_cluster.node(NODES[0], "sh", "-c", "cat /opt/rollout8/run/job-*tiny-cpu-lost*-verl.txt").stdout
        assert state.strip() == job  # nothing was resubmitted
    finally:
        sim_cluster.node(WORKER, "docker", "start", "rollout8-train", check=False)


def test_preflight_refuses_a_shared_dir_that_is_not_shared(sim_cluster):
    """cluster.shared_dir on a directory each node has on its own disk (/tmp), or on none: refused in preflight,
    naming the nodes, before anything is deployed."""
    stop_leftover_jobs(sim_cluster)  # a lifecycle job still running (its fixture failed) would be guarded first
    spec = yaml.safe_load(lifecycle_spec(sim_cluster).read_text())
    for shared_dir, expected in (("/tmp", [f"{w}: /tmp (cluster.shared_dir) is not shared with rollout8-sim-head"
                                            for w in ("rollout8-sim-w1", "rollout8-sim-w2")]),
                                 ("/nonexistent-shared", ["rollout8-sim-head: /nonexistent-shared (cluster.shared_dir)"
                                                          " is not a directory here"])):
        spec["cluster"]["shared_dir"] = shared_dir
        path = sim_cluster.work / "not-shared.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        run = sim_cluster.playbook("--tags", "preflight", kind="verl", spec=path, timeout=600)
        text = one_line(run.output)
        assert run.rc != 0, text[-3000:]
        for line in expected:
            assert line in text, text[-3000:]
        assert "TASK [runtime" not in run.output and "TASK [artifacts" not in run.output
