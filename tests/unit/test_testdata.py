"""`rollout8 make-test-data`: real parquet in verl's GSM8K layout, deterministic, scored by verl's own GSM8K scorer."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import upstream_wheels as uw

from rollout8.runspec.testdata import make_dataset


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
    assert bad.returncode == 2 and "must be 1 or more" in bad.stderr


def test_reward_file_scores_response_text_so_a_random_policy_gets_a_signal(tmp_path):
    """make-test-data's reward.py (the run spec's data.reward): responses differ in score, so GRPO's advantages
    and updates are not all zero (verl's GSM8K rule gives every random response 0)."""
    path = make_dataset(tmp_path / "d")["reward"]
    spec = importlib.util.spec_from_file_location("reward", path)
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    scores = {reward.compute_score("openai/gsm8k", text, "42") for text in ("abc def", "a1b2", "12 34", "7")}
    assert len(scores) == 4 and all(0.0 <= s <= 1.0 for s in scores)


def test_shipped_tiny_cpu_spec_fits_its_data(model_pair_factory, tmp_path):
    """Every prompt make-test-data writes, through the demo model's chat template as verl's RLHFDataset tokenizes
    it, fits the shipped spec's data.max_prompt_length (verl's default truncation=error refuses longer ones)."""
    import yaml
    from transformers import AutoTokenizer

    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/runs/tiny-cpu.yaml").read_text())
    limit = spec["verl"]["data.max_prompt_length"]
    tokenizer = AutoTokenizer.from_pretrained(model_pair_factory("tiny-engine").bf16)
    paths = make_dataset(tmp_path / "d")
    lengths = [len(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True))
               for split in ("train", "val") for row in pq.read_table(paths[split]).to_pylist()]
    assert 64 < max(lengths) <= limit, (max(lengths), limit)
