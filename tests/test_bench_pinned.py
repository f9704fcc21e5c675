"""bench.pinned: which cores each run gets, and the section it writes from finished runs."""

from __future__ import annotations

import pytest

from bench.pinned import core_plan, section
from bench.system import WINDOW, Outcome


def test_every_run_gets_cores_no_other_run_has_and_too_few_cores_is_a_clear_error():
    plan = core_plan([0, 1, 2, 3], list(range(16)), 3)
    assert plan[0] == (0, [0, 1, 2], [12])
    assert plan[3] == (3, [9, 10, 11], [15])
    used = [c for _, system_cores, loop_cores in plan for c in system_cores + loop_cores]
    assert sorted(used) == list(range(16))
    with pytest.raises(ValueError, match="need 20 cores; this process may use 16"):
        core_plan([0, 1, 2, 3, 4], list(range(16)), 3)


def _run(seed: int, at_target: int, step_s: float, wait_s: float) -> Outcome:
    """Steps 10 s apart at reward 0.6 / exact 0.1 until step ``at_target``, then at the target."""
    steps = at_target + WINDOW
    curve = [(10.0 * (t + 1), 0.6 if t < at_target else 1.0, 0.1 if t < at_target else 1.0)
             for t in range(steps)]  # fmt: skip
    rows = [{"step_s": step_s, "wait_s": wait_s}] * steps
    return Outcome("x", seed, 900.0, curve, 500.0, 0.0, 0.0, extra={"steps": rows})


def test_the_section_has_the_time_to_target_per_seed_the_median_ratio_and_the_learners_step():
    results = [_run(0, 12, 0.19, 0.004), _run(1, 32, 0.18, 0.005)]
    reference = [_run(0, 2, 0, 0), _run(1, 22, 0, 0)]
    text = section(results, reference, 3, 2, "python -m bench.pinned --seeds 0,1")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0] == "| seed | streamrl (3 cores) | reference loop |"
    # a window of 20 steps clears 0.95 with at most 2 steps at 0.6 in it: k such steps -> at
    # step max(20, k + 18), 10 s each
    assert rows[1] == "| 0 | 300 s, 500 samples/s | 200 s, 500 samples/s |"
    assert rows[2] == "| 1 | 500 s, 500 samples/s | 400 s, 500 samples/s |"
    assert rows[3] == "| median / reference loop | 1.33× | 1.00× |"
    assert "streamrl (learner + 2 actors) on 3 cores of its own per seed" in text
    assert "seed 0: step 0.190 s, wait 0.004 s; seed 1: step 0.180 s, wait 0.005 s." in text
