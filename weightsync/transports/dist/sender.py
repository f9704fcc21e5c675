"""The learner's side of the dist transport: rank 0 of every epoch's group (``DistSender``), and with
relays the learner's own host's shm segment beside it (``HostSender``)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable

import redis
import torch
import torch.distributed as tdist

from streamrl.broker.client import as_str
from streamrl.broker.keys import Keys
from streamrl.weightsync import metrics
from streamrl.weightsync.announce import announce
from streamrl.weightsync.hosts import relay_member
from streamrl.weightsync.layout import Layout
from streamrl.weightsync.transports.base import TransferTimeout
from streamrl.weightsync.transports.dist.buckets import (
    as_bytes,
    bucket_sizes,
    piece_bytes,
    windows,
)
from streamrl.weightsync.transports.dist.group import (
    bound_store,
    bounded,
    device_of,
    make_group,
    resolve_backend,
)
from streamrl.weightsync.transports.dist.trust import beat, count_refused, create_secret, sign
from streamrl.weightsync.transports.shm.sender import ShmSender

log = logging.getLogger(__name__)

# ``fill(end)``: the flat slot being broadcast now holds its bytes up to ``end``; returns its
# checksums (layout order) once it holds them all, else None
Fill = Callable[[int], "list[int] | None"]


class DistSender:
    """Publisher side (rank 0 of every epoch's group)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        layout: Layout,
        *,
        bucket_bytes: int,
        timeout_s: float,
        backend: str,
        host: str,
        port: int = 0,
        ports: int = 1,
        host_id: str = "",
        publisher: str = "",
    ):
        self.client, self.keys, self.layout = client, keys, layout
        self.bucket_bytes, self.timeout_s, self.host = bucket_bytes, timeout_s, host
        self.port, self.ports, self.host_id, self.publisher = port, ports, host_id, publisher
        self.backend = resolve_backend(backend)
        self.device = device_of(self.backend)
        self.plan = windows(layout, bucket_bytes)
        self.sizes = bucket_sizes(layout, bucket_bytes)
        self.bucket = torch.empty(max(self.sizes, default=0), dtype=torch.uint8, device=self.device)
        self.epoch = int(client.get(keys.weights_dist_epoch) or 0)
        self.members: list[str] = []
        # member -> the epoch it was dropped from (invited again once it has seen that epoch)
        self.dropped: dict[str, int] = {}
        self.store: tdist.TCPStore | None = None
        # the epoch's HMAC secret (trust): every value members act on is signed with it
        self.secret = b""
        self.group = None
        self.seq = 0
        self.broken = True
        # when (time.time()) the last send passed each of its phases, for the relay bench's split
        self.marks: dict[str, float] = {}

    def live_members(self) -> list[str]:
        """Members with a fresh heartbeat, less those dropped that have not noticed it yet."""
        return sorted(self._live_beats())

    def _live_beats(self) -> dict[str, int]:
        """``live_members`` -> the epoch whose group each is in (-1: none). An entry that does not parse (or is not
        finite) is dropped as an expired one is, and counted."""
        now = time.time()
        raw = self.client.hgetall(self.keys.weights_dist_members)
        live, expired = {}, []
        for key, value in raw.items():
            parsed = beat(value)
            try:
                member = as_str(key)
            except UnicodeDecodeError:
                parsed = None
            if parsed is None:
                count_refused("heartbeat", f"member {key[:80]!r}: {value[:80]!r}")
                expired.append(key)
            elif parsed[0] <= now:
                expired.append(key)
            # the learner serves its own host's shm itself; that host's relay, checked in before
            # it saw the learner's group record, would hold the first epoch up for timeout_s
            elif self.host_id and member == relay_member(self.host_id):
                continue
            elif parsed[1] >= self.dropped.get(member, -1):
                self.dropped.pop(member, None)
                live[member] = parsed[2]
        if expired:
            self.client.hdel(self.keys.weights_dist_members, *expired)
        return live

    def _announce_group(self, members: list[str]) -> None:
        record = {
            "epoch": self.epoch,
            "host": self.host,
            "port": self.store.port,
            "backend": self.backend,
            "members": members,
            "host_id": self.host_id,
        }
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.keys.weights_dist_group, json.dumps(record))
        pipe.set(self.keys.weights_dist_epoch, self.epoch)
        pipe.publish(self.keys.weights_notify, f"group {self.epoch}")
        pipe.execute()

    def _close_group(self) -> None:
        self.group = None
        self.members = []

    def reform(self, invited: list[str], deadline: float) -> None:
        """New epoch for ``invited``: the group is whoever checked in before ``deadline``."""
        self._close_group()
        if self.store is None:
            self.store = bound_store(self.host, self.timeout_s, self.port, self.ports)
        self.epoch += 1
        self.seq = 0
        # made before the epoch is announced: a member never finds an epoch without its secret
        self.secret = create_secret(self.client, self.keys, self.epoch)
        self.client.delete(self.keys.weights_dist_secret(self.epoch - 1))
        self._announce_group(invited)
        joined = self._wait_ready(invited, deadline)
        missing = [m for m in invited if m not in joined]
        if missing:
            log.warning(
                "weightsync dist: %s did not join epoch %d within %.1fs; dropped",
                missing,
                self.epoch,
                self.timeout_s,
            )
            metrics.TRANSFER_FAILURES.labels(reason="peer_dropped").inc(len(missing))
            self.dropped.update(dict.fromkeys(missing, self.epoch))
        final = f"e{self.epoch}/final"
        self.store.set(final, sign(self.secret, final, joined))
        self.broken = False
        if not joined:
            return
        prefix = tdist.PrefixStore(f"e{self.epoch}/pg/", self.store)
        try:
            with bounded(f"forming epoch {self.epoch}'s group", self.timeout_s):
                self.group = make_group(
                    self.backend, prefix, 0, len(joined) + 1, self.timeout_s, self.host
                )
        # a member died between check-in and connect: retried at the next publish
        except Exception as exc:
            metrics.TRANSFER_FAILURES.labels(reason="rendezvous").inc()
            log.warning("weightsync dist: epoch %d failed to form: %s", self.epoch, exc)
            self.broken = True
            return
        self.members = joined

    def _wait_ready(self, invited: list[str], deadline: float) -> list[str]:
        keys = {m: f"e{self.epoch}/ready/{m}" for m in invited}
        while invited and time.monotonic() < deadline:
            if self.store.check(list(keys.values())):
                return list(invited)
            time.sleep(0.01)
        return [m for m in invited if self.store.check([keys[m]])]

    def send(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        aliases: dict[str, str],
        checksums: dict[str, int] | None = None,
        flat: torch.Tensor | None = None,
        sums: list[int] | None = None,
        fill: Fill | None = None,
    ) -> dict:
        """Broadcast one version to the members; waits at most ``timeout_s`` for members to join and
        each bucket at most ``timeout_s``. A failed broadcast is retried once with a re-formed group
        while that budget lasts; members the version missed get the next one. ``flat``: the
        version laid out as the layout's byte stream on this sender's device (a shm slot),
        broadcast from where it lies (in pieces, ``buckets.piece_bytes``) instead of bucket by
        bucket through a copy; ``fill``: ``flat`` is being written, each piece before it goes
        (``Fill``); ``sums``: its shm checksums (layout order) if known before the broadcast,
        else ``fill``'s, passed on for members that keep it in shm."""
        deadline = time.monotonic() + self.timeout_s
        for attempt in range(2):
            invited = self.live_members()
            if self.broken or invited != self.members:
                self.reform(invited, deadline)
            self.marks = {"members": time.time()}
            if self.group is None:
                break
            try:
                self._broadcast(version, tensors, aliases, flat, sums, fill)
                return {"epoch": self.epoch, "members": self.members}
            except Exception as exc:
                reason = "timeout" if isinstance(exc, TransferTimeout) else "error"
                metrics.TRANSFER_FAILURES.labels(reason=reason).inc()
                log.warning(
                    "weightsync dist: broadcast of version %d failed (attempt %d): %s",
                    version,
                    attempt + 1,
                    exc,
                )
                self.broken = True
                self._close_group()
            if time.monotonic() >= deadline:
                break
        return {"epoch": self.epoch, "members": []}

    def _broadcast(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        aliases: dict[str, str],
        flat: torch.Tensor | None = None,
        sums: list[int] | None = None,
        fill: Fill | None = None,
    ) -> None:
        # a slot on the group's device goes out in pieces, each while the next is written
        pieces = flat is not None and flat.device == self.device
        header = {
            "version": version,
            "layout": self.layout.to_json(),
            "aliases": aliases,
            "bucket_bytes": piece_bytes(self.bucket_bytes) if pieces else self.bucket_bytes,
            "publisher": self.publisher,
            "checksums": sums,
        }
        key = f"e{self.epoch}/pub/{self.seq}"
        self.store.set(key, sign(self.secret, key, header))
        self.marks["header"] = time.time()
        # members read a header before its broadcast starts; two back is long taken
        if self.seq >= 2:
            for old in (
                f"e{self.epoch}/pub/{self.seq - 2}",
                f"e{self.epoch}/pub/{self.seq - 2}/sums",
            ):
                self.store.delete_key(old)
        self.seq += 1
        if pieces:
            works, sums_after = self._issue_pieces(flat, header["bucket_bytes"], fill)
        else:
            works, sums_after = [], None
            self._send_buckets(version, tensors, flat)
        # a header sent without checksums is followed by the same header with them (or still
        # without: none were taken), signed likewise: members that keep the bytes check them
        if sums is None:
            after = header | {"checksums": sums_after}
            self.store.set(f"{key}/sums", sign(self.secret, f"{key}/sums", after))
        timeout = dt.timedelta(seconds=self.timeout_s)
        for work in works:
            with bounded(f"broadcast of version {version}", self.timeout_s):
                work.wait(timeout)
        self.marks["sent"] = time.time()

    def _issue_pieces(
        self, flat: torch.Tensor, size: int, fill: Fill | None
    ) -> tuple[list, list[int] | None]:
        """Start the broadcast of ``flat`` piece by piece, each once ``fill`` wrote it; returns
        the collectives under way and what ``fill`` returned for the last piece (the checksums)."""
        works, whole = [], None
        for start in range(0, flat.numel(), size):
            end = min(start + size, flat.numel())
            if fill is not None:
                whole = fill(end)
            works.append(self.group.broadcast([flat[start:end]], tdist.BroadcastOptions()))
        self.marks["filled"] = time.time()
        return works, whole

    def _send_buckets(
        self, version: int, tensors: dict[str, torch.Tensor], flat: torch.Tensor | None
    ) -> None:
        """Bucket by bucket through the group's own bucket: from ``flat`` (a host slot sent over
        NCCL, a catch-up), or converted from ``tensors``."""
        timeout = dt.timedelta(seconds=self.timeout_s)
        dtypes = {s.name: s.torch_dtype for s in self.layout.specs}
        converted_name, converted = None, None
        with torch.no_grad():
            for index, (size, window) in enumerate(zip(self.sizes, self.plan, strict=True)):
                bucket = self.bucket[:size]
                if flat is not None:
                    bucket.copy_(flat[index * self.bucket_bytes :][:size])
                    window = []
                for name, start, end, at in window:
                    # a tensor spanning buckets is converted once
                    if name != converted_name:
                        converted_name = name
                        converted = as_bytes(
                            tensors[name].detach().to(self.device, dtypes[name]).contiguous()
                        )
                    bucket[at : at + end - start].copy_(converted[start:end])
                with bounded(f"broadcast of version {version}", self.timeout_s):
                    self.group.broadcast([bucket], tdist.BroadcastOptions()).wait(timeout)

    def joiners(self) -> set[str]:
        """Live members outside the current group: new, or restarted under the same id (in no
        group of this epoch, by its heartbeat)."""
        beats = self._live_beats()
        return {m for m, joined in beats.items() if m not in self.members or joined != self.epoch}

    def close(self) -> None:
        self._close_group()
        # its server stops with it: members of the last epoch see the store gone
        self.store = None
        try:
            self.client.delete(self.keys.weights_dist_secret(self.epoch))
        except redis.RedisError:
            pass


