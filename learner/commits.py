"""The learner's commit bookkeeping: which trained entries are not acked yet, and how many groups
the completed steps took (admission's ``consumed``). ``Commits`` is the one writer of
``StreamProgress.consumed``, ``StreamProgress.unacked`` and ``StreamProgress.redis_epoch``.

Every rank keeps the same figures: a checkpoint is collective, and every rank must agree whether
one is still due when the learner stops. Rank 0 also writes them to Redis, through its
``RolloutIO`` (``learner.rollout_io``, which makes this rank's ``Commits``).

Ack policy (``learner.ack_policy``):
- ``checkpoint`` (default): entries are acked only after a checkpoint holds the step that used
  them. The checkpoint also lists them, and a restarted learner acks that list first (a crash
  between save and ack). A SIGKILLed learner restarts from the checkpoint and re-reads exactly the
  entries of the lost steps from its pending list, in the same order: nothing lost, nothing trained
  twice, the same weights as an uninterrupted run.
- ``step``: entries are acked as soon as their step is published. Less redelivery after a crash,
  but the steps since the last checkpoint are lost together with their data.

Counting for admission: every completed step, trained or not, adds its entries to ``consumed``,
and that running total is written to ``adm:consumed`` (set only if larger: idempotent, restored
from the checkpoint by a restarted learner, see broker.admission).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from streamrl.learner.progress import Progress


@dataclass
class StreamProgress(Progress):
    """The progress of a run trained from the stream: the trainer's, and the commit bookkeeping
    (written by ``Commits`` only)."""

    # groups taken by completed steps (admission); below zero right after a Redis wipe, by the
    # entries held from before it (the wiped `accepted` no longer counts them)
    consumed: int = 0
    # admission.epoch of the Redis data set `consumed` counts in
    redis_epoch: str = ""
    # (entry id, group id) trained, not acked
    unacked: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def from_state(cls, state: dict | None) -> StreamProgress:
        if not state or "progress" not in state:
            return cls()
        p = {"consumed": 0, **state["progress"]}
        p["unacked"] = [tuple(e) for e in p["unacked"]]
        return cls(**p)


class Ledger(Protocol):
    """Where rank 0's commits go: the run's Redis (``learner.rollout_io.RolloutIO``)."""

    def ack(self, entries: list[tuple[str, str]], consumed: int, step: int) -> None: ...

    def set_consumed(self, consumed: int) -> None: ...

    def redis_epoch(self) -> str: ...

    def consumed_in_redis(self) -> int: ...


class Commits:
    """The commit bookkeeping of ``progress`` under ``ack_policy``; ``io`` on rank 0 only."""

    def __init__(self, progress: StreamProgress, ack_policy: str, io: Ledger | None = None):
        self.progress = progress
        self.ack_policy = ack_policy
        self.io = io

    @property
    def pending(self) -> bool:
        """Entries trained but not acked: a checkpoint must hold them before the learner stops."""
        return bool(self.progress.unacked)

    def count_with(self, taken: int) -> int:
        """The consumed count once the step in training, which took ``taken`` entries, completes:
        its last update publishes it together with its version."""
        return self.progress.consumed + taken

    def step_done(self, entries: list[tuple[str, str]], trained: bool) -> None:
        """Count a completed step's entries, trained or not: a step whose every group was dropped
        still frees their slots."""
        p = self.progress
        p.unacked += entries
        p.consumed += len(entries)
        if self.ack_policy == "step":
            self._ack()
        elif self.io is not None and not trained:
            # no update published this step's count (``count_with``)
            self.io.set_consumed(p.consumed)

    def checkpointed(self) -> None:
        """A checkpoint now holds every step so far and lists the entries not acked yet."""
        if self.ack_policy == "checkpoint":
            self._ack()
        self.progress.unacked = []

    def resume(self) -> None:
        """Rank 0, at start: ack what the checkpoint covers (a crash may have hit between save and
        ack) and re-announce the consumed count.

        With ``ack_policy: step`` the steps after the checkpoint are lost with their entries
        (acked and deleted), so Redis's count, which holds them, is the right one. With
        ``checkpoint`` those entries come back and are counted again as their steps are redone.
        """
        p, io = self.progress, self.io
        epoch = io.redis_epoch()
        # Redis lost its data since the checkpoint: its count is of groups the new `accepted` lacks
        if p.redis_epoch not in ("", epoch):
            p.consumed = 0
        p.redis_epoch = epoch
        if self.ack_policy == "step":
            p.consumed = max(p.consumed, io.consumed_in_redis())
        self._ack()
        io.set_consumed(p.consumed)

    def redis_wiped(self, held: int, epoch: str) -> int:
        """Redis restarted without persistence: the count starts again from zero, and the ``held``
        entries read before the wipe, which its ``accepted`` no longer counts, are counted below
        zero until their step completes. Returns the count Redis must hold now."""
        self.progress.consumed = -held
        self.progress.redis_epoch = epoch
        return self.progress.consumed

    def _ack(self) -> None:
        p = self.progress
        if self.io is not None and p.unacked:
            self.io.ack(p.unacked, p.consumed, p.step)
        p.unacked = []
