"""`rollout8 make-test-data -o DIR`: a tiny GSM8K-shaped dataset in verl's parquet layout (no hub access).

The columns are the ones verl's GSM8K preprocessing writes and its RL dataset and reward manager read:
`data_source`, `prompt` (a chat: list of {role, content}), `ability`, `reward_model` {style, ground_truth}
and `extra_info` {split, index, answer, question}. The questions are generated arithmetic with known answers,
so a reward function can score them; the demo and the tests use them, real runs use the real datasets.

It also writes DIR/reward.py, a verl custom reward (run spec `data.reward`) that a tiny random model can move:
the rule reward of GSM8K scores 0 for every random response, so advantages, gradients and weight updates would
all be zero and every weight sync would carry the same weights.
"""

from __future__ import annotations

import random
from pathlib import Path

from ..errors import Rollout8Error
from ..fileutil import atomic_write

DATA_SOURCE = "openai/gsm8k"  # what verl's default reward function dispatches on for GSM8K-style answers
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def _rows(split: str, count: int, rng: random.Random) -> list[dict]:
    rows = []
    for index in range(count):
        a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 9)
        question = f"Sam has {a} apples and buys {b} more, then shares them with {c} friends and keeps the rest " \
                   f"for himself. How many apples did Sam have before sharing?"
        answer = str(a + b)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "answer": f"{a} + {b} = {answer}\n#### {answer}",
                           "question": question},
        })
    return rows


REWARD_PY = '''"""Test reward (rollout8 make-test-data): the share of digits in the response text.

Random responses differ in it, so GRPO's advantages are non-zero and the policy really moves.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    text = solution_str or ""
    return sum(c.isdigit() for c in text) / max(len(text), 1)
'''


def make_dataset(out_dir: str | Path, n_train: int = 12, n_val: int = 6, seed: int = 0) -> dict[str, Path]:
    """Write DIR/train.parquet, DIR/val.parquet and DIR/reward.py; deterministic for a seed. Returns the paths."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise Rollout8Error("make-test-data needs pyarrow (pip install pyarrow)") from exc
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = {}
    for split, count in (("train", n_train), ("val", n_val)):
        table = pa.Table.from_pylist(_rows(split, count, rng))
        paths[split] = atomic_write(out / f"{split}.parquet", lambda tmp, table=table: pq.write_table(table, tmp))
    paths["reward"] = atomic_write(out / "reward.py", REWARD_PY)
    return paths
