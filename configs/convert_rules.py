"""The per-field rules of ``convert``: how a TRL or verl field whose value changes on the way
becomes streamrl settings, the verl paths whose last part alone is ambiguous, why a field with
no counterpart has none, and which settings are code a run would import."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from streamrl.configs.reward import BUILTIN_REWARD_RANGES

Dialect = Literal["trl", "verl"]
Status = Literal["code reference", "mapped", "approximated", "refused", "unset"]

# the keys whose value names code a run imports and calls (actors.plugins), or lets run
# (a model repository's own code): a converted config never sets them without the user's review
CODE_KEYS = (
    "reward.functions",
    "env.name",
    "model.init_kwargs.trust_remote_code",
)


def code_in(key: str, value: Any) -> list[str]:
    """The code a setting of ``key`` to ``value`` would run, as the user should review it
    (``[]``: none; a built-in reward is no code reference)."""
    if key == "reward.functions" or key.startswith("reward.functions."):
        items = value if isinstance(value, list) else [value]
        names = [i.get("fn") if isinstance(i, dict) else i for i in items]
        return [str(n) for n in names if n is not None and n not in BUILTIN_REWARD_RANGES]
    if key == "model.init_kwargs.trust_remote_code":
        return ["the model repository's own code (trust_remote_code)"] if value else []
    if key in CODE_KEYS and value is not None:
        return [str(value)]
    return []


def value_at(tree: dict, path: str) -> Any:
    """The value at dotted ``path`` of a nested tree, or None."""
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


class Setting(NamedTuple):
    """What a rule makes of one foreign field: streamrl's key (None: nothing to set), the value."""

    key: str | None
    value: Any
    status: Status = "mapped"
    note: str = ""


class Refused(Exception):
    """A rule's reason for refusing a field."""


# verl paths whose last part alone is ambiguous or spelled like nothing in FOREIGN
VERL_PATHS: dict[str, str] = {
    "actor_rollout_ref.model.path": "model.path",
    "actor_rollout_ref.rollout.n": "rollout.group_size",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "actor.vllm.tensor_parallel_size",
    "actor_rollout_ref.rollout.name": "actor.engine",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "learner.warmup_steps",
    "actor_rollout_ref.actor.grad_clip": "learner.grad_clip",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "learner.micro_batch_tokens",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "learner.gradient_checkpointing",
    "trainer.test_freq": "data.eval_every",
}

# why a field with no counterpart has none (fields not named here get the generic reason)
WHY_NOT: dict[str, str] = {
    "min_p": "not supported by the actors' sampling",
    "repetition_penalty": "not supported by the actors' sampling",
    "mask_truncated_completions": "not supported",
    "top_entropy_quantile": "not supported",
    "sync_ref_model": "the reference model is the initial policy, never synced",
    "vllm_mode": "actors are always separate processes (TRL's server mode)",
    "logging_steps": "every learner step is logged",
    "per_device_train_batch_size": "a step is a number of groups: learner.groups_per_step",
    "gradient_accumulation_steps": "a step is a number of groups: learner.minibatches splits it",
    "generation_batch_size": "a step is a number of groups: learner.groups_per_step",
    "steps_per_generation": "a step is a number of groups: learner.minibatches splits it",
    "ppo_micro_batch_size_per_gpu": "micro-batches are packed by tokens: learner.micro_batch_tokens",
    "log_prob_micro_batch_size_per_gpu": "micro-batches are packed by tokens: learner.micro_batch_tokens",
    "fsdp_config": "the learner is DeepSpeed ZeRO: learner.zero_stage, learner.offload_optimizer",
    "nnodes": "hosts are started one by one (docs/multihost.md)",
    "critic_warmup": "GRPO has no critic",
    "use_kl_in_reward": "the KL is a loss term only (algo.kl_coef)",
    "kl_ctrl": "the KL is a loss term only (algo.kl_coef)",
    "project_name": "the tracker's project comes from its environment (WANDB_PROJECT)",
    "filter_overlong_prompts": "longer prompts are always refused, not truncated",
    "truncation": "longer prompts are always refused, not truncated",
    "use_remove_padding": "the learner always packs samples without padding",
    "reward_model": "a reward is a function (reward.functions); reward models are not supported",
}
NO_COUNTERPART = "no streamrl counterpart (docs/migrating.md)"


# --- rules: the fields whose value changes on the way, (value, whole foreign tree) -> settings


def _trl_loss_type(value, tree) -> list[Setting]:
    if value == "grpo":
        return [Setting("algo.aggregation", "seq_mean")]
    if value == "dapo":
        return [Setting("algo.aggregation", "token_mean")]
    if value == "bnpo":
        return [
            Setting(
                "algo.aggregation",
                "token_mean",
                "approximated",
                "normalised by the mini-batch's tokens, not the local batch's",
            )
        ]
    if value == "dr_grpo":
        return [Setting("algo.aggregation", "constant"), Setting("algo.advantage", "drgrpo")]
    raise Refused(f"loss_type {value!r}: not implemented (grpo, bnpo, dapo, dr_grpo are)")


