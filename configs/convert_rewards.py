"""The rules of ``convert`` for rewards: TRL's reward functions with their weights (or the
weights alone, onto the base's functions), verl's reward file. A weight count that differs from
the functions' is a ConfigError in one line: the file cannot be read as meant."""

from __future__ import annotations

from typing import Any

from streamrl.configs.convert_types import Refused, Setting, value_at
from streamrl.configs.errors import ConfigError
from streamrl.configs.reward import BUILTIN_REWARD_RANGES


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


def trl_reward_funcs(value, tree, base) -> list[Setting]:
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


def trl_reward_weights(value, tree, base) -> list[Setting]:
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


def verl_custom_reward(value, tree, base) -> list[Setting]:
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


def verl_custom_reward_name(value, tree, base) -> list[Setting]:
    if value_at(tree, "custom_reward_function.path") is None:
        raise Refused("a function in custom_reward_function.path, which this file does not name")
    return [Setting(None, value, note="folded into custom_reward_function.path")]
