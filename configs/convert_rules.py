"""The per-field rules of ``convert``: how a TRL or verl field whose value changes on the way,
or that is converted together with others (a schedule and its horizon, a warm-up ratio, reward
weights), becomes streamrl settings, and which settings are code a run would import."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from streamrl.configs.errors import ConfigError
from streamrl.configs.learner import LearnerConfig
from streamrl.configs.reward import BUILTIN_REWARD_RANGES
from streamrl.configs.schema import Config

Dialect = Literal["trl", "trl-sft", "trl-dpo", "verl"]
Status = Literal["code reference", "mapped", "approximated", "refused", "unset"]

# the keys whose value names code a run imports and calls (actors.plugins), or lets run
# (a model repository's own code): a converted config never sets them without the user's review
CODE_KEYS = (
    "reward.functions",
    "model.build",
    "data.build",
    "supervised.build",
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


_A = "actor_rollout_ref.actor."
_LEARNER_DEFAULTS = LearnerConfig()


class Setting(NamedTuple):
    """What a rule makes of one foreign field: streamrl's key (None: nothing to set), the value."""

    key: str | None
    value: Any
    status: Status = "mapped"
    note: str = ""


class Refused(Exception):
    """A rule's reason for refusing a field."""


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


def _trl_max_steps(value, tree, base) -> list[Setting]:
    if value <= 0:
        raise Refused(f"{value}: train num_train_epochs; streamrl stops at run.max_steps")
    return [Setting("run.max_steps", value)]


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


_SCHEDULES = {
    "linear": "linear",
    "cosine": "cosine",
    "constant": "constant",
    "constant_with_warmup": "constant",
}


def _max_steps(tree: dict) -> int | None:
    """The run's length in steps as the foreign file gives it (TRL's max_steps, verl's
    total_training_steps), or None."""
    for path in ("max_steps", "trainer.total_training_steps", _A + "optim.total_training_steps"):
        steps = value_at(tree, path)
        if isinstance(steps, int) and steps > 0:
            return steps
    return None


def _lr_scheduler(value, tree, base) -> list[Setting]:
    if value not in _SCHEDULES:
        raise Refused(
            f"{value!r}: streamrl's schedules are linear, cosine (half a cosine to 0) and "
            "constant (learner.lr_scheduler)"
        )
    out = [Setting("learner.lr_scheduler", _SCHEDULES[value])]
    if value == "constant_with_warmup":
        out[0] = out[0]._replace(note="the warm-up is learner.warmup_steps")
    if _SCHEDULES[value] != "constant":
        # a decay needs its horizon: the file's step count travels with it, checked together
        steps = _max_steps(tree)
        if steps is not None:
            out.append(Setting("run.max_steps", steps, note=f"decays to 0 over {steps} steps"))
        elif base is None or not base.run.max_steps:
            raise Refused(
                f"{value} decays to 0 at run.max_steps, which neither this file nor --base "
                "sets: set run.max_steps with it"
            )
    return out


def _optimizer_steps(tree: dict, base: Config | None) -> tuple[int, int]:
    """(learner.minibatches, learner.updates_per_batch) of the converted run."""
    learner = (base.learner if base is not None else None) or _LEARNER_DEFAULTS
    updates = tree.get("num_iterations") or value_at(tree, _A + "ppo_epochs")
    groups = value_at(tree, "data.train_batch_size")
    mini = value_at(tree, _A + "ppo_mini_batch_size")
    minibatches = groups // mini if groups and mini and groups % mini == 0 else None
    return (minibatches or learner.minibatches, updates or learner.updates_per_batch)


def _warmup(steps: int | float, tree: dict, base: Config | None, ratio: bool) -> list[Setting]:
    """learner.warmup_steps for a warm-up of ``steps`` foreign steps, or of a ``ratio`` of the
    run: the same share of the schedule, in optimizer steps."""
    minibatches, updates = _optimizer_steps(tree, base)
    per = minibatches * updates
    if not ratio:
        status: Status = "mapped" if per == 1 else "approximated"
        note = f"{steps} x {minibatches} minibatches x {updates} updates_per_batch"
        return [Setting("learner.warmup_steps", int(steps) * per, status, note)]
    total = _max_steps(tree) or (base.run.max_steps if base is not None else 0)
    if not total:
        raise Refused(
            "a share of run.max_steps, which neither this file nor --base sets: set "
            "learner.warmup_steps"
        )
    formula = f"ceil({steps} x {total} steps x {minibatches} minibatches x {updates} updates)"
    warm = math.ceil(steps * total * per)
    return [Setting("learner.warmup_steps", warm, "approximated", formula)]