# how often the learner looks for relays that joined between versions
CATCH_UP_POLL_S = 0.25


class HostSender:
    """With relays: each version goes to the group (one relay per actor host) and into this host's
    shm segment, announced under this host's keys, for the actors that run beside the learner.

    A relay that starts or restarts between versions gets the current one at once, from this
    host's slot (``catch_up``), not at the next publish: its host's actors may have none yet.
    """

    def __init__(
        self,
        dist: DistSender,
        shm: ShmSender,
        client: redis.Redis,
        local_keys: Keys,
        publisher: str,
    ):
        self.dist, self.shm, self.client = dist, shm, client
        self.local_keys, self.publisher = local_keys, publisher
        # one publish or catch-up at a time; the last version sent: (version, aliases, slot)
        self._lock = threading.Lock()
        self._last: tuple[int, dict[str, str], int] | None = None
        self.marks: dict[str, float] = {}
        self._stop = threading.Event()
        self._catcher = threading.Thread(target=self.catch_up, name="weight-catch-up", daemon=True)
        self._catcher.start()

    def send(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        aliases: dict[str, str],
        checksums: dict[str, int] | None = None,
    ) -> dict:
        with self._lock:
            marks = {"start": time.time()}
            if self.dist.device.type != "cpu":
                # NCCL's buckets are on the GPU and are filled from the tensors: the slot is
                # written first, for this host's actors
                local = self.shm.send(version, tensors, aliases, checksums)
                sums = self.shm.writer.checksums(local["slot"])
                self._announce_here(version, aliases, local["slot"], marks)
                sent = self.dist.send(version, tensors, aliases, checksums, sums=sums)
            else:
                # the one copy: into this host's slot, piece by piece, each piece then broadcast
                # from there while the next is written (gloo, on the host)
                fill = self.shm.fill(version, tensors, checksums)

                def written(end: int) -> list[int] | None:
                    fill.upto(end)
                    if end < fill.flat.numel():
                        return None
                    if not fill.committed:
                        fill.commit()
                        self._announce_here(version, aliases, fill.slot, marks)
                    return fill.sums

                sent = self.dist.send(version, tensors, aliases, checksums, fill.flat, fill=written)
                # no member took it (or the broadcast failed early): the slot still gets it all
                written(fill.flat.numel())
            self.marks = marks | self.dist.marks
            return sent

    def _announce_here(self, version: int, aliases: dict[str, str], slot: int, marks: dict) -> None:
        """``slot`` holds ``version``: announced to this host's actors."""
        marks["slot"] = time.time()
        local = {"layout": self.dist.layout.to_json(), "aliases": aliases}
        local |= {"segment": self.shm.writer.name, "slot": slot}
        announce(self.client, self.local_keys, version, "shm", self.publisher, local)
        marks["here"] = time.time()
        self._last = (version, aliases, slot)

    def catch_up(self) -> None:
        """The background thread: a joiner seen on two polls running (a publish in between takes
        it in anyway) gets the last version, re-sent from this host's slot, which no publish can
        overwrite meanwhile. The group's other members take it again and drop it."""
        seen: set[str] = set()
        while not self._stop.wait(CATCH_UP_POLL_S):
            try:
                with self._lock:
                    joiners = self.dist.joiners() if self._last is not None else set()
                    if joiners & seen:
                        version, aliases, slot = self._last
                        writer = self.shm.writer
                        sums = writer.checksums(slot)
                        # a relay restarted under the same id would otherwise fail the broadcast first
                        self.dist.broken = True
                        self.dist.send(version, {}, aliases, flat=writer.flat(slot), sums=sums)
                        joiners = set()
                seen = joiners
            # Redis or the store out of reach: the next publish meets it and says so
            except Exception as exc:
                log.warning("weightsync dist: catching a joiner up failed: %s", exc)
                seen = set()

    def close(self) -> None:
        self._stop.set()
        self._catcher.join()
        self.dist.close()
        self.shm.close()
