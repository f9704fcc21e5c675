"""The shm transport's slots: each one ``Layout`` of a version's tensors and, after them, their
checksum table, in the body of one segment (``segment``): ``ShmWriter`` writes a version into a
slot no reader holds, ``ShmReader`` copies one out (or leases it to be read in place).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from streamrl.weightsync.layout import Layout
from streamrl.weightsync.transports.shm.checksum import (
    checksum,
    checksum_of_sum,
    copy_summed,
    copy_with_checksum,
    raw_sum,
    word_sum,
)
from streamrl.weightsync.transports.shm.segment import PAGE, SegmentReader, SegmentWriter

log = logging.getLogger(__name__)


def _sums_offset(layout: Layout) -> int:
    """Where a slot's checksum table (one uint64 per tensor) starts, after its data."""
    return -(-layout.total_bytes // 64) * 64


def _slot_bytes_used(layout: Layout) -> int:
    return _sums_offset(layout) + 8 * len(layout.specs)


def _slot_stride(layout: Layout) -> int:
    return max(PAGE, -(-_slot_bytes_used(layout) // PAGE) * PAGE)


def _sums(slot: torch.Tensor, layout: Layout) -> np.ndarray:
    """The checksum table of one slot (a view into the segment)."""
    start = _sums_offset(layout)
    return slot[start : start + 8 * len(layout.specs)].numpy().view(np.uint64)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """A plain CPU byte copy between the two (no conversion, no device): it can be summed on the fly."""
    return (
        a.device.type == b.device.type == "cpu"
        and a.dtype == b.dtype
        and a.is_contiguous()
        and b.is_contiguous()
    )


def _held_checksum(out: torch.Tensor, published: torch.Tensor, version: int) -> int:
    """Copy ``published`` (a slot's view) into ``out`` and checksum the bytes ``out`` now holds:
    summed on the fly on CPU, on the device for a GPU copy of the same dtype; a converting copy
    is checked on the slot, once more after copying."""
    if _same_bytes(out, published):
        return copy_with_checksum(out, published, version)
    out.copy_(published)
    if out.dtype == published.dtype and out.is_contiguous():
        return checksum_of_sum(int(word_sum(out)), version)
    return checksum(published, version)


class ShmWriter(SegmentWriter):
    """Publisher side. Creates the segment on construction; ``write`` copies one version into a free slot."""

    def __init__(
        self, run_name: str, layout: Layout, slots: int, lease_s: float, host_id: str = ""
    ):
        """``host_id``: the host whose actors read the segment, in its name (hosts may share /dev/shm)."""
        stride = _slot_stride(layout)
        super().__init__(run_name, slots, stride, slots * stride, lease_s, host_id)
        self.layout = layout
        slot_bytes = [self.body[s * stride : (s + 1) * stride] for s in range(slots)]
        self._flat = [b[: layout.total_bytes] for b in slot_bytes]
        self._views = [layout.views(b) for b in slot_bytes]
        self._sums = [_sums(b, layout) for b in slot_bytes]

    def write(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        checksums: dict[str, int] | None = None,
    ) -> tuple[int, bool]:
        """Copy (and convert) ``tensors`` into a slot; returns (slot, had to override a lease).

        ``checksums`` (by name, from ``checksum_of_sum``): taken by the caller on the tensors
        as published (a GPU's, before they were copied to the host), so the slot is not summed
        again; a reader still checks what it copied against them.
        """
        fill = SlotFill(self, version, tensors, checksums)
        fill.commit()
        return fill.slot, fill.overrode

    def begin(self, version: int) -> tuple[int, torch.Tensor]:
        """A free slot to fill in place: (slot, its bytes as the layout's flat stream), marked as
        being written until ``commit`` (readers keep to the newest complete slot meanwhile)."""
        slot, overrode = self.start_slot(version)
        if overrode:
            log.warning("shm slot %d: a reader's lease ran out; writing over it", slot)
        return slot, self._flat[slot]

    def commit(self, slot: int, version: int, checksums: list[int] | None = None) -> None:
        """``slot``, filled since ``begin``, holds ``version``: stamped, with ``checksums`` (the
        layout's order, taken where the bytes came from: readers then check them end to end), or
        checksummed in place."""
        views, sums = self._views[slot], self._sums[slot]
        for i, spec in enumerate(self.layout.specs):
            sums[i] = checksum(views[spec.name], version) if checksums is None else checksums[i]
        self.stamp(slot, version)

    def checksums(self, slot: int) -> list[int]:
        """``slot``'s checksums in the layout's order."""
        return [int(x) for x in self._sums[slot]]

    def flat(self, slot: int) -> torch.Tensor:
        """``slot``'s bytes as the layout's flat stream (padding included), for reading."""
        return self._flat[slot]

    def _release_body(self) -> None:
        self._flat = self._views = self._sums = []


class SlotFill:
    """One version written into a free slot front to back (``upto``), so a sender can ship each
    written piece of the slot while the next is being written; ``commit`` finishes, checksums and
    stamps it. Each tensor is summed as it is copied, piece by piece, unless ``checksums`` (by
    name, from ``checksum_of_sum``: taken where the tensors were published, a GPU's) are given."""

    def __init__(
        self,
        writer: ShmWriter,
        version: int,
        tensors: dict[str, torch.Tensor],
        checksums: dict[str, int] | None = None,
    ):
        self.writer, self.version, self.tensors = writer, version, tensors
        self.slot, self.overrode = writer.start_slot(version)
        self.flat = writer.flat(self.slot)
        layout = writer.layout
        self.sums = None if checksums is None else [checksums[s.name] for s in layout.specs]
        self._totals = [0] * len(layout.specs)
        # the next tensor (layout order) not written in full, and how far into the stream
        self._next, self._cursor = 0, 0
        self.committed = False

    def upto(self, end: int) -> None:
        """The slot holds the layout's byte stream up to at least ``end``."""
        layout = self.writer.layout
        # pieces end at multiples of 8 within each tensor (tensors start at multiples of 64)
        end = min(-(-end // 8) * 8, layout.total_bytes)
        with torch.no_grad():
            while self._next < len(layout.specs) and self._cursor < end:
                i = self._next
                spec, offset = layout.specs[i], layout.offsets[i]
                if offset >= end:
                    break
                start, stop = max(self._cursor, offset), min(end, offset + spec.nbytes)
                self._piece(i, start - offset, stop - offset)
                self._cursor = stop
                if stop == offset + spec.nbytes:
                    self._next += 1
        self._cursor = max(self._cursor, end)

    def _piece(self, i: int, start: int, stop: int) -> None:
        """Bytes ``start``..``stop`` of tensor ``i`` into the slot: copied and summed, or, for a
        tensor that must be converted, converted whole at its first piece and summed."""
        spec = self.writer.layout.specs[i]
        view, src = self.writer._views[self.slot][spec.name], self.tensors[spec.name]
        at = self.writer.layout.offsets[i]
        dst = self.flat[at + start : at + stop]
        same = _same_bytes(view, src)
        if not same and start == 0:
            view.copy_(src)
        if self.sums is not None:
            if same:
                dst.copy_(src.reshape(-1).view(torch.uint8)[start:stop])
        elif same:
            self._totals[i] += copy_summed(dst, src.reshape(-1).view(torch.uint8)[start:stop])
        else:
            self._totals[i] += raw_sum(dst.numpy())

    def commit(self) -> list[int]:
        """Write what is left, stamp the slot with its checksums (layout order) and return them."""
        if self.committed:
            return self.sums
        self.upto(self.writer.layout.total_bytes)
        if self.sums is None:
            self.sums = [checksum_of_sum(t, self.version) for t in self._totals]
        self.writer.commit(self.slot, self.version, self.sums)
        self.committed = True
        return self.sums


class ShmReader(SegmentReader):
    """Subscriber side: maps a segment by name and copies announced slots out under a lease."""

    def read_into(
        self,
        version: int,
        slot: int,
        layout: Layout,
        pairs: list[tuple[str, str]],
        dest: dict[str, torch.Tensor],
    ) -> str:
        """Copy ``version`` from ``slot`` into ``dest``; "ok", "stale" (slot reused for a newer
        version) or "torn" (overwritten meanwhile, or a tensor that does not match its checksum)."""
        self._check_slot(slot, _slot_bytes_used(layout))
        if not self.hold(version, slot):
            return "stale"
        try:
            slot_bytes = self._slot_bytes(slot)
            src, sums = layout.views(slot_bytes), _sums(slot_bytes, layout)
            index = {spec.name: i for i, spec in enumerate(layout.specs)}
            with torch.no_grad():
                for engine_name, published_name in pairs:
                    out, published = dest[engine_name], src[published_name]
                    if _held_checksum(out, published, version) != int(sums[index[published_name]]):
                        return "torn"
            return "ok" if self.begin_stamp(slot) == version else "torn"
        finally:
            self._drop_lease()

    def lease(self, version: int, slot: int, layout: Layout) -> dict[str, torch.Tensor] | None:
        """Lease ``slot`` and return zero-copy views of ``version`` in it (None: the slot no longer holds it).

        For a consumer that reads the slot in place over a while (vLLM's workers
        load straight from it): the lease lasts ``lease_s`` from now, ``renew``
        extends it, and ``release`` ends it and says whether the slot held
        ``version`` all along.
        """
        self._check_slot(slot, _slot_bytes_used(layout))
        if not self.hold(version, slot):
            return None
        slot_bytes = self._slot_bytes(slot)
        views, sums = layout.views(slot_bytes), _sums(slot_bytes, layout)
        if any(
            checksum(views[spec.name], version) != int(sums[i])
            for i, spec in enumerate(layout.specs)
        ):
            self._drop_lease()
            return None
        return views
