"""The TRL baseline's scoring and time-to-target arithmetic (the TRL run itself is a benchmark)."""

from __future__ import annotations

from bench.trl_baseline import EXACT_REWARD, score, stopped_on_eos, time_to_target

EOS_ID, DIGIT = 1, 20


def test_a_completion_that_stopped_on_eos_earns_the_stop_reward():
    # TRL decodes without special tokens and keeps the EOS id as the last completion id
    assert stopped_on_eos([DIGIT, DIGIT, DIGIT, EOS_ID], {EOS_ID})
    assert score("413", [DIGIT, DIGIT, DIGIT, EOS_ID], "413", {EOS_ID}) >= EXACT_REWARD


def test_a_truncated_completion_gets_no_stop_reward_and_is_not_exact():
    ids = [DIGIT] * 8
    assert not stopped_on_eos(ids, {EOS_ID})
    assert not stopped_on_eos([], {EOS_ID})
    reward = score("413", ids, "413", {EOS_ID})
    assert abs(reward - 0.9) < 1e-9
    assert reward < EXACT_REWARD


def test_time_to_target_is_the_first_step_where_the_five_step_means_reach_both_targets():
    curve = [(float(t), 0.5, 0.0) for t in range(1, 6)]
    curve += [(6.0, 1.0, 1.0), (7.0, 1.0, 1.0), (8.0, 1.0, 1.0), (9.0, 1.0, 1.0), (10.0, 1.0, 1.0)]
    # means over steps 6-10: reward 1.0, exact 1.0; over 5-9: reward 0.9, exact 0.8 -> reached at t=9
    assert time_to_target(curve) == 9.0
    assert time_to_target(curve[:8]) is None
    assert time_to_target([(1.0, 1.0, 0.7)] * 10) is None
