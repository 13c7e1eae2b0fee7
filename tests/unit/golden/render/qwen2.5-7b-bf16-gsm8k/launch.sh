#!/usr/bin/env bash
# rollout8 render: launch run qwen2.5-7b-bf16-gsm8k on the Ray head (generated; re-render, do not edit).
# Extra hydra overrides given to this script are appended.
set -euo pipefail
export VLLM_USE_V1=1
export HF_HUB_OFFLINE=1
export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1
export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True
export HCCL_CONNECT_TIMEOUT=3000
exec python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files=/var/lib/rollout8/runs/qwen2.5-7b-bf16-gsm8k/data/train.parquet \
  data.val_files=/var/lib/rollout8/runs/qwen2.5-7b-bf16-gsm8k/data/val.parquet \
  actor_rollout_ref.model.path=/var/lib/rollout8/runs/qwen2.5-7b-bf16-gsm8k/models/bf16 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.mode=sync \
  trainer.device=npu \
  trainer.nnodes=1 \
  trainer.n_gpus_per_node=8 \
  '+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_USE_V1='"'"'1'"'"'' \
  '+ray_kwargs.ray_init.runtime_env.env_vars.HF_HUB_OFFLINE='"'"'1'"'"'' \
  data.train_batch_size=16 \
  data.max_prompt_length=2048 \
  data.max_response_length=10240 \
  data.filter_overlong_prompts=true \
  data.truncation=error \
  actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-06 \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.actor.use_kl_loss=true \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
  actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.enforce_eager=true \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.rollout.calculate_log_probs=true \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 \
  algorithm.rollout_correction.rollout_is=sequence \
  algorithm.rollout_correction.rollout_is_threshold=2.0 \
  algorithm.use_kl_in_reward=false \
  'trainer.logger=[console]' \
  trainer.project_name=rollout8 \
  trainer.experiment_name=qwen2.5-7b-bf16-gsm8k \
  trainer.total_epochs=15 \
  trainer.save_freq=-1 \
  trainer.test_freq=5 \
  "$@"
