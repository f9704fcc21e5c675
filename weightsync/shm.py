"""Shared-memory transport: a ring of slots in one POSIX shm segment (/dev/shm), on one host.

Segment: a 4 KiB header, then ``slots`` page-aligned slots, each one ``Layout``.
Header words (int64): magic, slots, slot_bytes, max_readers, data_offset; per
slot a version stamp written before (``begin``) and after (``end``) the data;
per reader a lease row (slot, version, expiry, pid).

A reader accepts a copy only if ``begin == end == version`` before it and
``begin`` is unchanged after (seqlock), and only if every tensor it copied sums
to the checksum the writer stored for it. The stamps alone would rely on x86's
store and load ordering (Python has no fences to place): on a weakly ordered
CPU (ARM) the reader could see the new stamps with old or half-written data. The
checksum (the tensor's bytes summed as 64-bit words, mixed with the version;
one table per slot, after its data) is checked on the bytes the reader actually
holds, so such a copy is refused as torn and read again. Its cost is measured
by ``bench/shm_checksum.py``: a word sum runs at memory speed (as fast as xxh3
here), can be taken on a GPU (``word_sum``), and on CPU is folded into the copy
block by block (``copy_with_checksum``) so the bytes are summed while in cache.
Leases keep the writer off slots readers are copying: a reader owns its row
through an open-file-description lock, which the kernel drops when the reader
dies, and a lease expires after ``lease_s``, so neither a SIGKILLed nor a
SIGSTOPped reader can block the writer for longer than that. The writer never
touches the newest complete slot, so with 3+ slots one frozen reader never
delays it at all.

The header, stamps and leases are ``SegmentWriter``/``SegmentReader``'s; what a
slot's bytes are lies with the subclass: ``ShmWriter``/``ShmReader`` keep each
slot's data and checksum table in the segment's body, the ``cuda_ipc`` transport
(``weightsync.ipc_slots``) keeps only checksum tables and handle fields there
and the data on a GPU. Header word 5 says which (``KIND_*``): a reader refuses a
segment of the other kind.

Pages are allocated (posix_fallocate: a full /dev/shm is an error here, not a
SIGBUS later) and pre-faulted once (the first touch of a page is the real cost),
then reused for every version.

A segment is unlinked by ``close`` and at interpreter exit; one left by a killed
process is removed by ``cleanup_stale_segments``. No signal handler is set here:
the process's owner decides what a signal means (the learner stops at a step
boundary, then closes the segment).
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import mmap
import os
import secrets
import stat
import struct
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import torch

from streamrl.weightsync.layout import ALIGN, Layout

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
# "STRMLWS1"
MAGIC = 0x5354524D4C575331
HEADER_BYTES = 4096
PAGE = 4096
MAX_SLOTS = 16
MAX_READERS = 64
# header word 5: what the segment's body holds
KIND_SLOTS = 0
KIND_CONTROL = 1
_KIND = 5
# word index of slot 0's begin stamp
_STAMPS = 8
# word index of reader row 0
_ROWS = _STAMPS + 2 * MAX_SLOTS
# slot, version, expiry_ns, pid
_ROW_WORDS = 4
_SLOT, _VERSION, _EXPIRY, _PID = range(_ROW_WORDS)
# struct flock on 64-bit Linux; l_pid must be 0 for OFD locks
_FLOCK = "hhxxxxqqixxxx"


def segment_prefix(run_name: str) -> str:
    return f"streamrl.{run_name}.weights."


def cleanup_stale_segments(run_name: str) -> list[str]:
    """Unlink this run's segments whose creating process is gone (a SIGKILLed learner leaves them).

    Only regular files of our own uid: /dev/shm is shared by every local user, and a file
    another user planted under our prefix must neither be removed nor stop the learner.
    """
    removed = []
    for path in SHM_DIR.glob(segment_prefix(run_name) + "*"):
        pid = _pid_of(path.name)
        if pid is None or psutil.pid_exists(pid) or not _ours(path):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("leaving %s in place: %s", path, exc)
            continue
        removed.append(path.name)
    return removed


def _ours(path: Path) -> bool:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()


def _pid_of(name: str) -> int | None:
    parts = name.rsplit(".", 2)
    try:
        return int(parts[-2])
    except (IndexError, ValueError):
        return None


def _ofd_lock(fd: int, byte: int, kind: int, cmd: int = fcntl.F_OFD_SETLK) -> int:
    """OFD byte-range lock (held per open file description, released when the holder dies); returns l_type."""
    packed = fcntl.fcntl(fd, cmd, struct.pack(_FLOCK, kind, os.SEEK_SET, byte, 1, 0))
    return struct.unpack(_FLOCK, packed)[0]


def _row_alive(fd: int, row: int) -> bool:
    return _ofd_lock(fd, row, fcntl.F_WRLCK, fcntl.F_OFD_GETLK) != fcntl.F_UNLCK


class _Mapping:
    """An mmap of a segment file with an int64 header view and a uint8 data tensor."""

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        self.words = np.frombuffer(self.mm, dtype=np.int64, count=HEADER_BYTES // 8)
        self.data = torch.frombuffer(self.mm, dtype=torch.uint8)

    def close(self) -> None:
        self.words = self.data = None
        try:
            self.mm.close()
        except BufferError:
            # a caller still holds a view; the mapping goes with the last reference
            pass
        os.close(self.fd)


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


# mixes the version into a checksum: the same bytes under another version do not match
_VERSION_MIX = 0x9E3779B97F4A7C15
# bytes copied and summed at a time: small enough to be summed while still in L2
_BLOCK = 1 << 20
# below this a tensor is still in the last-level cache after its copy: two passes are cheaper
# than blocks (measured: 1.22x a plain copy against 1.48x at 10 MB; 1.46x against 1.31x at 100 MB)
_FUSE_ABOVE = 32 << 20


def _mix(raw_sum: int, version: int) -> int:
    return (raw_sum + version * _VERSION_MIX) % 2**64


def checksum(tensor: torch.Tensor, version: int) -> int:
    """The bytes of a contiguous CPU tensor summed as little-endian uint64 words (the tail
    zero-padded), plus a multiple of ``version``: a copy mixing two versions, or old data under
    a new stamp, fails to match except by a 2**-64 chance."""
    raw = tensor.reshape(-1).view(torch.uint8).numpy()
    whole = raw.size - raw.size % 8
    # uint64 sums wrap modulo 2**64 (and np.sum keeps the dtype: passing one is 4x slower)
    total = int(raw[:whole].view(np.uint64).sum())
    if whole < raw.size:
        total += int.from_bytes(raw[whole:].tobytes(), "little")
    return _mix(total, version)


def word_sum(tensor: torch.Tensor) -> torch.Tensor:
    """``checksum``'s word sum before the version is mixed in, as a 0-dim int64 on the tensor's
    own device (no sync: a GPU sums its tensors before they are copied to the host). int64
    additions wrap like uint64 ones; ``checksum_of_sum`` maps the result back."""
    raw = tensor.reshape(-1).view(torch.uint8)
    whole = raw.numel() - raw.numel() % 8
    head = raw[:whole]
    if head.data_ptr() % 8:
        # an int64 view needs 8-byte alignment (a parameter inside a flat buffer may lack it)
        head = head.clone()
    total = head.view(torch.int64).sum()
    if whole < raw.numel():
        tail = raw[whole:].to(torch.int64)
        shifts = torch.arange(tail.numel(), device=tail.device, dtype=torch.int64) * 8
        total = total + (tail << shifts).sum()
    return total


def layout_sums(flat: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``word_sum`` of every tensor of ``layout`` in the flat uint8 buffer ``flat`` (of at least
    ``layout.padded_bytes``), as an int64 [tensors] on its device, in a handful of kernels whatever the
    tensor count: a model has hundreds of tensors, and a GPU reduction each costs more in
    launches than in bytes.

    The layout starts every tensor at a multiple of ``ALIGN`` (64) bytes, so each 64-byte block
    of the buffer lies within one tensor's extent (the tensor, then the padding up to the next
    one) or in padding alone: the blocks are summed as 8 words each, and a tensor's sum is the
    difference of the blocks' running sum across its extent. The padding is summed with its
    tensor, so it must be zero: allocate the buffer zeroed and write only the tensors' bytes.
    """
    padded = layout.padded_bytes
    if flat.dtype != torch.uint8 or flat.dim() != 1 or flat.numel() < padded:
        raise ValueError(
            f"need a flat uint8 buffer of >= {padded} bytes, got {flat.dtype} {tuple(flat.shape)}"
        )
    words = flat[:padded]
    if words.data_ptr() % 8:
        words = words.clone()
    blocks = words.view(torch.int64).view(-1, ALIGN // 8).sum(1)
    # running[i] = the sum of blocks before block i; int64 additions wrap like word_sum's
    running = torch.zeros(blocks.numel() + 1, dtype=torch.int64, device=flat.device)
    torch.cumsum(blocks, 0, out=running[1:])
    bounds = torch.tensor(
        [
            [offset // ALIGN, -(-(offset + spec.nbytes) // ALIGN)]
            for spec, offset in zip(layout.specs, layout.offsets, strict=True)
        ],
        dtype=torch.int64,
    ).reshape(-1, 2)
    bounds = bounds.to(flat.device)
    return running[bounds[:, 1]] - running[bounds[:, 0]]


def checksum_of_sum(raw_sum: int, version: int) -> int:
    """The checksum from ``word_sum``'s value (a signed int64)."""
    return _mix(raw_sum % 2**64, version)


def copy_with_checksum(dst: torch.Tensor, src: torch.Tensor, version: int) -> int:
    """``dst.copy_(src)`` for contiguous CPU tensors of one dtype, returning ``checksum(dst)``.
    A tensor larger than the cache is copied block by block, each block summed right after it
    landed, so memory is crossed once."""
    d = dst.reshape(-1).view(torch.uint8)
    s = src.reshape(-1).view(torch.uint8)
    if d.numel() <= _FUSE_ABOVE:
        d.copy_(s)
        return checksum(d, version)
    held = d.numpy()
    n = d.numel()
    whole = n - n % 8
    total = 0
    for start in range(0, whole, _BLOCK):
        stop = min(start + _BLOCK, whole)
        d[start:stop].copy_(s[start:stop])
        total += int(held[start:stop].view(np.uint64).sum())
    if whole < n:
        d[whole:].copy_(s[whole:])
        total += int.from_bytes(held[whole:].tobytes(), "little")
    return _mix(total, version)


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


class SegmentWriter:
    """The creating side of a segment: its header, per-slot stamps and the choice of a slot no
    reader holds. Creates the segment on construction; the body (``body``, after the header) is
    the subclass's."""

    def __init__(
        self,
        run_name: str,
        slots: int,
        stride: int,
        body_bytes: int,
        lease_s: float,
        host_id: str = "",
        kind: int = KIND_SLOTS,
    ):
        """``stride``: bytes per slot in the body; ``body_bytes``: the whole body; ``host_id``: the
        host whose actors read the segment, in its name (hosts may share /dev/shm)."""
        if not 2 <= slots <= MAX_SLOTS:
            raise ValueError(f"shm slots must be in [2, {MAX_SLOTS}], got {slots}")
        cleanup_stale_segments(run_name)
        self.slots = slots
        self.lease_s = lease_s
        self.stride = stride
        # 128 random bits: nobody can pre-create (or guess and replace) the segment's name.
        host = f"{host_id}." if host_id else ""
        self.name = f"{segment_prefix(run_name)}{host}{os.getpid()}.{secrets.token_hex(16)}"
        self.path = SHM_DIR / self.name
        size = HEADER_BYTES + -(-body_bytes // PAGE) * PAGE
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._closed = False
        try:
            os.posix_fallocate(fd, 0, size)
            self._map = _Mapping(fd, size)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        _register_cleanup(self)
        w = self._map.words
        w[_STAMPS : _STAMPS + 2 * MAX_SLOTS] = -1
        w[_ROWS : _ROWS + MAX_READERS * _ROW_WORDS] = -1
        w[1], w[2], w[3], w[4], w[_KIND] = slots, stride, MAX_READERS, HEADER_BYTES, kind
        w[0] = MAGIC
        self._versions = [-1] * slots
        self._newest = -1

    @property
    def body(self) -> torch.Tensor:
        return self._map.data[HEADER_BYTES:]

    def _leased(self, slot: int) -> bool:
        w, now = self._map.words, time.monotonic_ns()
        for row in range(MAX_READERS):
            base = _ROWS + row * _ROW_WORDS
            if (
                w[base + _SLOT] == slot
                and w[base + _EXPIRY] > now
                and _row_alive(self._map.fd, row)
            ):
                return True
        return False

    def _free_slot(self) -> tuple[int, bool]:
        """(slot, waited past the lease timeout). Oldest non-newest slot without a live lease."""
        candidates = sorted(
            (s for s in range(self.slots) if s != self._newest), key=lambda s: self._versions[s]
        )
        deadline = time.monotonic() + self.lease_s
        while True:
            for s in candidates:
                if not self._leased(s):
                    return s, False
            if time.monotonic() >= deadline:
                # leases are expired by now; the seqlock rejects the reader's copy
                return candidates[0], True
            time.sleep(0.001)

    def start_slot(self, version: int) -> tuple[int, bool]:
        """A free slot, marked as being written (begin != end: readers refuse it) until ``stamp``;
        returns (slot, had to override a lease)."""
        slot, overrode = self._free_slot()
        self._versions[slot] = -1
        self._map.words[_STAMPS + 2 * slot] = version
        return slot, overrode

    def stamp(self, slot: int, version: int) -> None:
        """``slot`` holds ``version`` in full: readers may take it."""
        self._map.words[_STAMPS + 2 * slot + 1] = version
        self._versions[slot] = version
        self._newest = slot

    def _release_body(self) -> None:
        """Drop the subclass's views into the body before the mapping closes."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.path.unlink(missing_ok=True)
        self._release_body()
        self._map.close()
        _unregister_cleanup(self)


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
        slot, overrode = self.start_slot(version)
        views, sums = self._views[slot], self._sums[slot]
        with torch.no_grad():
            for i, spec in enumerate(self.layout.specs):
                view, src = views[spec.name], tensors[spec.name]
                if checksums is not None:
                    view.copy_(src)
                    sums[i] = checksums[spec.name]
                elif _same_bytes(view, src):
                    sums[i] = copy_with_checksum(view, src, version)
                else:
                    view.copy_(src)
                    sums[i] = checksum(view, version)
        self.stamp(slot, version)
        return slot, overrode

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


class SegmentReader:
    """The reading side of a segment of this user: maps it by name, checks its header and kind,
    and takes a reader row whose lease keeps the writer off the slot being read."""

    def __init__(self, name: str, lease_s: float, kind: int | None = KIND_SLOTS):
        """``kind``: what the body must hold (``KIND_*``; None: either, for a stamps-only look)."""
        if "/" in name or not name.startswith("streamrl."):
            raise ValueError(f"not a streamrl weight segment name: {name!r}")
        self.name = name
        self.lease_s = lease_s
        fd = os.open(SHM_DIR / name, os.O_RDWR | os.O_NOFOLLOW)
        try:
            info = os.fstat(fd)
            # The learner runs as our user and creates segments 0600: anything else is a forgery
            # (an announcement written by whoever holds the Redis password, pointing at their file).
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                raise ValueError(
                    f"shm segment {name} is not a file of this user (uid {info.st_uid})"
                )
            size = info.st_size
            if size < HEADER_BYTES:
                raise ValueError(f"shm segment {name} is too small ({size} bytes)")
            self._map = _Mapping(fd, size)
        except BaseException:
            os.close(fd)
            raise
        w = self._map.words
        if w[0] != MAGIC or (kind is not None and w[_KIND] != kind):
            self._map.close()
            raise ValueError(f"shm segment {name} has no streamrl header of kind {kind}")
        self.slots, self.stride = int(w[1]), int(w[2])
        if not 0 <= self.slots <= MAX_SLOTS or HEADER_BYTES + self.slots * self.stride > size:
            self._map.close()
            raise ValueError(f"shm segment {name}: its header does not fit its size")
        self.row = self._claim_row()

    def _claim_row(self) -> int:
        for row in range(MAX_READERS):
            try:
                _ofd_lock(self._map.fd, row, fcntl.F_WRLCK)
            except OSError:
                continue
            base = _ROWS + row * _ROW_WORDS
            self._map.words[base + _SLOT] = -1
            self._map.words[base + _PID] = os.getpid()
            return row
        self._map.close()
        raise RuntimeError(f"shm segment {self.name}: all {MAX_READERS} reader rows are taken")

    def _check_slot(self, slot: int, needed: int) -> None:
        """``slot`` exists and ``needed`` bytes of it fit its stride (an announcement is data)."""
        if not 0 <= slot < self.slots or needed > self.stride:
            raise ValueError(
                f"announcement does not fit segment {self.name}: slot {slot}, {needed} bytes"
            )

    def hold(self, version: int, slot: int) -> bool:
        """Lease ``slot`` for ``lease_s`` from now; True if it holds ``version`` in full (else the
        lease is dropped at once). ``holds`` after the read says whether the read was intact."""
        w = self._map.words
        row = _ROWS + self.row * _ROW_WORDS
        self.renew()
        w[row + _VERSION] = version
        w[row + _SLOT] = slot
        if self.holds(version, slot):
            return True
        self._drop_lease()
        return False

    def _drop_lease(self) -> None:
        self._map.words[_ROWS + self.row * _ROW_WORDS + _SLOT] = -1

    def holds(self, version: int, slot: int) -> bool:
        """The slot's stamps both say ``version`` right now."""
        w = self._map.words
        return w[_STAMPS + 2 * slot] == version == w[_STAMPS + 2 * slot + 1]

    def _slot_bytes(self, slot: int) -> torch.Tensor:
        start = HEADER_BYTES + slot * self.stride
        return self._map.data[start : start + self.stride]

    def renew(self) -> None:
        self._map.words[_ROWS + self.row * _ROW_WORDS + _EXPIRY] = time.monotonic_ns() + int(
            self.lease_s * 1e9
        )

    def release(self) -> bool:
        """End the lease ``hold`` took; True if no writer touched the slot since."""
        w = self._map.words
        row = _ROWS + self.row * _ROW_WORDS
        slot, version = int(w[row + _SLOT]), int(w[row + _VERSION])
        self._drop_lease()
        return slot >= 0 and self.holds(version, slot)

    def close(self) -> None:
        # closing the descriptor drops the row lock
        self._map.close()


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
            return "ok" if self._map.words[_STAMPS + 2 * slot] == version else "torn"
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


_writers: set[SegmentWriter] = set()
_lock = threading.Lock()
_installed = False


def _register_cleanup(writer: SegmentWriter) -> None:
    """Unlink on interpreter exit (a process killed outright leaves it to ``cleanup_stale_segments``)."""
    global _installed
    with _lock:
        _writers.add(writer)
        if _installed:
            return
        _installed = True
    atexit.register(_close_all)


def _unregister_cleanup(writer: SegmentWriter) -> None:
    with _lock:
        _writers.discard(writer)


def _close_all() -> None:
    for writer in list(_writers):
        writer.close()


def active_leases(name: str) -> list[dict]:
    """Leases readers hold right now on segment ``name``: who is copying what (``streamrl inspect``)."""
    with open(SHM_DIR / name, "rb") as f:
        words = np.frombuffer(f.read(HEADER_BYTES), dtype=np.int64)
    now = time.monotonic_ns()
    out = []
    for row in range(MAX_READERS):
        base = _ROWS + row * _ROW_WORDS
        if words[base + _SLOT] >= 0 and words[base + _EXPIRY] > now:
            out.append(
                {
                    "row": row,
                    "slot": int(words[base + _SLOT]),
                    "version": int(words[base + _VERSION]),
                    "pid": int(words[base + _PID]),
                }
            )
    return out
