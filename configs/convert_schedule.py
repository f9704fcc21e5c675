"""The rules of ``convert`` that read a run's length: a decaying LR schedule with its step
count, a warm-up in steps or as a share of the run, the step count itself. streamrl counts
``run.max_steps`` learner steps of ``learner.minibatches`` x ``learner.updates_per_batch``
optimizer steps; a warm-up keeps its share of the schedule."""

from __future__ import annotations

import math

from streamrl.configs.convert_types import VERL_ACTOR as _A
from streamrl.configs.convert_types import Refused, Setting, Status, value_at
from streamrl.configs.learner import LearnerConfig
from streamrl.configs.schema import Config

_LEARNER_DEFAULTS = LearnerConfig()

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


def lr_scheduler(value, tree, base) -> list[Setting]:
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


def _optimizer_steps(tree: dict, base: Config | None, supervised: bool) -> tuple[int, int]:
    """(learner.minibatches, learner.updates_per_batch) of the converted run; an SFT or DPO
    step is one optimizer step."""
    if supervised:
        return (1, 1)
    learner = (base.learner if base is not None else None) or _LEARNER_DEFAULTS
    updates = tree.get("num_iterations") or value_at(tree, _A + "ppo_epochs")
    groups = value_at(tree, "data.train_batch_size")
    mini = value_at(tree, _A + "ppo_mini_batch_size")
    minibatches = groups // mini if groups and mini and groups % mini == 0 else None
    return (minibatches or learner.minibatches, updates or learner.updates_per_batch)


def _warmup(
    steps: int | float, tree: dict, base: Config | None, ratio: bool, supervised: bool = False
) -> list[Setting]:
    """learner.warmup_steps for a warm-up of ``steps`` foreign steps, or of a ``ratio`` of the
    run: the same share of the schedule, in optimizer steps."""
    minibatches, updates = _optimizer_steps(tree, base, supervised)
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


def trl_warmup_steps(value, tree, base, supervised: bool = False) -> list[Setting]:
    if isinstance(value, float) and 0 < value < 1:
        # transformers 5: a float under 1 is a ratio of the run
        return _warmup(value, tree, base, True, supervised)
    if value == 0 and (tree.get("warmup_ratio") or 0) > 0:
        return [Setting(None, value, note="0: warmup_ratio sets the warm-up")]
    return _warmup(value, tree, base, False, supervised)


def trl_warmup_ratio(value, tree, base, supervised: bool = False) -> list[Setting]:
    if (tree.get("warmup_steps") or 0) >= 1:
        return [Setting(None, value, note="warmup_steps > 0 overrides it, as in transformers")]
    return _warmup(value, tree, base, True, supervised)


def verl_warmup_steps(value, tree, base) -> list[Setting]:
    if value is None or value < 0:
        return [Setting(None, value, note="-1: lr_warmup_steps_ratio sets the warm-up")]
    return _warmup(value, tree, base, ratio=False)


def verl_warmup_ratio(value, tree, base) -> list[Setting]:
    steps = value_at(tree, _A + "optim.lr_warmup_steps")
    if steps is not None and steps >= 0:
        return [Setting(None, value, note="lr_warmup_steps >= 0 overrides it, as in verl")]
    return _warmup(value, tree, base, ratio=True)


def verl_total_steps(value, tree, base) -> list[Setting]:
    if value is None or value <= 0:
        return [Setting(None, value, note="-1: the trainer's total_training_steps")]
    return [Setting("run.max_steps", value)]


def trl_max_steps(value, tree, base) -> list[Setting]:
    if value <= 0:
        raise Refused(f"{value}: train num_train_epochs; streamrl stops at run.max_steps")
    return [Setting("run.max_steps", value)]
