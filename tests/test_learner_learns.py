"""The learner, fed stale groups from a plain sampling loop, learns the demo task.

It trains with the CPU demo's recipe (tests/recipes.py): the demo policy's reward rises from
chance (~0.09) by ~0.07 over 40 steps; exact match stays near 0 for that long, so the test
asserts on the reward.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path
from statistics import mean

import pytest
import recipes
from learner_rollouts import DEMO_REWARD, sample_groups, xadd_groups

from streamrl.configs import Config, load_config
from streamrl.policy.load import load_tokenizer

MAX_STEPS = 40
WINDOW = 5
GROUPS, GROUP_SIZE = 16, 16
# the sampler's (learner_rollouts.sample_groups) budget, as the demo's: the answer's 3 digits and
# the end of sequence
MAX_NEW_TOKENS = 4
# The demo preset's recipe (lr 3e-4 constant, two mini-batches a batch, pi_prox = the behaviour
# policy). The recipe this test had before (lr 1e-3, two passes over each batch, 8 tokens) rose
# by its 0.06 within 40 steps on 6 seeds of 9 and not within 80 on 2 (lr 2e-3 or 3e-3, or 4
# tokens, did not help; measured 2026-11-29): seed 0, its own, passed because a seed's run is
# deterministic.
RECIPE = recipes.DEMO | {
    "run.max_steps": 0,
    # no target: the loop below runs the steps (and DEMO_REWARD alone has no exact-match part)
    "run.target_reward": 0.0,
    "run.target_parts": {},
    "rollout.group_size": GROUP_SIZE,
    "rollout.max_new_tokens": MAX_NEW_TOKENS,
    "learner.groups_per_step": GROUPS,
}
# The reward rise between the means of the first and the last WINDOW of the MAX_STEPS steps.
# Measured 2026-11-29 on the 2-core machine under load (other helpers' pytest sessions), this
# loop over seeds 0-6 and 11 (n=8; one seed's run is deterministic, repeated runs of seed 0 gave
# the same rewards): +0.069, +0.079, +0.072, +0.076, +0.063, +0.090, +0.095, +0.076; mean
# +0.077, sd 0.011. RISE sits 4.5 sd below the mean.
RISE = 0.03


def _config(redis_cfg: Config, policy: str) -> Config:
    settings = {
        "run.name": redis_cfg.run.name,
        "run.dir": redis_cfg.run.dir,
        "broker.redis_url": redis_cfg.broker.redis_url,
        "broker.block_ms": 200,
        "model.path": policy,
        "reward.functions": [DEMO_REWARD],
        "learner.micro_batch_tokens": 4096,
        "learner.read_timeout_s": 3.0,
        "learner.checkpoint_every": 1000,
        "weightsync.transport": "none",
        "metrics.enabled": False,
        **RECIPE,
    }
    return load_config(None, settings, env={})


def learning_configs(tmp_path: Path) -> dict[str, Config]:
    """The config this module's learning assertion trains with (tests/recipes.py)."""
    return {"learns": _config(Config.model_validate({"run": {"dir": str(tmp_path)}}), "policy")}


def reward_history(cfg: Config, policy: str, seed: int) -> list[float]:
    """Mean reward of each step's groups over MAX_STEPS steps, sampled one learner step behind."""
    from streamrl.learner.grpo import GRPO

    learner = GRPO(cfg)
    tokenizer = load_tokenizer(policy)
    rng = random.Random(seed)
    # the "actor": always one learner step behind
    actor = copy.deepcopy(learner.model)
    actor_version, history = 0, []
    try:
        for _ in range(MAX_STEPS):
            groups = sample_groups(
                actor, tokenizer, rng, GROUPS, GROUP_SIZE, actor_version, MAX_NEW_TOKENS
            )
            history.append(
                sum(c.reward for g in groups for c in g.completions) / (GROUPS * GROUP_SIZE)
            )
            # the next groups come from the weights before this batch: their tokens are as stale
            # as the versions one batch publishes (learner.versions_per_batch)
            actor.load_state_dict(learner.model.state_dict())
            actor_version = learner.progress.version
            xadd_groups(cfg, groups)
            assert learner.train_next() is not None
    finally:
        learner.close()
    return history


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_reward_on_reverse_digits_rises_clearly_within_bounded_steps(redis_cfg, demo_policy):
    cfg = _config(redis_cfg, demo_policy)
    history = reward_history(cfg, demo_policy, seed=0)
    start, end = mean(history[:WINDOW]), mean(history[-WINDOW:])
    assert start < 0.15, f"the warm-started policy should be near chance, got {start:.2f}"
    assert end > start + RISE, f"reward went {start:.3f} -> {end:.3f}: {history}"
