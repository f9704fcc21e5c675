"""The ``cuda_ipc`` transport's slots: a ring of flat buffers on the learner's GPU, described by a
control segment in /dev/shm.

The learner allocates ``weightsync.cuda_ipc.slots`` buffers of its ``Layout`` once on its device and
exports each once (``DeviceIpc.share``); the fields go into the control segment, a
``transports.shm.segment`` of kind ``KIND_CONTROL`` (same header, version stamps, reader leases,
0600 creation under a random name, owner check, stale cleanup), whose body holds each slot's
checksum table and, after them, the handle fields as msgpack (never pickle; header words 6 and
7 give their offset and length). Redis carries only the segment's name, the slot and the layout.

Writing a version (``IpcSlotsWriter.write``): mark the slot as being written, copy (converting)
the tensors into it on the GPU, take their word sums there (``shm.checksum.layout_sums``: a
slot's all at once), record a fence and wait for it, store the checksums, stamp. A reader (``IpcSlotsReader``) leases the slot,
checks the stamps, copies device to device into its own tensors, sums what it now holds on its
device and checks those sums against the table, and the stamp once more after (seqlock): a
copy that raced a writer (a lease that ran out) is refused as torn.
"""

from __future__ import annotations

import msgpack
import torch

from streamrl.weightsync.layout import Layout
from streamrl.weightsync.transports.cuda_ipc.device import FIELDS, DeviceIpc
from streamrl.weightsync.transports.shm.checksum import checksum_of_sum, layout_sums, word_sum
from streamrl.weightsync.transports.shm.segment import (
    HEADER_BYTES,
    KIND_CONTROL,
    PAGE,
    SegmentReader,
    SegmentWriter,
)

# header words: the handle fields' offset in the body and their length
_BLOB_OFFSET, _BLOB_BYTES = 6, 7


