"""`rollout8 render RUN.yaml -o DIR`: everything a launch needs, from one run spec.

Writes into DIR (names fixed; the Ansible roles read render.json, never the spec):
  flashrl.yaml   the FlashRL config with node paths (int8 and hybrid runs only)
  rollout8.env   KEY=VALUE lines (docker --env-file / systemd EnvironmentFile format), for every node,
                 to be in the environment before `ray start`
  launch.sh      exports the env and runs `python3 -m verl.trainer.main_ppo ...` (on the Ray head)
  render.json    the manifest: artifacts (local -> node paths, checksums), env, per-node env, argv

Output is a pure function of the spec and of the local artifacts' contents: same input, same bytes.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..fileutil import atomic_write, sha256_bytes, sha256_file
from . import flashrl_config
from .runspec import RunSpec
from .verl_keys import Override, QuotedStr, as_hydra_reads, split_key

MANIFEST_SCHEMA = 1
FLASHRL_FILE = "flashrl.yaml"
ENV_FILE = "rollout8.env"
LAUNCH_FILE = "launch.sh"
MANIFEST_FILE = "render.json"
HASH_LIMIT = 64 * 1024 * 1024  # files above this size are listed with their size only (model shards)

TIS = {  # the reference recipe: sequence-level truncated importance sampling, threshold 2.0
    "algorithm.rollout_correction.rollout_is": "sequence",
    "algorithm.rollout_correction.rollout_is_threshold": 2.0,
}
# Variables that must reach every Ray worker even if Ray was started before they were exported.
RUNTIME_ENV_KEYS = ("FLASHRL_CONFIG", "FLASHRL_LOGGING_LEVEL", "FLASHRL_LMHEAD_FP32", "VLLM_USE_V1", "HF_HUB_OFFLINE")
RUNTIME_ENV_PREFIX = "ray_kwargs.ray_init.runtime_env.env_vars."
CPU_BRIDGES_HOOK_KEY = "ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"
CPU_BRIDGES_HOOK = "rollout8_cpu_bridges.install"

# Checkpoints on by default: a multi-hour job left alone must be resumable, and verl's own trainer.save_freq (-1)
# saves nothing. Derived only where the spec's verl: block does not set the key itself: an explicit value wins,
# trainer.save_freq: -1 included (the opt-out). The checkpoints land in trainer.default_local_dir (spec.checkpoint_dir
# with cluster.shared_dir); verl also saves the last step whenever save_freq > 0.
SAVE_FRACTION = 10  # with trainer.total_training_steps known: a checkpoint every 10% of the run (ceil(total / 10))
# Without it the run's length (total_epochs x the training rows / data.train_batch_size, after verl's filtering) is
# known only once verl has read the data. 20 steps: on the shipped GSM8K specs (7473 rows / batch 16, about 467 steps
# an epoch, minutes a step) a failure loses at most 20 steps, and the save (the actor's weights, optimizer and
# extra state) comes about 23 times an epoch, a small share of the run's time.
SAVE_FREQ_STEPS = 20
# trainer.max_actor_ckpt_to_keep: verl removes older checkpoints past this many. Each holds the actor's fp32 weights
# and Adam state (about 12 bytes a parameter: ~90 GB for a 7B model), so unbounded retention fills the disk within
# an epoch; 2 keeps the one before the latest too. GRPO has no critic: max_critic_ckpt_to_keep is left alone.
CKPT_TO_KEEP = 2


@dataclass
class Rendered:
    spec: RunSpec
    env: dict[str, str]
    per_node_env: dict[str, str]
    runtime_env: dict[str, str]
    overrides: list[Override]
    flashrl: dict | None
    derived_keys: set[str] = field(default_factory=set)
    # the checkpoint keys render derived because the spec leaves them unset: key -> what the value comes from
    derived_from: dict[str, str] = field(default_factory=dict)

    @property
    def argv(self) -> list[str]:
        return ["python3", "-m", "verl.trainer.main_ppo"] + [o.arg() for o in self.overrides]

    def value(self, key: str) -> tuple[bool, Any]:
        """(set by this render?, value) of a verl key; unset keys report (False, None)."""
        for override in self.overrides:
            if override.key == key and override.op != "~":
                return True, override.value
        return False, None


def build_env(spec: RunSpec) -> tuple[dict[str, str], dict[str, str]]:
    """(env for every node, per-node env described) in a fixed order; spec.env wins."""
    env: dict[str, str] = {}
    if spec.flashrl:
        env["FLASHRL_CONFIG"] = spec.node_path("flashrl")
        env["FLASHRL_LOGGING_LEVEL"] = "DEBUG"  # `rollout8 logs` needs the DEBUG lines for its verdict
        env["FLASHRL_LMHEAD_FP32"] = "1" if spec.rollout.lmhead_fp32 else "0"
    env["VLLM_USE_V1"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    per_node: dict[str, str] = {}
    net = spec.cluster.network
    # Ray hides the NPUs from the `ray job submit` entrypoint and renumbers them in workers without it (ray #59063);
    # CPU runs too: their custom NPU resource makes Ray treat them as Ascend nodes (rollout8.node.npu_visibility)
    env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] = "1"
    if spec.cluster.accelerator == "npu":
        env["PYTORCH_NPU_ALLOC_CONF"] = "expandable_segments:True"
        env["HCCL_CONNECT_TIMEOUT"] = str(net.hccl_connect_timeout)
        for name, value in (("HCCL_EXEC_TIMEOUT", net.hccl_exec_timeout), ("HCCL_BUFFSIZE", net.hccl_buffsize),
                            ("HCCL_HOST_SOCKET_PORT_RANGE", net.hccl_host_socket_port_range),
                            ("HCCL_NPU_SOCKET_PORT_RANGE", net.hccl_npu_socket_port_range)):
            if value is not None:
                env[name] = str(value)
        per_node["HCCL_IF_IP"] = "the node's IPv4 address on cluster.network.nic"
    if net.nic:
        if spec.cluster.accelerator == "npu":
            env["HCCL_SOCKET_IFNAME"] = net.nic
        env["GLOO_SOCKET_IFNAME"] = net.nic
        env["TP_SOCKET_IFNAME"] = net.nic
    env.update(spec.env)
    return env, per_node


def _positive_int(value: Any) -> int | None:
    value = as_hydra_reads(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        return None
    return int(value)


def checkpoint_defaults(spec: RunSpec) -> dict[str, tuple[Any, str]]:
    """The checkpoint keys render sets where the spec's verl: block does not: key -> (value, what it is derived
    from). trainer.save_freq: every 10% of trainer.total_training_steps, else every SAVE_FREQ_STEPS steps;
    trainer.max_actor_ckpt_to_keep: CKPT_TO_KEEP, unless the spec turns checkpoints off."""
    user = {}
    for raw, value in spec.verl.items():
        op, key = split_key(raw)
        user[key] = -1 if op == "~" and key == "trainer.save_freq" else value  # deleted: verl's default, -1
    out: dict[str, tuple[Any, str]] = {}
    if "trainer.save_freq" not in user:
        total = _positive_int(user.get("trainer.total_training_steps"))
        if total is not None:
            out["trainer.save_freq"] = (max(1, math.ceil(total / SAVE_FRACTION)),
                                        f"every {100 // SAVE_FRACTION}% of trainer.total_training_steps {total}")
        else:
            out["trainer.save_freq"] = (SAVE_FREQ_STEPS, f"every {SAVE_FREQ_STEPS} steps, render's default without "
                                                         "trainer.total_training_steps")
        saves = True
    else:
        freq = as_hydra_reads(user["trainer.save_freq"])
        saves = not (isinstance(freq, (int, float)) and not isinstance(freq, bool) and freq <= 0)
    if "trainer.max_actor_ckpt_to_keep" not in user and saves:
        out["trainer.max_actor_ckpt_to_keep"] = (CKPT_TO_KEEP, f"the latest {CKPT_TO_KEEP} kept, older ones removed "
                                                              "so the disk does not fill")
    return out


def build_overrides(spec: RunSpec, env: dict[str, str]) -> tuple[list[Override], set[str], dict[str, str]]:
    derived: dict[str, Any] = {
        "algorithm.adv_estimator": "grpo",
        "data.train_files": spec.node_path("train"),
        "data.val_files": spec.node_path("val"),
        "actor_rollout_ref.model.path": spec.node_path("bf16"),
        "actor_rollout_ref.rollout.name": "vllm",
        # FlashRL hooks only vllm.LLM (the sync path); the bf16 baseline runs the same path for a fair comparison.
        "actor_rollout_ref.rollout.mode": "sync",
    }
    if spec.flashrl:
        derived["actor_rollout_ref.rollout.calculate_log_probs"] = True
        derived.update(TIS)
    if spec.data.reward is not None:
        derived["custom_reward_function.path"] = spec.node_path("reward")
        derived["custom_reward_function.name"] = "compute_score"
    if spec.checkpoint_dir is not None:
        # on the directory every node sees: a resubmitted job (train.yml after a failure) resumes from the latest
        derived["trainer.default_local_dir"] = spec.checkpoint_dir
        derived["trainer.resume_mode"] = "auto"
    derived.update((key, value) for key, (value, _) in checkpoint_defaults(spec).items())
    derived["trainer.device"] = spec.cluster.accelerator
    derived["trainer.nnodes"] = spec.cluster.nnodes
    derived["trainer.n_gpus_per_node"] = spec.cluster.npus_per_node
    overrides = [Override("", key, value) for key, value in derived.items()]
    runtime_env = {k: env[k] for k in RUNTIME_ENV_KEYS if k in env}
    runtime_env.update(spec.env)
    for key, value in runtime_env.items():
        overrides.append(Override("+", RUNTIME_ENV_PREFIX + key, QuotedStr(value)))
    if spec.cluster.accelerator == "cpu":
        # The simulated tier's CPU bridges, in every Ray worker of the job (virtual/cpu_bridges: only the simulated
        # nodes have the module; an accelerator: npu render never names it).
        overrides.append(Override("+", CPU_BRIDGES_HOOK_KEY, CPU_BRIDGES_HOOK))
    derived_keys = {o.key for o in overrides}
    # The spec's own overrides: replace a derived key in place (check reports conflicts), else append.
    for raw_key, value in spec.verl.items():
        op, key = split_key(raw_key)
        new = Override(op, key, value)
        for i, existing in enumerate(overrides):
            if existing.key == key:
                overrides[i] = new
                break
        else:
            overrides.append(new)
    return overrides, derived_keys, runtime_env


def render(spec: RunSpec) -> Rendered:
    env, per_node = build_env(spec)
    overrides, derived_keys, runtime_env = build_overrides(spec, env)
    flashrl = flashrl_config.config_for_spec(spec, node_paths=True) if spec.flashrl else None
    derived_from = {key: why for key, (_, why) in checkpoint_defaults(spec).items()}
    return Rendered(spec, env, per_node, runtime_env, overrides, flashrl, derived_keys, derived_from)


# ---------------------------------------------------------------------------------------------- files
def env_file_text(rendered: Rendered) -> str:
    lines = [f"# rollout8 render: environment of run {rendered.spec.name} (every node, before `ray start`)."]
    for key in rendered.per_node_env:
        lines.append(f"# per node, set by Ansible: {key} = {rendered.per_node_env[key]}")
    for key, value in rendered.env.items():
        if any(c.isspace() for c in value):
            raise SpecError(f"env.{key}: value {value!r} contains whitespace (not representable in an env file)")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def launch_text(rendered: Rendered) -> str:
    lines = [
        "#!/usr/bin/env bash",
        f"# rollout8 render: launch run {rendered.spec.name} on the Ray head (generated; re-render, do not edit).",
        "# Extra hydra overrides given to this script are appended.",
        "set -euo pipefail",
    ]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in rendered.env.items()]
    argv = rendered.argv
    lines.append(f"exec {shlex.join(argv[:3])} \\")
    lines += [f"  {shlex.quote(arg)} \\" for arg in argv[3:]]
    lines.append('  "$@"')
    return "\n".join(lines) + "\n"


def describe_local(path: Path | None) -> dict:
    """What is at a local artifact path: kind, presence, and per-file size/sha256 (sha256 for files <= 64 MiB)."""
    if path is None:
        return {"present": False}
    if path.is_file():
        size = path.stat().st_size
        return {"present": True, "kind": "file", "size": size,
                "sha256": sha256_file(path) if size <= HASH_LIMIT else None}
    if path.is_dir():
        files = []
        for item in sorted(p for p in path.rglob("*") if p.is_file()):
            size = item.stat().st_size
            files.append({"path": item.relative_to(path).as_posix(), "size": size,
                          "sha256": sha256_file(item) if size <= HASH_LIMIT else None})
        return {"present": True, "kind": "dir", "files": files}
    return {"present": False}


def manifest(rendered: Rendered, flashrl_text: str | None, spec_text: str) -> dict:
    spec = rendered.spec
    copy = not spec.deploy.shared_storage
    artifacts = []
    for name in spec.artifacts():
        local = spec.local_path(name)
        entry = {"name": name, "local": str(local), "node": spec.node_path(name), "copy": copy}
        entry.update(describe_local(local) if copy else {"present": None})
        artifacts.append(entry)
    if flashrl_text is not None:
        artifacts.append({
            "name": "flashrl", "local": FLASHRL_FILE, "node": spec.node_path("flashrl"), "copy": True,
            "present": True, "kind": "file", "size": len(flashrl_text.encode()),
            "sha256": sha256_bytes(flashrl_text),
        })
    root = spec.deploy_root
    node_dirs = [root] + ([f"{root}/models", f"{root}/data"] if copy else [])
    tp = rendered.value("actor_rollout_ref.rollout.tensor_model_parallel_size")
    return {
        "schema": MANIFEST_SCHEMA,
        "name": spec.name,
        "spec_file": spec.source.name if spec.source else None,
        "spec_sha256": sha256_bytes(spec_text),
        "quantization": spec.rollout.quantization,
        "accelerator": spec.cluster.accelerator,
        "nnodes": spec.cluster.nnodes,
        "npus_per_node": spec.cluster.npus_per_node,
        "rollout_tp": tp[1] if tp[0] else None,
        "deploy_root": root,
        "node_dirs": node_dirs,
        "files": {
            "flashrl_config": FLASHRL_FILE if flashrl_text is not None else None,
            "env": ENV_FILE,
            "launch": LAUNCH_FILE,
        },
        "artifacts": artifacts,
        "env": rendered.env,
        "per_node_env": rendered.per_node_env,
        "ray_runtime_env_vars": rendered.runtime_env,
        "command": rendered.argv,
    }


def write_outputs(rendered: Rendered, out_dir: Path) -> dict[str, Path]:
    """Write every output file into out_dir (created); stale files of an earlier render are removed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = rendered.spec
    flashrl_text = flashrl_config.dump_config(rendered.flashrl) if rendered.flashrl is not None else None
    spec_text = spec.source.read_text() if spec.source else ""
    texts = {ENV_FILE: env_file_text(rendered), LAUNCH_FILE: launch_text(rendered)}
    if flashrl_text is not None:
        texts[FLASHRL_FILE] = flashrl_text
    texts[MANIFEST_FILE] = json.dumps(manifest(rendered, flashrl_text, spec_text), indent=2) + "\n"
    written: dict[str, Path] = {}
    for name, text in texts.items():
        written[name] = atomic_write(out_dir / name, text, mode=0o755 if name == LAUNCH_FILE else 0o644)
    if flashrl_text is None:
        (out_dir / FLASHRL_FILE).unlink(missing_ok=True)
    return written
