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
- over it: lower. Back by one when this is the first window read since the bound was raised (a
  probe that failed: the bound before it was fine), else halve (the drift grew under a bound that held, e.g. a learning
  rate that rose: react fast);
- raise by one while the deficit scaled to the next bound, ``deficit * (b + 1) / max(b, 1)``,
  stays within the allowed: drift grows about linearly with the lag, and the part of it that lag
  does not cause (engine and learner numerics) makes that prediction err high;
- never back up to a bound lowered from before ``RETRY_STEPS * 2**failures`` readings have passed
  since, ``failures`` counting its earlier lowerings not followed by a raise from it (a whole
  window held there): a drift that grows with the bound would otherwise cycle between the last
  good bound and the first bad one. Each bound keeps its own count, so noise that lowers a good
  bound does not clear a bad one's. The wait is capped so that a drift that went away (a learning
  rate decayed) is noticed.

So on a drift that does not depend on the bound the bound only ever moves one way, and on one
that grows with it the probes of a bound above thin out geometrically: the direction changes of
the bound grow with the logarithm of the run's length (tests/test_staleness_control.py measures
them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from streamrl.configs.schema import AlgoConfig, LearnerConfig

# readings before a bound lowered from may be tried again, doubled per failure there in a row
RETRY_STEPS = 16
MAX_RETRY_STEPS = 1024


@dataclass(frozen=True)
class DriftTarget:
    """What the controller keeps to: the ESS floor, the bound's range and how a decision reads."""

    ess_floor: float
    lowest: int
    highest: int
    window: int
    versions_per_batch: int = 1

    @classmethod
    def from_config(cls, algo: AlgoConfig, learner: LearnerConfig) -> DriftTarget:
        auto = algo.staleness_auto
        return cls(
            ess_floor=auto.ess_floor,
            lowest=auto.min,
            highest=auto.max,
            window=auto.window,
            versions_per_batch=learner.versions_per_batch,
        )


@dataclass(frozen=True)
class Lowered:
    """A bound the controller lowered from: its failures before, and the reading it was at."""

    bound: int
    failures: int
    at: int


@dataclass(frozen=True)
class ControlState:
    bound: int
    # readings taken (finite ESS values), the clock of the waits
    seen: int = 0
    # readings still to skip after the last change
    settle: int = 0
    # the last ``window`` readings since the settling
    readings: tuple[float, ...] = ()
    # the last change raised the bound, and no full window was read since: its first decides it
    probing: bool = False
    # the bounds lowered from and not raised from since
    lowered: tuple[Lowered, ...] = ()


def start(target: DriftTarget) -> ControlState:
    """The state a run starts in: at the lowest bound, the safe one until drift is measured."""
    return ControlState(bound=target.lowest)


def retry_wait(failures: int) -> int:
    return min(RETRY_STEPS * 2**failures, MAX_RETRY_STEPS)


def decide(ess: float, state: ControlState, target: DriftTarget) -> tuple[int, ControlState, str]:
    """The bound after a step whose first pass measured ``ess``, the next state and the reason."""
    b = state.bound
    if not math.isfinite(ess):
        return b, state, f"held at {b}: the step trained no tokens to measure"
    state = replace(state, seen=state.seen + 1)
    if state.settle > 0:
        left = f"{state.settle} more step{'s' if state.settle > 1 else ''}"
        return b, replace(state, settle=state.settle - 1), f"held at {b}: settling ({left})"
    readings = (*state.readings, ess)[-target.window :]
    state = replace(state, readings=readings)
    if len(readings) < target.window:
        return b, state, f"held at {b}: measuring ({len(readings)}/{target.window} steps)"
    mean = sum(readings) / len(readings)
    probing, state = state.probing, replace(state, probing=False)
    allowed = 1.0 - target.ess_floor
    measured = f"ESS {mean:.3f} over {target.window} steps"
    if 1.0 - mean > allowed:
        if b <= target.lowest:
            return b, state, f"held at {b}, the lowest: {measured} is under {target.ess_floor}"
        new = b - 1 if probing else max(target.lowest, b // 2)
        before = _record(state, b)
        mark = Lowered(b, before.failures + 1 if before else 0, state.seen)
        moved = _moved(state, target, new, probing=False, lowered=_without(state, b) + (mark,))
        return new, moved, f"lowered {b} -> {new}: {measured} is under {target.ess_floor}"
    if b >= target.highest:
        return b, state, f"held at {b}, the highest: {measured}"
    if (1.0 - mean) * (b + 1) / max(b, 1) > allowed:
        return b, state, f"held at {b}: {measured}, too little room for {b + 1}"
    above = _record(state, b + 1)
    if above is not None and state.seen - above.at < retry_wait(above.failures):
        left = retry_wait(above.failures) - (state.seen - above.at)
        return b, state, f"held at {b}: {b + 1} was lowered from, retried in {left} steps"
    # b held a whole window: its lowerings are forgotten
    moved = _moved(state, target, b + 1, probing=True, lowered=_without(state, b))
    return b + 1, moved, f"raised {b} -> {b + 1}: {measured}"


def _record(state: ControlState, bound: int) -> Lowered | None:
    return next((low for low in state.lowered if low.bound == bound), None)


def _without(state: ControlState, bound: int) -> tuple[Lowered, ...]:
    return tuple(low for low in state.lowered if low.bound != bound)


def _moved(
    state: ControlState, target: DriftTarget, new: int, probing: bool, lowered: tuple[Lowered, ...]
) -> ControlState:
    settle = math.ceil(max(state.bound, new) / target.versions_per_batch)
    return replace(state, bound=new, settle=settle, readings=(), probing=probing, lowered=lowered)
