"""TRL's and verl's names for streamrl's settings, for the "unknown key" hint of the loader.

A key a TRL ``GRPOConfig`` or a verl config spells differently (``num_generations``,
``beta``, ``actor_rollout_ref.rollout.n``, ...) fails with an unknown-key error that names
streamrl's key. ``docs/migrating.md`` is the whole mapping, field by field, with where the
meaning differs; tests check the two agree and that every target is a key of the schema.
"""

from __future__ import annotations

# the last part of a foreign key -> (whose name, streamrl's key)
FOREIGN: dict[str, tuple[str, str]] = {
    "num_generations": ("TRL", "rollout.group_size"),
    "max_completion_length": ("TRL", "rollout.max_new_tokens"),
    "max_response_length": ("verl", "rollout.max_new_tokens"),
    "max_prompt_length": ("TRL and verl", "rollout.max_prompt_tokens"),
    "learning_rate": ("TRL", "learner.lr"),
    "beta": ("TRL", "algo.kl_coef"),
    "kl_loss_coef": ("verl", "algo.kl_coef"),
    "epsilon": ("TRL", "algo.clip_low"),
    "epsilon_high": ("TRL", "algo.clip_high"),
    "clip_ratio_low": ("verl", "algo.clip_low"),
    "clip_ratio_high": ("verl", "algo.clip_high"),
    "vllm_importance_sampling_cap": ("TRL", "algo.rho_max"),
    "vllm_importance_sampling_correction": ("TRL", "algo.importance_correction"),
    "num_iterations": ("TRL", "learner.updates_per_batch"),
    "ppo_epochs": ("verl", "learner.updates_per_batch"),
    "max_grad_norm": ("TRL", "learner.grad_clip"),
    "train_batch_size": ("verl", "learner.groups_per_step"),
    "loss_type": ("TRL", "algo.aggregation"),
    "importance_sampling_level": ("TRL", "algo.importance_sampling_level"),
    "loss_mode": ("verl", "algo.importance_sampling_level"),
    "lr_scheduler_type": ("TRL and verl", "learner.lr_scheduler"),
    "warmup_style": ("verl", "learner.lr_scheduler"),
    "chat_template_kwargs": ("TRL", "rollout.chat_template_kwargs"),
    "apply_chat_template_kwargs": ("verl", "rollout.chat_template_kwargs"),
    "model_init_kwargs": ("TRL", "model.init_kwargs"),
    "loss_agg_mode": ("verl", "algo.aggregation"),
    "scale_rewards": ("TRL", "algo.advantage"),
    "adv_estimator": ("verl", "algo.advantage"),
    "entropy_coeff": ("verl", "algo.entropy_coef"),
    "reward_weights": ("TRL", "reward.functions.<i>.weight"),
    "reward_funcs": ("TRL", "reward.functions"),
    "vllm_gpu_memory_utilization": ("TRL", "actor.vllm.gpu_memory_utilization"),
    "vllm_tensor_parallel_size": ("TRL", "actor.vllm.tensor_parallel_size"),
    "use_vllm": ("TRL", "actor.engine"),
    "output_dir": ("TRL", "run.dir"),
    "default_local_dir": ("verl", "run.dir"),
    "run_name": ("TRL", "run.name"),
    "experiment_name": ("verl", "run.name"),
    "total_training_steps": ("verl", "run.max_steps"),
    "logger": ("verl", "run.report_to"),
    "save_steps": ("TRL", "learner.checkpoint_every"),
    "save_freq": ("verl", "learner.checkpoint_every"),
    "log_completions": ("TRL", "run.log_samples_every"),
    "num_completions_to_print": ("TRL", "run.log_samples"),
    "model_name_or_path": ("TRL", "model.path"),
    "train_files": ("verl", "data.path"),
    "val_files": ("verl", "data.eval_path"),
}


def hint(key: str) -> str:
    """``"; beta is TRL's name: streamrl's is algo.kl_coef (docs/migrating.md)"``, or ""."""
    if key not in FOREIGN:
        return ""
    who, ours = FOREIGN[key]
    return f"; {key} is {who}'s name: streamrl's is {ours} (docs/migrating.md)"
