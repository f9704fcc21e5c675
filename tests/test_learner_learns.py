"""The learner, fed stale groups from a plain sampling loop, learns the demo task.

Measured here: the demo policy's reward rises from chance (~0.10) to ~0.2 within
15-40 steps, in this learner and in a textbook synchronous GRPO loop alike;
exact match stays near 0 for that long, so the test asserts on the reward.
"""

from __future__ import annotations

import copy
import random
from statistics import mean

import pytest
from learner_rollouts import sample_groups, xadd_groups
from test_learner_sync import learner_config

from streamrl.policy.load import load_tokenizer

MAX_STEPS = 40
WINDOW = 5
# ~6 standard errors of a 5-step mean of 256 rewards
RISE = 0.06


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_reward_on_reverse_digits_rises_clearly_within_bounded_steps(redis_cfg, demo_policy):
    from streamrl.learner.grpo import GRPO

    cfg = learner_config(
        redis_cfg,
        demo_policy,
        learner={
            "groups_per_step": 16,
            "updates_per_batch": 2,
            "micro_batch_tokens": 4096,
            "lr": 1e-3,
        },
        algo={"max_staleness": 2},
        rollout={"group_size": 16},
    )
    learner = GRPO(cfg)
    tokenizer = load_tokenizer(demo_policy)
    rng = random.Random(0)
    # the "actor": always one learner step behind
    actor = copy.deepcopy(learner.model)
    actor_version, history = 0, []
    try:
        for _ in range(MAX_STEPS):
            groups = sample_groups(actor, tokenizer, rng, 16, 16, version=actor_version)
            history.append(sum(c.reward for g in groups for c in g.completions) / (16 * 16))
            # the next groups come from the weights before this batch: staleness = updates_per_batch
            actor.load_state_dict(learner.model.state_dict())
            actor_version = learner.progress.version
            xadd_groups(cfg, groups)
            row = learner.train_next()
            assert row is not None
            if len(history) > WINDOW and mean(history[-WINDOW:]) >= mean(history[:WINDOW]) + RISE:
                break
    finally:
        learner.close()
    start, end = mean(history[:WINDOW]), mean(history[-WINDOW:])
    assert start < 0.15, f"the warm-started policy should be near chance, got {start:.2f}"
    assert end >= start + RISE, (
        f"reward went {start:.3f} -> {end:.3f} in {len(history)} steps: {history}"
    )
