"""``algo.max_staleness: auto``'s controller (``learner.staleness_control``) on synthetic drift
traces: it decides as a plain reference that recomputes every decision from the whole history,
stays within ``[min, max]``, raises the bound while the drift stays under the target, lowers it
when the drift grows, and does not oscillate.

Oscillation, measured: the direction changes of the bound (a raise after a lowering or the other
way round) over a trace.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.learner.staleness_control import (
    MAX_RETRY_STEPS,
    RETRY_STEPS,
    DriftTarget,
    decide,
    start,
)

TARGET = DriftTarget(ess_floor=0.9, lowest=0, highest=8, window=4)


def direction_changes(bounds: list[int]) -> int:
    moves = [b - a for a, b in pairwise(bounds) if b != a]
    return sum(1 for x, y in pairwise(moves) if (x > 0) != (y > 0))


# ESS of the step at t, given the bounds decided before it, and the run's random source
Drift = Callable[[int, list[int], random.Random], float]


def run(target: DriftTarget, drift: Drift, steps: int, seed: int = 0) -> list[int]:
    """The bound after each step of a trace."""
    rng, state, bounds = random.Random(seed), start(target), []
    for t in range(steps):
        bound, state, _ = decide(drift(t, bounds, rng), state, target)
        bounds.append(bound)
    return bounds


def noisy(level: float, sigma: float) -> Drift:
    """A drift that does not depend on the bound: ESS ``level`` plus noise."""
    return lambda t, bounds, rng: min(1.0, level + rng.gauss(0.0, sigma))


def growing(per_version: float, sigma: float = 0.02, base: float = 0.01) -> Drift:
    """A drift that grows with the bound: the deficit 1 - ESS is ``base + per_version`` x the
    bound the step's data was admitted under (as many steps back as the bound)."""

    def ess(t: int, bounds: list[int], rng: random.Random) -> float:
        lag = bounds[-1] if bounds else 0
        admitted = bounds[-1 - lag] if len(bounds) > lag else 0
        return min(1.0, 1.0 - base - per_version * admitted + rng.gauss(0.0, sigma))

    return ess


def reference(trace: list[float], target: DriftTarget) -> list[int]:
    """The controller's rule (the module doc) recomputed from the whole history at every step."""
    bound, finite, changes, bounds = target.lowest, [], [], []
    for ess in trace:
        if math.isfinite(ess):
            finite.append(ess)
            bound = _reference_decision(finite, changes, bound, target)
        bounds.append(bound)
    return bounds


def _reference_decision(finite, changes, bound, target):
    """changes: (the reading it was decided on, from, to), appended to when the bound moves."""
    at, before, after = changes[-1] if changes else (0, bound, bound)
    settle = math.ceil(max(before, after) / target.versions_per_batch) if changes else 0
    since = finite[at + settle :]
    if len(since) < target.window:
        return bound
    deficit = 1.0 - sum(since[-target.window :]) / target.window
    allowed = 1.0 - target.ess_floor
    new = bound
    if deficit > allowed and bound > target.lowest:
        first_window = len(since) == target.window
        new = bound - 1 if changes and after > before and first_window else bound // 2
        new = max(new, target.lowest)
    elif deficit <= allowed and bound < target.highest:
        if deficit * (bound + 1) / max(bound, 1) <= allowed and _may_retry(
            finite, changes, bound + 1
        ):
            new = bound + 1
    if new != bound:
        changes.append((len(finite), bound, new))
    return new


def _may_retry(finite, changes, bound) -> bool:
    """Whether ``bound`` is not lowered from, or its wait is over."""
    lowerings = []
    for at, before, after in changes:
        if before == bound and after < before:
            lowerings.append(at)
        if before == bound and after > before:
            lowerings = []
    if not lowerings:
        return True
    wait = min(RETRY_STEPS * 2 ** (len(lowerings) - 1), MAX_RETRY_STEPS)
    return len(finite) - lowerings[-1] >= wait


# piecewise-constant ESS levels with noise, and steps that trained nothing (NaN)
segments = st.lists(
    st.tuples(st.floats(0.5, 1.0), st.integers(1, 60), st.floats(0.0, 0.08)),
    min_size=1,
    max_size=8,
)
targets = st.builds(
    lambda floor, low, span, window, vpb: DriftTarget(floor, low, low + span, window, vpb),
    st.floats(0.6, 0.98),
    st.integers(0, 3),
    st.integers(0, 9),
    st.integers(1, 6),
    st.integers(1, 3),
)