def _trl_warmup_steps(value, tree, base) -> list[Setting]:
    if isinstance(value, float) and 0 < value < 1:
        # transformers 5: a float under 1 is a ratio of the run
        return _warmup(value, tree, base, ratio=True)
    if value == 0 and (tree.get("warmup_ratio") or 0) > 0:
        return [Setting(None, value, note="0: warmup_ratio sets the warm-up")]
    return _warmup(value, tree, base, ratio=False)


def _trl_warmup_ratio(value, tree, base) -> list[Setting]:
    if (tree.get("warmup_steps") or 0) >= 1:
        return [Setting(None, value, note="warmup_steps > 0 overrides it, as in transformers")]
    return _warmup(value, tree, base, ratio=True)


def _verl_warmup_steps(value, tree, base) -> list[Setting]:
    if value is None or value < 0:
        return [Setting(None, value, note="-1: lr_warmup_steps_ratio sets the warm-up")]
    return _warmup(value, tree, base, ratio=False)


def _verl_warmup_ratio(value, tree, base) -> list[Setting]:
    steps = value_at(tree, _A + "optim.lr_warmup_steps")
    if steps is not None and steps >= 0:
        return [Setting(None, value, note="lr_warmup_steps >= 0 overrides it, as in verl")]
    return _warmup(value, tree, base, ratio=True)


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


def _weights(weights: Any, count: int, of: str) -> list:
    """``weights`` for ``count`` reward functions; a ConfigError in one line when they differ."""
    if weights is None:
        return [1.0] * count
    if not isinstance(weights, list) or len(weights) != count:
        raise ConfigError(
            f"reward_weights: {weights!r} is not one weight for each of the {count} reward "
            f"functions of {of}"
        )
    return weights


def _trl_reward_funcs(value, tree, base) -> list[Setting]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise Refused("a name or a list of names of reward functions")
    weights = _weights(tree.get("reward_weights"), len(names), f"reward_funcs {names}")
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


def _trl_reward_weights(value, tree, base) -> list[Setting]:
    if tree.get("reward_funcs") is not None:
        return [Setting(None, value, note="the weights of reward_funcs")]
    if base is None:
        raise Refused("weights of reward_funcs, which neither this file nor a --base names")
    functions = base.reward.functions
    weights = _weights(value, len(functions), f"--base ({[f.fn for f in functions]})")
    specs = [
        {**f.model_dump(exclude_unset=True), "weight": w}
        for f, w in zip(functions, weights, strict=True)
    ]
    return [Setting("reward.functions", specs, note="onto --base's reward functions, in order")]


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


def _verl_total_steps(value, tree, base) -> list[Setting]:
    if value is None or value <= 0:
        return [Setting(None, value, note="-1: the trainer's total_training_steps")]
    return [Setting("run.max_steps", value)]


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


def _verl_custom_reward(value, tree, base) -> list[Setting]:
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


def _verl_custom_reward_name(value, tree, base) -> list[Setting]:
    if value_at(tree, "custom_reward_function.path") is None:
        raise Refused("a function in custom_reward_function.path, which this file does not name")
    return [Setting(None, value, note="folded into custom_reward_function.path")]


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
    "max_steps": _trl_max_steps,
    "bf16": _trl_bf16,
    "fp16": _trl_fp16,
    "adam_beta1": _trl_betas,
    "adam_beta2": _trl_betas,
    "report_to": _report_to,
    "lr_scheduler_type": _lr_scheduler,
    "warmup_steps": _trl_warmup_steps,
    "warmup_ratio": _trl_warmup_ratio,
    "model_init_kwargs": _trl_model_init_kwargs,
    "trust_remote_code": _trust_remote_code,
}
_SUPERVISED: dict[str, Rule] = {
    **_TRAINING_ARGUMENTS,
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
        "reward_funcs": _trl_reward_funcs,
        "reward_weights": _trl_reward_weights,
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
        _A + "optim.lr_scheduler_type": _lr_scheduler,
        _A + "optim.warmup_style": _lr_scheduler,
        _A + "optim.lr_warmup_steps": _verl_warmup_steps,
        _A + "optim.lr_warmup_steps_ratio": _verl_warmup_ratio,
        _A + "optim.total_training_steps": _verl_total_steps,
        _A + "policy_loss.loss_mode": _loss_mode,
        "actor_rollout_ref.rollout.top_k": _verl_top_k,
        "actor_rollout_ref.model.trust_remote_code": _trust_remote_code,
        "trainer.save_freq": _verl_save_freq,
        "trainer.n_gpus_per_node": _verl_gpus,
        "trainer.logger": _report_to,
        "trainer.test_freq": _verl_test_freq,
        "trainer.total_training_steps": _verl_total_steps,
        "trainer.resume_mode": _verl_resume_mode,
        "custom_reward_function.path": _verl_custom_reward,
        "custom_reward_function.name": _verl_custom_reward_name,
    },
}
