"""How much disk verl's checkpoints of a run need where they land: the plan's `checkpoint_*` fields, which preflight
compares with the free space of that filesystem on every node (ansible/plugins/filter/rollout8_preflight.py).

needed = the model's parameters x BYTES_PER_PARAMETER_PER_SAVE x the saves kept on disk at once; the parameters
counted from the bf16 model's safetensors headers (no tensor is read, no torch imported).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelError
from ..quant.checkpoint import Checkpoint
from .verl_keys import as_hydra_reads

# Bytes one checkpoint holds per model parameter (verl 51d2104, FSDP actor, fsdp_checkpoint_manager.py): each rank
# saves its shard of the actor's weights as the actor keeps them, fp32 (fsdp_workers.py: torch_dtype float32 for the
# actor), 4 bytes; the AdamW optimizer's two fp32 moments (exp_avg, exp_avg_sq), 8 bytes; and, when
# actor.checkpoint.save_contents names hf_model, the merged Hugging Face weights in bf16, 2 bytes. 4 + 8 + 2 = 14
# (verl's default save_contents, model/optimizer/extra, takes 12 of them; 'extra', the rng and lr scheduler state,
# is small): about 98 GB a save for 7B parameters, 107 GB for Qwen2.5-7B's 7.6B.
BYTES_PER_PARAMETER_PER_SAVE = 14


@dataclass(frozen=True)
class CheckpointNeed:
    """The plan's checkpoint sizing. `bytes_needed` is what the filesystem holding the checkpoints must have free on
    each node: all of it with cluster.shared_dir (every node writes its shards to the one shared filesystem), a
    node's share without (`share` nodes each hold their ranks' shards on their own disk)."""

    parameters: int | None  # the bf16 model's parameter count (None: its files are not readable here)
    max_actor_ckpt_to_keep: int | None  # as verl gets it; None: verl keeps every checkpoint
    saves_kept: int  # the most checkpoints on disk at once (0: the run saves none)
    bytes_per_save: int  # the whole checkpoint, every rank's shards
    share: int  # the nodes whose disks share one checkpoint's bytes (1: one filesystem holds it all)
    bytes_needed: int  # on each node's checkpoint filesystem

    def plan_fields(self) -> dict[str, Any]:
        """The Plan's fields (rollout8-plan.json) of this sizing."""
        return {"model_parameters": self.parameters, "max_actor_ckpt_to_keep": self.max_actor_ckpt_to_keep,
                "checkpoint_saves_kept": self.saves_kept, "checkpoint_bytes_per_save": self.bytes_per_save,
                "checkpoint_share": self.share, "checkpoint_bytes_needed": self.bytes_needed}


def _integer(value: Any) -> int | None:
    value = as_hydra_reads(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or math.isinf(value):
        return None
    return int(value) if value == int(value) else None


def saves_kept(save_freq: Any, max_to_keep: Any, total_steps: Any) -> int:
    """The most checkpoints on disk at once. verl saves every save_freq steps and at the last step (ray_trainer.py:
    `global_steps % save_freq == 0 or is_last_step`), none with save_freq <= 0 (its default, -1); it removes the
    oldest before a save once max_to_keep are there, and keeps every one when max_to_keep is unset (its default,
    null) or not a positive integer. A run of known length makes ceil(total / save_freq) saves; of unknown length
    (total_training_steps unset: verl derives it from the data) with every save kept, at least 1 is counted."""
    freq = _integer(save_freq)
    if freq is None or freq <= 0:
        return 0
    total = _integer(total_steps)
    saves = math.ceil(total / freq) if total is not None and total > 0 else None
    keep = _integer(max_to_keep)
    if keep is None or keep <= 0:
        return saves if saves is not None else 1
    return min(keep, saves) if saves is not None else keep


def checkpoint_bytes(parameters: int, kept: int, share: int = 1) -> int:
    """Bytes `kept` checkpoints of a model of `parameters` take, on one of `share` disks that split each one."""
    return math.ceil(parameters * BYTES_PER_PARAMETER_PER_SAVE * kept / max(1, share))


def model_parameters(model_dir: Path | None) -> int | None:
    """The parameters of a Hugging Face safetensors model, from its shards' headers; None when not readable."""
    if model_dir is None:
        return None
    try:
        tensors = Checkpoint(model_dir).tensors.values()
    except ModelError:
        return None
    return sum(math.prod(info.shape) for info in tensors)


def checkpoint_need(parameters: int | None, save_freq: Any, max_to_keep: Any, total_steps: Any, nnodes: int,
                    shared_dir: str | None) -> CheckpointNeed:
    """The sizing of a run's checkpoints (see CheckpointNeed); the model's size unknown: needs 0 (not judged)."""
    kept = saves_kept(save_freq, max_to_keep, total_steps)
    share = 1 if shared_dir else max(1, nnodes)
    keep = _integer(max_to_keep)
    per_save = checkpoint_bytes(parameters, 1) if parameters else 0
    return CheckpointNeed(parameters=parameters, max_actor_ckpt_to_keep=keep if keep and keep > 0 else None,
                          saves_kept=kept, bytes_per_save=per_save, share=share,
                          bytes_needed=checkpoint_bytes(parameters, kept, share) if parameters else 0)
