#!/usr/bin/env bash
# GRPO on Qwen3-4B-Instruct-2507 through every append-only harness configuration, one node of
# 8 GPUs: 16 tasks x 8 rollouts per step, clip 0.20 / 0.28, no KL, 300 steps, K=2 pairing.
# Run from the repository root in an environment with `pip install -e '.[verl]'` and vLLM.
set -euo pipefail
DATA=${DATA:-data/harnessrl-verl}
MODEL=${MODEL:-Qwen/Qwen3-4B-Instruct-2507}
python examples/verl/make_dataset.py "$DATA"

python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  algorithm.use_kl_in_reward=False \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/val.parquet" \
  data.train_batch_size=16 \
  data.shuffle=False \
  data.filter_overlong_prompts=False \
  data.max_prompt_length=4096 \
  data.max_response_length=28672 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 \
  actor_rollout_ref.actor.use_kl_loss=False \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.actor.clip_ratio_low=0.20 \
  actor_rollout_ref.actor.clip_ratio_high=0.28 \
  actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.use_dynamic_bsz=True \
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768 \
  actor_rollout_ref.actor.fsdp_config.param_offload=False \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.rollout.prompt_length=4096 \
  actor_rollout_ref.rollout.response_length=28672 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.agent.num_workers=8 \
  actor_rollout_ref.rollout.agent.agent_loop_config_path=examples/verl/agent_loops.yaml \
  actor_rollout_ref.rollout.val_kwargs.temperature=0 \
  trainer.n_gpus_per_node=8 \
  trainer.nnodes=1 \
  trainer.total_training_steps=300 \
  trainer.save_freq=50 \
  trainer.test_freq=50 \
  trainer.project_name=harnessrl \
  trainer.experiment_name=qwen3-4b-grpo-k2 \
  trainer.logger='[console]' \
  "$@"
