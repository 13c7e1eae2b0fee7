"""`rollout8 check RUN.yaml [--json]`: refuse a run spec that would fail, or silently not run int8, before launch.

Each rule looks at the spec and at what `rollout8 render` would produce from it, and reports one line that
names the field and the fix. Errors make the exit code 1; warnings and notes do not. Rules (ids in brackets):
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
  [batch]            batch sizes divide the way verl asserts they do
  [hybrid-mix]       every hybrid entry is used by some DP rollout worker
  [models]           config.json readable; bf16 unquantized; int8 really int8, a scale per weight; shards whole
  [profile]          the profile matches the int8 model (layers, names, shapes, finite non-zero scales, a sampled
                     verify-quant against the bf16 weights)
  [owned-key]        verl keys that the spec's own fields set are not overridden differently
  [env]              VLLM_USE_V1=1 for FlashRL; FLASHRL_LMHEAD_FP32=1 on NPU (warning)
  [resume]           with cluster.shared_dir, trainer.save_freq saves checkpoints to resume from (warning)
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

import hashlib
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import ModelError, Rollout8Error
from ..findings import Finding
from . import verl_keys
from .render import Rendered, render
from .runspec import RunSpec

ROLLOUT = verl_keys.ROLLOUT_PREFIX
MOE_CONFIG_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")
MOE_MODEL_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v2", "deepseek_v3", "dbrx", "olmoe", "jamba")
VERL_QUANT_LEAVES = ("quantization", "kv_cache_dtype", "quantization_config", "calculate_kv_scales", "quant_config")
OWNED = {  # verl key -> the spec field that sets it
    "trainer.nnodes": "cluster.nnodes",
    "trainer.n_gpus_per_node": "cluster.npus_per_node",
    "trainer.device": "cluster.accelerator",
    "actor_rollout_ref.model.path": "model.bf16",
    "data.train_files": "data.train",
    "data.val_files": "data.val",
    "actor_rollout_ref.rollout.name": "(FlashRL patches vLLM only)",
    "trainer.default_local_dir": "cluster.shared_dir (<shared_dir>/<name>/<spec digest>/checkpoints)",
}


class _Collector:
    def __init__(self) -> None:
        self.findings: list[Finding] = []

    def error(self, rule: str, field: str, message: str) -> None:
        self.findings.append(Finding("error", rule, field, message))

    def warning(self, rule: str, field: str, message: str) -> None:
        self.findings.append(Finding("warning", rule, field, message))

    def info(self, rule: str, field: str, message: str) -> None:
        self.findings.append(Finding("info", rule, field, message))


def _verl_field(spec: RunSpec, key: str) -> str:
    for raw in spec.verl:
        if verl_keys.split_key(raw)[1] == key:
            return f"verl.{raw}"
    return f"verl.{key}"


def effective(rendered: Rendered, key: str) -> Any:
    """The value verl will see: set by the render (spec or derived), deleted, or verl's default at the pin."""
    for override in rendered.overrides:
        if override.key == key:
            return verl_keys.default(key) if override.op == "~" else override.value
    return verl_keys.default(key)


def _as_int(c: _Collector, rendered: Rendered, key: str) -> int | None:
    value = effective(rendered, key)
    if value is None:
        return None
    try:
        if isinstance(value, bool) or float(value) != int(float(value)):
            raise ValueError
        return int(float(value))
    except (TypeError, ValueError):
        c.error("batch", _verl_field(rendered.spec, key), f"{value!r} is not an integer")
        return None


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")


# ---------------------------------------------------------------------------------------------- rules
def check_rollout_mode(c: _Collector, spec: RunSpec, r: Rendered) -> None:
    if not spec.flashrl:
        return
    mode = effective(r, ROLLOUT + "mode")
    if mode != "sync":
        c.error("rollout-mode", _verl_field(spec, ROLLOUT + "mode"),
                f"is {mode!r}: FlashRL hooks only vllm.LLM (the sync rollout), so {spec.rollout.quantization} "
                "rollouts would silently stay bf16; remove the override (render sets mode=sync)")
    if not _truthy(effective(r, ROLLOUT + "calculate_log_probs")):
        c.warning("rollout-mode", _verl_field(spec, ROLLOUT + "calculate_log_probs"),
                  "is off: TIS (algorithm.rollout_correction) needs the rollout log-probs to correct the int8 "
                  "mismatch; remove the override")