def _trl_scale_rewards(value, tree) -> list[Setting]:
    if tree.get("loss_type") == "dr_grpo":
        return [Setting(None, value, note="dr_grpo's unscaled advantage is set by loss_type")]
    if value in ("group", True):
        return [Setting("algo.advantage", "grpo")]
    if value in ("none", False):
        return [Setting("algo.advantage", "drgrpo")]
    raise Refused(f"scale_rewards {value!r}: not supported (group or none are)")


def _trl_epsilon(value, tree) -> list[Setting]:
    out = [Setting("algo.clip_low", value)]
    if tree.get("epsilon_high") is None:
        # TRL clips both sides at epsilon unless epsilon_high is set
        out.append(Setting("algo.clip_high", value, note="TRL's epsilon_high defaults to epsilon"))
    return out


def _trl_max_steps(value, tree) -> list[Setting]:
    if value <= 0:
        raise Refused(f"{value}: train num_train_epochs; streamrl stops at run.max_steps")
    return [Setting("run.max_steps", value)]


def _trl_bf16(value, tree) -> list[Setting]:
    return [Setting("model.dtype", "bfloat16" if value else "float32")]


def _trl_betas(value, tree) -> list[Setting]:
    betas = [tree.get("adam_beta1", 0.9), tree.get("adam_beta2", 0.999)]
    return [Setting("learner.betas", betas)]


def _trl_log_completions(value, tree) -> list[Setting]:
    if not value:
        return [Setting("run.log_samples_every", 0)]
    every = tree.get("logging_steps", 10)
    return [Setting("run.log_samples_every", every, note="every logging_steps steps")]


def _trl_use_vllm(value, tree) -> list[Setting]:
    return [Setting("actor.engine", "vllm" if value else "hf")]


def _report_to(value, tree) -> list[Setting]:
    names = [value] if isinstance(value, str) else list(value)
    known = ("tensorboard", "wandb", "trackio")
    kept = [n for n in names if n in known]
    if names == ["all"]:
        return [Setting("run.report_to", ["tensorboard"], "approximated", "all: TensorBoard")]
    dropped = [n for n in names if n not in known and n not in ("none", "console")]
    if dropped:
        return [Setting("run.report_to", kept, "approximated", f"{', '.join(dropped)} dropped")]
    note = "console is the live view, always on" if "console" in names else ""
    return [Setting("run.report_to", kept, note=note)]


