#!/usr/bin/env bash
# rollout8 render: launch run qwen2.5-7b-int8-dapo on the Ray head (generated; re-render, do not edit).
# Extra hydra overrides given to this script are appended.
set -euo pipefail
export FLASHRL_CONFIG=/var/lib/rollout8/runs/qwen2.5-7b-int8-dapo/flashrl.yaml
export FLASHRL_LOGGING_LEVEL=DEBUG
export FLASHRL_LMHEAD_FP32=0
export VLLM_USE_V1=1
export HF_HUB_OFFLINE=1
export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1
export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True
export HCCL_CONNECT_TIMEOUT=3000
exec python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files=/var/lib/rollout8/runs/qwen2.5-7b-int8-dapo/data/train.parquet \
  data.val_files=/var/lib/rollout8/runs/qwen2.5-7b-int8-dapo/data/val.parquet \
  actor_rollout_ref.model.path=/var/lib/rollout8/runs/qwen2.5-7b-int8-dapo/models/bf16 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.mode=sync \
  actor_rollout_ref.rollout.calculate_log_probs=true \
  algorithm.rollout_correction.rollout_is=sequence \
  algorithm.rollout_correction.rollout_is_threshold=2.0 \
  trainer.save_freq=5 \
  trainer.max_actor_ckpt_to_keep=2 \
  trainer.device=npu \
  trainer.nnodes=1 \
  trainer.n_gpus_per_node=8 \
  '+ray_kwargs.ray_init.runtime_env.env_vars.FLASHRL_CONFIG='"'"'/var/lib/rollout8/runs/qwen2.5-7b-int8-dapo/flashrl.yaml'"'"'' \
  '+ray_kwargs.ray_init.runtime_env.env_vars.FLASHRL_LOGGING_LEVEL='"'"'DEBUG'"'"'' \
  '+ray_kwargs.ray_init.runtime_env.env_vars.FLASHRL_LMHEAD_FP32='"'"'0'"'"'' \
  '+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_USE_V1='"'"'1'"'"'' \
  '+ray_kwargs.ray_init.runtime_env.env_vars.HF_HUB_OFFLINE='"'"'1'"'"'' \
  data.train_batch_size=16 \
  data.max_prompt_length=2048 \
  data.max_response_length=10240 \
  data.filter_overlong_prompts=true \
  data.truncation=left \
  actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-06 \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.actor.use_kl_loss=false \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
  actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.enforce_eager=true \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 \
  algorithm.use_kl_in_reward=false \
  'trainer.logger=[console]' \
  trainer.project_name=rollout8 \
  trainer.experiment_name=qwen2.5-7b-int8-dapo \
  trainer.total_training_steps=50 \
  trainer.test_freq=-1 \
  trainer.val_before_train=false \
  "$@"