def check_paths(c: _Collector, spec: RunSpec) -> None:
    if "FLASHRL_CONFIG" in spec.env:
        c.error("flashrl-paths", "env.FLASHRL_CONFIG",
                f"is set by render to {spec.node_path('flashrl')} (deploy.root); remove it from env")
    shared = spec.deploy.shared_storage
    fields = {"bf16": "model.bf16", "int8": "model.int8", "profile": "model.profile", "train": "data.train",
              "val": "data.val", "reward": "data.reward"}
    for name in spec.artifacts():
        local = spec.local_path(name)
        field = fields[name]
        if name == "profile" and spec.model.profile is None:
            field = "model.profile (default <model.int8>/profile.pt)"
        if shared:
            if not PurePosixPath(str(local)).is_absolute():
                c.error("flashrl-paths", field, f"{local} must be an absolute path on every node "
                        "(deploy.shared_storage: true); a relative FlashRL path is taken for a hub id")
            elif not Path(local).exists():
                c.info("flashrl-paths", field, f"{local} is not on this machine: not checked here "
                       "(shared storage; the probe job checks it on every node)")
            continue
        if not Path(local).exists():
            what = "file" if name in ("profile", "train", "val", "reward") else "model directory"
            hint = {"profile": "; make it with `rollout8 profile -m BF16 -q INT8 -o PROFILE`"}.get(name, "")
            c.error("flashrl-paths", field, f"{local}: {what} does not exist here (it is copied from here to "
                    f"{spec.node_path(name)} on every node){hint}")
        elif name in ("bf16", "int8") and not Path(local).is_dir():
            c.error("flashrl-paths", field, f"{local} is not a directory (expected an HF model directory)")
        elif name in ("train", "val") and Path(local).suffix != ".parquet":
            c.warning("flashrl-paths", field, f"{local}: verl reads parquet files (.parquet)")
        elif name == "reward" and (not Path(local).is_file() or "def compute_score" not in
                                   Path(local).read_text(errors="replace")):
            c.error("flashrl-paths", field, f"{local}: not a Python file defining compute_score(data_source, "
                    "solution_str, ground_truth, extra_info=None), which verl's custom_reward_function calls")


def check_verl_keys(c: _Collector, spec: RunSpec, r: Rendered) -> None:
    user = [verl_keys.Override(*verl_keys.split_key(raw), value) for raw, value in spec.verl.items()]
    config_dir = verl_keys.installed_config_dir() if verl_keys.hydra_available() else None
    hydra = verl_keys.hydra_problems(user, config_dir) if config_dir and user else {}
    for override in user:
        field = f"verl.{override.raw_key}"
        value = verl_keys.value_problem(override)
        if value:
            c.error("verl-value", field, value)
        problem = verl_keys.key_problem(override)
        if override.key in verl_keys.REMOVED_KEYS:
            c.error("verl-key", field, problem[1])
        elif config_dir is not None:
            if override.raw_key in hydra:
                hint = verl_keys.suggest(override.key)
                c.error("verl-key", field, f"verl at {config_dir} refuses it: {hydra[override.raw_key]}"
                        + (f"; did you mean {hint}?" if hint and not verl_keys.exists(override.key) else ""))
            elif problem and problem[0] == "warning":
                c.warning("verl-key", field, problem[1])
        elif problem:
            getattr(c, problem[0])("verl-key", field, problem[1])


