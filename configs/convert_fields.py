"""Every field of the foreign configs ``convert`` reads, and what becomes of each.

One entry per field of TRL 1.16's ``GRPOConfig``, ``SFTConfig`` and ``DPOConfig`` (their
``transformers.TrainingArguments`` fields included) and of verl v0.7.0's ``ppo_trainer.yaml``
(``tests/data/verl_v0.7.0_ppo_trainer_keys.txt``): *mapped* (to which key), *approximated* (the
formula), *refused* (why, and what streamrl does instead) or *code reference*. verl subtrees that
belong to parts GRPO on streamrl has no use for (the critic, reward models, profilers) are one
entry by prefix. The converter takes its refusals and its plain mappings from here, and
``docs/migrating.md``'s tables are written from here (``convert_doc``), so the three agree.
"""

from __future__ import annotations

from typing import NamedTuple

from streamrl.configs.convert_rules import Status


class Entry(NamedTuple):
    status: Status
    # one schema key when the field has no rule in convert_rules.RULES; else what the rule sets
    target: str
    note: str = ""
    # target "-" (nothing to set): the values that mean streamrl's behaviour; others are refused
    only: tuple = ()


def _all(names: str, status: Status, target: str, note: str = "") -> dict[str, Entry]:
    """One entry for each whitespace-separated name: a group refused (or mapped) for one reason."""
    return {n: Entry(status, target, note) for n in names.split()}


def _refused(names: str, why: str) -> dict[str, Entry]:
    return _all(names, "refused", "", why)


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
    **_refused(
        "push_to_hub hub_model_id hub_strategy hub_token hub_private_repo hub_always_push "
        "hub_revision",
        "streamrl uploads nothing: the policy is exported to <run.dir>/policy",
    ),
    **_refused(
        "do_train do_eval do_predict eval_strategy eval_delay eval_on_start "
        "per_device_eval_batch_size eval_accumulation_steps eval_do_concat_batches "
        "eval_use_gather_object batch_eval_metrics prediction_loss_only include_for_metrics "
        "bf16_full_eval fp16_full_eval load_best_model_at_end metric_for_best_model "
        "greater_is_better",
        "evaluation is data.eval_path, every data.eval_every versions, on the actors",
    ),
    **_refused(
        "dataloader_drop_last dataloader_num_workers dataloader_prefetch_factor "
        "dataloader_pin_memory dataloader_persistent_workers dataloader_in_order "
        "dataloader_multiprocessing_context remove_unused_columns label_names "
        "length_column_name train_sampling_strategy data_seed ignore_data_skip",
        "no torch DataLoader: the actors read data.path (GRPO), the learner supervised.path",
    ),
    **_refused(
        "local_rank ddp_backend ddp_timeout ddp_find_unused_parameters ddp_bucket_cap_mb "
        "ddp_broadcast_buffers ddp_static_graph fsdp fsdp_config deepspeed parallelism_config "
        "accelerator_config save_on_each_node log_on_each_node average_tokens_across_devices",
        "the learner is DeepSpeed ZeRO: learner.ranks, learner.zero_stage, "
        "learner.offload_optimizer",
    ),
    **_refused(
        "logging_strategy logging_first_step logging_nan_inf_filter log_level "
        "log_level_replica disable_tqdm skip_memory_metrics include_num_input_tokens_seen "
        "trackio_space_id trackio_bucket_id trackio_static_space_id",
        "every learner step is logged (learner_steps.jsonl, run.report_to, the live view)",
    ),
    **_refused(
        "tf32 torch_compile torch_compile_backend torch_compile_mode use_liger_kernel "
        "liger_kernel_config gradient_checkpointing_kwargs activation_checkpointing "
        "activation_checkpointing_kwargs enable_jit_checkpoint torch_empty_cache_steps "
        "use_cache full_determinism debug auto_find_batch_size optim_args "
        "optim_target_modules restore_callback_states_from_checkpoint save_only_model "
        "save_total_limit",
        _INTERNALS,
    ),
    **_refused("neftune_noise_alpha label_smoothing_factor", "not implemented"),
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
    **_refused("router_aux_loss_coef", "mixture-of-experts aux loss: not implemented"),
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
    **_refused(
        "sync_ref_model ref_model_mixup_alpha ref_model_sync_steps",
        "the reference model is the initial policy, never synced",
    ),
    **_refused(
        "delta sapo_temperature_neg sapo_temperature_pos vespo_k_pos vespo_lambda_pos "
        "vespo_k_neg vespo_lambda_neg use_adaptive_entropy entropy_coef_min entropy_coef_max "
        "entropy_coef_delta entropy_target multi_objective_aggregation use_bias_correction_kl "
        "off_policy_mask_threshold",
        "a loss variant not implemented: the loss is README's (algo.*)",
    ),
    **_refused(
        "vllm_importance_sampling_mode vllm_importance_sampling_clip_max "
        "vllm_importance_sampling_clip_min",
        "one correction: the token weight truncated at algo.rho_max",
    ),
    **_refused(
        "vllm_mode vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout "
        "vllm_group_port vllm_enable_sleep_mode",
        "actors are always separate processes (TRL's server mode), started by streamrl run",
    ),
    **_refused(
        "vllm_model_impl vllm_max_model_length vllm_structured_outputs_regex "
        "cache_implementation use_transformers_continuous_batching "
        "transformers_continuous_batching_config use_transformers_paged "
        "ds3_gather_for_generation cast_lm_head_to_fp32 pad_to_multiple_of",
        "the engines' own settings: actor.vllm.*, actor.hf.*",
    ),
    **_refused(
        "log_multimodal log_unique_prompts log_completions_hub_repo",
        "samples are logged as run.log_samples rows every run.log_samples_every steps",
    ),
    **_refused("max_tool_calling_iterations", "tools run as environments: env.max_turns"),
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
    "max_length": Entry("mapped", "supervised.max_length", "longer rows are cut from the right"),
    "shuffle_dataset": Entry("mapped", "supervised.shuffle"),
    "truncation_mode": Entry(
        "mapped", "-", "keep_start only (cut from the right)", ("keep_start",)
    ),
    **_refused(
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
    **_refused(
        "dataset_text_field dataset_kwargs eos_token chat_template_path pad_to_multiple_of",
        "rows are read as docs/sft_dpo.md says (text, messages, prompt/completion), with the "
        "model's tokenizer and chat template",
    ),
}