def trace_of(parts, seed: int) -> list[float]:
    rng = random.Random(seed)
    out = []
    for level, length, sigma in parts:
        for _ in range(length):
            out.append(math.nan if rng.random() < 0.03 else min(1.0, rng.gauss(level, sigma)))
    return out


@settings(max_examples=150, deadline=None)
@given(parts=segments, target=targets, seed=st.integers(0, 10**6))
def test_the_controller_decides_as_the_plain_reference_and_stays_within_min_and_max(
    parts, target, seed
):
    trace = trace_of(parts, seed)
    state, bounds = start(target), []
    for ess in trace:
        bound, state, reason = decide(ess, state, target)
        assert reason
        bounds.append(bound)
    assert bounds == reference(trace, target)
    assert all(target.lowest <= b <= target.highest for b in bounds)


def test_a_drift_well_under_the_target_raises_the_bound_to_max_without_turning_back():
    for seed in range(5):
        bounds = run(TARGET, noisy(0.97, sigma=0.02), 600, seed)
        assert bounds[-1] == TARGET.highest
        assert direction_changes(bounds) == 0


def test_a_drift_over_the_target_keeps_the_bound_at_min():
    for seed in range(5):
        assert set(run(TARGET, noisy(0.8, sigma=0.02), 600, seed)) == {TARGET.lowest}


def test_a_noisy_drift_right_at_the_target_turns_the_bound_only_on_probes_that_thin_out():
    """The worst case of a threshold: every decision a coin flip. A controller without memory
    of failed probes turns once per couple of windows (hundreds of times here); this one probes
    a bound that failed after waits doubling up to MAX_RETRY_STEPS, two turns per probe."""
    steps = 4000
    doublings = math.log2(MAX_RETRY_STEPS / RETRY_STEPS) + 1
    for seed in range(5):
        bounds = run(TARGET, noisy(0.9, sigma=0.03), steps, seed)
        assert direction_changes(bounds) <= 2 * (doublings + steps / MAX_RETRY_STEPS)
        assert max(bounds) <= 1


def test_a_drift_that_grows_with_the_bound_settles_under_the_target_and_probes_rarely():
    """Deficit 0.01 + 0.03 x bound: 2 is the largest bound under the allowed 0.1 with room to
    spare, 3 sits on it, 4 is over."""
    for seed in range(5):
        bounds = run(TARGET, growing(0.03), 4000, seed)
        late = bounds[1000:]
        assert max(late) <= 3
        assert late.count(2) >= 0.9 * len(late)
        assert direction_changes(bounds) <= 30


def test_a_step_up_in_drift_brings_the_bound_down_fast_and_its_end_lets_it_climb_back():
    """ESS 0.99, then 0.7 from step 300 (a learning-rate jump), then 0.99 again from step 600."""

    def stepped(t: int, bounds: list[int], rng: random.Random) -> float:
        level = 0.7 if 300 <= t < 600 else 0.99
        return min(1.0, level + rng.gauss(0.0, 0.01))

    bounds = run(TARGET, stepped, 1200)
    assert bounds[299] == TARGET.highest
    # halved per decision: log2(8) + 1 lowerings, each after a settle and a window
    assert bounds[300 + 4 * (TARGET.highest + TARGET.window)] == TARGET.lowest
    assert bounds[600 + 8 * (TARGET.highest + TARGET.window)] == TARGET.highest
    assert direction_changes(bounds) == 2


def test_a_failed_probe_returns_to_the_bound_before_it_and_waits_longer_each_time():
    target = DriftTarget(ess_floor=0.9, lowest=0, highest=8, window=2)
    # bound 0 and 1 are fine, 2 is over: the trace answers with the bound in force
    state, bound, raises_to_2 = start(target), 0, []
    for t in range(3000):
        before = bound
        bound, state, _ = decide(0.99 if bound < 2 else 0.8, state, target)
        assert bound <= 2
        if bound == 2 and before == 1:
            raises_to_2.append(t)
    gaps = [b - a for a, b in pairwise(raises_to_2)]
    assert gaps == sorted(gaps)
    assert gaps[-1] >= MAX_RETRY_STEPS