def _trl_groups_per_step(value, tree) -> list[Setting]:
    completions = tree.get("per_device_train_batch_size", 8) * tree.get(
        "gradient_accumulation_steps", 1
    )
    groups = max(1, completions // tree.get("num_generations", 8))
    return [
        Setting(
            "learner.groups_per_step",
            groups,
            "approximated",
            f"{completions} completions / num_generations, one process",
        )
    ]


def _lr_scheduler(value, tree) -> list[Setting]:
    if value == "constant_with_warmup":
        return [Setting("learner.lr_scheduler", "constant", note="warm-up: learner.warmup_steps")]
    return [Setting("learner.lr_scheduler", value)]


def _loss_mode(value, tree) -> list[Setting]:
    levels = {"vanilla": "token", "gspo": "sequence"}
    if value not in levels:
        raise Refused(f"{value!r}: vanilla (PPO's token ratio) and gspo are implemented")
    return [Setting("algo.importance_sampling_level", levels[value])]


def _verl_adv_estimator(value, tree) -> list[Setting]:
    if value != "grpo":
        raise Refused(f"{value!r}: only grpo (and its unscaled form) is implemented")
    std = value_at(tree, "algorithm.norm_adv_by_std_in_grpo")
    return [Setting("algo.advantage", "drgrpo" if std is False else "grpo")]


def _verl_norm_adv(value, tree) -> list[Setting]:
    return [Setting(None, value, note="folded into algorithm.adv_estimator")]


def _verl_loss_agg(value, tree) -> list[Setting]:
    ours = {
        "token-mean": "token_mean",
        "seq-mean-token-mean": "seq_mean",
        "seq-mean-token-sum-norm": "constant",
    }
    if value not in ours:
        raise Refused(f"{value!r}: not implemented")
    return [Setting("algo.aggregation", ours[value])]


def _verl_mini_batch(value, tree) -> list[Setting]:
    groups = value_at(tree, "data.train_batch_size")
    if not groups or groups % value:
        raise Refused("learner.minibatches counts mini-batches: train_batch_size must divide")
    return [Setting("learner.minibatches", groups // value, note="train_batch_size / this")]


def _verl_use_kl(value, tree) -> list[Setting]:
    if value:
        return [Setting(None, value, note="the coefficient is kl_loss_coef")]
    return [Setting("algo.kl_coef", 0.0)]


def _verl_kl_coef(value, tree) -> list[Setting]:
    if value_at(tree, "actor_rollout_ref.actor.use_kl_loss") is False:
        return [Setting(None, value, note="use_kl_loss is false")]
    return [Setting("algo.kl_coef", value)]


def _verl_kl_type(value, tree) -> list[Setting]:
    if value not in ("low_var_kl", "k3"):
        raise Refused(f"{value!r}: the KL is always the k3 (low_var_kl) estimator")
    return [Setting(None, value, note="the k3 estimator, streamrl's only one")]


def _trl_reward_funcs(value, tree) -> list[Setting]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise Refused("a name or a list of names of reward functions")
    weights = tree.get("reward_weights") or [1.0] * len(names)
    if not isinstance(weights, list) or len(weights) != len(names):
        raise Refused(f"{len(names)} reward_funcs but reward_weights {weights!r}")
    specs, notes = [], []
    for name, weight in zip(names, weights, strict=True):
        if name not in BUILTIN_REWARD_RANGES and ":" not in name:
            module, dot, attr = name.rpartition(".")
            if not (dot and module and attr) or "/" in name:
                raise Refused(f"{name!r}: neither a streamrl built-in nor module.function")
            # TRL imports a dotted path; streamrl's plug-ins are module:function
            name = f"{module}:{attr}"
            notes.append(f"TRL's dotted path as {name}")
        specs.append({"fn": name, "weight": weight})
    return [Setting("reward.functions", specs, note="; ".join(notes))]


def _trl_reward_weights(value, tree) -> list[Setting]:
    if tree.get("reward_funcs") is None:
        raise Refused("weights of reward_funcs, which this file does not name")
    return [Setting(None, value, note="the weights of reward_funcs")]


def _trust_remote_code(value, tree) -> list[Setting]:
    if value is True:
        return [Setting("model.init_kwargs.trust_remote_code", True)]
    return [Setting(None, value, note="streamrl never runs a model repository's code unless told")]


def _verl_custom_reward(value, tree) -> list[Setting]:
    name = value_at(tree, "custom_reward_function.name") or "compute_score"
    return [
        Setting(
            "reward.functions",
            [{"fn": f"{value}:{name}"}],
            "approximated",
            "verl calls fn(data_source, solution_str, ground_truth, extra_info); "
            "streamrl fn(messages, answer, **columns)",
        )
    ]


def _verl_custom_reward_name(value, tree) -> list[Setting]:
    if value_at(tree, "custom_reward_function.path") is None:
        raise Refused("a function in custom_reward_function.path, which this file does not name")
    return [Setting(None, value, note="folded into custom_reward_function.path")]


def _verl_top_k(value, tree) -> list[Setting]:
    if value < 0:
        return [Setting("rollout.top_k", 0, note="verl's -1 (off) is 0")]
    return [Setting("rollout.top_k", value)]


def _verl_save_freq(value, tree) -> list[Setting]:
    if value <= 0:
        return [
            Setting(
                None,
                value,
                "approximated",
                "a checkpoint is always written at shutdown and "
                "every learner.checkpoint_every steps",
            )
        ]
    return [Setting("learner.checkpoint_every", value)]


def _verl_gpus(value, tree) -> list[Setting]:
    return [
        Setting(
            "learner.ranks",
            value,
            "approximated",
            "verl's GPUs train and generate; here they are the learner's, actors come apart",
        )
    ]


def _verl_test_freq(value, tree) -> list[Setting]:
    if value <= 0:
        return [Setting("data.eval_every", 0)]
    return [Setting("data.eval_every", value, note="every N policy versions")]


Rule = Callable[[Any, dict], list[Setting]]
RULES: dict[Dialect, dict[str, Rule]] = {
    "trl": {
        "loss_type": _trl_loss_type,
        "scale_rewards": _trl_scale_rewards,
        "epsilon": _trl_epsilon,
        "max_steps": _trl_max_steps,
        "bf16": _trl_bf16,
        "use_vllm": _trl_use_vllm,
        "log_completions": _trl_log_completions,
        "adam_beta1": _trl_betas,
        "adam_beta2": _trl_betas,
        "report_to": _report_to,
        "per_device_train_batch_size": _trl_groups_per_step,
        "lr_scheduler_type": _lr_scheduler,
        "reward_funcs": _trl_reward_funcs,
        "reward_weights": _trl_reward_weights,
        "trust_remote_code": _trust_remote_code,
    },
    "verl": {
        "algorithm.adv_estimator": _verl_adv_estimator,
        "algorithm.norm_adv_by_std_in_grpo": _verl_norm_adv,
        "actor_rollout_ref.actor.loss_agg_mode": _verl_loss_agg,
        "actor_rollout_ref.actor.ppo_mini_batch_size": _verl_mini_batch,
        "actor_rollout_ref.actor.use_kl_loss": _verl_use_kl,
        "actor_rollout_ref.actor.kl_loss_coef": _verl_kl_coef,
        "actor_rollout_ref.actor.kl_loss_type": _verl_kl_type,
        "actor_rollout_ref.rollout.top_k": _verl_top_k,
        "trainer.save_freq": _verl_save_freq,
        "trainer.n_gpus_per_node": _verl_gpus,
        "trainer.logger": _report_to,
        "trainer.test_freq": _verl_test_freq,
        "lr_scheduler_type": _lr_scheduler,
        "loss_mode": _loss_mode,
        "custom_reward_function.path": _verl_custom_reward,
        "custom_reward_function.name": _verl_custom_reward_name,
        "trust_remote_code": _trust_remote_code,
    },
}
