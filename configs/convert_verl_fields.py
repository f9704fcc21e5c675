"""verl v0.7.0's ``ppo_trainer.yaml``, key by key (``tests/data/verl_v0.7.0_ppo_trainer_keys.txt``):
what ``convert --from verl`` makes of each. Subtrees GRPO on streamrl has no use for (the
critic, reward models, profilers, the reference's copy of the actor's settings) are one entry by
prefix."""

from __future__ import annotations

from streamrl.configs.convert_types import VERL_ACTOR as _A
from streamrl.configs.convert_types import Entry, refused, under

_R = "actor_rollout_ref.rollout."
_M = "actor_rollout_ref.model."


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
    **refused(
        "data.custom_cls.path data.custom_cls.name data.sampler.class_path "
        "data.sampler.class_name data.datagen.path data.datagen.name",
        "verl imports this code to read data; streamrl reads data.path itself and imports "
        "nothing a converted file names",
    ),
    **refused(
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
    **under(
        _M,
        "_target_ hf_config_path tokenizer_path use_shm custom_chat_template "
        "enable_activation_offload exclude_modules lora_adapter_path use_liger "
        "use_fused_kernels fused_kernel_options.impl_backend tiled_mlp.enabled "
        "tiled_mlp.num_shards",
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
    **under(
        _A + "optim.",
        "_target_ optimizer_impl override_optimizer_config",
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
    **under(
        _A,
        "ppo_micro_batch_size ppo_micro_batch_size_per_gpu use_dynamic_bsz",
        "micro-batches are packed by tokens: learner.micro_batch_tokens",
    ),
    **under(
        _A,
        "tau_pos tau_neg policy_loss._target_ policy_loss.clip_cov_ratio "
        "policy_loss.clip_cov_lb policy_loss.clip_cov_ub policy_loss.kl_cov_ratio "
        "policy_loss.ppo_kl_coef clip_ratio_c loss_scale_factor",
        "a loss variant not implemented: the loss is README's (algo.*)",
    ),
    **under(
        _A,
        "_target_ rollout_n strategy freeze_vision_tower calculate_entropy use_torch_compile "
        "shuffle data_loader_seed checkpoint._target_ checkpoint.save_contents "
        "checkpoint.load_contents checkpoint.async_save use_fused_kernels "
        "router_replay._target_ router_replay.mode router_replay.record_file "
        "router_replay.replay_file ulysses_sequence_parallel_size "
        "entropy_from_logits_with_chunking entropy_checkpointing",
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
    **under(
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
        "the engines' own settings: actor.vllm.*, actor.hf.*; actors are separate processes "
        "(streamrl run --actors)",
    ),
    **under(
        _R,
        "val_kwargs._target_ val_kwargs.top_k val_kwargs.top_p val_kwargs.temperature "
        "val_kwargs.n val_kwargs.do_sample",
        "evaluation samples with rollout.* (data.eval_path)",
    ),
    **under(
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
        "multi-turn episodes are environments (env.name, env.max_turns; docs/multiturn.md) "
        "and agents (agent.*): code a converted file never names",
    ),
    **under(
        _R,
        "trace._target_ trace.backend trace.token2text trace.max_samples_per_step_per_worker "
        "prometheus._target_ prometheus.enable prometheus.port prometheus.file "
        "prometheus.served_model_name",
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
    **refused(
        "algorithm._target_ algorithm.gamma algorithm.lam algorithm.kl_penalty "
        "algorithm.use_pf_ppo algorithm.pf_ppo.reweight_method algorithm.pf_ppo.weight_pow",
        "GRPO's advantage needs no discount, GAE or in-reward KL (algo.advantage)",
    ),
    **under(
        "algorithm.kl_ctrl.",
        "_target_ type kl_coef horizon target_kl",
        "the KL is a loss term with a fixed coefficient (algo.kl_coef)",
    ),
    **under(
        "algorithm.rollout_correction.",
        "rollout_is rollout_is_threshold rollout_rs rollout_rs_threshold "
        "rollout_rs_threshold_lower rollout_token_veto_threshold bypass_mode loss_type "
        "rollout_is_batch_normalize",
        "one correction, always on: the token weight truncated at algo.rho_max "
        "(algo.importance_correction)",
    ),
    "custom_reward_function.path": Entry(
        "code reference", "reward.functions", "path.py:name, held back for review"
    ),
    "custom_reward_function.name": Entry("mapped", "-", "with custom_reward_function.path"),
    **refused(
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
    **refused(
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
