"""The bad-input tests' workspace: the tiny model pair, its FlashRL profile, data and a run spec, in one directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from rollout8.cli import main

# A valid run spec for the tiny model pair (3 nodes x 2, cpu); tests copy it before changing it.
SPEC = {
    "name": "t",
    "model": {"bf16": "bf16", "int8": "int8", "profile": "profile.pt", "layout": "compressed-tensors"},
    "rollout": {"quantization": "int8"},
    "cluster": {"nnodes": 3, "npus_per_node": 2, "accelerator": "cpu", "network": {"nic": "data0"}},
    "data": {"train": "data/train.parquet", "val": "data/val.parquet"},
    "verl": {"data.train_batch_size": 6, "actor_rollout_ref.actor.ppo_mini_batch_size": 6,
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2, "actor_rollout_ref.rollout.n": 2,
             "actor_rollout_ref.rollout.tensor_model_parallel_size": 1},
}


def make_workspace(root: Path, model_pair, spec: dict, *, real_data: bool = False) -> Path:
    """bf16/, int8/, profile.pt, data/{train,val}.parquet and spec.yaml under root, checked by `rollout8 check`.
    real_data writes parquet files (`rollout8 make-test-data`); otherwise they are stubs that check accepts."""
    from rollout8.quant.profile import write_profile

    shutil.copytree(model_pair.bf16, root / "bf16")
    shutil.copytree(model_pair.int8, root / "int8")
    write_profile(root / "bf16", root / "int8", root / "profile.pt")
    if real_data:
        assert main(["make-test-data", "-o", str(root / "data")]) == 0
    else:
        (root / "data").mkdir()
        for name in ("train", "val"):
            (root / "data" / f"{name}.parquet").write_bytes(b"PAR1")
    (root / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["check", str(root / "spec.yaml")]) == 0
    return root


def shipped_tiny_spec(root: Path, model_pair) -> dict:
    """configs/runs/tiny-cpu.yaml (as a mapping) on the tiny model pair as it is, its profile and real data written
    under root: what ships, with paths that exist on this machine."""
    from rollout8.quant.profile import write_profile
    from rollout8.runspec.testdata import make_dataset

    data = make_dataset(root / "data", 4, 2, 0)
    write_profile(model_pair.bf16, model_pair.int8, root / "profile.pt")
    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "runs" / "tiny-cpu.yaml").read_text())
    spec["model"].update(bf16=str(model_pair.bf16), int8=str(model_pair.int8), profile=str(root / "profile.pt"))
    spec["data"] = {"train": str(data["train"]), "val": str(data["val"])}
    spec["deploy"].pop("shared_storage", None)  # here on this machine, sent by the controller
    return spec
