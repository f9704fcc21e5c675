"""What a rollout source is: it turns admitted groups into rolled-out groups, and what it works with.

A source's ``groups(admit)`` is an async iterator: it asks ``admit`` for groups (a lease and a
prompt each), has the engine roll them out and yields each group once its G samples are done;
the actor scores and publishes it (``actors.loop``). A group it gives up is released through
``admit``. ``from_config`` names the config sections it reads as keyword-only parameters.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import ClassVar

from streamrl.actors import metrics
from streamrl.actors.admit import Admit
from streamrl.actors.engines.base import Engine, Output, SamplingParams
from streamrl.actors.group import Group
from streamrl.actors.prompt_data import Prompt
from streamrl.actors.rewards import RewardInput
from streamrl.actors.trajectory import assistant_turn


@dataclass
class Generation:
    """What every source generates with."""

    engine: Engine
    actor_id: str
    # the run's sampling (``rollout.*``), with the policy's stop tokens
    params: SamplingParams
    # shows the reward functions and environments the completions as text
    tokenizer: object
    group_size: int
    # ``rollout.chat_template_kwargs``, for every chat template a source renders
    chat_template_kwargs: dict = field(default_factory=dict)
    # sampled tokens per second of the last generation (the heartbeat reports it)
    tokens_per_s: float = 0.0

    def assistant_turn(self, output: Output) -> dict:
        return assistant_turn(self.tokenizer, output)

    def reward_input(self, prompt: Prompt, output: Output) -> RewardInput:
        """What the reward functions see of one completion of ``prompt``."""
        return RewardInput(
            prompt.messages + [self.assistant_turn(output)],
            prompt.answer,
            prompt.columns,
            prompt.conversational,
            output.token_ids.tolist(),
        )

    def generated(self, tokens: int, started: float) -> None:
        """A generation that began at ``started`` (``time.monotonic``) sampled ``tokens``."""
        elapsed = time.monotonic() - started
        metrics.GENERATE_SECONDS.inc(elapsed)
        self.tokens_per_s = tokens / max(elapsed, 1e-9)


class Source(ABC):
    """One way of rolling groups out, registered by ``name`` in ``actors.sources``."""

    name: ClassVar[str]
    # a group that cannot be published is dropped and the source serves on (its callers are
    # other programs), instead of ending the actor so its supervisor restarts it
    serves_on: ClassVar[bool] = False

    @abstractmethod
    def groups(self, admit: Admit) -> AsyncIterator[Group]:
        """Rolled-out groups, until ``admit`` says the actor is stopping."""

    def close(self) -> None:  # noqa: B027 - most sources hold nothing
        """Release what the source holds."""
