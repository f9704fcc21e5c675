"""The one receive loop of the transports whose publisher keeps each version in a ring of slots that
the actors read (``shm``: in shared memory, ``cuda_ipc``: on the learner's GPU).

A turn: the newest announcement, if wanted -> the announced segment opened (once per publisher)
-> the staging copy claimed -> the announced slot read into it under a lease -> the copy
released, staged or empty. A read that finds its slot reused ("stale") or overwritten meanwhile
("torn") is retried at once with the newest announcement. A transport implements ``open`` (its
reader of a segment) and ``read`` (one slot into the claimed copy); everything else is here.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from streamrl.configs.errors import StreamRLError
from streamrl.weightsync.layout import Layout
from streamrl.weightsync.naming import NameMappingError
from streamrl.weightsync.transports.shm.segment import SegmentNameError

if TYPE_CHECKING:
    from streamrl.weightsync.announce import Announcement
    from streamrl.weightsync.transports.base import Fill, Staging
    from streamrl.weightsync.transports.shm.segment import SegmentReader

# re-read the announcement at least this often even without a notification
IDLE_WAIT_S = 1.0
# a newer version is pending while the engine holds the staging copy
BUSY_WAIT_S = 0.02
# stale/torn reads retried at once with the newest announcement
RETRIES = 3


class CannotOpen(StreamRLError, RuntimeError):
    """A segment that is there but cannot be read from here: the version is skipped, counted under
    ``reason``."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class SlotReceiver(ABC):
    """``transports.Receiver`` over announced slots; ``reader`` is the open segment's reader."""

    # whether the staging copy is asked for as one buffer (``Staging.begin_fill``'s ``flat``)
    flat: ClassVar[bool] = False

    def __init__(self, timeout_s: float, run_name: str | None = None):
        """``run_name``: the run whose segments an announcement may name (None: any run's)."""
        self.timeout_s = timeout_s
        self.run_name = run_name
        self.reader: SegmentReader | None = None

    @abstractmethod
    def open(self, segment: str) -> SegmentReader:
        """The reader of ``segment`` (of ``run_name``). Raises ``FileNotFoundError`` when the
        segment is gone, ``SegmentNameError`` when the name is not a segment's, ``CannotOpen``
        when it cannot be read here."""

    @abstractmethod
    def read(self, version: int, slot: int, layout: Layout, fill: Fill) -> str:
        """Copy ``version`` from ``slot`` of the open segment (``reader``) into ``fill``: "ok",
        "stale" (the slot holds another version) or "torn" (overwritten meanwhile, or a checksum
        mismatch)."""

    def step(self, staging: Staging) -> float:
        return BUSY_WAIT_S if self._receive(staging) else IDLE_WAIT_S

    def _receive(self, staging: Staging) -> bool:
        """Receive the newest announced version if wanted; returns True if one is still pending."""
        ann = staging.wanted()
        for _ in range(RETRIES):
            if ann is None:
                return False
            layout = Layout.from_json(ann.meta["layout"])
            if not self._open(staging, ann):
                return False
            start = time.perf_counter()
            try:
                fill = staging.begin_fill(layout, ann.meta["aliases"], flat=self.flat)
            except NameMappingError as exc:
                staging.fail("name_mismatch", str(exc), skip=ann)
                return False
            if fill is None:
                return True
            result = "error"
            try:
                result = self.read(ann.version, int(ann.meta["slot"]), layout, fill)
            finally:
                if result == "ok":
                    seconds = time.perf_counter() - start
                    staging.end_fill(ann.version, ann.publisher, seconds, ann.meta["segment"])
                else:
                    staging.end_fill(None, ann.publisher)
            if result == "ok":
                return False
            staging.fail("torn" if result == "torn" else "stale_slot")
            ann = staging.wanted(reread=True)
        return True

    def _open(self, staging: Staging, ann: Announcement) -> bool:
        """Open the announced segment (once per publisher); False, with the version skipped and the
        reason counted, when it is gone or cannot be read here."""
        segment = ann.meta["segment"]
        if self.reader is not None and self.reader.name == segment:
            return True
        self.close()
        try:
            self.reader = self.open(segment)
        except FileNotFoundError:
            detail = f"{segment} is gone (publisher exited)"
            staging.fail("segment_gone", f"{detail}; keeping version {staging.version}", skip=ann)
            return False
        except SegmentNameError as exc:
            staging.fail("segment_refused", f"{exc}; keeping version {staging.version}", skip=ann)
            return False
        except CannotOpen as exc:
            staging.fail(exc.reason, f"{exc}; keeping version {staging.version}", skip=ann)
            return False
        return True

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None
