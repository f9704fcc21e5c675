"""bench.multiturn's reading of a run: time and steps to the target, and the second turn's share."""

from __future__ import annotations

import pytest

from bench.multiturn import outcome
from streamrl.learner.target import Target

GOAL = Target({"reverse_digits_exact": 0.85}, window=3, ranges={"reverse_digits_exact": (0.0, 1.0)})


def _row(step: int, exact: float, second: float) -> dict:
    return {
        "step": step,
        "time": 100.0 + step,
        "reward_mean": exact,
        "reward_parts": {"reverse_digits_exact": exact, "second_turn_exact": second},
        "env": {"turns": 1.5},
    }


def test_the_target_is_the_end_of_the_first_window_reaching_the_bars():
    rows = [_row(i, 0.5, 0.1) for i in range(1, 11)] + [_row(i, 0.9, 0.3) for i in range(11, 15)]
    got = outcome({"started": 100.0, "steps": rows}, GOAL)
    assert (got["step"], got["seconds"]) == (13, 13.0)
    assert got["exact"] == pytest.approx(0.9) and got["second_share"] == pytest.approx(1 / 3)
    assert got["turns"] == pytest.approx(1.5)


def test_a_run_that_misses_reports_its_last_window():
    rows = [_row(i, 0.5, 0.25) for i in range(1, 11)]
    got = outcome({"started": 100.0, "steps": rows}, GOAL)
    assert got["step"] is None and got["seconds"] is None
    assert got["exact"] == pytest.approx(0.5) and got["second_share"] == pytest.approx(0.5)
