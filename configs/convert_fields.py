"""Every field of the foreign configs ``convert`` reads, and what becomes of each (verl's in
``convert_verl_fields``).

One entry per field of TRL 1.16's ``GRPOConfig``, ``SFTConfig`` and ``DPOConfig`` (their
``transformers.TrainingArguments`` fields included) and of verl v0.7.0's ``ppo_trainer.yaml``
(``tests/data/verl_v0.7.0_ppo_trainer_keys.txt``): *mapped* (to which key), *approximated* (the
formula), *refused* (why, and what streamrl does instead) or *code reference*. verl subtrees that
belong to parts GRPO on streamrl has no use for (the critic, reward models, profilers) are one
entry by prefix. The converter takes its refusals and its plain mappings from here, and
``docs/migrating.md``'s tables are written from here (``convert_doc``), so the three agree.
"""

from __future__ import annotations

from streamrl.configs.convert_types import Entry, refused
from streamrl.configs.convert_verl_fields import VERL, VERL_PREFIXES

_STEP = "learner.groups_per_step, learner.minibatches"
_INTERNALS = "HF Trainer internals; streamrl's learner has its own (docs/sft_dpo.md, learner.*)"

# transformers.TrainingArguments: what GRPO, SFT and DPO share (SFT/DPO differ in _SUPERVISED)
TRAINING_ARGUMENTS: dict[str, Entry] = {
    "output_dir": Entry("mapped", "run.dir"),
    "run_name": Entry("mapped", "run.name", "also the Redis key prefix"),
    "seed": Entry("mapped", "run.seed"),
    "max_steps": Entry("mapped", "run.max_steps", "-1 (train num_train_epochs) is refused"),
    "num_train_epochs": Entry(
        "refused",
        "",
        "a streaming learner counts steps, and a decaying LR needs its horizon before the "
        "dataset is read: set run.max_steps = epochs x rows / learner.groups_per_step",
    ),
    "learning_rate": Entry("mapped", "learner.lr"),
    "lr_scheduler_type": Entry(
        "mapped",
        "learner.lr_scheduler, run.max_steps",
        "linear, cosine, constant, constant_with_warmup; linear and cosine with the file's "
        "max_steps (or the base's run.max_steps); other schedules are refused",
    ),
    "lr_scheduler_kwargs": Entry(
        "mapped", "-", "empty only: streamrl's schedules take no arguments", ({},)
    ),
    "warmup_steps": Entry(
        "approximated",
        "learner.warmup_steps",
        "an int: x learner.minibatches x learner.updates_per_batch (the optimizer steps of a "
        "learner step); a float < 1, a ratio: ceil(ratio x run.max_steps x learner.minibatches "
        "x learner.updates_per_batch)",
    ),
    "weight_decay": Entry("mapped", "learner.weight_decay"),
    "adam_beta1": Entry("mapped", "learner.betas", "with adam_beta2"),
    "adam_beta2": Entry("mapped", "learner.betas", "with adam_beta1"),
    "adam_epsilon": Entry("mapped", "-", "1e-8 only: streamrl's AdamW keeps torch's eps", (1e-8,)),
    "optim": Entry(
        "mapped",
        "-",
        "adamw_torch, adamw_torch_fused only: the learner's optimizer is AdamW",
        ("adamw_torch", "adamw_torch_fused"),
    ),
    "max_grad_norm": Entry("mapped", "learner.grad_clip"),
    "per_device_train_batch_size": Entry(
        "approximated",
        "learner.groups_per_step",
        "per_device_train_batch_size x gradient_accumulation_steps / num_generations groups, "
        "one process",
    ),
    "gradient_accumulation_steps": Entry(
        "approximated", "learner.groups_per_step", "with per_device_train_batch_size"
    ),
    "gradient_checkpointing": Entry("mapped", "learner.gradient_checkpointing"),
    "bf16": Entry("mapped", "model.dtype", "true: bfloat16; false: float32"),
    "fp16": Entry("mapped", "model.dtype", "true: float16; false: streamrl's default"),
    "save_steps": Entry("mapped", "learner.checkpoint_every", "also one at shutdown"),
    "save_strategy": Entry(
        "mapped",
        "-",
        "steps only (save_steps); a checkpoint is always written at shutdown",
        ("steps",),
    ),
    "report_to": Entry("mapped", "run.report_to", "tensorboard, wandb, trackio; all: tensorboard"),
    "resume_from_checkpoint": Entry(
        "mapped",
        "-",
        "true only: the default (a checkpoint in run.dir is resumed); a path: set run.dir to "
        "that run; false: streamrl run --overwrite",
        (True,),
    ),
    "eval_steps": Entry(
        "approximated", "data.eval_every", "every N policy versions (one per learner step)"
    ),
    "logging_steps": Entry(
        "refused", "", "every learner step is logged (learner_steps.jsonl, run.report_to)"
    ),
    "project": Entry(
        "refused", "", "the tracker's project comes from its environment (WANDB_PROJECT)"
    ),
    "use_cpu": Entry(
        "refused",
        "",
        "where the learner runs is learner.gpus and DS_ACCELERATOR; actors: actor.device",
    ),
    **refused(
        "push_to_hub hub_model_id hub_strategy hub_token hub_private_repo hub_always_push "
        "hub_revision",
        "streamrl uploads nothing: the policy is exported to <run.dir>/policy",
    ),
    **refused(
        "do_train do_eval do_predict eval_strategy eval_delay eval_on_start "
        "per_device_eval_batch_size eval_accumulation_steps eval_do_concat_batches "
        "eval_use_gather_object batch_eval_metrics prediction_loss_only include_for_metrics "
        "bf16_full_eval fp16_full_eval load_best_model_at_end metric_for_best_model "
        "greater_is_better",
        "evaluation is data.eval_path, every data.eval_every versions, on the actors",
    ),
    **refused(
        "dataloader_drop_last dataloader_num_workers dataloader_prefetch_factor "
        "dataloader_pin_memory dataloader_persistent_workers dataloader_in_order "
        "dataloader_multiprocessing_context remove_unused_columns label_names "
        "length_column_name train_sampling_strategy data_seed ignore_data_skip",
        "no torch DataLoader: the actors read data.path (GRPO), the learner supervised.path",
    ),
    **refused(
        "local_rank ddp_backend ddp_timeout ddp_find_unused_parameters ddp_bucket_cap_mb "
        "ddp_broadcast_buffers ddp_static_graph fsdp fsdp_config deepspeed parallelism_config "
        "accelerator_config save_on_each_node log_on_each_node average_tokens_across_devices",
        "the learner is DeepSpeed ZeRO: learner.ranks, learner.zero_stage, "
        "learner.offload_optimizer",
    ),
    **refused(
        "logging_strategy logging_first_step logging_nan_inf_filter log_level "
        "log_level_replica disable_tqdm skip_memory_metrics include_num_input_tokens_seen "
        "trackio_space_id trackio_bucket_id trackio_static_space_id",
        "every learner step is logged (learner_steps.jsonl, run.report_to, the live view)",
    ),
    **refused(
        "tf32 torch_compile torch_compile_backend torch_compile_mode use_liger_kernel "
        "liger_kernel_config gradient_checkpointing_kwargs activation_checkpointing "
        "activation_checkpointing_kwargs enable_jit_checkpoint torch_empty_cache_steps "
        "use_cache full_determinism debug auto_find_batch_size optim_args "
        "optim_target_modules restore_callback_states_from_checkpoint save_only_model "
        "save_total_limit",
        _INTERNALS,
    ),
    **refused("neftune_noise_alpha label_smoothing_factor", "not implemented"),
    # older transformers (< 5): TrainingArguments had it; still in many TRL files
    "warmup_ratio": Entry(
        "approximated",
        "learner.warmup_steps",
        "ceil(warmup_ratio x run.max_steps x learner.minibatches x learner.updates_per_batch)",
    ),
}

