"""The per-field rules of ``convert``: how a TRL or verl field whose value changes on the way,
or that is read with others, becomes streamrl settings (the schedule and warm-up in
``convert_schedule``, the rewards in ``convert_rewards``), and which settings are code a run
would import."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from streamrl.configs import convert_rewards as rewards
from streamrl.configs import convert_schedule as schedule
from streamrl.configs.convert_types import VERL_ACTOR as _A
from streamrl.configs.convert_types import Dialect, Refused, Setting, Status, value_at
from streamrl.configs.reward import BUILTIN_REWARD_RANGES
from streamrl.configs.schema import Config

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


# a field the catalogue (convert_fields) does not know: not one of the pinned releases' fields
NO_COUNTERPART = "not a field of the TRL or verl release the catalogue lists: no counterpart known"


# --- rules: (value, the whole foreign tree, the base config or None) -> settings


def _trl_loss_type(value, tree, base) -> list[Setting]:
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


def _trl_scale_rewards(value, tree, base) -> list[Setting]:
    if tree.get("loss_type") == "dr_grpo":
        return [Setting(None, value, note="dr_grpo's unscaled advantage is set by loss_type")]
    if value in ("group", True):
        return [Setting("algo.advantage", "grpo")]
    if value in ("none", False):
        return [Setting("algo.advantage", "drgrpo")]
    raise Refused(f"scale_rewards {value!r}: not supported (group or none are)")


def _trl_epsilon(value, tree, base) -> list[Setting]:
    out = [Setting("algo.clip_low", value)]
    if tree.get("epsilon_high") is None:
        # TRL clips both sides at epsilon unless epsilon_high is set
        out.append(Setting("algo.clip_high", value, note="TRL's epsilon_high defaults to epsilon"))
    return out


def _trl_bf16(value, tree, base) -> list[Setting]:
    return [Setting("model.dtype", "bfloat16" if value else "float32")]


def _trl_betas(value, tree, base) -> list[Setting]:
    betas = [tree.get("adam_beta1", 0.9), tree.get("adam_beta2", 0.999)]
    return [Setting("learner.betas", betas)]


def _trl_log_completions(value, tree, base) -> list[Setting]:
    if not value:
        return [Setting("run.log_samples_every", 0)]
    every = tree.get("logging_steps", 10)
    return [Setting("run.log_samples_every", every, note="every logging_steps steps")]


def _trl_use_vllm(value, tree, base) -> list[Setting]:
    return [Setting("actor.engine", "vllm" if value else "hf")]


def _report_to(value, tree, base) -> list[Setting]:
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


def _trl_groups_per_step(value, tree, base) -> list[Setting]:
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


def _loss_mode(value, tree, base) -> list[Setting]:
    levels = {"vanilla": "token", "gspo": "sequence"}
    if value not in levels:
        raise Refused(f"{value!r}: vanilla (PPO's token ratio) and gspo are implemented")
    return [Setting("algo.importance_sampling_level", levels[value])]


def _verl_adv_estimator(value, tree, base) -> list[Setting]:
    if value != "grpo":
        raise Refused(f"{value!r}: only grpo (and its unscaled form) is implemented")
    std = value_at(tree, "algorithm.norm_adv_by_std_in_grpo")
    return [Setting("algo.advantage", "drgrpo" if std is False else "grpo")]


def _verl_norm_adv(value, tree, base) -> list[Setting]:
    return [Setting(None, value, note="folded into algorithm.adv_estimator")]


def _verl_loss_agg(value, tree, base) -> list[Setting]:
    ours = {
        "token-mean": "token_mean",
        "seq-mean-token-mean": "seq_mean",
        "seq-mean-token-sum-norm": "constant",
    }
    if value not in ours:
        raise Refused(f"{value!r}: not implemented")
    return [Setting("algo.aggregation", ours[value])]


def _verl_mini_batch(value, tree, base) -> list[Setting]:
    groups = value_at(tree, "data.train_batch_size")
    if not groups or groups % value:
        raise Refused("learner.minibatches counts mini-batches: train_batch_size must divide")
    return [Setting("learner.minibatches", groups // value, note="train_batch_size / this")]


def _verl_use_kl(value, tree, base) -> list[Setting]:
    if value:
        return [Setting(None, value, note="the coefficient is kl_loss_coef")]
    return [Setting("algo.kl_coef", 0.0)]


def _verl_kl_coef(value, tree, base) -> list[Setting]:
    if value_at(tree, "actor_rollout_ref.actor.use_kl_loss") is False:
        return [Setting(None, value, note="use_kl_loss is false")]
    return [Setting("algo.kl_coef", value)]


def _trl_model_init_kwargs(value, tree, base) -> list[Setting]:
    if not isinstance(value, dict):
        raise Refused("a mapping of from_pretrained's keyword arguments")
    rest = dict(value)
    out = []
    dtypes = {rest.pop("dtype", None), rest.pop("torch_dtype", None)} - {None}
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        if name not in ("auto", "float32", "bfloat16", "float16"):
            raise Refused(f"dtype {dtype!r}: model.dtype is auto, float32, bfloat16 or float16")
        out.append(Setting("model.dtype", name))
    if rest.pop("trust_remote_code", None) is True:
        out.append(Setting("model.init_kwargs.trust_remote_code", True))
    if rest:
        out.append(Setting("model.init_kwargs", rest))
    return out


def _trl_generation_kwargs(value, tree, base) -> list[Setting]:
    if not isinstance(value, dict):
        raise Refused("a mapping of generation arguments")
    others = sorted(set(value) - {"stop"})
    if others:
        raise Refused(f"{', '.join(others)}: the actors' sampling is rollout.*; stop only maps")
    return [Setting("rollout.stop", value.get("stop"))] if "stop" in value else []


def _trl_fp16(value, tree, base) -> list[Setting]:
    if value:
        return [Setting("model.dtype", "float16")]
    return [Setting(None, value, note="false: model.dtype stands (auto)")]


def _verl_clip_ratio(value, tree, base) -> list[Setting]:
    # verl's clip_ratio_low/high default to clip_ratio
    sides = {"clip_ratio_low": "algo.clip_low", "clip_ratio_high": "algo.clip_high"}
    out = [Setting(k, value) for s, k in sides.items() if value_at(tree, _A + s) is None]
    return out or [Setting(None, value, note="clip_ratio_low and clip_ratio_high are set")]


def _verl_resume_mode(value, tree, base) -> list[Setting]:
    if value == "auto":
        return [Setting(None, value, note="the default: a checkpoint in run.dir is resumed")]
    if value == "disable":
        return [Setting(None, value, "approximated", "start over: streamrl run --overwrite")]
    raise Refused(
        f"{value!r}: a run resumes its own run.dir's checkpoint; set run.dir "
        "(trainer.default_local_dir) to the run resume_from_path names"
    )


def _supervised_batch(value, tree, base) -> list[Setting]:
    rows = tree.get("per_device_train_batch_size", 8) * tree.get("gradient_accumulation_steps", 1)
    return [Setting("supervised.batch_size", rows, "approximated", f"{rows} rows, one process")]


def _supervised_epochs(value, tree, base) -> list[Setting]:
    epochs = math.ceil(value)
    status: Status = "mapped" if epochs == value else "approximated"
    return [Setting("supervised.epochs", epochs, status, f"{value} rounded up")]


def _dpo_loss_type(value, tree, base) -> list[Setting]:
    losses = value if isinstance(value, list) else [value]
    if len(losses) != 1 or losses[0] not in ("sigmoid", "ipo"):
        raise Refused(f"{value!r}: supervised.loss is one of sigmoid, ipo")
    return [Setting("supervised.loss", losses[0])]


def _trust_remote_code(value, tree, base) -> list[Setting]:
    if value is True:
        return [Setting("model.init_kwargs.trust_remote_code", True)]
    return [Setting(None, value, note="streamrl never runs a model repository's code unless told")]


def _verl_top_k(value, tree, base) -> list[Setting]:
    if value < 0:
        return [Setting("rollout.top_k", 0, note="verl's -1 (off) is 0")]
    return [Setting("rollout.top_k", value)]


def _verl_save_freq(value, tree, base) -> list[Setting]:
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


def _verl_gpus(value, tree, base) -> list[Setting]:
    return [
        Setting(
            "learner.ranks",
            value,
            "approximated",
            "verl's GPUs train and generate; here they are the learner's, actors come apart",
        )
    ]


def _verl_test_freq(value, tree, base) -> list[Setting]:
    if value <= 0:
        return [Setting("data.eval_every", 0)]
    return [Setting("data.eval_every", value, note="every N policy versions")]


Rule = Callable[[Any, dict, "Config | None"], list[Setting]]
# transformers.TrainingArguments: the rules GRPO, SFT and DPO share
_TRAINING_ARGUMENTS: dict[str, Rule] = {
    "max_steps": schedule.trl_max_steps,
    "bf16": _trl_bf16,
    "fp16": _trl_fp16,
    "adam_beta1": _trl_betas,
    "adam_beta2": _trl_betas,
    "report_to": _report_to,
    "lr_scheduler_type": schedule.lr_scheduler,
    "warmup_steps": schedule.trl_warmup_steps,
    "warmup_ratio": schedule.trl_warmup_ratio,
    "model_init_kwargs": _trl_model_init_kwargs,
    "trust_remote_code": _trust_remote_code,
}
_SUPERVISED: dict[str, Rule] = {
    **_TRAINING_ARGUMENTS,
    "warmup_steps": functools.partial(schedule.trl_warmup_steps, supervised=True),
    "warmup_ratio": functools.partial(schedule.trl_warmup_ratio, supervised=True),
    "per_device_train_batch_size": _supervised_batch,
    "gradient_accumulation_steps": _supervised_batch,
    "num_train_epochs": _supervised_epochs,
}
RULES: dict[Dialect, dict[str, Rule]] = {
    "trl": {
        **_TRAINING_ARGUMENTS,
        "loss_type": _trl_loss_type,
        "scale_rewards": _trl_scale_rewards,
        "epsilon": _trl_epsilon,
        "use_vllm": _trl_use_vllm,
        "log_completions": _trl_log_completions,
        "per_device_train_batch_size": _trl_groups_per_step,
        "gradient_accumulation_steps": _trl_groups_per_step,
        "reward_funcs": rewards.trl_reward_funcs,
        "reward_weights": rewards.trl_reward_weights,
        "generation_kwargs": _trl_generation_kwargs,
    },
    "trl-sft": _SUPERVISED,
    "trl-dpo": {**_SUPERVISED, "loss_type": _dpo_loss_type},
    "verl": {
        "algorithm.adv_estimator": _verl_adv_estimator,
        "algorithm.norm_adv_by_std_in_grpo": _verl_norm_adv,
        _A + "loss_agg_mode": _verl_loss_agg,
        _A + "ppo_mini_batch_size": _verl_mini_batch,
        _A + "use_kl_loss": _verl_use_kl,
        _A + "kl_loss_coef": _verl_kl_coef,
        _A + "clip_ratio": _verl_clip_ratio,
        _A + "optim.lr_scheduler_type": schedule.lr_scheduler,
        _A + "optim.warmup_style": schedule.lr_scheduler,
        _A + "optim.lr_warmup_steps": schedule.verl_warmup_steps,
        _A + "optim.lr_warmup_steps_ratio": schedule.verl_warmup_ratio,
        _A + "optim.total_training_steps": schedule.verl_total_steps,
        _A + "policy_loss.loss_mode": _loss_mode,
        "actor_rollout_ref.rollout.top_k": _verl_top_k,
        "actor_rollout_ref.model.trust_remote_code": _trust_remote_code,
        "trainer.save_freq": _verl_save_freq,
        "trainer.n_gpus_per_node": _verl_gpus,
        "trainer.logger": _report_to,
        "trainer.test_freq": _verl_test_freq,
        "trainer.total_training_steps": schedule.verl_total_steps,
        "trainer.resume_mode": _verl_resume_mode,
        "custom_reward_function.path": rewards.verl_custom_reward,
        "custom_reward_function.name": rewards.verl_custom_reward_name,
    },
}
