"""Reward functions and how their failures are contained (``reward``)."""

from __future__ import annotations

from pydantic import Field, field_validator

from streamrl.configs.section import Section

# the ranges the built-in reward functions declare (actors.rewards.BUILTINS): all are rates
BUILTIN_REWARD_RANGES: dict[str, tuple[float, float]] = {
    name: (0.0, 1.0) for name in ("exact_match", "gsm8k", "math", "think_format", "code")
}


class RewardSpec(Section):
    """One reward function and its weight."""

    fn: str = Field(
        ...,
        description="Built-in reward (exact_match, gsm8k, math, think_format, code), or a plug-in as `module:function` or `path/to/file.py:function` taking (messages, answer, **columns) -> float | dict, or TRL's batched form (see `batched`).",
    )
    batched: bool | None = Field(
        None,
        description="TRL's batched form: fn(prompts, completions, completion_ids, **columns) -> list[float | None], every argument a list over a chunk of samples. None = read from the signature: a `prompts`, `completions` or `completion_ids` parameter and no `messages` is TRL's form; true/false force it.",
    )
    name: str | None = Field(
        None,
        description="What this function's reward parts are named in step rows, metrics and `run.target_parts` (None = `fn`).",
    )
    weight: float = Field(1.0, description="Weight of this reward in the total.")
    range: tuple[float, float] | None = Field(
        None,
        description="[low, high] the function's value and each of its parts lie in, e.g. [0, 1] for a rate. None = a built-in's declared range ([0, 1] for all of them), else [-broker.max_abs_reward, broker.max_abs_reward]. An actor scores a value outside as a failure (`invalid`); the learner dead-letters an entry whose part lies outside, and clips each step's part means to it for `run.target_parts`.",
    )
    kwargs: dict = Field(
        default_factory=dict, description="Extra keyword arguments passed to the reward function."
    )

    @field_validator("range")
    @classmethod
    def _low_to_high(cls, value):
        if value is not None and not value[0] <= value[1]:
            raise ValueError(f"range {list(value)}: low is above high")
        return value


class RewardConfig(Section):
    """Reward functions and how their failures are contained."""

    functions: list[RewardSpec] = Field(
        default_factory=list,
        description="Required (at least one). Rewards summed with their weights into the scalar reward.",
    )
    timeout_s: float = Field(
        5.0,
        gt=0,
        description="Per-sample time limit of a reward call; past it the sample scores 0 and is counted.",
    )
    workers: int = Field(1, ge=1, description="Reward worker processes per actor.")
    worker_memory_mb: int = Field(
        1024,
        ge=16,
        description="Memory a reward worker may allocate beyond its start-up size (address-space limit); past it the sample scores 0.",
    )
    max_failing_steps: int = Field(
        3,
        ge=1,
        description="The learner stops the run, printing the reward function's last exception, after this many steps in a row in which one function failed on more than half of the step's samples.",
    )
    sandbox_memory_mb: int = Field(
        512, ge=16, description="Address-space limit of the code-execution sandbox."
    )
    sandbox_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Wall-clock limit of one sandboxed program; its whole process group is killed after it.",
    )