# the model fields TRL's three configs share
_MODEL: dict[str, Entry] = {
    "model_init_kwargs": Entry(
        "mapped", "model.init_kwargs", "dtype, torch_dtype, device_map, revision refused"
    ),
    "trust_remote_code": Entry(
        "code reference", "model.init_kwargs.trust_remote_code", "true: held back for review"
    ),
    **refused("router_aux_loss_coef", "mixture-of-experts aux loss: not implemented"),
    "disable_dropout": Entry(
        "mapped", "-", "false only: the policy trains with its model config's dropout", (False,)
    ),
}

GRPO: dict[str, Entry] = {
    **TRAINING_ARGUMENTS,
    **_MODEL,
    "num_generations": Entry("mapped", "rollout.group_size"),
    "max_completion_length": Entry("mapped", "rollout.max_new_tokens"),
    "max_prompt_length": Entry("mapped", "rollout.max_prompt_tokens", "older TRL; refused over"),
    "temperature": Entry("mapped", "rollout.temperature"),
    "top_p": Entry("mapped", "rollout.top_p"),
    "top_k": Entry("mapped", "rollout.top_k", "0 = off"),
    "chat_template_kwargs": Entry("mapped", "rollout.chat_template_kwargs"),
    "generation_kwargs": Entry("mapped", "rollout.stop", "stop only; other keys refused"),
    "num_iterations": Entry("mapped", "learner.updates_per_batch"),
    "beta": Entry("mapped", "algo.kl_coef", "the k3 estimator, as TRL"),
    "epsilon": Entry("mapped", "algo.clip_low, algo.clip_high", "clip_high too unless set"),
    "epsilon_high": Entry("mapped", "algo.clip_high"),
    "importance_sampling_level": Entry("mapped", "algo.importance_sampling_level"),
    "reward_weights": Entry(
        "mapped",
        "reward.functions[i].weight",
        "with reward_funcs, or onto the base's functions; counts must match",
    ),
    "reward_funcs": Entry(
        "code reference", "reward.functions", "built-ins pass; pkg.mod.fn is held back for review"
    ),
    "scale_rewards": Entry("mapped", "algo.advantage", "group: grpo; none: drgrpo"),
    "loss_type": Entry(
        "mapped", "algo.aggregation", "grpo: seq_mean; dapo/bnpo: token_mean; dr_grpo: constant"
    ),
    "entropy_coef": Entry("mapped", "algo.entropy_coef"),
    "vllm_importance_sampling_correction": Entry("mapped", "algo.importance_correction"),
    "vllm_importance_sampling_cap": Entry("mapped", "algo.rho_max"),
    "use_vllm": Entry("mapped", "actor.engine", "true: vllm; false: hf"),
    "vllm_gpu_memory_utilization": Entry("mapped", "actor.vllm.gpu_memory_utilization"),
    "vllm_tensor_parallel_size": Entry("mapped", "actor.vllm.tensor_parallel_size"),
    "log_completions": Entry("mapped", "run.log_samples_every", "every logging_steps steps"),
    "num_completions_to_print": Entry("mapped", "run.log_samples"),
    "shuffle_dataset": Entry(
        "mapped", "-", "true only: the actors draw prompts in random order", (True,)
    ),
    "generation_batch_size": Entry("refused", "", f"a step is a number of groups: {_STEP}"),
    "steps_per_generation": Entry("refused", "", f"a step is a number of groups: {_STEP}"),
    "num_generations_eval": Entry("refused", "", "evaluation samples rollout.group_size"),
    "min_p": Entry("refused", "", "not supported by the actors' sampling: top_p, top_k"),
    "repetition_penalty": Entry("refused", "", "not supported by the actors' sampling"),
    "mask_truncated_completions": Entry(
        "refused", "", "not supported: a truncated completion trains with its reward"
    ),
    "top_entropy_quantile": Entry("refused", "", "not supported: every token trains"),
    **refused(
        "sync_ref_model ref_model_mixup_alpha ref_model_sync_steps",
        "the reference model is the initial policy, never synced",
    ),
    **refused(
        "delta sapo_temperature_neg sapo_temperature_pos vespo_k_pos vespo_lambda_pos "
        "vespo_k_neg vespo_lambda_neg use_adaptive_entropy entropy_coef_min entropy_coef_max "
        "entropy_coef_delta entropy_target multi_objective_aggregation use_bias_correction_kl "
        "off_policy_mask_threshold",
        "a loss variant not implemented: the loss is README's (algo.*)",
    ),
    **refused(
        "vllm_importance_sampling_mode vllm_importance_sampling_clip_max "
        "vllm_importance_sampling_clip_min",
        "one correction: the token weight truncated at algo.rho_max",
    ),
    **refused(
        "vllm_mode vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout "
        "vllm_group_port vllm_enable_sleep_mode",
        "actors are always separate processes (TRL's server mode), started by streamrl run",
    ),
    **refused(
        "vllm_model_impl vllm_max_model_length vllm_structured_outputs_regex "
        "cache_implementation use_transformers_continuous_batching "
        "transformers_continuous_batching_config use_transformers_paged "
        "ds3_gather_for_generation cast_lm_head_to_fp32 pad_to_multiple_of",
        "the engines' own settings: actor.vllm.*, actor.hf.*",
    ),
    **refused(
        "log_multimodal log_unique_prompts log_completions_hub_repo",
        "samples are logged as run.log_samples rows every run.log_samples_every steps",
    ),
    **refused("max_tool_calling_iterations", "tools run as environments: env.max_turns"),
}

