"""The rules of `rollout8 check` on what verl is given: the rollout mode, every override's key and value at the
verl pin, rollout quantization on top of FlashRL, the sampling options FlashRL drops, keys the spec's own fields
own, the environment, resumability, and the sizes verl asserts on (TP x PP, batch sizes, the hybrid mix).
Each reports through a Collector (check_common); check.run_checks calls them in order.
"""

from __future__ import annotations

from . import verl_keys
from .check_common import ROLLOUT, Collector, as_int, effective, truthy, user_sets, verl_field
from .checkpoint_size import BYTES_PER_PARAMETER_PER_SAVE
from .render import SAVE_FRACTION, SAVE_FREQ_STEPS, Rendered, render
from .runspec import RunSpec

VERL_QUANT_LEAVES = ("quantization", "kv_cache_dtype", "quantization_config", "calculate_kv_scales", "quant_config")


OWNED = {  # verl key -> the spec field that sets it
    "trainer.nnodes": "cluster.nnodes",
    "trainer.n_gpus_per_node": "cluster.npus_per_node",
    "trainer.device": "cluster.accelerator",
    "actor_rollout_ref.model.path": "model.bf16",
    "data.train_files": "data.train",
    "data.val_files": "data.val",
    "actor_rollout_ref.rollout.name": "(FlashRL patches vLLM only)",
    "trainer.default_local_dir": "cluster.shared_dir (<shared_dir>/<name>/<resume key>/checkpoints)",
}


# ---------------------------------------------------------------------------------------------- rules
def check_rollout_mode(c: Collector, spec: RunSpec, r: Rendered) -> None:
    if not spec.flashrl:
        return
    mode = effective(r, ROLLOUT + "mode")
    if mode != "sync":
        c.error("rollout-mode", verl_field(spec, ROLLOUT + "mode"),
                f"is {mode!r}: FlashRL hooks only vllm.LLM (the sync rollout), so {spec.rollout.quantization} "
                "rollouts would silently stay bf16; remove the override (render sets mode=sync)")
    if not truthy(effective(r, ROLLOUT + "calculate_log_probs")):
        c.warning("rollout-mode", verl_field(spec, ROLLOUT + "calculate_log_probs"),
                  "is off: TIS (algorithm.rollout_correction) needs the rollout log-probs to correct the int8 "
                  "mismatch; remove the override")
    if effective(r, "algorithm.rollout_correction.rollout_is") in (None, "null"):
        c.warning("rollout-mode", verl_field(spec, "algorithm.rollout_correction.rollout_is"),
                  f"is null: nothing corrects the mismatch between the {spec.rollout.quantization} rollout's "
                  "log-probs and the bf16 actor's (render sets sequence-level TIS, threshold 2.0, as the reference "
                  "recipe does); remove the override, or set token or sequence")


def check_verl_keys(c: Collector, spec: RunSpec, r: Rendered) -> None:
    user = [verl_keys.Override(*verl_keys.split_key(raw), value) for raw, value in spec.verl.items()]
    config_dir = verl_keys.installed_config_dir() if verl_keys.hydra_available() else None
    hydra = verl_keys.hydra_problems(user, config_dir) if config_dir and user else {}
    rendered = r if r is not None else render(spec)
    manager = str(effective(rendered, "reward_model.reward_manager"))
    custom_reward = effective(rendered, "custom_reward_function.path") not in (None, "", "null")
    for override in user:
        field = f"verl.{override.raw_key}"
        value = verl_keys.value_problem(override)
        if value:
            c.error("verl-value", field, value)
        problem = verl_keys.key_problem(override, manager, custom_reward)
        if override.key in verl_keys.REMOVED_KEYS:
            c.error("verl-key", field, problem[1])
        elif config_dir is not None:
            if override.raw_key in hydra:
                hint = verl_keys.suggest(override.key)
                c.error("verl-key", field, f"verl at {config_dir} refuses it: {hydra[override.raw_key]}"
                        + (f"; did you mean {hint}?" if hint and not verl_keys.exists(override.key) else ""))
            elif problem and (problem[0] == "warning" or verl_keys.reward_kwargs_problem(override, manager)):
                # hydra composes any '+' add; what the reward manager then refuses is verl's, not hydra's
                getattr(c, problem[0])("verl-key", field, problem[1])
        elif problem:
            getattr(c, problem[0])("verl-key", field, problem[1])