def _table_stride(layout: Layout) -> int:
    return max(PAGE, -(-8 * len(layout.specs) // PAGE) * PAGE)


def copy_and_sum(
    pairs: list[tuple[torch.Tensor, torch.Tensor]], version: int, device: torch.device
) -> list[int]:
    """Copy each (destination, source) pair and return the checksum of each destination as it now
    is (summed on its own device; a converting copy is summed on the source), reading every sum
    back in one transfer: one wait, not one per tensor. The copies go as one foreach call (fused
    kernels where devices and dtypes agree: a model has hundreds of tensors, and a launch each
    would cost more than the bytes)."""
    if not pairs:
        return []
    sums = []
    with torch.no_grad():
        torch._foreach_copy_([out for out, _ in pairs], [src for _, src in pairs])
        for out, src in pairs:
            summed = out if out.dtype == src.dtype and out.is_contiguous() else src
            sums.append(word_sum(summed).to(device))
    return [checksum_of_sum(int(s), version) for s in torch.stack(sums).tolist()]


def decode_handles(raw: bytes, slots: int) -> list[dict]:
    """The handle fields of ``slots`` slots from the control segment, every field checked against
    ``device.FIELDS`` (the segment is ours, but a reader trusts nothing it parses)."""
    try:
        data = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ValueError(f"unreadable slot handles: {exc}") from None
    if not isinstance(data, list) or len(data) != slots:
        raise ValueError(f"the segment describes {slots} slots, its handles do not")
    for fields in data:
        if not isinstance(fields, dict) or set(fields) != set(FIELDS):
            raise ValueError(f"slot handle fields must be exactly {sorted(FIELDS)}")
        for key, kind in FIELDS.items():
            value = fields[key]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"slot handle field {key!r} is not {kind}")
    return data


class IpcSlotsWriter(SegmentWriter):
    """Learner side: the slots on ``device`` and their control segment, both made once."""

    def __init__(
        self,
        ops: DeviceIpc,
        run_name: str,
        layout: Layout,
        slots: int,
        lease_s: float,
        device: torch.device,
        host_id: str = "",
    ):
        self.layout = layout
        self.device = device
        self.ops = ops
        # zeroed once: the padding between tensors stays zero, as ``layout_sums`` needs
        buffers = [ops.allocate(layout.padded_bytes, device).zero_() for _ in range(slots)]
        blob = msgpack.packb([ops.share(b) for b in buffers], use_bin_type=True)
        stride = _table_stride(layout)
        super().__init__(
            run_name, slots, stride, slots * stride + len(blob), lease_s, host_id, KIND_CONTROL
        )
        start = slots * stride
        self.body[start : start + len(blob)].copy_(
            torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        )
        self._map.words[_BLOB_OFFSET], self._map.words[_BLOB_BYTES] = start, len(blob)
        self._buffers = buffers
        self._views = [layout.views(b) for b in buffers]
        self._sums = [
            self.body[s * stride : s * stride + 8 * len(layout.specs)].numpy().view("uint64")
            for s in range(slots)
        ]

    def write(self, version: int, tensors: dict[str, torch.Tensor]) -> tuple[int, bool]:
        """Copy (and convert) ``tensors`` into a free slot on the GPU; returns (slot, had to
        override a lease). Stamped only once the fence after the copy and its sums has passed."""
        slot, overrode = self.start_slot(version)
        views = self._views[slot]
        names = [spec.name for spec in self.layout.specs]
        with torch.no_grad():
            # one foreach call: fused kernels where dtypes agree, not a launch per tensor
            torch._foreach_copy_([views[n] for n in names], [tensors[n] for n in names])
            sums = layout_sums(self._buffers[slot], self.layout)
            fence = self.ops.fence(self.device)
        fence.synchronize()
        raw = sums.tolist()
        table = self._sums[slot]
        for i, s in enumerate(raw):
            table[i] = checksum_of_sum(s, version)
        self.stamp(slot, version)
        return slot, overrode

    def _release_body(self) -> None:
        self._sums = []

    def close(self) -> None:
        super().close()
        self._views = self._buffers = []


class IpcSlotsReader(SegmentReader):
    """Actor side: one publisher's control segment, its slots opened once (``DeviceIpc.open``)."""

    def __init__(self, ops: DeviceIpc, name: str, lease_s: float, *, run_name: str | None = None):
        super().__init__(name, lease_s, KIND_CONTROL, run_name=run_name)
        try:
            w = self._map.words
            start, length = int(w[_BLOB_OFFSET]), int(w[_BLOB_BYTES])
            body = self._map.data[HEADER_BYTES:]
            if start < self.slots * self.stride or length <= 0 or start + length > body.numel():
                raise ValueError(f"shm segment {name}: its slot handles lie outside it")
            handles = decode_handles(body[start : start + length].numpy().tobytes(), self.slots)
            self.flats = [ops.open(fields) for fields in handles]
        except BaseException:
            self.close()
            raise
        self._views: dict[tuple[int, Layout], dict[str, torch.Tensor]] = {}

    def views(self, slot: int, layout: Layout) -> dict[str, torch.Tensor]:
        """The layout's tensors over ``slot`` (this process's views of the learner's memory)."""
        key = (slot, layout)
        if key not in self._views:
            flat = self.flats[slot]
            if flat.numel() < layout.padded_bytes:
                raise ValueError(
                    f"announced layout ({layout.total_bytes} bytes) exceeds slot {slot} of {self.name}"
                )
            self._views = {k: v for k, v in self._views.items() if k[1] == layout}
            self._views[key] = layout.views(flat)
        return self._views[key]

    def _table(self, slot: int, layout: Layout) -> list[int]:
        start = slot * self.stride
        raw = self._map.data[HEADER_BYTES + start : HEADER_BYTES + start + 8 * len(layout.specs)]
        return [int(x) for x in raw.numpy().view("uint64")]

    def read_into(
        self,
        version: int,
        slot: int,
        layout: Layout,
        pairs: list[tuple[str, str]],
        dest: dict[str, torch.Tensor],
        flat: torch.Tensor | None = None,
    ) -> str:
        """Copy ``version`` from ``slot`` into ``dest`` (device to device); "ok", "stale" (the
        slot holds another version) or "torn" (overwritten meanwhile, or a checksum mismatch).

        ``flat``: the buffer ``dest``'s tensors are views of, in ``layout`` (the subscriber's flat
        staging copy): the slot is copied into it whole, one copy, and summed by ``layout_sums``;
        else tensor by tensor (``copy_and_sum``)."""
        self._check_slot(slot, 8 * len(layout.specs))
        src = self.views(slot, layout)
        if not self.hold(version, slot):
            return "stale"
        try:
            index = {spec.name: i for i, spec in enumerate(layout.specs)}
            table = self._table(slot, layout)
            if flat is not None:
                with torch.no_grad():
                    flat[: layout.padded_bytes].copy_(self.flats[slot][: layout.padded_bytes])
                    sums = layout_sums(flat, layout).tolist()
                held = [checksum_of_sum(sums[index[published]], version) for _, published in pairs]
            else:
                device = next(iter(dest.values())).device if dest else torch.device("cpu")
                held = copy_and_sum(
                    [(dest[engine], src[published]) for engine, published in pairs], version, device
                )
        finally:
            # after the sums came back (the copies are done): no writer touched the slot since
            intact = self.release()
        expected = [table[index[published]] for _, published in pairs]
        return "ok" if intact and held == expected else "torn"

    def lease(self, version: int, slot: int, layout: Layout) -> dict[str, torch.Tensor] | None:
        """Lease ``slot`` and return its views in place (None: it no longer holds ``version``), for a
        consumer loading straight from the learner's GPU (vLLM's workers); ``renew`` extends the
        lease and ``release`` ends it, saying whether the slot held ``version`` all along.
        The checksums are checked on the slot itself."""
        self._check_slot(slot, 8 * len(layout.specs))
        views = self.views(slot, layout)
        if not self.hold(version, slot):
            return None
        table = self._table(slot, layout)
        with torch.no_grad():
            sums = layout_sums(self.flats[slot], layout).tolist()
        held = [checksum_of_sum(s, version) for s in sums]
        if held != table:
            self.release()
            return None
        return views

    def close(self) -> None:
        self._views = {}
        self.flats = []
        super().close()
