"""Bad input to the playbooks is refused on the controller, naming it, before any node is touched.

Runs the real ansible-playbook (from .venv) on train.yml with an inventory of hosts that do not exist
(192.0.2.0/24, TEST-NET-1): a run that got past the controller's checks would fail to reach them, so "no node
was touched" is visible in the output (no fact gathering, no preflight task).
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
node-a ansible_host=192.0.2.10
[workers]
node-b ansible_host=192.0.2.11
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
    rc, out = play(tmp_path, inventory="[head\nnode-a ansible_host=192.0.2.10\n[workers]\n")
    assert rc != 0, out[-2000:]
    assert "hosts.ini" in out
    assert "PLAY RECAP" not in out


@pytest.mark.parametrize("extra,expected", [
    (("-e", "rollout8_ray_port=abc"), 'rollout8_ray_port="abc" is not a TCP port (1-65535)'),
    (("-e", "rollout8_ray_dashboard_port=70000"), 'rollout8_ray_dashboard_port="70000" is not a TCP port'),
    (("-e", "rollout8_preflight_min_disk_gb=lots"), 'rollout8_preflight_min_disk_gb="lots" is not a number'),
    (("-e", "rollout8_preflight_skip=disk"), 'rollout8_preflight_skip="disk" is not a list'),
    (("-e", '{"rollout8_preflight_skip": ["dsik"]}'), "rollout8_preflight_skip names dsik, not a preflight check"),
    (("-e", "rollout8_verify_follow=maybe"), 'rollout8_verify_follow="maybe" is not true or false'),
    (("-e", "rollout8_job_start_timeout_s=0"), 'rollout8_job_start_timeout_s="0" is not an integer, 1 or more'),
], ids=["port-word", "port-range", "disk-gb-word", "skip-string", "skip-unknown", "bool-word", "timeout-zero"])
def test_variable_of_the_wrong_type_is_refused_naming_it(tmp_path, extra, expected):
    rc, out = play(tmp_path, *extra)
    assert_refused_before_any_node(rc, out, expected, "Nothing was changed")


def test_wrong_type_in_group_vars_is_refused_too(tmp_path):
    rc, out = play(tmp_path, group_vars="rollout8_ray_num_cpus: -2\n")
    assert_refused_before_any_node(rc, out, 'rollout8_ray_num_cpus="-2" is not an integer, 0 or more')


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
    assert_refused_before_any_node(rc, out, "rollout8 verify-quant refuses the artifacts", victim,
                                   "nothing was copied to any node")
    assert not list((tmp_path / "work").rglob("verify-quant-*.json")), "a failed verification was cached"


    write_profile(tmp_path / "bf16", tmp_path / "int8", tmp_path / "profile.pt")  # fixed
    task = "TASK [plan : Verify every int8 weight against the bf16 weights and the profile (once per set of artifacts)]"
    for expected in ("changed:", "ok:"):  # verified, then found cached
        # (the controller's plays pass; then the nodes, which do not exist, are unreachable)
        _, out = play(tmp_path, "-e", "rollout8_job_kind=probe", "--tags", "never")
        assert "verify-quant refuses" not in out and "TASK [plan : The plan fits the inventory] *" in out, out[-3000:]
        assert out.split(task, 1)[1].split("TASK [", 1)[0].lstrip("* ").startswith(expected), out[-3000:]
    assert len(list((tmp_path / "work").rglob("verify-quant-*.json"))) == 1