# SFT and DPO train on the learner from supervised.path (docs/sft_dpo.md)
_SUPERVISED: dict[str, Entry] = {
    **TRAINING_ARGUMENTS,
    **_MODEL,
    "num_train_epochs": Entry("approximated", "supervised.epochs", "rounded up to a whole pass"),
    "per_device_train_batch_size": Entry(
        "approximated",
        "supervised.batch_size",
        "per_device_train_batch_size x gradient_accumulation_steps, one process",
    ),
    "gradient_accumulation_steps": Entry(
        "approximated", "supervised.batch_size", "with per_device_train_batch_size"
    ),
    "eval_steps": Entry("refused", "", "streamrl sft/dpo do not evaluate"),
    "warmup_steps": Entry(
        "approximated",
        "learner.warmup_steps",
        "an int: the same steps (an SFT/DPO step is one optimizer step); a float < 1, a ratio: "
        "ceil(ratio x run.max_steps)",
    ),
    "warmup_ratio": Entry(
        "approximated", "learner.warmup_steps", "ceil(warmup_ratio x run.max_steps)"
    ),
    "max_length": Entry("mapped", "supervised.max_length", "longer rows are cut from the right"),
    "shuffle_dataset": Entry("mapped", "supervised.shuffle"),
    "truncation_mode": Entry(
        "mapped", "-", "keep_start only (cut from the right)", ("keep_start",)
    ),
    **refused(
        "dataset_num_proc pad_token padding_free activation_offloading",
        "the learner packs rows without padding, in one process",
    ),
}

