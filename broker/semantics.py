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

from dataclasses import dataclass

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

    @classmethod
    def from_config(
        cls,
        rollout: RolloutConfig,
        broker: BrokerConfig,
        algo: AlgoConfig,
        completion_limit: tuple[str, int],
    ) -> Limits:
        """``completion_limit``: the knob that bounds one completion and its value
        (``Config.completion_limit``)."""
        key, tokens = completion_limit
        return cls(
            group_size=rollout.group_size,
            max_completion_tokens=tokens,
            max_prompt_tokens=rollout.max_prompt_tokens,
            max_abs_reward=broker.max_abs_reward,
            needs_ref_logprobs=algo.actors_score_reference,
            completion_key=key,
        )


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
        if abs(completion.reward) > limits.max_abs_reward:
            raise WireError(
                f"completion[{i}].r: reward {completion.reward!r} exceeds "
                f"broker.max_abs_reward={limits.max_abs_reward}"
            )
        for name, value in completion.reward_parts.items():
            if abs(value) > limits.max_abs_reward:
                raise WireError(
                    f"completion[{i}].rp[{name!r}]: {value!r} exceeds "
                    f"broker.max_abs_reward={limits.max_abs_reward}"
                )
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


def is_stale(learner_version, token_version, max_staleness):
    """Whether a token sampled by policy ``token_version`` is too old to train on once the learner
    is at ``learner_version``: more than ``max_staleness`` versions behind it.

    The one staleness test of the system (learner masks and drops, actors wait, admission bounds);
    elementwise on ints, numpy arrays and torch tensors alike.
    """
    # stale = v_learner - v_token > S
    return learner_version - token_version > max_staleness