def check_verl_quantization(c: _Collector, spec: RunSpec, r: Rendered) -> None:
    if not spec.flashrl:
        return
    for raw, value in spec.verl.items():
        key = verl_keys.split_key(raw)[1]
        leaf = key.rpartition(".")[2]
        if key.startswith(ROLLOUT) and leaf in VERL_QUANT_LEAVES and value not in (None, False, "auto", "none"):
            c.error("verl-quant", f"verl.{raw}",
                    f"{value!r}: verl/vLLM's own rollout quantization or fp8 kv cache on top of FlashRL "
                    f"({spec.rollout.quantization}) corrupts the weight sync; remove it")
    for key, value in spec.env.items():
        if key.startswith("VLLM_") and "FP8" in key.upper() and value not in ("0", ""):
            c.error("verl-quant", f"env.{key}", "fp8 switches do not combine with FlashRL int8; remove it")


# What FlashRL 1.0.3 drops: its replacement of vLLM V1's Sampler.forward (flash_rl/vllm_patch.py,
# patch_vllm_logprob_compute, applied at every vllm.LLM init) applies temperature, top_k and top_p, then samples and
# returns log-probs after them; it skips vLLM's penalties, allowed/bad-word masks and logits processors. Field -> its
# neutral value (the one that changes nothing). tests/engine shows a penalty dropped in a real engine.
SAMPLER_DROPPED = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0,
                   "min_tokens": 0, "logit_bias": None, "allowed_token_ids": None, "bad_words": None,
                   "logits_processors": None}


def check_sampler(c: _Collector, spec: RunSpec, r: Rendered) -> None:
    if not spec.flashrl:
        # vLLM's own sampler at the pin returns log-probs before temperature; verl's actor recomputes them after it
        temperature = r.value(ROLLOUT + "temperature")[1]
        if r.value(ROLLOUT + "calculate_log_probs")[1] is True and temperature not in (None, 1, 1.0):
            c.warning("sampler", f"verl.{ROLLOUT}temperature",
                      f"{temperature}: a bf16 rollout's log-probs (vLLM's own sampler, no logprobs_mode set by verl at "
                      "the pin) are taken before temperature while the actor's are after it, so the rollout "
                      "correction compares unlike values; train at temperature 1.0 or with rollout.quantization: int8")
        return
    for raw, value in spec.verl.items():
        op, key = verl_keys.split_key(raw)
        field = verl_keys.sampling_param(key)
        if op == "~" or field not in SAMPLER_DROPPED or value in (SAMPLER_DROPPED[field], None, [], {}):
            continue
        c.error("sampler", f"verl.{raw}",
                f"{value!r}: FlashRL 1.0.3 replaces vLLM's sampler for {spec.rollout.quantization} rollouts and drops "
                f"{field} (it applies temperature, top_k and top_p only): the rollouts would ignore it; remove it, "
                "or train with rollout.quantization: bf16")


def _read_config(path: Path | None) -> dict | None:
    if path is None or not (path / "config.json").is_file():
        return None
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_moe_config(config: dict) -> str | None:
    """Why a config.json describes a mixture-of-experts model, or None."""
    for source in (config, config.get("text_config") or {}):
        for key in MOE_CONFIG_KEYS:
            value = source.get(key)
            if isinstance(value, int) and value > 1:
                return f"{key}={value}"
        model_type = str(source.get("model_type", ""))
        if model_type in MOE_MODEL_TYPES:
            return f"model_type={model_type}"
    return None


def check_moe(c: _Collector, spec: RunSpec) -> None:
    if not spec.flashrl:
        return
    fix = ("FlashRL's profile covers dense layers only, MoE expert weights would not be requantized; "
           "use rollout.quantization: bf16 for this model")
    if spec.model.moe:
        c.error("moe", "model.moe", f"true: {fix}")
        return
    for field, path in (("model.bf16", spec.model.bf16), ("model.int8", spec.model.int8)):
        config = _read_config(path)
        if config is not None:
            reason = is_moe_config(config)
            if reason:
                c.error("moe", field, f"{path}/config.json says mixture of experts ({reason}): {fix}")
            return
    if spec.model.moe is None:
        c.info("moe", "model.moe", "no config.json readable here: could not tell dense from MoE "
               "(set model.moe: false to state it)")


