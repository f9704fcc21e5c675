"""The run's target: when the recent learner steps are good enough to stop (pure functions).

``cfg.run.target_reward`` (the mean reward) and ``cfg.run.target_parts`` (the means of named
reward parts, as the task's reward functions name them) over the last ``target_window`` step
records; every bar set must hold. The learner stops on it, and the end-of-run summary and the
benchmarks read the same definition, so "reached the target" means one thing.

Each step's measures are clipped to their declared ranges (``Config.reward_ranges``: reward
functions' ``range``) before averaging, as the stream consumer already bounds each group's: one
group moves a window's mean by at most its share of the window times its measure's range, so a
hostile peer's single extreme group cannot end a run as "target reached". ``Target`` carries the
bars, the window and the ranges together, so whoever judges the target (the learner's stop, the
end-of-run summary and live view, the benchmarks' stop rule and tables) clips the same way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# the measure of a step's mean reward; every other measure is a reward part
REWARD = "reward"


def bars(run) -> dict[str, float]:
    """Measure -> the bar its window mean must reach (``run`` is cfg.run; empty: no target)."""
    reward = {REWARD: run.target_reward} if run.target_reward > 0 else {}
    # a bar of 0 is no bar, as for the reward, so an override can lift one a preset sets
    return reward | {name: bar for name, bar in run.target_parts.items() if bar != 0}


def describe(run) -> str:
    """The target in words, e.g. ``20-step means of reward >= 0.95 and reverse_digits_exact >= 0.85``."""
    shown = " and ".join(f"{name} >= {bar:g}" for name, bar in bars(run).items())
    return f"{run.target_window}-step means of {shown}"


def measures(row: Mapping, ranges: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """A learner step row's figures the bars compare: the mean reward and each part's mean,
    each clipped to its range in ``ranges`` (by name, or a ``fn/key`` part by ``fn``).

    The mean reward is the row's own: a part named ``reward`` (the decoder refuses one) could
    never stand in for it.
    """
    figures = {**row.get("reward_parts", {}), REWARD: row["reward_mean"]}
    for name, value in figures.items():
        bounds = ranges.get(name) or ranges.get(name.partition("/")[0])
        if bounds is not None:
            figures[name] = min(max(value, bounds[0]), bounds[1])
    return figures


def window_reached(
    rows: Sequence[Mapping[str, float]], bars: Mapping[str, float], window: int
) -> bool:
    """Whether the last ``window`` rows' means reach every bar (a measure a row lacks fails it)."""
    if len(rows) < window:
        return False
    last = rows[-window:]
    return all(
        statistics.fmean(r.get(name, math.nan) for r in last) >= bar for name, bar in bars.items()
    )


def first_reached(
    rows: Sequence[Mapping[str, float]], bars: Mapping[str, float], window: int
) -> int | None:
    """Index of the row that closes the first window reaching every bar; None if none does."""
    for end in range(window, len(rows) + 1):
        if window_reached(rows[:end], bars, window):
            return end - 1
    return None


@dataclass(frozen=True)
class Target:
    """What "target reached" means for one run: each bar's ``window``-step mean over step rows
    whose measures are clipped to ``ranges``."""

    bars: Mapping[str, float]
    window: int
    ranges: Mapping[str, tuple[float, float]]

    @classmethod
    def of(cls, run, ranges: Mapping[str, tuple[float, float]]) -> Target:
        """The run's own target (``run``: cfg.run's ``target_*``; ``ranges``:
        ``Config.reward_ranges``)."""
        return cls(bars(run), run.target_window, ranges)

    def measures(self, row: Mapping) -> dict[str, float]:
        return measures(row, self.ranges)

    def reached(self, recent: Sequence[Mapping[str, float]]) -> bool:
        """Whether the last rows' ``measures`` reach every bar (no bars: never)."""
        return bool(self.bars) and window_reached(recent, self.bars, self.window)

    def reached_at(self, rows: Sequence[Mapping]) -> int | None:
        """Index of the step row closing the first window that reaches every bar; None if none
        does or there are no bars."""
        if not self.bars:
            return None
        return first_reached([self.measures(r) for r in rows], self.bars, self.window)
