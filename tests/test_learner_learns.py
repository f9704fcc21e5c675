"""The learner, fed one-version-stale groups from a plain sampling loop, learns the demo task."""

from __future__ import annotations

import copy
import random

import pytest
from learner_rollouts import exact_match, sample_groups, xadd_groups
from test_learner_sync import learner_config

from weightsync.policy import load_tokenizer

MAX_STEPS = 60
WINDOW = 5


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_exact_match_on_reverse_digits_rises_from_chance(redis_cfg, demo_policy):
    from learner.loop import Learner

    cfg = learner_config(
        redis_cfg,
        demo_policy,
        learner={"groups_per_step": 16, "updates_per_batch": 2, "micro_batch_tokens": 4096},
        algo={"max_staleness": 2},
    )
    learner = Learner(cfg)
    tokenizer = load_tokenizer(demo_policy)
    rng = random.Random(0)
    actor = copy.deepcopy(learner.model)  # the "actor": always one learner step behind
    actor_version, history = 0, []
    try:
        for _ in range(MAX_STEPS):
            groups = sample_groups(actor, tokenizer, rng, 16, 16, version=actor_version)
            history.append(exact_match(groups))
            # the next groups come from the weights before this batch: staleness = updates_per_batch
            actor.load_state_dict(learner.model.state_dict())
            actor_version = learner.progress.version
            xadd_groups(cfg, groups)
            row = learner.train_next()
            assert row is not None
            if len(history) > WINDOW and sum(history[-WINDOW:]) / WINDOW >= 0.5:
                break
    finally:
        learner.close()
    start, end = sum(history[:WINDOW]) / WINDOW, sum(history[-WINDOW:]) / WINDOW
    assert start < 0.1, f"the warm-started policy should be near chance, got {start:.2f}"
    assert end >= 0.5, f"exact match went {start:.2f} -> {end:.2f} in {len(history)} steps: {history}"
