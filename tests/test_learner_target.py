"""The learner stops at ``run.target_*``: the means of the last ``target_window`` steps reach the bars."""

from __future__ import annotations

import random

import pytest
from learner_rollouts import sample_groups, xadd_groups
from test_learner_sync import GROUPS, learner_config

from streamrl.configs import load_config
from streamrl.learner.target import bars, describe, first_reached, measures, window_reached
from streamrl.policy.load import load_policy, load_tokenizer

WINDOW, BATCHES = 3, 6


def rows(rewards: list[float], exact: list[float]) -> list[dict[str, float]]:
    return [{"reward": r, "x_exact": e} for r, e in zip(rewards, exact, strict=True)]


def test_the_window_needs_every_bar_and_enough_steps():
    bars = {"reward": 0.9, "x_exact": 0.8}
    assert not window_reached(rows([1.0, 1.0], [1.0, 1.0]), bars, 3)
    assert window_reached(rows([0.0, 1.0, 1.0, 1.0], [0.0, 0.9, 0.9, 0.9]), bars, 3)
    assert not window_reached(rows([1.0, 1.0, 1.0], [0.9, 0.9, 0.5]), bars, 3)
    # a part the steps do not report never reaches its bar
    assert not window_reached(rows([1.0] * 3, [1.0] * 3), {"reward": 0.9, "other": 0.1}, 3)
    # windows end at 2 (mean 0.83) and 3 (mean 1.0)
    assert first_reached(rows([0.5, 1.0, 1.0, 1.0, 1.0], [1.0] * 5), {"reward": 0.9}, 3) == 3
    assert first_reached(rows([0.5] * 5, [1.0] * 5), {"reward": 0.9}, 3) is None


def test_the_bars_are_the_reward_and_the_named_parts_a_zero_bar_is_none():
    run = load_config(
        "configs/demo_cpu.yaml", ["run.target_parts.reverse_digits/stop=0"], env={}
    ).run
    assert bars(run) == {"reward": 0.95, "reverse_digits_exact": 0.85}
    assert describe(run) == "20-step means of reward >= 0.95 and reverse_digits_exact >= 0.85"
    row = {"reward_mean": 0.5, "reward_parts": {"reverse_digits_exact": 0.25}}
    assert measures(row, {}) == {"reward": 0.5, "reverse_digits_exact": 0.25}


def test_one_extreme_group_does_not_reach_the_target():
    cfg = load_config("configs/demo_cpu.yaml", [], env={})
    run, ranges = cfg.run, cfg.reward_ranges
    honest = {"reward_mean": 0.5, "reward_parts": {"reverse_digits_exact": 0.5}}
    # a fuzz's group under the old bound of 1e6: alone, it ended the demo as "target reached"
    hostile = {"reward_mean": 9.9e5, "reward_parts": {"reverse_digits_exact": 9.9e5}}
    window = [honest] * (run.target_window - 1) + [hostile]
    assert window_reached([measures(r, {}) for r in window], bars(run), run.target_window)
    clipped = [measures(r, ranges) for r in window]
    assert clipped[-1] == {"reward": 1.0, "reverse_digits_exact": 1.0}
    assert not window_reached(clipped, bars(run), run.target_window)
    # one step moves the window's mean by at most its share of the range: (1 - 0.5) / 20
    assert window_reached(clipped, {"reward": 0.5 + 0.5 / run.target_window}, run.target_window)


def test_the_summary_the_benchmarks_and_the_learner_judge_one_extreme_group_alike():
    """Whoever says "target reached" clips each step to its declared range: the end-of-run summary,
    the live view's stop time, the benchmarks' stop rule and curves, and the learner."""
    from bench.multiturn import outcome
    from bench.system import curve_of
    from streamrl.launch.status import time_to_target
    from streamrl.launch.view import summary
    from streamrl.learner.target import Target

    cfg = load_config("configs/demo_cpu.yaml", [], env={})
    honest = {"reward_mean": 0.5, "reward_parts": {"reverse_digits_exact": 0.5}}
    hostile = {"reward_mean": 9.9e5, "reward_parts": {"reverse_digits_exact": 9.9e5}}
    window = [honest] * (cfg.run.target_window - 1) + [hostile]
    steps = [{**row, "step": i, "version": i, "time": 1000.0 + i} for i, row in enumerate(window)]
    goal = Target.of(cfg.run, cfg.reward_ranges)
    assert Target(goal.bars, goal.window, {}).reached_at(steps) is not None  # unclipped, it would
    assert goal.reached_at(steps) is None
    assert not goal.reached([goal.measures(s) for s in steps])
    assert time_to_target(steps, 1000.0, goal) is None
    assert "target               20-step means" in (text := summary(steps, 1000.0, 20.0, [], cfg))
    assert "not reached" in text
    assert outcome({"started": 1000.0, "steps": steps}, goal)["seconds"] is None
    curve = curve_of(steps, 1000.0, "reverse_digits_exact", cfg.reward_ranges)
    assert curve[-1][1:] == (1.0, 1.0)


@pytest.mark.timeout(180)
def test_the_learner_stops_once_the_last_window_of_steps_reaches_the_target(redis_cfg, demo_policy):
    from streamrl.learner.grpo import GRPO

    tokenizer, model = load_tokenizer(demo_policy), load_policy(demo_policy)
    rng = random.Random(0)
    for _ in range(BATCHES):
        xadd_groups(redis_cfg, sample_groups(model, tokenizer, rng, GROUPS, 8, version=0))
    cfg = learner_config(
        redis_cfg,
        demo_policy,
        # the warmed policy's reward (~0.1-0.2) and its position part clear 0.01 from the first
        # step: the window decides (a part the step rows did not report would never clear it)
        run={
            "target_reward": 0.01,
            "target_parts": {"reverse_digits/position": 0.01},
            "target_window": WINDOW,
        },
        algo={"max_staleness": 100, "skip_zero_variance": False},
    )
    lines: list[str] = []
    progress = GRPO(cfg).run(echo=lines.append)
    assert progress.step == WINDOW, lines
    assert lines[-1].startswith(
        "target reached: 3-step means of reward >= 0.01 and reverse_digits/position >= 0.01"
    ), lines