def check_layout(c: _Collector, spec: RunSpec) -> None:
    if not spec.flashrl or spec.model.int8 is None:
        return
    from .flashrl_config import detect_layout

    if spec.model.int8.is_dir():
        try:
            found = detect_layout(spec.model.int8)
        except ModelError:
            found = spec.model.layout  # what is wrong with the directory: check_models says it
        if found != spec.model.layout:
            c.error("layout", "model.layout", f"is {spec.model.layout} but {spec.model.int8} is in the {found} "
                    f"layout; set model.layout: {found}")
    if spec.cluster.accelerator == "npu" and spec.model.layout == "compressed-tensors":
        c.error("layout", "model.layout",
                "compressed-tensors W8A8 does not load on vllm-ascend at the pin (it maps every "
                "quantization_config to 'ascend' and fails with KeyError); convert the model with "
                "`rollout8 convert` and set model.layout: ascend")


def check_parallel(c: _Collector, spec: RunSpec, r: Rendered) -> tuple[int, int] | None:
    """TP x PP (x rollout DP) must divide the NPUs per node. Returns (infer world size, DP workers)."""
    tp = _as_int(c, r, ROLLOUT + "tensor_model_parallel_size")
    pp = _as_int(c, r, ROLLOUT + "pipeline_model_parallel_size") or 1
    dp = _as_int(c, r, ROLLOUT + "data_parallel_size") or 1
    if tp is None or tp < 1:
        c.error("tp", _verl_field(spec, ROLLOUT + "tensor_model_parallel_size"), f"{tp!r}: must be >= 1")
        return None
    infer = tp * pp * dp
    npus = spec.cluster.npus_per_node
    world = spec.cluster.nnodes * npus
    if npus % infer != 0:
        set_by = "" if any(verl_keys.split_key(k)[1] == ROLLOUT + "tensor_model_parallel_size"
                           for k in spec.verl) else f" (verl's default at the pin is {tp})"
        c.error("tp", _verl_field(spec, ROLLOUT + "tensor_model_parallel_size"),
                f"rollout TP {tp} x PP {pp} x DP {dp} = {infer} does not divide cluster.npus_per_node {npus}"
                f"{set_by}; pick a divisor of {npus}")
        return None
    return infer, world // (tp * pp)