SFT: dict[str, Entry] = {
    **_SUPERVISED,
    "packing": Entry(
        "mapped", "-", "true only: the learner always packs (per-row position ids)", (True,)
    ),
    "packing_strategy": Entry("mapped", "-", "bfd only: packed by length", ("bfd",)),
    "eval_packing": Entry("refused", "", "streamrl sft does not evaluate"),
    "completion_only_loss": Entry(
        "mapped", "-", "true only: prompt-completion rows train the completion", (True,)
    ),
    "assistant_only_loss": Entry(
        "mapped", "-", "true only: messages rows train the assistant turns", (True,)
    ),
    "loss_type": Entry("mapped", "-", "nll only: the loss is the token mean NLL", ("nll",)),
    **refused(
        "dataset_text_field dataset_kwargs eos_token chat_template_path pad_to_multiple_of",
        "rows are read as docs/sft_dpo.md says (text, messages, prompt/completion), with the "
        "model's tokenizer and chat template",
    ),
}

DPO: dict[str, Entry] = {
    **_SUPERVISED,
    "beta": Entry("mapped", "supervised.beta"),
    "loss_type": Entry("mapped", "supervised.loss", "sigmoid or ipo (a list of one)"),
    **refused(
        "sync_ref_model ref_model_mixup_alpha ref_model_sync_steps precompute_ref_log_probs "
        "precompute_ref_batch_size",
        "the reference is the initial policy, scored in each step",
    ),
    **refused(
        "loss_weights ld_alpha f_divergence_type f_alpha_divergence_coef label_smoothing "
        "use_weighting discopop_tau",
        "a DPO variant not implemented: supervised.loss is sigmoid or ipo",
    ),
    **refused("pad_to_multiple_of", "the learner packs rows without padding"),
}

CATALOGUES: dict[str, dict[str, Entry]] = {
    "trl": GRPO,
    "trl-sft": SFT,
    "trl-dpo": DPO,
    "verl": VERL,
}


def entry(dialect: str, path: str) -> Entry | None:
    """The catalogue's entry for ``path`` (a verl path also by its subtree), or None."""
    found = CATALOGUES[dialect].get(path)
    if found is None and dialect == "verl":
        found = next((e for p, e in VERL_PREFIXES.items() if path.startswith(p)), None)
    return found