DPO: dict[str, Entry] = {
    **_SUPERVISED,
    "beta": Entry("mapped", "supervised.beta"),
    "loss_type": Entry("mapped", "supervised.loss", "sigmoid or ipo (a list of one)"),
    **_refused(
        "sync_ref_model ref_model_mixup_alpha ref_model_sync_steps precompute_ref_log_probs "
        "precompute_ref_batch_size",
        "the reference is the initial policy, scored in each step",
    ),
    **_refused(
        "loss_weights ld_alpha f_divergence_type f_alpha_divergence_coef label_smoothing "
        "use_weighting discopop_tau",
        "a DPO variant not implemented: supervised.loss is sigmoid or ipo",
    ),
    **_refused("pad_to_multiple_of", "the learner packs rows without padding"),
}

_A = "actor_rollout_ref.actor."
_R = "actor_rollout_ref.rollout."
_M = "actor_rollout_ref.model."


def _under(prefix: str, names: str, status: Status, target: str, note: str) -> dict[str, Entry]:
    return _all(" ".join(prefix + n for n in names.split()), status, target, note)


# verl v0.7.0's ppo_trainer.yaml, by dotted path
VERL: dict[str, Entry] = {
    "data.train_files": Entry("mapped", "data.path"),
    "data.val_files": Entry("mapped", "data.eval_path", "with data.eval_every"),
    "data.prompt_key": Entry("mapped", "data.prompt_key"),
    "data.max_prompt_length": Entry("mapped", "rollout.max_prompt_tokens"),
    "data.max_response_length": Entry("mapped", "rollout.max_new_tokens"),
    "data.train_batch_size": Entry("mapped", "learner.groups_per_step", "prompts (groups)"),
    "data.apply_chat_template_kwargs": Entry("mapped", "rollout.chat_template_kwargs"),
    "data.shuffle": Entry(
        "mapped", "-", "true only: the actors draw prompts in random order", (True,)
    ),
    "data.seed": Entry("refused", "", "the data order follows run.seed"),
    "data.filter_overlong_prompts": Entry(
        "mapped", "-", "true only: longer prompts are always refused", (True,)
    ),
    "data.truncation": Entry("mapped", "-", "error only: longer prompts are refused", ("error",)),
    **_refused(
        "data.custom_cls.path data.custom_cls.name data.sampler.class_path "
        "data.sampler.class_name data.datagen.path data.datagen.name",
        "verl imports this code to read data; streamrl reads data.path itself and imports "
        "nothing a converted file names",
    ),
    **_refused(
        "data.tokenizer data.use_shm data.train_max_samples data.val_max_samples "
        "data.reward_fn_key data.val_batch_size data.tool_config_path "
        "data.return_raw_input_ids data.return_raw_chat data.return_full_prompt "
        "data.dataloader_num_workers data.image_patch_size data.validation_shuffle "
        "data.filter_overlong_prompts_workers data.image_key data.video_key "
        "data.trust_remote_code data.return_multi_modal_inputs",
        "the actors read data.path as docs/configuration.md's data section says (text only; "
        "eval: data.eval_size rows)",
    ),
    "actor_rollout_ref.model.path": Entry("mapped", "model.path"),
    "actor_rollout_ref.model.trust_remote_code": Entry(
        "code reference", "model.init_kwargs.trust_remote_code", "true: held back for review"
    ),
    "actor_rollout_ref.model.enable_gradient_checkpointing": Entry(
        "mapped", "learner.gradient_checkpointing"
    ),
    "actor_rollout_ref.model.use_remove_padding": Entry(
        "mapped", "-", "true only: the learner always packs samples without padding", (True,)
    ),
    "actor_rollout_ref.model.lora_rank": Entry("mapped", "model.lora.rank"),
    "actor_rollout_ref.model.lora_alpha": Entry("mapped", "model.lora.alpha"),
    "actor_rollout_ref.model.target_modules": Entry("mapped", "model.lora.target_modules"),
    "actor_rollout_ref.model.override_config": Entry(
        "mapped", "-", "empty only: streamrl loads the model's own config", ({},)
    ),
    "actor_rollout_ref.model.external_lib": Entry(
        "refused", "", "code verl imports; streamrl imports nothing a converted file names"
    ),
    **_under(
        _M,
        "_target_ hf_config_path tokenizer_path use_shm custom_chat_template "
        "enable_activation_offload exclude_modules lora_adapter_path use_liger "
        "use_fused_kernels fused_kernel_options.impl_backend tiled_mlp.enabled "
        "tiled_mlp.num_shards",
        "refused",
        "",
        "the model, its tokenizer and chat template come from model.path (model.*)",
    ),
    _A + "optim.lr": Entry("mapped", "learner.lr"),
    _A + "optim.weight_decay": Entry("mapped", "learner.weight_decay"),
    _A + "optim.betas": Entry("mapped", "learner.betas"),
    _A + "optim.clip_grad": Entry("mapped", "learner.grad_clip"),
    _A + "optim.lr_scheduler_type": Entry(
        "mapped",
        "learner.lr_scheduler, run.max_steps",
        "constant, cosine (with trainer.total_training_steps or the base's run.max_steps)",
    ),
    _A + "optim.warmup_style": Entry(
        "mapped", "learner.lr_scheduler, run.max_steps", "older verl's lr_scheduler_type"
    ),
    _A + "optim.lr_warmup_steps": Entry(
        "approximated",
        "learner.warmup_steps",
        "verl's steps x learner.minibatches x learner.updates_per_batch; -1: the ratio",
    ),
    _A + "optim.lr_warmup_steps_ratio": Entry(
        "approximated",
        "learner.warmup_steps",
        "ceil(ratio x run.max_steps x learner.minibatches x learner.updates_per_batch), "
        "when lr_warmup_steps is -1",
    ),
    _A + "optim.min_lr_ratio": Entry("mapped", "-", "0 only: streamrl decays to 0", (0, 0.0)),
    _A + "optim.num_cycles": Entry("mapped", "-", "0.5 only: half a cosine", (0.5,)),
    _A + "optim.total_training_steps": Entry("mapped", "run.max_steps", "-1: unset"),
    _A + "optim.optimizer": Entry("mapped", "-", "AdamW only", ("AdamW",)),
    **_under(
        _A + "optim.",
        "_target_ optimizer_impl override_optimizer_config",
        "refused",
        "",
        "the learner's optimizer is DeepSpeed's AdamW (learner.*)",
    ),
    _A + "ppo_mini_batch_size": Entry(
        "mapped", "learner.minibatches", "train_batch_size / ppo_mini_batch_size"
    ),
    _A + "ppo_max_token_len_per_gpu": Entry("mapped", "learner.micro_batch_tokens"),
    _A + "clip_ratio": Entry("mapped", "algo.clip_low, algo.clip_high", "both sides"),
    _A + "clip_ratio_low": Entry("mapped", "algo.clip_low"),
    _A + "clip_ratio_high": Entry("mapped", "algo.clip_high"),
    _A + "policy_loss.loss_mode": Entry(
        "mapped", "algo.importance_sampling_level", "vanilla: token; gspo: sequence"
    ),
    _A + "loss_agg_mode": Entry("mapped", "algo.aggregation"),
    _A + "entropy_coeff": Entry("mapped", "algo.entropy_coef"),
    _A + "use_kl_loss": Entry("mapped", "algo.kl_coef", "false: 0"),
    _A + "kl_loss_coef": Entry("mapped", "algo.kl_coef", "unless use_kl_loss is false"),
    _A + "kl_loss_type": Entry(
        "mapped", "-", "low_var_kl / k3 only: the k3 estimator", ("low_var_kl", "k3")
    ),
    _A + "ppo_epochs": Entry("mapped", "learner.updates_per_batch"),
    _A + "grad_clip": Entry("mapped", "learner.grad_clip"),
    _A + "use_remove_padding": Entry(
        "mapped", "-", "true only: the learner always packs samples without padding", (True,)
    ),
    _A + "fsdp_config.optimizer_offload": Entry("mapped", "learner.offload_optimizer"),
    **_under(
        _A,
        "ppo_micro_batch_size ppo_micro_batch_size_per_gpu use_dynamic_bsz",
        "refused",
        "",
        "micro-batches are packed by tokens: learner.micro_batch_tokens",
    ),
    **_under(
        _A,
        "tau_pos tau_neg policy_loss._target_ policy_loss.clip_cov_ratio "
        "policy_loss.clip_cov_lb policy_loss.clip_cov_ub policy_loss.kl_cov_ratio "
        "policy_loss.ppo_kl_coef clip_ratio_c loss_scale_factor",
        "refused",
        "",
        "a loss variant not implemented: the loss is README's (algo.*)",
    ),
    **_under(
        _A,
        "_target_ rollout_n strategy freeze_vision_tower calculate_entropy use_torch_compile "
        "shuffle data_loader_seed checkpoint._target_ checkpoint.save_contents "
        "checkpoint.load_contents checkpoint.async_save use_fused_kernels "
        "router_replay._target_ router_replay.mode router_replay.record_file "
        "router_replay.replay_file ulysses_sequence_parallel_size "
        "entropy_from_logits_with_chunking entropy_checkpointing",
        "refused",
        "",
        "the learner's own mechanics (DeepSpeed ZeRO, learner.*); entropy is always logged",
    ),
    _R + "name": Entry("mapped", "actor.engine", "vllm or hf"),
    _R + "temperature": Entry("mapped", "rollout.temperature"),
    _R + "top_k": Entry("mapped", "rollout.top_k", "-1 (off) is 0"),
    _R + "top_p": Entry("mapped", "rollout.top_p"),
    _R + "n": Entry("mapped", "rollout.group_size"),
    _R + "prompt_length": Entry("mapped", "rollout.max_prompt_tokens"),
    _R + "response_length": Entry("mapped", "rollout.max_new_tokens"),
    _R + "gpu_memory_utilization": Entry("mapped", "actor.vllm.gpu_memory_utilization"),
    _R + "tensor_model_parallel_size": Entry("mapped", "actor.vllm.tensor_parallel_size"),
    _R + "do_sample": Entry("mapped", "-", "true only: the actors sample", (True,)),
    **_under(
        _R,
        "_target_ mode dtype ignore_eos enforce_eager cudagraph_capture_sizes "
        "free_cache_engine data_parallel_size expert_parallel_size "
        "pipeline_model_parallel_size max_num_batched_tokens max_model_len max_num_seqs "
        "enable_chunked_prefill enable_prefix_caching logprobs_mode load_format "
        "log_prob_micro_batch_size log_prob_micro_batch_size_per_gpu "
        "log_prob_use_dynamic_bsz log_prob_max_token_len_per_gpu disable_log_stats "
        "over_sample_rate multi_stage_wake_up engine_kwargs.vllm engine_kwargs.sglang "
        "calculate_log_probs update_weights_bucket_megabytes skip_rollout skip_dump_dir "
        "skip_tokenizer_init enable_rollout_routing_replay quantization "
        "quantization_config_file layered_summon",
        "refused",
        "",
        "the engines' own settings: actor.vllm.*, actor.hf.*; actors are separate processes "
        "(streamrl run --actors)",
    ),
    **_under(
        _R,
        "val_kwargs._target_ val_kwargs.top_k val_kwargs.top_p val_kwargs.temperature "
        "val_kwargs.n val_kwargs.do_sample",
        "refused",
        "",
        "evaluation samples with rollout.* (data.eval_path)",
    ),
    **_under(
        _R,
        "multi_turn._target_ multi_turn.enable multi_turn.max_assistant_turns "
        "multi_turn.tool_config_path multi_turn.max_user_turns multi_turn.max_parallel_calls "
        "multi_turn.max_tool_response_length multi_turn.tool_response_truncate_side "
        "multi_turn.interaction_config_path multi_turn.use_inference_chat_template "
        "multi_turn.tokenization_sanity_check_mode multi_turn.format "
        "multi_turn.num_repeat_rollouts agent._target_ agent.num_workers "
        "agent.default_agent_loop agent.agent_loop_config_path "
        "agent.custom_async_server._target_ agent.custom_async_server.path "
        "agent.custom_async_server.name",
        "refused",
        "",
        "multi-turn episodes are environments (env.name, env.max_turns; docs/multiturn.md) "
        "and agents (agent.*): code a converted file never names",
    ),
    **_under(
        _R,
        "trace._target_ trace.backend trace.token2text trace.max_samples_per_step_per_worker "
        "prometheus._target_ prometheus.enable prometheus.port prometheus.file "
        "prometheus.served_model_name",
        "refused",
        "",
        "every actor serves Prometheus metrics (actor.metrics_port); samples: run.log_samples",
    ),
    "actor_rollout_ref.hybrid_engine": Entry(
        "approximated",
        "-",
        "true: actors and the learner are separate processes, placed by streamrl run",
        (True,),
    ),
    "actor_rollout_ref.nccl_timeout": Entry(
        "refused", "", "weightsync.timeout_s bounds a weight transfer"
    ),
    "algorithm.adv_estimator": Entry("mapped", "algo.advantage", "grpo only"),
    "algorithm.norm_adv_by_std_in_grpo": Entry(
        "mapped", "algo.advantage", "false: drgrpo (with adv_estimator)"
    ),
    "algorithm.use_kl_in_reward": Entry(
        "mapped", "-", "false only: the KL is a loss term (algo.kl_coef)", (False,)
    ),
    **_refused(
        "algorithm._target_ algorithm.gamma algorithm.lam algorithm.kl_penalty "
        "algorithm.use_pf_ppo algorithm.pf_ppo.reweight_method algorithm.pf_ppo.weight_pow",
        "GRPO's advantage needs no discount, GAE or in-reward KL (algo.advantage)",
    ),
    **_under(
        "algorithm.kl_ctrl.",
        "_target_ type kl_coef horizon target_kl",
        "refused",
        "",
        "the KL is a loss term with a fixed coefficient (algo.kl_coef)",
    ),
    **_under(
        "algorithm.rollout_correction.",
        "rollout_is rollout_is_threshold rollout_rs rollout_rs_threshold "
        "rollout_rs_threshold_lower rollout_token_veto_threshold bypass_mode loss_type "
        "rollout_is_batch_normalize",
        "refused",
        "",
        "one correction, always on: the token weight truncated at algo.rho_max "
        "(algo.importance_correction)",
    ),
    "custom_reward_function.path": Entry(
        "code reference", "reward.functions", "path.py:name, held back for review"
    ),
    "custom_reward_function.name": Entry("mapped", "-", "with custom_reward_function.path"),
    **_refused(
        "reward_manager._target_ reward_manager.source reward_manager.name "
        "reward_manager.module._target_ reward_manager.module.path reward_manager.module.name",
        "rewards run in reward.workers sandboxed processes; a reward manager is code a "
        "converted file never names",
    ),
    "trainer.total_training_steps": Entry("mapped", "run.max_steps"),
    "trainer.total_epochs": Entry("refused", "", "as TRL's num_train_epochs: set run.max_steps"),
    "trainer.experiment_name": Entry("mapped", "run.name"),
    "trainer.default_local_dir": Entry("mapped", "run.dir"),
    "trainer.logger": Entry("mapped", "run.report_to", "console is the live view, always on"),
    "trainer.n_gpus_per_node": Entry(
        "approximated", "learner.ranks", "the learner's GPUs; actors are counted apart"
    ),
    "trainer.save_freq": Entry("mapped", "learner.checkpoint_every", "-1: at shutdown only"),
    "trainer.test_freq": Entry("mapped", "data.eval_every", "every N policy versions"),
    "trainer.resume_mode": Entry(
        "mapped", "-", "auto: the default; disable: streamrl run --overwrite; resume_path refused"
    ),
    "trainer.resume_from_path": Entry(
        "refused", "", "a run resumes its own run.dir's checkpoint: set run.dir to that run"
    ),
    "trainer.project_name": Entry(
        "refused", "", "the tracker's project comes from its environment (WANDB_PROJECT)"
    ),
    "trainer.nnodes": Entry("refused", "", "hosts are started one by one (docs/multihost.md)"),
    "trainer.critic_warmup": Entry("refused", "", "GRPO has no critic"),
    "trainer.val_before_train": Entry(
        "refused", "", "evaluation runs every data.eval_every versions"
    ),
    **_refused(
        "trainer.balance_batch trainer.log_val_generations trainer.rollout_data_dir "
        "trainer.validation_data_dir trainer.esi_redundant_time trainer.val_only "
        "trainer.default_hdfs_dir trainer.del_local_ckpt_after_load "
        "trainer.max_actor_ckpt_to_keep trainer.max_critic_ckpt_to_keep "
        "trainer.ray_wait_register_center_timeout trainer.device "
        "trainer.use_legacy_worker_impl transfer_queue.enable ray_kwargs.ray_init.num_cpus "
        "ray_kwargs.timeline_json_file",
        "verl's Ray trainer's own mechanics: streamrl run starts Redis, the learner and "
        "actors (run.*, learner.*, actor.*)",
    ),
}

# whole verl subtrees with one reason: every key under the prefix
VERL_PREFIXES: dict[str, Entry] = {
    "critic.": Entry("refused", "", "GRPO has no critic: the advantage is the group's"),
    "reward_model.": Entry(
        "refused", "", "a reward is a function (reward.functions); reward models are not supported"
    ),
    "actor_rollout_ref.ref.": Entry(
        "refused", "", "the reference is the initial policy on the learner (algo.kl_coef > 0)"
    ),
    _A + "fsdp_config.": Entry(
        "refused",
        "",
        "the learner is DeepSpeed ZeRO: learner.zero_stage, learner.offload_optimizer",
    ),
    _A + "profiler.": Entry("refused", "", "profiling is outside a run's config"),
    _R + "profiler.": Entry("refused", "", "profiling is outside a run's config"),
    "global_profiler.": Entry("refused", "", "profiling is outside a run's config"),
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
