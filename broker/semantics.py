"""What a well-formed rollout group may mean: the checks ``broker.wire`` cannot make alone.

``decode_group`` checks types and sizes; a peer can still write a valid entry that
poisons training (a completion longer than the actors may sample, a group of the
wrong size, token versions from the future that read as negative staleness,
rewards so large the advantages overflow, a prompt far past the dataset's, no reference
log-probs where the actors were to send them). The
consumer calls ``check_group`` with limits from the config and the highest
version the learner knows was announced, and dead-letters what fails, with the
reason. Pure: no Redis, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from streamrl.broker.wire import RolloutGroup, WireError
from streamrl.configs.schema import AlgoConfig, BrokerConfig, RolloutConfig


@dataclass(frozen=True)
class Limits:
    group_size: int
    max_completion_tokens: int
    max_prompt_tokens: int
    max_abs_reward: float
    # algo.reference_on: actors with a KL term: every completion carries reference log-probs
    needs_ref_logprobs: bool = False
    # the knob max_completion_tokens comes from: a multi-turn trajectory's limit is
    # env.max_total_tokens, an agent's agent.max_total_tokens
    completion_key: str = "rollout.max_new_tokens"
    # measure -> [low, high] (``Config.reward_ranges``): "reward" bounds the total, a function's
    # part name its parts (``name`` and ``name/key``); a part named in none keeps max_abs_reward
    ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def from_config(
        cls,
        rollout: RolloutConfig,
        broker: BrokerConfig,
        algo: AlgoConfig,
        completion_limit: tuple[str, int],
        ranges: Mapping[str, tuple[float, float]] | None = None,
    ) -> Limits:
        """``completion_limit``: the knob that bounds one completion and its value
        (``Config.completion_limit``); ``ranges``: ``Config.reward_ranges``."""
        key, tokens = completion_limit
        return cls(
            group_size=rollout.group_size,
            max_completion_tokens=tokens,
            max_prompt_tokens=rollout.max_prompt_tokens,
            max_abs_reward=broker.max_abs_reward,
            needs_ref_logprobs=algo.actors_score_reference,
            completion_key=key,
            ranges=dict(ranges or {}),
        )

    def range_of(self, measure: str) -> tuple[float, float]:
        """The range of the total (``reward``) or of a reward part, by its name."""
        found = self.ranges.get(measure) or self.ranges.get(measure.partition("/")[0])
        return found or (-self.max_abs_reward, self.max_abs_reward)


def check_group(group: RolloutGroup, limits: Limits, max_version: int | None = None) -> None:
    """Raise ``WireError`` naming the first limit ``group`` breaks; ``max_version=None`` skips versions."""
    if len(group.completions) != limits.group_size:
        raise WireError(
            f"group: {len(group.completions)} completions, rollout.group_size is {limits.group_size}"
        )
    if len(group.prompt_token_ids) > limits.max_prompt_tokens:
        raise WireError(
            f"group.prompt: {len(group.prompt_token_ids)} tokens exceeds "
            f"rollout.max_prompt_tokens={limits.max_prompt_tokens}"
        )
    for i, completion in enumerate(group.completions):
        if len(completion) > limits.max_completion_tokens:
            raise WireError(
                f"completion[{i}]: {len(completion)} tokens exceeds "
                f"{limits.completion_key}={limits.max_completion_tokens}"
            )
        _check_range(completion.reward, limits.range_of("reward"), f"completion[{i}].r: reward")
        for name, value in completion.reward_parts.items():
            _check_range(value, limits.range_of(name), f"completion[{i}].rp[{name!r}]:")
        if limits.needs_ref_logprobs and completion.ref_logprobs is None:
            raise WireError(
                f"completion[{i}]: no reference log-probs (rlp), which algo.reference_on=actors "
                "needs for the KL term"
            )
        if max_version is not None and int(completion.versions.max()) > max_version:
            raise WireError(
                f"completion[{i}].ver: policy version {int(completion.versions.max())} was never "
                f"announced (the learner is at {max_version})"
            )


def _check_range(value: float, bounds: tuple[float, float], what: str) -> None:
    low, high = bounds
    # the actor sums weighted parts in float64: a total at its bound may round past it
    slack = 1e-9 * max(1.0, abs(low), abs(high))
    if not low - slack <= value <= high + slack:
        raise WireError(
            f"{what} {value!r} outside its range [{low:g}, {high:g}] (reward.functions[].range, "
            f"broker.max_abs_reward)"
        )


def is_stale(learner_version, token_version, max_staleness):
    """Whether a token sampled by policy ``token_version`` is too old to train on once the learner
    is at ``learner_version``: more than ``max_staleness`` versions behind it.

    The one staleness test of the system (learner masks and drops, actors wait, admission bounds);
    elementwise on ints, numpy arrays and torch tensors alike.
    """
    # stale = v_learner - v_token > S
    return learner_version - token_version > max_staleness
