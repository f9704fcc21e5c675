"""Scoring a rolled-out group: its reward functions, and the reference policy's log-probs.

The reward functions run in the actor's reward workers (``actors.rewards``), off the event loop,
while the reference pass (``algo.reference_on: actors``) scores the same samples' tokens. A
sample's score is the reward functions' total plus its ``bonus`` parts, or the score it was given.
"""

from __future__ import annotations

import asyncio
import time

from streamrl.actors import metrics
from streamrl.actors.group import Group, Sample
from streamrl.actors.reference import ReferenceScorer
from streamrl.actors.rewards import RewardPool, Score


class Scorer:
    def __init__(self, rewards: RewardPool, reference: ReferenceScorer | None = None) -> None:
        self.rewards = rewards
        self.reference = reference

    async def score(self, group: Group) -> list[Score]:
        """One score per sample of ``group``; its reference log-probs are attached to it."""
        asked = [s.reward_input for s in group.samples if s.reward_input is not None]
        scored, _ = await asyncio.gather(
            asyncio.to_thread(self.rewards.score, asked) if asked else _nothing(),
            self._score_reference(group),
        )
        computed = iter(scored)
        return [
            _total(s, next(computed)) if s.reward_input is not None else s.score
            for s in group.samples
        ]

    async def _score_reference(self, group: Group) -> None:
        if self.reference is None:
            return
        start = time.monotonic()
        prompts = [group.prompt_token_ids] * len(group.samples)
        completions = [s.output.token_ids for s in group.samples]
        group.ref_logprobs = await asyncio.to_thread(self.reference.logprobs, prompts, completions)
        metrics.REFERENCE_SECONDS.inc(time.monotonic() - start)

    def close(self) -> None:
        self.rewards.close()


def _total(sample: Sample, score: Score) -> Score:
    if not sample.bonus:
        return score
    total = score.total + sum(sample.bonus.values())
    return Score(total, {**score.parts, **sample.bonus}, score.failures)


async def _nothing() -> list:
    return []
