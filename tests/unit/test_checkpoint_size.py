"""rollout8.runspec.checkpoint_size: the saves kept, the bytes a checkpoint takes, the parameters read from
safetensors headers without torch, and the plan's checkpoint_* fields that preflight compares with a node's free
space (ansible/plugins/filter/rollout8_preflight.py, tested in test_node_rules.py)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rollout8.runspec.checkpoint_size import (
    BYTES_PER_PARAMETER_PER_SAVE,
    checkpoint_bytes,
    checkpoint_need,
    model_parameters,
    saves_kept,
)

REPO = Path(__file__).resolve().parents[2]


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file by hand (header length, JSON header, zero bytes): no torch, no safetensors library."""
    sizes = {"BF16": 2, "F32": 4, "I8": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + count * sizes[dtype]]}
        offset += count * sizes[dtype]
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_bytes_per_parameter_is_fp32_weights_adam_moments_and_bf16_hf_weights():
    assert BYTES_PER_PARAMETER_PER_SAVE == 4 + 8 + 2
    per_save = checkpoint_bytes(7_000_000_000, 1)
    assert per_save == 98_000_000_000  # "about 90 GB a save for a 7B model", with the HF weights on top
    assert checkpoint_bytes(7_000_000_000, 2) == 2 * per_save
    assert checkpoint_bytes(7_000_000_000, 2, share=2) == per_save  # two nodes, each its ranks' half
    assert checkpoint_bytes(10, 1, share=3) == 47  # rounded up: 140 / 3


@pytest.mark.parametrize(("freq", "keep", "total", "kept"), [
    (-1, 2, 100, 0),          # verl's default save_freq: no checkpoint at all
    (0, 2, 100, 0),
    (None, None, None, 0),
    (True, 2, 100, 0),        # not a number
    (20, 2, None, 2),         # render's defaults on a run of unknown length
    (20, 2, 100, 2),
    (20, 5, 30, 2),           # a short run makes fewer saves than it may keep: steps 20 and 30 (the last)
    (20, None, 100, 5),       # verl's default max_actor_ckpt_to_keep (null): every save kept
    (20, None, 101, 6),       # ... and the last step saves too
    (20, 0, 100, 5),          # 0 or less: verl keeps every one as well
    (20, -1, None, 1),        # every save kept, the run's length unknown: at least one
    (20, None, None, 1),
    ("20", "2", "100", 2),    # as hydra reads what render writes
    (3, 2, 3, 1),             # tiny-cpu: one save, at its last step
])
def test_saves_kept_as_verl_saves_and_rotates(freq, keep, total, kept):
    assert saves_kept(freq, keep, total) == kept


def test_need_is_the_whole_on_a_shared_dir_and_each_nodes_share_without():
    shared = checkpoint_need(7_000_000_000, 20, 2, None, 2, "/mnt/rollout8-shared")
    assert (shared.saves_kept, shared.share, shared.bytes_per_save) == (2, 1, 98_000_000_000)
    assert shared.bytes_needed == 196_000_000_000 and shared.max_actor_ckpt_to_keep == 2
    local = checkpoint_need(7_000_000_000, 20, 2, None, 2, None)
    assert local.share == 2 and local.bytes_needed == 98_000_000_000
    assert checkpoint_need(7_000_000_000, -1, 2, None, 1, None).bytes_needed == 0  # no saves: nothing needed
    unknown = checkpoint_need(None, 20, 2, None, 1, "/mnt/s")  # the model not readable here: not judged
    assert unknown.bytes_needed == 0 and unknown.bytes_per_save == 0 and unknown.saves_kept == 2
    every = checkpoint_need(1000, 20, None, 100, 1, None)
    assert every.max_actor_ckpt_to_keep is None and every.bytes_needed == 5 * 14 * 1000
    assert set(every.plan_fields()) == {"model_parameters", "max_actor_ckpt_to_keep", "checkpoint_saves_kept",
                                        "checkpoint_bytes_per_save", "checkpoint_share", "checkpoint_bytes_needed"}


def test_parameters_come_from_the_safetensors_headers_without_torch(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    write_safetensors(model / "model-00001-of-00002.safetensors",
                      {"embed.weight": ("BF16", [10, 4]), "norm.weight": ("F32", [4])})
    write_safetensors(model / "model-00002-of-00002.safetensors", {"lm_head.weight": ("BF16", [10, 4])})
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "embed.weight": "model-00001-of-00002.safetensors", "norm.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors"}}))
    assert model_parameters(model) == 40 + 4 + 40
    assert model_parameters(tmp_path / "absent") is None and model_parameters(None) is None
    (tmp_path / "empty").mkdir()
    assert model_parameters(tmp_path / "empty") is None  # no safetensors: not judged, not a crash
    code = ("import sys; from rollout8.runspec.checkpoint_size import model_parameters; "
            f"assert model_parameters({str(model)!r}) == 84; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_plan_carries_the_sizing_outside_the_jobs_identity(tmp_path, model_pair):
    pytest.importorskip("torch")
    from workspace import shipped_tiny_spec

    from rollout8.runspec.plan import SIZING_FIELDS, build_plan

    raw = shipped_tiny_spec(tmp_path, model_pair)
    raw["cluster"]["network"] = {"nic": "eth0"}  # (3 nodes: whatever the inventory names, the spec names one)
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(raw))
    plan = build_plan(spec, tmp_path / "plan", "rollout8")
    params = model_parameters(model_pair.bf16)
    assert plan.model_parameters == params > 0
    # tiny-cpu: save_freq 3 over 3 steps, render's max_actor_ckpt_to_keep 2: one save, on the shared directory
    assert (plan.max_actor_ckpt_to_keep, plan.checkpoint_saves_kept, plan.checkpoint_share) == (2, 1, 1)
    assert plan.checkpoint_bytes_needed == plan.checkpoint_bytes_per_save == params * BYTES_PER_PARAMETER_PER_SAVE
    assert plan.checkpoint_dir.startswith("/mnt/rollout8-shared/tiny-cpu/")
    written = json.loads((tmp_path / "plan" / "rollout8-plan.json").read_text())
    assert written["checkpoint_bytes_needed"] == plan.checkpoint_bytes_needed
    # the sizing follows from the model and launch.sh, which the identity covers: it does not move the job id
    assert plan.model_copy(update=dict.fromkeys(SIZING_FIELDS, None)).identity() == plan.identity()

    raw["verl"]["trainer.save_freq"] = -1  # no checkpoints: nothing needed
    spec.write_text(yaml.safe_dump(raw))
    assert build_plan(spec, tmp_path / "off", "rollout8").checkpoint_bytes_needed == 0


def test_plan_preview_of_the_shipped_two_node_spec_names_the_shared_checkpoint_dir(tmp_path, capsys):
    from rollout8.cli import main

    raw = yaml.safe_load((REPO / "configs" / "runs" / "qwen2.5-32b-int8-2node.yaml").read_text())
    spec = tmp_path / "two.yaml"
    spec.write_text(yaml.safe_dump(raw))
    assert main(["plan", "--no-artifacts", str(spec)]) == 0
    preview = json.loads(capsys.readouterr().out)
    assert preview["checkpoint_dir"].startswith(raw["cluster"]["shared_dir"] + "/qwen2.5-32b-int8-2node/")
    # the 32B model is not on this machine: its size is unknown, so nothing is judged yet
    assert preview["model_parameters"] is None and preview["checkpoint_bytes_needed"] == 0
    assert preview["max_actor_ckpt_to_keep"] == 2 and preview["checkpoint_saves_kept"] == 2
