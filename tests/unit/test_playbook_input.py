"""Bad input to the playbooks is refused on the controller, naming it, before any node is touched.

Runs the real ansible-playbook (from .venv) on train.yml with an inventory of loopback hosts on a port nothing
listens on (127.0.0.10-12, port 9, discard): a run that got past the controller's checks would try them and be
refused at once, so "no node was touched" is visible in the output (no fact gathering, no preflight task), and
no test sends traffic off this machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

pytestmark = pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook is not in this venv (make venv)")

INVENTORY = """[head]
node-a ansible_host=127.0.0.10 ansible_port=9
[workers]
node-b ansible_host=127.0.0.11 ansible_port=9
node-c ansible_host=127.0.0.12 ansible_port=9
[cluster:children]
head
workers
"""


def play(tmp_path: Path, *args: str, inventory: str | None = INVENTORY, group_vars: str = "",
         path: str | None = None) -> tuple[int, str]:
    inv = tmp_path / "inventory" / "hosts.ini"
    if inventory is not None:
        inv.parent.mkdir(parents=True, exist_ok=True)
        inv.write_text(inventory)
        if group_vars:
            (inv.parent / "group_vars").mkdir(exist_ok=True)
            (inv.parent / "group_vars" / "all.yml").write_text(group_vars)
    env = dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"), ANSIBLE_NOCOLOR="1")
    if path is not None:
        env["PATH"] = path
    proc = subprocess.run([str(PLAYBOOK), "-i", str(inv), "train.yml", "-e", f"rollout8_run_spec={tmp_path}/run.yaml",
                           "-e", f"rollout8_work_dir={tmp_path}/work", *args], cwd=ANSIBLE, env=env,
                          capture_output=True, text=True, timeout=300)
    out = " ".join((proc.stdout + proc.stderr).split())
    return proc.returncode, out


def assert_refused_before_any_node(rc: int, out: str, *expected: str) -> None:
    assert rc != 0, out[-3000:]
    for text in expected:
        assert text in out, out[-3000:]
    assert "Gathering Facts" not in out and "TASK [preflight" not in out, out[-3000:]


def test_missing_inventory_fails_the_run(tmp_path):
    rc, out = play(tmp_path, inventory=None)
    assert rc != 0, out[-2000:]
    assert str(tmp_path / "inventory" / "hosts.ini") in out


def test_inventory_that_does_not_parse_fails_the_run(tmp_path):
    rc, out = play(tmp_path, inventory="[head\nnode-a ansible_host=127.0.0.10 ansible_port=9\n[workers]\n")
    assert rc != 0, out[-2000:]
    assert "hosts.ini" in out
    assert "PLAY RECAP" not in out


FIX = "fix it where it is set (group_vars, host_vars or -e) and run again. Nothing was changed."


@pytest.mark.parametrize("extra,expected", [
    # the two: a misspelled bool silently skipped the int8 verification, a misspelled choice went on
    (("-e", "rollout8_verify_quant=flase"), 'rollout8_verify_quant="flase" is not true or false'),
    (("-e", "rollout8_job_wait_until=frist_step"),
     "value of rollout8_job_wait_until must be one of: auto, first_step, end, got: frist_step"),
    (("-e", "rollout8_job_kind=smoke"), "value of rollout8_job_kind must be one of: verl, probe, got: smoke"),
    (("-e", "rollout8_runtime=podman"), "value of rollout8_runtime must be one of: docker, host, got: podman"),
    (("-e", "rollout8_ray_port=abc"), 'rollout8_ray_port="abc" is not an integer'),
    (("-e", "rollout8_ray_dashboard_port=70000"), "rollout8_ray_dashboard_port=70000 is out of range (1-65535)"),
    (("-e", "rollout8_preflight_min_disk_gb=lots"), 'rollout8_preflight_min_disk_gb="lots" is not a number'),
    (("-e", "rollout8_preflight_skip=disk"), 'rollout8_preflight_skip="disk" is not a list'),
    (("-e", '{"rollout8_preflight_skip": ["dsik"]}'),
     "value of rollout8_preflight_skip must be one or more of: clock, disk, docker, npu, ports, shared, shm. Got no "
     "match for: dsik"),
    (("-e", "rollout8_verify_follow=maybe"), 'rollout8_verify_follow="maybe" is not true or false'),
    (("-e", "rollout8_job_start_timeout_s=0"), "rollout8_job_start_timeout_s=0 is out of range (1 or more)"),
], ids=["bool-typo", "choice-typo", "kind-old-name", "runtime", "port-word", "port-range", "disk-gb-word",
        "skip-string", "skip-unknown", "bool-word", "timeout-zero"])
def test_knob_of_the_wrong_type_or_value_is_refused_naming_it(tmp_path, extra, expected):
    rc, out = play(tmp_path, *extra)
    assert_refused_before_any_node(rc, out, expected, FIX)


def test_wrong_value_in_group_vars_is_refused_too(tmp_path):
    rc, out = play(tmp_path, group_vars="rollout8_ray_num_cpus: -2\n")
    assert_refused_before_any_node(rc, out, "rollout8_ray_num_cpus=-2 is out of range (0 or more)", FIX)


def test_controller_without_rsync_is_refused_before_any_node(tmp_path):
    """The artifacts and the image go to the nodes with rsync: a controller without it is told so up front."""
    (tmp_path / "run.yaml").write_text("name: x\n")
    rc, out = play(tmp_path, path=str(PLAYBOOK.parent))  # the venv's bin only: no rsync on PATH
    assert_refused_before_any_node(rc, out, "rsync is not installed on the controller")


def test_artifacts_that_fail_the_full_verify_quant_are_refused_before_any_node(model_pair, tmp_path):
    """A profile with one entry off (not among the layers `rollout8 check` samples): the plan's full verify-quant
    on the controller refuses it, naming the tensor, and nothing reaches a node; once fixed, the passing report is
    kept (keyed by the artifacts' checksums) and the next run does not verify again."""
    import shutil

    import torch
    import yaml

    from rollout8.quant.profile import write_profile

    shutil.copytree(model_pair.bf16, tmp_path / "bf16")
    shutil.copytree(model_pair.int8, tmp_path / "int8")
    write_profile(tmp_path / "bf16", tmp_path / "int8", tmp_path / "profile.pt")
    profile = torch.load(tmp_path / "profile.pt", weights_only=True)
    int8 = [n for n, e in profile.items() if e["type"] == torch.int8]
    victim = int8[1]  # the sample takes int8[0], then every len//4-th entry
    profile[victim]["input_scale"] = profile[victim]["input_scale"] * 3
    torch.save(profile, tmp_path / "profile.pt")
    (tmp_path / "data").mkdir()
    for name in ("train", "val"):
        (tmp_path / "data" / f"{name}.parquet").write_bytes(b"PAR1")
    spec = {"name": "t", "model": {"bf16": "bf16", "int8": "int8", "profile": "profile.pt"},
            "rollout": {"quantization": "int8"}, "cluster": {"nnodes": 2, "npus_per_node": 1, "accelerator": "cpu"},
            "data": {"train": "data/train.parquet", "val": "data/val.parquet"},
            "verl": {"data.train_batch_size": 2, "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1, "actor_rollout_ref.rollout.n": 2,
                     "actor_rollout_ref.rollout.tensor_model_parallel_size": 1}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    rc, out = play(tmp_path, "-e", "rollout8_job_kind=probe")
    assert_refused_before_any_node(rc, out, "verify-quant refuses the artifacts", victim,
                                   "nothing was copied to any node")
    assert not list((tmp_path / "work").rglob("verify-quant-*.json")), "a failed verification was cached"

    write_profile(tmp_path / "bf16", tmp_path / "int8", tmp_path / "profile.pt")  # fixed
    seen = []
    for _ in range(2):  # verified, then found kept (the report is not written again)
        # (the controller's plays pass; then the nodes, which nothing answers for, are unreachable)
        _, out = play(tmp_path, "-e", "rollout8_job_kind=probe", "--tags", "never")
        assert "verify-quant refuses" not in out and "TASK [plan : The plan fits the inventory" in out, out[-3000:]
        reports = list((tmp_path / "work").rglob("verify-quant-*.json"))
        assert len(reports) == 1, reports
        seen.append(reports[0].stat().st_mtime_ns)
    assert seen[0] == seen[1], "the kept report was verified and written again"
