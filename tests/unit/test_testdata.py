"""`rollout8 make-test-data`: real parquet in verl's GSM8K layout, deterministic, scored by verl's own GSM8K scorer."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pyarrow.parquet as pq
import upstream_wheels as uw

from rollout8.spec.testdata import make_dataset


def test_layout_and_determinism(tmp_path):
    a = make_dataset(tmp_path / "a", n_train=5, n_val=3, seed=7)
    b = make_dataset(tmp_path / "b", n_train=5, n_val=3, seed=7)
    train = pq.read_table(a["train"]).to_pylist()
    assert len(train) == 5 and pq.read_table(a["val"]).num_rows == 3
    assert set(train[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert train[0]["prompt"][0]["role"] == "user" and "####" in train[0]["prompt"][0]["content"]
    assert a["train"].read_bytes() == b["train"].read_bytes()
    c = make_dataset(tmp_path / "c", n_train=5, n_val=3, seed=8)
    assert pq.read_table(c["train"]).to_pylist() != train


def test_verl_gsm8k_scorer_accepts_the_ground_truth(tmp_path):
    """verl's rule-based GSM8K reward (verl 0.6.1 wheel, the scorer the demo's data_source selects) scores the
    dataset's own reference answers 1 and a wrong answer 0: the data is usable for a real GRPO reward."""
    root = uw.unpack(uw.wheel("verl", uw.VERL_STAND_IN_VERSION), tmp_path / "verl", "verl")
    spec = importlib.util.spec_from_file_location("verl_gsm8k", root / "verl/utils/reward_score/gsm8k.py")
    gsm8k = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gsm8k)
    rows = pq.read_table(make_dataset(tmp_path / "d")["val"]).to_pylist()
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        assert gsm8k.compute_score(f"some reasoning\n#### {truth}", truth) == 1.0
        assert gsm8k.compute_score(f"some reasoning\n#### {int(truth) + 1}", truth) == 0.0


def test_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rollout8", "make-test-data", "-o", str(tmp_path), "--train", "2",
                          "--val", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert pq.read_table(tmp_path / "train.parquet").num_rows == 2
    bad = subprocess.run([sys.executable, "-m", "rollout8", "make-test-data", "-o", str(tmp_path), "--train", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "at least 1" in bad.stderr
