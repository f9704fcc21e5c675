"""Where a run stands: what a checkpoint restores besides weights and optimizer (every trainer's;
the RL learner's adds its commit bookkeeping, ``commits.StreamProgress``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Progress:
    """What a checkpoint must restore besides weights and optimizer."""

    step: int = 0
    # the policy's version: one more with every optimizer step (an RL step may take several)
    version: int = 0
    samples: int = 0
    tokens: int = 0

    @classmethod
    def from_state(cls, state: dict | None) -> Progress:
        if not state or "progress" not in state:
            return cls()
        # a supervised run's checkpoint from before it saved its version: one a step
        return cls(**{"version": state["progress"]["step"], **state["progress"]})
