#!/usr/bin/env bash
# rollout8 render: launch run tiny-cpu on the Ray head (generated; re-render, do not edit).
# Extra hydra overrides given to this script are appended.
set -euo pipefail
export FLASHRL_CONFIG=/var/lib/rollout8/runs/tiny-cpu/flashrl.yaml
export FLASHRL_LOGGING_LEVEL=DEBUG
export FLASHRL_LMHEAD_FP32=0
export VLLM_USE_V1=1
export HF_HUB_OFFLINE=1
export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1
export GLOO_SOCKET_IFNAME=data0
export TP_SOCKET_IFNAME=data0
exec python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files=/mnt/rollout8-models/tiny-cpu/data/train.parquet \
  data.val_files=/mnt/rollout8-models/tiny-cpu/data/val.parquet \
  actor_rollout_ref.model.path=/mnt/rollout8-models/tiny-cpu/tiny/bf16 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.mode=sync \
  actor_rollout_ref.rollout.calculate_log_probs=true \
  algorithm.rollout_correction.rollout_is=sequence \
  algorithm.rollout_correction.rollout_is_threshold=2.0 \
  custom_reward_function.path=/mnt/rollout8-models/tiny-cpu/data/reward.py \
  custom_reward_function.name=compute_score \
  trainer.default_local_dir=/mnt/rollout8-shared/tiny-cpu/<KEY>/checkpoints \
  trainer.resume_mode=auto \
  trainer.max_actor_ckpt_to_keep=2 \
  trainer.device=cpu \
  trainer.nnodes=3 \
  trainer.n_gpus_per_node=1 \
  '+ray_kwargs.ray_init.runtime_env.env_vars.FLASHRL_CONFIG='"'"'/var/lib/rollout8/runs/tiny-cpu/flashrl.yaml'"'"'' \
  '+ray_kwargs.ray_init.runtime_env.env_vars.FLASHRL_LOGGING_LEVEL='"'"'DEBUG'"'"'' \
  '+ray_kwargs.ray_init.runtime_env.env_vars.FLASHRL_LMHEAD_FP32='"'"'0'"'"'' \
  '+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_USE_V1='"'"'1'"'"'' \
  '+ray_kwargs.ray_init.runtime_env.env_vars.HF_HUB_OFFLINE='"'"'1'"'"'' \
  +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rollout8_cpu_bridges.install \
  data.train_batch_size=6 \
  data.val_batch_size=6 \
  data.max_prompt_length=192 \
  data.max_response_length=32 \
  actor_rollout_ref.actor.ppo_mini_batch_size=6 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.actor.optim.lr=0.001 \
  actor_rollout_ref.actor.fsdp_config.model_dtype=bf16 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.n=2 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
  actor_rollout_ref.rollout.enforce_eager=true \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 \
  'trainer.logger=[console]' \
  trainer.project_name=rollout8 \
  trainer.experiment_name=tiny-cpu \
  trainer.total_training_steps=3 \
  trainer.save_freq=3 \
  trainer.test_freq=-1 \
  trainer.val_before_train=false \
  "$@"
