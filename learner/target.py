"""The run's target: when the recent learner steps are good enough to stop (pure functions).

``cfg.run.target_reward`` / ``target_exact`` over the last ``target_window`` step
records. The learner stops on it, and the end-of-run summary and the system
benchmark read the same definition, so "reached the target" means one thing.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def enabled(reward: float, exact: float) -> bool:
    return reward > 0 or exact > 0


def window_reached(
    rewards: Sequence[float], exacts: Sequence[float], reward: float, exact: float, window: int
) -> bool:
    """Whether the means of the last ``window`` rewards and exact-match fractions reach both bars."""
    if len(rewards) < window or len(exacts) < window:
        return False
    return (
        statistics.fmean(rewards[-window:]) >= reward
        and statistics.fmean(exacts[-window:]) >= exact
    )


def first_reached(
    rewards: Sequence[float], exacts: Sequence[float], reward: float, exact: float, window: int
) -> int | None:
    """Index of the step that closes the first window reaching both bars; None if none does."""
    for end in range(window, min(len(rewards), len(exacts)) + 1):
        if window_reached(rewards[:end], exacts[:end], reward, exact, window):
            return end - 1
    return None