def check_verl_quantization(c: Collector, spec: RunSpec, r: Rendered) -> None:
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


def check_sampler(c: Collector, spec: RunSpec, r: Rendered) -> None:
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


def check_parallel(c: Collector, spec: RunSpec, r: Rendered) -> tuple[int, int] | None:
    """TP x PP (x rollout DP) must divide the NPUs per node. Returns (infer world size, DP workers)."""
    tp = as_int(c, r, ROLLOUT + "tensor_model_parallel_size")
    pp = as_int(c, r, ROLLOUT + "pipeline_model_parallel_size") or 1
    dp = as_int(c, r, ROLLOUT + "data_parallel_size") or 1
    if tp is None or tp < 1:
        c.error("tp", verl_field(spec, ROLLOUT + "tensor_model_parallel_size"), f"{tp!r}: must be >= 1")
        return None
    infer = tp * pp * dp
    npus = spec.cluster.npus_per_node
    world = spec.cluster.nnodes * npus
    if npus % infer != 0:
        set_by = "" if user_sets(spec, ROLLOUT + "tensor_model_parallel_size") else \
            f" (verl's default at the pin is {tp})"
        c.error("tp", verl_field(spec, ROLLOUT + "tensor_model_parallel_size"),
                f"rollout TP {tp} x PP {pp} x DP {dp} = {infer} does not divide cluster.npus_per_node {npus}"
                f"{set_by}; pick a divisor of {npus}")
        return None
    return infer, world // (tp * pp)


