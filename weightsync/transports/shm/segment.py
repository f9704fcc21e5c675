"""The shm segment: one POSIX shared-memory file (/dev/shm) on one host, a header of version stamps
and reader leases, then a body of slots whose meaning is the subclass's.

Segment: a 4 KiB header, then ``slots`` page-aligned slots. Header words (int64): magic, slots,
slot_bytes, max_readers, data_offset, kind; per slot a version stamp written before (``begin``)
and after (``end``) the data; per reader a lease row (slot, version, expiry, pid).

A reader accepts a copy only if ``begin == end == version`` before it and ``begin`` is unchanged
after (seqlock); the stamps alone would rely on x86's store and load ordering, so every slot also
carries checksums the reader checks on the bytes it holds (``checksum``).
Leases keep the writer off slots readers are copying: a reader owns its row
through an open-file-description lock, which the kernel drops when the reader
dies, and a lease expires after ``lease_s``, so neither a SIGKILLed nor a
SIGSTOPped reader can block the writer for longer than that. The writer never
touches the newest complete slot, so with 3+ slots one frozen reader never
delays it at all.

The header, stamps and leases are ``SegmentWriter``/``SegmentReader``'s; what a
slot's bytes are lies with the subclass: ``slots.ShmWriter``/``slots.ShmReader`` keep each
slot's data and checksum table in the segment's body, the ``cuda_ipc`` transport
(``transports.cuda_ipc.slots``) keeps only checksum tables and handle fields there
and the data on a GPU. Header word 5 says which (``KIND_*``): a reader refuses a
segment of the other kind.

Pages are allocated (posix_fallocate: a full /dev/shm is an error here, not a
SIGBUS later), after a check that /dev/shm has room for them (``check_space``: a container's
is 64 MiB unless given more, and the error names the fix), and pre-faulted once (the first touch of a page is the real cost),
then reused for every version.

A segment is unlinked by ``close`` and at interpreter exit, and its name already when its
process is asked to stop (``unlink_on_stop``); one left by a killed process is removed by
``cleanup_stale_segments``. No signal handler is set here:
the process's owner decides what a signal means (the learner stops at a step
boundary, then closes the segment).
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import mmap
import os
import re
import secrets
import stat
import struct
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import torch

from streamrl.configs.errors import StreamRLError

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


class ShmSpaceError(StreamRLError, OSError):
    """/dev/shm has less room than a segment needs; the message says how much and the fix."""


def space_error(needed: int, free: int, where: str = str(SHM_DIR)) -> str | None:
    """Why a segment of ``needed`` bytes does not fit in ``free`` bytes of ``where``; None if it
    fits."""
    if needed <= free:
        return None
    mib = 1 << 20
    # room for the segment and the others of a host (the learner's, the relay's), rounded up
    suggest = -(-2 * needed // (1 << 30))
    return (
        f"{where} has {free / mib:.1f} MiB free, and this shared-memory segment needs "
        f"{needed / mib:.1f} MiB (its slots x the model's bytes): give it more (docker run "
        f"--shm-size={suggest}g; Kubernetes: an emptyDir volume with medium: Memory mounted at "
        f"{where}), or use fewer slots"
    )


def check_space(needed: int, directory: Path = SHM_DIR) -> None:
    """ShmSpaceError unless ``directory``'s file system has ``needed`` bytes free."""
    fs = os.statvfs(directory)
    reason = space_error(needed, fs.f_bavail * fs.f_frsize, str(directory))
    if reason is not None:
        raise ShmSpaceError(reason)


def segment_prefix(run_name: str) -> str:
    return f"streamrl.{run_name}.weights."


# what follows the prefix in a name ``SegmentWriter`` makes: ``[<host_id>.]<pid>.<128 random bits>``
_TAIL = r"(?:[A-Za-z0-9_.\-]+\.)?[0-9]+\.[0-9a-f]{32}"
# any run's prefix: a run name is one path part (``configs.run``), so never holds / or \
_ANY_RUN = r"streamrl\.[^/\\\x00]+\.weights\."


class SegmentNameError(StreamRLError, ValueError):
    """A segment name (read from Redis: an announcement) that is not one a writer makes."""


