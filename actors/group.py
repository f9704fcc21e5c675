"""A group in flight, from its admission lease to its publication: one prompt, G samples.

A rollout source fills the samples (``Sample``: an engine ``Output`` and what its reward is
made of); ``actors.scoring`` scores them and ``actors.publish`` sends the group to the stream.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from streamrl.actors.engines.base import Output
from streamrl.actors.prompt_data import Prompt
from streamrl.actors.rewards import RewardInput, Score


@dataclass
class Sample:
    """One completion (or trajectory) of a group and what its reward is made of."""

    output: Output
    # what the reward functions see; None: ``score`` is given and they are not called
    reward_input: RewardInput | None
    # a given score (an agent's reported reward, a truncated trajectory's ``env.truncated_reward``)
    score: Score | None = None
    # reward parts added to the reward functions' total (an environment's rewards: ``env``)
    bonus: dict[str, float] = field(default_factory=dict)


@dataclass
class Group:
    """A group in flight: its lease, prompt and, once rolled out, its samples."""

    lease_id: str
    prompt: Prompt
    samples: list[Sample] = field(default_factory=list)
    # the prompt's token ids as the samples continue them, when they are not ``prompt.token_ids``
    # (a multi-turn trajectory's rendered first messages, an agent's first call)
    prompt_tokens: list[int] | None = None
    # per-group statistics of an environment's trajectories (``broker.env_stats``)
    env: dict[str, float] = field(default_factory=dict)
    # the reference policy's log-probs per sample (``algo.reference_on: actors``)
    ref_logprobs: list[np.ndarray] | None = None
    # resolved with whether the group was published, for a source that waits to know (agents)
    outcome: asyncio.Future | None = None

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.prompt.token_ids if self.prompt_tokens is None else self.prompt_tokens

    @property
    def outputs(self) -> list[Output]:
        return [s.output for s in self.samples]

    def settle(self, published: bool) -> None:
        if self.outcome is not None and not self.outcome.done():
            self.outcome.set_result(published)
