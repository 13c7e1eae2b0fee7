"""`rollout8 spec-diff`: the keys changed between two versions of a run spec and whether the run's checkpoints
resume under them, the line the launch role's guard prints when a job of the run is running (issue 28, part 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from rollout8.runspec.spec_diff import diff, summary

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "configs" / "runs" / "tiny-cpu.yaml"


def spec_diff(tmp_path: Path, new: dict) -> dict:
    path = tmp_path / "new.yaml"
    path.write_text(yaml.safe_dump(new))
    proc = subprocess.run([sys.executable, "-m", "rollout8", "spec-diff", str(SHIPPED), str(path), "--json"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_resumable_edits_are_named_and_said_to_resume(tmp_path):
    spec = yaml.safe_load(SHIPPED.read_text())
    spec["verl"]["trainer.save_freq"] = 1
    spec["env"] = {"FOO": "1"}
    spec["description"] = "edited"  # free text: not a change of the run
    out = spec_diff(tmp_path, spec)
    assert out["keys"] == ["env.FOO", "verl.trainer.save_freq"] and out["resumes"] is True, out
    assert out["line"] == ("env.FOO added ('1'), verl.trainer.save_freq 3 -> 1; the run's checkpoints resume under "
                           "them"), out["line"]


def test_an_edit_a_checkpoint_cannot_be_resumed_under_is_named_as_such(tmp_path):
    spec = yaml.safe_load(SHIPPED.read_text())
    spec["verl"]["data.train_batch_size"] = 12
    spec["cluster"]["nnodes"] = 2
    del spec["verl"]["trainer.test_freq"]
    out = spec_diff(tmp_path, spec)
    assert out["keys"] == ["cluster.nnodes", "verl.data.train_batch_size", "verl.trainer.test_freq"], out
    assert out["resumes"] is False
    assert "verl.trainer.test_freq removed (was -1)" in out["line"]
    assert out["line"].endswith("cluster.nnodes, verl.data.train_batch_size cannot be resumed under: the new version "
                                "starts from step 0 in a checkpoint directory of its own"), out["line"]


def test_a_nested_verl_section_is_the_same_spec_as_its_dotted_keys():
    dotted = {"name": "x", "verl": {"trainer.save_freq": 3, "data.train_batch_size": 6}}
    nested = {"name": "x", "verl": {"trainer": {"save_freq": 3}, "data": {"train_batch_size": 6}}}
    assert diff(dotted, nested) == []
    assert summary([]) == "no key changed"