def segment_name(run_name: str, host_id: str, pid: int, token: str) -> str:
    """The name of a segment of ``run_name`` for ``host_id``'s actors ('' = the learner's host)."""
    host = f"{host_id}." if host_id else ""
    return f"{segment_prefix(run_name)}{host}{pid}.{token}"


def check_segment_name(name: object, run_name: str | None = None) -> str:
    """``name`` if it is a segment name ``segment_name`` makes (of ``run_name``; None: of any run),
    else SegmentNameError saying why. A name that passes is one file directly in /dev/shm, so a
    name from Redis is a name, never a path: ``../../etc/passwd`` or ``/etc/shadow`` is refused
    before anything opens it."""
    if not isinstance(name, str):
        raise SegmentNameError(f"segment name {name!r} is not a string")
    prefix = _ANY_RUN if run_name is None else re.escape(segment_prefix(run_name))
    if re.fullmatch(prefix + _TAIL, name) is None:
        rule = segment_prefix(run_name or "<run>") + "[<host>.]<pid>.<32 hex digits>"
        raise SegmentNameError(
            f"refused segment name {name!r}: not a weight segment name of the form {rule}, a name "
            f"in {SHM_DIR} (a name in Redis is a name, never a path)"
        )
    return name


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


def _open_ours(name: str, flags: int) -> int:
    """A descriptor of segment ``name`` (checked: ``check_segment_name``), opened without following
    a link or waiting on a FIFO; ValueError unless it is a regular file of this user."""
    fd = os.open(SHM_DIR / name, flags | os.O_NOFOLLOW | os.O_NONBLOCK)
    info = os.fstat(fd)
    # The learner runs as our user and creates segments 0600: anything else is a forgery
    # (an announcement written by whoever holds the Redis password, pointing at their file).
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise ValueError(f"shm segment {name} is not a file of this user (uid {info.st_uid})")
    return fd


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
        self.name = segment_name(run_name, host_id, os.getpid(), secrets.token_hex(16))
        self.path = SHM_DIR / self.name
        size = HEADER_BYTES + -(-body_bytes // PAGE) * PAGE
        check_space(size, SHM_DIR)
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


class SegmentReader:
    """The reading side of a segment of this user: maps it by name, checks its header and kind,
    and takes a reader row whose lease keeps the writer off the slot being read."""

    def __init__(
        self,
        name: str,
        lease_s: float,
        kind: int | None = KIND_SLOTS,
        *,
        run_name: str | None = None,
    ):
        """``kind``: what the body must hold (``KIND_*``; None: either, for a stamps-only look).
        ``name`` comes from an announcement (Redis): SegmentNameError, before anything is opened,
        unless it is a segment name (``check_segment_name``; of ``run_name`` when given)."""
        self.name = check_segment_name(name, run_name)
        self.lease_s = lease_s
        fd = _open_ours(name, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
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

    def begin_stamp(self, slot: int) -> int:
        """The version a writer last began writing into ``slot`` (the seqlock's check after a copy)."""
        return int(self._map.words[_STAMPS + 2 * slot])

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


def unlink_on_stop() -> None:
    """Unlink the name of every segment this process created, keeping the mappings: what a
    process asked to stop (SIGTERM) calls first, so that a kill before its ``close`` (Slurm's after
    its grace, torchrun's, a supervisor's) leaves no file in /dev/shm. A reader that mapped a
    segment reads on; none opens it anew, and the process may still write its last version."""
    try:
        writers = tuple(_writers)
    # another thread registering a writer right now: its exit-time close unlinks it instead
    except RuntimeError:
        return
    for writer in writers:
        writer.path.unlink(missing_ok=True)


def _close_all() -> None:
    for writer in list(_writers):
        writer.close()


def active_leases(name: str, run_name: str | None = None) -> list[dict]:
    """Leases readers hold right now on segment ``name``: who is copying what (``streamrl inspect``).

    ``name`` comes from Redis: SegmentNameError, before anything is opened, unless it is a segment
    name (of ``run_name`` when given); the file is read only if it is a regular file of this user
    (ValueError otherwise), not through a link."""
    with os.fdopen(_open_ours(check_segment_name(name, run_name), os.O_RDONLY), "rb") as f:
        words = np.frombuffer(f.read(HEADER_BYTES).ljust(HEADER_BYTES, b"\0"), dtype=np.int64)
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
