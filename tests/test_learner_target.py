"""The learner stops at ``run.target_*``: the means of the last ``target_window`` steps reach the bars."""

from __future__ import annotations

import random

import pytest
from learner_rollouts import sample_groups, xadd_groups
from test_learner_sync import GROUPS, learner_config

from learner.target import first_reached, window_reached
from weightsync.policy import load_policy, load_tokenizer

WINDOW, BATCHES = 3, 6


def test_the_window_needs_every_bar_and_enough_steps():
    assert not window_reached([1.0, 1.0], [1.0, 1.0], 0.9, 0.8, 3)
    assert window_reached([0.0, 1.0, 1.0, 1.0], [0.0, 0.9, 0.9, 0.9], 0.9, 0.8, 3)
    assert not window_reached([1.0, 1.0, 1.0], [0.9, 0.9, 0.5], 0.9, 0.8, 3)
    # windows end at 2 (mean 0.83) and 3 (mean 1.0)
    assert first_reached([0.5, 1.0, 1.0, 1.0, 1.0], [1.0] * 5, 0.9, 0.0, 3) == 3
    assert first_reached([0.5] * 5, [1.0] * 5, 0.9, 0.0, 3) is None


@pytest.mark.timeout(180)
def test_the_learner_stops_once_the_last_window_of_steps_reaches_the_target(redis_cfg, demo_policy):
    from learner.loop import Learner

    tokenizer, model = load_tokenizer(demo_policy), load_policy(demo_policy)
    rng = random.Random(0)
    for _ in range(BATCHES):
        xadd_groups(redis_cfg, sample_groups(model, tokenizer, rng, GROUPS, 8, version=0))
    cfg = learner_config(
        redis_cfg,
        demo_policy,
        # the warmed policy's reward (~0.1-0.2) clears 0.01 from the first step: the window decides
        run={"target_reward": 0.01, "target_window": WINDOW},
        algo={"max_staleness": 100, "skip_zero_variance": False},
    )
    lines: list[str] = []
    progress = Learner(cfg).run(echo=lines.append)
    assert progress.step == WINDOW, lines
    assert lines[-1].startswith("target reached"), lines
