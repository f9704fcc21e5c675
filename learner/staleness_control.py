"""``algo.max_staleness: auto``: the admission bound set from the measured drift, as a pure function.

After every learner step ``decide(ess, state, target)`` reads the step's normalised effective
sample size of the truncated IS weights (``is_ess`` of ``learner.step.off_policy``) and returns
the bound the actors are admitted under from now on, the controller's next state and the reason,
in words, for the step row. The rule, in order:

- a step that trained nothing (no ESS) changes nothing;
- after a change, the next ``ceil(max(old, new) / versions_per_batch)`` readings are skipped:
  groups admitted under the old bound keep arriving for as many steps as their lag;
- a decision reads the mean of the last ``window`` readings since, and compares its deficit
  ``1 - ESS`` with the allowed ``1 - ess_floor``;
- over it: lower. Back by one when the last change raised the bound (a probe that failed: the
  bound before it was fine), else halve (the drift grew under a bound that held, e.g. a learning
  rate that rose: react fast);
- raise by one while the deficit scaled to the next bound, ``deficit * (b + 1) / max(b, 1)``,
  stays within the allowed: drift grows about linearly with the lag, and the part of it that lag
  does not cause (engine and learner numerics) makes that prediction err high;
- never back up to the bound last lowered from (the ceiling) before ``RETRY_STEPS * 2**failures``
  readings have passed, ``failures`` counting the lowerings from that same bound in a row: a drift
  that grows with the bound would otherwise cycle between the last good bound and the first bad
  one. The wait is capped so that a drift that went away (a learning rate decayed) is noticed.

So on a drift that does not depend on the bound the bound only ever moves one way, and on one
that grows with it the probes of the bound above thin out geometrically: the direction changes
of the bound grow with the logarithm of the run's length (tests/test_staleness_control.py
measures them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from streamrl.configs.schema import AlgoConfig, LearnerConfig

# readings before a bound lowered from may be tried again, doubled per failure there in a row
RETRY_STEPS = 16
MAX_RETRY_STEPS = 1024


@dataclass(frozen=True)
class Target:
    """What the controller keeps to: the ESS floor, the bound's range and how a decision reads."""

    ess_floor: float
    lowest: int
    highest: int
    window: int
    versions_per_batch: int = 1

    @classmethod
    def from_config(cls, algo: AlgoConfig, learner: LearnerConfig) -> Target:
        auto = algo.staleness_auto
        return cls(
            ess_floor=auto.ess_floor,
            lowest=auto.min,
            highest=auto.max,
            window=auto.window,
            versions_per_batch=learner.versions_per_batch,
        )


@dataclass(frozen=True)
class State:
    bound: int
    # readings still to skip after the last change
    settle: int = 0
    # the last ``window`` readings since the settling
    readings: tuple[float, ...] = ()
    # whether the last change raised the bound
    raised: bool = False
    # the bound last lowered from, the lowerings from it in a row, and the readings since the last
    ceiling: int | None = None
    failures: int = 0
    since_lowered: int = 0


def start(target: Target) -> State:
    """The state a run starts in: at the lowest bound, the safe one until drift is measured."""
    return State(bound=target.lowest)


def retry_wait(failures: int) -> int:
    return min(RETRY_STEPS * 2**failures, MAX_RETRY_STEPS)


def decide(ess: float, state: State, target: Target) -> tuple[int, State, str]:
    """The bound after a step whose first pass measured ``ess``, the next state and the reason."""
    b = state.bound
    if not math.isfinite(ess):
        return b, state, f"held at {b}: the step trained no tokens to measure"
    state = replace(state, since_lowered=state.since_lowered + 1)
    if state.settle > 0:
        left = f"{state.settle} more step{'s' if state.settle > 1 else ''}"
        return b, replace(state, settle=state.settle - 1), f"held at {b}: settling ({left})"
    readings = (*state.readings, ess)[-target.window :]
    state = replace(state, readings=readings)
    if len(readings) < target.window:
        return b, state, f"held at {b}: measuring ({len(readings)}/{target.window} steps)"
    mean = sum(readings) / len(readings)
    allowed = 1.0 - target.ess_floor
    measured = f"ESS {mean:.3f} over {target.window} steps"
    if 1.0 - mean > allowed:
        if b <= target.lowest:
            return b, state, f"held at {b}, the lowest: {measured} is under {target.ess_floor}"
        new = b - 1 if state.raised else max(target.lowest, b // 2)
        failures = state.failures + 1 if state.ceiling == b else 0
        moved = _moved(state, target, new, raised=False)
        moved = replace(moved, ceiling=b, failures=failures, since_lowered=0)
        return new, moved, f"lowered {b} -> {new}: {measured} is under {target.ess_floor}"
    if b >= target.highest:
        return b, state, f"held at {b}, the highest: {measured}"
    if (1.0 - mean) * (b + 1) / max(b, 1) > allowed:
        return b, state, f"held at {b}: {measured}, too little room for {b + 1}"
    if state.ceiling == b + 1 and state.since_lowered < retry_wait(state.failures):
        left = retry_wait(state.failures) - state.since_lowered
        return b, state, f"held at {b}: {b + 1} was lowered from, retried in {left} steps"
    moved = _moved(state, target, b + 1, raised=True)
    if state.ceiling == b:
        # a probe of the ceiling held a whole window: it is a bound like any other again
        moved = replace(moved, ceiling=None, failures=0)
    return b + 1, moved, f"raised {b} -> {b + 1}: {measured}"


def _moved(state: State, target: Target, new: int, raised: bool) -> State:
    settle = math.ceil(max(state.bound, new) / target.versions_per_batch)
    return replace(state, bound=new, settle=settle, readings=(), raised=raised)
