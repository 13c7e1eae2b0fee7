"""`rollout8 check RUN.yaml [--json]`: refuse a run spec that would fail, or silently not run int8, before launch.

Each rule looks at the spec and at what `rollout8 render` would produce from it, and reports one line that
names the field and the fix. Errors make the exit code 1; warnings and notes do not. The rules live in check_verl
(what verl is given) and check_artifacts (the files on this machine), reporting through check_common's collector;
this module runs them in order (run_checks), keeps the plan step's cache of a passing profile check, and is where
other code imports them from. Rules (ids in brackets):
  [rollout-mode]     int8/hybrid need actor_rollout_ref.rollout.mode=sync (FlashRL hooks only vllm.LLM)
  [flashrl-paths]    FlashRL paths absolute; local artifacts present; FLASHRL_CONFIG owned by render
  [verl-key]         every verl override exists at the verl pin (nearest key suggested)
  [verl-value]       every verl value has its key's type at the pin (no 'lots' for a number) and range
  [verl-quant]       no verl/vLLM rollout quantization or fp8 kv cache on top of FlashRL
  [sampler]          int8/hybrid: no sampling option that FlashRL 1.0.3's replacement of vLLM's sampler drops
                     (repetition/presence/frequency penalties, min_p, min_tokens, logit_bias, bad_words, ...);
                     bf16 with calculate_log_probs at temperature != 1: log-probs taken before temperature (warning)
  [moe]              no int8 for mixture-of-experts models (FlashRL's profile covers dense layers only)
  [layout]           the int8 layout matches the model dir, and loads on the accelerator
  [tp]               rollout TP x PP (x DP) divides the NPUs per node
  [npus]             NPUs per node within the node kind's (cluster.node_kind: a2 8, a3 16)
  [shared-dir]       more than one NPU node sets cluster.shared_dir (a filesystem every node mounts at the same
                     path): else verl's checkpoints fill each node's root disk inside the container and a
                     resubmitted job cannot resume from them
  [network]          more than one node names its data NIC (cluster.network.nic, or the inventory for every
                     node: --nic-in-inventory)
  [batch]            batch sizes divide the way verl asserts they do (the per-rank rules with use_dynamic_bsz too)
  [token-budget]     chunked prefill off: max_num_batched_tokens >= max_model_len (verl's sync vLLM rollout)
  [context]          the model's context (max_position_embeddings x rope factor) holds prompt + response
  [hybrid-mix]       every hybrid entry is used by some DP rollout worker
  [models]           config.json readable; bf16 unquantized; int8 really int8, a scale per weight; shards whole
  [profile]          the profile matches the int8 model (layers, names, shapes, finite non-zero scales, a sampled
                     verify-quant against the bf16 weights)
  [owned-key]        verl keys that the spec's own fields set are not overridden differently
  [env]              VLLM_USE_V1=1 for FlashRL; no variable the spec's fields set (NIC, HCCL timeouts and port
                     ranges, FlashRL's); rollout.lmhead_fp32 on NPU (warning)
  [resume]           the checkpoint keys render derives where verl: leaves them unset (info: trainer.save_freq
                     every 10% of total_training_steps, else 20 steps; max_actor_ckpt_to_keep 2); an explicit
                     trainer.save_freq <= 0 on more than one node or with cluster.shared_dir (warning)
Checked on a node by `make accept-npu` (tests/npu), not from the spec; each FAIL line says what to do:
  accept cann-pairing  torch_npu imports on this CANN in a fresh process; an undefined symbol (libtbe_adapter.so)
                       means CANN and torch_npu are not a pair (Ascend/pytorch #99): run the image built from the lock
  accept ray-npu       torch.npu.is_available() in a `ray job submit` entrypoint and in a task asking for `NPU`;
                       hidden there: RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1 before `ray start` (ray #59063)
  accept weight-sync   one FlashRL sync of a 7B-shaped model in s and GB/s (floor ROLLOUT8_ACCEPT_MIN_SYNC_GBPS);
                       slow with the post-load transpose/NZ step dominating: SkyRL #176's class; else host memory
  accept hccl          two nodes (ROLLOUT8_ACCEPT_HCCL_MASTER / _RANK): broadcast and all-reduce of the largest
                       weight checked entry by entry (verl PR #6834); hcclCommInitRootInfoConfig codes mapped to a
                       cause: 4/5 NIC then ports, 7 port taken, 9 timeout, 11 TCP listen/connect, 15 device ids
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import Rollout8Error
from ..fileutil import sha256_bytes
from ..findings import Finding
from . import check_artifacts
from .check_artifacts import (
    MOE_CONFIG_KEYS,
    MOE_MODEL_TYPES,
    PROFILE_SAMPLE,
    _check_profile,
    check_context,
    check_layout,
    check_models,
    check_moe,
    check_paths,
    is_moe_config,
)
from .check_common import ROLLOUT, Collector, effective
from .check_verl import (
    OWNED,
    SAMPLER_DROPPED,
    VERL_QUANT_LEAVES,
    check_batches,
    check_env,
    check_hybrid,
    check_nodes,
    check_owned,
    check_parallel,
    check_resume,
    check_rollout_mode,
    check_sampler,
    check_token_budget,
    check_verl_keys,
    check_verl_quantization,
)
from .render import render
from .runspec import RunSpec

__all__ = [  # the rules live in check_verl and check_artifacts; this is where other code imports them from
    "MOE_CONFIG_KEYS", "MOE_MODEL_TYPES", "OWNED", "PROFILE_SAMPLE", "ROLLOUT", "SAMPLER_DROPPED",
    "VERL_QUANT_LEAVES", "check_batches", "check_context", "check_env", "check_hybrid", "check_layout",
    "check_models", "check_moe", "check_nodes", "check_owned", "check_parallel", "check_paths", "check_profile",
    "check_resume", "check_rollout_mode", "check_sampler", "check_token_budget", "check_verl_keys",
    "check_verl_quantization", "effective", "is_moe_config", "rules",
    "run_checks",
]


def _profile_inputs_key(spec: RunSpec) -> str:
    """What check_profile's verdict depends on: the profile rule's code (check_artifacts) and the profile, the int8
    and the bf16 model's files by path, size and mtime (the trust of the plan's sha256 cache)."""
    files = [spec.model.profile_path] + sorted(p for d in (spec.model.int8, spec.model.bf16) if d and d.is_dir()
                                                for p in d.rglob("*") if p.is_file())
    stats = [(str(p), st.st_size, st.st_mtime_ns) for p, st in ((p, p.stat()) for p in files)]
    body = json.dumps([PROFILE_SAMPLE, stats]).encode() + Path(check_artifacts.__file__).read_bytes()
    return sha256_bytes(body)[:24]


def check_profile(c: Collector, spec: RunSpec, cache: Path | None = None) -> None:
    """With `cache` (a directory: the plan step's), a pass is remembered by the key of its inputs, and the same
    inputs are not checked again (loading torch and sampling verify-quant took seconds of every re-run)."""
    if not spec.flashrl or spec.model.int8 is None:
        return
    if cache is not None and spec.model.profile_path and spec.model.profile_path.is_file():
        marker = cache / f"profile-ok-{_profile_inputs_key(spec)}"
        if marker.is_file():
            return
        before = len(c.findings)
        _check_profile(c, spec)
        if not any(f.level == "error" for f in c.findings[before:]):
            cache.mkdir(parents=True, exist_ok=True)
            marker.write_text("")
        return
    _check_profile(c, spec)


def rules() -> str:
    """The rules this module enforces, as `rollout8 check --explain` prints them (from this docstring)."""
    return __doc__[__doc__.index("  [rollout-mode]"):]


# What `check --no-artifacts` leaves out: every rule that reads the artifacts' files.
ARTIFACT_RULES = ("flashrl-paths (the files exist and are of their kind)", "moe (from config.json)",
                  "layout (of the int8 directory)", "models", "context", "profile")


def run_checks(spec: RunSpec, profile_cache: Path | None = None, artifacts: bool = True,
               nic_in_inventory: bool = False) -> list[Finding]:
    """Every rule, in order. Without artifacts (check --no-artifacts): every rule that does not read the files,
    and one note naming those skipped."""
    c = Collector()
    if not artifacts:
        c.info("no-artifacts", "--no-artifacts", "skipped, as asked (the files are not read): "
               + ", ".join(ARTIFACT_RULES))
    check_paths(c, spec, artifacts)
    try:
        rendered = render(spec)
    except Rollout8Error as exc:
        if not any(f.level == "error" for f in c.findings):
            c.error("flashrl-paths", "model", str(exc))
        return c.findings
    check_rollout_mode(c, spec, rendered)
    check_verl_keys(c, spec, rendered)
    check_verl_quantization(c, spec, rendered)
    check_sampler(c, spec, rendered)
    check_owned(c, spec, rendered)
    check_moe(c, spec, artifacts)
    check_layout(c, spec, artifacts)
    parallel = check_parallel(c, spec, rendered)
    check_nodes(c, spec, nic_in_inventory)
    check_batches(c, spec, rendered)
    check_token_budget(c, spec, rendered)
    check_hybrid(c, spec, parallel)
    check_env(c, spec, rendered)
    check_resume(c, spec, rendered)
    if artifacts:
        check_models(c, spec)
        check_context(c, spec, rendered)
        check_profile(c, spec, profile_cache)
    return c.findings