def check_batches(c: Collector, spec: RunSpec, r: Rendered) -> None:
    """The driver's rules (verl 51d2104: verl/utils/config.py:89-113, verl/workers/config/actor.py:152-157) hold
    without dynamic batch sizing only; the FSDP workers' per-rank rules (verl/workers/fsdp_workers.py:234-256: the
    mini batch x rollout.n over the data-parallel ranks > 0 and divisible by ppo_micro_batch_size_per_gpu when that
    is set) are asserted whatever use_dynamic_bsz says."""
    dynamic = truthy(effective(r, "actor_rollout_ref.actor.use_dynamic_bsz"))
    world = spec.cluster.nnodes * spec.cluster.npus_per_node
    train = as_int(c, r, "data.train_batch_size")
    n = as_int(c, r, ROLLOUT + "n")
    mini = as_int(c, r, "actor_rollout_ref.actor.ppo_mini_batch_size")
    micro = as_int(c, r, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
    sp = as_int(c, r, "actor_rollout_ref.actor.ulysses_sequence_parallel_size") or 1
    if None in (train, n, mini) or min(train, n, mini) < 1:
        if None not in (train, n, mini):
            c.error("batch", "verl", f"batch sizes must be >= 1 (train {train}, n {n}, mini {mini})")
        return
    f_train = verl_field(spec, "data.train_batch_size")
    f_mini = verl_field(spec, "actor_rollout_ref.actor.ppo_mini_batch_size")
    if not dynamic and (train * n) % world:
        c.error("batch", f_train, f"data.train_batch_size {train} x rollout.n {n} = {train * n} is not divisible by "
                f"the world size {world} (cluster.nnodes {spec.cluster.nnodes} x npus_per_node "
                f"{spec.cluster.npus_per_node}); verl asserts it")
    if not dynamic and train < mini:
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
        c.error("batch", verl_field(spec, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
                f"the per-rank mini batch {normalized} (= {mini} x {n} / {dp}) is not divisible by "
                f"ppo_micro_batch_size_per_gpu {micro}; verl's FSDP workers assert it"
                + (" (with use_dynamic_bsz too)" if dynamic else ""))
    if effective(r, "algorithm.adv_estimator") == "grpo" and n == 1:
        c.warning("batch", verl_field(spec, ROLLOUT + "n"),
                  "GRPO with one response per prompt has zero advantages; set it to 4 or more")


def model_len(c: Collector, r: Rendered) -> tuple[int | None, str]:
    """(max_model_len verl's sync vLLM rollout gives vLLM, how it was reached): rollout.max_model_len, else
    data.max_prompt_length + data.max_response_length (verl 51d2104, vllm_rollout_spmd.py:200)."""
    explicit = as_int(c, r, ROLLOUT + "max_model_len")
    if explicit:
        return explicit, "rollout.max_model_len"
    prompt, response = as_int(c, r, "data.max_prompt_length"), as_int(c, r, "data.max_response_length")
    if prompt is None or response is None:
        return None, ""
    return prompt + response, f"max_prompt_length {prompt} + max_response_length {response}"


def check_token_budget(c: Collector, spec: RunSpec, r: Rendered) -> None:
    """verl's sync vLLM rollout refuses chunked prefill off with a token budget below max_model_len when the rollout
    starts, after the cluster is up (verl 51d2104, vllm_rollout_spmd.py:204-208). render runs the sync rollout; on
    the async path vLLM V1 turns chunked prefill back on (vLLM 0.10.1.1, EngineArgs._set_default_args_v1), so only
    sync is judged."""
    if effective(r, ROLLOUT + "mode") != "sync" or truthy(effective(r, ROLLOUT + "enable_chunked_prefill")):
        return
    budget = as_int(c, r, ROLLOUT + "max_num_batched_tokens")
    length, how = model_len(c, r)
    if budget is not None and length and budget < length:
        set_by = "" if user_sets(spec, ROLLOUT + "max_num_batched_tokens") else " (verl's default)"
        c.error("token-budget", verl_field(spec, ROLLOUT + "max_num_batched_tokens"),
                f"{budget}{set_by} is below max_model_len {length} ({how}) with enable_chunked_prefill off: verl's "
                f"vLLM rollout refuses it when the rollout starts, after the cluster is up; raise it to at least "
                f"{length} or turn chunked prefill on")


# NPUs per node of each Atlas node kind (cluster.node_kind): 8 on an Atlas 800T A2, 16 on an A3.
NPUS_PER_NODE = {"a2": 8, "a3": 16}


def check_nodes(c: Collector, spec: RunSpec, nic_in_inventory: bool = False) -> None:
    """NPU nodes: as many NPUs per node as their kind has ([npus]), and for more than one a shared directory for
    the checkpoints ([shared-dir]) and a data NIC ([network])."""
    cluster = spec.cluster
    # any accelerator: Gloo (the cpu runs' collectives) binds where HCCL does
    if cluster.nnodes > 1 and not cluster.network.nic and not nic_in_inventory:
        c.error("network", "cluster.network.nic",
                f"unset with cluster.nnodes {cluster.nnodes}, and the inventory does not name a data NIC for every "
                "node: HCCL and Gloo would pick an address by hostname or default route, which on Atlas nodes is "
                "often the management NIC (or none: air-gapped nodes often have no default route), not the data "
                "(RoCE) network; set it to the data NIC's name on the nodes (e.g. enp189s0f0), or rollout8_cluster_nic "
                "for every node in the inventory (ansible-playbook train.yml then passes --nic-in-inventory)")
    if cluster.accelerator != "npu":
        return
    most = NPUS_PER_NODE[cluster.node_kind]
    if cluster.npus_per_node > most:
        other = next((k for k, v in NPUS_PER_NODE.items() if v >= cluster.npus_per_node), None)
        c.error("npus", "cluster.npus_per_node",
                f"{cluster.npus_per_node}, but an Atlas {cluster.node_kind.upper()} node has {most} NPUs "
                f"(cluster.node_kind: {cluster.node_kind}"
                f"{', the default' if 'node_kind' not in cluster.model_fields_set else ''}); use at most {most}"
                + (f", or set cluster.node_kind: {other} for Atlas {other.upper()} nodes" if other else ""))
    if cluster.nnodes > 1 and not cluster.shared_dir:
        c.error("shared-dir", "cluster.shared_dir",
                f"unset with cluster.nnodes {cluster.nnodes}: verl's checkpoints would land in its relative "
                "trainer.default_local_dir inside each node's training container, on the node's root disk (about "
                f"{BYTES_PER_PARAMETER_PER_SAVE} bytes a parameter a save: ~100 GB for a 7B model, times "
                "trainer.max_actor_ckpt_to_keep), where a resubmitted job does not find them; set it to a directory "
                "of a filesystem every node mounts at the same path (e.g. an NFS export such as "
                "/mnt/rollout8-shared): checkpoints go there, and a resubmitted job resumes from them")


# Environment variables the spec's own fields (or render itself) set: a spec's env block must not set them apart.
OWNED_ENV = {
    "HCCL_SOCKET_IFNAME": "cluster.network.nic", "GLOO_SOCKET_IFNAME": "cluster.network.nic",
    "TP_SOCKET_IFNAME": "cluster.network.nic", "HCCL_IF_IP": "cluster.network.nic (Ansible sets it per node)",
    "HCCL_CONNECT_TIMEOUT": "cluster.network.hccl_connect_timeout",
    "HCCL_EXEC_TIMEOUT": "cluster.network.hccl_exec_timeout", "HCCL_BUFFSIZE": "cluster.network.hccl_buffsize",
    "HCCL_HOST_SOCKET_PORT_RANGE": "cluster.network.hccl_host_socket_port_range",
    "HCCL_NPU_SOCKET_PORT_RANGE": "cluster.network.hccl_npu_socket_port_range",
    "FLASHRL_LMHEAD_FP32": "rollout.lmhead_fp32",
    "FLASHRL_LOGGING_LEVEL": "render (DEBUG: `rollout8 logs` reads FlashRL's debug lines for its verdict)",
    "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "render (1: Ray must not renumber the NPUs, ray #59063)",
}


def check_hybrid(c: Collector, spec: RunSpec, parallel: tuple[int, int] | None) -> None:
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


def check_env(c: Collector, spec: RunSpec, r: Rendered) -> None:
    if spec.flashrl and r.env.get("VLLM_USE_V1") != "1":
        c.error("env", "env.VLLM_USE_V1", "FlashRL asserts vLLM V1; remove the override (render sets 1)")
    for key in sorted(spec.env.keys() & OWNED_ENV.keys()):
        c.error("env", f"env.{key}", f"is set by {OWNED_ENV[key]}; remove it from env and set it there")
    if spec.cluster.accelerator == "npu" and spec.rollout.lmhead_fp32:
        c.warning("env", "rollout.lmhead_fp32", "FLASHRL_LMHEAD_FP32=1 likely breaks on vllm-ascend (its "
                  "lm_head classes skip FlashRL's patch); keep it false until an NPU test says otherwise")


def check_resume(c: Collector, spec: RunSpec, r: Rendered) -> None:
    """The checkpoint keys render derived (one info line naming them and what from), and an explicit
    trainer.save_freq <= 0 where checkpoints matter: with cluster.shared_dir (kept there for resubmission) or on
    more than one node (more nodes, more chances the job dies)."""
    if r.derived_from:
        where = spec.checkpoint_dir or ("verl's default trainer.default_local_dir, relative to the job's working "
                                        "directory in the training containers (cluster.shared_dir puts them where "
                                        "every node and a resubmission see them)")
        c.info("resume", verl_field(spec, next(iter(r.derived_from))),
               "derived by render (the spec's verl: leaves them unset): " + "; ".join(
                   f"{key}={r.value(key)[1]} ({why})" for key, why in r.derived_from.items())
               + f"; checkpoints go to {where}; set a key in verl: to choose another value")
    nodes = spec.cluster.nnodes
    if spec.checkpoint_dir is None and nodes == 1:
        return
    freq = as_int(c, r, "trainer.save_freq")
    if freq is not None and freq <= 0:
        why = f"on {nodes} nodes" if nodes > 1 else "with cluster.shared_dir set for them"
        if nodes > 1 and spec.checkpoint_dir is not None:
            why += " and cluster.shared_dir set for them"
        c.warning("resume", verl_field(spec, "trainer.save_freq"),
                  f"is {freq} {why}: no checkpoint is saved, so after a failure"
                  + (" of any one node" if nodes > 1 else "") + " a resubmitted job starts again from step 0, "
                  "every step trained lost; remove it (render "
                  f"then saves every {100 // SAVE_FRACTION}% of trainer.total_training_steps, else every "
                  f"{SAVE_FREQ_STEPS} steps) or set the steps between checkpoints")


def check_owned(c: Collector, spec: RunSpec, r: Rendered) -> None:
    derived = {o.key: o.value for o in render(spec.model_copy(update={"verl": {}})).overrides}
    for raw, value in spec.verl.items():
        key = verl_keys.split_key(raw)[1]
        if key in OWNED and key in derived and str(value) != str(derived[key]):
            c.error("owned-key", f"verl.{raw}", f"{value!r} contradicts {OWNED[key]} ({derived[key]!r}); "
                    f"remove the override and set {OWNED[key]}")
        if key.startswith("ray_kwargs.ray_init.runtime_env.env_vars.FLASHRL_"):
            c.error("owned-key", f"verl.{raw}", "render passes the FLASHRL_* variables to Ray workers itself; "
                    "remove it")
