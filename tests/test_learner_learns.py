"""The learner, fed stale groups from a plain sampling loop, learns the demo task.

Measured here: the demo policy's reward rises from chance (~0.10) to ~0.2 within
15-40 steps, in this learner and in a textbook synchronous GRPO loop alike;
exact match stays near 0 for that long, so the test asserts on the reward.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path
from statistics import mean

import pytest
import recipes
from learner_rollouts import DEMO_REWARD, sample_groups, xadd_groups

from streamrl.configs import Config
from streamrl.policy.load import load_tokenizer

MAX_STEPS = 40
WINDOW = 5
GROUPS, GROUP_SIZE = 16, 16
# the sampler's (learner_rollouts.sample_groups) budget, which the learner's normaliser follows
MAX_NEW_TOKENS = 8
RECIPE = recipes.RL | {
    "run.seed": 0,
    # the loop below runs the steps; the learner has no step limit (nor an LR horizon)
    "run.max_steps": 0,
    "rollout.group_size": GROUP_SIZE,
    "rollout.max_new_tokens": MAX_NEW_TOKENS,
    "learner.lr": 1e-3,
    "learner.betas": [0.9, 0.99],
    "learner.groups_per_step": GROUPS,
    "learner.updates_per_batch": 2,
}
# MEASURE
RISE = 0.06


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
    return Config.model_validate(recipes.tree(settings))


def learning_configs(tmp_path: Path) -> dict[str, Config]:
    """The config this module's learning assertion trains with (tests/recipes.py)."""
    return {"learns": _config(Config.model_validate({"run": {"dir": str(tmp_path)}}), "policy")}


def reward_history(cfg: Config, policy: str, seed: int, stop_at_rise: float | None) -> list[float]:
    """Mean reward of each step's groups, sampled one learner step behind, for up to MAX_STEPS
    steps (or until the last WINDOW steps' mean is ``stop_at_rise`` above the first's)."""
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
            # the next groups come from the weights before this batch: staleness = updates_per_batch
            actor.load_state_dict(learner.model.state_dict())
            actor_version = learner.progress.version
            xadd_groups(cfg, groups)
            assert learner.train_next() is not None
            if stop_at_rise is not None and len(history) > WINDOW and rise(history) >= stop_at_rise:
                break
    finally:
        learner.close()
    return history


def rise(history: list[float]) -> float:
    return mean(history[-WINDOW:]) - mean(history[:WINDOW])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_reward_on_reverse_digits_rises_clearly_within_bounded_steps(redis_cfg, demo_policy):
    cfg = _config(redis_cfg, demo_policy)
    history = reward_history(cfg, demo_policy, seed=0, stop_at_rise=RISE)
    start, end = mean(history[:WINDOW]), mean(history[-WINDOW:])
    print(f"LEARNING learns rise {end - start:+.4f} in {len(history)} steps")
    assert start < 0.15, f"the warm-started policy should be near chance, got {start:.2f}"
    assert end >= start + RISE, (
        f"reward went {start:.3f} -> {end:.3f} in {len(history)} steps: {history}"
    )