def check_batches(c: _Collector, spec: RunSpec, r: Rendered) -> None:
    if _truthy(effective(r, "actor_rollout_ref.actor.use_dynamic_bsz")):
        return
    world = spec.cluster.nnodes * spec.cluster.npus_per_node
    train = _as_int(c, r, "data.train_batch_size")
    n = _as_int(c, r, ROLLOUT + "n")
    mini = _as_int(c, r, "actor_rollout_ref.actor.ppo_mini_batch_size")
    micro = _as_int(c, r, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
    sp = _as_int(c, r, "actor_rollout_ref.actor.ulysses_sequence_parallel_size") or 1
    if None in (train, n, mini) or min(train, n, mini) < 1:
        if None not in (train, n, mini):
            c.error("batch", "verl", f"batch sizes must be >= 1 (train {train}, n {n}, mini {mini})")
        return
    f_train = _verl_field(spec, "data.train_batch_size")
    f_mini = _verl_field(spec, "actor_rollout_ref.actor.ppo_mini_batch_size")
    if (train * n) % world:
        c.error("batch", f_train, f"data.train_batch_size {train} x rollout.n {n} = {train * n} is not divisible by "
                f"the world size {world} (cluster.nnodes {spec.cluster.nnodes} x npus_per_node "
                f"{spec.cluster.npus_per_node}); verl asserts it")
    if train < mini:
        c.error("batch", f_mini, f"ppo_mini_batch_size {mini} > data.train_batch_size {train}; verl refuses it")
    dp = world // sp
    normalized = mini * n // dp if dp else 0
    if normalized == 0:
        c.error("batch", f_mini, f"ppo_mini_batch_size {mini} x rollout.n {n} = {mini * n} is smaller than the "
                f"{dp} data-parallel actor ranks: nothing per rank; raise it to a multiple of {dp}")
    elif (mini * n) % dp:
        c.warning("batch", f_mini, f"ppo_mini_batch_size {mini} x rollout.n {n} = {mini * n} is not a multiple of "
                  f"{dp} actor ranks: verl rounds it down to {normalized} per rank")
    if micro and normalized and normalized % micro:
        c.error("batch", _verl_field(spec, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
                f"the per-rank mini batch {normalized} (= {mini} x {n} / {dp}) is not divisible by "
                f"ppo_micro_batch_size_per_gpu {micro}; verl asserts it")
    if effective(r, "algorithm.adv_estimator") == "grpo" and n == 1:
        c.warning("batch", _verl_field(spec, ROLLOUT + "n"),
                  "GRPO with one response per prompt has zero advantages; set it to 4 or more")


def check_hybrid(c: _Collector, spec: RunSpec, parallel: tuple[int, int] | None) -> None:
    mix = spec.rollout.mix
    if mix is None or parallel is None:
        return
    entries = mix.int8 + mix.bf16
    workers = parallel[1]
    if workers < entries:
        c.error("hybrid-mix", "rollout.hybrid", f"{mix.int8} int8 + {mix.bf16} bf16 entries but only {workers} DP "
                f"rollout workers (world / (TP x PP)): entries {workers}..{entries - 1} would never be used; "
                "lower the counts or the rollout TP")
    elif workers % entries:
        c.warning("hybrid-mix", "rollout.hybrid", f"{workers} DP rollout workers over {entries} entries: the mix is "
                  f"not exactly {mix.int8}:{mix.bf16} (worker k uses entry k % {entries})")


def check_env(c: _Collector, spec: RunSpec, r: Rendered) -> None:
    if spec.flashrl and r.env.get("VLLM_USE_V1") != "1":
        c.error("env", "env.VLLM_USE_V1", "FlashRL asserts vLLM V1; remove the override (render sets 1)")
    if spec.cluster.accelerator == "npu":
        if spec.rollout.lmhead_fp32:
            c.warning("env", "rollout.lmhead_fp32", "FLASHRL_LMHEAD_FP32=1 likely breaks on vllm-ascend (its "
                      "lm_head classes skip FlashRL's patch); keep it false until an NPU test says otherwise")
        elif spec.env.get("FLASHRL_LMHEAD_FP32") == "1":
            c.warning("env", "env.FLASHRL_LMHEAD_FP32", "=1 likely breaks on vllm-ascend (its lm_head classes "
                      "skip FlashRL's patch); remove it")


def check_resume(c: _Collector, spec: RunSpec, r: Rendered) -> None:
    if spec.checkpoint_dir is None:
        return
    freq = _as_int(c, r, "trainer.save_freq")
    if freq is not None and freq <= 0:
        c.warning("resume", _verl_field(spec, "trainer.save_freq"),
                  f"cluster.shared_dir is set but trainer.save_freq is {freq}: no checkpoint is saved, so a "
                  "resubmitted job starts again from step 0; set it to the steps between checkpoints")


def check_owned(c: _Collector, spec: RunSpec, r: Rendered) -> None:
    derived = {o.key: o.value for o in render(spec.model_copy(update={"verl": {}})).overrides}
    for raw, value in spec.verl.items():
        key = verl_keys.split_key(raw)[1]
        if key in OWNED and key in derived and str(value) != str(derived[key]):
            c.error("owned-key", f"verl.{raw}", f"{value!r} contradicts {OWNED[key]} ({derived[key]!r}); "
                    f"remove the override and set {OWNED[key]}")
        if key.startswith("ray_kwargs.ray_init.runtime_env.env_vars.FLASHRL_"):
            c.error("owned-key", f"verl.{raw}", "render passes the FLASHRL_* variables to Ray workers itself; "
                    "remove it")


_LAYER = re.compile(r"\.layers\.(\d+)\.")


def _layers(names: set[str]) -> str:
    idx = sorted({int(m.group(1)) for n in names if (m := _LAYER.search(n))})
    if not idx:
        return ""
    return f" (layers {idx[0]}..{idx[-1]})" if len(idx) > 1 else f" (layer {idx[0]})"


def _numel(x: Any) -> int:
    return int(x.numel()) if hasattr(x, "numel") else 1


def _sample(names: set[str]) -> str:
    items = sorted(names)
    return ", ".join(items[:3]) + (f", ... ({len(items)} in all)" if len(items) > 3 else "")


def check_models(c: _Collector, spec: RunSpec) -> None:
    """The model directories are what their fields say: a readable config.json; the bf16 model holds no int8
    weights (the int8 directory given as model.bf16 would train on int8 codes); the int8 model holds int8 weights,
    each with its weight_scale; every shard's size agrees with its header (a truncated copy fails here, not on
    the nodes)."""
    from ..quant.checkpoint import Checkpoint, read_json

    wanted = [("model.bf16", spec.model.bf16, "bf16")]
    if spec.flashrl and spec.model.int8 is not None:
        wanted.append(("model.int8", spec.model.int8, "int8"))
    for field, path, kind in wanted:
        if path is None or not path.is_dir():
            continue  # reported by check_paths, or not on this machine
        config = path / "config.json"
        if not config.is_file():
            c.error("models", field, f"{path}: no config.json: not a Hugging Face model directory (copy it whole)")
            continue
        try:
            parsed = read_json(config, "config.json")
            ckpt = Checkpoint(path)
        except ModelError as exc:
            c.error("models", field, str(exc))
            continue
        int8 = [n for n, t in ckpt.tensors.items() if t.dtype == "I8"]
        if kind == "bf16" and (int8 or "quantization_config" in parsed):
            c.error("models", field, f"{path} is a quantized model ({len(int8)} int8 tensors"
                    f"{', quantization_config in config.json' if 'quantization_config' in parsed else ''}): "
                    "model.bf16 must be the unquantized weights the trainer updates")
        if kind == "int8":
            weights = ckpt.int8_weights()
            if not weights:
                c.error("models", field, f"{path} holds no int8 weights: not a W8A8 model (the bf16 directory "
                        "given as model.int8?)")
                continue
            unscaled = sorted(n for n in weights if n[: -len(".weight")] + ".weight_scale" not in ckpt.tensors)
            if unscaled:
                c.error("models", field, f"{len(unscaled)} int8 weight(s) have no weight_scale, e.g. {unscaled[0]}: "
                        "the checkpoint is incomplete; convert or copy it again")


# int8 entries a sampled verify-quant checks (spread over the model): a profile of another checkpoint fails
PROFILE_SAMPLE = 4


def _profile_inputs_key(spec: RunSpec) -> str:
    """What check_profile's verdict depends on: this module's code and the profile's, the int8 and the bf16
    model's files by path, size and mtime (the trust of the plan's sha256 cache)."""
    files = [spec.model.profile_path] + sorted(p for d in (spec.model.int8, spec.model.bf16) if d and d.is_dir()
                                                for p in d.rglob("*") if p.is_file())
    stats = [(str(p), st.st_size, st.st_mtime_ns) for p, st in ((p, p.stat()) for p in files)]
    body = json.dumps([PROFILE_SAMPLE, stats]).encode() + Path(__file__).read_bytes()
    return hashlib.sha256(body).hexdigest()[:24]


def check_profile(c: _Collector, spec: RunSpec, cache: Path | None = None) -> None:
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


def _check_profile(c: _Collector, spec: RunSpec) -> None:
    profile_path = spec.model.profile_path
    field = "model.profile"
    if profile_path and profile_path.is_dir():
        c.error("profile", field, f"{profile_path} is a directory; model.profile is the profile file "
                "(`rollout8 profile -o FILE.pt`)")
        return
    if not (profile_path and profile_path.is_file() and spec.model.int8.is_dir()):
        return  # reported by check_paths, or not on this machine
    try:
        import torch
    except ImportError:
        c.info("profile", field, "torch is not installed here: profile not compared with the int8 model")
        return
    from ..quant.checkpoint import Checkpoint

    try:
        ckpt = Checkpoint(spec.model.int8)
    except ModelError as exc:
        c.error("profile", "model.int8", str(exc))
        return
    try:
        profile = torch.load(profile_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        c.error("profile", field, f"{profile_path}: not a loadable FlashRL profile ({type(exc).__name__}: {exc})")
        return
    if not isinstance(profile, dict) or not all(isinstance(v, dict) and {"input_scale", "output_scale", "type"}
                                                <= set(v) for v in profile.values()):
        c.error("profile", field, f"{profile_path}: not a FlashRL profile ({{name: {{input_scale, output_scale, "
                "type}}}}); make it with `rollout8 profile`")
        return
    quantized = ckpt.int8_weights()
    in_profile_int8 = {n for n, v in profile.items() if v["type"] == torch.int8}
    missing = quantized - in_profile_int8
    extra = set(profile) - set(ckpt.tensors)
    remake = f"; re-run `rollout8 profile` for {spec.model.int8}"
    if missing:
        c.error("profile", field, f"{len(missing)} int8 weight(s) of the int8 model are not in the profile"
                f"{_layers(missing)}: {_sample(missing)}{remake}")
    if extra:
        c.error("profile", field, f"{len(extra)} profile entr(ies) name tensors the int8 model does not have"
                f"{_layers(extra)}: {_sample(extra)}{remake}")
    wrong_type = {n for n in in_profile_int8 & set(ckpt.tensors) if n not in quantized}
    if wrong_type:
        c.error("profile", field, f"{len(wrong_type)} entr(ies) quantize to int8 tensors that are not int8 in the "
                f"model: {_sample(wrong_type)}{remake}")
    bad_shape = []
    for name, entry in sorted(profile.items()):
        info = ckpt.tensors.get(name)
        if info is None:
            continue
        shape = info.shape
        out_n, in_n = (shape[0], shape[-1]) if len(shape) >= 2 else (shape[0], shape[0])
        o, i = _numel(entry["output_scale"]), _numel(entry["input_scale"])
        if len(shape) >= 2:
            if o not in (1, out_n) or i not in (1, in_n):
                bad_shape.append(f"{name} {list(shape)}: output_scale {o}, input_scale {i}")
        elif i not in (1, out_n):
            bad_shape.append(f"{name} {list(shape)}: input_scale {i}")
    if bad_shape:
        c.error("profile", field, f"{len(bad_shape)} entr(ies) have scales whose shapes do not fit the model: "
                + "; ".join(bad_shape[:3]) + remake)
    bad_scale = sorted(name for name, entry in profile.items() for key in ("input_scale", "output_scale")
                       if torch.is_tensor(entry[key]) and entry[key].is_floating_point()
                       and not bool((torch.isfinite(entry[key]) & (entry[key] != 0)).all()))
    if bad_scale:
        c.error("profile", field, f"{len(bad_scale)} entr(ies) have NaN, infinite or zero scales, e.g. "
                f"{bad_scale[0]}: FlashRL would write garbage weights at every sync{remake}")
    if missing or extra or wrong_type or bad_shape or bad_scale or not spec.model.bf16.is_dir():
        return
    from ..quant.verify import verify

    try:
        report = verify(spec.model.bf16, spec.model.int8, profile_path, sample=PROFILE_SAMPLE)
    except ModelError as exc:
        c.error("profile", field, str(exc))
        return
    if not report.passed:
        worst = report.failures[0]
        c.error("profile", field, f"a sampled verify-quant fails ({len(report.failures)} of {len(report.rows)} "
                f"entries, e.g. {worst.name}: {worst.message}): the profile, the bf16 model and the int8 model are "
                f"not of one checkpoint; re-run `rollout8 profile -m {spec.model.bf16} -q {spec.model.int8}`")


def rules() -> str:
    """The rules this module enforces, as `rollout8 check --explain` prints them (from this docstring)."""
    return __doc__[__doc__.index("  [rollout-mode]"):]


def run_checks(spec: RunSpec, profile_cache: Path | None = None) -> list[Finding]:
    c = _Collector()
    check_paths(c, spec)
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
    check_moe(c, spec)
    check_layout(c, spec)
    parallel = check_parallel(c, spec, rendered)
    check_batches(c, spec, rendered)
    check_hybrid(c, spec, parallel)
    check_env(c, spec, rendered)
    check_resume(c, spec, rendered)
    check_models(c, spec)
    check_profile(c, spec, profile_cache)
    return c.findings
