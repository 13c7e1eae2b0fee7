"""The shipped GSM8K specs are the upstream reference recipe, differences explained.

The recipe: MindSpeed-RL 6f8e476f6eb19f67e96168508db7a03cc1a5692f, tests/verl_examples/configs/
test_grpo_qwen25_7b_fsdp_int8_A2.sh (the verl command at lines 51-102, its environment at lines 3-12; the launcher
tests/verl_examples/flash_rl/grpo_qwen25_7b_fsdp_int8_A2.sh runs it). Below are its values as it passes them
(shell variables resolved), by line; the paths are left out (every site has its own). Each shipped spec must render
to the same value for every key, except where its own line (or the comment right above it) says why not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout8.runspec import verl_keys
from rollout8.runspec.check_common import effective
from rollout8.runspec.render import render
from rollout8.runspec.runspec import load_spec

RUNS = Path(__file__).resolve().parents[2] / "configs" / "runs"
SPECS = ("qwen2.5-7b-int8-gsm8k.yaml", "qwen2.5-7b-bf16-gsm8k.yaml")

RECIPE = (  # (line, key, value as the script writes it)
    (52, "algorithm.adv_estimator", "grpo"),
    (55, "data.train_batch_size", "16"),
    (56, "data.max_prompt_length", "2048"),
    (57, "data.max_response_length", "10240"),
    (58, "data.filter_overlong_prompts", "True"),
    (59, "data.truncation", "error"),
    (61, "actor_rollout_ref.actor.optim.lr", "5e-8"),
    (62, "actor_rollout_ref.model.use_remove_padding", "True"),
    (63, "actor_rollout_ref.actor.use_dynamic_bsz", "True"),
    (64, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "12288"),
    (65, "actor_rollout_ref.actor.ppo_mini_batch_size", "8"),
    (66, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "2"),
    (67, "actor_rollout_ref.actor.use_kl_loss", "True"),
    (68, "actor_rollout_ref.actor.entropy_coeff", "0"),
    (69, "actor_rollout_ref.actor.kl_loss_coef", "0.001"),
    (70, "actor_rollout_ref.actor.kl_loss_type", "low_var_kl"),
    (71, "actor_rollout_ref.model.enable_gradient_checkpointing", "True"),
    (72, "actor_rollout_ref.actor.fsdp_config.param_offload", "False"),
    (73, "actor_rollout_ref.actor.fsdp_config.optimizer_offload", "False"),
    (74, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "2"),
    (75, "actor_rollout_ref.rollout.tensor_model_parallel_size", "4"),
    (76, "actor_rollout_ref.rollout.name", "vllm"),
    (77, "actor_rollout_ref.rollout.gpu_memory_utilization", "0.3"),
    (78, "actor_rollout_ref.rollout.n", "4"),
    (79, "actor_rollout_ref.rollout.enable_chunked_prefill", "False"),
    (80, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "2"),
    (81, "actor_rollout_ref.ref.fsdp_config.param_offload", "True"),
    (82, "actor_rollout_ref.rollout.calculate_log_probs", "True"),
    (83, "algorithm.rollout_correction.rollout_is", "sequence"),
    (84, "algorithm.rollout_correction.rollout_is_threshold", "2.0"),
    (85, "algorithm.rollout_correction.rollout_is_batch_normalize", "true"),
    (86, "algorithm.rollout_correction.rollout_rs", "null"),
    (87, "algorithm.rollout_correction.rollout_rs_threshold", "null"),
    (88, "algorithm.rollout_correction.rollout_rs_threshold_lower", "null"),
    (89, "algorithm.rollout_correction.rollout_token_veto_threshold", "null"),
    (90, "algorithm.rollout_correction.bypass_mode", "true"),
    (91, "algorithm.rollout_correction.use_policy_gradient", "true"),
    (92, "algorithm.use_kl_in_reward", "False"),
    (93, "trainer.critic_warmup", "0"),
    (94, "trainer.logger", "console"),
    (95, "trainer.project_name", "verl_grpo_example_gsm8k"),
    (96, "trainer.experiment_name", "qwen2_5_7b_function_rm"),
    (97, "trainer.n_gpus_per_node", "8"),
    (98, "trainer.nnodes", "1"),
    (99, "trainer.save_freq", "-1"),
    (100, "trainer.test_freq", "-1"),
    (101, "trainer.total_epochs", "1"),
    (102, "trainer.device", "npu"),
)
RECIPE_ENV = {"HCCL_CONNECT_TIMEOUT": "3000", "FLASHRL_LOGGING_LEVEL": "DEBUG", "FLASHRL_LMHEAD_FP32": "1",
              "VERL_LOGGING_LEVEL": "DEBUG", "VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_CONFIGURE_LOGGING": "1"}
# What rollout8 sets itself, not the spec (render): the sync rollout FlashRL needs; the recipe keeps verl's default.
RENDER_OWNED = {"actor_rollout_ref.rollout.mode": "sync"}


def explained(text: str, key: str) -> bool:
    """The spec's line for key carries a comment, or the comment line(s) right above it do; a key the spec leaves
    unset on purpose (render derives it: trainer.save_freq) is explained by a comment line that starts with it,
    `# key: why`."""
    lines = [line.strip() for line in text.splitlines()]
    at = next((i for i, line in enumerate(lines) if line.startswith(f"{key}:")), None)
    if at is None:
        return any(line.startswith("#") and line.lstrip("# ").startswith(f"{key}:") for line in lines)
    return "#" in lines[at] or (at > 0 and lines[at - 1].startswith("#"))


def same(a, b) -> bool:
    a, b = verl_keys.as_hydra_reads(a), verl_keys.as_hydra_reads(b)
    return a == b or isinstance(a, (int, float)) and isinstance(b, (int, float)) and float(a) == float(b)


@pytest.mark.parametrize("name", SPECS)
def test_every_recipe_value_is_the_specs_or_its_difference_is_explained(name):
    path = RUNS / name
    text = path.read_text()
    rendered = render(load_spec(path))
    unexplained = []
    for line, key, value in RECIPE:
        mine = effective(rendered, key)
        if not same(mine, value) and not (key in text and explained(text, key)):
            unexplained.append(f"recipe line {line}: {key}={value}, the spec renders {mine!r}")
    assert unexplained == [], "\n".join(unexplained)


@pytest.mark.parametrize("name", SPECS)
def test_every_key_the_spec_adds_is_explained(name):
    path = RUNS / name
    text = path.read_text()
    recipe = {key for _, key, _ in RECIPE}
    rendered = render(load_spec(path))
    for override in rendered.overrides:
        if override.key in recipe or override.key in rendered.derived_keys and override.key not in load_spec(path).verl:
            continue
        if override.key in RENDER_OWNED:
            assert override.value == RENDER_OWNED[override.key]
            continue
        assert override.key in text and explained(text, override.key), f"{override.key}: not in the recipe, unexplained"


@pytest.mark.parametrize("name", SPECS)
def test_the_recipe_environment_or_why_not(name):
    path = RUNS / name
    text = path.read_text()
    rendered = render(load_spec(path))
    for key, value in RECIPE_ENV.items():
        mine = rendered.env.get(key)
        if key.startswith("FLASHRL_") and not load_spec(path).flashrl:
            assert mine is None, key  # the bf16 baseline runs no FlashRL
        elif mine != value:
            assert key in text, f"{key}={value} in the recipe, {mine!r} here, and the spec does not say why"


@pytest.mark.parametrize("name", SPECS)
def test_the_gsm8k_specs_checkpoint_unlike_the_recipe_and_say_why(name):
    """The recipe saves nothing (trainer.save_freq=-1); the shipped specs leave the key to render, which derives a
    checkpoint every 20 steps (no total_training_steps) and keeps 2, and a comment line names the key and why."""
    path = RUNS / name
    spec, text = load_spec(path), path.read_text()
    assert "trainer.save_freq" not in spec.verl
    rendered = render(spec)
    assert effective(rendered, "trainer.save_freq") == 20 and effective(rendered, "trainer.max_actor_ckpt_to_keep") == 2
    assert explained(text, "trainer.save_freq") and "resumable" in text
    assert not explained("verl:\n  trainer.test_freq: -1\n", "trainer.save_freq")  # not named: not explained


def test_the_int8_spec_runs_the_recipes_algorithm():
    """The rollout-correction bypass mode with the policy-gradient loss, batch-normalized sequence IS weights: not
    PPO clipping on top of plain TIS (what the spec ran before it followed the recipe)."""
    rendered = render(load_spec(RUNS / SPECS[0]))
    got = {key: effective(rendered, f"algorithm.rollout_correction.{key}") for key in
           ("bypass_mode", "use_policy_gradient", "rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize")}
    assert got == {"bypass_mode": True, "use_policy_gradient": True, "rollout_is": "sequence",
                   "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": True}
